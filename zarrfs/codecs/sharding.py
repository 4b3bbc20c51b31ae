"""Sharding: a shard's index (the one reader and encoder) and the v3 `sharding_indexed` codec.

A shard holds inner chunks back to back and an index of (offset, nbytes) little-endian
uint64 pairs, one per inner chunk in C order over the inner grid, at the shard's end or
start; 2^64-1 twice marks an absent chunk. v3's `sharding_indexed` codec encodes the index
with its own codecs (bytes + crc32c by default); the v3 drafts' sharding storage
transformer uses the same layout with a plain index at the end (PLAIN_INDEX). Everything
here is pure: chunk sources (chunksource.py) do the store I/O.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar

import numpy as np

from .. import grid
from ..errors import CorruptChunk, MetadataError, Unsupported, ZarrfsError
from ..grid import Index
from .bounded import u1
from .chain import BytesLayout, CodecChain, is_fill

ABSENT = 2**64 - 1  # index entry of an inner chunk that is not stored
ENTRY_DTYPE = np.dtype("<u8")
ENTRY_NBYTES = 2 * ENTRY_DTYPE.itemsize  # (offset, nbytes)


def _shard(where: str) -> str:
    return f"shard {where}" if where else "shard"


def positions(per_shard: Index) -> Any:
    """Every inner chunk position of a shard, in C order (the index's order)."""
    return grid.all_chunks(per_shard, (1,) * len(per_shard))


@dataclasses.dataclass(frozen=True)
class ShardIndex:
    """Where a shard keeps its index and how the index is encoded."""

    codec: CodecChain
    at_end: bool = True

    def nbytes(self, per_shard: Index) -> int:
        """Stored size of a shard's index."""
        return self.codec.encoded_size(ENTRY_NBYTES * math.prod(per_shard))

    def decode(self, raw: Any, per_shard: Index, where: str) -> np.ndarray:
        """The (offset, nbytes) pairs of an index read from the store, shape per_shard + (2,)."""
        nbytes = self.nbytes(per_shard)
        if len(raw) < nbytes:
            raise CorruptChunk(f"{_shard(where)}: {len(raw)} bytes, shorter than its index of {nbytes}")
        try:
            return self.codec.decode(raw, per_shard + (2,), ENTRY_DTYPE, np.zeros((), ENTRY_DTYPE))
        except ZarrfsError as e:
            raise type(e)(f"{_shard(where)}: index: {e}") from None
        except Exception as e:  # numcodecs raises many types (a checksum that does not match)
            raise CorruptChunk(f"{_shard(where)}: cannot decode its index: {type(e).__name__}: {e}") from None

    def of_shard(self, buf: np.ndarray, per_shard: Index, where: str) -> np.ndarray:
        """The index of a whole shard's bytes (a flat uint8 array)."""
        nbytes = self.nbytes(per_shard)
        if buf.size < nbytes:
            raise CorruptChunk(f"{_shard(where)}: {buf.size} bytes, shorter than its index of {nbytes}")
        return self.decode(buf[buf.size - nbytes :] if self.at_end else buf[:nbytes], per_shard, where)

    @staticmethod
    def entry(index: np.ndarray, pos: Index) -> tuple[int, int] | None:
        """(offset, nbytes) of inner chunk `pos`, or None when it is absent."""
        offset, nbytes = (int(x) for x in index[pos])
        if offset == ABSENT and nbytes == ABSENT:
            return None
        if offset == ABSENT or nbytes == ABSENT:
            raise CorruptChunk(f"bad index entry ({offset}, {nbytes}) of inner chunk {pos}: absent in one field only")
        return offset, nbytes

    def inner_chunks(self, shard: Any, per_shard: Index, where: str) -> dict[Index, np.ndarray | None]:
        """Every inner chunk's stored bytes (None: absent) of a whole shard, each checked to lie inside it."""
        buf = u1(shard)
        index = self.of_shard(buf, per_shard, where)
        out: dict[Index, np.ndarray | None] = {}
        for pos in positions(per_shard):
            try:
                found = self.entry(index, pos)
            except CorruptChunk as e:
                raise CorruptChunk(f"{_shard(where)}: {e}") from None
            if found is not None and found[0] + found[1] > buf.size:
                raise CorruptChunk(
                    f"{_shard(where)}: inner chunk {pos} at {found[0]}+{found[1]} lies outside the shard"
                )
            out[pos] = None if found is None else buf[found[0] : found[0] + found[1]]
        return out

    def assemble(self, parts: dict[Index, Any], per_shard: Index) -> bytes:
        """A shard of the given inner chunks (None or missing: absent), back to back in C
        order, and its index; b"" when no inner chunk is stored (erase the shard)."""
        index = self.empty_index(per_shard)
        offset = 0 if self.at_end else self.nbytes(per_shard)
        body = []
        for pos in positions(per_shard):
            data = parts.get(pos)
            if data is None or not len(data):
                continue
            index[pos] = (offset, len(data))
            offset += len(data)
            body.append(data if isinstance(data, bytes) else bytes(data))
        if not body:
            return b""
        raw_index = self.encode_index(index)
        return b"".join([*body, raw_index] if self.at_end else [raw_index, *body])

    def empty_index(self, per_shard: Index) -> np.ndarray:
        """An index with every inner chunk absent, to fill in."""
        return np.full(per_shard + (2,), ABSENT, dtype=ENTRY_DTYPE)

    def encode_index(self, index: np.ndarray) -> bytes:
        """The stored bytes of an index of (offset, nbytes) pairs."""
        raw = self.codec.encode(index, np.zeros((), ENTRY_DTYPE))
        nbytes = self.nbytes(index.shape[:-1])
        if len(raw) != nbytes:
            raise Unsupported(f"shard index encoded to {len(raw)} bytes, expected {nbytes}")
        return bytes(raw)


# The drafts' sharding storage transformer: uint64 pairs at the shard's end, no checksum.
PLAIN_INDEX = ShardIndex(CodecChain((), BytesLayout("little", "C"), ()), at_end=True)


@dataclasses.dataclass(frozen=True)
class ShardingIndexed:
    """v3 `sharding_indexed`: the array->bytes codec of a shard of inner chunks and an index."""

    inner_chunks: Index
    inner: CodecChain
    index: CodecChain
    index_at_end: bool = True
    #: encoding to b"" means "erase the chunk" (a shard with no stored inner chunk)
    empty_is_absent: ClassVar[bool] = True

    @property
    def layout(self) -> ShardIndex:
        return ShardIndex(self.index, self.index_at_end)

    def per_shard(self, shape: Index) -> Index:
        """Inner chunks along each dimension of a shard of `shape`."""
        if any(s % c for s, c in zip(shape, self.inner_chunks)):
            raise MetadataError(f"shard shape {shape} is not a multiple of inner chunks {self.inner_chunks}")
        return tuple(s // c for s, c in zip(shape, self.inner_chunks))

    def max_encoded_nbytes(self, shape: Index, dtype: np.dtype) -> int:
        """Every inner chunk at its largest, and the index."""
        per_shard = self.per_shard(shape)
        return math.prod(per_shard) * self.inner.max_encoded_nbytes(self.inner_chunks, dtype) + self.layout.nbytes(
            per_shard
        )

    def decode(self, data: Any, shape: Index, dtype: np.dtype, fill: np.ndarray | None) -> np.ndarray:
        """The shard's elements; inner chunks not stored are FILL (None: the fill value cannot be
        read, and such a shard cannot be either)."""
        per_shard = self.per_shard(shape)
        out = np.empty(shape, dtype=dtype)
        for pos, raw in self.layout.inner_chunks(data, per_shard, "").items():
            region = grid.chunk_slices(pos, shape, self.inner_chunks)
            if raw is None and fill is None:
                raise MetadataError(f"inner chunk {'.'.join(map(str, pos))} is not stored")
            out[region] = fill if raw is None else self.inner.decode(raw, self.inner_chunks, dtype, fill)
        return out

    def encode(self, arr: np.ndarray, fill: np.ndarray, keep: dict[Index, Any] | None = None) -> bytes:
        """The shard: its inner chunks that are not all fill and the index; b"" when every
        inner chunk is fill. `keep` gives inner chunks already encoded (None: absent)."""
        shape = arr.shape
        per_shard = self.per_shard(shape)
        parts: dict[Index, Any] = {}
        for pos in positions(per_shard):
            if keep is not None and pos in keep:
                parts[pos] = keep[pos]
                continue
            parts[pos] = self.encode_inner(arr[grid.chunk_slices(pos, shape, self.inner_chunks)], fill)
        return self.layout.assemble(parts, per_shard)

    def encode_inner(self, inner: np.ndarray, fill: np.ndarray) -> Any:
        """One inner chunk's stored bytes; None when it is not stored (all fill)."""
        if is_fill(inner, fill):
            return None
        data = self.inner.encode(inner, fill)
        return data if len(data) else None  # (b"": a nested shard of fill)

    def encode_changed(self, arr: np.ndarray, fill: np.ndarray, old: Any, changed: set[Index]) -> bytes:
        """The shard, encoding only the inner chunks in `changed`: the others are copied
        from `old`, the stored shard `arr` was read from. An `old` that cannot be parsed
        is not trusted: then every inner chunk is encoded."""
        try:
            stored = self.layout.inner_chunks(old, self.per_shard(arr.shape), "")
        except Exception:  # numcodecs raises many types for a corrupt index
            stored = {}
        keep = {pos: raw for pos, raw in stored.items() if pos not in changed}
        return self.encode(arr, fill, keep)

    def describe(self) -> dict[str, Any]:
        return {
            "name": "sharding_indexed",
            "configuration": {
                "chunk_shape": list(self.inner_chunks),
                "codecs": self.inner.describe(),
                "index_codecs": self.index.describe(),
                "index_location": "end" if self.index_at_end else "start",
            },
        }
