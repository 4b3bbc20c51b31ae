"""The image views under `.zarrfs/`: tiff/PATH.tif, raw/PATH.hdr (ENVI), gdal/PATH.vrt, preview/PATH.png: names, layouts, texts.

Which arrays each view shows (a table of suffix, entry kind and eligibility), the byte
stream of a TIFF, and the generated ENVI and VRT texts. Pure: no I/O, no trio.
"""

from __future__ import annotations

from typing import Callable
from xml.sax.saxutils import escape

import numpy as np

from . import preview, tiff
from .layouts import ArrayStream, npy_header
from .model import ArrayMeta, Node

# ENVI `data type` codes (ENVI header format; GDAL's ENVI driver reads the same table).
ENVI_TYPES = {"u1": 1, "b1": 1, "i2": 2, "i4": 3, "f4": 4, "f8": 5, "c8": 6, "c16": 9,
              "u2": 12, "u4": 13, "i8": 14, "u8": 15}
# GDAL data type names of a VRTRawRasterBand (Int8 and Float16 need a GDAL newer than
# Debian 12's 3.6, so those arrays get no VRT).
GDAL_TYPES = {"u1": "Byte", "b1": "Byte", "u2": "UInt16", "i2": "Int16", "u4": "UInt32", "i4": "Int32",
              "u8": "UInt64", "i8": "Int64", "f4": "Float32", "f8": "Float64", "c8": "CFloat32",
              "c16": "CFloat64"}
# A VRT holds about 300 bytes a band: 65,536 bands keep its text under 20 MB.
MAX_VRT_BANDS = 1 << 16


def _code(dtype: np.dtype) -> str:
    return f"{dtype.kind}{dtype.itemsize}"


def _raster(meta: ArrayMeta, table: dict[str, object]) -> bool:
    """2-D or 3-D (bands, rows, columns), no empty dimension, a type the format names."""
    return (meta.dtype.fields is None and meta.dtype.subdtype is None and 2 <= len(meta.shape) <= 3
            and all(n > 0 for n in meta.shape) and _code(meta.dtype) in table)


def tiff_ok(meta: ArrayMeta) -> bool:
    """2+ dimensions of a TIFF type, and IFDs of a bounded size (not millions of pages)."""
    return tiff.supported(meta.dtype, meta.shape) and tiff.header_fits(tiff.pixel_dtype(meta.dtype), meta.shape)


def envi_ok(meta: ArrayMeta) -> bool:
    return _raster(meta, ENVI_TYPES)


def vrt_ok(meta: ArrayMeta) -> bool:
    return _raster(meta, GDAL_TYPES) and (len(meta.shape) == 2 or meta.shape[0] <= MAX_VRT_BANDS)


# view directory -> (file suffix, entry kind, which arrays it shows)
IMAGE_VIEWS: dict[str, tuple[str, str, Callable[[ArrayMeta], bool]]] = {
    "tiff": (".tif", "tiff", tiff_ok),
    "gdal": (".vrt", "text", vrt_ok),
    "preview": (".png", "preview", preview.supported),
}
# Files beside the arrays of an existing view directory: view -> (suffix, kind, which arrays).
BESIDE = {"raw": (".hdr", "text", envi_ok)}


def view_names(view: str, node: Node, base: str) -> list[tuple[str, str]]:
    """(name, entry kind) of a node in an image view directory (groups are directories;
    arrays the view cannot show are left out)."""
    if node.kind != "array":
        return [(base, "group")]
    suffix, kind, ok = IMAGE_VIEWS[view]
    return [(base + suffix, kind)] if isinstance(node, ArrayMeta) and ok(node) else []


def beside(view: str, node: Node, base: str) -> list[tuple[str, str]]:
    """(name, kind) of files an image view adds beside an array in another view (raw/PATH.hdr)."""
    extra = BESIDE.get(view)
    if extra is None or not isinstance(node, ArrayMeta) or not extra[2](node):
        return []
    return [(base + extra[0], extra[1])]


def tiff_stream(meta: ArrayMeta) -> ArrayStream:
    """The TIFF of an array: its header, then the elements in C order, little-endian."""
    dtype = tiff.pixel_dtype(meta.dtype)
    desc = tiff.description("/" + meta.path, meta.shape, meta.dtype, meta.attributes)
    return ArrayStream(meta, "C", False, header=tiff.header(dtype, meta.shape, desc), dtype=dtype)


def _bands_rows_cols(meta: ArrayMeta) -> tuple[int, int, int]:
    return (1, *meta.shape) if len(meta.shape) == 2 else meta.shape  # type: ignore[return-value]


def envi_header(meta: ArrayMeta) -> bytes:
    """raw/PATH.hdr: the raw view (C order, the .npy's byte order) as an ENVI band-sequential file."""
    bands, rows, cols = _bands_rows_cols(meta)
    big = meta.dtype.byteorder == ">" or (meta.dtype.byteorder == "=" and np.little_endian is False)
    text = (f"ENVI\ndescription = {{zarrfs array /{meta.path}}}\nsamples = {cols}\nlines = {rows}\n"
            f"bands = {bands}\nheader offset = 0\nfile type = ENVI Standard\n"
            f"data type = {ENVI_TYPES[_code(meta.dtype)]}\ninterleave = bsq\nbyte order = {int(big)}\n")
    return text.encode()


def vrt(meta: ArrayMeta, npy_name: str) -> bytes:
    """gdal/PATH.vrt: one VRTRawRasterBand per band, reading the main tree's PATH.npy past its
    header; `npy_name` is that file's name (a root array's is the mount's NAME.npy)."""
    bands, rows, cols = _bands_rows_cols(meta)
    item = meta.dtype.itemsize
    offset = len(npy_header(meta.dtype, meta.shape, False))
    dirs = meta.path.count("/") if meta.path else 0
    # From .zarrfs/gdal/DIRS/ back to the mount's root: works wherever the mount is.
    source = escape("../" * (dirs + 2) + (meta.path.rsplit("/", 1)[0] + "/" if dirs else "") + npy_name)
    order = "MSB" if meta.dtype.byteorder == ">" else "LSB"
    gdal_type = GDAL_TYPES[_code(meta.dtype)]
    lines = [f'<VRTDataset rasterXSize="{cols}" rasterYSize="{rows}">']
    for b in range(bands):
        lines += [f'  <VRTRasterBand dataType="{gdal_type}" band="{b + 1}" subClass="VRTRawRasterBand">',
                  f'    <SourceFilename relativeToVRT="1">{source}</SourceFilename>',
                  f"    <ImageOffset>{offset + b * rows * cols * item}</ImageOffset>",
                  f"    <PixelOffset>{item}</PixelOffset>", f"    <LineOffset>{cols * item}</LineOffset>",
                  f"    <ByteOrder>{order}</ByteOrder>", "  </VRTRasterBand>"]
    lines.append("</VRTDataset>")
    return ("\n".join(lines) + "\n").encode()


def text(view: str, meta: ArrayMeta, npy_name: str) -> bytes:
    """The bytes of a generated text file of an image view."""
    return envi_header(meta) if view == "raw" else vrt(meta, npy_name)
