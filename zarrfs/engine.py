"""Trio orchestration of chunk loads: cache, single-flight, limiters, worker threads, counters.

Concurrency rules: everything here runs in the trio thread, so code between two awaits is
atomic and the tables (cache, in-flight loads, counters) need no locks. Worker threads
(`*_sync` functions) get immutable inputs (ArrayMeta, bytes) and touch no shared table.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import logging
import math
import os
import time
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import trio

from . import grid
from .codecs import is_fill
from .errors import CorruptChunk, StoreError, ZarrfsError
from .model import ArrayMeta, ShardedInner
from .store import Store
from .layouts import ArrayStream

log = logging.getLogger(__name__)

Index = tuple[int, ...]

# Concurrent store reads: enough to hide the latency of a remote store; local reads
# gain nothing past a handful. Decoding is CPU-bound: one thread per core.
IO_THREADS_REMOTE = 16
IO_THREADS_LOCAL = 4
DECODE_THREADS = max(1, os.cpu_count() or 1)
COUNTERS = ("reads", "store_gets", "store_bytes", "fill_chunks", "bytes_decoded", "prefetched",
            "bytes_written", "chunks_stored", "chunks_erased", "oversize_loads")
# Read-ahead of chunks for sequential readers: the window doubles on each sequential read
# and resets on a seek (as mountpoint-s3 and ratarmount do), bounded in bytes and by a
# share of the cache so that prefetched chunks are not evicted before they are read.
PREFETCH_MAX_BYTES = 256 << 20
PREFETCH_CACHE_SHARE = 4
# Dirty (written, not yet stored) chunks are flushed oldest first beyond this budget, so a
# streaming copy of any size holds at most this much: a few chunk rows of a large array.
# Past a quarter of it the oldest are stored in the background while the writer goes on.
DIRTY_MAX_BYTES = 256 << 20
# Inner chunks of one shard that a read needs are fetched as ranges of the shard, merged
# when the bytes between them cost less than another request would.
RANGE_GAP_LOCAL = 64 << 10
RANGE_GAP_REMOTE = 1 << 20
SHARD_RETRIES = 3  # reads of a shard again after a write overtook them, at most
BATCH_BYTES = 4 << 20  # decoded bytes of inner chunks loaded together, at most (or one chunk)
# Cache keys of inner chunks and of shard indexes carry a tag after (path, index).
INNER = "inner"
INDEX = "index"
NO_SHARD = np.zeros(0, dtype="<u8")  # cached index of a shard that is not stored


def encode_chunk_sync(meta: ArrayMeta, key: str, arr: np.ndarray,
                      old: bytes | None = None, changed: set[Index] | None = None) -> bytes | None:
    """The bytes to store for a chunk, or None when it is all fill value (then it is erased).

    For a shard read from stored bytes `old`, only the inner chunks in `changed` are
    encoded; the others keep their stored bytes.
    """
    if meta.erase_fill_chunks and is_fill(arr, meta.fill_value):
        return None
    try:
        if old is not None and changed is not None and meta.inner is not None:
            data = meta.codec.array_bytes.encode_changed(arr, meta.fill_value, old, changed)
            return data or None
        data = meta.codec.encode(arr, meta.fill_value)
    except ZarrfsError as e:
        raise type(e)(f"chunk {key}: {e}") from None
    except Exception as e:
        raise StoreError(f"chunk {key}: cannot encode: {type(e).__name__}: {e}") from None
    return bytes(data) if len(data) else None


def decode_chunk_sync(meta: ArrayMeta, key: str, raw: bytes) -> np.ndarray:
    """Decode one stored chunk; any failure becomes a CorruptChunk naming the key."""
    try:
        arr = meta.codec.decode(raw, meta.chunk_shape, meta.dtype, meta.fill_value)
    except ZarrfsError as e:
        raise type(e)(f"chunk {key}: {e}") from None
    except Exception as e:  # numcodecs raises many types for corrupt input
        raise CorruptChunk(f"chunk {key}: cannot decode: {type(e).__name__}: {e}") from None
    if arr.shape != meta.chunk_shape or arr.dtype != meta.dtype:
        raise CorruptChunk(f"chunk {key}: decoded to {arr.shape} {arr.dtype}, "
                           f"expected {meta.chunk_shape} {meta.dtype}")
    return arr


def decode_chunks_sync(meta: ArrayMeta, pieces: list[tuple[str, Any]]) -> list[np.ndarray]:
    """Decode several stored chunks of one array, each labelled by its key for errors."""
    return [decode_chunk_sync(meta, key, raw) for key, raw in pieces]


class _Load:
    """One chunk load in flight, shared by every reader that wants that chunk."""

    __slots__ = ("done", "value", "error")

    def __init__(self) -> None:
        self.done = trio.Event()
        self.value: np.ndarray | None = None
        self.error: BaseException | None = None


class ReadAhead:
    """The read-ahead state of one reader (an open file): where its next sequential read
    starts, its window in bytes, and the offset up to which read-ahead was already started."""

    __slots__ = ("next_offset", "window", "planned")

    def __init__(self) -> None:
        self.next_offset, self.window, self.planned = -1, 0, 0


class Engine:
    """Turns reads of array streams into cached, deduplicated chunk loads."""

    def __init__(self, store: Store, cache: Any) -> None:
        self.store = store
        self.cache = cache
        self.io_limiter = trio.CapacityLimiter(IO_THREADS_LOCAL if store.is_local else IO_THREADS_REMOTE)
        self.cpu_limiter = trio.CapacityLimiter(DECODE_THREADS)
        self._inflight: dict[tuple[str, Index], _Load] = {}
        self.counters: collections.Counter[str] = collections.Counter(dict.fromkeys(COUNTERS, 0))
        self.errors: collections.Counter[str] = collections.Counter()
        self.decode_seconds = 0.0
        self.started = time.time()
        self._nursery: trio.Nursery | None = None
        self._flights: dict[Any, _Load] = {}  # once(): calls in flight by key
        self.prefetch_max_bytes = min(PREFETCH_MAX_BYTES, cache.max_bytes // PREFETCH_CACHE_SHARE)
        # Written chunks not yet stored, oldest first: (path, idx) -> (meta, writable array)
        self._dirty: collections.OrderedDict[tuple[str, Index], tuple[ArrayMeta, np.ndarray]] = (
            collections.OrderedDict())
        self.dirty_bytes = 0
        self.dirty_max_bytes = DIRTY_MAX_BYTES
        self.storing_bytes = 0  # chunks taken from the dirty set and being encoded or stored
        self._flushing = False  # a background flush is running
        self._chunk_locks: dict[tuple[str, Index], trio.Lock] = {}
        self._storing: dict[tuple[str, Index], np.ndarray] = {}
        # Dirty shards patched from what the store holds: the inner chunks written since
        # (None: every inner chunk is encoded again at flush).
        self._changed: dict[tuple[str, Index], set[Index] | None] = {}
        # Changes of each written chunk, so a writer notices one made while it waited.
        self._versions: dict[tuple[str, Index], int] = {}
        # A failed background flush is reported at the array's next fsync/close.
        self._write_errors: dict[str, ZarrfsError] = {}
        # Chunks larger than the cache are loaded one at a time (each costs its encoded
        # bytes and its decoded array while it loads), and said once per array.
        self._oversize_lock = trio.Lock()
        self._oversize_told: set[str] = set()

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Host background work (prefetch) until cancelled; without it there is no prefetch."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            await trio.sleep_forever()

    async def run_io(self, fn: Any, *args: Any) -> Any:
        """Run a blocking store call in a worker thread under the I/O limiter."""
        return await trio.to_thread.run_sync(fn, *args, limiter=self.io_limiter)

    async def run_io_shielded(self, fn: Any, *args: Any) -> Any:
        """run_io that finishes even when the caller is cancelled (clean-up after a failure)."""
        with trio.CancelScope(shield=True):
            return await self.run_io(fn, *args)

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
            del self._flights[key]
            flight.done.set()

    @staticmethod
    def _key(meta: ArrayMeta, idx: Index) -> tuple:
        """Cache key of a decoded chunk; inner chunks of shards have their own."""
        return (meta.path, idx, INNER) if isinstance(meta.source, ShardedInner) else (meta.path, idx)

    @staticmethod
    def _write_unit(meta: ArrayMeta, idx: Index) -> tuple[str, Index]:
        """The written chunk a chunk belongs to: itself, or for an inner chunk its shard."""
        src = meta.source
        return (meta.path, src.shard_of(idx)) if isinstance(src, ShardedInner) else (meta.path, idx)

    def _lookup(self, meta: ArrayMeta, idx: Index, count: bool = True) -> np.ndarray | None:
        """A chunk without loading it: held by a writer, or cached (for an inner chunk, its shard too)."""
        unit = self._write_unit(meta, idx)
        whole = self._held(unit)
        src = meta.source
        if isinstance(src, ShardedInner):
            if whole is None and self.cache.contains(unit):
                whole = self.cache.get(unit, count)
            if whole is not None:  # the inner chunk's region of its decoded shard
                return whole[tuple(slice(p * c, (p + 1) * c) for p, c in zip(src.position(idx), meta.chunk_shape))]
            return self.cache.get(self._key(meta, idx), count)
        return whole if whole is not None else self.cache.get(unit, count)

    def _held(self, key: tuple[str, Index]) -> np.ndarray | None:
        """A written chunk the store may not have yet: dirty, or being stored right now."""
        dirty = self._dirty.get(key)
        return dirty[1] if dirty is not None else self._storing.get(key)

    async def chunk(self, meta: ArrayMeta, idx: Index) -> np.ndarray:
        """The decoded chunk at `idx` (full chunk shape), from cache or loaded once."""
        return (await self.chunks(meta, (idx,)))[idx]

    async def chunks(self, meta: ArrayMeta, wanted: tuple[Index, ...] | list[Index]) -> dict[Index, np.ndarray]:
        """Several chunks: those held or cached at once; the others loaded concurrently, each
        once however many readers want it (inner chunks of one shard in one batch)."""
        out: dict[Index, np.ndarray] = {}
        waiting: list[tuple[Index, _Load]] = []
        new: dict[Index, _Load] = {}
        shards: list[Index] = []
        for idx in wanted:
            arr = self._lookup(meta, idx)
            if arr is not None:
                out[idx] = arr
                continue
            key = self._key(meta, idx)
            load = self._inflight.get(key)
            if load is None and key[-1] == INNER and self._write_unit(meta, idx) in self._inflight:
                shards.append(idx)  # its shard is being loaded whole: take it from there
                continue
            if load is None:
                load = new[idx] = self._inflight[key] = _Load()
            waiting.append((idx, load))
        if new:
            batches = self._batches(meta, list(new))
            if len(batches) == 1:
                await self._load_batch(meta, batches[0], new)
            else:
                async with trio.open_nursery() as nursery:
                    for batch in batches:
                        nursery.start_soon(self._load_batch, meta, batch, new)
        for idx, load in waiting:
            await load.done.wait()
            if load.error is not None:
                raise load.error
            out[idx] = load.value
        for idx in shards:
            load = self._inflight.get(self._write_unit(meta, idx))
            if load is not None:
                await load.done.wait()
            arr = self._lookup(meta, idx)
            out[idx] = arr if arr is not None else (await self.chunks(meta, (idx,)))[idx]
        return out

    @staticmethod
    def _batches(meta: ArrayMeta, idxs: list[Index]) -> list[list[Index]]:
        """Loads that go together: each chunk alone; inner chunks of one shard a few at a time."""
        src = meta.source
        if not isinstance(src, ShardedInner):
            return [[idx] for idx in idxs]
        by_shard: dict[Index, list[Index]] = {}
        for idx in idxs:
            by_shard.setdefault(src.shard_of(idx), []).append(idx)
        # Bounded batches, in the shard's own order: a reader waits only for the batch
        # holding its chunk, and several batches decode in parallel.
        per_batch = max(1, BATCH_BYTES // (math.prod(meta.chunk_shape) * meta.dtype.itemsize or 1))
        batches = []
        for group in by_shard.values():
            group.sort(key=src.position)
            batches += [group[i:i + per_batch] for i in range(0, len(group), per_batch)]
        return batches

    async def _load_batch(self, meta: ArrayMeta, batch: list[Index], loads: dict[Index, _Load]) -> None:
        """Load a batch and settle its loads (values or the error); cache what is still current.

        Only cancellation propagates: load errors reach every reader through its `_Load`.
        """
        unit = self._write_unit(meta, batch[0])
        version = self._versions.get(unit, 0)
        values: dict[Index, np.ndarray] = {}
        error: BaseException | None = None
        try:
            async with self._oversize_turn(meta, batch[0]):
                if isinstance(meta.source, ShardedInner):
                    values, error = await self._load_inner_consistent(meta, batch)
                    version = self._versions.get(unit, 0)
                else:
                    values = {batch[0]: await self._load(meta, batch[0])}
        except ZarrfsError as e:
            error = e
        except Exception as e:  # a bug fails this load (EIO), never the daemon
            log.exception("unexpected error loading chunk %s of %s", batch[0], meta.path or "/")
            error = StoreError(f"chunk {batch[0]} of {meta.path or '/'}: unexpected {type(e).__name__}: {e}")
        except BaseException:
            error = StoreError(f"load of chunk {batch[0]} of {meta.path or '/'} was interrupted")
            raise
        finally:
            # A write since the load began makes what was read stale: hand it to the
            # readers that asked before the write, but do not cache it.
            current = self._versions.get(unit, 0) == version
            for idx in batch:
                key = self._key(meta, idx)
                load = loads[idx]
                if error is None:
                    load.value = values[idx]
                    if current:
                        self.cache.put(key, load.value)
                else:
                    load.error = error
                del self._inflight[key]
                load.done.set()

    @contextlib.asynccontextmanager
    async def _oversize_turn(self, meta: ArrayMeta, idx: Index) -> AsyncIterator[None]:
        """For a chunk larger than the whole cache: wait for the one such load at a time, make
        room in the cache's oversize slots first (so that at most that many such chunks
        exist at once), and say once per array what this costs. Other chunks pass."""
        if meta.chunk_nbytes <= self.cache.max_bytes:
            yield
            return
        async with self._oversize_lock:
            if meta.path not in self._oversize_told:
                self._oversize_told.add(meta.path)
                log.warning("%s: chunk %s decodes to %d bytes, more than cache_size (%d): such chunks are "
                            "kept beside the cache, the %d most recently read, and decoded one at a time. "
                            "Give a cache_size of at least %d bytes (four chunks: read-ahead, a quarter of the "
                            "cache, then spans one), or rechunk the array in smaller chunks",
                            meta.path or "/", meta.chunk_key(idx), meta.chunk_nbytes, self.cache.max_bytes,
                            self.cache.oversize_slots, meta.chunk_nbytes * PREFETCH_CACHE_SHARE)
            self.cache.make_room_oversize()
            self.counters["oversize_loads"] += 1
            yield

    async def _load_inner_consistent(self, meta: ArrayMeta, batch: list[Index]
                                     ) -> tuple[dict[Index, np.ndarray], ZarrfsError | None]:
        """Inner chunks read from one version of their shard.

        The index and the chunks' bytes are separate requests: a shard stored by a writer
        between them leaves offsets of the old shard over the bytes of the new one. When
        the shard was written meanwhile, what was read (or failed to decode) is dropped
        and read again, from the writer's chunk while it is held.
        """
        unit = self._write_unit(meta, batch[0])
        for attempt in range(SHARD_RETRIES + 1):
            version = self._versions.get(unit, 0)
            # Held or cached since the reader looked (a write may have come in between).
            values = {idx: arr for idx in batch if (arr := self._lookup(meta, idx, count=False)) is not None}
            error: ZarrfsError | None = None
            try:
                if len(values) < len(batch):
                    values.update(await self._load_inner(meta, [i for i in batch if i not in values]))
            except ZarrfsError as e:
                error = e
            if self._versions.get(unit, 0) == version or attempt == SHARD_RETRIES:
                break
            log.debug("shard of %s chunk %s was written while it was read; reading again", meta.path, batch[0])
        if error is not None:
            self._count_error(error, meta.chunk_key(batch[0]))
        return values, error

    async def _load(self, meta: ArrayMeta, idx: Index) -> np.ndarray:
        key = meta.chunk_key(idx)
        try:
            raw = await self.run_io(meta.read_chunk_sync, self.store, idx)
        except ZarrfsError as e:
            self._count_error(e, key)
            raise
        self.counters["store_gets"] += 1
        if raw is None:
            self.counters["fill_chunks"] += 1
            return np.broadcast_to(meta.fill_value, meta.chunk_shape)
        self.counters["store_bytes"] += len(raw)
        return (await self._decode(meta, [(key, raw)]))[0]

    async def _decode(self, meta: ArrayMeta, pieces: list[tuple[str, Any]],
                      count_errors: bool = True) -> list[np.ndarray]:
        """Decode encoded chunks (labelled for errors) in one worker thread."""
        t0 = time.perf_counter()
        try:
            arrs = await trio.to_thread.run_sync(decode_chunks_sync, meta, pieces, limiter=self.cpu_limiter)
        except ZarrfsError as e:
            if count_errors:
                self._count_error(e, pieces[0][0])
            raise
        self.decode_seconds += time.perf_counter() - t0
        self.counters["bytes_decoded"] += sum(a.nbytes for a in arrs)
        return arrs

    async def _shard_index(self, meta: ArrayMeta, shard: Index) -> np.ndarray | None:
        """The index of a shard (cached, loaded once), or None when the shard is not stored."""
        src: ShardedInner = meta.source
        key = (meta.path, shard, INDEX)
        index = self.cache.get(key, count=False)
        if index is None:
            load = self._inflight.get(key)
            if load is not None:
                await load.done.wait()
                if load.error is not None:
                    raise load.error
                index = load.value
            else:
                load = self._inflight[key] = _Load()
                version = self._versions.get((meta.path, shard), 0)
                try:
                    index = await self.run_io(src.read_index_sync, self.store, shard)
                    self.counters["store_gets"] += 1
                    if index is None:
                        index = NO_SHARD
                    else:
                        self.counters["store_bytes"] += src.sharding.index_nbytes(src.per_shard)
                    load.value = index
                    if self._versions.get((meta.path, shard), 0) == version:
                        self.cache.put(key, index)
                except BaseException as e:  # counted and logged by the batch that asked
                    load.error = e if isinstance(e, ZarrfsError) else StoreError(f"load of shard {shard} was interrupted")
                    raise
                finally:
                    del self._inflight[key]
                    load.done.set()
        return None if index.size == 0 else index

    async def _load_inner(self, meta: ArrayMeta, batch: list[Index]) -> dict[Index, np.ndarray]:
        """Inner chunks of one shard: its index, then only their bytes, in as few ranges as reason allows."""
        src: ShardedInner = meta.source
        shard = src.shard_of(batch[0])
        shard_key = src.keys.key(shard)
        index = await self._shard_index(meta, shard)
        out: dict[Index, np.ndarray] = {}
        stored: list[tuple[int, int, Index]] = []
        # A hostile index must not make us ask for terabytes: no codec of fixed-size data
        # grows it by more than a header and a small fraction.
        decoded = math.prod(meta.chunk_shape) * meta.dtype.itemsize
        limit = 2 * decoded + (1 << 16)
        for idx in batch:
            try:
                found = None if index is None else src.sharding.entry(index, src.position(idx))
            except CorruptChunk as e:
                raise CorruptChunk(f"shard {shard_key}: {e}") from None
            if found is None:
                self.counters["fill_chunks"] += 1
                out[idx] = np.broadcast_to(meta.fill_value, meta.chunk_shape)
                continue
            offset, nbytes = found
            if nbytes > limit:
                raise CorruptChunk(f"shard {shard_key}: its index gives inner chunk {src.position(idx)} "
                                   f"{nbytes} bytes, more than any encoding of {decoded} bytes takes")
            else:
                stored.append((offset, nbytes, idx))
        if not stored:
            return out
        stored.sort()
        gap = RANGE_GAP_LOCAL if self.store.is_local else RANGE_GAP_REMOTE
        ranges: list[list[int]] = []
        for offset, nbytes, _ in stored:
            if ranges and offset - ranges[-1][1] <= gap:
                ranges[-1][1] = max(ranges[-1][1], offset + nbytes)
            else:
                ranges.append([offset, offset + nbytes])
        datas = await self.run_io(src.read_ranges_sync, self.store, shard, [tuple(r) for r in ranges])
        self.counters["store_gets"] += len(ranges)
        self.counters["store_bytes"] += sum(len(d) for d in datas)
        pieces = []
        r = 0
        for offset, nbytes, idx in stored:
            while offset + nbytes > ranges[r][1]:  # pieces and ranges are both in offset order
                r += 1
            start = offset - ranges[r][0]
            pieces.append((f"{shard_key} (inner chunk {src.position(idx)})",
                           memoryview(datas[r])[start:start + nbytes]))
        for (_, _, idx), arr in zip(stored, await self._decode(meta, pieces, count_errors=False)):
            out[idx] = arr
        return out

    def _count_error(self, error: ZarrfsError, key: str) -> None:
        self.errors[type(error).__name__] += 1
        text = str(error)
        log.warning("%s", text if key in text else f"{key}: {text}")

    async def read(self, stream: ArrayStream, offset: int, size: int,
                   readahead: ReadAhead | None = None) -> bytes | memoryview:
        """Bytes [offset, offset+size) of a stream, loading the chunks it needs concurrently;
        with `readahead` (the reader's own state), a sequential reader's next window is loaded.

        Arrays of shards that can be read in part are planned over their inner chunks,
        unless every shard the read needs is already decoded whole (then over the shards:
        fewer, larger copies).
        """
        plan = stream.plan(offset, size)
        fine = stream.for_reads()
        if (fine is not stream and not self.store.ranges_ignored
                and not all(self._known(stream.meta, idx) for idx in plan.chunks)):
            plan, reader = fine.plan(offset, size), fine
        else:
            reader = stream
        chunks = await self.chunks(reader.meta, plan.chunks)
        self.counters["reads"] += 1
        if readahead is not None:
            self._read_ahead(stream, offset, size, readahead)
        return reader.assemble(plan, chunks)

    def _read_ahead(self, stream: ArrayStream, offset: int, size: int, state: ReadAhead) -> None:
        """After a sequential read, start loading the chunks of the next window.

        Shards that fit in the window are loaded whole; in a smaller window, only the
        inner chunks the window covers.
        """
        if self._nursery is None or self.prefetch_max_bytes <= 0:
            return
        window, planned = state.window, state.planned
        if offset == state.next_offset:
            window = min(max(window * 2, size), self.prefetch_max_bytes)
        else:
            window, planned = 0, 0
        end = offset + size
        # Only the part of the window not planned by an earlier read is planned now.
        start = max(end, planned)
        stop = min(end + window, stream.size)
        state.next_offset, state.window, state.planned = end, window, max(planned, stop)
        if start >= stop:
            return
        meta = stream.meta
        if (meta.inner is not None and not self.store.ranges_ignored
                and math.prod(meta.chunk_shape) * meta.dtype.itemsize > window):
            stream = stream.for_reads()
            meta = stream.meta
        ahead = []
        for idx in stream.plan(start, stop - start).chunks:
            if self._key(meta, idx) not in self._inflight and not self._known(meta, idx):
                ahead.append(idx)
        if ahead:
            self.counters["prefetched"] += len(ahead)
            self._nursery.start_soon(self._prefetch, meta, ahead)

    def _known(self, meta: ArrayMeta, idx: Index) -> bool:
        """Whether a chunk is held or cached (an inner chunk: it, or its shard whole)."""
        unit = self._write_unit(meta, idx)
        if self._held(unit) is not None or self.cache.contains(unit):
            return True
        return isinstance(meta.source, ShardedInner) and self.cache.contains(self._key(meta, idx))

    async def _prefetch(self, meta: ArrayMeta, idxs: list[Index]) -> None:
        try:
            await self.chunks(meta, idxs)
        except ZarrfsError:
            pass  # reported when a reader asks for these chunks
        except Exception:  # background work must not end the daemon
            log.exception("unexpected error in read-ahead of %s", meta.path or "/")

    # --- writes -------------------------------------------------------------------------

    async def write(self, stream: ArrayStream, offset: int, data: bytes) -> None:
        """Write bytes into the data part of a stream: patch the chunks touched (read-modify-write).

        The caller has checked any part of `data` that falls on the NPY header.
        """
        meta = stream.meta
        plan = stream.plan(offset, len(data))
        if plan.take_bytes == 0:
            return
        item = stream.dtype.itemsize
        n_elems = plan.stop_elem - plan.first_elem
        buf = np.empty(n_elems, dtype=stream.dtype)
        raw = buf.view(np.uint8)
        if plan.skip_bytes or (plan.skip_bytes + plan.take_bytes) % item:
            # Partial elements at the edges keep their other bytes.
            first = len(stream.header) + plan.first_elem * item
            raw[:] = np.frombuffer(await self.read(stream, first, n_elems * item), np.uint8)
        src = data[len(plan.header_part):len(plan.header_part) + plan.take_bytes]
        raw[plan.skip_bytes:plan.skip_bytes + plan.take_bytes] = np.frombuffer(src, np.uint8)
        covered = stream.coverage(plan)
        partial = [idx for idx in plan.chunks
                   if covered[idx] < math.prod(grid.data_shape(idx, meta.shape, meta.chunk_shape))]
        loaded: dict[Index, np.ndarray] = {}
        seen: dict[Index, int] = {}
        while True:
            # Chunks to start from: partly written, not dirty, and not loaded since their
            # last change (another writer may change or store them while we wait).
            need = [idx for idx in partial if (meta.path, idx) not in self._dirty and (
                idx not in loaded or self._versions.get((meta.path, idx), 0) != seen[idx])]
            if not need:
                break
            for idx in need:
                seen[idx] = self._versions.get((meta.path, idx), 0)
            loaded.update(await self.chunks(meta, need))
        changed: dict[Index, set[Index]] | None = None  # computed when a shard needs it
        # From here to the end no await: the patch of every chunk is atomic.
        targets = {}
        for idx in plan.chunks:
            key = (meta.path, idx)
            entry = self._dirty.get(key)
            if entry is None:
                current = loaded.get(idx)
                base = self._dirty_base(meta, idx, current)
                entry = self._dirty[key] = (meta, base)
                self.dirty_bytes += base.nbytes
                if meta.inner is not None:
                    # A shard patched from what the store holds re-encodes only the inner
                    # chunks written; one from fill or from a copy not yet stored, all.
                    from_store = current is not None and current is not self._storing.get(key)
                    self._changed[key] = set() if from_store else None
            if self._changed.get(key) is not None:
                if changed is None:
                    changed = self._inner_changed(stream, offset, len(data))
                self._changed[key] |= changed.get(idx, set())
            targets[idx] = entry[1]
            self._versions[key] = self._versions.get(key, 0) + 1
        stream.scatter(plan, buf, targets)
        self.counters["bytes_written"] += plan.take_bytes
        if self.dirty_bytes + self.storing_bytes > self.dirty_max_bytes:
            await self._flush_oldest(self.dirty_max_bytes // 2)
        elif self.dirty_bytes > self.dirty_max_bytes // 4 and not self._flushing and self._nursery is not None:
            # Store the oldest chunks in the background while the writer goes on, so that
            # encoding overlaps the copy instead of stalling it at the budget.
            self._flushing = True
            self._nursery.start_soon(self._flush_background)

    @staticmethod
    def _inner_changed(stream: ArrayStream, offset: int, size: int) -> dict[Index, set[Index]]:
        """Inner chunks (positions within their shard) that bytes [offset, offset+size) touch, by shard."""
        fine = stream.for_reads()
        src: ShardedInner = fine.meta.source
        out: dict[Index, set[Index]] = {}
        for idx in fine.plan(offset, size).chunks:
            out.setdefault(src.shard_of(idx), set()).add(src.position(idx))
        return out

    def _dirty_base(self, meta: ArrayMeta, idx: Index, current: np.ndarray | None) -> np.ndarray:
        """A writable copy of a chunk to patch: its current values, or fill where none matter."""
        if current is None:  # the write covers every element of the chunk inside the array
            return np.full(meta.chunk_shape, meta.fill_value, dtype=meta.dtype)
        return np.array(current, dtype=meta.dtype, order="C", copy=True)

    async def _flush_oldest(self, target: int) -> None:
        """Store the oldest dirty chunks, several at once, until dirty bytes are within `target`;
        raise the first failure (also kept for the array's next fsync/close)."""
        keys, excess = [], self.dirty_bytes - target
        for key, (_, arr) in self._dirty.items():
            if excess <= 0:
                break
            keys.append(key)
            excess -= arr.nbytes
        errors: list[ZarrfsError] = []

        async def one(key: tuple[str, Index]) -> None:
            try:
                await self._flush_chunk(key)
            except Exception as e:
                if not isinstance(e, ZarrfsError):
                    log.exception("unexpected error storing chunk %s of %s", key[1], key[0] or "/")
                    e = StoreError(f"chunk {key[1]} of {key[0] or '/'}: unexpected {type(e).__name__}: {e}")
                self._write_errors.setdefault(key[0], e)
                errors.append(e)

        async with trio.open_nursery() as nursery:
            for key in keys:
                nursery.start_soon(one, key)
        if errors:
            raise errors[0]

    async def _flush_background(self) -> None:
        try:
            await self._flush_oldest(self.dirty_max_bytes // 8)
        except ZarrfsError:
            pass  # kept in _write_errors: reported at the array's next fsync or close
        except Exception:  # background work must not end the daemon
            log.exception("unexpected error in a background flush")
        finally:
            self._flushing = False

    async def _flush_chunk(self, key: tuple[str, Index]) -> None:
        lock = self._chunk_locks.setdefault(key, trio.Lock())
        async with lock:  # flushes of one chunk reach the store in the order they started
            entry = self._dirty.pop(key, None)
            if entry is None:
                return
            meta, arr = entry
            changed = self._changed.pop(key, None)
            self.dirty_bytes -= arr.nbytes
            self.storing_bytes += arr.nbytes
            arr.flags.writeable = False
            # Readers and writers see it while it is being stored, cached or not.
            self._storing[key] = arr
            self.cache.put(key, arr)
            store_key = meta.chunk_key(key[1])
            try:
                # A shard of which few inner chunks changed keeps the others' stored bytes
                # (read again from a local store: cheaper than encoding them; remote, not).
                old = None
                if (changed is not None and self.store.is_local
                        and len(changed) < math.prod(meta.inner.source.per_shard) // 2):
                    old = await self.run_io(self.store.get_sync, store_key, meta.max_stored_nbytes)
                data = await trio.to_thread.run_sync(encode_chunk_sync, meta, store_key, arr, old, changed,
                                                     limiter=self.cpu_limiter)
                await self.run_io(meta.write_chunk_sync, self.store, key[1], data)
            except ZarrfsError as e:
                self.cache.discard(key)  # what the store holds is the truth again
                self._versions[key] = self._versions.get(key, 0) + 1
                self._count_error(e, store_key)
                raise
            finally:
                self.storing_bytes -= arr.nbytes
                if self._storing.get(key) is arr:
                    del self._storing[key]
                self._forget_inner(meta, key[1])
            self.counters["chunks_stored" if data is not None else "chunks_erased"] += 1
        if not lock.locked() and lock.statistics().tasks_waiting == 0:
            self._chunk_locks.pop(key, None)

    def _forget_inner(self, meta: ArrayMeta, shard: Index) -> None:
        """Drop the cached index and inner chunks of a shard that was just stored (or failed to be)."""
        if meta.inner is None:
            return
        src: ShardedInner = meta.inner.source
        self.cache.discard((meta.path, shard, INDEX))
        for pos in itertools.product(*map(range, src.per_shard)):
            self.cache.discard((meta.path, tuple(s * n + p for s, n, p in zip(shard, src.per_shard, pos)), INNER))

    async def flush(self, path: str | None = None) -> None:
        """Store every dirty chunk (of one array, or all); raise the first failure (EIO)."""
        keys = [k for k in self._dirty if path is None or k[0] == path]
        errors: list[ZarrfsError] = []

        async def one(key: tuple[str, Index]) -> None:
            try:
                await self._flush_chunk(key)
            except ZarrfsError as e:
                errors.append(e)

        async with trio.open_nursery() as nursery:
            for key in keys:
                nursery.start_soon(one, key)
        earlier = [self._write_errors.pop(p) for p in list(self._write_errors) if path is None or p == path]
        if errors or earlier:
            raise (earlier + errors)[0]

    def discard(self, path: str) -> None:
        """Forget everything held for an array (after it is removed or replaced)."""
        for key in [k for k in self._dirty if k[0] == path or k[0].startswith(path + "/")]:
            self.dirty_bytes -= self._dirty.pop(key)[1].nbytes
            self._changed.pop(key, None)
        self.cache.discard_prefix(path)
        self._write_errors.pop(path, None)
        for key in [k for k in self._versions if k[0] == path or k[0].startswith(path + "/")]:
            del self._versions[key]

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
            "errors": dict(self.errors),
        }
