"""The image views under `.zarrfs/`: tiff/PATH.tif, raw/PATH.hdr (ENVI), gdal/PATH.vrt, preview/PATH.png: names, layouts, texts.

Which arrays each view shows (a table of suffix, entry kind and eligibility), the byte
stream of a TIFF, the generated ENVI, VRT and GDAL .aux.xml texts, and the statistics GDAL
saves into the last two. Pure: no I/O, no trio.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from xml.etree import ElementTree
from xml.sax.saxutils import escape, quoteattr

import numpy as np

from ..model import ArrayMeta, Node
from . import histograms, ngff, preview, tiff
from .georef import GeoReference, crs_of_wkt, number_text
from .kinds import Kind
from .streams import ArrayStream, npy_header

# ENVI `data type` codes (ENVI header format; GDAL's ENVI driver reads the same table).
ENVI_TYPES = {
    "u1": 1,
    "b1": 1,
    "i2": 2,
    "i4": 3,
    "f4": 4,
    "f8": 5,
    "c8": 6,
    "c16": 9,
    "u2": 12,
    "u4": 13,
    "i8": 14,
    "u8": 15,
}
# GDAL data type names of a VRTRawRasterBand (Int8 and Float16 need a GDAL newer than
# Debian 12's 3.6, so those arrays get no VRT).
GDAL_TYPES = {
    "u1": "Byte",
    "b1": "Byte",
    "u2": "UInt16",
    "i2": "Int16",
    "u4": "UInt32",
    "i4": "Int32",
    "u8": "UInt64",
    "i8": "Int64",
    "f4": "Float32",
    "f8": "Float64",
    "c8": "CFloat32",
    "c16": "CFloat64",
}
# A VRT holds about 300 bytes a band: 65,536 bands keep its text under 20 MB.
MAX_VRT_BANDS = 1 << 16
# Band metadata GDAL saves into a VRT or an .aux.xml when it has computed statistics
# (gdalinfo -stats): the only change a rewrite of those views may make.
STATISTICS_PREFIX = "STATISTICS_"
# Where a band's kept statistics hold its histograms (`<Histograms>` text, histograms.py).
HISTOGRAMS = "HISTOGRAMS"
# Attributes GDAL adds to a band when it writes a VRT back: block sizes of its own cache,
# which change no value read.
GDAL_ADDED_BAND_ATTRIBUTES = ("blockXSize", "blockYSize")
# ENVI header items GDAL may leave out of the ENVI metadata it copies into an .aux.xml.
ENVI_GEOREFERENCE_ITEMS = {"map_info", "coordinate_system_string"}
# A band number in an .aux.xml: ASCII digits only (str.isdigit also takes superscripts, which
# int() refuses), and few enough of them for int() (which refuses thousands).
BAND_NUMBER = re.compile(r"[1-9][0-9]{0,8}")


def _code(dtype: np.dtype) -> str:
    return f"{dtype.kind}{dtype.itemsize}"


def _raster(meta: ArrayMeta, table: Mapping[str, object]) -> bool:
    """2-D or 3-D (bands, rows, columns), no empty dimension, a type the format names."""
    return (
        meta.dtype.fields is None
        and meta.dtype.subdtype is None
        and 2 <= len(meta.shape) <= 3
        and all(n > 0 for n in meta.shape)
        and _code(meta.dtype) in table
    )


def tiff_ok(meta: ArrayMeta) -> bool:
    """2+ dimensions of a TIFF type, and IFDs of a bounded size (not millions of pages)."""
    return tiff.supported(meta.dtype, meta.shape) and tiff.header_fits(tiff.pixel_dtype(meta.dtype), meta.shape)


def envi_ok(meta: ArrayMeta) -> bool:
    return _raster(meta, ENVI_TYPES)


def vrt_ok(meta: ArrayMeta) -> bool:
    return _raster(meta, GDAL_TYPES) and (len(meta.shape) == 2 or meta.shape[0] <= MAX_VRT_BANDS)


# view directory -> (file suffix, entry kind, which arrays it shows)
IMAGE_VIEWS: dict[str, tuple[str, Kind, Callable[[ArrayMeta], bool]]] = {
    "tiff": (".tif", Kind.TIFF, tiff_ok),
    "gdal": (".vrt", Kind.TEXT, vrt_ok),
    "preview": (".png", Kind.PREVIEW, preview.supported),
}
# Files beside the arrays of an existing view directory: view -> (suffix, kind, which arrays)...
# raw/PATH.raw.aux.xml is where GDAL looks for, and saves, the statistics of PATH.raw.
BESIDE = {"raw": ((".hdr", Kind.TEXT, envi_ok), (".raw.aux.xml", Kind.PAM, envi_ok))}


def view_names(view: str, node: Node, base: str) -> list[tuple[str, Kind]]:
    """(name, entry kind) of a node in an image view directory (groups are directories;
    arrays the view cannot show are left out)."""
    if node.kind != "array":
        return [(base, Kind.GROUP)]
    suffix, kind, ok = IMAGE_VIEWS[view]
    return [(base + suffix, kind)] if isinstance(node, ArrayMeta) and ok(node) else []


def beside(view: str, node: Node, base: str) -> list[tuple[str, Kind]]:
    """(name, kind) of files an image view adds beside an array in another view (raw/PATH.hdr)."""
    if not isinstance(node, ArrayMeta):
        return []
    return [(base + suffix, kind) for suffix, kind, ok in BESIDE.get(view, ()) if ok(node)]


def tiff_stream(meta: ArrayMeta, geo: GeoReference | None = None, hints: ngff.ArrayHints | None = None) -> ArrayStream:
    """The TIFF of an array: its header (GeoTIFF tags where `geo` places it; axes and resolution
    from HINTS, an NGFF image's level, else axes from dimension names, v3's or xarray's
    `_ARRAY_DIMENSIONS`), then the elements in C order, little-endian."""
    dtype = tiff.pixel_dtype(meta.dtype)
    hinted = hints is not None and len(hints.axes) == len(meta.shape)
    names = meta.dimension_names or meta.attributes.get("_ARRAY_DIMENSIONS")  # (xarray's, on v2)
    named = isinstance(names, (list, tuple)) and len(names) == len(meta.shape)
    axes = (
        hints.axes
        if hints is not None and hinted
        else ngff.tiff_axes(tuple(names))
        if named and isinstance(names, (list, tuple))
        else None
    )
    desc = tiff.description("/" + meta.path, meta.shape, meta.dtype, meta.attributes, axes)
    tags = tiff.geo_tags(geo) if geo is not None and len(meta.shape) <= 3 else ()
    res = ngff.resolution(hints) if hints is not None and hinted else None
    tags += tiff.resolution_tags(*res) if res is not None else ()
    return ArrayStream(meta, "C", False, header=tiff.header(dtype, meta.shape, desc, tags), dtype=dtype)


def _bands_rows_cols(meta: ArrayMeta) -> tuple[int, int, int]:
    return (1, *meta.shape) if len(meta.shape) == 2 else meta.shape  # type: ignore[return-value]


def envi_header(meta: ArrayMeta, geo: GeoReference | None = None) -> bytes:
    """raw/PATH.hdr: the raw view (C order, the .npy's byte order) as an ENVI band-sequential
    file; `map info`, `coordinate system string` and `data ignore value` where `geo` places it."""
    bands, rows, cols = _bands_rows_cols(meta)
    big = meta.dtype.byteorder == ">" or (meta.dtype.byteorder == "=" and np.little_endian is False)
    text = (
        f"ENVI\ndescription = {{zarrfs array /{meta.path}}}\nsamples = {cols}\nlines = {rows}\n"
        f"bands = {bands}\nheader offset = 0\nfile type = ENVI Standard\n"
        f"data type = {ENVI_TYPES[_code(meta.dtype)]}\ninterleave = bsq\nbyte order = {int(big)}\n"
    )
    if geo is not None and not geo.rotated:  # (ENVI's rotation is an angle: no shear, no flip)
        text += f"map info = {{{_envi_map_info(geo)}}}\n"
        if geo.crs is not None:
            text += f"coordinate system string = {{{' '.join(geo.crs.wkt.split())}}}\n"
    if geo is not None and geo.nodata is not None:
        text += f"data ignore value = {number_text(geo.nodata)}\n"
    return text.encode()


def _envi_map_info(geo: GeoReference) -> str:
    """ENVI's map info: projection, the reference pixel (1, 1: the first pixel's outer corner),
    its map coordinates, the pixel size (y positive when north-up), and UTM's zone or the datum."""
    x0, dx, _, y0, _, dy = geo.geotransform
    where = f"1, 1, {number_text(x0)}, {number_text(y0)}, {number_text(dx)}, {number_text(-dy)}"
    epsg = geo.crs.epsg if geo.crs is not None else None
    if epsg is not None and (32601 <= epsg <= 32660 or 32701 <= epsg <= 32760):  # WGS 84 / UTM
        hemisphere = "North" if epsg < 32700 else "South"
        return f"UTM, {where}, {epsg % 100}, {hemisphere}, WGS-84, units=Meters"
    if epsg == 4326:
        return f"Geographic Lat/Lon, {where}, WGS-84, units=Degrees"
    return f"Arbitrary, {where}"


