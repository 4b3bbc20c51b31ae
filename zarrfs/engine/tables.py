"""ChunkTables: the chunk tables the engine's parts share (cache, loads in flight, written chunks, versions, locks).

Who writes what (docs/CONCURRENCY.md has the rules of each table):
- `cache`: Loads puts what it loaded; WriteBack puts chunks being stored and drops what a
  failed store leaves stale; Revalidation drops what changed in the store; Spares drops what a
  sequential reader passed; the Engine drops everything on a refresh.
- `inflight`: Loads (one Flight per chunk or shard index being loaded); the Engine's `discard`
  drops those of an array replaced or removed.
- `dirty`, `storing`, `changed`: WriteBack alone; every reader looks written chunks up here first.
- `versions`: WriteBack bumps a chunk's (or shard's) on every change; Loads and StreamedReads
  compare them to tell whether what they read is still current.
- `chunk_locks`: WriteBack's flushes of one chunk (or shard) take turns; Loads waits on a
  shard's while it is rewritten.
- `generation`: the Engine bumps it when cached chunks are dropped; bands, decoders and
  read-ahead made before are not used again.
Used from the trio thread only.
"""

from __future__ import annotations

import collections

import numpy as np
import trio

from ..grid import Index
from ..model import ArrayMeta
from .cache import ChunkCache, Key
from .runtime import Flight

# Cache keys of inner chunks and of shard indexes, and version keys of shards rewritten
# chunk by chunk, carry a tag after (path, index).
INNER = "inner"
INDEX = "index"
SHARD = "shard"
BODY = "body"  # once() key of a whole shard's stored bytes being loaded, for its inner chunks


def partial(meta: ArrayMeta) -> bool:
    """Whether the array's chunks are read through their shard's index, in part."""
    return meta.source is not None and meta.source.partial_reads


def in_shard_chunks(meta: ArrayMeta) -> bool:
    """Whether the array's chunks are inner chunks of shards that are themselves chunks (v3)."""
    return meta.source is not None and meta.source.shard_is_chunk


def cache_key(meta: ArrayMeta, idx: Index) -> Key:
    """Cache key of a decoded chunk; inner chunks of a grid of shards have their own."""
    return (meta.path, idx, INNER) if in_shard_chunks(meta) else (meta.path, idx)


def write_unit(meta: ArrayMeta, idx: Index) -> tuple[str, Index]:
    """The written chunk a chunk belongs to: itself, or for an inner chunk of a grid of shards its shard."""
    return (meta.path, meta.source.shard_of(idx)) if in_shard_chunks(meta) else (meta.path, idx)


def shard_unit(meta: ArrayMeta, shard: Index) -> Key:
    """Version (and rewrite lock) key of a shard's stored bytes: the written chunk itself
    where shards are the grid's chunks, a key of its own where chunks rewrite their shard."""
    return (meta.path, shard) if meta.source.shard_is_chunk else (meta.path, shard, SHARD)


def lock_key(meta: ArrayMeta, idx: Index) -> Key:
    """What flushes take turns on: the chunk, or its shard where writing a chunk rewrites it."""
    src = meta.source
    if src is not None and src.rewrites_shard:
        return shard_unit(meta, src.shard_of(idx))
    return (meta.path, idx)


class ChunkTables:
    """The tables of decoded, loading and written chunks (see the module's docstring for owners)."""

    def __init__(self, cache: ChunkCache) -> None:
        self.cache = cache
        self.inflight: dict[Key, Flight] = {}
        # Written chunks not yet stored, oldest first: (path, idx) -> (meta, writable array)
        self.dirty: collections.OrderedDict[tuple[str, Index], tuple[ArrayMeta, np.ndarray]] = collections.OrderedDict()
        self.storing: dict[tuple[str, Index], np.ndarray] = {}
        # Dirty shards patched from what the store holds: the inner chunks written since
        # (None: every inner chunk is encoded again at flush).
        self.changed: dict[tuple[str, Index], set[Index] | None] = {}
        # Changes of each written chunk, so a writer notices one made while it waited, and
        # of each shard rewritten chunk by chunk, so a reader notices a rewrite it overlapped.
        self.versions: dict[Key, int] = {}
        # Flushes of one chunk (of one shard, where writing a chunk rewrites its shard) take turns.
        self.chunk_locks: dict[Key, trio.Lock] = {}
        self.generation = 0  # bumped when cached chunks are dropped

    def version(self, key: Key) -> int:
        """The write version of a chunk or shard (0: never written through this mount)."""
        return self.versions.get(key, 0)

    def chunk_versions(self, meta: ArrayMeta, batch: list[Index]) -> dict[Index, int]:
        """The write version of each chunk's written unit (a chunk, or its shard)."""
        return {idx: self.versions.get(write_unit(meta, idx), 0) for idx in batch}

    def held(self, key: tuple[str, Index]) -> np.ndarray | None:
        """A written chunk the store may not have yet: dirty, or being stored right now."""
        dirty = self.dirty.get(key)
        return dirty[1] if dirty is not None else self.storing.get(key)

    @property
    def holding(self) -> bool:
        """Whether any written chunk is not yet in the store (lookups must look here first)."""
        return bool(self.dirty or self.storing)

    def lookup(self, meta: ArrayMeta, idx: Index, count: bool = True) -> np.ndarray | None:
        """A chunk without loading it: held by a writer, or cached (for an inner chunk, its shard too)."""
        if not in_shard_chunks(meta):  # (every small read asks: no more than it needs)
            key = (meta.path, idx)
            held = self.held(key) if self.dirty or self.storing else None
            return held if held is not None else self.cache.get(key, count)
        unit = write_unit(meta, idx)  # its shard
        whole = self.held(unit)
        if whole is None and self.cache.contains(unit):
            whole = self.cache.get(unit, count)
        if whole is not None:  # the inner chunk's region of its decoded shard
            return whole[tuple(slice(p * c, (p + 1) * c) for p, c in zip(meta.source.position(idx), meta.chunk_shape))]
        return self.cache.get(cache_key(meta, idx), count)

    def known(self, meta: ArrayMeta, idx: Index) -> bool:
        """Whether a chunk is held or cached (an inner chunk: it, or its shard whole)."""
        unit = write_unit(meta, idx)
        if self.held(unit) is not None or self.cache.contains(unit):
            return True
        return in_shard_chunks(meta) and self.cache.contains(cache_key(meta, idx))

    def loading(self, meta: ArrayMeta, idx: Index) -> bool:
        """Whether a chunk is being loaded."""
        return cache_key(meta, idx) in self.inflight

    def drop_lock(self, key: Key, lock: trio.Lock) -> None:
        """Forget a lock nobody holds or waits for."""
        if not lock.locked() and lock.statistics().tasks_waiting == 0 and self.chunk_locks.get(key) is lock:
            del self.chunk_locks[key]
