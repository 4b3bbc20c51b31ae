"""Write-back: written chunks held dirty, patched in place, stored oldest first within a byte budget.

The WriteBack mixin of Engine (the package's __init__ owns the tables; docs/CONCURRENCY.md says who
touches which). Encoding runs in worker threads on immutable inputs.
"""

from __future__ import annotations

import logging
import math

import numpy as np
import trio

from ..storage import chunksource
from .. import grid
from ..codecs.chain import is_fill
from ..errors import StoreError, ZarrfsError
from ..model import ArrayMeta
from ..views.streams import ArrayStream
from .loads import BODY, INDEX, INNER

log = logging.getLogger(__name__)

Index = tuple[int, ...]

# Dirty (written, not yet stored) chunks are flushed oldest first beyond this budget, so a
# streaming copy of any size holds at most this much: a few chunk rows of a large array.
# Past a quarter of it the oldest are stored in the background while the writer goes on.
DIRTY_MAX_BYTES = 256 << 20

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



class WriteBack:
    """Writes into chunks and their way to the store (mixed into Engine)."""


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
        for key, (meta, arr) in self._dirty.items():
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
        try:
            await self._flush_oldest(self.dirty_max_bytes // 8)
        except ZarrfsError:
            pass  # kept in _write_errors: reported at the array's next fsync or close
        except Exception:  # background work must not end the daemon
            log.exception("unexpected error in a background flush")
        finally:
            self._flushing = False

    def _lock_key(self, meta: ArrayMeta, idx: Index) -> tuple:
        """What flushes take turns on: the chunk, or its shard where writing a chunk rewrites it."""
        src = meta.source
        if src is not None and src.rewrites_shard:
            return self._shard_unit(meta, src.shard_of(idx))
        return (meta.path, idx)

    def _drop_lock(self, key: tuple, lock: trio.Lock) -> None:
        """Forget a lock nobody holds or waits for."""
        if not lock.locked() and lock.statistics().tasks_waiting == 0 and self._chunk_locks.get(key) is lock:
            del self._chunk_locks[key]

    async def _flush_chunk(self, key: tuple[str, Index], meta: ArrayMeta) -> None:
        lock_key = self._lock_key(meta, key[1])
        lock = self._chunk_locks.setdefault(lock_key, trio.Lock())
        async with lock:  # flushes of one chunk (or shard) reach the store in the order they started
            entry = self._dirty.pop(key, None)
            if entry is None:
                return
            meta, arr = entry
            if lock_key != key:  # readers of the shard's other chunks retry and wait for the rewrite
                self._versions[lock_key] = self._versions.get(lock_key, 0) + 1
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
                data = await self.run_cpu(encode_chunk_sync, meta, store_key, arr, old, changed)
                await self.run_io(chunksource.write_chunk_sync, meta, self.store, key[1], data)
            except ZarrfsError as e:
                self.cache.discard(key)  # what the store holds is the truth again
                self._versions[key] = self._versions.get(key, 0) + 1
                self._count_error(e, store_key)
                raise
            finally:
                self.storing_bytes -= arr.nbytes
                if self._storing.get(key) is arr:
                    del self._storing[key]
                self._forget_shard(meta, key[1])
            self.counters["chunks_stored" if data is not None else "chunks_erased"] += 1
        self._drop_lock(lock_key, lock)

    def _forget_shard(self, meta: ArrayMeta, idx: Index) -> None:
        """After a chunk was stored (or failed to be): drop the cached index of the shard it
        rewrote, and for a shard of the array's own grid the inner chunks cached apart."""
        if meta.inner is not None:  # the chunk is a shard
            self.cache.discard((meta.path, idx, INDEX))
            for inner in meta.inner.source.inner_of(idx):
                self.cache.discard((meta.path, inner, INNER))
        elif meta.source is not None and meta.source.rewrites_shard:
            self.cache.discard((meta.path, meta.source.shard_of(idx), INDEX))

    async def flush(self, path: str | None = None) -> None:
        """Store every dirty chunk (of one array, or all); raise the first failure (EIO)."""
        keys = [(k, meta) for k, (meta, _) in self._dirty.items() if path is None or k[0] == path]
        errors: list[ZarrfsError] = []

        async def one(key: tuple[str, Index], meta: ArrayMeta) -> None:
            try:
                await self._flush_chunk(key, meta)
            except ZarrfsError as e:
                errors.append(e)

        async with trio.open_nursery() as nursery:
            for key, meta in keys:
                nursery.start_soon(one, key, meta)
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
        for key in [k for k in self._layouts if k == path or k.startswith(path + "/")]:
            del self._layouts[key]  # this mount removed or replaced it: its next metadata is the truth
        # Loads under way keep their readers; later readers start loads of their own (a load caches
        # its value only while it is still the one in the table: what it read may be the old array).
        def within(p: str) -> bool:
            return p == path or p.startswith(path + "/")

        for key in [k for k in self._inflight if within(k[0])]:
            del self._inflight[key]
        for key in [k for k in self._flights if isinstance(k, tuple) and k[-1] == BODY and within(k[0])]:
            del self._flights[key]  # whole shards being read
        self._idle = [slot for slot in self._idle if not within(slot.path)]  # streamed reads' decoders