def vrt(
    meta: ArrayMeta, npy_name: str, statistics: list[dict[str, str]] | None = None, geo: GeoReference | None = None
) -> bytes:
    """gdal/PATH.vrt: one VRTRawRasterBand per band, reading the main tree's PATH.npy past its
    header; `npy_name` is that file's name (a root array's is the mount's NAME.npy).
    `statistics` (one dict a band) are STATISTICS_* items GDAL computed and saved into it;
    `geo` gives its SRS, GeoTransform and the bands' NoDataValue."""
    bands, rows, cols = _bands_rows_cols(meta)
    item = meta.dtype.itemsize
    offset = len(npy_header(meta.dtype, meta.shape, False))
    dirs = meta.path.count("/") if meta.path else 0
    # From .zarrfs/gdal/DIRS/ back to the mount's root: works wherever the mount is.
    source = escape("../" * (dirs + 2) + (meta.path.rsplit("/", 1)[0] + "/" if dirs else "") + npy_name)
    order = "MSB" if meta.dtype.byteorder == ">" else "LSB"
    gdal_type = GDAL_TYPES[_code(meta.dtype)]
    lines = [f'<VRTDataset rasterXSize="{cols}" rasterYSize="{rows}">']
    if geo is not None and geo.crs is not None:
        lines.append(f"  <SRS>{escape(' '.join(geo.crs.wkt.split()))}</SRS>")
    if geo is not None:
        lines.append(f"  <GeoTransform>{_gdal_geotransform(geo)}</GeoTransform>")
    nodata = geo.nodata if geo is not None else None
    for b in range(bands):
        lines.append(f'  <VRTRasterBand dataType="{gdal_type}" band="{b + 1}" subClass="VRTRawRasterBand">')
        items = statistics[b] if statistics else {}
        lines += _metadata(items)
        if nodata is not None:
            lines.append(f"    <NoDataValue>{number_text(nodata)}</NoDataValue>")
        if HISTOGRAMS in items:
            lines += histograms.lines(items[HISTOGRAMS], "    ")
        lines += [
            f'    <SourceFilename relativeToVRT="1">{source}</SourceFilename>',
            f"    <ImageOffset>{offset + b * rows * cols * item}</ImageOffset>",
            f"    <PixelOffset>{item}</PixelOffset>",
            f"    <LineOffset>{cols * item}</LineOffset>",
            f"    <ByteOrder>{order}</ByteOrder>",
            "  </VRTRasterBand>",
        ]
    lines.append("</VRTDataset>")
    return ("\n".join(lines) + "\n").encode()


