"""Decoding that a hostile chunk cannot make allocate without limit: declared sizes checked first, streams inflated in bounded steps."""

from __future__ import annotations

import bz2
import lzma
import types
import zlib
from collections.abc import Callable
from typing import Any

import numpy as np
from numcodecs.compat import ensure_contiguous_ndarray

from ..errors import CorruptChunk

try:  # ISA-L's inflate, zlib's API: gzip and zlib chunks decode faster (docs/PERFORMANCE.md)
    from isal import isal_zlib

    inflate_lib: types.ModuleType = isal_zlib
except ImportError:  # no wheel for this platform (pyproject installs it on x86_64 and aarch64)
    inflate_lib = zlib

# Bounds on what a chunk's bytes may legitimately take, so that a hostile chunk cannot make
# us read or allocate without limit. No compressor grows incompressible data by more than
# a header and a small fraction (blosc 16 bytes + a little per block, zstd a few bytes per
# 128 KiB block, bz2 about 1 %): twice the input plus 64 KiB leaves a wide margin. The engine
# bounds shard index entries by the same rule.
GROWTH_FACTOR = 2
GROWTH_SLACK_BYTES = 64 << 10
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
    size = int.from_bytes(head[at : at + fcs_nbytes], "little")
    return size + 256 if fcs_nbytes == 2 else size  # the 2-byte field is offset by 256


def inflate_bounded(new: Callable[[], Any], data: Any, limit: int, name: str, members: bool) -> bytes:
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
        return inflate_bounded(inflate_lib.decompressobj, u1(data), limit, name, members=False)
    elif cid == "gzip":
        return inflate_bounded(lambda: inflate_lib.decompressobj(GZIP_WBITS), u1(data), limit, name, members=True)
    elif cid == "bz2":
        return inflate_bounded(bz2.BZ2Decompressor, u1(data).data, limit, name, members=True)
    elif cid == "lzma":
        return inflate_bounded(
            lambda: lzma.LZMADecompressor(format=codec.format, filters=codec.filters),
            u1(data).data,
            limit,
            name,
            members=codec.format != lzma.FORMAT_RAW,
        )
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
