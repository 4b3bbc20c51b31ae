"""Where a grid chunk's bytes come from and go to: keyed chunks, inner chunks of shards; all chunk store I/O.

Every source answers, for the engine, what it can do (so the engine never tests types):

- `partial_reads`: chunks are read through their shard's index (`read_index_sync`,
  cached and loaded once by the engine) and byte ranges of the shard (`read_ranges_sync`),
  or from the whole shard read at once, its index parsed from it (`read_whole_sync`).
- `shard_is_chunk`: the shard is itself a chunk of the array's own grid (v3
  `sharding_indexed`): a decoded shard holds the chunk, and writes go to whole shards.
- `rewrites_shard`: writing a chunk rewrites its whole shard (the drafts' transformer):
  writes of one shard take turns, and readers of a shard wait while it is rewritten.

Methods ending in `_sync` do store I/O; the engine runs them in worker threads.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import numpy as np

from ..codecs.sharding import PLAIN_INDEX, ShardIndex, ShardingIndexed
from ..errors import CorruptChunk, MetadataError
from ..grid import Index
from .base import BaseStore
from .keys import ChunkKeys


def merge_ranges(stored: list[tuple[int, int, Index]], gap: int) -> list[tuple[int, int]]:
    """Byte ranges [start, end) covering (offset, nbytes, _) pieces in offset order, merged
    where fewer than `gap` bytes lie between them."""
    ranges: list[list[int]] = []
    for offset, nbytes, _ in stored:
        if ranges and offset - ranges[-1][1] <= gap:
            ranges[-1][1] = max(ranges[-1][1], offset + nbytes)
        else:
            ranges.append([offset, offset + nbytes])
    return [(a, b) for a, b in ranges]


@dataclasses.dataclass(frozen=True)
class KeyedChunks:
    """Each grid chunk under its own key (every format but sharding)."""

    keys: ChunkKeys
    partial_reads: ClassVar[bool] = False
    shard_is_chunk: ClassVar[bool] = False
    rewrites_shard: ClassVar[bool] = False

    def key(self, idx: Index) -> str:
        return self.keys.key(idx)

    def read_sync(self, store: BaseStore, idx: Index, max_nbytes: int | None = None, into: Any = None) -> Any:
        """The encoded chunk at grid position `idx` (refused past `max_nbytes`; maybe read into
        INTO, see Store.get_sync), or None when it is not stored."""
        return store.get_sync(self.keys.key(idx), max_nbytes, into)

    def write_sync(self, store: BaseStore, idx: Index, data: bytes | None) -> None:
        """Store an encoded chunk, or erase it (None: the chunk is all fill value)."""
        if data is None:
            store.erase_sync(self.keys.key(idx))
        else:
            store.set_sync(self.keys.key(idx), data)


class _InShards:
    """Grid chunks that are inner chunks of shards: shard keys, the index, byte ranges."""

    partial_reads: ClassVar[bool] = True
    keys: ChunkKeys
    per_shard: Index
    layout: ShardIndex

    def shard_of(self, idx: Index) -> Index:
        return tuple(i // n for i, n in zip(idx, self.per_shard))

    def position(self, idx: Index) -> Index:
        return tuple(i % n for i, n in zip(idx, self.per_shard))

    def key(self, idx: Index) -> str:
        """The key of the shard holding chunk `idx`."""
        return self.keys.key(self.shard_of(idx))

    def inner_of(self, shard: Index) -> list[Index]:
        """Grid positions of every chunk of a shard."""
        return [tuple(s * n + p for s, n, p in zip(shard, self.per_shard, pos)) for pos in np.ndindex(*self.per_shard)]

    @property
    def index_nbytes(self) -> int:
        return self.layout.nbytes(self.per_shard)

    def read_index_sync(self, store: BaseStore, shard: Index) -> np.ndarray | None:
        """A shard's index (per_shard + (2,) of offset, nbytes), or None when the shard is absent."""
        key = self.keys.key(shard)
        nbytes = self.index_nbytes
        raw = store.get_suffix_sync(key, nbytes) if self.layout.at_end else store.get_prefix_sync(key, nbytes)
        return None if raw is None else self.layout.decode(raw, self.per_shard, key)

    def read_whole_sync(self, store: BaseStore, shard: Index, max_nbytes: int) -> tuple[bytes, np.ndarray] | None:
        """A whole shard in one request and its index parsed from those bytes (refused past
        `max_nbytes`), or None when the shard is absent."""
        key = self.keys.key(shard)
        data = store.get_sync(key, max_nbytes)
        if data is None:
            return None
        return data, self.layout.of_shard(np.frombuffer(data, dtype=np.uint8), self.per_shard, key)

    def entry(self, index: np.ndarray | None, idx: Index) -> tuple[int, int] | None:
        """(offset, nbytes) of chunk `idx` in its shard's index (None: absent)."""
        if index is None:
            return None
        try:
            return self.layout.entry(index, self.position(idx))
        except CorruptChunk as e:
            raise CorruptChunk(f"shard {self.key(idx)}: {e}") from None

    def read_ranges_sync(self, store: BaseStore, shard: Index, ranges: list[tuple[int, int]]) -> list[bytes]:
        """Byte ranges [start, end) of one shard, each checked to lie inside it."""
        key = self.keys.key(shard)
        out = store.get_ranges_sync(key, ranges)
        for (start, end), data in zip(ranges, out):
            if len(data) != end - start:
                raise CorruptChunk(
                    f"shard {key}: bytes {start}:{end} named by its index lie outside the shard ({len(data)} read)"
                )
        return out

    def read_sync(self, store: BaseStore, idx: Index, max_nbytes: int | None = None) -> bytes | None:
        """One chunk, uncached: its shard's index, then its bytes (the engine caches the index instead)."""
        found = self.entry(self.read_index_sync(store, self.shard_of(idx)), idx)
        if found is None:
            return None
        offset, nbytes = found
        if max_nbytes is not None and nbytes > max_nbytes:
            raise CorruptChunk(
                f"shard {self.key(idx)}: its index gives inner chunk {self.position(idx)} "
                f"{nbytes} bytes, more than the {max_nbytes} it can take"
            )
        data = self.read_ranges_sync(store, self.shard_of(idx), [(offset, offset + nbytes)])[0]
        return data

    def stored_nbytes_sync(self, store: BaseStore, idx: Index) -> int:
        """Bytes the chunk at `idx` takes in its shard (0 when it is not stored)."""
        found = self.entry(self.read_index_sync(store, self.shard_of(idx)), idx)
        return 0 if found is None else found[1]