def _gdal_geotransform(geo: GeoReference) -> str:
    """A GeoTransform as GDAL writes one into a VRT (the same text when it saves statistics)."""
    return ",".join(f"{v:24.16e}" for v in geo.geotransform)


def max_rewrite_bytes(meta: ArrayMeta) -> int:
    """The most a rewrite of a VRT view or an .aux.xml may hold: a band's text and statistics
    take under 1 KiB, a histogram of 256 buckets about 2 KiB, the header metadata GDAL copies
    into an .aux.xml a few hundred bytes (and a CRS's WKT: a few KiB)."""
    return (16 << 10) * _bands_rows_cols(meta)[0] + (64 << 10)


def _mdi(key: str, value: str) -> str:
    return f"      <MDI key={quoteattr(key)}>{escape(value)}</MDI>"


def _metadata(items: dict[str, str]) -> list[str]:
    """A band's `<Metadata>` of its kept STATISTICS_* items (none: nothing)."""
    kept = sorted((k, v) for k, v in items.items() if k != HISTOGRAMS)
    return ["    <Metadata>"] + [_mdi(k, v) for k, v in kept] + ["    </Metadata>"] if kept else []


def pam(meta: ArrayMeta, statistics: list[dict[str, str]] | None = None) -> bytes:
    """raw/PATH.raw.aux.xml: GDAL's auxiliary file of PATH.raw, holding the statistics GDAL
    saved (none yet: an empty document, which GDAL reads as nothing)."""
    lines = ["<PAMDataset>"]
    for b, items in enumerate(statistics or []):
        if items:
            lines.append(f'  <PAMRasterBand band="{b + 1}">')
            lines += histograms.lines(items[HISTOGRAMS], "    ") if HISTOGRAMS in items else []
            lines += _metadata(items) + ["  </PAMRasterBand>"]
    lines.append("</PAMDataset>")
    return ("\n".join(lines) + "\n").encode()


