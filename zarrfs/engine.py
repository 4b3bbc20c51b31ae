"""Trio orchestration of chunk loads: cache, single-flight, limiters, worker threads, counters.

Concurrency rules: everything here runs in the trio thread, so code between two awaits is
atomic and the tables (cache, in-flight loads, counters) need no locks. Worker threads
(`*_sync` functions) get immutable inputs (ArrayMeta, bytes) and touch no shared table.
"""

from __future__ import annotations

import collections
import logging
import math
import os
import time
from typing import Any

import numpy as np
import trio

from . import grid
from .codecs import is_fill
from .errors import CorruptChunk, StoreError, ZarrfsError
from .model import ArrayMeta
from .store import Store
from .views import ArrayStream

log = logging.getLogger(__name__)

Index = tuple[int, ...]

# Concurrent store reads: enough to hide the latency of a remote store; local reads
# gain nothing past a handful. Decoding is CPU-bound: one thread per core.
IO_THREADS_REMOTE = 16
IO_THREADS_LOCAL = 4
DECODE_THREADS = max(1, os.cpu_count() or 1)
COUNTERS = ("reads", "store_gets", "store_bytes", "fill_chunks", "bytes_decoded", "prefetched",
            "bytes_written", "chunks_stored", "chunks_erased")
# Read-ahead of chunks for sequential readers: the window doubles on each sequential read
# and resets on a seek (as mountpoint-s3 and ratarmount do), bounded in bytes and by a
# share of the cache so that prefetched chunks are not evicted before they are read.
PREFETCH_MAX_BYTES = 256 << 20
PREFETCH_CACHE_SHARE = 4
PREFETCH_STREAMS = 256  # sequential-read state kept for this many streams
# Dirty (written, not yet stored) chunks are flushed oldest first beyond this budget, so a
# streaming copy of any size holds at most this much: a few chunk rows of a large array.
DIRTY_MAX_BYTES = 256 << 20


def encode_chunk_sync(meta: ArrayMeta, key: str, arr: np.ndarray) -> bytes | None:
    """The bytes to store for a chunk, or None when it is all fill value (then it is erased)."""
    if meta.erase_fill_chunks and is_fill(arr, meta.fill_value):
        return None
    try:
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


def _first_leaf(group: BaseExceptionGroup) -> BaseException:
    """The error to report from a group of failed loads: a ZarrfsError if there is one."""
    leaves: list[BaseException] = []
    stack: list[BaseException] = [group]
    while stack:
        e = stack.pop()
        if isinstance(e, BaseExceptionGroup):
            stack.extend(e.exceptions)
        else:
            leaves.append(e)
    return next((e for e in leaves if isinstance(e, ZarrfsError)), leaves[0])


