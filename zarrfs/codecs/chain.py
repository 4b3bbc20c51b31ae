"""Codec chains (array->array*, array->bytes, bytes->bytes*) over numcodecs: encode and decode one chunk.

Every format builds a CodecChain from its own JSON (in its module under formats/): v3 from
its `codecs` list, v2 and v1 from `filters` and `compressor` (as bytes->bytes steps)
followed by a plain `bytes` layout in C or F order. The sharding codec is in sharding.py.
Encoding and decoding are synchronous and pure; the engine runs them in worker threads.
A chunk whose every element is the fill value is not stored (`is_fill`); a shard with no
stored inner chunk encodes to b"", the sign to erase it.
"""

from __future__ import annotations

import bz2
import dataclasses
import logging
import lzma
import math
import zlib
from collections.abc import Callable
from typing import Any

import numcodecs
import numpy as np
from numcodecs.compat import ensure_contiguous_ndarray

from ..errors import CorruptChunk, MetadataError, UnknownCodec, Unsupported, UserError
from ..repeats import LogOnce

log = logging.getLogger(__name__)

try:  # ISA-L's inflate, zlib's API: gzip and zlib chunks decode 2.2x faster (0.50 vs 0.23 GB/s here)
    from isal import isal_zlib as inflate_lib
except ImportError:  # no wheel for this platform (pyproject installs it on x86_64 and aarch64)
    inflate_lib = zlib

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


def is_zlib_stream(data: Any) -> bool:
    """Whether bytes begin with a zlib header (RFC 1950: deflate, a window of at most 32 KiB,
    the two bytes a multiple of 31), as an early writer stored under the id `gzip`."""
    head = bytes(u1(data)[:2])
    return len(head) == 2 and head[0] & 0x0F == 8 and head[0] >> 4 <= 7 and int.from_bytes(head, "big") % 31 == 0


def grown_bound(n_bytes: int) -> int:
    """The most bytes any compressor may turn `n_bytes` of input into."""
    return GROWTH_FACTOR * n_bytes + GROWTH_SLACK_BYTES


def _too_large(name: str, n_bytes: int | str, limit: int) -> CorruptChunk:
    return CorruptChunk(f"{name} decodes to {n_bytes} bytes, more than the {limit} expected")


def zstd_content_size(data: Any) -> int | None:
    """The decompressed size a zstd frame header declares, or None when it declares none."""
    head = bytes(u1(data)[:18])
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


def decode_bounded(codec: Any, data: Any, limit: int, name: str, out: np.ndarray | None = None) -> Any:
    """`codec.decode(data)`, refused (CorruptChunk) before allocating when the output would
    exceed `limit` bytes, for every compressor whose format says or lets us find the size.

    With OUT (uint8), blosc and zstd data that say they decode to exactly its size are decoded
    into it (memory already touched: no page faults), and OUT is returned."""
    cid = codec.codec_id
    if cid == "zstd":
        declared = zstd_content_size(data)
        if declared is not None and declared > limit:
            raise _too_large(name, declared, limit)
        if out is not None and declared == out.nbytes:
            codec.decode(data, out=out)
            return out
        if declared is None and bytes(u1(data)[:4]) == ZSTD_MAGIC:
            # No size in the header: decode into a buffer of the limit first, which fails
            # when the frame holds more; then again for the exact length (rare frames).
            try:
                codec.decode(data, out=np.empty(limit, np.uint8))
            except Exception as e:
                raise _too_large(name, f"more than {limit} ({e})", limit) from None
    elif cid == "blosc":  # blosc's 16-byte header: version, versionlz, flags, typesize, nbytes (u32 LE)...
        head = bytes(u1(data)[:8])
        declared = int.from_bytes(head[4:8], "little") if len(head) == 8 else None
        if declared is not None and declared > limit:
            raise _too_large(name, declared, limit)
        if out is not None and declared == out.nbytes:
            codec.decode(data, out=out)
            return out
    elif cid == "lz4":  # numcodecs prefixes the decoded size, 4 bytes little-endian
        head = bytes(u1(data)[:4])
        if len(head) == 4 and int.from_bytes(head, "little") > limit:
            raise _too_large(name, int.from_bytes(head, "little"), limit)
    elif cid == "zlib":
        return _inflate(inflate_lib.decompressobj, u1(data), limit, name, members=False)
    elif cid == "gzip":
        return _inflate(lambda: inflate_lib.decompressobj(GZIP_WBITS), u1(data), limit, name, members=True)
    elif cid == "bz2":
        return _inflate(bz2.BZ2Decompressor, memoryview(u1(data)), limit, name, members=True)
    elif cid == "lzma":
        return _inflate(lambda: lzma.LZMADecompressor(format=codec.format, filters=codec.filters),
                        memoryview(u1(data)), limit, name, members=codec.format != lzma.FORMAT_RAW)
    out = codec.decode(data)
    n = u1(out).size
    if n > limit:  # a codec that does not tell its size first: at least stop here
        raise _too_large(name, n, limit)
    return out


def u1(buf: Any) -> np.ndarray:
    """A flat uint8 view of any buffer a codec returned."""
    return ensure_contiguous_ndarray(buf).reshape(-1).view(np.uint8)


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
    if n in (1, 2, 4, 8):  # one integer comparison per element
        return bool((raw.view(f"u{n}") == np.frombuffer(want, f"u{n}")[0]).all())
    return bool((raw.reshape(-1, n) == np.frombuffer(want, np.uint8)).all())