def _items(metadata: ElementTree.Element) -> dict[str, str] | None:
    """The MDI items of a <Metadata> element (None when it holds anything else)."""
    items = {}
    for mdi in metadata:
        if mdi.tag != "MDI" or len(mdi) or "key" not in mdi.attrib:
            return None
        items[mdi.attrib["key"]] = (mdi.text or "").strip()
    return items


def _envi_items(meta: ArrayMeta, geo: GeoReference | None) -> dict[str, str]:
    """The ENVI metadata domain GDAL reads from raw/PATH.hdr (names with `_` for spaces)."""
    lines = envi_header(meta, geo).decode().splitlines()[1:]
    return {k.strip().replace(" ", "_"): v.strip() for k, v in (line.split("=", 1) for line in lines)}


def pam_statistics(written: bytes, meta: ArrayMeta, geo: GeoReference | None = None) -> list[dict[str, str]] | None:
    """The statistics a write of raw/PATH.raw.aux.xml saves, one dict a band; None when it holds
    more than band STATISTICS_* items and the metadata GDAL read from PATH.hdr (made with `geo`)."""
    try:
        tree = ElementTree.fromstring(written)
    except ElementTree.ParseError:
        return None
    derived = {"IMAGE_STRUCTURE": {"INTERLEAVE": "BAND"}, "ENVI": _envi_items(meta, geo)}
    bands = _bands_rows_cols(meta)[0]
    statistics: list[dict[str, str]] = [{} for _ in range(bands)]
    if tree.tag != "PAMDataset" or tree.attrib:
        return None
    for child in tree:
        if child.tag == "Metadata":
            domain, items = child.get("domain"), _items(child)
            if domain not in derived or items is None or not _copied(items, derived[domain]):
                return None
        elif (
            child.tag == "PAMRasterBand"
            and BAND_NUMBER.fullmatch(child.get("band", ""))
            and int(child.attrib["band"]) <= bands
        ):
            items = _band_statistics(child)
            _drop_own_nodata(child, geo)
            if items is None or len(child) or set(child.attrib) != {"band"}:
                return None
            statistics[int(child.attrib["band"]) - 1] = items
        else:
            return None
    return statistics


def _copied(items: dict[str, str], derived: dict[str, str]) -> bool:
    """Whether `items` are the metadata GDAL copies from `derived` (it leaves out an ENVI map
    info it has read as the georeference)."""
    left_out = derived.keys() - items.keys()
    return left_out <= ENVI_GEOREFERENCE_ITEMS and all(derived.get(k) == v for k, v in items.items())


def _band_statistics(band: ElementTree.Element) -> dict[str, str] | None:
    """Take a band's STATISTICS_* items and its histograms out of `band` (None when it holds
    other metadata, or histograms that are not numbers)."""
    items: dict[str, str] = {}
    for md in band.findall("Metadata"):
        found = _items(md)
        if md.attrib or found is None or not all(k.startswith(STATISTICS_PREFIX) for k in found):
            return None  # a metadata domain, or other items: more than statistics
        items.update(found)
        band.remove(md)
    for element in band.findall("Histograms"):
        text = histograms.canonical(element)
        if text is None or HISTOGRAMS in items:
            return None
        items[HISTOGRAMS] = text
        band.remove(element)
    for name in GDAL_ADDED_BAND_ATTRIBUTES:
        band.attrib.pop(name, None)
    return items


