"""TIFF headers for the `.zarrfs/tiff/` view: every IFD and its tag data before the pixels, which follow as C-order elements.

The last two dimensions of an array are a page's rows and columns; every other index
is a page, in C order. Pages are contiguous and uncompressed, cut into strips of rows,
so a TIFF file is `header(...)` followed by the array's raw C-order little-endian
element bytes: an ArrayStream with this header serves it. Pure: no I/O.
"""

from __future__ import annotations

import fractions
import json
import math
import struct
from typing import Any

import numpy as np

from .georef import CrsKind, GeoReference, number_text

# TIFF SampleFormat values (TIFF 6.0 section 19; 6 = complex float, a GDAL/tifffile extension).
SAMPLE_UINT, SAMPLE_INT, SAMPLE_FLOAT, SAMPLE_COMPLEX = 1, 2, 3, 6
SAMPLE_FORMATS = {"b": SAMPLE_UINT, "u": SAMPLE_UINT, "i": SAMPLE_INT, "f": SAMPLE_FLOAT, "c": SAMPLE_COMPLEX}
# Field types: SHORT, LONG, ASCII, RATIONAL (two LONGs), DOUBLE, LONG8 (BigTIFF).
ASCII, SHORT, LONG, RATIONAL, DOUBLE, LONG8 = 2, 3, 4, 5, 12, 16
# Strips of about this many bytes: readers that load a strip at a time (libtiff, GDAL)
# read a bounded piece, and the strip tables stay small next to the pixels.
STRIP_TARGET_BYTES = 1 << 20
# Pixel data start on a page-cache page boundary, so the kernel's page-sized reads of one
# TIFF page never carry bytes of its neighbour (and so never load its chunks).
DATA_ALIGN = 4096
# A TIFF whose IFDs would take more than this (millions of tiny pages) is not offered:
# the header is built whole and held by every open of the file.
MAX_HEADER_BYTES = 16 << 20
# Attributes larger than this are left out of ImageDescription (it is read whole by readers).
MAX_DESCRIPTION_BYTES = 64 << 10
# Classic TIFF offsets are 32-bit: a larger file is written as BigTIFF.
CLASSIC_MAX_BYTES = (1 << 32) - 1
# GeoTIFF tags (GeoTIFF 1.1, OGC 19-008r4) and GDAL's NoData tag.
MODEL_PIXEL_SCALE, MODEL_TIEPOINT, MODEL_TRANSFORMATION = 33550, 33922, 34264
GEO_KEY_DIRECTORY, GEO_ASCII_PARAMS, GDAL_NODATA = 34735, 34737, 42113
# GeoKeys: GTModelTypeGeoKey, GTRasterTypeGeoKey (1: PixelIsArea), GTCitationGeoKey,
# GeographicTypeGeoKey, ProjectedCSTypeGeoKey; EPSG codes a SHORT key can hold (32767 is
# "user-defined").
MODEL_TYPE_KEY, RASTER_TYPE_KEY, CITATION_KEY = 1024, 1025, 1026
GEOGRAPHIC_TYPE_KEY, PROJECTED_TYPE_KEY = 2048, 3072
PIXEL_IS_AREA = 1
EPSG_KEY_MAX = 32766
# A CRS name longer than this is cut in the citation (readers show it; the EPSG code is what counts).
CITATION_MAX_CHARS = 200


def supported(dtype: np.dtype, shape: tuple[int, ...]) -> bool:
    """Whether an array can be shown as TIFF: 2+ dimensions, none empty, a numeric or bool type."""
    return (
        len(shape) >= 2
        and all(n > 0 for n in shape)
        and shape[-1] < 1 << 32
        and shape[-2] < 1 << 32
        and dtype.fields is None
        and dtype.subdtype is None
        and dtype.kind in SAMPLE_FORMATS
    )


