"""The engine: the tables every chunk operation shares, limiters, worker threads, counters; reads.

Engine is the one place where trio meets the core. Its behaviour is split by
responsibility into mixins of this package: loads.py (cache lookups, single-flight loads,
shard indexes, partial shard reads), readahead.py (prefetch for sequential readers),
writeback.py (dirty chunks and their way to the store). The tables are created here, and
the rules of who touches them are written down in one place: docs/CONCURRENCY.md.
"""

from __future__ import annotations

import collections
import functools
import logging
import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import trio

from .fastpath import direct
from .. import grid
from ..errors import StoreError, ZarrfsError
from ..model import ArrayMeta
from ..repeats import RepeatedFailures
from ..storage.store import Store
from ..views.streams import ArrayStream, copy_elements
from .fastpath.bands import BAND_MAX_PIECE_BYTES, BandReads
from .fastpath.spares import Spares
from .streamed import StreamedReads
from .interrupts import Interrupts
from .later import Later
from .loads import Loads, _Load
from .revalidate import Revalidation
from .readahead import (
    LOCAL_PREFETCH_MAX_BYTES,
    PREFETCH_CACHE_SHARE,
    PREFETCH_MAX_BYTES,
    Prefetch,
    ReadAhead,
)
from .workers import Workers
from .writeback import DIRTY_MAX_BYTES, WriteBack

log = logging.getLogger(__name__)

Index = tuple[int, ...]

# Concurrent store reads: enough to hide the latency of a remote store; local reads
# gain nothing past a handful. Decoding is CPU-bound: one thread per core (run_cpu).
IO_THREADS_REMOTE = 16
IO_THREADS_LOCAL = 4
DECODE_THREADS = max(1, os.cpu_count() or 1)
# The reply buffer of direct reads starts at the largest read the kernel sends (1 MiB).
REPLY_BUF_MIN = 1 << 20
# Smaller requests (random access) go through the chunk cache: a system call per chunk piece
# costs them more (4,700 vs 9,000 random 4 KiB reads/s here) than one load of the chunk.
DIRECT_MIN_BYTES = 64 << 10
# Reads smaller than this that lie within one row of the array and whose chunks are at hand
# skip the planner (random reads: 4 KiB at a time).
SMALL_READ_BYTES = 64 << 10
# The `timeout` option's default (options.Options.timeout_s) for engines built without it (tests).
DEFAULT_TIMEOUT_S = 30.0
# After a store call timed out, a later call for the same key (the kernel reads the page again at
# once after a failed read-ahead; a program retries) does not start a wait of its own: it fails at
# once while the timed-out request, still running in its abandoned worker, is unanswered (at most
# `timeout` long), or for this long after the timeout when that request failed too (the kernel's
# retry comes within milliseconds). A store that is back answers that request, and the mount
# serves again at once, no remount.
STALL_GRACE_S = 1.0
COUNTERS = ("reads", "store_gets", "store_bytes", "fill_chunks", "bytes_decoded", "prefetched",
            "bytes_written", "chunks_stored", "chunks_erased", "oversize_loads",
            "plain_files_stored", "plain_bytes_stored", "direct_reads", "direct_bytes", "revalidations", "chunks_changed", "band_reads", "bands_assembled", "small_reads", "row_reads", "buffers_reused",
            "streamed_reads")

__all__ = ["Engine", "ReadAhead"]


def _call_name(fn: Any) -> str:
    """What a store call was, for its timeout message (`list_dir_sync` -> `list dir`)."""
    return getattr(fn, "__name__", "store call").removesuffix("_sync").replace("_", " ")