def _same_tree(a: ElementTree.Element, b: ElementTree.Element) -> bool:
    return (
        a.tag == b.tag
        and a.attrib == b.attrib
        and (a.text or "").strip() == (b.text or "").strip()
        and len(a) == len(b)
        and all(_same_tree(x, y) for x, y in zip(a, b))
    )


def _same_number(text: str | None, value: float, single: bool = False) -> bool:
    """Whether GDAL's text of a number is `value` (printed in full, or with `single`, as a float32:
    a NoData value of a float32 band)."""
    try:
        got = float((text or "").strip())
    except ValueError:
        return False
    if got == value or (math.isnan(got) and math.isnan(value)):
        return True
    if not single:
        return False
    with np.errstate(over="ignore"):
        narrowed = np.float32(value)
        return bool(np.isfinite(narrowed) and np.float32(got) == narrowed)


def _drop_own_nodata(band: ElementTree.Element, geo: GeoReference | None) -> None:
    """Take out of `band` the NoDataValue GDAL copied from the view (its own value only)."""
    for element in band.findall("NoDataValue"):
        if geo is not None and geo.nodata is not None and _same_number(element.text, geo.nodata, single=True):
            band.remove(element)


def _own_georeference(tree: ElementTree.Element, ours: ElementTree.Element, geo: GeoReference | None) -> None:
    """Give the georeference GDAL wrote back into a VRT the view's own text where it means the
    same: the same SRS (GDAL writes it again as WKT 1, with its axis mapping), GeoTransform
    and NoDataValue numbers."""
    if geo is None:
        return
    srs, own_srs = tree.find("SRS"), ours.find("SRS")
    if srs is not None and own_srs is not None and geo.crs is not None:
        srs.attrib.pop("dataAxisToSRSAxisMapping", None)
        said = " ".join((srs.text or "").split())
        again = crs_of_wkt(said)
        if (
            said == own_srs.text
            or (geo.crs.epsg is not None and again.epsg == geo.crs.epsg)
            or (geo.crs.epsg is None and geo.crs.name is not None and again.name == geo.crs.name)
        ):
            srs.text = own_srs.text
    transform = tree.find("GeoTransform")
    if transform is not None:
        numbers = (transform.text or "").split(",")
        if len(numbers) == 6 and all(_same_number(t, v) for t, v in zip(numbers, geo.geotransform)):
            transform.text = _gdal_geotransform(geo)
    if geo.nodata is not None:
        for band in tree.findall("VRTRasterBand"):
            for element in band.findall("NoDataValue"):
                if _same_number(element.text, geo.nodata, single=True):
                    element.text = number_text(geo.nodata)


def vrt_statistics(
    written: bytes, meta: ArrayMeta, npy_name: str, geo: GeoReference | None = None
) -> list[dict[str, str]] | None:
    """The statistics a rewrite of gdal/PATH.vrt saves, one dict a band; None when the written
    text is not the view's VRT (made with `geo`) with STATISTICS_* band metadata added (what
    GDAL writes back after computing statistics) but some other change, or no VRT at all."""
    try:
        tree = ElementTree.fromstring(written)
    except ElementTree.ParseError:
        return None
    bands = tree.findall("VRTRasterBand")
    statistics = [_band_statistics(band) for band in bands]
    ours = ElementTree.fromstring(vrt(meta, npy_name, geo=geo))
    _own_georeference(tree, ours, geo)
    if any(s is None for s in statistics) or not _same_tree(tree, ours):
        return None
    return statistics  # type: ignore[return-value]


def text(
    view: str,
    meta: ArrayMeta,
    npy_name: str,
    statistics: list[dict[str, str]] | None = None,
    geo: GeoReference | None = None,
) -> bytes:
    """The bytes of a generated text file of an image view (a VRT with the statistics kept for
    it), georeferenced by `geo`."""
    return envi_header(meta, geo) if view == "raw" else vrt(meta, npy_name, statistics, geo)
