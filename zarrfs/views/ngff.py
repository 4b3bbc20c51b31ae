"""OME-Zarr (NGFF 0.4 and 0.5) multiscale images: their metadata read from group attributes, their pyramid, and OME-XML.

An image group's attributes (0.4: `multiscales` and `omero`; 0.5: the same under `ome`)
give the axes, the levels' paths and scales, and the channels; the levels' array metadata
decide which levels form a TIFF pyramid. Pure: no I/O, no trio.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any
from xml.etree import ElementTree

import numpy as np

from ..model import ArrayMeta

# OME pixel types by numpy type code (kind + bytes): OME has no 64-bit integers, and float16
# is shown as float (converted while read, exactly); bool as uint8 0/1.
OME_TYPES = {
    "u1": "uint8",
    "b1": "uint8",
    "i1": "int8",
    "u2": "uint16",
    "i2": "int16",
    "u4": "uint32",
    "i4": "int32",
    "f2": "float",
    "f4": "float",
    "f8": "double",
    "c8": "complexfloat",
    "c16": "complexdouble",
}
# The TIFF pixels' dtype of each OME type (little-endian).
PIXEL_DTYPES = {
    "uint8": "<u1",
    "int8": "<i1",
    "uint16": "<u2",
    "int16": "<i2",
    "uint32": "<u4",
    "int32": "<i4",
    "float": "<f4",
    "double": "<f8",
    "complexfloat": "<c8",
    "complexdouble": "<c16",
}
# NGFF units are UDUNITS-2 names; OME-XML's UnitsLength and UnitsTime are symbols.
_PREFIXES = {
    "yotta": "Y",
    "zetta": "Z",
    "exa": "E",
    "peta": "P",
    "tera": "T",
    "giga": "G",
    "mega": "M",
    "kilo": "k",
    "hecto": "h",
    "deca": "da",
    "deci": "d",
    "centi": "c",
    "milli": "m",
    "micro": "\u00b5",
    "nano": "n",
    "pico": "p",
    "femto": "f",
    "atto": "a",
    "zepto": "z",
    "yocto": "y",
}
LENGTH_UNITS = {p + "meter": s + "m" for p, s in _PREFIXES.items() if p != "deca"} | {
    "meter": "m",
    "angstrom": "\u00c5",
    "inch": "in",
    "foot": "ft",
    "yard": "yd",
    "mile": "mi",
    "parsec": "pc",
}
TIME_UNITS = {p + "second": s + "s" for p, s in _PREFIXES.items() if p not in ("deca",)} | {
    "second": "s",
    "minute": "min",
    "hour": "h",
    "day": "d",
}
OME_NS = "http://www.openmicroscopy.org/Schemas/OME/2016-06"
# Axis letters of OME's five dimensions; the plane axes of a TIFF are the last two.
AXES = "tczyx"


class NotShown(ValueError):
    """An image the OME-TIFF view cannot show (the message says why)."""


@dataclasses.dataclass(frozen=True)
class Image:
    """What an NGFF multiscale image's group attributes say."""

    version: str
    name: str
    axes: tuple[str, ...]  # letters of AXES, in the arrays' dimension order
    units: tuple[str | None, ...]  # each axis' NGFF unit
    paths: tuple[str, ...]  # the levels' array paths, relative to the group, largest first
    scales: tuple[tuple[float, ...] | None, ...]  # each level's scale (its own and the multiscale's)
    channels: tuple[tuple[str | None, int | None], ...]  # (name, OME colour) from omero

    @property
    def scale(self) -> tuple[float, ...] | None:
        """Level 0's scale, per axis."""
        return self.scales[0]