def header_fits(dtype: np.dtype, shape: tuple[int, ...], geo: Tags = ()) -> bool:
    """Whether the header stays within MAX_HEADER_BYTES (a bound from BigTIFF's sizes,
    the larger encoding, without building it), with `geo` tags on every page."""
    rows_per_strip, n_strips = _strips(shape[-2], shape[-1] * dtype.itemsize)
    per_page = 8 + 13 * 20 + 8 + (2 * 8 * n_strips if n_strips > 1 else 0) + _tags_bound(geo)
    return 16 + math.prod(shape[:-2]) * per_page + 2 * MAX_DESCRIPTION_BYTES <= MAX_HEADER_BYTES


def _tags_bound(tags: Tags) -> int:
    """The most `tags` add to a BigTIFF IFD: an entry each, and their values (8 bytes a number), padded."""
    total = 0
    for _, _, value in tags:
        size = len(value) if isinstance(value, bytes) else 8 * len(value) if isinstance(value, (list, tuple)) else 8
        total += 20 + size + size % 2
    return total


def pixel_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype of the TIFF's pixels: the array's, little-endian; bool as 8-bit unsigned."""
    return np.dtype(np.uint8) if dtype.kind == "b" else dtype.newbyteorder("<")


def description(path: str, shape: tuple[int, ...], dtype: np.dtype, attributes: Any, axes: str | None = None) -> str:
    """ImageDescription: JSON with the array's shape first (tifffile reads it back as the
    N-D shape, and `axes`, one of its axis letters per dimension, when known), path, dtype and
    attributes (left out when larger than MAX_DESCRIPTION_BYTES)."""
    doc: dict[str, Any] = {
        "shape": list(shape),
        **({"axes": axes} if axes else {}),
        "path": path,
        "dtype": np.lib.format.dtype_to_descr(dtype),
        "attributes": attributes,
    }
    text = json.dumps(doc, default=str)
    if len(text) > MAX_DESCRIPTION_BYTES:
        doc["attributes"] = None
        doc["attributes_omitted_bytes"] = len(text)
        text = json.dumps(doc, default=str)
    return text


class _Layout:
    """Sizes of the classic or BigTIFF encoding."""

    def __init__(self, big: bool) -> None:
        self.big = big
        self.offset_type = LONG8 if big else LONG
        self.offset_fmt = "Q" if big else "I"
        self.offset_size = 8 if big else 4
        self.entry_size = 20 if big else 12
        self.count_fmt = "Q" if big else "H"  # number of entries in an IFD
        self.file_header = 16 if big else 8
        self.inline = 8 if big else 4  # values up to this many bytes sit in the entry itself


Tags = tuple[tuple[int, int, Any], ...]  # (tag, field type, value)

_TYPE_FMT = {ASCII: "s", SHORT: "H", LONG: "I", RATIONAL: "I", DOUBLE: "d", LONG8: "Q"}


def _ifd(lay: _Layout, at: int, tags: list[tuple[int, int, Any]], next_ifd_at: int | None) -> tuple[bytes, int]:
    """One IFD at file offset `at`, followed by its out-of-line values: (bytes, offset after them)."""
    n = len(tags)
    ifd_size = (8 if lay.big else 2) + n * lay.entry_size + lay.offset_size
    extra_at = at + ifd_size
    entries, extra = [], b""
    for code, ftype, value in sorted(tags, key=lambda t: t[0]):
        if ftype == ASCII:
            data, count = value, len(value)
        else:
            values = value if isinstance(value, (list, tuple)) else [value]
            data = struct.pack(f"<{len(values)}{_TYPE_FMT[ftype]}", *values)
            count = len(values) // 2 if ftype == RATIONAL else len(values)
        if len(data) <= lay.inline:
            field = data.ljust(lay.inline, b"\0")
        else:
            field = struct.pack("<" + lay.offset_fmt, extra_at + len(extra))
            extra += data + b"\0" * (len(data) % 2)  # values start on a word boundary
        entries.append(struct.pack("<HH" + lay.offset_fmt, code, ftype, count) + field)
    out = struct.pack("<" + lay.count_fmt, n) + b"".join(entries)
    out += struct.pack("<" + lay.offset_fmt, next_ifd_at or 0)
    return out + extra, at + len(out) + len(extra)


def _ifd_size(lay: _Layout, tags: list[tuple[int, int, Any]]) -> int:
    return len(_ifd(lay, 0, tags, None)[0])


def _page_tags(
    lay: _Layout,
    dtype: np.dtype,
    rows: int,
    cols: int,
    strip_offsets: list[int],
    strip_counts: list[int],
    rows_per_strip: int,
    desc: bytes | None,
) -> list[tuple[int, int, Any]]:
    tags = [
        (254, LONG, 0),  # NewSubfileType: a full-resolution image
        (256, LONG, cols),
        (257, LONG, rows),
        (258, SHORT, dtype.itemsize * 8),  # BitsPerSample
        (259, SHORT, 1),  # Compression: none
        (262, SHORT, 1),  # PhotometricInterpretation: MinIsBlack
        (273, lay.offset_type, strip_offsets),
        (277, SHORT, 1),  # SamplesPerPixel
        (278, LONG, rows_per_strip),
        (279, lay.offset_type, strip_counts),
        (284, SHORT, 1),  # PlanarConfiguration: contiguous
        (339, SHORT, SAMPLE_FORMATS[dtype.kind]),
    ]
    if desc is not None:
        tags.append((270, ASCII, desc))
    return tags


def _strips(rows: int, row_bytes: int) -> tuple[int, int]:
    """(rows per strip, strips per page)."""
    rows_per_strip = max(1, min(rows, STRIP_TARGET_BYTES // max(row_bytes, 1)))
    return rows_per_strip, -(-rows // rows_per_strip)


def _build(
    lay: _Layout,
    dtype: np.dtype,
    shape: tuple[int, ...],
    desc: bytes,
    data_at: int | None,
    geo: Tags = (),
    geo_pages: int = 0,
) -> bytes:
    """The header with pixel data at `data_at`, padded up to it (None: unpadded, offsets left 0,
    for its length, which the offsets' values do not change); `geo`: tags of the first
    `geo_pages` pages."""
    rows, cols = shape[-2], shape[-1]
    pages = math.prod(shape[:-2])
    row_bytes = cols * dtype.itemsize
    page_bytes = rows * row_bytes
    rows_per_strip, n_strips = _strips(rows, row_bytes)
    counts = [rows_per_strip * row_bytes] * (n_strips - 1) + [(rows - rows_per_strip * (n_strips - 1)) * row_bytes]
    magic = b"II" + (
        struct.pack("<HHHQ", 43, 8, 0, lay.file_header) if lay.big else struct.pack("<HI", 42, lay.file_header)
    )
    parts, at = [magic], lay.file_header
    for p in range(pages):
        start = p * page_bytes + (data_at or 0)
        offsets = [0 if data_at is None else start + s * rows_per_strip * row_bytes for s in range(n_strips)]
        tags = _page_tags(lay, dtype, rows, cols, offsets, counts, rows_per_strip, desc if p == 0 else None)
        tags += geo if p < geo_pages else ()
        size = _ifd_size(lay, tags)
        if at + size > MAX_HEADER_BYTES:
            raise ValueError(f"TIFF header of {pages} pages exceeds {MAX_HEADER_BYTES} bytes")
        ifd, at = _ifd(lay, at, tags, at + size if p + 1 < pages else None)
        parts.append(ifd)
    head = b"".join(parts)
    return head if data_at is None else head + b"\0" * (data_at - len(head))


def header(dtype: np.dtype, shape: tuple[int, ...], desc: str = "", geo: Tags = ()) -> bytes:
    """The TIFF bytes before the pixels of an array of `shape` whose pixels are `dtype`
    (little-endian, as `pixel_dtype` gives): BigTIFF when the whole file passes 4 GiB.
    `geo`: the GeoTIFF tags (`geo_tags`) every page carries, or the first one alone when
    they would take the header past MAX_HEADER_BYTES (`header_fits` leaves room there for
    what one page carries).

    ValueError when the array cannot be a TIFF or its header would pass MAX_HEADER_BYTES.
    """
    if not supported(dtype, shape):
        raise ValueError(f"no TIFF of a {dtype} array of shape {shape}")
    desc_bytes = desc.encode("ascii", "backslashreplace") + b"\0"
    pages = math.prod(shape[:-2])
    return _header(dtype, shape, desc_bytes, geo, pages if header_fits(dtype, shape, geo) else 1)


def _header(dtype: np.dtype, shape: tuple[int, ...], desc: bytes, geo: Tags, geo_pages: int) -> bytes:
    data_bytes = math.prod(shape) * dtype.itemsize
    for big in (False, True):
        lay = _Layout(big)
        length = len(_build(lay, dtype, shape, desc, None, geo, geo_pages))
        data_at = -(-length // DATA_ALIGN) * DATA_ALIGN
        if big or data_at + data_bytes <= CLASSIC_MAX_BYTES:
            return _build(lay, dtype, shape, desc, data_at, geo, geo_pages)
    raise AssertionError("unreachable")


def geo_tags(geo: GeoReference) -> Tags:
    """GeoTIFF tags of a georeference: ModelPixelScale and ModelTiepoint when north-up, else
    ModelTransformation; the GeoKeyDirectory (PixelIsArea, the EPSG code of a projected or
    geographic CRS, its name as citation); GDAL_NODATA."""
    gt = geo.geotransform
    if geo.north_up:
        tags: list[tuple[int, int, Any]] = [
            (MODEL_PIXEL_SCALE, DOUBLE, (gt[1], -gt[5], 0.0)),
            (MODEL_TIEPOINT, DOUBLE, (0.0, 0.0, 0.0, gt[0], gt[3], 0.0)),
        ]
    else:
        matrix = (gt[1], gt[2], 0.0, gt[0], gt[4], gt[5], 0.0, gt[3], 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0)
        tags = [(MODEL_TRANSFORMATION, DOUBLE, matrix)]
    keys = [(RASTER_TYPE_KEY, 0, 1, PIXEL_IS_AREA)]
    crs = geo.crs
    if crs is not None and crs.kind is not None and crs.epsg is not None and 0 < crs.epsg <= EPSG_KEY_MAX:
        keys.append((MODEL_TYPE_KEY, 0, 1, crs.kind.value))
        keys.append((PROJECTED_TYPE_KEY if crs.kind is CrsKind.PROJECTED else GEOGRAPHIC_TYPE_KEY, 0, 1, crs.epsg))
        if crs.name:
            citation = crs.name[:CITATION_MAX_CHARS].replace("|", "/").encode("ascii", "backslashreplace") + b"|"
            keys.append((CITATION_KEY, GEO_ASCII_PARAMS, len(citation), 0))
            tags.append((GEO_ASCII_PARAMS, ASCII, citation + b"\0"))
    keys.sort()
    directory = [1, 1, 0, len(keys)] + [v for key in keys for v in key]
    tags.append((GEO_KEY_DIRECTORY, SHORT, directory))
    if geo.nodata is not None:
        tags.append((GDAL_NODATA, ASCII, number_text(geo.nodata).encode() + b"\0"))
    return tuple(tags)


def resolution_tags(y_per_unit: float, x_per_unit: float, unit: int) -> Tags:
    """YResolution, XResolution (pixels per unit, as rationals) and ResolutionUnit (1: none,
    3: centimetre); none when a value is no positive rational of 32-bit terms."""
    out: list[tuple[int, int, Any]] = []
    for code, value in ((283, y_per_unit), (282, x_per_unit)):
        if not (value > 0 and math.isfinite(value)):
            return ()
        frac = fractions.Fraction(value).limit_denominator(1 << 20)
        if not 0 < frac.numerator < 1 << 32:
            return ()
        out.append((code, RATIONAL, [frac.numerator, frac.denominator]))
    return (*out, (296, SHORT, unit))
