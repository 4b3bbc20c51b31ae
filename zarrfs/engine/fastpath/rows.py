"""Row reads: small reads, and many rows in one row of chunks, served from chunks at hand with no plan, no await.

Both are optional: off, such a read is planned and assembled like any other, the same bytes
with more Python in the trio thread.
"""

from __future__ import annotations

import numpy as np

from ... import grid
from ...grid import Index
from ...model import ArrayMeta
from ...views.streams import ArrayStream, copy_elements
from ..readahead import ReadAhead
from ..revalidate import Revalidation
from ..tables import ChunkTables
from .gates import BAND_MAX_PIECE_BYTES
from .reply import ReplyBuffer


class RowReads:
    """Reads of a whole array's C-order elements (ArrayStream.row_reads) copied from held or
    cached chunks into the reused reply buffer, or viewed in one chunk."""

    def __init__(self, tables: ChunkTables, revalidation: Revalidation, reply: ReplyBuffer) -> None:
        self.tables, self.revalidation, self.reply = tables, revalidation, reply

    def _row_span(self, stream: ArrayStream, offset: int, size: int) -> tuple[ArrayMeta, int, int] | None:
        """For `small_read` and `rows_read`: the array and the data bytes [d0, d1) of a read of
        a stream whose reads may be served from its chunks (ArrayStream.row_reads, its chunks
        current), inside the data and not empty; None for any other."""
        if not stream.row_reads:
            return None
        meta = stream.meta
        if not self.revalidation.is_current(meta.path):
            return None
        hlen = len(stream.header)
        d0, d1 = offset - hlen, min(offset + size, stream.size) - hlen
        return (meta, d0, d1) if 0 <= d0 < d1 else None

    def rows_read(
        self, stream: ArrayStream, offset: int, size: int, readahead: ReadAhead | None
    ) -> tuple[memoryview | None, list[Index] | None]:
        """A read of many rows of an array in one row of chunks (the run of rows `grid.row_run`
        gives), whose chunks are all at hand: the whole rows copied into the reused reply
        buffer, a copy per chunk, with no plan and no await; the bytes, and the chunks used.
        (None, None) sends it the usual way: another stream (ArrayStream.row_reads), a 1-d
        array, rows longer than the read (it would copy more than it needs), a read across rows
        of chunks, a chunk not at hand, or chunks so narrow that bands serve them.

        Most of what `cat` of a decoded array asks: through the planner, the loads' bookkeeping
        and a cancel scope, each such read costs Python in the trio thread, which replies to
        every read of every reader (docs/PERFORMANCE.md)."""
        span = self._row_span(stream, offset, size)
        if span is None or (readahead is not None and readahead.bands):
            return None, None
        meta, d0, d1 = span
        item, shape, chunks = stream.dtype.itemsize, meta.shape, meta.chunk_shape
        ncols, width = shape[-1], chunks[-1]
        rb = ncols * item
        if len(shape) < 2 or rb > size:  # (rows longer than the read: copied whole, more than it)
            return None, None
        row, last = d0 // rb, (-(-d1 // item) - 1) // ncols
        prefix, within, run = grid.row_run(row, shape, chunks)
        nk = -(-ncols // width)
        if last - row >= run or nk * BAND_MAX_PIECE_BYTES > size:
            return None, None
        used = [(*prefix, k) for k in range(nk)]
        found = [self.tables.lookup(meta, idx) for idx in used]  # (held by a writer, or cached)
        arrs = [arr for arr in found if arr is not None]
        if len(arrs) != len(found):
            return None, None
        m = last - row + 1
        self.reply.room(m * rb)
        buf, lead = self.reply.buf, within[:-1]
        rows = slice(within[-1], within[-1] + m)
        for k, arr in enumerate(arrs):
            n = min(width, ncols - k * width)
            dst = np.ndarray((m, n), meta.dtype, buf, k * width * item, (rb, item))
            part: tuple[int | slice, ...] = (*lead, rows, slice(0, n))
            copy_elements(dst, arr[part])
        skip = d0 - row * rb
        return self.reply.view[skip : skip + d1 - d0], used

    def small_read(self, stream: ArrayStream, offset: int, size: int) -> memoryview | None:
        """A read within one row of an array, or across the end of one row into the next, whose
        chunks are all at hand (held or cached and current), with no plan and no await: a view of
        the chunk's bytes when one chunk holds it, else its pieces copied into the reused reply
        buffer; None sends it the usual way (any other read, or stream than a whole array's
        C-order elements in its own dtype: ArrayStream.row_reads).

        Written out for random 4 KiB reads, where any helper call is a share of the read's time."""
        span = self._row_span(stream, offset, size)
        if span is None:
            return None
        meta, d0, d1 = span
        item, shape, chunks = stream.dtype.itemsize, meta.shape, meta.chunk_shape
        ncols, width = shape[-1], chunks[-1]
        e0 = d0 // item
        row, c0 = divmod(e0, ncols)
        last, c1 = divmod(-(-d1 // item) - 1, ncols)
        c1 += 1
        if last == row:
            spans: tuple[tuple[int, int, int], ...] = ((row, c0, c1),)
        elif last == row + 1:
            spans = ((row, c0, ncols), (last, 0, c1))
        else:
            return None
        skip, take = d0 - e0 * item, d1 - d0
        held = self.tables.holding  # (written chunks the store may not have yet)
        get, path = self.tables.cache.get, meta.path
        out: memoryview | None = None
        pos = 0
        prefix: tuple[int, ...]
        within: tuple[int, ...]
        for r, a, b in spans:
            if len(shape) == 2:  # (most arrays: grid.row_run written out)
                p, i = divmod(r, chunks[0])
                prefix, within, row_at = (p,), (i,), i * width
            else:
                prefix, within, _ = grid.row_run(r, shape, chunks)
                row_at = grid.flat_row(within, chunks) * width
            for k in range(a // width, (b - 1) // width + 1):
                key = (path, (*prefix, k))
                arr = self.tables.held(key) if held else None
                if arr is None:
                    arr = get(key)
                    if arr is None:
                        return None
                lo, hi = max(a, k * width), min(b, (k + 1) * width)
                n = (hi - lo) * item
                flat = arr.flags.c_contiguous
                at = (row_at + lo - k * width) * item
                if flat and len(spans) == 1 and n == (c1 - c0) * item:  # the read is in this one chunk: its bytes
                    return _flat_bytes(arr)[at + skip : at + skip + take]
                if out is None:
                    out = self.reply.room(take + 2 * item)
                if flat:
                    out[pos : pos + n] = _flat_bytes(arr)[at : at + n]
                else:  # F-ordered chunks, fill values
                    cols = slice(lo - k * width, hi - k * width)
                    part: tuple[int | slice, ...] = (*within, cols)
                    self.reply.buf[pos : pos + n].view(meta.dtype)[...] = arr[part]
                pos += n
        assert out is not None  # (every span holds a byte)
        return out[skip : skip + take]


def _flat_bytes(arr: np.ndarray) -> memoryview:
    """A C-contiguous array's bytes, flat."""
    try:
        return arr.data.cast("B")
    except (TypeError, ValueError, NotImplementedError):  # dtypes the buffer protocol cannot name (datetimes)
        return arr.reshape(-1).view(np.uint8).data
