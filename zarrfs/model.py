"""The nodes every format produces: ArrayMeta, GroupMeta and BrokenNode (frozen values)."""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Union

import numpy as np

from . import grid, npy
from .codecs import CodecChain, ShardingIndexed
from .errors import CorruptChunk, MetadataError, ZarrfsError

# An array's .npy file size is an off_t (st_size, read offsets): signed 64 bits.
MAX_FILE_BYTES = 2**63 - 1
# numpy indexes with intp: a dimension, a chunk's element count or a grid position
# number beyond it cannot be addressed (np.empty, unravel_index); readdir offsets of a
# chunk directory are signed 64-bit too.
MAX_INDEX = 2**63 - 1


def check_key(key: str) -> str:
    """Refuse keys that would leave the store: absolute, `..`, empty segments, NUL, backslash."""
    if key.startswith("/") or "\0" in key or "\\" in key:
        raise MetadataError(f"refusing hostile key {key!r}")
    if key and any(part in ("", ".", "..") for part in key.split("/")):
        raise MetadataError(f"refusing hostile key {key!r}")
    return key


def join(*parts: str) -> str:
    """Join key parts with `/`, skipping empty ones."""
    return "/".join(p for p in parts if p)


@dataclasses.dataclass(frozen=True)
class ChunkKeys:
    """How a grid position becomes a store key: PREFIX + HEAD + i<SEP>j<SEP>k, or ZERO_D for 0-d."""

    prefix: str
    sep: str = "."
    head: str = ""
    zero_d: str = "0"

    def key(self, idx: tuple[int, ...]) -> str:
        name = self.head + self.sep.join(map(str, idx)) if idx else self.zero_d
        return check_key(join(self.prefix, name))


@dataclasses.dataclass(frozen=True)
class KeyedChunks:
    """Where grid chunks are stored: each under its own key (every format but sharding transformers).

    Formats whose grid chunks live inside larger objects (the v3 drafts' sharding storage
    transformer) supply another source with the same two methods.
    """

    keys: ChunkKeys

    def key(self, idx: tuple[int, ...]) -> str:
        return self.keys.key(idx)

    def read_sync(self, store: Any, idx: tuple[int, ...], max_nbytes: int | None = None) -> bytes | None:
        """The encoded chunk at grid position `idx` (refused past `max_nbytes`), or None when it is not stored."""
        return store.get_sync(self.keys.key(idx), max_nbytes)

    def write_sync(self, store: Any, idx: tuple[int, ...], data: bytes | None) -> None:
        """Store an encoded chunk, or erase it (None: the chunk is all fill value)."""
        if data is None:
            store.erase_sync(self.keys.key(idx))
        else:
            store.set_sync(self.keys.key(idx), data)