@dataclasses.dataclass(frozen=True)
class ShardedInner(_InShards):
    """Inner chunks of v3 `sharding_indexed` shards, read one by one (partial shard reads).

    Read-only: writes go to whole shards, the array's own grid (`ArrayMeta.inner` is the
    same array over the inner grid with this source).
    """

    keys: ChunkKeys
    per_shard: Index
    sharding: ShardingIndexed
    shard_is_chunk: ClassVar[bool] = True
    rewrites_shard: ClassVar[bool] = False

    @property
    def layout(self) -> ShardIndex:  # type: ignore[override]
        return self.sharding.layout


@dataclasses.dataclass(frozen=True)
class ShardedChunks(_InShards):
    """Grid chunks stored as inner chunks of shards (the v3 drafts' sharding storage transformer).

    A shard's key is the chunk key of (chunk index // chunks_per_shard); it ends with a
    plain index (sharding.PLAIN_INDEX). Writing a chunk reads the whole shard and stores it
    again (`write_sync`).
    """

    keys: ChunkKeys
    chunks_per_shard: Index
    layout: ClassVar[ShardIndex] = PLAIN_INDEX  # type: ignore[misc]  # (one index layout for all)
    shard_is_chunk: ClassVar[bool] = False
    rewrites_shard: ClassVar[bool] = True

    @property
    def per_shard(self) -> Index:  # type: ignore[override]
        return self.chunks_per_shard

    def write_sync(self, store: BaseStore, idx: Index, data: bytes | None) -> None:
        """Store the encoded chunk at grid position `idx`, or drop it (None).

        The shard is read whole, the chunk replaced or dropped, and the shard stored again
        (erased when no chunk is left). A shard that cannot be parsed is left as it is
        (CorruptChunk): its other chunks are not thrown away. The engine makes writes of
        one shard take turns.
        """
        key = self.key(idx)
        shard = store.get_sync(key, None)  # a whole shard: any size
        if shard is None and data is None:
            return  # nothing stored, nothing to store
        parts: dict[Index, Any] = {}
        if shard is not None:
            try:
                parts = self.layout.inner_chunks(shard, self.per_shard, key)
            except CorruptChunk as e:
                raise CorruptChunk(f"{e}; not rewriting it") from None
        parts[self.position(idx)] = data
        new = self.layout.assemble(parts, self.per_shard)
        if new:
            store.set_sync(key, new)
        else:
            store.erase_sync(key)


def source_of(meta: Any) -> Any:
    """The chunk source of an array: its own, or one key per chunk."""
    return meta.source if meta.source is not None else KeyedChunks(meta.keys)


def read_chunk_sync(meta: Any, store: BaseStore, idx: Index, into: Any = None) -> Any:
    """A grid chunk's stored bytes, or None; more than any encoding of it takes is refused.
    With INTO (chunks one key each): read into it when they fit (see Store.get_sync)."""
    if into is not None:
        return source_of(meta).read_sync(store, idx, meta.max_stored_nbytes, into)
    return source_of(meta).read_sync(store, idx, meta.max_stored_nbytes)


def write_chunk_sync(meta: Any, store: BaseStore, idx: Index, data: bytes | None) -> None:
    """Store a grid chunk's encoded bytes, or erase it (None)."""
    source_of(meta).write_sync(store, idx, data)


def with_inner_reads(meta: Any) -> Any:
    """The array with `inner` set when its chunks are shards that can be read in part."""
    chain = meta.codec
    sharding = chain.array_bytes
    if not isinstance(sharding, ShardingIndexed) or chain.array_array or chain.bytes_bytes:
        return meta
    try:
        per_shard = sharding.per_shard(meta.chunk_shape)
    except MetadataError:
        return meta  # reported when a shard is decoded
    inner = dataclasses.replace(
        meta,
        chunk_shape=sharding.inner_chunks,
        codec=sharding.inner,
        source=ShardedInner(meta.keys, per_shard, sharding),
    )
    return dataclasses.replace(meta, inner=inner)
