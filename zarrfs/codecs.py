"""Codec chains (array->array*, array->bytes, bytes->bytes*) over numcodecs: encode and decode one chunk.

Every format builds a CodecChain: v3 from its `codecs` list, v2 and v1 from `filters` and
`compressor` (as bytes->bytes steps) followed by a plain `bytes` layout in C or F order.
Encoding and decoding are synchronous and pure; the engine runs them in worker threads.
A chunk whose every element is the fill value is not stored (`is_fill`); a shard with no
stored inner chunk encodes to b"", the sign to erase it.
"""

from __future__ import annotations

import bz2
import dataclasses
import lzma
import math
import zlib
from collections.abc import Callable
from typing import Any

import numcodecs
import numpy as np
from numcodecs.compat import ensure_contiguous_ndarray

from . import grid
from .errors import CorruptChunk, MetadataError, UnknownCodec, Unsupported

# numcodecs ids by the role zarr-python 3 gives them under `numcodecs.<id>` in v3 metadata.
ARRAY_ARRAY_IDS = {"delta", "bitround", "fixedscaleoffset", "quantize", "packbits", "astype"}
ARRAY_BYTES_IDS = {"pcodec", "zfpy"}
ABSENT = 2**64 - 1  # sharding index entry of a chunk that is not stored

# Bounds on what a chunk's bytes may legitimately take, so that a hostile chunk cannot make
# us read or allocate without limit. No compressor grows incompressible data by more than
# a header and a small fraction (blosc 16 bytes + a little per block, zstd a few bytes per
# 128 KiB block, bz2 about 1 %): twice the input plus 64 KiB leaves a wide margin. The engine
# bounds shard index entries by the same rule.
GROWTH_FACTOR = 2
GROWTH_SLACK_BYTES = 64 << 10
# Codecs that append a 4-byte checksum, and filters that keep the byte count
# (filters that change the dtype are sized by their dtype and astype attributes).
CHECKSUM_IDS = {"crc32", "crc32c", "adler32", "fletcher32", "jenkins_lookup3"}
SAME_SIZE_IDS = {"shuffle", "bitround"}
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
GZIP_WBITS = 16 + zlib.MAX_WBITS  # zlib's wbits for a gzip member


def grown_bound(n_bytes: int) -> int:
    """The most bytes any compressor may turn `n_bytes` of input into."""
    return GROWTH_FACTOR * n_bytes + GROWTH_SLACK_BYTES


def _too_large(name: str, n_bytes: int | str, limit: int) -> CorruptChunk:
    return CorruptChunk(f"{name} decodes to {n_bytes} bytes, more than the {limit} expected")


def zstd_content_size(data: Any) -> int | None:
    """The decompressed size a zstd frame header declares, or None when it declares none."""
    head = bytes(_u1(data)[:18])
    if len(head) < 6 or head[:4] != ZSTD_MAGIC:
        return None  # not a frame numcodecs can decode either: it reports the error
    fhd = head[4]
    fcs_flag, single_segment, dict_flag = fhd >> 6, (fhd >> 5) & 1, fhd & 3
    fcs_nbytes = (1 if single_segment else 0, 2, 4, 8)[fcs_flag]
    if fcs_nbytes == 0:
        return None
    at = 5 + (0 if single_segment else 1) + (0, 1, 2, 4)[dict_flag]
    if len(head) < at + fcs_nbytes:
        return None
    size = int.from_bytes(head[at:at + fcs_nbytes], "little")
    return size + 256 if fcs_nbytes == 2 else size  # the 2-byte field is offset by 256


def _inflate(new: Callable[[], Any], data: Any, limit: int, name: str, members: bool) -> bytes:
    """Streaming decompression (zlib, gzip, bz2, lzma objects) that stops past `limit` bytes.

    With `members`, concatenated streams are decoded one after another as the standard
    library's one-shot functions do; data after the last stream that is not one is ignored.
    """
    parts: list[bytes] = []
    total = 0
    first = True
    while True:
        d = new()
        try:
            part = d.decompress(data, limit - total + 1)  # never 0: that means "no limit" to zlib
        except Exception:
            if first:
                raise
            break  # trailing bytes that are not another stream
        total += len(part)
        if total > limit:
            raise _too_large(name, f"more than {limit}", limit)
        parts.append(part)
        if not d.eof:
            raise CorruptChunk(f"{name}: compressed stream ends early")
        data, first = d.unused_data, False
        if not members or not data.strip(b"\0"):  # gzip allows zero padding after a member
            break
    return parts[0] if len(parts) == 1 else b"".join(parts)


