"""The engine: reads and writes of arrays as cached, deduplicated chunk loads and stores; where trio meets the core.

Engine is a facade over parts that each own one job and are handed what they share:
Runtime (runtime.py: threads, limiter, nursery, counters), ChunkTables (tables.py: the cache
and the tables of loads, written chunks and versions, with who writes which), Revalidation
(revalidate.py), Loads (loads.py), Prefetch (readahead.py), WriteBack (writeback.py),
StreamedReads (streamed.py) and the optional read strategies (fastpath/, tried in the order
its docstring gives). Its configuration (config.py) is given when it is built. The rules of
who touches which table, and when, are in docs/CONCURRENCY.md.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import trio

from ..errors import ZarrfsError
from ..grid import Index
from ..model import ArrayMeta
from ..storage.base import BaseStore
from ..views.streams import ArrayStream, ByteStream
from .cache import ChunkCache
from .config import DEFAULT_TIMEOUT_S, EngineConfig
from .debounce import DelayedCalls
from .fastpath import FastPaths
from .fastpath.direct import DirectReads
from .fastpath.shards import ShardReads
from .fastpath.spares import Spares
from .interrupts import Interrupts
from .loads import Loads
from .readahead import Prefetch, ReadAhead, window_bound
from .revalidate import Revalidation
from .runtime import DECODE_THREADS, Runtime
from .streamed import Box, StreamedReads
from .tables import BODY, ChunkTables
from .writeback import WriteBack

log = logging.getLogger(__name__)

__all__ = ["DECODE_THREADS", "DEFAULT_TIMEOUT_S", "Engine", "EngineConfig", "Event", "Lock", "ReadAhead"]

# What `new_lock` and `new_event` make, named for the core (which imports no trio).
Lock = trio.Lock
Event = trio.Event


class Engine:
    """Turns reads and writes of array streams into cached, deduplicated chunk loads and stores."""

    def __init__(self, store: BaseStore, cache: ChunkCache, config: EngineConfig | None = None) -> None:
        self.config = config = config or EngineConfig()
        self.runtime = runtime = Runtime(store, config)
        self.tables = tables = ChunkTables(cache)
        self.revalidation = Revalidation(runtime, tables)
        spares = Spares(runtime, tables, config.recycle, config.drop_behind)
        self.loads = Loads(runtime, tables, self.revalidation, spares)
        window = window_bound(store, cache) if config.prefetch_max_bytes is None else config.prefetch_max_bytes
        shards = ShardReads(runtime, tables, window)
        self.prefetch = Prefetch(runtime, tables, self.loads, shards, window)
        self.writeback = WriteBack(runtime, tables, self.loads, self.read, config.dirty_max_bytes)
        self.streams = StreamedReads(runtime, tables, self.loads, self.revalidation)
        direct = DirectReads(store) if config.direct_reads and store.chunk_files else None
        self.fast = FastPaths(
            runtime, tables, self.loads, self.revalidation, self.prefetch, shards, spares, direct, config.bands
        )
        self.interrupts = Interrupts()  # requests ended early when their process got a signal
        self.delayed = DelayedCalls()  # plain files' write-back, a few seconds after their last close
        self.started = time.time()
        # What the tree and the FUSE layer call on the runtime, as the engine's own.
        self.run_io, self.run_cpu, self.once = runtime.run_io, runtime.run_cpu, runtime.once
        self.gather = runtime.gather
        self.run_io_long, self.run_io_shielded = runtime.run_io_long, runtime.run_io_shielded
        self.start_soon_thread = runtime.start_soon_thread
        self.counters, self.errors = runtime.counters, runtime.errors

    @property
    def store(self) -> BaseStore:
        return self.runtime.store

    @property
    def cache(self) -> ChunkCache:
        return self.tables.cache

    @property
    def on_array_changed(self) -> Callable[[str], object] | None:
        """Called with an array's path when revalidation found its cached chunks changed in the store."""
        return self.revalidation.on_array_changed

    @on_array_changed.setter
    def on_array_changed(self, callback: Callable[[str], object] | None) -> None:
        self.revalidation.on_array_changed = callback

    @property
    def dirty_bytes(self) -> int:
        """Bytes of written chunks not yet stored."""
        return self.writeback.dirty_bytes

    @property
    def storing_bytes(self) -> int:
        """Bytes of written chunks being encoded or stored."""
        return self.writeback.storing_bytes

    @property
    def dirty_max_bytes(self) -> int:
        return self.writeback.dirty_max_bytes

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Host background work (prefetch, delayed calls) until cancelled; without it neither runs."""
        async with trio.open_nursery() as nursery:
            self.runtime.attach(nursery)
            self.delayed.attach(nursery)
            nursery.start_soon(self.interrupts.run)
            task_status.started()
            await trio.sleep_forever()

    @staticmethod
    def new_lock() -> Lock:
        """A lock for the core's own objects (held files): taken with `async with`."""
        return trio.Lock()

    @staticmethod
    def new_event() -> Event:
        """An event for the core's own waits (a revalidation under way): `set`, `await wait()`."""
        return trio.Event()

    def note_failure(self, error: ZarrfsError, key: str) -> None:
        """Count a failure of KEY (a node's document, a chunk) found outside the engine, and log it
        as the engine's own: once, then at most once a minute."""
        self.runtime.count_error(error, key)

    # --- reads ----------------------------------------------------------------------------

    async def read(
        self,
        stream: ByteStream,
        offset: int,
        size: int,
        readahead: ReadAhead | None = None,
        reply: bool = False,
        pinned: bool = False,
    ) -> bytes | memoryview:
        """Bytes [offset, offset+size) of a stream, loading the chunks it needs concurrently;
        with `readahead` (the reader's own state), a sequential reader's next window is loaded.
        With `reply` (a FUSE read handler, which returns the bytes at once: pyfuse3 replies
        before any other task runs, and which tried `read_now` first), the bytes may be a view
        of a buffer every such read reuses, and the fast paths that need that are tried
        (fastpath/: bands, then direct reads).

        Arrays of shards that can be read in part are planned over their inner chunks,
        unless every shard the read needs is already decoded whole (then over the shards:
        fewer, larger copies). A sequential reader of a remote store takes them from whole
        shards, each read in one request (fastpath/shards.py).

        `pinned`: the read continues one begun before the TTL's last start: chunks that start
        dropped are taken in the version they had (pins.py), through the usual path.
        """
        if self.streams.serves(stream):  # chunks larger than the cache: never decoded whole
            if readahead is not None:
                readahead.next_offset = offset + size
            return await self.streams.read(stream, offset, size)
        fast = self.fast
        if pinned:
            reply = False  # (bands and direct reads know nothing of pinned versions)
        if reply and readahead is not None:
            banded = await fast.from_bands(stream, offset, size, readahead)
            if banded is not None:
                readahead.next_offset = offset + size
                self.counters["reads"] += 1
                return banded
        plan = stream.plan(offset, size)
        sequential = readahead is not None and (
            offset == readahead.next_offset or fast.shards.sequential_start(stream, offset, size, readahead)
        )
        if readahead is not None:  # at once: a read the kernel sends while this one loads is sequential too
            readahead.next_offset = offset + size
        if reply:
            direct = await fast.from_files(stream, plan, size)
            if direct is not None:
                self.counters["reads"] += 1
                if sequential and readahead is not None:  # narrow chunks: bands, filled straight from the files too
                    fast.after_read(stream, offset, size, readahead, len(plan.chunks))
                return direct
        reader, plan = fast.shards.planner(stream, plan, offset, size)
        whole = sequential and fast.shards.whole(stream)
        if whole and readahead is not None:  # before the read's own loads, which then share each shard's one request
            self.prefetch.read_ahead(stream, offset, size, readahead, sequential)
        chunks = await self.loads.chunks(reader.meta, plan.chunks, whole, pinned)
        self.counters["reads"] += 1
        self.counters["pinned_reads"] += pinned
        if readahead is not None and not whole:
            self.prefetch.read_ahead(stream, offset, size, readahead, sequential)
        if reply and sequential and readahead is not None:
            fast.after_read(stream, offset, size, readahead, len(plan.chunks))
        data = reader.assemble(plan, chunks)
        if sequential and readahead is not None and reader is stream:
            del chunks  # this read's hold on them
            fast.spares.release_behind(stream, readahead, offset, plan.chunks)
        return data

    def read_now(
        self, stream: ByteStream, offset: int, size: int, readahead: ReadAhead | None = None
    ) -> memoryview | None:
        """A FUSE read served at once, with no await (so no wait to interrupt): a small read, or
        one of many rows in one row of chunks, whose chunks are at hand, as a view of the reused
        reply buffer (or of a chunk); None: `read` it."""
        data, step, used = self.fast.read_now(stream, offset, size, readahead)
        if data is None:
            return None
        if readahead is not None:
            if offset == readahead.next_offset:  # a sequential reader's window still grows
                self.prefetch.read_ahead(stream, offset, size, readahead, True)
                if used is not None:
                    self.fast.spares.release_behind(stream, readahead, offset, used)
            elif used is not None:  # a large read elsewhere: the window starts again, as in `read`
                self.prefetch.read_ahead(stream, offset, size, readahead, False)
            readahead.next_offset = offset + size
        self.counters["reads"] += 1
        self.counters["small_reads" if step == "small" else "row_reads"] += 1
        return data

    async def read_key(self, key: str, offset: int, size: int, key_size: int) -> bytes:
        """Bytes of a store key as it is stored (the `store/` view)."""
        end = min(offset + size, key_size)
        if offset >= end:
            return b""
        try:
            data = await self.run_io(self.store.get_range_sync, key, offset, end)
        except ZarrfsError as e:
            self.runtime.count_error(e, key)
            raise
        self.counters["chunk_gets"] += 1
        self.counters["chunk_bytes"] += len(data)
        return data

    async def chunks(
        self, meta: ArrayMeta, wanted: tuple[Index, ...] | list[Index], whole: bool = False
    ) -> dict[Index, np.ndarray]:
        """Decoded chunks of an array, from the cache or loaded once each (loads.py)."""
        return await self.loads.chunks(meta, wanted, whole)

    async def chunk(self, meta: ArrayMeta, idx: Index) -> np.ndarray:
        """The decoded chunk at `idx` (full chunk shape), from cache or loaded once."""
        return await self.loads.chunk(meta, idx)

    def streamed(self, stream: ByteStream) -> bool:
        """Whether reads of STREAM decode ranges of its chunks, never a whole chunk (streamed.py)."""
        return self.streams.serves(stream)

    async def read_boxes(self, meta: ArrayMeta, idx: Index, parts: list[Box]) -> int:
        """Boxes of one chunk of a streamed array copied into their targets (streamed.py); the bytes decoded."""
        return await self.streams.read_boxes(meta, idx, parts)

    # --- writes ---------------------------------------------------------------------------

    async def write(self, stream: ArrayStream, offset: int, data: bytes) -> None:
        """Write bytes into the data part of a stream (writeback.py)."""
        await self.writeback.write(stream, offset, data)

    async def flush(self, path: str | None = None) -> None:
        """Store every dirty chunk (of one array, or all); raise the first failure (EIO)."""
        await self.writeback.flush(path)

    def starts_empty(self, path: str, stored: set[Index] | None = None) -> None:
        """The array at PATH is being created (staged): no chunk of it is read from the store
        before this engine stored it; STORED, if given, is kept to the chunks stored with data."""
        self.writeback.starts_empty(path, stored)

    def discard(self, path: str) -> None:
        """Forget everything held for an array, or every array below a group (after it is
        removed or replaced). Loads under way keep their readers; later readers start loads of
        their own (a load caches its value only while it is still the one in the table: what
        it read may be the old array)."""

        def within(p: str) -> bool:
            return p == path or p.startswith(path + "/")

        self.writeback.forget(path)  # written chunks, versions, failures
        self.cache.discard_prefix(path)
        self.revalidation.forget(path)  # this mount removed or replaced it: its next metadata is the truth
        inflight = self.tables.inflight
        for key in [k for k in inflight if within(k[0])]:
            del inflight[key]
        self.runtime.forget_flights(lambda k: isinstance(k, tuple) and k[-1] == BODY and within(k[0]))
        self.streams.forget(path)  # streamed reads' decoders

    # --- freshness ------------------------------------------------------------------------

    def see_layout(self, meta: ArrayMeta) -> None:
        """The namespace read `meta` from the store. If the array's chunks were read with another
        chunk layout (another writer replaced it with another grid, data type, fill value or
        codecs), forget what was decoded or is being loaded with the old one."""
        if not self.revalidation.layout_replaced(meta):
            return
        path = meta.path
        lost = [k for k in self.tables.dirty if k[0] == path]
        if lost:  # their grid is gone from the store: stored now, they would corrupt the new array
            log.warning(
                "%s: %d written chunks not yet stored are dropped: another writer replaced the array "
                "in the store with another shape, data type or chunking",
                path or "/",
                len(lost),
            )
        self.discard(path)  # (chunks, shard indexes, written chunks, versions, loads under way)
        self.revalidation.adopt_layout(meta)
        self._new_generation()

    def chunks_stale(self, pins_until: float) -> None:
        """The TTL ran out: cached chunks of every array are checked before their next use; what
        cannot be checked (shard indexes and inner chunks, chunks not read from the store) is
        dropped, and chunk files replaced since (rename) are opened again through their names.
        What it drops stays pinned until `pins_until` (monotonic) for reads begun before (pins.py)."""
        self.revalidation.chunks_stale(pins_until)
        self._new_generation()

    def pins_live(self) -> bool:
        """Whether chunks the TTL's last start dropped may still be used by reads begun before it."""
        return self.revalidation.pins.live()

    def pins_left_s(self) -> float:
        """How long chunks the TTL's last start dropped may still be used (0: no longer)."""
        return max(0.0, self.revalidation.pins.until - time.monotonic())

    def chunks_checked(self, path: str) -> bool:
        """Whether the array's chunks read before the TTL's last start were checked since (or none was read)."""
        return self.revalidation.is_current(path)

    async def check_chunks(self, meta: Any) -> None:
        """Check the array's chunks read before the TTL's last start, if not done yet (revalidate.py)."""
        await self.revalidation.check_cached(meta)

    def drop_clean_chunks(self) -> None:
        """Forget every cached chunk and shard index (they are read from the store again when next
        needed); written chunks not yet stored stay in the dirty set, where reads find them first."""
        self.cache.discard_prefix("")
        self._new_generation()
        self.streams.drop()

    def drop_streams(self) -> None:
        """Forget every idle decoder of streamed reads (their chunks may have changed)."""
        self.streams.drop()

    def _new_generation(self) -> None:
        """Bands, decoders and read-ahead plans made so far are not used again, kept chunk files
        are opened again, and loads under way leave the tables (they finish for the readers
        that wait on them, and cache nothing): their chunks may have changed."""
        self.tables.generation += 1
        self.tables.inflight.clear()
        self.runtime.forget_flights(lambda k: isinstance(k, tuple) and k[-1] == BODY)
        self.fast.drop()

    def stats(self) -> dict[str, Any]:
        """Counters since mount (for stats.json and the log)."""
        cache, bands = self.cache, self.fast.bands
        return {
            "uptime_s": round(time.time() - self.started, 3),
            **dict(self.counters),
            "cache_hits": cache.hits,
            "cache_misses": cache.misses,
            "cache_evictions": cache.evictions,
            "cache_bytes": cache.used_bytes,
            "cache_max_bytes": cache.max_bytes,
            "oversize_chunks": cache.oversize_held,
            "oversize_bytes": cache.oversize_bytes,
            "oversize_slots": cache.oversize_slots,
            "oversize_evictions": cache.oversize_evictions,
            "decode_seconds": round(self.runtime.decode_seconds, 6),
            "band_bytes": bands.band_bytes,
            "band_bytes_peak": bands.band_bytes_peak,
            "plain_files_pending": self.delayed.waiting,  # closed, waiting for their write-back
            **self.store.request_stats(),
            **self.store.disk_stats(),
            "errors": dict(self.errors),
            **self.runtime.failures.stats(),
        }
