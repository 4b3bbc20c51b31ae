"""Codec chains (array->array*, array->bytes, bytes->bytes*): the roles as protocols, checked once; encode and decode one chunk.

Every format builds a CodecChain from its own JSON (in its module under formats/): v3 from
its `codecs` list, v2 and v1 from `filters` and `compressor` (as bytes->bytes steps)
followed by a plain `bytes` layout in C or F order. The steps are the layout and transpose
(here), numcodecs codecs (adapters.py), sharding (sharding.py) and vlen (vlen.py); a chain
refuses, when built, a step that does not stand in its role. Encoding and decoding are
synchronous and pure; the engine runs them in worker threads. A chunk whose every element
is the fill value is not stored (`is_fill`); a shard with no stored inner chunk encodes to
b"", the sign to erase it.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Literal, Protocol

import numpy as np

from ..errors import CorruptChunk, MetadataError, UnknownCodec
from .bounded import u1

# The order of a chunk's elements in memory or in its stored bytes: C (row-major) or F.
MemoryOrder = Literal["C", "F"]


class ArrayArrayCodec(Protocol):
    """An array->array step (transpose, a numcodecs filter): the array it encodes to, and back."""

    def encoded_shape(self, shape: tuple[int, ...], dtype: np.dtype) -> tuple[tuple[int, ...], np.dtype]: ...

    def decode(self, arr: np.ndarray, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray: ...

    def encode(self, arr: np.ndarray) -> np.ndarray: ...

    def describe(self) -> dict[str, Any]: ...


class ArrayBytesCodec(Protocol):
    """The array->bytes step (bytes layout, sharding, vlen, pcodec): bytes of exactly one chunk, and back."""

    def decode(self, data: Any, shape: tuple[int, ...], dtype: np.dtype, fill: np.ndarray | None) -> np.ndarray: ...

    def encode(self, arr: np.ndarray, fill: np.ndarray) -> Any: ...

    def max_encoded_nbytes(self, shape: tuple[int, ...], dtype: np.dtype) -> int: ...

    def describe(self) -> dict[str, Any]: ...


class BytesBytesCodec(Protocol):
    """A bytes->bytes step (compressor, checksum, v2 filter): bounded decoding, and the most bytes it encodes to."""

    @property
    def codec(self) -> Any: ...  # the numcodecs codec it runs (its codec_id decides range decoding)

    def decode(self, data: Any, limit: int | None = None, out: np.ndarray | None = None) -> Any: ...

    def encode(self, data: Any) -> Any: ...

    def encoded_bound(self, n: int) -> int: ...

    def encoded_size(self, n: int) -> int: ...

    def describe(self) -> dict[str, Any]: ...


@functools.cache
def _conforms(cls: type, role: type) -> bool:
    """Whether instances of CLS have every method of ROLE (asked once per class and role)."""
    return all(
        callable(getattr(cls, name, None))
        for name in role.__dict__
        if not name.startswith("_") and callable(role.__dict__[name])
    )


def _check_roles(
    array_array: tuple[ArrayArrayCodec, ...], array_bytes: object, bytes_bytes: tuple[BytesBytesCodec, ...]
) -> None:
    """Refuse (TypeError) a chain whose steps do not stand in their roles: a format's mistake, found
    when the chain is built rather than at its first decode."""
    steps: list[tuple[object, type]] = [(s, ArrayArrayCodec) for s in array_array] + [(array_bytes, ArrayBytesCodec)]
    steps += [(s, BytesBytesCodec) for s in bytes_bytes]
    for step, role in steps:
        if not _conforms(type(step), role):  # type: ignore[arg-type]  # (classes hash; mypy's type.__hash__ disagrees)
            raise TypeError(f"{type(step).__name__} cannot stand in the {role.__name__} role")


def _as_bytes(buf: Any) -> bytes:
    """What a codec returned (bytes, or an array in memory order) as bytes."""
    return buf if isinstance(buf, bytes) else u1(buf).tobytes()


def is_fill(arr: np.ndarray, fill: np.ndarray) -> bool:
    """True when every element of `arr` has exactly the bytes of `fill` (cast to `arr`'s dtype).

    Comparing bytes makes a NaN fill match NaNs of the same bit pattern and works for
    structured, `S`, `U` and `V` types alike; -0.0 does not match a 0.0 fill, nor a NaN of
    another payload a NaN fill, so erasing a chunk never changes what is read back.
    """
    arr = np.asarray(arr)
    if arr.size == 0:
        return True
    with np.errstate(invalid="ignore", over="ignore"):
        want = np.asarray(fill).astype(arr.dtype).tobytes()
    n = arr.dtype.itemsize
    raw = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
    for at in (0, arr.size // 2, arr.size - 1):  # most chunks of data differ at once
        if raw[at * n : (at + 1) * n].tobytes() != want:
            return False
    if n in (1, 2, 4, 8):  # one integer comparison per element
        return bool((raw.view(f"u{n}") == np.frombuffer(want, f"u{n}")[0]).all())
    return bool((raw.reshape(-1, n) == np.frombuffer(want, np.uint8)).all())


@dataclasses.dataclass(frozen=True)
class Transpose:
    """v3 `transpose`: the encoded array is `a.transpose(order)`."""

    order: tuple[int, ...]

    def encoded_shape(self, shape: tuple[int, ...], dtype: np.dtype) -> tuple[tuple[int, ...], np.dtype]:
        return tuple(shape[i] for i in self.order), dtype

    def decode(self, arr: np.ndarray, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        return arr.transpose(np.argsort(self.order))

    def encode(self, arr: np.ndarray) -> np.ndarray:
        return arr.transpose(self.order)

    def describe(self) -> dict[str, Any]:
        return {"name": "transpose", "configuration": {"order": list(self.order)}}


@dataclasses.dataclass(frozen=True)
class BytesLayout:
    """The array->bytes step: elements laid out in C or F order, in a given byte order.

    `endian` None keeps the dtype's own byte order (v1, v2); 'little'/'big' is v3 `bytes`.
    """

    endian: str | None = "little"
    order: MemoryOrder = "C"

    def stored_dtype(self, dtype: np.dtype) -> np.dtype:
        """`dtype` in the byte order its elements are stored in."""
        if self.endian is not None and dtype.itemsize > 1 and dtype.fields is None and dtype.kind not in "SV":
            return dtype.newbyteorder("<" if self.endian == "little" else ">")
        return dtype

    def decode(self, data: Any, shape: tuple[int, ...], dtype: np.dtype, fill: np.ndarray | None) -> np.ndarray:
        stored = self.stored_dtype(dtype)
        raw = u1(data)
        expected = math.prod(shape) * dtype.itemsize
        if raw.size != expected:
            raise CorruptChunk(f"decoded to {raw.size} bytes, expected {expected}")
        arr = raw.view(stored).reshape(shape, order=self.order)
        return arr if stored == dtype else arr.astype(dtype)

    def max_encoded_nbytes(self, shape: tuple[int, ...], dtype: np.dtype) -> int:
        return math.prod(shape) * dtype.itemsize

    def encode(self, arr: np.ndarray, fill: np.ndarray) -> np.ndarray:
        """The elements in `order` and stored byte order: a flat array, so that codecs
        downstream see the element size (blosc's shuffle, v2 filters) as zarr gives it them."""
        return np.ravel(arr.astype(self.stored_dtype(arr.dtype), copy=False), order=self.order)

    def describe(self) -> dict[str, Any]:
        if self.endian is None:
            return {"name": "bytes", "configuration": {"order": self.order}}
        return {"name": "bytes", "configuration": {"endian": self.endian}}


@dataclasses.dataclass(frozen=True)
class CodecChain:
    """One chunk's codecs in encode order: array->array*, one array->bytes, bytes->bytes*."""

    array_array: tuple[ArrayArrayCodec, ...] = ()
    array_bytes: Any = BytesLayout()
    bytes_bytes: tuple[BytesBytesCodec, ...] = ()

    def __post_init__(self) -> None:
        _check_roles(self.array_array, self.array_bytes, self.bytes_bytes)

    def decode(
        self, data: Any, shape: tuple[int, ...], dtype: np.dtype, fill: np.ndarray | None, out: np.ndarray | None = None
    ) -> np.ndarray:
        """Decode stored bytes into an array of exactly `shape` and `dtype` (may be F-ordered).

        Each bytes->bytes step may produce at most what its encoding was given: the last
        compressor at most the chunk's own byte count. More is a CorruptChunk, found before
        the output is allocated wherever the codec's format tells its size. With OUT (uint8,
        the chunk's bytes), a lone compressor may decode into it: the array is then a view of it.
        """
        shapes = [(shape, dtype)]
        for aa in self.array_array:
            shapes.append(aa.encoded_shape(*shapes[-1]))
        limits = self._step_limits(*shapes[-1])
        if out is not None and not decodes_into(self):
            out = None
        for bb, limit in zip(reversed(self.bytes_bytes), reversed(limits)):
            data = bb.decode(data, limit, out)
        arr = self.array_bytes.decode(data, *shapes[-1], fill)
        for aa, (s, d) in zip(reversed(self.array_array), reversed(shapes[:-1])):
            arr = aa.decode(arr, s, d)
        return arr

    def _step_limits(self, shape: tuple[int, ...], dtype: np.dtype) -> list[int]:
        """For each bytes->bytes step (encode order), the most bytes it is given when encoding."""
        n = self.array_bytes.max_encoded_nbytes(shape, dtype)
        limits = []
        for bb in self.bytes_bytes:
            limits.append(n)
            n = bb.encoded_bound(n)
        return limits

    def max_encoded_nbytes(self, shape: tuple[int, ...], dtype: np.dtype) -> int:
        """The most bytes a chunk of `shape` and `dtype` can legitimately take in the store."""
        n = self.array_bytes.max_encoded_nbytes(*self._encoded_shape(shape, dtype))
        for bb in self.bytes_bytes:
            n = bb.encoded_bound(n)
        return n

    def _encoded_shape(self, shape: tuple[int, ...], dtype: np.dtype) -> tuple[tuple[int, ...], np.dtype]:
        for aa in self.array_array:
            shape, dtype = aa.encoded_shape(shape, dtype)
        return shape, dtype

    def encode(self, arr: np.ndarray, fill: np.ndarray) -> bytes:
        """The bytes to store for `arr`, a chunk of exactly the chunk shape and the array's dtype.

        b"" means there is nothing to store (a shard whose inner chunks are all fill): erase
        the chunk. Whole chunks of fill are encoded like any other; see `is_fill`.
        """
        for aa in self.array_array:
            arr = aa.encode(arr)
        data = self.array_bytes.encode(arr, fill)
        if getattr(self.array_bytes, "empty_is_absent", False) and not len(data):
            return b""  # a shard with no stored inner chunk
        for bb in self.bytes_bytes:
            data = bb.encode(data)
        return _as_bytes(data)

    @property
    def order(self) -> str:
        """Memory layout of the stored chunk: 'F' if its elements are kept in Fortran order."""
        if isinstance(self.array_bytes, BytesLayout) and self.array_bytes.order == "F":
            return "F"
        if len(self.array_array) == 1 and isinstance(self.array_array[0], Transpose):
            order = self.array_array[0].order
            if len(order) > 1 and list(order) == list(range(len(order)))[::-1]:
                return "F"
        return "C"

    def encoded_size(self, n_bytes: int) -> int:
        for bb in self.bytes_bytes:
            n_bytes = bb.encoded_size(n_bytes)
        return n_bytes

    def describe(self) -> list[dict[str, Any]]:
        return [c.describe() for c in (*self.array_array, self.array_bytes, *self.bytes_bytes)]


def decodes_into(chain: Any) -> bool:
    """Whether CodecChain.decode can decode a chunk of this chain into a buffer given for it:
    a lone blosc or zstd compressor over the chunk's bytes as stored."""
    return (
        type(chain) is CodecChain
        and not chain.array_array
        and len(chain.bytes_bytes) == 1
        and type(chain.array_bytes) is BytesLayout
        and getattr(chain.bytes_bytes[0].codec, "codec_id", None) in ("blosc", "zstd")
    )


def reads_into(chain: Any) -> bool:
    """Whether a chunk of this chain is its bytes as stored (no codec but the bytes layout), so
    that a buffer its stored bytes are read into is what CodecChain.decode views."""
    return (
        type(chain) is CodecChain
        and not chain.array_array
        and not chain.bytes_bytes
        and type(chain.array_bytes) is BytesLayout
    )


@dataclasses.dataclass(frozen=True, eq=False)
class UnusableChain(CodecChain):
    """Codecs the metadata names that cannot run here (unknown, or their library missing).

    The array keeps what its metadata says (shape, dtype, attributes, this description);
    each decode and encode fails with `error`, which names the document and the reason.
    """

    error: Exception = dataclasses.field(default_factory=lambda: UnknownCodec("codec unavailable"))
    description: Any = ()
    layout_order: str = "C"

    def _fail(self) -> Exception:
        return type(self.error)(str(self.error))

    def decode(
        self, data: Any, shape: tuple[int, ...], dtype: np.dtype, fill: np.ndarray | None, out: np.ndarray | None = None
    ) -> np.ndarray:
        raise self._fail()

    def encode(self, arr: np.ndarray, fill: np.ndarray) -> bytes:
        raise self._fail()

    def encoded_size(self, n_bytes: int) -> int:
        raise self._fail()

    def max_encoded_nbytes(self, shape: tuple[int, ...], dtype: np.dtype) -> int:
        raise self._fail()  # nothing is worth reading: no chunk can be decoded

    @property
    def order(self) -> str:
        return self.layout_order

    def describe(self) -> list[dict[str, Any]]:
        return list(self.description)


def transpose_order(order: Any, ndim: int, where: str) -> tuple[int, ...]:
    """A permutation of `ndim` axes from `C`, `F` or a list (v3 `transpose`, the drafts' layouts)."""
    if order == "C":
        return tuple(range(ndim))
    if order == "F":
        return tuple(range(ndim))[::-1]
    if not isinstance(order, list) or sorted(order) != list(range(ndim)):
        raise MetadataError(f"bad transpose order {order!r} in {where}")
    return tuple(order)