def decode_bounded(codec: Any, data: Any, limit: int, name: str) -> Any:
    """`codec.decode(data)`, refused (CorruptChunk) before allocating when the output would
    exceed `limit` bytes, for every compressor whose format says or lets us find the size."""
    cid = codec.codec_id
    if cid == "zstd":
        declared = zstd_content_size(data)
        if declared is not None and declared > limit:
            raise _too_large(name, declared, limit)
        if declared is None and bytes(_u1(data)[:4]) == ZSTD_MAGIC:
            # No size in the header: decode into a buffer of the limit first, which fails
            # when the frame holds more; then again for the exact length (rare frames).
            try:
                codec.decode(data, out=np.empty(limit, np.uint8))
            except Exception as e:
                raise _too_large(name, f"more than {limit} ({e})", limit) from None
    elif cid == "blosc":  # blosc's 16-byte header: version, versionlz, flags, typesize, nbytes (u32 LE)...
        head = bytes(_u1(data)[:8])
        if len(head) == 8 and int.from_bytes(head[4:8], "little") > limit:
            raise _too_large(name, int.from_bytes(head[4:8], "little"), limit)
    elif cid == "lz4":  # numcodecs prefixes the decoded size, 4 bytes little-endian
        head = bytes(_u1(data)[:4])
        if len(head) == 4 and int.from_bytes(head, "little") > limit:
            raise _too_large(name, int.from_bytes(head, "little"), limit)
    elif cid == "zlib":
        return _inflate(zlib.decompressobj, _u1(data), limit, name, members=False)
    elif cid == "gzip":
        return _inflate(lambda: zlib.decompressobj(GZIP_WBITS), _u1(data), limit, name, members=True)
    elif cid == "bz2":
        return _inflate(bz2.BZ2Decompressor, memoryview(_u1(data)), limit, name, members=True)
    elif cid == "lzma":
        return _inflate(lambda: lzma.LZMADecompressor(format=codec.format, filters=codec.filters),
                        memoryview(_u1(data)), limit, name, members=codec.format != lzma.FORMAT_RAW)
    out = codec.decode(data)
    n = _u1(out).size
    if n > limit:  # a codec that does not tell its size first: at least stop here
        raise _too_large(name, n, limit)
    return out


def _u1(buf: Any) -> np.ndarray:
    """A flat uint8 view of any buffer a codec returned."""
    return ensure_contiguous_ndarray(buf).reshape(-1).view(np.uint8)


def _as_bytes(buf: Any) -> bytes:
    """What a codec returned (bytes, or an array in memory order) as bytes."""
    return buf if isinstance(buf, bytes) else _u1(buf).tobytes()


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
    if n in (1, 2, 4, 8):  # one integer comparison per element
        return bool((raw.view(f"u{n}") == np.frombuffer(want, f"u{n}")[0]).all())
    return bool((raw.reshape(-1, n) == np.frombuffer(want, np.uint8)).all())


