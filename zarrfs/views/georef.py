"""Where a CF raster lies on the Earth: its CRS, geotransform and NoData, from `grid_mapping` and 1-D coordinates.

An array of 2 or 3 dimensions (band, y, x) is georeferenced from what xarray and rioxarray
write beside it in its group: the variable its `grid_mapping` attribute names, else the first
of its `coordinates` with a WKT, as rioxarray reads them (`crs_wkt` or `spatial_ref` WKT, a
GDAL `GeoTransform`, or `grid_mapping_name: latitude_longitude`), and evenly spaced 1-D
coordinate arrays named as its last two dimensions (x/y, or lat/lon: these need no grid
mapping, and are taken as WGS 84 when none names a CRS). Pixels are areas: the origin is
the outer corner of the first pixel, half a step before the first coordinate. The EPSG code is
read from the WKT's own AUTHORITY/ID. Pure: the caller reads the coordinates' values
(`Plan.y`, `Plan.x`) and hands them to `Plan.resolve`.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from enum import Enum
from typing import Any

import numpy as np

from ..model import ArrayMeta, Node
from .netcdf import dimension_names, fill_value_of

# GDAL's geotransform: x = gt[0] + col*gt[1] + row*gt[2], y = gt[3] + col*gt[4] + row*gt[5].
GeoTransform = tuple[float, float, float, float, float, float]

# WKT of WGS 84 (EPSG:4326, as rioxarray writes it) for lat/lon coordinates that name no CRS.
WGS84_WKT = (
    'GEOGCS["WGS 84",DATUM["WGS_1984",SPHEROID["WGS 84",6378137,298.257223563,AUTHORITY["EPSG","7030"]],'
    'AUTHORITY["EPSG","6326"]],PRIMEM["Greenwich",0,AUTHORITY["EPSG","8901"]],'
    'UNIT["degree",0.0174532925199433,AUTHORITY["EPSG","9122"]],AXIS["Latitude",NORTH],AXIS["Longitude",EAST],'
    'AUTHORITY["EPSG","4326"]]'
)
# Root keywords of WKT 1 and WKT 2 by the kind of CRS they name.
PROJECTED = {"PROJCS", "PROJCRS", "PROJECTEDCRS"}
GEOGRAPHIC = {"GEOGCS", "GEOGCRS", "GEOGRAPHICCRS"}
GEODETIC = {"GEODCRS", "GEODETICCRS"}  # geographic where its coordinate system is ellipsoidal
# Names and CF attributes that mark a coordinate as latitude or longitude (CF conventions, 4.1-4.2).
LAT_NAMES, LON_NAMES = {"lat", "latitude"}, {"lon", "long", "longitude"}
LAT_UNITS = {"degrees_north", "degree_north", "degree_n", "degrees_n", "degreen", "degreesn"}
LON_UNITS = {"degrees_east", "degree_east", "degree_e", "degrees_e", "degreee", "degreese"}
# Coordinates whose steps differ by more than this fraction of a step are not a regular grid
# (the spacing float32 coordinates can hold is allowed besides: `_regular`).
STEP_TOLERANCE = 1e-6
# A longer WKT is not taken (the VRT and ENVI texts carry it; a CRS takes a few KiB at most).
MAX_WKT_CHARS = 16 << 10
# Coordinate arrays read to find their step: larger ones are not coordinates of an image.
MAX_COORDINATE_BYTES = 64 << 20


class CrsKind(Enum):
    """The kinds of CRS a GeoTIFF names by an EPSG code (GTModelTypeGeoKey's values)."""

    PROJECTED = 1
    GEOGRAPHIC = 2


@dataclass(frozen=True)
class Crs:
    """What the WKT says of itself: its kind, EPSG code and name."""

    wkt: str
    kind: CrsKind | None = None  # None: another kind (geocentric, compound...), or not parsed
    epsg: int | None = None
    name: str | None = None


@dataclass(frozen=True)
class GeoReference:
    """Where an image lies: a GDAL geotransform, its CRS (None: unknown) and NoData value."""

    geotransform: GeoTransform
    crs: Crs | None = None
    nodata: float | None = None

    @property
    def north_up(self) -> bool:
        gt = self.geotransform
        return gt[2] == 0 and gt[4] == 0 and gt[5] < 0

    @property
    def rotated(self) -> bool:
        return self.geotransform[2] != 0 or self.geotransform[4] != 0


def number_text(value: float) -> str:
    """A number as GDAL parses it back exactly: integers without a point, nan and inf by name."""
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return str(int(value)) if value == int(value) and abs(value) < 2**63 else repr(float(value))


# --- WKT -----------------------------------------------------------------------------------

_TOKEN = re.compile(r'\s*(?:("(?:[^"]|"")*")|([\[(])|([\])])|(,)|([^\s\[\](),"]+))')
# WKT nests a few levels deep (a BOUNDCRS of a PROJCRS: about 6); deeper text is no CRS.
MAX_WKT_DEPTH = 32


@dataclass
class _Node:
    keyword: str
    items: list[Any]  # str (quoted text), str (numbers and enumerations, as written), _Node


def _parse(wkt: str) -> _Node | None:
    """The root node of WKT text (None when it is not WKT)."""
    stack: list[_Node] = []
    root, word = None, None
    pos = 0
    while pos < len(wkt):
        m = _TOKEN.match(wkt, pos)
        if m is None or m.end() == pos:
            return None if wkt[pos:].strip() else root
        pos = m.end()
        quoted, opening, closing, comma, bare = m.groups()
        if opening:
            if word is None or len(stack) >= MAX_WKT_DEPTH:
                return None
            node = _Node(word.upper(), [])
            if stack:
                stack[-1].items.append(node)
            elif root is None:
                root = node
            else:
                return None
            stack.append(node)
            word = None
        elif closing:
            if not stack:
                return None
            if word is not None:
                stack[-1].items.append(word)
            word = None
            stack.pop()
        elif comma:
            if word is not None and stack:
                stack[-1].items.append(word)
            word = None
        elif quoted:
            if not stack:
                return None
            stack[-1].items.append(quoted[1:-1].replace('""', '"'))
        else:
            word = bare
    return root if not stack else None


def _child(node: _Node, *keywords: str) -> _Node | None:
    return next((i for i in node.items if isinstance(i, _Node) and i.keyword in keywords), None)


def crs_of_wkt(wkt: str) -> Crs:
    """The kind, EPSG code and name a WKT (1 or 2) gives its CRS at its root (a BOUNDCRS: its source's)."""
    node = _parse(wkt)
    if node is not None and node.keyword == "BOUNDCRS":
        source = _child(node, "SOURCECRS")
        node = next((i for i in source.items if isinstance(i, _Node)), None) if source else None
    if node is None:
        return Crs(wkt)
    kind = None
    if node.keyword in PROJECTED:
        kind = CrsKind.PROJECTED
    elif node.keyword in GEOGRAPHIC:
        kind = CrsKind.GEOGRAPHIC
    elif node.keyword in GEODETIC:
        cs = _child(node, "CS")
        kind = CrsKind.GEOGRAPHIC if cs is not None and cs.items and str(cs.items[0]).lower() == "ellipsoidal" else None
    name = node.items[0] if node.items and isinstance(node.items[0], str) else None
    authority = _child(node, "AUTHORITY", "ID")
    epsg = None
    if authority is not None and len(authority.items) >= 2 and str(authority.items[0]).upper() == "EPSG":
        code = str(authority.items[1])
        epsg = int(code) if code.isascii() and code.isdigit() and len(code) <= 9 else None
    return Crs(wkt, kind, epsg, name)


# --- the raster and what lies beside it -------------------------------------------------------


def _attr_text(attributes: dict[str, Any], key: str) -> str | None:
    value = attributes.get(key)
    return value.strip() if isinstance(value, str) and value.strip() else None


class Axis(Enum):
    """What a dimension's coordinate measures."""

    X = "x"
    Y = "y"
    LAT = "latitude"
    LON = "longitude"


NORTHINGS, EASTINGS = (Axis.Y, Axis.LAT), (Axis.X, Axis.LON)


def _axis_of(name: str, meta: ArrayMeta | None) -> Axis | None:
    """What a dimension's name and its coordinate's CF attributes say it measures (None: neither)."""
    attrs = meta.attributes if meta is not None else {}
    standard = (_attr_text(attrs, "standard_name") or "").lower()
    units = (_attr_text(attrs, "units") or "").lower().replace(" ", "_")
    axis = (_attr_text(attrs, "axis") or "").upper()
    if standard == "latitude" or units in LAT_UNITS or name.lower() in LAT_NAMES:
        return Axis.LAT
    if standard == "longitude" or units in LON_UNITS or name.lower() in LON_NAMES:
        return Axis.LON
    if axis == "Y" or standard == "projection_y_coordinate" or name.lower() in ("y", "northing", "rlat"):
        return Axis.Y
    if axis == "X" or standard == "projection_x_coordinate" or name.lower() in ("x", "easting", "rlon"):
        return Axis.X
    return None


def _coordinate(name: str | None, length: int, siblings: dict[str, ArrayMeta]) -> ArrayMeta | None:
    """The 1-D numeric array named as a dimension, of its length (a CF coordinate variable)."""
    meta = siblings.get(name) if name is not None else None
    if (
        meta is None
        or meta.shape != (length,)
        or meta.dtype.kind not in "iuf"
        or length * meta.dtype.itemsize > MAX_COORDINATE_BYTES
    ):
        return None
    return meta


def _geotransform_attribute(value: Any) -> GeoTransform | None:
    """GDAL's `GeoTransform` attribute: six numbers in a string (or a list), finite, not degenerate."""
    try:
        numbers = [float(v) for v in (value.split() if isinstance(value, str) else value)]
    except (TypeError, ValueError):
        return None
    if len(numbers) != 6 or not all(math.isfinite(v) for v in numbers):
        return None
    if numbers[1] * numbers[5] - numbers[2] * numbers[4] == 0:
        return None
    return tuple(numbers)  # type: ignore[return-value]


def nodata_of(meta: ArrayMeta) -> float | None:
    """The NoData value: `_FillValue` as xarray reads it (netcdf.fill_value_of), else `missing_value`."""
    fill, _ = fill_value_of(meta)
    if fill is None:
        missing = meta.attributes.get("missing_value")
        fill = missing[0] if isinstance(missing, list) and missing else missing
        if isinstance(fill, bool) or not isinstance(fill, (int, float)):
            return None
    value = np.asarray(fill)
    if value.dtype.kind == "c" or value.size != 1:
        return None
    try:
        return float(value.item())
    except (TypeError, ValueError, OverflowError):
        return None


@dataclass(frozen=True)
class Plan:
    """What georeferences an array, before its coordinates are read: the coordinate arrays
    (`y`, `x`: read their values, then `resolve`), the CRS and GeoTransform its grid_mapping
    names, and why it cannot be georeferenced when it cannot (`why`, for the log)."""

    y: ArrayMeta | None = None
    x: ArrayMeta | None = None
    crs: Crs | None = None
    geotransform: GeoTransform | None = None
    nodata: float | None = None
    why: str | None = None

    def resolve(
        self, y_values: np.ndarray | None, x_values: np.ndarray | None
    ) -> tuple[GeoReference | None, str | None]:
        """The georeference from the coordinates' values (None: not evenly spaced, and no
        GeoTransform), and what the log should say of it (None: nothing)."""
        gt = None
        if y_values is not None and x_values is not None:
            ys, xs = _regular(y_values), _regular(x_values)
            if ys is not None and xs is not None:
                (y0, dy), (x0, dx) = ys, xs
                gt = (x0 - dx / 2, dx, 0.0, y0 - dy / 2, 0.0, dy)
        gt = gt or self.geotransform
        if gt is None:
            return None, self.why or "its coordinates are not evenly spaced"
        return GeoReference(gt, self.crs, self.nodata), self.why


def _regular(values: np.ndarray) -> tuple[float, float] | None:
    """(first value, step) of evenly spaced, strictly monotonic finite coordinates (None: not so)."""
    v = np.asarray(values, dtype=np.float64)
    if v.ndim != 1 or v.size < 2 or not np.isfinite(v).all():
        return None
    step = (v[-1] - v[0]) / (v.size - 1)
    if step == 0:
        return None
    slack = STEP_TOLERANCE * abs(step)
    if values.dtype.kind == "f":  # what the coordinates' own precision can hold
        slack += 2 * np.finfo(values.dtype).eps * float(np.abs(v).max())
    if np.abs(np.diff(v) - step).max() > slack:
        return None
    return float(v[0]), float(step)


def may_be_raster(meta: ArrayMeta) -> bool:
    """Whether `meta` may be a CF raster, so that its group's nodes are worth a look: 2 or 3
    dimensions, named (xarray's arrays) or with a grid_mapping."""
    named = any(n is not None for n in dimension_names(meta))
    return 2 <= len(meta.shape) <= 3 and (named or _attr_text(meta.attributes, "grid_mapping") is not None)


def _grid_mapping(meta: ArrayMeta, arrays: dict[str, ArrayMeta]) -> tuple[ArrayMeta | None, str | None]:
    """The array holding the CRS of `meta` (None: none, and why not when it names one): the one its
    `grid_mapping` names, else (as rioxarray reads it) the first of its `coordinates` with a WKT."""
    name = _attr_text(meta.attributes, "grid_mapping")
    if name is not None:
        # CF's extended form "crs: x y [crs2: lat lon]" names the first grid mapping first.
        name = name.split(":", 1)[0].split()[0] if name.split(":", 1)[0].split() else name
        mapping = arrays.get(name)
        return mapping, None if mapping is not None else f"its grid_mapping {name!r} is no array of its group"
    for name in (_attr_text(meta.attributes, "coordinates") or "").split():
        mapping = arrays.get(name)
        if mapping is not None and any(_attr_text(mapping.attributes, k) for k in ("crs_wkt", "spatial_ref")):
            return mapping, None
    return None, None


def _crs_of_mapping(mapping: ArrayMeta) -> tuple[Crs | None, GeoTransform | None, str | None]:
    """The CRS and GeoTransform a grid mapping variable holds, and why it has no CRS (None: it has one)."""
    name = mapping.path.rsplit("/", 1)[-1]
    gt = _geotransform_attribute(mapping.attributes.get("GeoTransform"))
    wkt = _attr_text(mapping.attributes, "crs_wkt") or _attr_text(mapping.attributes, "spatial_ref")
    if wkt is not None and len(wkt) > MAX_WKT_CHARS:
        return None, gt, f"the WKT of its grid_mapping {name!r} is longer than {MAX_WKT_CHARS} characters"
    if wkt is not None and _parse(wkt) is None:
        return None, gt, f"the crs_wkt/spatial_ref of its grid_mapping {name!r} is no WKT"
    if wkt is not None:
        return crs_of_wkt(wkt), gt, None
    if mapping.attributes.get("grid_mapping_name") == "latitude_longitude":
        return crs_of_wkt(WGS84_WKT), gt, None
    return None, gt, f"its grid_mapping {name!r} has no crs_wkt or spatial_ref"


def plan(meta: ArrayMeta, siblings: list[Node]) -> Plan | None:
    """How to georeference `meta` from the nodes of its group (None: it is no CF raster, nothing
    to say; a Plan with `why`: a CF raster that cannot be georeferenced, or has no CRS)."""
    if not 2 <= len(meta.shape) <= 3:
        return None
    arrays = {n.path.rsplit("/", 1)[-1]: n for n in siblings if isinstance(n, ArrayMeta) and n.path != meta.path}
    dims = dimension_names(meta)
    y_name, x_name = dims[-2], dims[-1]
    y = _coordinate(y_name, meta.shape[-2], arrays)
    x = _coordinate(x_name, meta.shape[-1], arrays)
    mapping, why = _grid_mapping(meta, arrays)
    crs, gt = None, None
    if mapping is not None:
        crs, gt, why = _crs_of_mapping(mapping)
    mapped = mapping is not None or why is not None  # a grid mapping says this is a map
    if y is not None and x is not None:
        axes = (_axis_of(y_name, y), _axis_of(x_name, x))
        if axes[0] in EASTINGS or axes[1] in NORTHINGS:
            return Plan(why=f"its last two dimensions {y_name!r}, {x_name!r} are x then y (transposed)")
        if not mapped and (axes[0] not in NORTHINGS or axes[1] not in EASTINGS):
            return None  # coordinates of something else (time, depth): not a map
        if crs is None and not mapped and axes == (Axis.LAT, Axis.LON):
            crs = crs_of_wkt(WGS84_WKT)  # latitude and longitude with no datum named: WGS 84
    else:
        y = x = None
    if y is None and gt is None:
        if not mapped:
            return None
        return Plan(why=why or "no evenly spaced 1-D coordinates named as its last two dimensions, no GeoTransform")
    return Plan(y, x, crs, gt, nodata_of(meta), why)
