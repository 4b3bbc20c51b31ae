"""Chunk loads: single-flight loads into the cache, shard indexes and partial shard reads, decoding in threads.

The tables it fills are ChunkTables' (tables.py says who writes which). A chunk source says
what it can read in part (chunksource.py); nothing here tests its type.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import trio

from ..codecs.chain import reads_into
from ..errors import CorruptChunk, MetadataError, StoreError, ZarrfsError
from ..grid import Index
from ..model import ArrayMeta
from ..repeats import LogOnce
from ..storage import chunksource
from . import revalidate
from .decoding import decode_chunks_sync, read_decode_sync
from .readahead import PREFETCH_CACHE_SHARE
from .runtime import Flight, Runtime
from .tables import BODY, INDEX, INNER, ChunkTables, cache_key, partial, shard_unit, write_unit

if TYPE_CHECKING:
    from .revalidate import Revalidation


class DecodeBuffers(Protocol):
    """Where a chunk may be decoded into a buffer given for it (fastpath/spares.Spares)."""

    def decode_buffer(self, meta: ArrayMeta) -> np.ndarray | None:
        """A buffer to decode a chunk of META into, or None: decode as usual."""
        ...


log = logging.getLogger(__name__)

# Inner chunks of one shard that a read needs are fetched as ranges of the shard, merged
# when the bytes between them cost less than another request would.
RANGE_GAP_LOCAL = 64 << 10
RANGE_GAP_REMOTE = 1 << 20
SHARD_RETRIES = 3  # reads of a shard again after a write overtook them, at most
BATCH_BYTES = 4 << 20  # decoded bytes of inner chunks loaded together, at most (or one chunk)
NO_SHARD = np.zeros(0, dtype="<u8")  # cached index of a shard that is not stored


def _inner_limit(meta: ArrayMeta) -> int:
    """Stored bytes an inner chunk may take at most. A hostile index must not make us ask for
    terabytes: no codec of fixed-size data grows it by more than a header and a small fraction."""
    return 2 * math.prod(meta.chunk_shape) * meta.dtype.itemsize + (1 << 16)


class Loads:
    """Loading chunks into the cache, each once however many readers want it."""

    def __init__(
        self, runtime: Runtime, tables: ChunkTables, revalidation: Revalidation, spares: DecodeBuffers
    ) -> None:
        self.runtime, self.tables, self.revalidation, self.spares = runtime, tables, revalidation, spares
        # Chunks larger than the cache are loaded one at a time (each costs its encoded
        # bytes and its decoded array while it loads), and said once per array.
        self._oversize_lock = trio.Lock()
        self._oversize_said = LogOnce()

    async def chunk(self, meta: ArrayMeta, idx: Index) -> np.ndarray:
        """The decoded chunk at `idx` (full chunk shape), from cache or loaded once."""
        return (await self.chunks(meta, (idx,)))[idx]

    async def chunks(
        self, meta: ArrayMeta, wanted: tuple[Index, ...] | list[Index], whole: bool = False, pinned: bool = False
    ) -> dict[Index, np.ndarray]:
        """Several chunks: those held or cached at once; the others loaded concurrently, each
        once however many readers want it (inner chunks of one shard in one batch).

        `whole`: inner chunks are taken from their shards read whole, one request each
        (`_shard_body`), instead of the shard's index and ranges of it.
        `pinned`: a read that continues one begun before the TTL's last start takes the versions
        that start dropped first (pins.py).
        """
        self.revalidation.check_layout(meta)
        await self.revalidation.check_cached(meta)
        pins = self.revalidation.pins
        out: dict[Index, np.ndarray] = {}
        waiting: list[tuple[Index, Flight]] = []
        new: dict[Index, Flight] = {}
        shards: list[Index] = []
        for idx in wanted:
            arr = pins.get(cache_key(meta, idx)) if pinned else None
            if arr is None:
                arr = self.tables.lookup(meta, idx)
            if arr is not None:
                out[idx] = arr
                continue
            key = cache_key(meta, idx)
            load = self.tables.inflight.get(key)
            if load is None and key[-1] == INNER and write_unit(meta, idx) in self.tables.inflight:
                shards.append(idx)  # its shard is being loaded whole: take it from there
                continue
            if load is None:
                load = new[idx] = self.tables.inflight[key] = Flight()
            waiting.append((idx, load))
        if new:
            batches = self._batches(meta, list(new))
            if self.runtime.running:  # a reader interrupted while it waits leaves the loads to others
                for batch in batches:
                    self.runtime.start_soon(self._load_batch, meta, batch, new, whole)
            elif len(batches) == 1:
                await self._load_batch(meta, batches[0], new, whole)
            else:
                async with trio.open_nursery() as nursery:
                    for batch in batches:
                        nursery.start_soon(self._load_batch, meta, batch, new, whole)
        for idx, load in waiting:
            await load.done.wait()
            if load.error is not None:
                raise load.error
            out[idx] = load.value
        for idx in shards:
            load = self.tables.inflight.get(write_unit(meta, idx))
            if load is not None:
                await load.done.wait()
            arr = self.tables.lookup(meta, idx)
            out[idx] = arr if arr is not None else (await self.chunks(meta, (idx,)))[idx]
        return out

    @staticmethod
    def _batches(meta: ArrayMeta, idxs: list[Index]) -> list[list[Index]]:
        """Loads that go together: each chunk alone; inner chunks of one shard a few at a time."""
        src = meta.source
        if not partial(meta):
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
            batches += [group[i : i + per_batch] for i in range(0, len(group), per_batch)]
        return batches

    async def _load_batch(
        self, meta: ArrayMeta, batch: list[Index], loads: dict[Index, Flight], whole: bool = False
    ) -> None:
        """Load a batch and settle its loads (values or the error); cache what is still current.

        Only cancellation propagates: load errors reach every reader through its Flight.
        """
        versions = self.tables.chunk_versions(meta, batch)
        values: dict[Index, np.ndarray] = {}
        error: BaseException | None = None
        try:
            async with self._oversize_turn(meta, batch[0]):
                if partial(meta):
                    values, error, versions = await self._load_inner_consistent(meta, batch, whole)
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
            current = self.tables.chunk_versions(meta, batch)
            for idx in batch:
                key = cache_key(meta, idx)
                load = loads[idx]
                # (no longer in the table: the array's layout was replaced while it loaded)
                mine = self.tables.inflight.get(key) is load
                if error is None:
                    load.value = values[idx]
                    if current[idx] == versions[idx] and mine:
                        self.tables.cache.put(key, load.value)
                else:
                    load.error = error
                if mine:
                    del self.tables.inflight[key]
                load.done.set()

    @contextlib.asynccontextmanager
    async def _oversize_turn(self, meta: ArrayMeta, idx: Index) -> AsyncIterator[None]:
        """For a chunk larger than the whole cache: wait for the one such load at a time, make
        room in the cache's oversize slots first (so that at most that many such chunks
        exist at once), and say once per array what this costs. Other chunks pass."""
        if meta.chunk_nbytes <= self.tables.cache.max_bytes:
            yield
            return
        async with self._oversize_lock:
            if self._oversize_said.first(meta.path):
                log.warning(
                    "%s: chunk %s decodes to %d bytes, more than cache_size (%d): such chunks are "
                    "decoded whole (their codecs cannot be decoded a range at a time), one at a time, and "
                    "the last %d kept beside the cache. "
                    "Give a cache_size of at least %d bytes (four chunks: read-ahead, a quarter of the "
                    "cache, then spans one), or rechunk the array in smaller chunks",
                    meta.path or "/",
                    meta.chunk_key(idx),
                    meta.chunk_nbytes,
                    self.tables.cache.max_bytes,
                    self.tables.cache.oversize_slots,
                    meta.chunk_nbytes * PREFETCH_CACHE_SHARE,
                )
            self.tables.cache.make_room_oversize()
            self.runtime.counters["oversize_loads"] += 1
            yield

    async def _rewrite_done(self, meta: ArrayMeta, shard: Index) -> None:
        """Wait while a writer rewrites the shard (chunks that rewrite their shard only)."""
        key = shard_unit(meta, shard)
        lock = self.tables.chunk_locks.get(key)
        if meta.source.rewrites_shard and lock is not None and lock.locked():
            async with lock:
                pass
            self.tables.drop_lock(key, lock)

    async def _load_inner_consistent(
        self, meta: ArrayMeta, batch: list[Index], whole: bool = False
    ) -> tuple[dict[Index, np.ndarray], ZarrfsError | None, dict[Index, int]]:
        """Inner chunks read from one version of their shard, and the chunks' write versions
        when the read began.

        The index and the chunks' bytes are separate requests: a shard stored by a writer
        between them leaves offsets of the old shard over the bytes of the new one. When
        the shard was written meanwhile, what was read (or failed to decode) is dropped
        and read again, from the writer's chunk while it is held, after the rewrite.
        """
        shard = meta.source.shard_of(batch[0])
        unit = shard_unit(meta, shard)
        for attempt in range(SHARD_RETRIES + 1):
            await self._rewrite_done(meta, shard)
            version = self.tables.versions.get(unit, 0)
            versions = self.tables.chunk_versions(meta, batch)
            # Held or cached since the reader looked (a write may have come in between).
            values = {idx: arr for idx in batch if (arr := self.tables.lookup(meta, idx, count=False)) is not None}
            error: ZarrfsError | None = None
            try:
                if len(values) < len(batch):
                    values.update(await self._load_inner(meta, [i for i in batch if i not in values], whole))
            except ZarrfsError as e:
                error = e
            if self.tables.versions.get(unit, 0) == version or attempt == SHARD_RETRIES:
                break
            log.debug("shard of %s chunk %s was written while it was read; reading again", meta.path, batch[0])
        if error is not None:
            self.runtime.count_error(error, meta.chunk_key(batch[0]))
        return values, error, versions

    async def _load(self, meta: ArrayMeta, idx: Index) -> np.ndarray:
        key = meta.chunk_key(idx)
        generation = self.tables.generation
        began = revalidate.now()
        out = self.spares.decode_buffer(meta)  # the chunk's bytes as stored, or what its codec decodes into
        into = out if out is not None and reads_into(meta.codec) else None
        # A local chunk that decodes into OUT is read and decoded in one call, in a decoding
        # thread (read_decode_sync).
        run_io, store = self.runtime.run_io, self.runtime.store
        together = out is not None and into is None and store.is_local
        try:
            if together and out is not None:
                nbytes, arr, seconds = await run_io(read_decode_sync, meta, store, idx, key, out, key=key, cpu=True)
            else:
                raw = await run_io(chunksource.read_chunk_sync, meta, store, idx, into, key=key)
                nbytes = None if raw is None else len(raw)
        except ZarrfsError as e:
            self.runtime.count_error(e, key)
            raise
        self.runtime.counters["chunk_gets"] += 1
        if not partial(meta) and generation == self.tables.generation:  # (else it is not cached)
            self.revalidation.note_fetch(meta, idx, key, began, nbytes)
        if nbytes is None:
            return self.fill_chunk(meta)
        self.runtime.counters["chunk_bytes"] += nbytes
        if together:
            assert arr is not None  # (decoded: the chunk was there)
            self.runtime.decoded([arr], seconds)
        else:
            arr = (await self._decode(meta, [(key, raw)], outs=[None if into is not None else out]))[0]
        if out is not None and arr.base is out:
            arr.flags.writeable = False  # a cached chunk is never changed by a reader
        return arr

    def fill_chunk(self, meta: ArrayMeta) -> np.ndarray:
        """A chunk that is not stored: the fill value throughout (MetadataError, logged under the
        array's document, when the document's fill value cannot be read)."""
        if meta.fill_error is not None:
            error = MetadataError(f"{meta.metadata_key}: a chunk that is not stored cannot be read: {meta.fill_error}")
            self.runtime.count_error(error, meta.metadata_key)
            raise error
        self.runtime.counters["fill_chunks"] += 1
        return np.broadcast_to(meta.fill_value, meta.chunk_shape)

    async def _decode(
        self,
        meta: ArrayMeta,
        pieces: list[tuple[str, Any]],
        count_errors: bool = True,
        outs: list[np.ndarray | None] | None = None,
    ) -> list[np.ndarray]:
        """Decode encoded chunks (labelled for errors) in one worker thread (maybe into OUTS)."""
        t0 = time.perf_counter()
        try:
            arrs = await self.runtime.run_cpu(decode_chunks_sync, meta, pieces, outs)
        except ZarrfsError as e:
            if count_errors:
                self.runtime.count_error(e, pieces[0][0])
            raise
        self.runtime.decoded(arrs, time.perf_counter() - t0)
        return arrs

    async def _shard_index(self, meta: ArrayMeta, shard: Index) -> np.ndarray | None:
        """The index of a shard (cached, loaded once), or None when the shard is not stored."""
        src = meta.source
        key = (meta.path, shard, INDEX)
        index = self.tables.cache.get(key, count=False)
        if index is None:
            load = self.tables.inflight.get(key)
            if load is not None:
                await load.done.wait()
                if load.error is not None:
                    raise load.error
                index = load.value
            else:
                load = self.tables.inflight[key] = Flight()
                version = self.tables.versions.get(shard_unit(meta, shard), 0)
                try:
                    index = await self.runtime.run_io(src.read_index_sync, self.runtime.store, shard, key=key)
                    self.runtime.counters["chunk_gets"] += 1
                    if index is None:
                        index = NO_SHARD
                    else:
                        self.runtime.counters["chunk_bytes"] += src.index_nbytes
                    load.value = index
                    if (
                        self.tables.inflight.get(key) is load  # (not begun before the TTL ran out or a refresh)
                        and self.tables.version(shard_unit(meta, shard)) == version
                        and self.revalidation.current_layout(meta)
                    ):
                        self.tables.cache.put(key, index)
                except BaseException as e:  # counted and logged by the batch that asked
                    load.error = (
                        e if isinstance(e, ZarrfsError) else StoreError(f"load of shard {shard} was interrupted")
                    )
                    raise
                finally:
                    if self.tables.inflight.get(key) is load:
                        del self.tables.inflight[key]
                    load.done.set()
        return None if index.size == 0 else index

    async def _shard_body(self, meta: ArrayMeta, shard: Index) -> tuple[Any, np.ndarray | None]:
        """A whole shard's stored bytes (one request) and its index parsed from them, loaded
        once for every batch of its inner chunks that asks while it is in flight; the index
        is cached as `_shard_index` caches it. (None, None) when the shard is not stored.

        The bytes are held only by the batches that wait for them: a batch asking after the
        load ended reads again (read-ahead asks for all of a shard's inner chunks at once).
        """
        src = meta.source

        async def load() -> tuple[Any, np.ndarray | None]:
            version = self.tables.versions.get(shard_unit(meta, shard), 0)
            generation = self.tables.generation
            max_nbytes = src.index_nbytes + math.prod(src.per_shard) * _inner_limit(meta)
            found = await self.runtime.run_io(src.read_whole_sync, self.runtime.store, shard, max_nbytes)
            self.runtime.counters["chunk_gets"] += 1
            if found is not None:
                self.runtime.counters["chunk_bytes"] += len(found[0])
            if (
                generation == self.tables.generation
                and self.tables.version(shard_unit(meta, shard)) == version
                and self.revalidation.current_layout(meta)
            ):
                self.tables.cache.put((meta.path, shard, INDEX), NO_SHARD if found is None else found[1])
            return (None, None) if found is None else found

        return await self.runtime.once((meta.path, shard, BODY), load)

    async def _load_inner(self, meta: ArrayMeta, batch: list[Index], whole: bool = False) -> dict[Index, np.ndarray]:
        """Inner chunks of one shard: its index, then only their bytes, in as few ranges as
        reason allows; or, `whole` (or while another batch reads it whole), from the whole shard."""
        src = meta.source
        shard = src.shard_of(batch[0])
        shard_key = src.keys.key(shard)
        body = None
        if whole or self.runtime.in_flight((meta.path, shard, BODY)):
            body, index = await self._shard_body(meta, shard)
        else:
            index = await self._shard_index(meta, shard)
        out: dict[Index, np.ndarray] = {}
        stored: list[tuple[int, int, Index]] = []
        limit = _inner_limit(meta)
        for idx in batch:
            found = src.entry(index, idx)
            if found is None:
                out[idx] = self.fill_chunk(meta)
                continue
            offset, nbytes = found
            if nbytes > limit:
                raise CorruptChunk(
                    f"shard {shard_key}: its index gives inner chunk {src.position(idx)} "
                    f"{nbytes} bytes, more than any encoding of {meta.chunk_nbytes} bytes takes"
                )
            else:
                stored.append((offset, nbytes, idx))
        if not stored:
            return out
        stored.sort()
        if body is not None:
            ranges, datas = [(0, len(body))], [body]
            if max(o + n for o, n, _ in stored) > len(body):
                raise CorruptChunk(
                    f"shard {shard_key}: inner chunks named by its index lie outside the shard ({len(body)} bytes)"
                )
        else:
            ranges = chunksource.merge_ranges(
                stored, RANGE_GAP_LOCAL if self.runtime.store.is_local else RANGE_GAP_REMOTE
            )
            datas = await self.runtime.run_io(src.read_ranges_sync, self.runtime.store, shard, ranges)
            self.runtime.counters["chunk_gets"] += len(ranges)
            self.runtime.counters["chunk_bytes"] += sum(len(d) for d in datas)
        pieces = []
        r = 0
        for offset, nbytes, idx in stored:
            while offset + nbytes > ranges[r][1]:  # pieces and ranges are both in offset order
                r += 1
            start = offset - ranges[r][0]
            pieces.append(
                (f"{shard_key} (inner chunk {src.position(idx)})", memoryview(datas[r])[start : start + nbytes])
            )
        for (_, _, idx), arr in zip(stored, await self._decode(meta, pieces, count_errors=False)):
            out[idx] = arr
        return out
