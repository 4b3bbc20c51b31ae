"""The layout of `.zarrfs/ome-tiff/IMAGE.ome.tif`: a tiled, pyramidal BigTIFF of an OME-Zarr image, made on read.

The file is a BigTIFF header; one record per plane (in the DimensionOrder of the OME-XML),
each the plane's full-resolution IFD followed by the IFDs of its reduced levels (SubIFDs,
NewSubfileType 1); the OME-XML (the first IFD's ImageDescription); the tile byte counts and
tile offsets of every IFD; then each level's tiles, plane after plane (tiles.TileStream).
Every part is computed from its offset: records after the first differ only in offsets that
grow by a fixed step per plane, tables are arithmetic sequences, so a read of the header of a
pyramid of millions of tiles builds only the bytes it returns. Pure: no I/O, no trio.
"""

from __future__ import annotations

import bisect
import struct
from collections.abc import Callable, Iterator

import numpy as np

from ..model import ArrayMeta
from .tiff import SAMPLE_FORMATS
from .tiles import TileStream

# Field types (TIFF 6.0; BigTIFF's LONG8 and IFD8).
ASCII, SHORT, LONG, LONG8, IFD8 = 2, 3, 4, 16, 18
# BigTIFF: an IFD is an 8-byte count, 20-byte entries, an 8-byte next offset; values up to 8
# bytes sit in the entry.
ENTRY_BYTES = 8 + 12
FILE_HEADER = b"II" + struct.pack("<HHHQ", 43, 8, 0, 16)
# TIFF tiles are multiples of 16 pixels on each side (TIFF 6.0, section 15).
TILE_MULTIPLE = 16
# Each level's pixels start on a page-cache page boundary, so page-sized reads of one level
# never carry bytes of another.
DATA_ALIGN = 4096

Span = tuple[int, int, Callable[[int, int], bytes] | int]


