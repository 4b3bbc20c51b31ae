"""Bands: a sequential reader's next bytes assembled ahead in worker threads; its reads are slices of them.

Planning a read piece by piece and copying its pieces into the reply in the trio thread cost
more than pyfuse3's reply itself where chunks are narrow (a 1 MiB read of chunks 64 float32
columns wide is 256 pieces), or where the copy transposes (the F view). A reader of a
read-only mount that reads sequentially, in reads of a body's size cut into small pieces
(BAND_MAX_PIECE_BYTES) or copied across the chunks' order, instead gets its bytes
in bands: spans of BAND_BYTES at multiples of BAND_BYTES in the file. While it reads one band,
the next is assembled in a worker thread into a buffer of the reader's own (its chunks loaded
as any read loads them, with the usual chunk read-ahead; uncompressed chunks of a local store
copied straight from their files), and every read inside a ready band is a view of it: no
plan, no copy, no await in the trio thread. A read that is not inside a ready band takes the
usual path, which also reports any error (a band that failed is only not used).

The F view of a 2-d array's C-ordered chunks of a local store (and the .npy of F-ordered
ones), uncompressed or of a lone blosc or zstd compressor, has bands of whole rows of its
chunks instead, from the header's end (`band_span`): each is copied transposed straight from
the chunk files by a worker thread, or from each chunk as it decodes in one decoding thread
per core (`decoded_rows_sync`), without the chunk cache, so every chunk is read once. They
are started before the reader's first read (which waits for them), and a read across two
bands is put together from both.

Memory: each reader holds at most BANDS_PER_READER buffers, and all readers together at most
BAND_BUDGET_BYTES (past it, readers take the usual path). Bands are only made on read-only
mounts, and are dropped when the engine drops its cached chunks (refresh, TTL), so they never
hold bytes older than the chunks a read would load (docs/CONCURRENCY.md).
"""

from __future__ import annotations

import logging
import threading
import weakref
from typing import Any

import numpy as np
import trio

from ...errors import ZarrfsError
from ...storage.base import BaseStore
from ...views.streams import ArrayStream
from ..decoding import read_decode_sync
from ..loads import Loads
from ..memory import private_buffer
from ..readahead import Prefetch, ReadAhead
from ..runtime import Runtime
from ..tables import ChunkTables
from . import direct
from .direct import DirectReads
from .gates import BAND_MAX_PIECE_BYTES, BAND_MIN_READ_BYTES, ROW_BAND_MAX_BYTES
from .reply import ReplyBuffer
from .shards import ShardReads
from .spares import Spares

log = logging.getLogger(__name__)

BAND_BYTES = 8 << 20
# Bands assembled ahead of the one being read: two, so that two worker threads assemble at once
# (one alone falls behind a reader whose bands take as long to copy as to reply).
BANDS_AHEAD = 2
BANDS_PER_READER = BANDS_AHEAD + 2  # and the band being read, and one that the reader just left
BAND_BUDGET_BYTES = 192 << 20  # all readers' band buffers together: three of ROW_BAND_MAX_BYTES
# The band just left stays until the reader is this far into the next (for the kernel's reads
# of it still under way: a few of 1 MiB at most).
ROW_BAND_KEEP_BYTES = 4 << 20


