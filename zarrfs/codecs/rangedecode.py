"""Byte ranges of a decoded chunk without decoding all of it: which chains can, their decoder and its memory, the pieces a read is cut into.

For chunks larger than the cache (engine/streamed.py): a compressor that is one stream (zstd,
zlib, gzip, bz2, lzma) is decoded from its start up to the end of the bytes asked for, keeping
only a bounded window of what it produced, so that the next range of a sequential reader
continues the stream; blosc decodes only the blocks holding the range. The encoded bytes are
read from the store a step at a time too: memory does not grow with the chunk, encoded or
decoded. The decoders themselves are in rangedecoders.py. Pure and synchronous.
"""

from __future__ import annotations

import lzma
from typing import Any

import numpy as np

from ..errors import CorruptChunk
from .chain import BytesLayout, CodecChain
from .rangedecoders import (
    BLOSC_HEADER_BYTES,
    BLOSC_TABLE_MAX_BYTES,
    SPAN_BYTES,
    ZSTD_MAX_WINDOW_BYTES,
    ZSTD_MIN_WINDOW_BYTES,
    BloscBlocks,
    Fetch,
    RangeDecoder,
    StreamDecoder,
    zstandard,
)

# The engine sizes its decoders with these (re-exported).
from .rangedecoders import MIN_WINDOW_BYTES as MIN_WINDOW_BYTES
from .rangedecoders import OUT_STEP_BYTES as OUT_STEP_BYTES
from .rangedecoders import STATE_BASE_BYTES as STATE_BASE_BYTES
from .rangedecoders import WINDOW_BYTES as WINDOW_BYTES
from .rangedecoders import back_of as back_of
from .rangedecoders import span_of as span_of

# What bz2's decompressor holds: its own tables, a few MiB.
BZ2_STATE_BYTES = 4 << 20
# The first bytes of a chunk, enough to say how much its decompressor will hold: a zstd frame
# header (18 bytes at most), an xz stream header and its first block header's filters.
HEAD_BYTES = 64
# A piece of a box (`regions`): (first byte, stop byte, shape, strides of its elements from its
# first byte, its part of the box as slices of it); with the box's number (`chunk_pieces`).
Piece = tuple[int, int, tuple[int, ...], tuple[int, ...], tuple[slice, ...]]
BoxPiece = tuple[int, int, tuple[int, ...], tuple[int, ...], tuple[slice, ...], int]
# An lzma dictionary when the header does not say (the largest preset's).
LZMA_DEFAULT_DICT_BYTES = 64 << 20
XZ_MAGIC = b"\xfd7zXZ\x00"
XZ_LZMA2_ID = 0x21
STREAM_IDS = ("zstd", "zlib", "gzip", "bz2", "lzma")


def supported(chain: Any) -> bool:
    """Whether a chunk of this chain can be decoded a range at a time: the plain bytes layout
    (C or F order), then one compressor that is a stream, or blosc."""
    if type(chain) is not CodecChain or chain.array_array or type(chain.array_bytes) is not BytesLayout:
        return False
    if len(chain.bytes_bytes) != 1:
        return False
    codec = chain.bytes_bytes[0].codec
    cid = getattr(codec, "codec_id", None)
    if cid == "zstd":
        return zstandard is not None
    if cid == "lzma":
        return codec.format != lzma.FORMAT_RAW or codec.filters is not None
    return cid in STREAM_IDS or cid == "blosc"


def is_stream(chain: CodecChain) -> bool:
    """Whether a `supported` chain is decoded from its start (not blosc, by blocks)."""
    return chain.bytes_bytes[0].codec.codec_id != "blosc"


def decoder(
    chain: CodecChain, nbytes: int, fetch: Fetch, name: str, window_bytes: int = WINDOW_BYTES, limit: int | None = None
) -> RangeDecoder:
    """A decoder of the chunk whose encoded bytes FETCH reads, of NBYTES decoded bytes (a
    `supported` chain), keeping WINDOW_BYTES of what it decoded last; NAME labels its errors.
    With LIMIT (`decoder_limit`), a zstd or lzma stream that needs a larger window or
    dictionary than that (a later frame, say) fails instead of allocating it."""
    stage = chain.bytes_bytes[0]
    if stage.codec.codec_id == "blosc":
        return BloscBlocks(nbytes, fetch, name)
    return StreamDecoder(stage.codec, nbytes, fetch, name, window_bytes, stage, limit)


