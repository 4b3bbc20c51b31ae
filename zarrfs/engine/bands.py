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

Memory: each reader holds at most BANDS_PER_READER buffers, and all readers together at most
BAND_BUDGET_BYTES (past it, readers take the usual path). Bands are only made on read-only
mounts, and are dropped when the engine drops its cached chunks (refresh, TTL), so they never
hold bytes older than the chunks a read would load. Mixed into Engine (docs/CONCURRENCY.md).
"""

from __future__ import annotations

import logging
import weakref

import numpy as np
import trio

from .. import direct
from ..errors import ZarrfsError
from ..layouts import ArrayStream
from .readahead import ReadAhead

log = logging.getLogger(__name__)

BAND_BYTES = 8 << 20
# Bands assembled ahead of the one being read: two, so that two worker threads assemble at once
# (one alone fell behind a `cat` of an uncompressed array: 8 MiB took about as long to copy
# from the chunk files as to reply).
BANDS_AHEAD = 2
BANDS_PER_READER = BANDS_AHEAD + 2  # and the band being read, and one that the reader just left
BAND_BUDGET_BYTES = 128 << 20  # all readers' band buffers together
# Only reads cut into pieces smaller than this on average start bands: where chunks are narrow
# (chunks of 64 float32 columns: 256 in a 1 MiB read) the trio thread's planning and copying
# is what bounds a reader. Reads in larger pieces were not faster with bands on this 2-core
# machine (a cold cat of the 1 GiB array in 1024x1024 chunks: uncompressed 1.5-1.8 s with,
# 0.8-1.3 s without; blosc and zstd 5-10 % slower): the cores were already busy decoding,
# copying and replying, and bands only move the copy to another thread.
BAND_MAX_PIECE_BYTES = 32 << 10
# Reads whose copies transpose (the F view of C-ordered chunks) start bands whatever their
# pieces: the copy is what bounds such a reader (a cold cat of the F view of the 1 GiB array in
# 1024x1024 chunks: 2.1-2.3 s with, 2.4-3.0 s without).
# Only reads of a body's size start bands (a peek at a header, random reads: the usual path).
BAND_MIN_READ_BYTES = 64 << 10


def transposing(stream: ArrayStream) -> bool:
    """Whether a stream's elements are copied across its chunks' memory order (the F view of
    C-ordered chunks, or the reverse): element by element, the copy that costs most."""
    if type(stream) is not ArrayStream or len(stream.meta.shape) < 2:
        return False
    return stream.order != getattr(stream.for_reads().meta.codec, "order", stream.order)


class Band:
    """Bytes [start, stop) of one stream, being assembled (`done` unset) or ready (`data`)."""

    __slots__ = ("stream", "start", "stop", "buf", "data", "generation", "done")

    def __init__(self, stream: ArrayStream, start: int, stop: int, buf: np.ndarray, generation: int) -> None:
        self.stream, self.start, self.stop, self.buf, self.generation = stream, start, stop, buf, generation
        self.data: memoryview | None = None  # set when assembled
        self.done = trio.Event()


class BandReads:
    """Band reads for sequential readers (mixed into Engine)."""

    def _init_bands(self) -> None:
        self.bands_enabled = False  # set by the daemon on read-only mounts
        self.band_generation = 0  # bumped when cached chunks are dropped: older bands are not used
        self.band_bytes = 0  # buffers of every reader's bands
        self.band_bytes_peak = 0

    def drop_bands(self) -> None:
        """Bands assembled so far are not used again (their chunks may have changed)."""
        self.band_generation += 1

    async def band_read(self, stream: ArrayStream, offset: int, size: int, state: ReadAhead) -> memoryview | None:
        """The bytes of a read inside a band of this reader, once it is assembled (and the next
        band started), or None. The view is replied before another task runs (pyfuse3); no
        await lies between the check that the band is still the reader's and the view."""
        n = offset // BAND_BYTES
        band = state.bands.get(n)
        if band is None or band.stream is not stream or min(offset + size, stream.size) > band.stop:
            return None
        if band.data is None and band.generation == self.band_generation:
            await band.done.wait()  # being assembled: the usual path would load the same chunks
        if state.bands.get(n) is not band or band.data is None or band.generation != self.band_generation:
            return None
        self._forget_bands(state, n)
        for k in range(n + 1, n + BANDS_AHEAD + 1):
            self._band_ahead(stream, k, state)
        self.counters["band_reads"] += 1
        return band.data[offset - band.start:offset - band.start + size]

    def bands_ahead(self, stream: ArrayStream, offset: int, size: int, state: ReadAhead, pieces: int) -> None:
        """After a sequential read (from the cache or the chunk files), cut into PIECES chunks:
        start the bands of its end and the next, if its pieces are small or its copies transpose."""
        if (not self.bands_enabled or self._nursery is None or size < BAND_MIN_READ_BYTES
                or (pieces * BAND_MAX_PIECE_BYTES <= size and not transposing(stream))):
            return
        self._forget_bands(state, offset // BAND_BYTES)
        n = (offset + size) // BAND_BYTES
        if n * BAND_BYTES < len(stream.header):
            n += 1  # a band holds elements only
        self._band_ahead(stream, n, state)
        self._band_ahead(stream, n + 1, state)

    @staticmethod
    def _forget_bands(state: ReadAhead, reading: int) -> None:
        """Drop a reader's bands outside its window (the band READING, the one just left, and
        BANDS_AHEAD ahead): behind it, or left by a seek. The band just left stays for the
        kernel's reads of it that arrive after a read of the next (concurrent read-ahead).
        A band still being assembled gives its buffer back when done (`_fill_band`)."""
        for k in [k for k in state.bands if not reading - 1 <= k <= reading + BANDS_AHEAD]:
            old = state.bands.pop(k)
            if old.done.is_set():
                state.spare.append(old.buf)

    def _band_ahead(self, stream: ArrayStream, n: int, state: ReadAhead) -> None:
        """Start assembling band N of the stream, unless it is there or there is no buffer for it."""
        start = n * BAND_BYTES
        stop = min(start + BAND_BYTES, stream.size)
        band = state.bands.get(n)
        if start >= stop or (band is not None and band.stream is stream and band.generation == self.band_generation):
            return
        if band is not None and band.done.is_set():
            state.spare.append(band.buf)
            del state.bands[n]
        elif band is not None:
            return  # a stale band still being assembled: its buffer is busy
        if state.spare:
            buf = state.spare.pop()
        elif len(state.bands) < BANDS_PER_READER and self.band_bytes + BAND_BYTES <= BAND_BUDGET_BYTES:
            # Elements the band cuts at either end are whole in the buffer.
            buf = np.empty(BAND_BYTES + 2 * stream.dtype.itemsize, np.uint8)
            self.band_bytes += buf.nbytes
            self.band_bytes_peak = max(self.band_bytes_peak, self.band_bytes)
            weakref.finalize(buf, self._band_freed, buf.nbytes)
        else:
            return
        band = state.bands[n] = Band(stream, start, stop, buf, self.band_generation)
        self._nursery.start_soon(self._fill_band, band, state)

    def _band_freed(self, nbytes: int) -> None:
        self.band_bytes -= nbytes

    async def _fill_band(self, band: Band, state: ReadAhead) -> None:
        stream = band.stream
        try:
            plan = stream.plan(band.start, band.stop - band.start)
            data = None
            if self.direct is not None and direct.worth(stream, plan, band.stop - band.start):
                try:
                    data = await self.run_io(self.direct.read_sync, stream, plan, band.buf, False)
                except direct.Fallback:
                    pass
            if data is None:
                # The chunks after this band start loading now (the usual read-ahead), so that
                # decoding runs ahead of the bands on every decoding thread.
                self._read_ahead(stream, band.start, band.stop - band.start, state, True)
                reader, plan = self._planner(stream, plan, band.start, band.stop - band.start)
                chunks = await self.chunks(reader.meta, plan.chunks)
                data = await self.run_cpu(reader.assemble, plan, chunks, band.buf)
                if reader is stream:
                    del chunks  # this band's hold on them: those wholly in it or before are done
                    self.release_behind(stream, state, band.stop, plan.chunks)
            band.data = memoryview(data)
            self.counters["bands_assembled"] += 1
        except ZarrfsError:
            pass  # a read of these bytes takes the usual path, which reports it
        except Exception:  # background work must not end the daemon
            log.exception("unexpected error assembling bytes %d-%d of %s", band.start, band.stop,
                          stream.meta.path or "/")
        finally:
            band.done.set()
            if state.bands.get(band.start // BAND_BYTES) is not band:  # dropped while assembled
                state.spare.append(band.buf)
