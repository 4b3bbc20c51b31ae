"""Write-back: written chunks held dirty, patched in place, stored oldest first within a byte budget.

A part of the engine, the one that writes the dirty tables (tables.py; docs/CONCURRENCY.md).
Encoding runs in worker threads on immutable inputs.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import numpy as np
import trio

from .. import grid
from ..codecs.chain import is_fill
from ..errors import StoreError, ZarrfsError
from ..grid import Index
from ..model import ArrayMeta
from ..storage import chunksource
from ..views.streams import ArrayStream
from .loads import Loads
from .runtime import Runtime
from .shardstreams import ShardStreams
from .tables import INDEX, INNER, ChunkTables
from .tables import lock_key as chunk_lock_key

log = logging.getLogger(__name__)

# Chunks uploaded at once in the background as writes complete them: as many as the engine's
# store threads for a remote store, so that the rest wait here, not holding a thread's place.
UPLOADS_IN_FLIGHT = 16
# Complete chunks queued for upload or being uploaded: past this a writer waits for uploads to end,
# so that a store slower than the writer holds the daemon's memory near `cache_size` (stored
# chunks go to the cache) instead of filling the write-back budget. One chunk always goes.
UPLOAD_QUEUE_MAX_BYTES = 16 << 20


def encode_chunk_sync(
    meta: ArrayMeta, key: str, arr: np.ndarray, old: bytes | None = None, changed: set[Index] | None = None
) -> bytes | None:
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


class WriteBack:
    """Writes into chunks and their way to the store: the only writer of the dirty tables."""

    def __init__(
        self,
        runtime: Runtime,
        tables: ChunkTables,
        loads: Loads,
        read: Callable[[ArrayStream, int, int], Awaitable[Any]],
        dirty_max_bytes: int,
    ) -> None:
        self.runtime, self.tables, self.loads = runtime, tables, loads
        self._read = read  # the engine's read: the other bytes of elements a write cuts
        self.dirty_max_bytes = dirty_max_bytes
        self._dirty_bytes = 0
        self.storing_bytes = 0  # chunks taken from the dirty set and being encoded or stored
        self._flushing = False  # a background flush is running
        # On a remote store a chunk whose every element was written is uploaded at once, while
        # the writer goes on (a copy's chunks each cost one request's latency, overlapped).
        self.upload_full = not runtime.store.is_local
        self._filled: dict[tuple[str, Index], int] = {}  # elements written into each dirty chunk
        self._uploads = trio.CapacityLimiter(UPLOADS_IN_FLIGHT)
        self.upload_queue_bytes = 0  # decoded bytes of chunks given to _upload and not yet stored
        self._uploaded = trio.Event()  # set (and replaced) each time an _upload ends
        # Large shards go up as their inner chunks are written (S3), not once the shard is stored.
        self.streams = ShardStreams(runtime, self._upload_progress)
        self._stored = trio.Event()  # set (and replaced) each time a chunk leaves `storing`
        # Arrays being created: the chunks stored since (any other is known to be absent: a write
        # into part of it starts from the fill value, no read of the store).
        self._created: dict[str, set[Index]] = {}
        # Of those, the ones stored with data, where the creator asked to know (starts_empty)
        self._stored_into: dict[str, set[Index]] = {}
        # A failed background flush is reported at the array's next fsync/close.
        self._write_errors: dict[str, ZarrfsError] = {}

    @property
    def dirty_bytes(self) -> int:
        """Bytes of written chunks not yet taken to be stored: the cache keeps them free."""
        return self._dirty_bytes

    @dirty_bytes.setter
    def dirty_bytes(self, nbytes: int) -> None:
        self._dirty_bytes = nbytes
        self.tables.cache.reserve(nbytes)

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
        start = len(plan.header_part)
        if plan.skip_bytes or plan.take_bytes % item:
            # Partial elements at the edges keep their other bytes.
            buf = np.empty(n_elems, dtype=stream.dtype)
            raw = buf.view(np.uint8)
            first = len(stream.header) + plan.first_elem * item
            raw[:] = np.frombuffer(await self._read(stream, first, n_elems * item), np.uint8)
            raw[plan.skip_bytes : plan.skip_bytes + plan.take_bytes] = np.frombuffer(
                data, np.uint8, plan.take_bytes, start
            )
        else:  # whole elements: scattered from the request's own bytes, no copy first
            buf = np.frombuffer(data, stream.dtype, n_elems, start)
        covered = stream.coverage(plan)
        partial = [
            idx for idx in plan.chunks if covered[idx] < math.prod(grid.data_shape(idx, meta.shape, meta.chunk_shape))
        ]
        loaded: dict[Index, np.ndarray] = {}
        seen: dict[Index, int] = {}
        while True:
            # Chunks to start from: partly written, not dirty, and not loaded since their
            # last change (another writer may change or store them while we wait).
            created = self._created.get(meta.path)
            need = [
                idx
                for idx in partial
                if (meta.path, idx) not in self.tables.dirty
                and (created is None or idx in created)
                and (idx not in loaded or self.tables.versions.get((meta.path, idx), 0) != seen[idx])
            ]
            if not need:
                break
            for idx in need:
                seen[idx] = self.tables.versions.get((meta.path, idx), 0)
            loaded.update(await self.loads.chunks(meta, need))
        changed: dict[Index, set[Index]] | None = None  # computed when a shard needs it
        # From here to the end no await: the patch of every chunk is atomic.
        targets = {}
        new: set[Index] = set()
        for idx in plan.chunks:
            key = (meta.path, idx)
            entry = self.tables.dirty.get(key)
            if entry is None:
                new.add(idx)
                current = loaded.get(idx)
                base = self._dirty_base(meta, idx, current)
                entry = self.tables.dirty[key] = (meta, base)
                self.dirty_bytes += base.nbytes
                if meta.inner is not None:
                    # A shard patched from what the store holds re-encodes only the inner
                    # chunks written; one from fill or from a copy not yet stored, all.
                    from_store = current is not None and current is not self.tables.storing.get(key)
                    self.tables.changed[key] = set() if from_store else None
            inner = self.tables.changed.get(key)
            if inner is not None:
                if changed is None:
                    changed = self._inner_changed(stream, offset, len(data))
                inner |= changed.get(idx, set())
            targets[idx] = entry[1]
            self.tables.versions[key] = self.tables.versions.get(key, 0) + 1
        stream.scatter(plan, buf, targets)
        self.runtime.counters["bytes_written"] += plan.take_bytes
        if self.upload_full and self.runtime.running:
            if self.streams.streamable(meta):
                self.streams.written(stream, offset, len(data), new, targets)
            self._upload_full(meta, plan.chunks, covered)
            while self.upload_queue_bytes + self.streams.queued_bytes > UPLOAD_QUEUE_MAX_BYTES:
                await self._uploaded.wait()
        if self.dirty_bytes + self.storing_bytes > self.dirty_max_bytes:
            await self._flush_oldest(self.dirty_max_bytes // 2)
            while self.storing_bytes > self.dirty_max_bytes // 2:  # uploads in flight hold the rest
                await self._stored.wait()
        elif self.dirty_bytes > self.dirty_max_bytes // 4 and not self._flushing and self.runtime.running:
            # Store the oldest chunks in the background while the writer goes on, so that
            # encoding overlaps the copy instead of stalling it at the budget.
            self._flushing = True
            self.runtime.start_soon(self._flush_background)

    def starts_empty(self, path: str, stored: set[Index] | None = None) -> None:
        """The array at PATH is being created: none of its chunks is stored until written here.
        STORED, if given, is kept to the indices of the chunks stored with data."""
        self._created[path] = set()
        if stored is not None:
            self._stored_into[path] = stored

    def _upload_full(self, meta: ArrayMeta, chunks: Sequence[Index], covered: dict[Index, int]) -> None:
        """Start storing the chunks this write completed (every element written since each became
        dirty), in the background, at most UPLOADS_IN_FLIGHT at once."""
        for idx in chunks:
            key = (meta.path, idx)
            filled = self._filled.get(key, 0) + covered[idx]
            if filled < math.prod(grid.data_shape(idx, meta.shape, meta.chunk_shape)):
                self._filled[key] = filled
                continue
            self._filled.pop(key, None)
            # A shard streamed went up as it was written: what is left waits in its queue.
            nbytes = 0 if self.streams.intact(key) else meta.chunk_nbytes
            self.upload_queue_bytes += nbytes
            self.runtime.start_soon(self._upload, key, meta, nbytes)

    async def _upload(self, key: tuple[str, Index], meta: ArrayMeta, nbytes: int) -> None:
        """Store one chunk in the background; a failure is kept for the array's next fsync/close."""
        try:
            async with self._uploads:
                await self._flush_chunk(key, meta)
        except ZarrfsError as e:
            self._write_errors.setdefault(key[0], e)
        except Exception as e:  # background work must not end the daemon
            log.exception("unexpected error storing chunk %s of %s", key[1], key[0] or "/")
            self._write_errors.setdefault(key[0], StoreError(f"chunk {key[1]}: unexpected {type(e).__name__}"))
        finally:
            self.upload_queue_bytes -= nbytes
            self._upload_progress()

    def _upload_progress(self) -> None:
        """Bytes waiting for their upload went: a writer waiting for them may go on."""
        self._uploaded.set()
        self._uploaded = trio.Event()

    @staticmethod
    def _inner_changed(stream: ArrayStream, offset: int, size: int) -> dict[Index, set[Index]]:
        """Inner chunks (positions within their shard) that bytes [offset, offset+size) touch, by shard."""
        fine = stream.for_reads()
        src = fine.meta.source
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
        for key, (meta, arr) in self.tables.dirty.items():
            if excess <= 0:
                break
            keys.append((key, meta))
            excess -= arr.nbytes
        errors: list[ZarrfsError] = []

        async def one(key: tuple[str, Index], meta: ArrayMeta) -> None:
            try:
                await self._flush_chunk(key, meta)
            except Exception as e:
                if not isinstance(e, ZarrfsError):
                    log.exception("unexpected error storing chunk %s of %s", key[1], key[0] or "/")
                    e = StoreError(f"chunk {key[1]} of {key[0] or '/'}: unexpected {type(e).__name__}: {e}")
                self._write_errors.setdefault(key[0], e)
                errors.append(e)

        async with trio.open_nursery() as nursery:
            for key, meta in keys:
                nursery.start_soon(one, key, meta)
        if errors:
            raise errors[0]

    async def _flush_background(self) -> None:
        """Store the oldest dirty chunks while the writer goes on."""
        try:
            await self._flush_oldest(self.dirty_max_bytes // 8)
        except ZarrfsError:
            pass  # kept in _write_errors: reported at the array's next fsync or close
        except Exception:  # background work must not end the daemon
            log.exception("unexpected error in a background flush")
        finally:
            self._flushing = False

    async def _flush_chunk(self, key: tuple[str, Index], meta: ArrayMeta) -> None:
        """Store one dirty chunk (or erase it, all fill), readers seeing it while it is stored."""
        lock_key = chunk_lock_key(meta, key[1])
        lock = self.tables.chunk_locks.setdefault(lock_key, trio.Lock())
        async with lock:  # flushes of one chunk (or shard) reach the store in the order they started
            entry = self.tables.dirty.pop(key, None)
            self._filled.pop(key, None)
            streamed = self.streams.take(meta, key[1])
            if entry is None:
                if streamed is not None:
                    await self.streams.abort(streamed)
                return
            meta, arr = entry
            if lock_key != key:  # readers of the shard's other chunks retry and wait for the rewrite
                self.tables.versions[lock_key] = self.tables.versions.get(lock_key, 0) + 1
            changed = self.tables.changed.pop(key, None)
            self.dirty_bytes -= arr.nbytes
            self.storing_bytes += arr.nbytes
            arr.flags.writeable = False
            # Readers and writers see it while it is being stored, cached or not.
            self.tables.storing[key] = arr
            created = self._created.get(key[0])
            absent = created is not None and key[1] not in created  # never stored: nothing to erase
            if created is not None:
                created.add(key[1])
            self.tables.cache.put(key, arr)
            store_key = meta.chunk_key(key[1])
            try:
                # A shard of which few inner chunks changed keeps the others' stored bytes
                # (read again from a local store: cheaper than encoding them; remote, not).
                old = None
                if (
                    changed is not None
                    and meta.inner is not None
                    and self.runtime.store.is_local
                    and len(changed) < math.prod(meta.inner.source.per_shard) // 2
                ):
                    old = await self.runtime.run_io(self.runtime.store.get_sync, store_key, meta.max_stored_nbytes)
                if streamed is not None and await self.streams.finish(streamed, arr):
                    has_data = True
                else:
                    data = await self.runtime.run_cpu(encode_chunk_sync, meta, store_key, arr, old, changed)
                    if data is not None or not absent:
                        await self.runtime.run_io(chunksource.write_chunk_sync, meta, self.runtime.store, key[1], data)
                    has_data = data is not None
                stored = self._stored_into.get(key[0])
                if stored is not None:
                    (stored.add if has_data else stored.discard)(key[1])
            except ZarrfsError as e:
                if streamed is not None:
                    await self.streams.abort(streamed)  # (done already when the upload failed)
                self.tables.cache.discard(key)  # what the store holds is the truth again
                self.tables.versions[key] = self.tables.versions.get(key, 0) + 1
                self.runtime.count_error(e, store_key)
                raise
            finally:
                self.storing_bytes -= arr.nbytes
                self._stored.set()
                self._stored = trio.Event()
                if self.tables.storing.get(key) is arr:
                    del self.tables.storing[key]
                self._forget_shard(meta, key[1])
            self.runtime.counters["chunks_stored" if has_data else "chunks_erased"] += 1
        self.tables.drop_lock(lock_key, lock)

    def _forget_shard(self, meta: ArrayMeta, idx: Index) -> None:
        """After a chunk was stored (or failed to be): drop the cached index of the shard it
        rewrote, and for a shard of the array's own grid the inner chunks cached apart."""
        if meta.inner is not None:  # the chunk is a shard
            self.tables.cache.discard((meta.path, idx, INDEX))
            for inner in meta.inner.source.inner_of(idx):
                self.tables.cache.discard((meta.path, inner, INNER))
        elif meta.source is not None and meta.source.rewrites_shard:
            self.tables.cache.discard((meta.path, meta.source.shard_of(idx), INDEX))

    async def flush(self, path: str | None = None) -> None:
        """Store every dirty chunk (of one array, or all); raise the first failure (EIO)."""
        keys = [(k, meta) for k, (meta, _) in self.tables.dirty.items() if path is None or k[0] == path]
        errors: list[ZarrfsError] = []

        async def one(key: tuple[str, Index], meta: ArrayMeta) -> None:
            try:
                await self._flush_chunk(key, meta)
            except ZarrfsError as e:
                errors.append(e)

        async with trio.open_nursery() as nursery:
            for key, meta in keys:
                nursery.start_soon(one, key, meta)
        # Chunks stored in the background when the flush began are in the store when it returns.
        while any(path is None or k[0] == path for k in self.tables.storing):
            await self._stored.wait()
        earlier = [self._write_errors.pop(p) for p in list(self._write_errors) if path is None or p == path]
        if errors or earlier:
            raise (earlier + errors)[0]

    def forget(self, path: str) -> None:
        """Forget the written chunks, versions and failures of an array, or of every array below
        a group (after it is removed or replaced)."""
        tables = self.tables
        for key in [k for k in tables.dirty if k[0] == path or k[0].startswith(path + "/")]:
            self.dirty_bytes -= tables.dirty.pop(key)[1].nbytes
            tables.changed.pop(key, None)
            self._filled.pop(key, None)
        self.streams.forget(path)
        self._write_errors.pop(path, None)
        self._created.pop(path, None)
        self._stored_into.pop(path, None)
        for unit in [k for k in tables.versions if k[0] == path or k[0].startswith(path + "/")]:
            del tables.versions[unit]