def band_span(stream: ArrayStream, local: bool) -> tuple[int, int, int]:
    """Where a stream's band 0 starts, how many bytes each band spans, and how many rows of
    chunks: for a transposing stream of a LOCAL store whose rows of chunks are copied straight
    from the chunk files or from each chunk as it decodes (`direct.transposed`), from the
    header's end, a row of chunks (or as many as BAND_BYTES holds); else BAND_BYTES from the
    file's start, and 0."""
    if local and (direct.transposed(stream) or direct.transposed(stream, decoded=True)):
        row = stream.chunk_row_bytes()
        if 0 < row <= ROW_BAND_MAX_BYTES:
            rows = max(1, BAND_BYTES // row)
            return len(stream.header), rows * row, rows
    return 0, BAND_BYTES, 0


def transposing(stream: ArrayStream) -> bool:
    """Whether a stream's elements are copied across its chunks' memory order (the F view of
    C-ordered chunks, or the reverse): element by element, the copy that costs most."""
    if not stream.is_array_stream or len(stream.meta.shape) < 2:
        return False
    return stream.order != getattr(stream.for_reads().meta.codec, "order", stream.order)


class Band:
    """Bytes [start, stop) of one stream, being assembled (`done` unset) or ready (`data`)."""

    __slots__ = ("stream", "number", "start", "stop", "buf", "data", "generation", "done")

    def __init__(
        self, stream: ArrayStream, number: int, start: int, stop: int, buf: np.ndarray, generation: int
    ) -> None:
        self.stream, self.number, self.start, self.stop = stream, number, start, stop
        self.buf: np.ndarray | None = buf  # None once a thread that timed out may still write there
        self.generation = generation
        self.data: memoryview | None = None  # set when assembled
        self.done = trio.Event()


class BandReads:
    """Band reads for sequential readers (ENABLED: read-only mounts)."""

    def __init__(
        self,
        runtime: Runtime,
        tables: ChunkTables,
        loads: Loads,
        prefetch: Prefetch,
        shards: ShardReads,
        spares: Spares,
        reply: ReplyBuffer,
        direct: DirectReads | None,
        enabled: bool,
    ) -> None:
        self.runtime, self.tables, self.loads, self.prefetch = runtime, tables, loads, prefetch
        self.shards, self.spares, self.reply, self.direct = shards, spares, reply, direct
        self.enabled = enabled
        self.band_bytes = 0  # buffers of every reader's bands
        self.band_bytes_peak = 0
        # Each stream's band_span, fixed for the stream (its array's metadata is): asked on
        # every read of a reader with bands, and before every large read (`first`).
        self._spans: weakref.WeakKeyDictionary[ArrayStream, tuple[int, int, int]] = weakref.WeakKeyDictionary()

    def _span(self, stream: ArrayStream) -> tuple[int, int, int]:
        """The stream's band_span, made once."""
        span = self._spans.get(stream)
        if span is None:
            span = self._spans[stream] = band_span(stream, self.direct is not None)  # (a local store)
        return span

    async def read(self, stream: ArrayStream, offset: int, size: int, state: ReadAhead) -> memoryview | None:
        """The bytes of a read inside one band of this reader, or across two (or the header and
        the first), once they are assembled (and the next bands started), or None. One band's
        are a view of it, others' put together in the reused reply buffer; either is replied
        before another task runs (pyfuse3): no await lies between the check that the bands are
        still the reader's and the bytes."""
        origin, span, rows = self._span(stream)
        end = min(offset + size, stream.size)
        first, last = max(offset - origin, 0) // span, max(end - 1 - origin, 0) // span
        if end <= offset or last - first > 1:
            return None
        found: list[Band | None] = [state.bands.get(n) for n in range(first, last + 1)]
        bands = [band for band in found if band is not None and band.stream is stream]
        if len(bands) != len(found):
            return None
        for band in bands:
            if band.data is None and band.generation == self.tables.generation:
                await band.done.wait()  # being assembled: the usual path would load the same chunks
        if any(
            state.bands.get(b.number) is not b or b.data is None or b.generation != self.tables.generation
            for b in bands
        ):
            return None
        # A reader well into a row of chunks leaves the one before: its buffer takes the next
        # but one (three per reader), which then has two rows' reading to be assembled.
        behind = rows > 0 and offset - bands[-1].start >= ROW_BAND_KEEP_BYTES
        self._forget_bands(state, last + 1 if behind else last)
        for k in range(last + 1, last + BANDS_AHEAD + 1):
            self._band_ahead(stream, k, state)
        self.runtime.counters["band_reads"] += 1
        if len(bands) == 1 and offset >= bands[0].start:
            band = bands[0]
            assert band.data is not None  # (checked above, with no await since)
            return band.data[offset - band.start : end - band.start]
        out = self.reply.room(end - offset)
        at = max(0, min(origin, end) - offset)  # the header's part (bands hold elements only)
        out[:at] = stream.header[offset : offset + at]
        for band in bands:
            lo, hi = max(offset, band.start), min(end, band.stop)
            assert band.data is not None
            out[at : at + hi - lo] = band.data[lo - band.start : hi - band.start]
            at += hi - lo
        return out[:at]

    def ahead(self, stream: ArrayStream, offset: int, size: int, state: ReadAhead, pieces: int) -> None:
        """After a sequential read (from the cache or the chunk files), cut into PIECES chunks:
        start the bands of its end and the next, if its pieces are small or its copies transpose."""
        if (
            not self.enabled
            or not self.runtime.running
            or size < BAND_MIN_READ_BYTES
            or (pieces * BAND_MAX_PIECE_BYTES <= size and not transposing(stream))
        ):
            return
        origin, span, _ = self._span(stream)
        self._forget_bands(state, max(offset - origin, 0) // span)
        n = max(offset + size - origin, 0) // span
        if origin + n * span < len(stream.header):
            n += 1  # a band holds elements only
        self._band_ahead(stream, n, state)
        self._band_ahead(stream, n + 1, state)

    def first(self, stream: ArrayStream, offset: int, size: int, state: ReadAhead) -> None:
        """Before a sequential read that no band holds, of a stream whose bands are rows of
        chunks read straight from their files: start the bands it reads and the next, so that
        it waits for them instead of loading the same chunks through the cache (the first read
        of a `cat`, or one after a seek)."""
        if (
            not self.enabled
            or not self.runtime.running
            or size < BAND_MIN_READ_BYTES
            or offset not in (0, state.next_offset)
        ):
            return
        origin, span, rows = self._span(stream)
        if rows == 0:
            return
        n = max(offset - origin, 0) // span
        if n in state.bands:
            return
        self._forget_bands(state, n)
        for k in range(n, n + BANDS_AHEAD):
            self._band_ahead(stream, k, state)

    @staticmethod
    def _forget_bands(state: ReadAhead, reading: int) -> None:
        """Drop a reader's bands outside its window (the band READING, the one just left, and
        BANDS_AHEAD ahead): behind it, or left by a seek. The band just left stays for the
        kernel's reads of it that arrive after a read of the next (concurrent read-ahead).
        A band still being assembled gives its buffer back when done (`_fill_band`)."""
        for k in [k for k in state.bands if not reading - 1 <= k <= reading + BANDS_AHEAD]:
            old = state.bands.pop(k)
            if old.done.is_set() and old.buf is not None:
                state.spare.append(old.buf)

    def _band_ahead(self, stream: ArrayStream, n: int, state: ReadAhead) -> None:
        """Start assembling band N of the stream, unless it is there or there is no buffer for it."""
        if (stream.meta.inner or stream.meta).chunk_nbytes > self.tables.cache.max_bytes:
            return  # a band would hold whole chunks larger than the cache, two where it spans two
        origin, span, rows = self._span(stream)
        start = origin + n * span
        stop = min(start + span, stream.size)
        band = state.bands.get(n)
        if start >= stop or (band is not None and band.stream is stream and band.generation == self.tables.generation):
            return
        if band is not None and band.done.is_set():
            if band.buf is not None:
                state.spare.append(band.buf)
            del state.bands[n]
        elif band is not None:
            return  # a stale band still being assembled: its buffer is busy
        # Elements a band of BAND_BYTES cuts at either end are whole in its buffer.
        need = span if rows else span + 2 * stream.dtype.itemsize
        while state.spare and len(state.spare[-1]) < need:
            state.spare.pop()  # (another stream's)
        if state.spare:
            buf = state.spare.pop()
        elif len(state.bands) < BANDS_PER_READER and self.band_bytes + need <= BAND_BUDGET_BYTES:
            buf = np.empty(need, np.uint8)
            self.band_bytes += buf.nbytes
            self.band_bytes_peak = max(self.band_bytes_peak, self.band_bytes)
            weakref.finalize(buf, self._band_freed, buf.nbytes)
        else:
            return
        band = state.bands[n] = Band(stream, n, start, stop, buf, self.tables.generation)
        self.runtime.start_soon(self._fill_band, band, state)

    async def _decode_rows(self, stream: ArrayStream, k: int, count: int, out: np.ndarray) -> memoryview:
        """`decoded_rows_sync` in as many parts as there are decoding threads, each a share of
        the chunk columns, at once: decoding is what such a band waits for. A part's error is
        raised once every part has ended (none is cancelled: its thread would go on writing in
        OUT, which another band may then take)."""
        parts = self.runtime.decode_threads
        done: list[Any] = [None] * parts  # each part's result, or its error

        async def part(p: int) -> None:
            try:
                done[p] = await self.runtime.run_io(
                    decoded_rows_sync, stream, self.runtime.store, k, count, out, p, parts, cpu=True
                )
            except Exception as e:  # raised below, once the others have ended
                done[p] = e

        async with trio.open_nursery() as nursery:
            for p in range(parts):
                nursery.start_soon(part, p)
        for result in done:
            if isinstance(result, BaseException):
                raise result
        for _, gets, stored, seconds in done:
            self.runtime.counters["chunk_gets"] += gets
            self.runtime.counters["chunk_bytes"] += stored
            self.runtime.counters["bytes_decoded"] += gets * stream.meta.chunk_nbytes
            self.runtime.decode_seconds += seconds  # (what stats.json reports as decode_seconds)
        return done[0][0]

    def _band_freed(self, nbytes: int) -> None:
        self.band_bytes -= nbytes

    async def _fill_band(self, band: Band, state: ReadAhead) -> None:
        stream = band.stream
        buf = band.buf
        assert buf is not None  # (a band is filled once, when made)
        try:
            data: bytes | memoryview | None = None
            rows = self._span(stream)[2]
            if rows:  # rows of chunks, from their files or as they decode
                try:
                    if self.direct is not None and direct.transposed(stream):  # (band_span: local stores only)
                        data = await self.runtime.run_io(
                            self.direct.transposed_rows_sync, stream, band.number * rows, rows, buf
                        )
                    else:
                        data = await self._decode_rows(stream, band.number * rows, rows, buf)
                except direct.Fallback:
                    return  # (a chunk not stored: its fill value, which the usual path gives)
                except ZarrfsError:
                    band.buf = None  # its thread may still be writing there (timed out): not reused
                    raise
                band.data = data
                self.runtime.counters["bands_assembled"] += 1
                return
            plan = stream.plan(band.start, band.stop - band.start)
            if self.direct is not None and direct.worth(stream, plan, band.stop - band.start):
                try:
                    data = await self.runtime.run_io(self.direct.read_sync, stream, plan, buf, False)
                except direct.Fallback:
                    pass
            if data is None:
                # The chunks after this band start loading now (the usual read-ahead), so that
                # decoding runs ahead of the bands on every decoding thread.
                self.prefetch.read_ahead(stream, band.start, band.stop - band.start, state, True)
                reader, plan = self.shards.planner(stream, plan, band.start, band.stop - band.start)
                chunks = await self.loads.chunks(reader.meta, plan.chunks)
                data = await self.runtime.run_cpu(reader.assemble, plan, chunks, buf)
                if reader is stream:
                    del chunks  # this band's hold on them: those wholly in it or before are done
                    self.spares.release_behind(stream, state, band.stop, plan.chunks)
            band.data = memoryview(data)
            self.runtime.counters["bands_assembled"] += 1
        except ZarrfsError:
            pass  # a read of these bytes takes the usual path, which reports it
        except Exception:  # background work must not end the daemon
            log.exception(
                "unexpected error assembling bytes %d-%d of %s", band.start, band.stop, stream.meta.path or "/"
            )
        finally:
            band.done.set()
            if state.bands.get(band.number) is not band and band.buf is not None:  # dropped while assembled
                state.spare.append(band.buf)


_decoded = threading.local()  # .buf: a worker thread's buffer for the chunk it decodes (decoded_rows_sync)


def decoded_rows_sync(
    stream: ArrayStream, store: BaseStore, k: int, count: int, out: np.ndarray, part: int = 0, parts: int = 1
) -> tuple[memoryview, int, int, float]:
    """The bytes of rows K.. K+COUNT-1 of a `direct.transposed(decoded=True)` stream's chunks
    (as many as there are), assembled in OUT (of their chunk columns, share PART of PARTS):
    each chunk read and decoded into this worker thread's own buffer (a chunk not stored: its
    fill value), then copied transposed into place a few of its rows at a time
    (direct.stage_rows, direct.copy_transposed); and the chunks read, their stored bytes and
    the seconds spent decoding. A chunk that cannot be read or decoded raises its error."""
    meta = stream.meta
    per = direct.stage_rows(stream.stream_chunks[0] * stream.dtype.itemsize)  # (a chunk's rows in memory)
    buf = getattr(_decoded, "buf", None)
    if buf is None or len(buf) != meta.chunk_nbytes:
        _decoded.buf = None  # the old one freed first
        buf = _decoded.buf = private_buffer(meta.chunk_nbytes)
    gets = stored = 0
    seconds = 0.0
    for idx, dst in direct.transposed_chunks(stream, k, count, out, part, parts):
        nbytes, arr, took = read_decode_sync(meta, store, idx, meta.chunk_key(idx), buf)
        if arr is None:
            if meta.fill_error is not None:  # the usual path fails that chunk's reads
                raise direct.Fallback(meta.fill_error)
            dst[...] = meta.fill_value
            continue
        gets, stored, seconds = gets + 1, stored + (nbytes or 0), seconds + took
        rows, cols = dst.shape
        mem = arr if stream.order == "F" else arr.T  # the chunk in its memory order, across the stream
        for r in range(0, cols, per):
            direct.copy_transposed(dst[:, r : r + per], mem[r : min(r + per, cols), :rows])
    return out.data[: direct.transposed_bytes(stream, k, count)], gets, stored, seconds