@dataclasses.dataclass(frozen=True)
class ShardedInner:
    """Inner chunks of v3 `sharding_indexed` shards, fetched one by one (partial shard reads).

    Grid position `idx` of the inner grid lies in the shard at `shard_of(idx)` (the key of
    that position in the shard grid) at `position(idx)` of its index. The index is read
    once per shard (`read_index_sync`, cached by the engine), then only the byte ranges of
    the inner chunks a read needs (`read_ranges_sync`): the engine loads inner chunks in
    batches itself. Read-only: writes go to whole shards (the array's own grid).
    """

    keys: ChunkKeys
    per_shard: tuple[int, ...]
    sharding: ShardingIndexed

    def shard_of(self, idx: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(i // n for i, n in zip(idx, self.per_shard))

    def position(self, idx: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(i % n for i, n in zip(idx, self.per_shard))

    def key(self, idx: tuple[int, ...]) -> str:
        """The key of the shard holding inner chunk `idx`."""
        return self.keys.key(self.shard_of(idx))

    def read_index_sync(self, store: Any, shard: tuple[int, ...]) -> np.ndarray | None:
        """A shard's index (per_shard + (2,) of offset, nbytes), or None when the shard is absent."""
        key = self.keys.key(shard)
        nbytes = self.sharding.index_nbytes(self.per_shard)
        if self.sharding.index_at_end:
            raw = store.get_suffix_sync(key, nbytes)
        else:
            raw = store.get_prefix_sync(key, nbytes)
        if raw is None:
            return None
        if len(raw) < nbytes:
            raise CorruptChunk(f"shard {key}: {len(raw)} bytes, shorter than its index of {nbytes}")
        try:
            return self.sharding.decode_index(raw, self.per_shard)
        except ZarrfsError as e:
            raise type(e)(f"shard {key}: index: {e}") from None
        except Exception as e:  # numcodecs raises many types (a checksum that does not match)
            raise CorruptChunk(f"shard {key}: cannot decode its index: {type(e).__name__}: {e}") from None

    def read_ranges_sync(self, store: Any, shard: tuple[int, ...],
                         ranges: list[tuple[int, int]]) -> list[bytes]:
        """Byte ranges [start, end) of one shard, each checked to lie inside it."""
        key = self.keys.key(shard)
        out = []
        for start, end in ranges:
            data = store.get_range_sync(key, start, end)
            if len(data) != end - start:
                raise CorruptChunk(f"shard {key}: bytes {start}:{end} named by its index lie outside it "
                                   f"({len(data)} read)")
            out.append(data)
        return out


@dataclasses.dataclass(frozen=True, eq=False)
class ArrayMeta:
    """An array as zarrfs sees it, whatever the format.

    `chunk_shape` is the grid's chunk (a shard for v3 sharding); `codec` turns a grid
    chunk's stored bytes into an array of `chunk_shape` and `dtype`.
    """

    path: str
    shape: tuple[int, ...]
    dtype: np.dtype
    chunk_shape: tuple[int, ...]
    fill_value: np.ndarray
    codec: CodecChain
    keys: ChunkKeys
    attributes: dict[str, Any]
    format: str
    metadata_key: str
    dimension_names: tuple[Any, ...] | None = None
    #: how a grid chunk's bytes are fetched; None means one key per chunk (`keys`)
    source: Any = None
    #: chunks all equal to the fill value are erased, unless the metadata's fill is null
    #: (undefined: readers may show something else for a missing chunk, e.g. NaT)
    erase_fill_chunks: bool = True
    #: for v3 shards whose only codec is `sharding_indexed`: the same array over the inner
    #: chunk grid (source ShardedInner), so that a read fetches only the inner chunks it needs
    inner: ArrayMeta | None = None
    #: why writes into this array are refused (a representation that cannot be written
    #: back, such as variable-length strings shown as fixed width); None: writable
    read_only: str | None = None

    def __post_init__(self) -> None:
        if len(self.shape) != len(self.chunk_shape):
            raise MetadataError(f"shape {self.shape} and chunks {self.chunk_shape} differ in rank")
        if any(n < 0 for n in self.shape) or any(c < 1 for c in self.chunk_shape):
            raise MetadataError(f"bad shape {self.shape} or chunks {self.chunk_shape}")
        self._check_size()

    def _check_size(self) -> None:
        """Refuse shapes no file or numpy array can hold (2^62 x 2^62: the size overflows st_size)."""
        where = self.metadata_key
        if any(n > MAX_INDEX for n in (*self.shape, *self.chunk_shape)):
            raise MetadataError(f"{where}: shape {self.shape} or chunks {self.chunk_shape} too large "
                                f"(a dimension over 2^63-1)")
        try:
            header = max(len(npy.header(self.dtype, self.shape, f)) for f in (False, True))
        except ValueError as e:
            raise MetadataError(f"{where}: no NPY header can describe shape {self.shape} of {self.dtype}: {e}") from None
        if header + self.nbytes > MAX_FILE_BYTES:
            raise MetadataError(f"{where}: shape {self.shape} of {self.dtype} too large: {self.nbytes} bytes "
                                f"do not fit a file (at most 2^63-1 bytes)")
        if math.prod(self.chunk_shape) * self.dtype.itemsize > MAX_FILE_BYTES:
            raise MetadataError(f"{where}: chunks {self.chunk_shape} of {self.dtype} too large "
                                f"(over 2^63-1 bytes each)")
        positions = grid.n_chunks(self.shape, self.chunk_shape)
        if positions > MAX_INDEX:
            raise MetadataError(f"{where}: shape {self.shape} in chunks {self.chunk_shape} too large: "
                                f"{positions} grid positions (at most 2^63-1)")

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize

    def chunk_key(self, idx: tuple[int, ...]) -> str:
        """The store key holding chunk `idx` (for sharding transformers: its shard)."""
        return (self.source or KeyedChunks(self.keys)).key(idx)

    @property
    def max_stored_nbytes(self) -> int:
        """The most bytes one grid chunk can legitimately take in the store (larger is hostile)."""
        return self.codec.max_encoded_nbytes(self.chunk_shape, self.dtype)

    @property
    def chunk_nbytes(self) -> int:
        """Bytes of one decoded grid chunk."""
        return math.prod(self.chunk_shape) * self.dtype.itemsize

    def read_chunk_sync(self, store: Any, idx: tuple[int, ...]) -> bytes | None:
        """A grid chunk's stored bytes, or None; a key larger than any encoding of it is refused."""
        if self.source is None:
            return KeyedChunks(self.keys).read_sync(store, idx, self.max_stored_nbytes)
        return self.source.read_sync(store, idx)

    def write_chunk_sync(self, store: Any, idx: tuple[int, ...], data: bytes | None) -> None:
        (self.source or KeyedChunks(self.keys)).write_sync(store, idx, data)

    @property
    def kind(self) -> str:
        return "array"

    def with_inner_reads(self) -> ArrayMeta:
        """This array with `inner` set when its chunks are shards that can be read in part."""
        chain = self.codec
        sharding = chain.array_bytes
        if not isinstance(sharding, ShardingIndexed) or chain.array_array or chain.bytes_bytes:
            return self
        try:
            per_shard = sharding.per_shard(self.chunk_shape)
        except MetadataError:
            return self  # reported when a shard is decoded
        inner = dataclasses.replace(self, chunk_shape=sharding.inner_chunks, codec=sharding.inner,
                                    source=ShardedInner(self.keys, per_shard, sharding))
        return dataclasses.replace(self, inner=inner)


@dataclasses.dataclass(frozen=True, eq=False)
class GroupMeta:
    """A group: explicit (with a metadata document) or implicit (implied by a descendant)."""

    path: str
    attributes: dict[str, Any]
    format: str
    metadata_key: str | None = None

    @property
    def kind(self) -> str:
        return "group"


@dataclasses.dataclass(frozen=True, eq=False)
class BrokenNode:
    """A node whose metadata could not be used; reading it reports `error`."""

    path: str
    kind: str  # "array" or "group"
    key: str
    error: ZarrfsError
    attributes: dict[str, Any] = dataclasses.field(default_factory=dict)


Node = Union[ArrayMeta, GroupMeta, BrokenNode]


@dataclasses.dataclass(frozen=True, eq=False)
class NewArray:
    """What an array created through the mount is made of (from an NPY header and options)."""

    shape: tuple[int, ...]
    dtype: np.dtype
    chunks: tuple[int, ...] | None = None  # None: the format's usual guess
    codec: str | None = None  # the `codec=` option (NAME[:LEVEL]); None: the format's default
    fill_value: np.ndarray | None = None  # None: zeros


def ints(value: Any, what: str, where: str) -> tuple[int, ...]:
    """A tuple of non-negative ints from a JSON list, or a MetadataError naming the field."""
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0
                                                       for v in value):
        raise MetadataError(f"`{what}` must be a list of non-negative integers in {where}, got {value!r}")
    return tuple(value)
