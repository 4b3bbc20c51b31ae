"""Decode bombs: valid compressed streams of BOMB_BYTES zeros in each compressor's own format.

Built with the standard library and numcodecs (never zarrfs), streamed where the format
allows so that building one does not hold the inflated bytes.
"""

from __future__ import annotations

import bz2
import functools
import lzma
import zlib

import numpy as np

# Far more than any chunk of the arrays that receive these (a few KiB decoded), and enough
# that a decoder which inflates it first shows in the daemon's peak memory.
BOMB_BYTES = 256 << 20
BLOCK = 1 << 20
# numcodecs ids (v2 compressor configs) of every compressor a bomb is made for
COMPRESSORS = ("zstd", "zlib", "gzip", "bz2", "lzma", "blosc", "lz4")


def _streamed(compressor) -> bytes:
    zeros = bytes(BLOCK)
    parts = [compressor.compress(zeros) for _ in range(BOMB_BYTES // BLOCK)]
    return b"".join(parts) + compressor.flush()


@functools.cache
def bomb(codec_id: str) -> bytes:
    """BOMB_BYTES zeros encoded as numcodecs' codec `codec_id` (default settings) stores them."""
    if codec_id == "zlib":
        return _streamed(zlib.compressobj(1))
    if codec_id == "gzip":
        return _streamed(zlib.compressobj(1, zlib.DEFLATED, 16 + zlib.MAX_WBITS))
    if codec_id == "bz2":
        return _streamed(bz2.BZ2Compressor(1))
    if codec_id == "lzma":
        return _streamed(lzma.LZMACompressor(lzma.FORMAT_XZ, preset=0))
    import numcodecs

    codec = numcodecs.get_codec({"id": codec_id})
    return bytes(codec.encode(np.zeros(BOMB_BYTES, np.uint8)))


def zstd_without_size(frame: bytes) -> bytes:
    """A zstd frame whose header declares no content size (as streaming writers make them).

    Only for frames whose header is magic, a descriptor with a 4-byte size and no single
    segment flag, a window byte, then the size (what numcodecs writes for large inputs).
    """
    fhd = frame[4]
    assert fhd >> 6 == 2 and not fhd & 0x20 and not fhd & 3, f"unexpected frame header {frame[:10].hex()}"
    return frame[:4] + bytes([0]) + frame[5:6] + frame[10:]