def decoder_limit(chain: CodecChain, head: bytes, name: str) -> int:
    """The memory a decoder of a chunk whose encoded bytes begin with HEAD (its first
    HEAD_BYTES) will hold besides its window: its decompressor's window or dictionary as the
    header states it (the largest allowed when it cannot be read), blosc's table of block
    starts and blocks, or a few MiB. CorruptChunk (naming NAME) when it is more than allowed."""
    codec = chain.bytes_bytes[0].codec
    cid = codec.codec_id
    if cid == "zstd":
        try:
            window = zstandard.get_frame_parameters(head).window_size
        except zstandard.ZstdError:  # (a skippable frame first, or not zstd: the decoder says which)
            return ZSTD_MAX_WINDOW_BYTES
        if window > ZSTD_MAX_WINDOW_BYTES:
            raise CorruptChunk(
                f"{name}: zstd frame needs a window of {window} bytes, more than the {ZSTD_MAX_WINDOW_BYTES} allowed"
            )
        return max(window, ZSTD_MIN_WINDOW_BYTES)
    if cid == "lzma":
        return _lzma_dict(codec, head)
    if cid == "bz2":
        return BZ2_STATE_BYTES
    if cid == "blosc" and len(head) >= BLOSC_HEADER_BYTES:
        nbytes, blocksize = (int.from_bytes(head[i : i + 4], "little") for i in (4, 8))
        if blocksize > 0:  # (else the decoder refuses the header)
            return min(BLOSC_TABLE_MAX_BYTES, 4 * -(-nbytes // blocksize)) + 2 * blocksize
    return 0


def _lzma_dict(codec: Any, head: bytes) -> int:
    """An lzma stream's dictionary size: from its filters (raw), its header (.lzma), or its
    first block's LZMA2 filter (.xz); else LZMA_DEFAULT_DICT_BYTES."""
    if codec.format == lzma.FORMAT_RAW:
        sizes = [f.get("dict_size", 0) for f in codec.filters or () if isinstance(f, dict)]
        return max(sizes or [0]) or LZMA_DEFAULT_DICT_BYTES
    if codec.format == lzma.FORMAT_ALONE or (codec.format == lzma.FORMAT_AUTO and head[:1] == b"\x5d"):
        return int.from_bytes(head[1:5], "little") if len(head) >= 5 else LZMA_DEFAULT_DICT_BYTES
    if not head.startswith(XZ_MAGIC) or len(head) < 14:
        return LZMA_DEFAULT_DICT_BYTES
    at, end = 12, 12 + (head[12] + 1) * 4  # the first block header
    flags = head[13]
    at += 2

    def varint() -> int:
        nonlocal at
        value = shift = 0
        while at < min(end, len(head)):
            byte = head[at]
            at += 1
            value |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                return value
        raise ValueError("varint")

    try:
        for present in (flags & 0x40, flags & 0x80):  # compressed size, uncompressed size
            if present:
                varint()
        for _ in range((flags & 3) + 1):
            fid, nprops = varint(), varint()
            props = head[at : at + nprops]
            at += nprops
            if fid == XZ_LZMA2_ID and len(props) == 1 and props[0] <= 40:
                bits = props[0]
                return (1 << 32) - 1 if bits == 40 else (2 | (bits & 1)) << (bits // 2 + 11)
    except ValueError:
        pass
    return LZMA_DEFAULT_DICT_BYTES


def _strides(shape: tuple[int, ...], itemsize: int, order: str) -> list[int]:
    strides = [0] * len(shape)
    step = itemsize
    for d in range(len(shape) - 1, -1, -1) if order == "C" else range(len(shape)):
        strides[d] = step
        step *= shape[d]
    return strides


def first_byte(shape: tuple[int, ...], itemsize: int, order: str, boxes: list[tuple[slice, ...]]) -> int:
    """The first byte in a chunk of any of its BOXES' elements."""
    strides = _strides(shape, itemsize, order)
    return min(sum(b.start * s for b, s in zip(box, strides)) for box in boxes)


def regions(
    shape: tuple[int, ...], itemsize: int, order: str, box: tuple[slice, ...], span: int = SPAN_BYTES
) -> list[Piece]:
    """A box of a chunk (SHAPE, elements of ITEMSIZE in ORDER) cut into pieces whose bytes lie
    within SPAN, in increasing order of their bytes: (first byte, stop byte, shape, strides
    of the piece's elements from its first byte, the piece's part of the box as slices of it)."""
    ndim = len(shape)
    strides = _strides(shape, itemsize, order)
    axes = sorted(range(ndim), key=lambda d: -strides[d])  # slowest first
    out: list[Piece] = []

    def extent(lo_idx: list[int], hi_idx: list[int]) -> tuple[int, int]:
        lo = sum(i * s for i, s in zip(lo_idx, strides))
        return lo, sum((i - 1) * s for i, s in zip(hi_idx, strides)) + itemsize

    def emit(lo_idx: list[int], hi_idx: list[int]) -> None:
        lo, hi = extent(lo_idx, hi_idx)
        out.append(
            (
                lo,
                hi,
                tuple(h - a for a, h in zip(lo_idx, hi_idx)),
                tuple(strides),
                tuple(slice(a - b.start, h - b.start) for a, h, b in zip(lo_idx, hi_idx, box)),
            )
        )

    def cut(lo_idx: list[int], hi_idx: list[int], level: int) -> None:
        lo, hi = extent(lo_idx, hi_idx)
        if hi - lo <= span or level >= ndim:
            emit(lo_idx, hi_idx)
            return
        d = axes[level]
        one_hi = list(hi_idx)
        one_hi[d] = lo_idx[d] + 1
        a, b = extent(lo_idx, one_hi)
        one = b - a  # the bytes of one index along D
        per = 1 if one > span else max(1, (span - one) // strides[d] + 1)
        for at in range(lo_idx[d], hi_idx[d], per):
            sub_lo, sub_hi = list(lo_idx), list(hi_idx)
            sub_lo[d], sub_hi[d] = at, min(at + per, hi_idx[d])
            cut(sub_lo, sub_hi, level + 1)

    if any(b.stop <= b.start for b in box):
        return []
    cut([b.start for b in box], [b.stop for b in box], 0)
    return out


def fill_sync(
    dec: RangeDecoder, pieces: list[BoxPiece], targets: list[np.ndarray], dtype: np.dtype, start: int, budget: int
) -> int:
    """Copy decoded pieces (`regions`) START.. of a chunk into their TARGETS (the box of each
    piece's list entry), elements of DTYPE as stored, until about BUDGET bytes were decoded;
    the index of the first piece not copied (len(pieces): all)."""
    began = dec.decoded
    for k in range(start, len(pieces)):
        lo, hi, shape, strides, part, n = pieces[k]
        left = budget - (dec.decoded - began)
        if left <= 0 or not dec.advance(lo, left):
            return k
        data = dec.read(lo, hi)
        targets[n][part] = np.ndarray(shape, dtype, data, 0, strides)
    return len(pieces)


def chunk_pieces(
    shape: tuple[int, ...], dtype: np.dtype, order: str, boxes: list[tuple[slice, ...]], span: int = SPAN_BYTES
) -> list[BoxPiece]:
    """Every box's pieces (`regions`), each tagged with its box's number, in increasing order of
    their bytes in the chunk (so that a stream is decoded once for all of them)."""
    pieces = []
    for n, box in enumerate(boxes):
        pieces += [(*r, n) for r in regions(shape, dtype.itemsize, order, box, span)]
    pieces.sort(key=lambda p: p[0])
    return pieces
