"""Byte layouts of an array (NPY C/F, raw C/F, one chunk): file offset <-> element regions.

A read of bytes [offset, offset+size) becomes a plan (header bytes, element range, the
chunks it touches) and, once those chunks are decoded, an assembly of the bytes.
Pure: no I/O, no trio.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import math
from collections.abc import Callable, Iterator
from types import EllipsisType
from typing import Protocol, TypeGuard

import numpy as np

from .. import grid, npy
from ..grid import Index
from ..model import ArrayMeta

# Reads of at least this many rows (of the last dimension) are assembled a whole row at a time
# (`_assemble_rows`: one copy per chunk per run of rows, at most two rows' extra bytes).
ROWS_MIN = 8
# A copy that transposes (the F view of C-ordered chunks, the C view of F-ordered ones) goes
# through a C-ordered staging buffer of at most this many bytes at a time: first the source's
# rows as they lie in memory, then the transposing copy out of the staged block, which the CPU
# cache still holds. Straight from a cold chunk, numpy's transposing copy reads the chunk a few
# bytes per row, several times slower (docs/PERFORMANCE.md).
STAGE_BYTES = 512 << 10


@functools.lru_cache(maxsize=1024)
def npy_header(dtype: np.dtype, shape: Index, fortran: bool) -> bytes:
    """The NPY header of a file (few distinct ones per array: its own and its edge chunks')."""
    return npy.header(dtype, shape, fortran)


def chunk_file_size(meta: ArrayMeta, idx: Index) -> int:
    """The size of a chunk's NPY file, without building its stream (a listing of a million)."""
    shape = grid.data_shape(idx, meta.shape, meta.chunk_shape)
    return len(npy_header(meta.dtype, shape, False)) + math.prod(shape) * meta.dtype.itemsize


def element_span(header: bytes, itemsize: int, total: int, offset: int, size: int) -> tuple[bytes, int, int, int, int]:
    """What bytes [offset, offset+size) of a stream (HEADER, then elements; TOTAL bytes) hold:
    (the header's part, first and stop element, bytes of the first element to skip, data
    bytes); the last four are 0 when no element byte is read."""
    end = min(offset + size, total)
    offset = max(offset, 0)
    hlen = len(header)
    header_part = header[offset:end] if offset < hlen else b""
    d0, d1 = max(offset - hlen, 0), end - hlen
    if d1 <= d0 or itemsize == 0:
        return header_part, 0, 0, 0, 0
    e0, e1 = d0 // itemsize, -(-d1 // itemsize)
    return header_part, e0, e1, d0 - e0 * itemsize, d1 - d0


def copy_elements(target: np.ndarray, source: np.ndarray) -> None:
    """`target[...] = source` (same shape, TARGET in C order); when SOURCE's elements are
    closest in memory along its first dimension (an F-ordered chunk, or a region of one),
    through a staging buffer (STAGE_BYTES), a block of SOURCE.T's rows at a time."""
    rows = source.T  # its elements closest along its last dimension: rows read as they lie
    per = STAGE_BYTES // max(1, rows[0].nbytes) if _transposes(source) else 0
    if per == 0:  # not transposing, or one row of SOURCE.T is more than a stage: copied as it is
        target[...] = source
        return
    stage = np.empty((min(per, len(rows)), *rows.shape[1:]), source.dtype)
    out = target.T
    for at in range(0, len(rows), per):
        block = stage[: len(rows) - at] if at + per > len(rows) else stage
        np.copyto(block, rows[at : at + len(block)])
        out[at : at + len(block)] = block


def _transposes(source: np.ndarray) -> bool:
    """Whether SOURCE (of at least 2 dimensions longer than 1) has its smallest stride on its
    first such dimension: copied into C order, it is read across its memory order."""
    if source.ndim < 2 or source.strides[-1] == source.itemsize:  # (most copies: rows as they lie)
        return False
    dims = [d for d in range(source.ndim) if source.shape[d] > 1]
    if len(dims) < 2:
        return False
    strides = [abs(source.strides[d]) for d in dims]
    return strides[0] < min(strides[1:])


class PlannedBytes(Protocol):
    """What `plan_bytes` asks of a plan (ReadPlan, tiles.TilePlan)."""

    @property
    def header_part(self) -> bytes: ...

    @property
    def skip_bytes(self) -> int: ...

    @property
    def take_bytes(self) -> int: ...


def plan_bytes(plan: PlannedBytes, out: np.ndarray) -> bytes | memoryview:
    """A plan's bytes, given OUT (bytes) holding its whole elements from its first: a view of
    OUT, or new bytes when the plan starts in the header."""
    data = out[plan.skip_bytes : plan.skip_bytes + plan.take_bytes]
    return plan.header_part + data.tobytes() if plan.header_part else data.data


class PlannedElements(PlannedBytes, Protocol):
    """What `assemble_elements` asks of a plan (ReadPlan, tiles.TilePlan): its element range too."""

    @property
    def first_elem(self) -> int: ...

    @property
    def stop_elem(self) -> int: ...


def assemble_elements(
    plan: PlannedElements, dtype: np.dtype, out: np.ndarray | None, fill: Callable[[np.ndarray], None]
) -> bytes | memoryview:
    """The bytes of PLAN: its whole elements (of DTYPE, in OUT, uint8 large enough, or a fresh
    buffer), which FILL writes into the buffer it is given, cut to the plan."""
    if plan.take_bytes == 0:
        return plan.header_part
    n = plan.stop_elem - plan.first_elem
    buf = np.empty(n, dtype) if out is None else out[: n * dtype.itemsize].view(dtype)
    fill(buf)
    return plan_bytes(plan, buf.view(np.uint8))


@dataclasses.dataclass(frozen=True)
class ReadPlan:
    header_part: bytes
    first_elem: int
    stop_elem: int
    skip_bytes: int  # bytes to drop from the first element
    take_bytes: int  # data bytes to return
    boxes: tuple[tuple[Index, Index], ...]  # in the stream's dimension order
    chunks: tuple[Index, ...]  # grid positions (array order) to load


class ByteStream(Protocol):
    """A file that is a stream of an array's elements after a header, read through the engine:
    what the engine and its fast paths ask of it (ArrayStream, slices.SliceStream)."""

    meta: ArrayMeta  # the array its elements come from
    dtype: np.dtype  # the elements' dtype in the stream
    header: bytes
    size: int  # bytes of the whole file
    # The array's own elements in C or F order (an ArrayStream): its plans can be cut into chunk
    # regions and rows (`array_stream`); any other stream is read by plans and `assemble` only.
    is_array_stream: bool
    row_reads: bool  # reads of its rows may be served from cached chunks without a plan (fastpath/rows.py)

    def plan(self, offset: int, size: int) -> ReadPlan:
        """What bytes [offset, offset+size) are made of: header bytes, elements, the chunks they lie in."""
        ...

    def for_reads(self) -> ByteStream:
        """The same bytes over the inner chunks of shards that can be read in part."""
        ...

    def assemble(
        self, plan: ReadPlan, chunks: dict[Index, np.ndarray], out: np.ndarray | None = None
    ) -> bytes | memoryview:
        """A plan's bytes from its decoded chunks (into OUT, uint8, when given)."""
        ...

    def last_chunk_row(self, offset: int, stop: int) -> tuple[int, bool, bool] | None:
        """The row of chunks whose bytes end a sequential read at STOP (None: none holds them in order)."""
        ...


def array_stream(stream: ByteStream) -> TypeGuard[ArrayStream]:
    """Whether STREAM is an array's own elements in C or F order (it says so: `is_array_stream`)."""
    return stream.is_array_stream


class ArrayStream(ByteStream):
    """An array as a byte stream: an optional NPY header, then its elements in C or F order.

    With `chunk` set, the stream is that one chunk of the array, clipped at the edge.
    """

    is_array_stream = True

    def __init__(
        self,
        meta: ArrayMeta,
        order: str = "C",
        with_header: bool = True,
        chunk: Index | None = None,
        header: bytes | None = None,
        dtype: np.dtype | None = None,
    ) -> None:
        self.meta = meta
        # The elements' dtype in this stream: the array's, or a writer's own byte order.
        self.dtype = meta.dtype if dtype is None else dtype
        self.order = order
        if chunk is None:
            shape, self.origin = meta.shape, (0,) * len(meta.shape)
        else:
            shape, self.origin = grid.data_shape(chunk, meta.shape, meta.chunk_shape), chunk
        self.shape = shape
        if header is None:
            header = npy_header(self.dtype, tuple(shape), order == "F") if with_header else b""
        self.header = header  # a writer's own NPY header may differ from ours in length
        self.size = len(self.header) + math.prod(shape) * self.dtype.itemsize
        # F order is C order of the transposed array: work in reversed dimensions.
        flip = order == "F"
        self._shape = shape[::-1] if flip else shape
        self._chunks = meta.chunk_shape[::-1] if flip else meta.chunk_shape
        self._flip = flip
        self.chunk = chunk
        self._reads: ArrayStream | None = None
        # The stream's chunk grid is the array's: a chunk's index in stream order is its index.
        self._grid_order = not flip and not any(self.origin)
        # A whole array's C-order elements in its own dtype, not read through shards: its reads
        # within a row or two, or of many rows in one row of chunks, can be served from cached
        # chunks without a plan (engine/fastpath/rows.py).
        self.row_reads = bool(
            not flip
            and chunk is None
            and self.dtype == meta.dtype
            and shape
            and not self.dtype.hasobject
            and meta.inner is None
        )

    @property
    def stream_shape(self) -> Index:
        """The shape in the stream's dimension order (reversed for F order)."""
        return self._shape

    @property
    def stream_chunks(self) -> Index:
        """The chunk shape in the stream's dimension order (of the chunks it is planned over)."""
        return self._chunks

    def array_index(self, t_idx: Index) -> Index:
        """Grid position in the array of a chunk index in the stream's dimension order."""
        return self._array_index(t_idx)

    def chunk_end(self, idx: Index) -> int:
        """The stream offset just past chunk IDX's last element (IDX: grid position in the
        array; a whole array's stream, not one chunk's)."""
        flat = 0
        for i, c, n in zip(idx[::-1] if self._flip else idx, self._chunks, self._shape):
            flat = flat * n + min((i + 1) * c, n) - 1
        return len(self.header) + (flat + 1) * self.dtype.itemsize

    def chunk_row_bytes(self) -> int:
        """Bytes of the stream that one row of chunks covers (its first dimension's chunk
        length times the rest of the stream), or of the whole stream when it is smaller."""
        if not self._shape:
            return self.size
        rest = math.prod(self._shape[1:]) * self.dtype.itemsize
        return min(self.size, min(self._chunks[0], self._shape[0]) * rest)

    def last_chunk_row(self, offset: int, stop: int) -> tuple[int, bool, bool] | None:
        """For a 2-d array's whole stream: the row of chunks (of the stream's first dimension)
        holding byte STOP - 1 of the bytes [OFFSET, STOP), whether those bytes begin in it too,
        and whether its part of them holds a whole row of the array (which touches every chunk
        of that row of chunks); None for other streams, or bytes that begin in the header."""
        if len(self._shape) != 2 or self.chunk is not None or offset < len(self.header) or stop <= offset:
            return None
        row_bytes = self._shape[1] * self.dtype.itemsize
        if row_bytes == 0:
            return None
        h, band = len(self.header), self.chunk_row_bytes()
        k = (stop - 1 - h) // band
        lo = max(offset - h, k * band)  # its part, from the header's end
        return k, offset - h >= k * band, -(-lo // row_bytes) * row_bytes + row_bytes <= stop - h

    def for_reads(self) -> ArrayStream:
        """The stream to plan reads with: itself, or over the inner chunks of its shards when
        the array can be read a part of a shard at a time (same bytes, finer pieces)."""
        inner = self.meta.inner
        if inner is None:
            return self
        if self._reads is None:
            fine = copy.copy(self)
            fine.meta = inner  # (its row geometry is the array's: same shape, dtype and order)
            ratio = [c // i for c, i in zip(self.meta.chunk_shape, inner.chunk_shape)]
            fine.origin = tuple(o * r for o, r in zip(self.origin, ratio))
            fine._chunks = inner.chunk_shape[::-1] if self._flip else inner.chunk_shape
            self._reads = fine
        return self._reads

    def _array_index(self, t_idx: Index) -> Index:
        """Grid position in the array of a chunk index in the stream's (maybe flipped) order."""
        if self._grid_order:
            return t_idx
        idx = t_idx[::-1] if self._flip else t_idx
        return tuple(o + i for o, i in zip(self.origin, idx))

    def plan(self, offset: int, size: int) -> ReadPlan:
        header_part, e0, e1, skip, take = element_span(self.header, self.dtype.itemsize, self.size, offset, size)
        if take == 0:
            return ReadPlan(header_part, 0, 0, 0, 0, (), ())
        boxes = tuple(grid.flat_boxes(self._shape, e0, e1))
        needed: dict[Index, None] = {}
        for start, box in boxes:
            if self._grid_order:  # (most streams)
                needed.update(dict.fromkeys(grid.chunks_in_box(start, box, self._chunks)))
                continue
            for t_idx in grid.chunks_in_box(start, box, self._chunks):
                needed[self._array_index(t_idx)] = None
        return ReadPlan(header_part, e0, e1, skip, take, boxes, tuple(needed))

    def _pieces(self, plan: ReadPlan) -> Iterator[tuple[Index, tuple[slice, ...], int, Index, tuple[slice, ...]]]:
        """(array chunk index, slices into the chunk (stream order), box start offset, slices into the box)."""
        pos = 0
        for start, box in plan.boxes:
            n = math.prod(box)
            for t_idx in grid.chunks_in_box(start, box, self._chunks):
                src, dst = [], []
                for i, c, a, b, s in zip(t_idx, self._chunks, start, box, self._shape):
                    lo, hi = max(i * c, a), min((i + 1) * c, a + b, s)
                    src.append(slice(lo - i * c, hi - i * c))
                    dst.append(slice(lo - a, hi - a))
                yield self._array_index(t_idx), tuple(src), pos, box, tuple(dst)
            pos += n

    def chunk_regions(self, plan: ReadPlan, out: np.ndarray) -> dict[Index, list[tuple[tuple[slice, ...], np.ndarray]]]:
        """For each chunk a plan needs: the regions of it (slices in the array's dimension
        order) and where each goes, a view of OUT (uint8, `element_bytes(plan)`) of the
        region's shape; what `assemble` copies, for a caller that has no whole chunks."""
        buf = out[: self.element_bytes(plan)].view(self.dtype)
        regions: dict[Index, list[tuple[tuple[slice, ...], np.ndarray]]] = {}
        for idx, src, pos, box, dst in self._pieces(plan):
            place: tuple[slice | EllipsisType, ...] = (*dst, ...)  # (a view: 0-d too)
            target = buf[pos : pos + math.prod(box)].reshape(box)[place]
            if self._flip:
                src, target = src[::-1], target.T
            regions.setdefault(idx, []).append((src, target))
        return regions

    def coverage(self, plan: ReadPlan) -> dict[Index, int]:
        """How many elements of each chunk a plan touches."""
        out: dict[Index, int] = dict.fromkeys(plan.chunks, 0)
        for idx, src, _, _, _ in self._pieces(plan):
            out[idx] += math.prod(s.stop - s.start for s in src)
        return out

    def scatter(self, plan: ReadPlan, buf: np.ndarray, chunks: dict[Index, np.ndarray]) -> None:
        """The reverse of assemble: copy the plan's elements from `buf` into writable chunks."""
        for idx, src, pos, box, dst in self._pieces(plan):
            chunk = chunks[idx].T if self._flip else chunks[idx]
            chunk[src] = buf[pos : pos + math.prod(box)].reshape(box)[dst]

    def assemble(
        self, plan: ReadPlan, chunks: dict[Index, np.ndarray], out: np.ndarray | None = None
    ) -> bytes | memoryview:
        """The bytes of `plan`, given every chunk it names (full chunk shape, any layout), in
        OUT (uint8, at least `element_bytes(plan)`) or a fresh buffer.

        Data-only reads come back as a memoryview of that buffer (no extra copy).
        """
        if plan.take_bytes == 0:
            return plan.header_part
        if out is None and self._shape and plan.stop_elem - plan.first_elem >= ROWS_MIN * self._shape[-1]:
            return self._assemble_rows(plan, chunks)
        out = np.empty(self.element_bytes(plan), np.uint8) if out is None else out[: self.element_bytes(plan)]
        buf = out.view(self.dtype)
        for idx, src, pos, box, dst in self._pieces(plan):
            chunk = chunks[idx].T if self._flip else chunks[idx]
            place: tuple[slice | EllipsisType, ...] = (*dst, ...)  # (a view: 0-d too)
            copy_elements(buf[pos : pos + math.prod(box)].reshape(box)[place], chunk[src])
        return plan_bytes(plan, out)

    def _assemble_rows(self, plan: ReadPlan, chunks: dict[Index, np.ndarray]) -> bytes | memoryview:
        """assemble for a read of many rows (of the stream's last dimension): the whole rows it
        touches, a run of rows in one row of chunks at a time, each run one copy per chunk,
        into a fresh buffer from its first row's start; the bytes are a view of it."""
        shape, item = self._shape, self.dtype.itemsize
        ncols, width = shape[-1], self._chunks[-1]
        row_bytes = ncols * item
        first, stop = plan.first_elem // ncols, -(-plan.stop_elem // ncols)
        out = np.empty((stop - first) * row_bytes, np.uint8)
        wanted = set(plan.chunks)
        row = first
        while row < stop:
            lead, within, m = grid.row_run(row, shape, self._chunks)
            m = min(m, stop - row)
            rows = within[:-1] + (slice(within[-1], within[-1] + m),) if within else ()
            at = (row - first) * row_bytes
            for j in range(-(-ncols // width)):
                idx = self._array_index(lead + (j,))
                if idx not in wanted:  # none of its elements is read (the plan names every chunk that has one)
                    continue
                chunk = chunks[idx]
                c0 = j * width
                n = min(width, ncols - c0)
                dst = np.ndarray((m, n), self.dtype, out, at + c0 * item, (row_bytes, item))
                copy_elements(dst, (chunk.T if self._flip else chunk)[rows + (slice(0, n),)].reshape(m, n))
            row += m
        return plan_bytes(plan, out[(plan.first_elem - first * ncols) * item :])  # from the plan's first element

    def element_bytes(self, plan: ReadPlan) -> int:
        """Bytes of the whole elements a plan covers (its data, plus the parts of elements it cuts)."""
        return (plan.stop_elem - plan.first_elem) * self.dtype.itemsize
