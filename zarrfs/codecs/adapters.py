"""numcodecs codecs in the chain's three roles, their size bounds, and the options' compressor configs; quirks of stored chunks said once."""

from __future__ import annotations

import dataclasses
import logging
import math
from typing import Any

import numcodecs
import numpy as np

from ..errors import CorruptChunk, UnknownCodec, Unsupported, UserError
from ..repeats import LogOnce
from .bounded import decode_bounded, grown_bound, inflate_bounded, inflate_lib, is_zlib_stream, u1

log = logging.getLogger(__name__)

# Codecs that append a 4-byte checksum, and filters that keep the byte count
# (filters that change the dtype are sized by their dtype and astype attributes).
CHECKSUM_IDS = {"crc32", "crc32c", "adler32", "fletcher32", "jenkins_lookup3"}
SAME_SIZE_IDS = {"shuffle", "bitround"}
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
            return inflate_bounded(inflate_lib.decompressobj, u1(data), limit, self.name, members=False)
        if limit is None:
            return self.codec.decode(data)
        return decode_bounded(self.codec, data, limit, self.name, out)

    def encode(self, data: Any) -> Any:
        return self.codec.encode(data)

    def tell_zlib(self) -> None:
        """Say once for this array that its `gzip` chunks are zlib streams."""
        self._tell_once(
            "zlib",
            "its gzip chunks are zlib streams (as an early writer stored them): "
            "read as zlib; chunks written here are gzip",
        )

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

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "configuration": self.codec.get_config()}


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

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "configuration": self.codec.get_config()}


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

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "configuration": self.codec.get_config()}


def numcodecs_codec(config: dict[str, Any], where: str) -> Any:
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


# Default compression levels when `codec=NAME` gives none.
DEFAULT_LEVELS = {"blosc": 5, "zstd": 0, "gzip": 5, "zlib": 5, "bz2": 5, "lzma": 6, "lz4": 1}


def compressor_config(codec: str | None, default: str, itemsize: int) -> dict[str, Any] | None:
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