@dataclasses.dataclass(frozen=True)
class BytesBytes:
    """A numcodecs codec used on whole buffers (compressors, checksums, v2 filters)."""

    codec: Any
    name: str

    def decode(self, data: Any, limit: int | None = None) -> Any:
        """Decoded bytes; with `limit`, at most that many (CorruptChunk beyond, before allocating)."""
        if limit is None:
            return self.codec.decode(data)
        return decode_bounded(self.codec, data, limit, self.name)

    def encode(self, data: Any) -> Any:
        return self.codec.encode(data)

    def encoded_bound(self, n: int) -> int:
        """The most bytes this codec encodes `n` bytes into (exact for filters and checksums)."""
        codec = self.codec
        if codec.codec_id in CHECKSUM_IDS:
            return n + 4
        decoded = getattr(codec, "decode_dtype", None) or getattr(codec, "dtype", None)
        encoded = getattr(codec, "encode_dtype", None) or getattr(codec, "astype", None)
        if decoded is not None and encoded is not None:  # delta, fixedscaleoffset, astype, quantize...
            try:
                return -(-n // np.dtype(decoded).itemsize) * np.dtype(encoded).itemsize
            except TypeError:
                pass
        if codec.codec_id in SAME_SIZE_IDS:
            return n
        return grown_bound(n)

    def encoded_size(self, n: int) -> int:
        if self.codec.codec_id in ("crc32c", "crc32", "adler32"):
            return n + 4
        raise Unsupported(f"codec {self.name} cannot be used in a sharding index (size not fixed)")

    def describe(self) -> dict:
        return {"name": self.name, "configuration": self.codec.get_config()}


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

    def describe(self) -> dict:
        return {"name": "transpose", "configuration": {"order": list(self.order)}}


@dataclasses.dataclass(frozen=True)
class NumcodecsArray:
    """A numcodecs filter in the array->array role (delta, fixedscaleoffset, astype...)."""

    codec: Any
    name: str

    def encoded_shape(self, shape: tuple[int, ...], dtype: np.dtype) -> tuple[tuple[int, ...], np.dtype]:
        if self.codec.codec_id == "packbits":  # a header byte, then 8 booleans a byte
            return (1 + -(-math.prod(shape) // 8),), np.dtype("u1")
        for attr in ("astype", "encode_dtype"):
            enc = getattr(self.codec, attr, None)
            if enc is not None:
                return shape, np.dtype(enc)
        return shape, dtype

    def decode(self, arr: np.ndarray, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        out = np.asarray(self.codec.decode(np.ascontiguousarray(arr)))
        return out.reshape(-1).view(dtype).reshape(shape) if out.dtype != dtype else out.reshape(shape)

    def encode(self, arr: np.ndarray) -> np.ndarray:
        shape, dtype = self.encoded_shape(arr.shape, arr.dtype)
        out = np.asarray(self.codec.encode(np.ascontiguousarray(arr)))
        return out.reshape(-1).view(dtype).reshape(shape) if out.dtype != dtype else out.reshape(shape)

    def describe(self) -> dict:
        return {"name": self.name, "configuration": self.codec.get_config()}


@dataclasses.dataclass(frozen=True)
class BytesLayout:
    """The array->bytes step: elements laid out in C or F order, in a given byte order.

    `endian` None keeps the dtype's own byte order (v1, v2); 'little'/'big' is v3 `bytes`.
    """

    endian: str | None = "little"
    order: str = "C"

    def stored_dtype(self, dtype: np.dtype) -> np.dtype:
        """`dtype` in the byte order its elements are stored in."""
        if self.endian is not None and dtype.itemsize > 1 and dtype.fields is None and dtype.kind not in "SV":
            return dtype.newbyteorder("<" if self.endian == "little" else ">")
        return dtype

    def decode(self, data: Any, shape: tuple[int, ...], dtype: np.dtype, fill: np.ndarray) -> np.ndarray:
        stored = self.stored_dtype(dtype)
        raw = _u1(data)
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

    def describe(self) -> dict:
        if self.endian is None:
            return {"name": "bytes", "configuration": {"order": self.order}}
        return {"name": "bytes", "configuration": {"endian": self.endian}}


@dataclasses.dataclass(frozen=True)
class NumcodecsArrayBytes:
    """A numcodecs codec in the array->bytes role (pcodec, zfpy)."""

    codec: Any
    name: str

    def decode(self, data: Any, shape: tuple[int, ...], dtype: np.dtype, fill: np.ndarray) -> np.ndarray:
        out = np.asarray(self.codec.decode(data))
        if out.size != math.prod(shape):
            raise CorruptChunk(f"decoded to {out.size} elements, expected {math.prod(shape)}")
        return out.reshape(-1).astype(dtype, copy=False).reshape(shape)

    def encode(self, arr: np.ndarray, fill: np.ndarray) -> Any:
        return self.codec.encode(np.ascontiguousarray(arr))

    def max_encoded_nbytes(self, shape: tuple[int, ...], dtype: np.dtype) -> int:
        return grown_bound(math.prod(shape) * dtype.itemsize)

    def describe(self) -> dict:
        return {"name": self.name, "configuration": self.codec.get_config()}


@dataclasses.dataclass(frozen=True)
class CodecChain:
    """One chunk's codecs in encode order: array->array*, one array->bytes, bytes->bytes*."""

    array_array: tuple = ()
    array_bytes: Any = BytesLayout()
    bytes_bytes: tuple = ()

    def decode(self, data: Any, shape: tuple[int, ...], dtype: np.dtype, fill: np.ndarray) -> np.ndarray:
        """Decode stored bytes into an array of exactly `shape` and `dtype` (may be F-ordered).

        Each bytes->bytes step may produce at most what its encoding was given: the last
        compressor at most the chunk's own byte count. More is a CorruptChunk, found before
        the output is allocated wherever the codec's format tells its size.
        """
        shapes = [(shape, dtype)]
        for aa in self.array_array:
            shapes.append(aa.encoded_shape(*shapes[-1]))
        limits = self._step_limits(*shapes[-1])
        for bb, limit in zip(reversed(self.bytes_bytes), reversed(limits)):
            data = bb.decode(data, limit)
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
        if isinstance(self.array_bytes, ShardingIndexed) and not len(data):
            return b""
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

    def describe(self) -> list[dict]:
        return [c.describe() for c in (*self.array_array, self.array_bytes, *self.bytes_bytes)]


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

    def decode(self, data: Any, shape: tuple[int, ...], dtype: np.dtype, fill: np.ndarray) -> np.ndarray:
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

    def describe(self) -> list[dict]:
        return list(self.description)


def v2_description(compressor: Any, filters: Any, order: str) -> list[dict]:
    """The codecs of v1/v2 metadata as CodecChain.describe shows them, straight from the document."""
    steps = [*(filters if isinstance(filters, list) else []), *([compressor] if compressor is not None else [])]
    return [{"name": "bytes", "configuration": {"order": order}},
            *({"name": s.get("id") if isinstance(s, dict) else None, "configuration": s} for s in steps)]


@dataclasses.dataclass(frozen=True)
class ShardingIndexed:
    """v3 `sharding_indexed`: a shard holds inner chunks and an index of (offset, nbytes) u64."""

    inner_chunks: tuple[int, ...]
    inner: CodecChain
    index: CodecChain
    index_at_end: bool = True

    def per_shard(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """Inner chunks along each dimension of a shard of `shape`."""
        if any(s % c for s, c in zip(shape, self.inner_chunks)):
            raise MetadataError(f"shard shape {shape} is not a multiple of inner chunks {self.inner_chunks}")
        return tuple(s // c for s, c in zip(shape, self.inner_chunks))

    def index_nbytes(self, per_shard: tuple[int, ...]) -> int:
        """Stored size of a shard's index (at its end or its start)."""
        return self.index.encoded_size(16 * math.prod(per_shard))

    def max_encoded_nbytes(self, shape: tuple[int, ...], dtype: np.dtype) -> int:
        """Every inner chunk at its largest, and the index."""
        per_shard = self.per_shard(shape)
        return (math.prod(per_shard) * self.inner.max_encoded_nbytes(self.inner_chunks, dtype)
                + self.index_nbytes(per_shard))

    def decode_index(self, raw: Any, per_shard: tuple[int, ...]) -> np.ndarray:
        """The (offset, nbytes) pairs of a shard's index, shape per_shard + (2,)."""
        return self.index.decode(raw, per_shard + (2,), np.dtype("<u8"), np.zeros((), "<u8"))

    @staticmethod
    def entry(index: np.ndarray, pos: tuple[int, ...]) -> tuple[int, int] | None:
        """(offset, nbytes) of inner chunk `pos`, or None when it is absent."""
        offset, nbytes = (int(x) for x in index[pos])
        if offset == ABSENT and nbytes == ABSENT:
            return None
        if offset == ABSENT or nbytes == ABSENT:
            raise CorruptChunk(f"bad index entry ({offset}, {nbytes}) of inner chunk {pos}: absent in one field only")
        return offset, nbytes

    def decode(self, data: Any, shape: tuple[int, ...], dtype: np.dtype, fill: np.ndarray) -> np.ndarray:
        per_shard = self.per_shard(shape)
        buf = _u1(data)
        index_nbytes = self.index_nbytes(per_shard)
        if buf.size < index_nbytes:
            raise CorruptChunk(f"shard of {buf.size} bytes is shorter than its index ({index_nbytes})")
        raw_index = buf[buf.size - index_nbytes:] if self.index_at_end else buf[:index_nbytes]
        index = self.decode_index(raw_index, per_shard)
        out = np.empty(shape, dtype=dtype)
        for pos in grid.all_chunks(per_shard, (1,) * len(per_shard)):
            found = self.entry(index, pos)
            region = grid.chunk_slices(pos, shape, self.inner_chunks)
            if found is None:
                out[region] = fill
                continue
            offset, nbytes = found
            if offset + nbytes > buf.size:
                raise CorruptChunk(f"inner chunk {pos} at {offset}+{nbytes} lies outside the shard")
            out[region] = self.inner.decode(buf[offset:offset + nbytes], self.inner_chunks, dtype, fill)
        return out

    def encode(self, arr: np.ndarray, fill: np.ndarray,
               keep: dict[tuple[int, ...], bytes | None] | None = None) -> bytes:
        """The shard: its inner chunks that are not all fill, back to back in C order over
        the inner grid, and the index; b"" when every inner chunk is fill.

        `keep` gives inner chunks already encoded (None: absent), stored as they are.
        """
        shape = arr.shape
        per_shard = self.per_shard(shape)
        index = np.full(per_shard + (2,), ABSENT, dtype="<u8")
        index_nbytes = self.index_nbytes(per_shard)
        offset = 0 if self.index_at_end else index_nbytes
        parts = []
        for pos in grid.all_chunks(per_shard, (1,) * len(per_shard)):
            if keep is not None and pos in keep:
                data = keep[pos]
                if data is not None:
                    index[pos] = (offset, len(data))
                    offset += len(data)
                    parts.append(data)
                continue
            inner = arr[(*grid.chunk_slices(pos, shape, self.inner_chunks), ...)]
            if is_fill(inner, fill):
                continue
            data = self.inner.encode(inner, fill)
            if not data:  # a nested shard of fill
                continue
            index[pos] = (offset, len(data))
            offset += len(data)
            parts.append(data)
        if not parts:
            return b""
        raw_index = self.index.encode(index, np.zeros((), "<u8"))
        if len(raw_index) != index_nbytes:
            raise Unsupported(f"shard index encoded to {len(raw_index)} bytes, expected {index_nbytes}")
        return b"".join([*parts, raw_index] if self.index_at_end else [raw_index, *parts])

    def encode_changed(self, arr: np.ndarray, fill: np.ndarray, old: Any,
                       changed: set[tuple[int, ...]]) -> bytes:
        """The shard, encoding only the inner chunks in `changed`: the others are copied
        from `old`, the stored shard `arr` was read from. An `old` that cannot be parsed
        is not trusted: then every inner chunk is encoded."""
        per_shard = self.per_shard(arr.shape)
        buf = _u1(old)
        index_nbytes = self.index_nbytes(per_shard)
        keep: dict[tuple[int, ...], bytes | None] = {}
        try:
            if buf.size < index_nbytes:
                raise CorruptChunk("shorter than its index")
            raw_index = buf[buf.size - index_nbytes:] if self.index_at_end else buf[:index_nbytes]
            index = self.decode_index(raw_index, per_shard)
            for pos in grid.all_chunks(per_shard, (1,) * len(per_shard)):
                if pos in changed:
                    continue
                found = self.entry(index, pos)
                if found is not None and found[0] + found[1] > buf.size:
                    raise CorruptChunk(f"inner chunk {pos} lies outside the shard")
                keep[pos] = None if found is None else buf[found[0]:found[0] + found[1]].tobytes()
        except Exception:  # numcodecs raises many types for a corrupt index
            keep = {}
        return self.encode(arr, fill, keep)

    def describe(self) -> dict:
        return {"name": "sharding_indexed", "configuration": {
            "chunk_shape": list(self.inner_chunks), "codecs": self.inner.describe(),
            "index_codecs": self.index.describe(),
            "index_location": "end" if self.index_at_end else "start"}}


# ---------------------------------------------------------------------------------------
# Building chains from metadata

_BLOSC_SHUFFLE = {"noshuffle": 0, "shuffle": 1, "bitshuffle": 2}


def numcodecs_codec(config: dict, where: str) -> Any:
    """A numcodecs codec from its v1/v2-style config (`{"id": ..., ...}`)."""
    try:
        return numcodecs.get_codec(dict(config))
    except (ValueError, KeyError, TypeError) as e:
        raise UnknownCodec(f"unknown or invalid codec {config!r} in {where}: {e}") from None


def _v3_numcodecs(name: str, config: dict, where: str) -> Any:
    if name == "blosc":
        shuffle = config.get("shuffle", "noshuffle")
        conf = {"id": "blosc", "cname": config.get("cname", "lz4"), "clevel": config.get("clevel", 5),
                "shuffle": _BLOSC_SHUFFLE.get(shuffle, shuffle), "blocksize": config.get("blocksize", 0),
                "typesize": config.get("typesize")}  # the element size to shuffle by when encoding
        return numcodecs_codec(conf, where)
    if name == "gzip":
        return numcodecs_codec({"id": "gzip", "level": config.get("level", 5)}, where)
    if name == "zstd":
        return numcodecs_codec({"id": "zstd", "level": config.get("level", 0),
                                "checksum": config.get("checksum", False)}, where)
    if name == "crc32c":
        return numcodecs_codec({"id": "crc32c"}, where)
    if name.startswith("numcodecs."):
        return numcodecs_codec({"id": name[len("numcodecs."):], **config}, where)
    raise UnknownCodec(f"unknown codec {name!r} in {where}")


def v3_chain(codecs: Any, ndim: int, where: str) -> CodecChain:
    """A chain from a final-v3 `codecs` list (names, or draft-style `codec` URIs)."""
    if not isinstance(codecs, list) or not codecs:
        raise MetadataError(f"`codecs` must be a non-empty list in {where}")
    array_array: list = []
    array_bytes = None
    bytes_bytes: list = []
    for item in codecs:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise MetadataError(f"bad codec entry {item!r} in {where}")
        name, config = item["name"], item.get("configuration") or {}
        if name == "transpose":
            order = config.get("order")
            if order == "C":
                order = list(range(ndim))
            elif order == "F":
                order = list(range(ndim))[::-1]
            if not isinstance(order, list) or sorted(order) != list(range(ndim)):
                raise MetadataError(f"bad transpose order {order!r} in {where}")
            stage = Transpose(tuple(order))
        elif name in ("bytes", "endian"):
            stage = BytesLayout(config.get("endian", "little"), "C")
        elif name == "sharding_indexed":
            try:
                inner = tuple(int(c) for c in config["chunk_shape"])
            except (KeyError, TypeError, ValueError):
                raise MetadataError(f"sharding_indexed without a valid chunk_shape in {where}") from None
            location = config.get("index_location", "end")
            if location not in ("start", "end"):
                raise MetadataError(f"bad index_location {location!r} in {where}")
            index_codecs = config.get("index_codecs") or [{"name": "bytes", "configuration": {"endian": "little"}},
                                                          {"name": "crc32c"}]
            stage = ShardingIndexed(inner, v3_chain(config.get("codecs"), ndim, where),
                                    v3_chain(index_codecs, ndim + 1, where), location == "end")
        else:
            codec = _v3_numcodecs(name, config, where)
            short = name[len("numcodecs."):] if name.startswith("numcodecs.") else ""
            if short in ARRAY_ARRAY_IDS:
                stage = NumcodecsArray(codec, name)
            elif short in ARRAY_BYTES_IDS:
                stage = NumcodecsArrayBytes(codec, name)
            else:
                stage = BytesBytes(codec, name)
        if isinstance(stage, (Transpose, NumcodecsArray)):
            if array_bytes is not None:
                raise MetadataError(f"array->array codec {name!r} after the array->bytes codec in {where}")
            array_array.append(stage)
        elif isinstance(stage, BytesBytes):
            if array_bytes is None:
                raise MetadataError(f"bytes->bytes codec {name!r} before the array->bytes codec in {where}")
            bytes_bytes.append(stage)
        else:
            if array_bytes is not None:
                raise MetadataError(f"two array->bytes codecs in {where}")
            array_bytes = stage
    if array_bytes is None:
        raise MetadataError(f"no array->bytes codec (such as `bytes`) in {where}")
    return CodecChain(tuple(array_array), array_bytes, tuple(bytes_bytes))


def v2_chain(compressor: Any, filters: Any, order: str, where: str) -> CodecChain:
    """A chain for v1/v2: filters, then the compressor, over the raw element bytes in `order`."""
    steps = []
    for f in filters or []:
        if not isinstance(f, dict) or "id" not in f:
            raise MetadataError(f"bad filter {f!r} in {where}")
        steps.append(BytesBytes(numcodecs_codec(f, where), f["id"]))
    if compressor is not None:
        if not isinstance(compressor, dict) or "id" not in compressor:
            raise MetadataError(f"bad compressor {compressor!r} in {where}")
        steps.append(BytesBytes(numcodecs_codec(compressor, where), compressor["id"]))
    if order not in ("C", "F"):
        raise MetadataError(f"bad order {order!r} in {where}")
    return CodecChain((), BytesLayout(None, order), tuple(steps))