class Engine(Loads, Prefetch, WriteBack, Revalidation, BandReads, Spares, StreamedReads):
    """Turns reads and writes of array streams into cached, deduplicated chunk loads and stores."""

    def __init__(self, store: Store, cache: Any, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.store = store
        self.timeout_s = timeout_s  # the longest wait of one store call (the `timeout` option)
        self.cache = cache
        self.io_limiter = trio.CapacityLimiter(IO_THREADS_LOCAL if store.is_local else IO_THREADS_REMOTE)
        self._decoders = Workers(DECODE_THREADS, "zarrfs-decode")  # run_cpu
        self._inflight: dict[tuple[str, Index], _Load] = {}
        self.counters: collections.Counter[str] = collections.Counter(dict.fromkeys(COUNTERS, 0))
        self.errors: collections.Counter[str] = collections.Counter()
        self.failures = RepeatedFailures()  # which failure lines reach the log; failures by key
        self.decode_seconds = 0.0
        self.started = time.time()
        self._nursery: trio.Nursery | None = None
        self._flights: dict[Any, _Load] = {}  # once(): calls in flight by key
        self.interrupts = Interrupts()  # requests ended early when their process got a signal
        self.later = Later()  # delayed calls (plain files' write-back)
        self.held_memory_bytes = 0  # plain files' bytes in memory (incoming.HeldFile)
        self._init_revalidation()
        self._init_bands()
        self._init_spares()
        self._init_streamed()
        # Reads of uncompressed chunks straight from a local store's files (set by the daemon
        # on read-only mounts: no written chunk can be newer than its file).
        self.direct: direct.DirectReads | None = None
        self._reply_buf = np.empty(0, np.uint8)  # bytes of direct and small reads, reused (_reply_room)
        self._reply_view = memoryview(self._reply_buf)  # the same bytes, flat
        self.prefetch_max_bytes = min(LOCAL_PREFETCH_MAX_BYTES if store.is_local else PREFETCH_MAX_BYTES,
                                      cache.max_bytes // PREFETCH_CACHE_SHARE)
        # Written chunks not yet stored, oldest first: (path, idx) -> (meta, writable array)
        self._dirty: collections.OrderedDict[tuple[str, Index], tuple[ArrayMeta, np.ndarray]] = (
            collections.OrderedDict())
        self.dirty_bytes = 0
        self.dirty_max_bytes = DIRTY_MAX_BYTES
        self.storing_bytes = 0  # chunks taken from the dirty set and being encoded or stored
        self._flushing = False  # a background flush is running
        # Flushes of one chunk (of one shard, where writing a chunk rewrites its shard) take turns.
        self._chunk_locks: dict[tuple, trio.Lock] = {}
        self._storing: dict[tuple[str, Index], np.ndarray] = {}
        # Dirty shards patched from what the store holds: the inner chunks written since
        # (None: every inner chunk is encoded again at flush).
        self._changed: dict[tuple[str, Index], set[Index] | None] = {}
        # Changes of each written chunk, so a writer notices one made while it waited, and
        # of each shard rewritten chunk by chunk, so a reader notices a rewrite it overlapped.
        self._versions: dict[tuple, int] = {}
        # A failed background flush is reported at the array's next fsync/close.
        self._write_errors: dict[str, ZarrfsError] = {}
        # Chunks larger than the cache are loaded one at a time (each costs its encoded
        # bytes and its decoded array while it loads), and said once per array.
        self._oversize_lock = trio.Lock()
        self._oversize_told: set[str] = set()
        # Keys whose store call timed out: (when, its worker's outcome: None while it runs, then
        # "ok" or "failed").
        self._stalled: dict[Any, tuple[float, list[str | None]]] = {}

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Host background work (prefetch, delayed calls) until cancelled; without it neither runs."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            self.later.attach(nursery)
            nursery.start_soon(self.interrupts.run)
            task_status.started()
            await trio.sleep_forever()

    async def run_io(self, fn: Any, *args: Any, key: Any = None, cpu: bool = False,
                     ended: Callable[[], None] | None = None) -> Any:
        """Run a blocking store call in a worker thread under the I/O limiter, for at most
        `timeout_s` (waiting for a thread included); then StoreError (EIO). The caller stops
        waiting at once when cancelled or timed out: a thread stuck in the store is left behind
        (its backend's own timeouts end it) instead of holding the reader. With `key` (what the
        call reads: a chunk, a listing), a call whose key just timed out does not wait again.
        With `cpu`, the call also decodes: it runs in a decoding thread (run_cpu) instead, and
        ENDED, if given, is called in the engine's thread once that thread is done with the call
        (it ran to its end, or will never run), even when the caller stopped waiting for it."""
        assert ended is None or cpu
        if key is not None and key in self._stalled:
            try:
                self._after_stall(key, fn)
            except StoreError:
                if ended is not None:
                    ended()
                raise
        outcome: list[str | None] = [None]  # written by the worker alone (one reference, no table)

        def call() -> Any:
            try:
                value = fn(*args)
                outcome[0] = "ok"
                return value
            finally:
                outcome[0] = outcome[0] or "failed"

        with trio.move_on_after(self.timeout_s) as scope:
            if cpu:
                return await self.run_cpu(call, abandon=True, ended=ended)
            return await trio.to_thread.run_sync(call, limiter=self.io_limiter, abandon_on_cancel=True)
        assert scope.cancelled_caught
        self.errors["timeout"] += 1
        if key is not None:
            now = time.monotonic()
            for old in [k for k, (t, _) in self._stalled.items() if now - t > self.timeout_s]:
                del self._stalled[old]  # forgotten: asked again like any key
            self._stalled[key] = (now, outcome)
        raise StoreError(f"the store did not answer within {self.timeout_s:g} s (timeout; {_call_name(fn)})")

    def _after_stall(self, key: Any, fn: Any) -> None:
        """Before asking the store for a key whose last call timed out: StoreError at once while
        that call is unanswered or has just failed too; else (answered, or old) forget it."""
        since, outcome = self._stalled[key]
        age = time.monotonic() - since
        if outcome[0] == "ok" or (outcome[0] == "failed" and age > STALL_GRACE_S) or age > self.timeout_s:
            del self._stalled[key]
            return
        self.errors["timeout"] += 1
        state = "is still unanswered" if outcome[0] is None else "failed too"
        raise StoreError(f"the store did not answer within {self.timeout_s:g} s (timeout; {_call_name(fn)}; "
                         f"not asked again: its request of {age:.1f} s ago {state})")

    async def run_cpu(self, fn: Any, *args: Any, abandon: bool = False,
                      ended: Callable[[], None] | None = None) -> Any:
        """`fn(*args)` in a decoding thread (workers.py), calls taken in the order asked.

        Cancelled, a call not started is dropped; a running one is waited for, as
        trio.to_thread does (the cancellation reaches the caller at its next checkpoint), or
        with ABANDON left to finish on its own, its result dropped, and its thread replaced.
        ENDED is called in this thread once the call ended or was dropped, waited for or not.
        """
        token = trio.lowlevel.current_trio_token()
        done = trio.Event()

        def soon(then: Callable[[], None]) -> Callable[[Any], None]:
            def callback(_: Any) -> None:
                try:
                    token.run_sync_soon(then)
                except trio.RunFinishedError:  # abandoned when the engine stopped
                    pass
            return callback

        future = self._decoders.submit(fn, *args)
        if ended is not None:  # (first: it has run when the caller goes on)
            future.add_done_callback(soon(ended))
        future.add_done_callback(soon(done.set))
        try:
            await done.wait()
        except trio.Cancelled:
            if future.cancel():
                raise
            if abandon:
                self._decoders.abandon(future)
                raise
            with trio.CancelScope(shield=True):
                await done.wait()
        return future.result()

    async def run_io_long(self, fn: Any, *args: Any) -> Any:
        """A store operation of many keys (commit, erase or move a node) that runs to its end:
        bounding it would leave the node half changed while the caller believes it failed."""
        return await trio.to_thread.run_sync(fn, *args, limiter=self.io_limiter)

    async def run_io_shielded(self, fn: Any, *args: Any) -> Any:
        """run_io_long that finishes even when the caller is cancelled (clean-up after a failure)."""
        with trio.CancelScope(shield=True):
            return await self.run_io_long(fn, *args)

    def drop_clean_chunks(self) -> None:
        """Forget every cached chunk and shard index (they are read from the store again when next
        needed); written chunks not yet stored stay in the dirty set, where reads find them first."""
        self.cache.discard_prefix("")
        self.drop_bands()
        self.drop_streams()
        if self.direct is not None:
            self.direct.close()

    def start_soon_thread(self, fn: Any, *args: Any) -> None:
        """Run `fn(*args)` in a worker thread in the background, not awaited (nothing without run())."""
        if self._nursery is not None:
            self._nursery.start_soon(functools.partial(trio.to_thread.run_sync, fn, *args, abandon_on_cancel=True))

    @staticmethod
    def new_lock() -> Any:
        """A lock for the core's own objects (held files): taken with `async with`."""
        return trio.Lock()

    async def once(self, key: Any, fn: Any) -> Any:
        """`await fn()`, shared: a call with the same key while one is in flight waits for it
        and gets its result or error (a directory listing is loaded once for every reader)."""
        while True:
            flight = self._flights.get(key)
            if flight is None:
                break
            await flight.done.wait()
            if isinstance(flight.error, Exception):
                raise flight.error
            if flight.error is None:
                return flight.value
            # the first caller was cancelled: try again
        flight = self._flights[key] = _Load()
        try:
            flight.value = await fn()
            return flight.value
        except BaseException as e:
            flight.error = e
            raise
        finally:
            if self._flights.get(key) is flight:  # (else dropped: revalidate.see_layout)
                del self._flights[key]
            flight.done.set()

    def note_failure(self, error: ZarrfsError, key: str) -> None:
        """Count a failure of KEY (a node's document, a chunk) found outside the engine, and log it
        as the engine's own: once, then at most once a minute."""
        self._count_error(error, key)

    def _count_error(self, error: ZarrfsError, key: str) -> None:
        """Count a failure of KEY and log it, unless the same was logged within the minute or the
        store logged it already (one line for many keys failing for one cause)."""
        self.errors[type(error).__name__] += 1
        text = str(error)
        line = self.failures.line(key, text if key in text else f"{key}: {text}")
        if line is not None and not error.logged_by_store:
            log.warning("%s", line)
        error.logged = True  # the FUSE layer does not log it again for each request it fails

    async def read(self, stream: ArrayStream, offset: int, size: int,
                   readahead: ReadAhead | None = None, reply: bool = False) -> bytes | memoryview:
        """Bytes [offset, offset+size) of a stream, loading the chunks it needs concurrently;
        with `readahead` (the reader's own state), a sequential reader's next window is loaded.
        With `reply` (a FUSE read handler, which returns the bytes at once: pyfuse3 replies
        before any other task runs, and which tried `read_now` first), the bytes may be a view
        of a buffer every such read reuses, and reads of uncompressed local chunks copy their
        files' bytes directly (direct.py).

        Arrays of shards that can be read in part are planned over their inner chunks,
        unless every shard the read needs is already decoded whole (then over the shards:
        fewer, larger copies). A sequential reader of a remote store takes them from whole
        shards, each read in one request (readahead.py `_whole_shards`).
        """
        if self.streamed(stream):  # chunks larger than the cache: never decoded whole
            if readahead is not None:
                readahead.next_offset = offset + size
            return await self.read_streamed(stream, offset, size)
        if reply and readahead is not None:
            self.bands_first(stream, offset, size, readahead)
            data = await self.band_read(stream, offset, size, readahead) if readahead.bands else None
            if data is not None:
                readahead.next_offset = offset + size
                self.counters["reads"] += 1
                return data
        plan = stream.plan(offset, size)
        sequential = readahead is not None and (offset == readahead.next_offset
                                                or self._sequential_start(stream, offset, size, readahead))
        if readahead is not None:  # at once: a read the kernel sends while this one loads is sequential too
            readahead.next_offset = offset + size
        if reply and self.direct is not None and size >= DIRECT_MIN_BYTES and direct.worth(stream, plan, size):
            data = await self._read_direct(stream, plan)
            if data is not None:
                self.counters["reads"] += 1
                if sequential:  # narrow chunks: bands, filled straight from the files too
                    self.bands_ahead(stream, offset, size, readahead, len(plan.chunks))
                return data
        reader, plan = self._planner(stream, plan, offset, size)
        whole = sequential and self._whole_shards(stream)
        if whole:  # before the read's own loads, which then share each shard's one request
            self._read_ahead(stream, offset, size, readahead, sequential)
        chunks = await self.chunks(reader.meta, plan.chunks, whole)
        self.counters["reads"] += 1
        if readahead is not None and not whole:
            self._read_ahead(stream, offset, size, readahead, sequential)
        if reply and sequential:
            self.bands_ahead(stream, offset, size, readahead, len(plan.chunks))
        data = reader.assemble(plan, chunks)
        if sequential and reader is stream:
            del chunks  # this read's hold on them
            self.release_behind(stream, readahead, offset, plan.chunks)
        return data

    def read_now(self, stream: ArrayStream, offset: int, size: int,
                 readahead: ReadAhead | None = None) -> memoryview | None:
        """A FUSE read served at once, with no await (so no wait to interrupt): a small read, or
        one of many rows in one row of chunks, whose chunks are at hand, as a view of the reused
        reply buffer (or of a chunk); None: `read` it."""
        if size < SMALL_READ_BYTES:
            data, used = self._small_read(stream, offset, size), None
        else:
            data, used = self._rows_read(stream, offset, size, readahead)
        if data is None:
            return None
        if readahead is not None:
            if offset == readahead.next_offset:  # a sequential reader's window still grows
                self._read_ahead(stream, offset, size, readahead, True)
                if used is not None:
                    self.release_behind(stream, readahead, offset, used)
            elif used is not None:  # a large read elsewhere: the window starts again, as in `read`
                self._read_ahead(stream, offset, size, readahead, False)
            readahead.next_offset = offset + size
        self.counters["reads"] += 1
        self.counters["small_reads" if used is None else "row_reads"] += 1
        return data

    def _row_span(self, stream: ArrayStream, offset: int, size: int) -> tuple[ArrayMeta, int, int] | None:
        """For `_small_read` and `_rows_read`: the array and the data bytes [d0, d1) of a read of
        a stream whose reads may be served from its chunks (ArrayStream.row_reads, its chunks
        current), inside the data and not empty; None for any other."""
        if not stream.row_reads:
            return None
        meta = stream.meta
        if self._checked.get(meta.path, self._epoch) != self._epoch:
            return None
        hlen = len(stream.header)
        d0, d1 = offset - hlen, min(offset + size, stream.size) - hlen
        return (meta, d0, d1) if 0 <= d0 < d1 else None

    def _rows_read(self, stream: ArrayStream, offset: int, size: int,
                   readahead: ReadAhead | None) -> tuple[memoryview | None, list | None]:
        """A read of many rows of an array in one row of chunks (the run of rows `grid.row_run`
        gives), whose chunks are all at hand: the whole rows copied into the reused reply
        buffer, a copy per chunk, with no plan and no await; the bytes, and the chunks used.
        (None, None) sends it the usual way: another stream (ArrayStream.row_reads), a 1-d
        array, rows longer than the read (it would copy more than it needs), a read across rows
        of chunks, a chunk not at hand, or chunks so narrow that bands serve them.

        What `cat` of a decoded array asks 63 times in 64 (1 MiB reads of the reference array,
        whose rows of chunks are 64 MiB): 16 copies of 17 rows. Through the planner, the loads'
        bookkeeping and a cancel scope, each such read took some 150 us of Python in the trio
        thread, which replies to every read of every reader."""
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
        arrs = [self._lookup(meta, idx) for idx in used]  # (held by a writer, or cached)
        if any(arr is None for arr in arrs):
            return None, None
        m = last - row + 1
        self._reply_room(m * rb)
        buf, lead = self._reply_buf, within[:-1]
        rows = slice(within[-1], within[-1] + m)
        for k, arr in enumerate(arrs):
            n = min(width, ncols - k * width)
            dst = np.ndarray((m, n), meta.dtype, buf, k * width * item, (rb, item))
            copy_elements(dst, arr[(*lead, rows, slice(0, n))])
        skip = d0 - row * rb
        return self._reply_view[skip:skip + d1 - d0], used

    def _small_read(self, stream: ArrayStream, offset: int, size: int) -> memoryview | None:
        """A read within one row of an array, or across the end of one row into the next, whose
        chunks are all at hand (held or cached and current), with no plan and no await: a view of
        the chunk's bytes when one chunk holds it, else its pieces copied into the reused reply
        buffer; None sends it the usual way (any other read, or stream than a whole array's
        C-order elements in its own dtype: ArrayStream.row_reads).

        Written out for the 20,000 random 4 KiB reads of bench.py (each across two chunks of
        the reference array): 12.6-14.4 us a read in-process through the plan-free helpers it
        replaced, 6.4-6.7 here."""
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
            spans: tuple = ((row, c0, c1),)
        elif last == row + 1:
            spans = ((row, c0, ncols), (last, 0, c1))
        else:
            return None
        skip, take = d0 - e0 * item, d1 - d0
        held = bool(self._dirty or self._storing)  # (written chunks the store may not have yet)
        get, path = self.cache.get, meta.path
        out, pos = None, 0
        for r, a, b in spans:
            if len(shape) == 2:  # (most arrays: grid.row_run written out)
                p, i = divmod(r, chunks[0])
                prefix, within, row_at = (p,), (i,), i * width
            else:
                prefix, within, _ = grid.row_run(r, shape, chunks)
                row_at = grid.flat_row(within, chunks) * width
            for k in range(a // width, (b - 1) // width + 1):
                key = (path, (*prefix, k))
                arr = self._held(key) if held else None
                if arr is None:
                    arr = get(key)
                    if arr is None:
                        return None
                lo, hi = max(a, k * width), min(b, (k + 1) * width)
                n = (hi - lo) * item
                flat = arr.flags.c_contiguous
                at = (row_at + lo - k * width) * item
                if flat and len(spans) == 1 and n == (c1 - c0) * item:  # the read is in this one chunk: its bytes as they are
                    return _flat_bytes(arr)[at + skip:at + skip + take]
                if out is None:
                    out = self._reply_room(take + 2 * item)
                if flat:
                    out[pos:pos + n] = _flat_bytes(arr)[at:at + n]
                else:  # F-ordered chunks, fill values
                    self._reply_buf[pos:pos + n].view(meta.dtype)[...] = arr[(*within, slice(lo - k * width, hi - k * width))]
                pos += n
        return out[skip:skip + take]

    def _reply_room(self, need: int) -> memoryview:
        """Make the reused reply buffer (and its flat view) hold at least NEED bytes; the view."""
        if len(self._reply_buf) < need:
            self._reply_buf = np.empty(max(need, REPLY_BUF_MIN), np.uint8)
            self._reply_view = memoryview(self._reply_buf)
        return self._reply_view

    def _planner(self, stream: ArrayStream, plan: Any, offset: int, size: int) -> tuple[ArrayStream, Any]:
        """The stream to read bytes [offset, offset+size) over, and its plan of them (PLAN is the
        stream's own): the one over inner chunks of shards that can be read in part, unless every
        shard the plan needs is already decoded whole (then over the shards: fewer, larger copies)."""
        fine = stream.for_reads()
        if (fine is not stream and not self.store.ranges_ignored
                and not all(self._known(stream.meta, idx) for idx in plan.chunks)):
            return fine, fine.plan(offset, size)
        return stream, plan

    async def _read_direct(self, stream: ArrayStream, plan: Any) -> bytes | memoryview | None:
        """A read of an eligible stream straight from its chunk files (None: take the usual path).

        From the OS's page cache in this thread into the reused reply buffer (no await
        between filling it and returning); what would wait for a disk, in a worker thread
        into a buffer of its own."""
        need = stream.element_bytes(plan)
        self._reply_room(need)
        try:
            data = self.direct.read_sync(stream, plan, self._reply_buf, nowait=True)
        except direct.WouldBlock:
            try:
                data = await self.run_io(self.direct.read_sync, stream, plan, np.empty(need, np.uint8), False)
            except direct.Fallback:
                return None
        except direct.Fallback:
            return None
        self.counters["direct_reads"] += 1
        self.counters["direct_bytes"] += plan.take_bytes
        return data

    async def read_key(self, key: str, offset: int, size: int, key_size: int) -> bytes:
        """Bytes of a store key as it is stored (the `store/` view)."""
        end = min(offset + size, key_size)
        if offset >= end:
            return b""
        try:
            data = await self.run_io(self.store.get_range_sync, key, offset, end)
        except ZarrfsError as e:
            self._count_error(e, key)
            raise
        self.counters["store_gets"] += 1
        self.counters["store_bytes"] += len(data)
        return data

    def stats(self) -> dict[str, Any]:
        """Counters since mount (for stats.json and the log)."""
        return {
            "uptime_s": round(time.time() - self.started, 3),
            **dict(self.counters),
            "cache_hits": self.cache.hits, "cache_misses": self.cache.misses,
            "cache_evictions": self.cache.evictions, "cache_bytes": self.cache.used_bytes,
            "cache_max_bytes": self.cache.max_bytes,
            "oversize_chunks": self.cache.oversize_held, "oversize_bytes": self.cache.oversize_bytes,
            "oversize_slots": self.cache.oversize_slots, "oversize_evictions": self.cache.oversize_evictions,
            "decode_seconds": round(self.decode_seconds, 6),
            "band_bytes": self.band_bytes, "band_bytes_peak": self.band_bytes_peak,
            "plain_files_pending": self.later.waiting,  # closed, waiting for their write-back
            "plain_memory_bytes": self.held_memory_bytes,
            **self.store.disk_stats(),
            "errors": dict(self.errors),
            **self.failures.stats(),
        }


def _flat_bytes(arr: np.ndarray) -> memoryview:
    """A C-contiguous array's bytes, flat."""
    try:
        return arr.data.cast("B")
    except (TypeError, ValueError, NotImplementedError):  # dtypes the buffer protocol cannot name (datetimes)
        return memoryview(arr.reshape(-1).view(np.uint8))