def _ome_attributes(attributes: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The NGFF part of a group's attributes and its version (0.5: under `ome`)."""
    ome = attributes.get("ome")
    if isinstance(ome, dict) and "multiscales" in ome:
        return ome, str(ome.get("version", "0.5"))
    return attributes, ""


def is_image(attributes: dict[str, Any]) -> bool:
    """Whether group attributes declare an NGFF multiscale image (well formed or not)."""
    ngff, _ = _ome_attributes(attributes)
    ms = ngff.get("multiscales")
    return isinstance(ms, list) and bool(ms) and isinstance(ms[0], dict)


def _axis_letter(axis: Any) -> str:
    name = axis if isinstance(axis, str) else axis.get("name") if isinstance(axis, dict) else None
    if not isinstance(name, str) or name.lower() not in AXES:
        kind = axis.get("type") if isinstance(axis, dict) else None
        letter = {"time": "t", "channel": "c"}.get(kind) if isinstance(kind, str) else None
        if letter is None:
            raise NotShown(f"axis {name!r} is none of t, c, z, y, x")
        return letter
    return name.lower()


def _scale(transforms: Any, ndim: int) -> list[float] | None:
    for t in transforms if isinstance(transforms, list) else []:
        if isinstance(t, dict) and t.get("type") == "scale":
            s = t.get("scale")
            if isinstance(s, list) and len(s) == ndim and all(isinstance(v, (int, float)) for v in s):
                return [float(v) for v in s]
    return None


def _colour(text: Any) -> int | None:
    """OME's Color (RGBA as a signed 32-bit integer) of omero's `RRGGBB`."""
    if not isinstance(text, str) or len(text) != 6:
        return None
    try:
        rgba = (int(text, 16) << 8) | 0xFF
    except ValueError:
        return None
    return rgba - (1 << 32) if rgba >= 1 << 31 else rgba


def image(attributes: dict[str, Any]) -> Image:
    """The image an image group's attributes describe (NotShown: why it cannot be shown)."""
    ngff, version = _ome_attributes(attributes)
    ms = ngff["multiscales"][0]
    version = version or str(ms.get("version", ""))
    axes_doc = ms.get("axes")
    if not isinstance(axes_doc, list) or len(axes_doc) < 2:
        raise NotShown("multiscales has no axes (NGFF before 0.3)")
    axes = tuple(_axis_letter(a) for a in axes_doc)
    if len(set(axes)) != len(axes) or axes[-2:] != ("y", "x"):
        raise NotShown(f"axes {''.join(axes)} do not end in y, x, or repeat one")
    units = tuple(a.get("unit") if isinstance(a, dict) and isinstance(a.get("unit"), str) else None for a in axes_doc)
    datasets = ms.get("datasets")
    if not isinstance(datasets, list) or not datasets:
        raise NotShown("multiscales has no datasets")
    paths = []
    for d in datasets:
        path = d.get("path") if isinstance(d, dict) else None
        if not isinstance(path, str) or not path or path.startswith("/") or ".." in path.split("/"):
            raise NotShown(f"dataset path {path!r} is not a path within the group")
        paths.append(path.strip("/"))
    outer = _scale(ms.get("coordinateTransformations"), len(axes))
    scales = []
    for d in datasets:
        scale = _scale(d.get("coordinateTransformations"), len(axes))
        if scale is not None and outer is not None:
            scale = [a * b for a, b in zip(scale, outer)]
        scales.append(tuple(scale) if scale is not None else None)
    channels = []
    omero = ngff.get("omero")
    listed = omero.get("channels") if isinstance(omero, dict) else None
    for ch in listed if isinstance(listed, list) else []:
        if isinstance(ch, dict):
            label = ch.get("label")
            channels.append((label if isinstance(label, str) else None, _colour(ch.get("color"))))
    name = ms.get("name")
    return Image(
        version,
        name if isinstance(name, str) else "",
        axes,
        units,
        tuple(paths),
        tuple(scales),
        tuple(channels),
    )


def pixel_type(dtype: np.dtype, low: int | None = None, high: int | None = None) -> str:
    """The OME pixel type of an array's dtype (NotShown for those OME has not). 64-bit integers
    whose every value lies in [LOW, HIGH] (labels, scanned) take the 32-bit type that holds them."""
    code = f"{dtype.kind}{dtype.itemsize}"
    if dtype.kind in "iu" and dtype.itemsize == 8 and low is not None and high is not None:
        if 0 <= low and high <= 0xFFFFFFFF:
            return "uint32"
        if -(1 << 31) <= low and high < 1 << 31:
            return "int32"
    if dtype.fields is not None or dtype.subdtype is not None or code not in OME_TYPES:
        scanned = "" if low is None else f", values {low}..{high}"
        raise NotShown(f"OME-TIFF has no pixel type for {dtype}{scanned} (OME's largest integers are 32-bit)")
    return OME_TYPES[code]


# 64-bit integer images (labels) are scanned for their values when their levels' chunks
# decode to at most this much together: a label image of some 8 million pixels, read once
# through the chunk cache when its file is first listed.
SCAN_MAX_BYTES = 64 << 20
SCAN_MAX_CHUNKS = 4096


def scan_wanted(levels: list[ArrayMeta]) -> bool:
    """Whether the values of an image of 64-bit integers are read to find a pixel type that holds them."""
    chunks = [math.prod(-(-n // c) for n, c in zip(m.shape, m.chunk_shape)) for m in levels]
    return (
        wide_integers(levels[0].dtype)
        and sum(chunks) <= SCAN_MAX_CHUNKS
        and sum(n * m.chunk_nbytes for n, m in zip(chunks, levels)) <= SCAN_MAX_BYTES
    )


def wide_integers(dtype: np.dtype) -> bool:
    """Whether an image's values decide its pixel type (64-bit integers: pixel_type's LOW, HIGH)."""
    return dtype.kind in "iu" and dtype.itemsize == 8


def reduction(base: tuple[int, ...], level: tuple[int, ...]) -> int | None:
    """The integer factor F >= 2 by which LEVEL reduces only the last two dimensions of BASE
    (each the floor or ceiling of the base's divided by F); None when there is none."""
    if len(base) != len(level) or base[:-2] != level[:-2] or min(level[-2:]) < 1:
        return None
    (h0, w0), (h, w) = base[-2:], level[-2:]
    candidates = range(max(2, min(h0 // (h + 1), w0 // (w + 1))), max(h0 // h, w0 // w) + 2)
    for f in candidates:
        if h in (h0 // f, -(-h0 // f)) and w in (w0 // f, -(-w0 // f)):
            return f
    return None


def pyramid(img: Image, levels: list[ArrayMeta | None]) -> tuple[list[ArrayMeta], list[str]]:
    """The levels that form the TIFF pyramid (level 0 first), and why each other one is left out.

    NotShown when level 0 cannot be shown."""
    base = levels[0]
    if base is None:
        raise NotShown(f"level 0 ({img.paths[0]}) is not an array")
    if len(base.shape) != len(img.axes):
        raise NotShown(f"level 0 has {len(base.shape)} dimensions, axes name {len(img.axes)}")
    if any(n == 0 for n in base.shape) or base.shape[-1] >= 1 << 32 or base.shape[-2] >= 1 << 32:
        raise NotShown(f"level 0's shape {base.shape} cannot be a TIFF")
    if not wide_integers(base.dtype):
        pixel_type(base.dtype)
    kept, notes, last = [base], [], 1
    for path, meta in zip(img.paths[1:], levels[1:]):
        f = reduction(base.shape, meta.shape) if meta is not None and meta.dtype == base.dtype else None
        if meta is None or f is None or f <= last:
            notes.append(f"level {path} is not level 0 reduced in y and x alone by an integer factor")
            continue
        kept.append(meta)
        last = f
    return kept, notes


def dimension_order(axes: tuple[str, ...]) -> str:
    """OME's DimensionOrder whose planes are the C order of the arrays' leading axes
    (XYZCT for t, c, z; axes an array lacks, of size 1, go last)."""
    lead = [a.upper() for a in reversed(axes[:-2])]
    return "XY" + "".join(lead) + "".join(a for a in "ZCT" if a not in lead)


def _unit(letter: str, unit: str | None) -> tuple[bool, str | None]:
    """(whether the size may be stated, OME's unit symbol or None for OME's default)."""
    if unit is None:
        return True, None
    table = TIME_UNITS if letter == "t" else LENGTH_UNITS
    symbol = table.get(unit.lower())
    return symbol is not None, symbol


def ome_xml(img: Image, name: str, shape: tuple[int, ...], ome_type: str) -> str:
    """The OME-XML of one image whose planes lie in IFDs 0.. in DimensionOrder order, ASCII
    (other characters as XML character references)."""
    sizes = dict.fromkeys("TCZ", 1) | {a.upper(): n for a, n in zip(img.axes, shape)}
    ElementTree.register_namespace("", OME_NS)
    q = "{" + OME_NS + "}"
    root = ElementTree.Element(q + "OME", {"Creator": "zarrfs"})
    image_el = ElementTree.SubElement(root, q + "Image", {"ID": "Image:0", "Name": name})
    attrs = {
        "ID": "Pixels:0",
        "DimensionOrder": dimension_order(img.axes),
        "Type": ome_type,
        "SizeX": str(sizes["X"]),
        "SizeY": str(sizes["Y"]),
        "SizeZ": str(sizes["Z"]),
        "SizeC": str(sizes["C"]),
        "SizeT": str(sizes["T"]),
        "BigEndian": "false",
        "Interleaved": "false",
    }
    for i, letter in enumerate(img.axes):
        value = img.scale[i] if img.scale is not None else None
        if letter == "c" or value is None or not (value > 0 and math.isfinite(value)):
            continue
        ok, symbol = _unit(letter, img.units[i])
        if not ok:
            continue
        field = "TimeIncrement" if letter == "t" else "PhysicalSize" + letter.upper()
        attrs[field] = repr(value)
        if symbol is not None:
            attrs[field + "Unit"] = symbol
    pixels = ElementTree.SubElement(image_el, q + "Pixels", attrs)
    for c in range(sizes["C"]):
        label, colour = img.channels[c] if c < len(img.channels) else (None, None)
        ch = {"ID": f"Channel:0:{c}", "SamplesPerPixel": "1"}
        if label:
            ch["Name"] = label
        if colour is not None:
            ch["Color"] = str(colour)
        ElementTree.SubElement(pixels, q + "Channel", ch)
    planes = sizes["T"] * sizes["C"] * sizes["Z"]
    ElementTree.SubElement(pixels, q + "TiffData", {"IFD": "0", "PlaneCount": str(planes)})
    body = ElementTree.tostring(root, encoding="us-ascii", xml_declaration=False).decode("ascii")
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + body


# tifffile's axis letters (its shaped series' `axes`) of dimension names; other names are Q.
TIFF_AXIS_LETTERS = {
    "t": "T",
    "time": "T",
    "c": "C",
    "channel": "C",
    "band": "C",
    "z": "Z",
    "y": "Y",
    "lat": "Y",
    "latitude": "Y",
    "x": "X",
    "lon": "X",
    "longitude": "X",
}
_PREFIX_POWERS = {
    "yotta": 24, "zetta": 21, "exa": 18, "peta": 15, "tera": 12, "giga": 9, "mega": 6, "kilo": 3,
    "hecto": 2, "deca": 1, "deci": -1, "centi": -2, "milli": -3, "micro": -6, "nano": -9,
    "pico": -12, "femto": -15, "atto": -18, "zepto": -21, "yocto": -24,
}  # fmt: skip
_METRES = {"meter": 1.0, "angstrom": 1e-10, "inch": 0.0254, "foot": 0.3048, "yard": 0.9144, "mile": 1609.344}


@dataclasses.dataclass(frozen=True)
class ArrayHints:
    """What an NGFF image group says of one of its levels: axes (tifffile's letters), scale, units."""

    axes: str
    scale: tuple[float, ...] | None
    units: tuple[str | None, ...]


def level_hints(attributes: dict[str, Any], name: str) -> ArrayHints | None:
    """The hints an image group's attributes give of its level NAME (None: not one of its levels)."""
    if not is_image(attributes):
        return None
    try:
        img = image(attributes)
    except NotShown:
        return None
    if name not in img.paths:
        return None
    return ArrayHints("".join(a.upper() for a in img.axes), img.scales[img.paths.index(name)], img.units)


def tiff_axes(names: tuple[Any, ...] | None) -> str | None:
    """tifffile's axes of v3 dimension names (a letter each, Q where none fits; no letter twice),
    None when no dimension is named."""
    if not names or all(n is None for n in names):
        return None
    out: list[str] = []
    for n in names:
        letter = TIFF_AXIS_LETTERS.get(n.lower(), "Q") if isinstance(n, str) else "Q"
        out.append("Q" if letter in out else letter)
    return "".join(out)


def metres(unit: str | None) -> float | None:
    """Metres in one NGFF length unit (None: not a length unit this knows)."""
    if unit is None:
        return None
    unit = unit.lower()
    if unit in _METRES:
        return _METRES[unit]
    for prefix, power in _PREFIX_POWERS.items():
        if unit == prefix + "meter":
            return 10.0**power
    return None


def resolution(hints: ArrayHints) -> tuple[float, float, int] | None:
    """TIFF's (y, x) pixels per unit and ResolutionUnit of a level: per centimetre (3) when its
    y and x units are lengths, per unit of the scale (1: none) when they have no unit."""
    if hints.scale is None:
        return None
    (sy, sx), (uy, ux) = hints.scale[-2:], hints.units[-2:]
    if uy is None and ux is None:
        return (1 / sy, 1 / sx, 1) if sy > 0 and sx > 0 else None
    my, mx = metres(uy), metres(ux)
    if my is None or mx is None or not (sy > 0 and sx > 0):
        return None
    return 1 / (sy * my * 100), 1 / (sx * mx * 100), 3
