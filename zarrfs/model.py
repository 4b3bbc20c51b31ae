"""The nodes every format produces: ArrayMeta, GroupMeta and BrokenNode (frozen values, no I/O)."""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from . import grid, npy
from .codecs.chain import CodecChain
from .errors import MetadataError, ZarrfsError
from .storage import chunksource
from .storage.keys import ChunkKeys

# An array's .npy file size is an off_t (st_size, read offsets): signed 64 bits.
MAX_FILE_BYTES = 2**63 - 1
# numpy indexes with intp: a dimension, a chunk's element count or a grid position
# number beyond it cannot be addressed (np.empty, unravel_index); readdir offsets of a
# chunk directory are signed 64-bit too.
MAX_INDEX = 2**63 - 1


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
    #: where a grid chunk's bytes are (chunksource.py); None means one key per chunk (`keys`)
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
    #: why the metadata's fill value cannot be read (zeros stand in for it where nothing is
    #: read: sizes, listings); chunks that are not stored then fail to read (fill_fields)
    fill_error: str | None = None

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
            raise MetadataError(
                f"{where}: shape {self.shape} or chunks {self.chunk_shape} too large (a dimension over 2^63-1)"
            )
        try:
            header = max(len(npy.header(self.dtype, self.shape, f)) for f in (False, True))
        except ValueError as e:
            raise MetadataError(
                f"{where}: no NPY header can describe shape {self.shape} of {self.dtype}: {e}"
            ) from None
        if header + self.nbytes > MAX_FILE_BYTES:
            raise MetadataError(
                f"{where}: shape {self.shape} of {self.dtype} too large: {self.nbytes} bytes "
                f"do not fit a file (at most 2^63-1 bytes)"
            )
        if math.prod(self.chunk_shape) * self.dtype.itemsize > MAX_FILE_BYTES:
            raise MetadataError(
                f"{where}: chunks {self.chunk_shape} of {self.dtype} too large (over 2^63-1 bytes each)"
            )
        positions = grid.n_chunks(self.shape, self.chunk_shape)
        if positions > MAX_INDEX:
            raise MetadataError(
                f"{where}: shape {self.shape} in chunks {self.chunk_shape} too large: "
                f"{positions} grid positions (at most 2^63-1)"
            )

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize

    def chunk_key(self, idx: tuple[int, ...]) -> str:
        """The store key holding chunk `idx` (for sharding transformers: its shard)."""
        return self.source.key(idx) if self.source is not None else self.keys.key(idx)

    @property
    def max_stored_nbytes(self) -> int:
        """The most bytes one grid chunk can legitimately take in the store (larger is hostile)."""
        return self.codec.max_encoded_nbytes(self.chunk_shape, self.dtype)

    @property
    def chunk_nbytes(self) -> int:
        """Bytes of one decoded grid chunk."""
        return math.prod(self.chunk_shape) * self.dtype.itemsize

    @property
    def kind(self) -> str:
        return "array"

    @functools.cached_property
    def chunk_layout(self) -> tuple[object, ...]:
        """What a decoded chunk of this array depends on besides its stored bytes: its key, grid,
        data type, fill value and codecs. Two metadata documents of one path that agree on it
        give the same decoded chunks (a cached chunk of one serves the other)."""
        codecs = json.dumps(self.codec.describe(), sort_keys=True, default=str)
        return (self.dtype, self.chunk_shape, self.fill_value.tobytes(), codecs, self.keys, repr(self.source))

    @functools.cached_property
    def chunk_layout_hash(self) -> int:
        """hash(chunk_layout), computed once."""
        return hash(self.chunk_layout)

    @functools.cached_property
    def file_layout(self) -> tuple[object, ...]:
        """What the bytes of the array's files depend on besides its chunks' values: its shape and
        `chunk_layout` (an open file of the array reads the same bytes under either document)."""
        return (self.shape, self.chunk_layout, self.read_only)

    def with_inner_reads(self) -> ArrayMeta:
        """This array with `inner` set when its chunks are shards that can be read in part."""
        return chunksource.with_inner_reads(self)


def fill_fields(value: Any, dtype: np.dtype, read: Callable[[Any, np.dtype], np.ndarray]) -> dict[str, Any]:
    """ArrayMeta's fill value fields from a document's `fill_value`, as `read` reads it.

    A fill value that cannot be read costs only what needs it: the array is listed, sized
    and its stored chunks read; chunks not stored fail (EIO, naming the document and the
    reason), nothing is erased as fill and nothing can be written.
    """
    try:
        fill = read(value, dtype)
    except MetadataError as e:
        reason = f"its fill value cannot be read: {e}"
        return {
            "fill_value": np.zeros((), dtype),
            "fill_error": reason,
            "erase_fill_chunks": False,
            "read_only": reason,
        }
    return {"fill_value": fill, "erase_fill_chunks": value is not None}


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


Node = ArrayMeta | GroupMeta | BrokenNode


@dataclasses.dataclass(frozen=True, eq=False)
class NewArray:
    """What an array created through the mount is made of (from an NPY header and options)."""

    shape: tuple[int, ...]
    dtype: np.dtype
    chunks: tuple[int, ...] | None = None  # None: the format's usual guess
    codec: str | None = None  # the `codec=` option (NAME[:LEVEL]); None: the format's default
    fill_value: np.ndarray | None = None  # None: zeros
    # v2 writes `fill_value: null` (no element reads as missing); v3, which needs one, zeros.
    fill_null: bool = False
    dimension_names: tuple[str, ...] | None = None  # v2 `_ARRAY_DIMENSIONS`, v3 `dimension_names`
    attributes: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def fill(self) -> np.ndarray:
        """The fill value as a 0-d array of `dtype` (zeros when none was given)."""
        return np.asarray(
            self.fill_value if self.fill_value is not None else np.zeros((), self.dtype), dtype=self.dtype
        )


def ints(value: Any, what: str, where: str) -> tuple[int, ...]:
    """A tuple of non-negative ints from a JSON list, or a MetadataError naming the field."""
    if not isinstance(value, (list, tuple)) or not all(
        isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value
    ):
        raise MetadataError(f"`{what}` must be a list of non-negative integers in {where}, got {value!r}")
    return tuple(value)
