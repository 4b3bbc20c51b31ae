"""The image views under `.zarrfs/`: tiff/PATH.tif, raw/PATH.hdr (ENVI), gdal/PATH.vrt, preview/PATH.png: names, layouts, texts.

Which arrays each view shows (a table of suffix, entry kind and eligibility), the byte
stream of a TIFF, the generated ENVI, VRT and GDAL .aux.xml texts, and the statistics GDAL
saves into the last two. Pure: no I/O, no trio.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from xml.etree import ElementTree
from xml.sax.saxutils import escape, quoteattr

import numpy as np

from ..model import ArrayMeta, Node
from ..tree.kinds import Kind
from . import preview, tiff
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
# Attributes GDAL adds to a band when it writes a VRT back: block sizes of its own cache,
# which change no value read.
GDAL_ADDED_BAND_ATTRIBUTES = ("blockXSize", "blockYSize")
# A band number in an .aux.xml: ASCII digits only (str.isdigit also takes superscripts, which
# int() refuses), and few enough of them for int() (which refuses thousands).
BAND_NUMBER = re.compile(r"[1-9][0-9]{0,8}")


def _code(dtype: np.dtype) -> str:
    return f"{dtype.kind}{dtype.itemsize}"


def _raster(meta: ArrayMeta, table: dict[str, object]) -> bool:
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
    text = (
        f"ENVI\ndescription = {{zarrfs array /{meta.path}}}\nsamples = {cols}\nlines = {rows}\n"
        f"bands = {bands}\nheader offset = 0\nfile type = ENVI Standard\n"
        f"data type = {ENVI_TYPES[_code(meta.dtype)]}\ninterleave = bsq\nbyte order = {int(big)}\n"
    )
    return text.encode()


def vrt(meta: ArrayMeta, npy_name: str, statistics: list[dict[str, str]] | None = None) -> bytes:
    """gdal/PATH.vrt: one VRTRawRasterBand per band, reading the main tree's PATH.npy past its
    header; `npy_name` is that file's name (a root array's is the mount's NAME.npy).
    `statistics` (one dict a band) are STATISTICS_* items GDAL computed and saved into it."""
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
        lines.append(f'  <VRTRasterBand dataType="{gdal_type}" band="{b + 1}" subClass="VRTRawRasterBand">')
        items = statistics[b] if statistics else {}
        if items:
            lines += ["    <Metadata>"] + [_mdi(k, v) for k, v in sorted(items.items())] + ["    </Metadata>"]
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


def max_rewrite_bytes(meta: ArrayMeta) -> int:
    """The most a rewrite of a VRT view or an .aux.xml may hold: a band's text and statistics
    take under 1 KiB, the header metadata GDAL copies into an .aux.xml a few hundred bytes."""
    return (4 << 10) * _bands_rows_cols(meta)[0] + (64 << 10)


def _mdi(key: str, value: str) -> str:
    return f"      <MDI key={quoteattr(key)}>{escape(value)}</MDI>"


def pam(meta: ArrayMeta, statistics: list[dict[str, str]] | None = None) -> bytes:
    """raw/PATH.raw.aux.xml: GDAL's auxiliary file of PATH.raw, holding the statistics GDAL
    saved (none yet: an empty document, which GDAL reads as nothing)."""
    lines = ["<PAMDataset>"]
    for b, items in enumerate(statistics or []):
        if items:
            lines += (
                [f'  <PAMRasterBand band="{b + 1}">', "    <Metadata>"]
                + [_mdi(k, v) for k, v in sorted(items.items())]
                + ["    </Metadata>", "  </PAMRasterBand>"]
            )
    lines.append("</PAMDataset>")
    return ("\n".join(lines) + "\n").encode()


def _items(metadata: ElementTree.Element) -> dict[str, str] | None:
    """The MDI items of a <Metadata> element (None when it holds anything else)."""
    items = {}
    for mdi in metadata:
        if mdi.tag != "MDI" or len(mdi) or "key" not in mdi.attrib:
            return None
        items[mdi.get("key")] = (mdi.text or "").strip()
    return items


def _envi_items(meta: ArrayMeta) -> dict[str, str]:
    """The ENVI metadata domain GDAL reads from raw/PATH.hdr (names with `_` for spaces)."""
    lines = envi_header(meta).decode().splitlines()[1:]
    return {k.strip().replace(" ", "_"): v.strip() for k, v in (line.split("=", 1) for line in lines)}


def pam_statistics(written: bytes, meta: ArrayMeta) -> list[dict[str, str]] | None:
    """The statistics a write of raw/PATH.raw.aux.xml saves, one dict a band; None when it holds
    more than band STATISTICS_* items and the metadata GDAL read from PATH.hdr."""
    try:
        tree = ElementTree.fromstring(written)
    except ElementTree.ParseError:
        return None
    derived = {"IMAGE_STRUCTURE": {"INTERLEAVE": "BAND"}, "ENVI": _envi_items(meta)}
    bands = _bands_rows_cols(meta)[0]
    statistics: list[dict[str, str]] = [{} for _ in range(bands)]
    if tree.tag != "PAMDataset" or tree.attrib:
        return None
    for child in tree:
        if child.tag == "Metadata":
            domain = child.get("domain")
            if domain not in derived or _items(child) != derived[domain]:
                return None
        elif (
            child.tag == "PAMRasterBand"
            and BAND_NUMBER.fullmatch(child.get("band", ""))
            and int(child.get("band")) <= bands
        ):
            items = _band_statistics(child)
            if items is None or len(child) or set(child.attrib) != {"band"}:
                return None
            statistics[int(child.get("band")) - 1] = items
        else:
            return None
    return statistics


def _band_statistics(band: ElementTree.Element) -> dict[str, str] | None:
    """Take a band's STATISTICS_* items out of `band` (None when it holds other metadata)."""
    items: dict[str, str] = {}
    for md in band.findall("Metadata"):
        found = _items(md)
        if md.attrib or found is None or not all(k.startswith(STATISTICS_PREFIX) for k in found):
            return None  # a metadata domain, or other items: more than statistics
        items.update(found)
        band.remove(md)
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


def vrt_statistics(written: bytes, meta: ArrayMeta, npy_name: str) -> list[dict[str, str]] | None:
    """The statistics a rewrite of gdal/PATH.vrt saves, one dict a band; None when the written
    text is not the view's VRT with STATISTICS_* band metadata added (what GDAL writes back
    after computing statistics) but some other change, or no VRT at all."""
    try:
        tree = ElementTree.fromstring(written)
    except ElementTree.ParseError:
        return None
    bands = tree.findall("VRTRasterBand")
    statistics = [_band_statistics(band) for band in bands]
    if any(s is None for s in statistics) or not _same_tree(tree, ElementTree.fromstring(vrt(meta, npy_name))):
        return None
    return statistics  # type: ignore[return-value]


def text(view: str, meta: ArrayMeta, npy_name: str, statistics: list[dict[str, str]] | None = None) -> bytes:
    """The bytes of a generated text file of an image view (a VRT with the statistics kept for it)."""
    return envi_header(meta) if view == "raw" else vrt(meta, npy_name, statistics)