# Quirks said, by (quirk, metadata document): once per array for the daemon's life, not once per
# parse of its document (each refresh parses it again).
QUIRKS_SAID = LogOnce()


@dataclasses.dataclass(frozen=True)
class BytesBytes:
    """A numcodecs codec used on whole buffers (compressors, checksums, v2 filters)."""

    codec: Any
    name: str
    where: str = ""  # the metadata document that names the codec, for what the log says of it

    def decode(self, data: Any, limit: int | None = None, out: np.ndarray | None = None) -> Any:
        """Decoded bytes; with `limit`, at most that many (CorruptChunk beyond, before allocating);
        maybe in OUT (see decode_bounded). A `gzip` chunk that is a zlib stream is read as zlib."""
        if self.codec.codec_id == "gzip" and is_zlib_stream(data):
            self.tell_zlib()
            if limit is None:
                return inflate_lib.decompress(u1(data))
            return _inflate(inflate_lib.decompressobj, u1(data), limit, self.name, members=False)
        if limit is None:
            return self.codec.decode(data)
        return decode_bounded(self.codec, data, limit, self.name, out)

    def encode(self, data: Any) -> Any:
        return self.codec.encode(data)

    def tell_zlib(self) -> None:
        """Say once for this array that its `gzip` chunks are zlib streams."""
        self._tell_once("zlib", "its gzip chunks are zlib streams (as an early writer stored them): "
                                "read as zlib; chunks written here are gzip")

    def _tell_once(self, what: str, text: str) -> None:
        """Log a quirk of the stored chunks once for this array, named by its document (else
        once for this codec's name); decoding threads race here."""
        subject = self.where or self.name
        if QUIRKS_SAID.first((what, subject)):
            log.warning("%s: %s", subject, text)

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

    def decode(self, data: Any, shape: tuple[int, ...], dtype: np.dtype, fill: np.ndarray,
               out: np.ndarray | None = None) -> np.ndarray:
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

    def describe(self) -> list[dict]:
        return [c.describe() for c in (*self.array_array, self.array_bytes, *self.bytes_bytes)]


def decodes_into(chain: Any) -> bool:
    """Whether CodecChain.decode can decode a chunk of this chain into a buffer given for it:
    a lone blosc or zstd compressor over the chunk's bytes as stored."""
    return (type(chain) is CodecChain and not chain.array_array and len(chain.bytes_bytes) == 1
            and type(chain.array_bytes) is BytesLayout
            and getattr(chain.bytes_bytes[0].codec, "codec_id", None) in ("blosc", "zstd"))


def reads_into(chain: Any) -> bool:
    """Whether a chunk of this chain is its bytes as stored (no codec but the bytes layout), so
    that a buffer its stored bytes are read into is what CodecChain.decode views."""
    return (type(chain) is CodecChain and not chain.array_array and not chain.bytes_bytes
            and type(chain.array_bytes) is BytesLayout)


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


# ---------------------------------------------------------------------------------------
# Building chains from metadata

def numcodecs_codec(config: dict, where: str) -> Any:
    """A numcodecs codec from its v1/v2-style config (`{"id": ..., ...}`)."""
    try:
        return numcodecs.get_codec(dict(config))
    except (ValueError, KeyError, TypeError) as e:
        raise UnknownCodec(f"unknown or invalid codec {config!r} in {where}: {e}") from None


# blosc's `shuffle` by name (v3 and the drafts' JSON) and by numcodecs number.
BLOSC_SHUFFLE = {"noshuffle": 0, "shuffle": 1, "bitshuffle": 2}
BLOSC_SHUFFLE_NAMES = {n: name for name, n in BLOSC_SHUFFLE.items()}


def blosc_shuffle(value: Any) -> Any:
    """numcodecs' shuffle number of a JSON `shuffle` (a name, or already a number)."""
    return BLOSC_SHUFFLE.get(value, value) if isinstance(value, str) else value


def transpose_order(order: Any, ndim: int, where: str) -> tuple[int, ...]:
    """A permutation of `ndim` axes from `C`, `F` or a list (v3 `transpose`, the drafts' layouts)."""
    if order == "C":
        return tuple(range(ndim))
    if order == "F":
        return tuple(range(ndim))[::-1]
    if not isinstance(order, list) or sorted(order) != list(range(ndim)):
        raise MetadataError(f"bad transpose order {order!r} in {where}")
    return tuple(order)


# Default compression levels when `codec=NAME` gives none.
DEFAULT_LEVELS = {"blosc": 5, "zstd": 0, "gzip": 5, "zlib": 5, "bz2": 5, "lzma": 6, "lz4": 1}


def compressor_config(codec: str | None, default: str, itemsize: int) -> dict | None:
    """The numcodecs config of a `codec=NAME[:LEVEL]` option (or of the format's default)."""
    name, _, level_text = (codec or default).partition(":")
    name = name.lower()
    if name == "none":
        return None
    if name not in DEFAULT_LEVELS:
        raise UserError(f"codec={codec}: expected one of none, {', '.join(DEFAULT_LEVELS)}")
    level = int(level_text) if level_text else DEFAULT_LEVELS[name]
    return {
        "blosc": {"id": "blosc", "cname": "lz4", "clevel": level, "shuffle": 1, "blocksize": 0},
        "zstd": {"id": "zstd", "level": level},
        "gzip": {"id": "gzip", "level": level},
        "zlib": {"id": "zlib", "level": level},
        "bz2": {"id": "bz2", "level": max(1, level)},
        "lzma": {"id": "lzma", "preset": level},
        "lz4": {"id": "lz4", "acceleration": level},
    }[name]