def tile_extent(chunk: int, extent: int) -> int:
    """A tile's side: the chunks' side rounded up to a multiple of 16, no larger than the
    image's side rounded up."""
    up = -(-min(chunk, extent) // TILE_MULTIPLE) * TILE_MULTIPLE
    return max(TILE_MULTIPLE, up)


def _align(n: int, to: int) -> int:
    return -(-n // to) * to


class _Record:
    """Bytes of IFDs under construction, with the 8-byte fields that grow by a step per plane."""

    def __init__(self) -> None:
        self.buf = bytearray()
        self.moving: list[tuple[int, int]] = []  # (position, step per plane)

    def u64(self, value: int, step: int = 0) -> None:
        if step:
            self.moving.append((len(self.buf), step))
        self.buf += struct.pack("<Q", value)

    def entry(self, tag: int, ftype: int, count: int, value: int | bytes, step: int = 0) -> None:
        self.buf += struct.pack("<HHQ", tag, ftype, count)
        if isinstance(value, bytes):
            self.buf += value.ljust(8, b"\0")
        else:
            self.u64(value, step)


class OmeTiff:
    """An OME-TIFF file of pyramid LEVELS (level 0 first, each reducing only y and x), its
    pixels of `dtype`, with OME-XML `xml` in the first IFD."""

    def __init__(self, levels: list[ArrayMeta], dtype: np.dtype, xml: str) -> None:
        self.dtype = dtype
        narrowed = dtype.itemsize < levels[0].dtype.itemsize and levels[0].dtype.kind in "iu"
        self.streams = []
        for meta in levels:
            chunks = (meta.inner or meta).chunk_shape
            th, tw = tile_extent(chunks[-2], meta.shape[-2]), tile_extent(chunks[-1], meta.shape[-1])
            self.streams.append(TileStream(meta, th, tw, dtype, narrowed))
        self.planes = self.streams[0].planes
        self.description = xml.encode("ascii") + b"\0"
        n_levels = len(levels)
        self._n_tags = [14 if n_levels > 1 and level == 0 else 13 for level in range(n_levels)]
        ifd_sizes = [8 + n * ENTRY_BYTES + 8 for n in self._n_tags]
        self.subifd_array = 8 * (n_levels - 1) if n_levels > 2 else 0  # SubIFDs out of line
        self.record_bytes = sum(ifd_sizes) + self.subifd_array
        self.first_record_bytes = self.record_bytes + ENTRY_BYTES  # + ImageDescription
        at = 16 + self.first_record_bytes + (self.planes - 1) * self.record_bytes
        self.description_at = at
        at = _align(at + len(self.description), 8)
        self.counts_at, self.offsets_at, self.data_at = [], [], []
        for s in self.streams:
            self.counts_at.append(at)
            at += 8 * s.tiles_per_plane if s.tiles_per_plane > 1 else 0
        for s in self.streams:
            self.offsets_at.append(at)
            at += 8 * s.tiles_per_plane * self.planes if s.tiles_per_plane > 1 else 0
        for s in self.streams:
            at = _align(at, DATA_ALIGN)
            self.data_at.append(at)
            at += s.size
        self.size = at
        self.header_bytes = self.data_at[0]
        self._first = bytes(self._record(0).buf)
        template = self._record(1)
        self._template = np.frombuffer(bytes(template.buf), np.uint8)
        self._moving = template.moving
        self._spans = self._layout()
        self._starts = [s[0] for s in self._spans]

    def same_layout(self, other: OmeTiff) -> bool:
        """Whether OTHER's file has the same bytes where this one has metadata, and its pixels
        in the same places (its levels may be read through other array metadata)."""
        return (
            self.size == other.size
            and self.description == other.description
            and self._first == other._first
            and np.array_equal(self._template, other._template)
            and [(s.meta.shape, s.tile_h, s.tile_w) for s in self.streams]
            == [(s.meta.shape, s.tile_h, s.tile_w) for s in other.streams]
        )

    def record_at(self, plane: int) -> int:
        """Where a plane's record (its level-0 IFD first) starts."""
        return 16 if plane == 0 else 16 + self.first_record_bytes + (plane - 1) * self.record_bytes

    def _record(self, plane: int) -> _Record:
        """Plane PLANE's IFDs (the first plane's with ImageDescription); steps are per plane,
        for planes after the first."""
        rec = _Record()
        first = plane == 0
        base = self.record_at(plane)
        n_levels = len(self.streams)
        step = self.record_bytes
        sizes = [8 + (n + (first and level == 0)) * ENTRY_BYTES + 8 for level, n in enumerate(self._n_tags)]
        ifd_at = [base + sum(sizes[:level]) for level in range(n_levels)]
        subifds_at = base + sum(sizes)
        for level, s in enumerate(self.streams):
            n_tags = self._n_tags[level] + (first and level == 0)
            rec.buf += struct.pack("<Q", n_tags)
            item = self.dtype.itemsize
            rec.entry(254, LONG, 1, struct.pack("<I", 0 if level == 0 else 1))  # NewSubfileType: reduced
            rec.entry(256, LONG, 1, struct.pack("<I", s.meta.shape[-1]))
            rec.entry(257, LONG, 1, struct.pack("<I", s.meta.shape[-2]))
            rec.entry(258, SHORT, 1, struct.pack("<H", item * 8))  # BitsPerSample
            rec.entry(259, SHORT, 1, struct.pack("<H", 1))  # Compression: none
            rec.entry(262, SHORT, 1, struct.pack("<H", 1))  # PhotometricInterpretation: MinIsBlack
            if first and level == 0:
                rec.entry(270, ASCII, len(self.description), self.description_at)
            rec.entry(277, SHORT, 1, struct.pack("<H", 1))  # SamplesPerPixel
            rec.entry(284, SHORT, 1, struct.pack("<H", 1))  # PlanarConfiguration: contiguous
            rec.entry(322, LONG, 1, struct.pack("<I", s.tile_w))
            rec.entry(323, LONG, 1, struct.pack("<I", s.tile_h))
            n = s.tiles_per_plane
            if n == 1:
                rec.entry(324, LONG8, 1, self.data_at[level] + plane * s.tile_bytes, s.tile_bytes)
                rec.entry(325, LONG8, 1, s.tile_bytes)
            else:
                rec.entry(324, LONG8, n, self.offsets_at[level] + plane * n * 8, n * 8)
                rec.entry(325, LONG8, n, self.counts_at[level])
            if level == 0 and n_levels > 1:
                if n_levels == 2:
                    rec.entry(330, IFD8, 1, ifd_at[1], step)
                else:
                    rec.entry(330, IFD8, n_levels - 1, subifds_at, step)
            rec.entry(339, SHORT, 1, struct.pack("<H", SAMPLE_FORMATS[self.dtype.kind]))
            if level == 0 and plane + 1 < self.planes:
                rec.u64(self.record_at(plane + 1), step)
            else:
                rec.u64(0)
        if self.subifd_array:
            for level in range(1, n_levels):
                rec.u64(ifd_at[level], step)
        return rec

    def _records(self, lo: int, hi: int) -> bytes:
        """Bytes [lo, hi) of the file, within the records of planes after the first."""
        start = self.record_at(1)
        rb = self.record_bytes
        p0, p1 = (lo - start) // rb + 1, -(-(hi - start) // rb) + 1
        out = np.tile(self._template, p1 - p0).reshape(p1 - p0, rb)
        k = np.arange(p0 - 1, p1 - 1, dtype=np.uint64)  # planes after plane 1
        for pos, step in self._moving:
            field = out[:, pos : pos + 8].copy().view("<u8")[:, 0]
            out[:, pos : pos + 8] = (field + k * np.uint64(step)).astype("<u8").view(np.uint8).reshape(-1, 8)
        if p1 == self.planes:  # the last plane's next IFD is none
            out[-1, 8 + self._n_tags[0] * ENTRY_BYTES : 8 + self._n_tags[0] * ENTRY_BYTES + 8] = 0
        flat = out.reshape(-1)
        base = start + (p0 - 1) * rb
        return flat[lo - base : hi - base].tobytes()

    def _table(self, at: int, first: int, step: int) -> Callable[[int, int], bytes]:
        """Bytes of a table of 8-byte values FIRST + STEP * i starting at file offset AT."""

        def make(lo: int, hi: int) -> bytes:
            i0, i1 = (lo - at) // 8, -(-(hi - at) // 8)
            values = np.uint64(first) + np.arange(i0, i1, dtype=np.uint64) * np.uint64(step)
            raw = values.astype("<u8").tobytes()
            return raw[lo - at - i0 * 8 : hi - at - i0 * 8]

        return make

    def _layout(self) -> list[Span]:
        """The file's parts in order: (start, stop, a maker of bytes [lo, hi) or a level number)."""
        spans: list[Span] = [
            (0, 16, lambda lo, hi: FILE_HEADER[lo:hi]),
            (16, 16 + len(self._first), lambda lo, hi: self._first[lo - 16 : hi - 16]),
        ]
        if self.planes > 1:
            spans.append((self.record_at(1), self.description_at, self._records))
        d = self.description_at
        spans.append((d, d + len(self.description), lambda lo, hi: self.description[lo - d : hi - d]))
        for level, s in enumerate(self.streams):
            n = s.tiles_per_plane
            if n > 1:
                at = self.counts_at[level]
                spans.append((at, at + 8 * n, self._table(at, s.tile_bytes, 0)))
        for level, s in enumerate(self.streams):
            n = s.tiles_per_plane
            if n > 1:
                at = self.offsets_at[level]
                spans.append((at, at + 8 * n * self.planes, self._table(at, self.data_at[level], s.tile_bytes)))
        for level, s in enumerate(self.streams):
            spans.append((self.data_at[level], self.data_at[level] + s.size, level))
        return spans

    def parts(self, offset: int, size: int) -> Iterator[bytes | tuple[int, TileStream, int, int]]:
        """What bytes [offset, offset+size) hold, in order: bytes, or (level, its tile stream,
        offset in the stream, bytes) to read through the engine."""
        end = min(offset + size, self.size)
        at = max(offset, 0)
        i = max(bisect.bisect_right(self._starts, at) - 1, 0)
        while at < end:
            start, stop, what = self._spans[i] if i < len(self._spans) else (self.size, self.size, 0)
            if at < start:  # padding between parts
                gap = min(start, end)
                yield bytes(gap - at)
                at = gap
                continue
            hi = min(stop, end)
            if at < hi:
                if isinstance(what, int):
                    yield what, self.streams[what], at - start, hi - at
                else:
                    yield what(at, hi)
                at = hi
            i += 1
