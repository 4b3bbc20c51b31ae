"""The nodes every format produces: ArrayMeta, GroupMeta and BrokenNode (frozen values)."""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Union

import numpy as np

from .codecs import CodecChain
from .errors import MetadataError, ZarrfsError


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

    def read_sync(self, store: Any, idx: tuple[int, ...]) -> bytes | None:
        """The encoded chunk at grid position `idx`, or None when it is not stored."""
        return store.get_sync(self.keys.key(idx))

    def write_sync(self, store: Any, idx: tuple[int, ...], data: bytes | None) -> None:
        """Store an encoded chunk, or erase it (None: the chunk is all fill value)."""
        if data is None:
            store.erase_sync(self.keys.key(idx))
        else:
            store.set_sync(self.keys.key(idx), data)


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

    def __post_init__(self) -> None:
        if len(self.shape) != len(self.chunk_shape):
            raise MetadataError(f"shape {self.shape} and chunks {self.chunk_shape} differ in rank")
        if any(n < 0 for n in self.shape) or any(c < 1 for c in self.chunk_shape):
            raise MetadataError(f"bad shape {self.shape} or chunks {self.chunk_shape}")

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize

    def chunk_key(self, idx: tuple[int, ...]) -> str:
        """The store key holding chunk `idx` (for sharding transformers: its shard)."""
        return (self.source or KeyedChunks(self.keys)).key(idx)

    def read_chunk_sync(self, store: Any, idx: tuple[int, ...]) -> bytes | None:
        return (self.source or KeyedChunks(self.keys)).read_sync(store, idx)

    def write_chunk_sync(self, store: Any, idx: tuple[int, ...], data: bytes | None) -> None:
        (self.source or KeyedChunks(self.keys)).write_sync(store, idx, data)

    @property
    def kind(self) -> str:
        return "array"


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