class _Load:
    """One chunk load in flight, shared by every reader that wants that chunk."""

    __slots__ = ("done", "value", "error")

    def __init__(self) -> None:
        self.done = trio.Event()
        self.value: np.ndarray | None = None
        self.error: BaseException | None = None


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
        # stream id -> (offset the next sequential read starts at, read-ahead window in bytes)
        self._sequential: collections.OrderedDict[int, tuple[int, int]] = collections.OrderedDict()
        self.prefetch_max_bytes = min(PREFETCH_MAX_BYTES, cache.max_bytes // PREFETCH_CACHE_SHARE)
        # Written chunks not yet stored, oldest first: (path, idx) -> (meta, writable array)
        self._dirty: collections.OrderedDict[tuple[str, Index], tuple[ArrayMeta, np.ndarray]] = (
            collections.OrderedDict())
        self.dirty_bytes = 0
        self.dirty_max_bytes = DIRTY_MAX_BYTES
        self._chunk_locks: dict[tuple[str, Index], trio.Lock] = {}
        self._storing: dict[tuple[str, Index], np.ndarray] = {}
        # Changes of each written chunk, so a writer notices one made while it waited.
        self._versions: dict[tuple[str, Index], int] = {}
        # A failed background flush is reported at the array's next fsync/close.
        self._write_errors: dict[str, ZarrfsError] = {}

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Host background work (prefetch) until cancelled; without it there is no prefetch."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            await trio.sleep_forever()

    async def run_io(self, fn: Any, *args: Any) -> Any:
        """Run a blocking store call in a worker thread under the I/O limiter."""
        return await trio.to_thread.run_sync(fn, *args, limiter=self.io_limiter)

    async def chunk(self, meta: ArrayMeta, idx: Index) -> np.ndarray:
        """The decoded chunk at `idx` (full chunk shape), from cache or loaded once."""
        key = (meta.path, idx)
        arr = self._held(key)
        if arr is None:
            arr = self.cache.get(key)
        if arr is not None:
            return arr
        load = self._inflight.get(key)
        if load is not None:
            await load.done.wait()
            if load.error is not None:
                raise load.error
            return load.value
        load = self._inflight[key] = _Load()
        try:
            load.value = await self._load(meta, idx)
            self.cache.put(key, load.value)
            return load.value
        except BaseException as e:
            load.error = e if isinstance(e, ZarrfsError) else StoreError(f"load of chunk {idx} was interrupted")
            raise
        finally:
            del self._inflight[key]
            load.done.set()

    def _held(self, key: tuple[str, Index]) -> np.ndarray | None:
        """A written chunk the store may not have yet: dirty, or being stored right now."""
        dirty = self._dirty.get(key)
        return dirty[1] if dirty is not None else self._storing.get(key)

    async def chunks(self, meta: ArrayMeta, wanted: tuple[Index, ...] | list[Index]) -> dict[Index, np.ndarray]:
        """Several chunks: those held (dirty or cached) at once, the others loaded concurrently."""
        out: dict[Index, np.ndarray] = {}
        missing = []
        for idx in wanted:
            key = (meta.path, idx)
            arr = self._held(key)
            if arr is None:
                arr = self.cache.get(key)
            if arr is None:
                missing.append(idx)
            else:
                out[idx] = arr
        if len(missing) == 1:
            out[missing[0]] = await self.chunk(meta, missing[0])
        elif missing:
            async def get(idx: Index) -> None:
                out[idx] = await self.chunk(meta, idx)

            try:
                async with trio.open_nursery() as nursery:
                    for idx in missing:
                        nursery.start_soon(get, idx)
            except BaseExceptionGroup as group:
                raise _first_leaf(group) from None
        return out

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
        t0 = time.perf_counter()
        try:
            arr = await trio.to_thread.run_sync(decode_chunk_sync, meta, key, raw, limiter=self.cpu_limiter)
        except ZarrfsError as e:
            self._count_error(e, key)
            raise
        self.decode_seconds += time.perf_counter() - t0
        self.counters["bytes_decoded"] += arr.nbytes
        return arr

    def _count_error(self, error: ZarrfsError, key: str) -> None:
        self.errors[type(error).__name__] += 1
        text = str(error)
        log.warning("%s", text if key in text else f"{key}: {text}")

    async def read(self, stream: ArrayStream, offset: int, size: int) -> bytes | memoryview:
        """Bytes [offset, offset+size) of a stream, loading the chunks it needs concurrently."""
        plan = stream.plan(offset, size)
        chunks = await self.chunks(stream.meta, plan.chunks)
        self.counters["reads"] += 1
        self._read_ahead(stream, offset, size)
        return stream.assemble(plan, chunks)

    def _read_ahead(self, stream: ArrayStream, offset: int, size: int) -> None:
        """After a sequential read, start loading the chunks of the next window."""
        if self._nursery is None or self.prefetch_max_bytes <= 0:
            return
        key = id(stream)
        next_offset, window = self._sequential.pop(key, (-1, 0))
        window = min(max(window * 2, size), self.prefetch_max_bytes) if offset == next_offset else 0
        self._sequential[key] = (offset + size, window)
        if len(self._sequential) > PREFETCH_STREAMS:
            self._sequential.popitem(last=False)
        if window == 0 or offset + size >= stream.size:
            return
        for idx in stream.plan(offset + size, window).chunks:
            ckey = (stream.meta.path, idx)
            if ckey not in self._inflight and not self.cache.contains(ckey):
                self.counters["prefetched"] += 1
                self._nursery.start_soon(self._prefetch, stream.meta, idx)

    async def _prefetch(self, meta: ArrayMeta, idx: Index) -> None:
        try:
            await self.chunk(meta, idx)
        except ZarrfsError:
            pass  # reported when a reader asks for this chunk

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
        # From here to the end no await: the patch of every chunk is atomic.
        targets = {}
        for idx in plan.chunks:
            key = (meta.path, idx)
            entry = self._dirty.get(key)
            if entry is None:
                base = self._dirty_base(meta, idx, loaded.get(idx))
                entry = self._dirty[key] = (meta, base)
                self.dirty_bytes += base.nbytes
            targets[idx] = entry[1]
            self._versions[key] = self._versions.get(key, 0) + 1
        stream.scatter(plan, buf, targets)
        self.counters["bytes_written"] += plan.take_bytes
        if self.dirty_bytes > self.dirty_max_bytes:
            await self._flush_oldest()

    def _dirty_base(self, meta: ArrayMeta, idx: Index, current: np.ndarray | None) -> np.ndarray:
        """A writable copy of a chunk to patch: its current values, or fill where none matter."""
        if current is None:  # the write covers every element of the chunk inside the array
            return np.full(meta.chunk_shape, meta.fill_value, dtype=meta.dtype)
        return np.array(current, dtype=meta.dtype, order="C", copy=True)

    async def _flush_oldest(self) -> None:
        """Store dirty chunks, oldest first, until back within the budget."""
        while self.dirty_bytes > self.dirty_max_bytes // 2 and self._dirty:
            key = next(iter(self._dirty))
            try:
                await self._flush_chunk(key)
            except ZarrfsError as e:
                self._write_errors.setdefault(key[0], e)
                raise

    async def _flush_chunk(self, key: tuple[str, Index]) -> None:
        lock = self._chunk_locks.setdefault(key, trio.Lock())
        async with lock:  # flushes of one chunk reach the store in the order they started
            entry = self._dirty.pop(key, None)
            if entry is None:
                return
            meta, arr = entry
            self.dirty_bytes -= arr.nbytes
            arr.flags.writeable = False
            # Readers and writers see it while it is being stored, cached or not.
            self._storing[key] = arr
            self.cache.put(key, arr)
            store_key = meta.chunk_key(key[1])
            try:
                data = await trio.to_thread.run_sync(encode_chunk_sync, meta, store_key, arr,
                                                     limiter=self.cpu_limiter)
                await self.run_io(meta.write_chunk_sync, self.store, key[1], data)
            except ZarrfsError as e:
                self.cache.discard(key)  # what the store holds is the truth again
                self._versions[key] = self._versions.get(key, 0) + 1
                self._count_error(e, store_key)
                raise
            finally:
                if self._storing.get(key) is arr:
                    del self._storing[key]
            self.counters["chunks_stored" if data is not None else "chunks_erased"] += 1
        if not lock.locked() and lock.statistics().tasks_waiting == 0:
            self._chunk_locks.pop(key, None)

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
            "decode_seconds": round(self.decode_seconds, 6),
            "errors": dict(self.errors),
        }
