"""Byte ranges of a decoded chunk without decoding all of it: streams decoded from their start, blosc by blocks.

For chunks larger than the cache (engine/streamed.py): a compressor that is one stream (zstd,
zlib, gzip, bz2, lzma) is decoded from its start up to the end of the bytes asked for, keeping
only a bounded window of what it produced, so that the next range of a sequential reader
continues the stream; blosc decodes only the blocks holding the range. The encoded bytes are
read from the store a step at a time too: memory does not grow with the chunk, encoded or
decoded. Pure and synchronous; a decoder is used by one thread at a time.
"""

from __future__ import annotations

import bz2
import lzma
import zlib
from collections.abc import Callable
from typing import Any

import numcodecs.blosc
import numpy as np

from .bounded import grown_bound, is_zlib_stream
from .chain import BytesLayout, CodecChain
from ..errors import CorruptChunk

try:  # zstd frames decoded as a stream (numcodecs' Zstd decodes whole frames only)
    import zstandard
except ImportError:  # then zstd chunks larger than the cache are decoded whole
    zstandard = None

# Encoded bytes read from the store at a time.
ENCODED_STEP_BYTES = 1 << 20
# Decoded bytes produced by one call of a stream decoder, and the most bytes of a chunk copied
# out of one decoded range (a read's region of a chunk is cut into such ranges).
OUT_STEP_BYTES = 1 << 20
SPAN_BYTES = 2 << 20
# What a stream decoder keeps of what it decoded last (by default): the range being copied, a
# step, and room for a read of the kernel that arrives a little behind the one before
# (concurrent read-ahead) without decoding the stream again from its start. A decoder with a
# smaller window copies and decodes in steps of a quarter of it.
WINDOW_BYTES = 8 << 20
MIN_WINDOW_BYTES = 1 << 20
# zstd frames whose window needs more are refused (the library's own default limit): a frame
# written at the highest levels fits, a hostile one does not make us allocate gigabytes.
ZSTD_MAX_WINDOW_BYTES = 1 << 27
ZSTD_MIN_WINDOW_BYTES = 1 << 10  # (the least zstd lets a decoder be limited to)
# What a decoder holds besides its window and its decompressor's window or dictionary: the
# encoded and decoded steps in flight, and the decompressor's own tables (bz2's are a few MiB).
STATE_BASE_BYTES = 2 << 20
BZ2_STATE_BYTES = 4 << 20
# The first bytes of a chunk, enough to say how much its decompressor will hold: a zstd frame
# header (18 bytes at most), an xz stream header and its first block header's filters.
HEAD_BYTES = 64
# An lzma dictionary when the header does not say (the largest preset's).
LZMA_DEFAULT_DICT_BYTES = 64 << 20
XZ_MAGIC = b"\xfd7zXZ\x00"
XZ_LZMA2_ID = 0x21
BLOSC_HEADER_BYTES = 16
BLOSC_MEMCPYED = 0x2
# A blosc chunk's table of block starts is read whole, once: refused past this (blocks of
# 256 bytes in a 2 GiB chunk), not read at a hostile header's word.
BLOSC_TABLE_MAX_BYTES = 32 << 20
STREAM_IDS = ("zstd", "zlib", "gzip", "bz2", "lzma")
# zlib's wbits that read a gzip member or a zlib stream, whichever header it finds.
ZLIB_OR_GZIP_WBITS = 32 + zlib.MAX_WBITS

Fetch = Callable[[int, int], bytes]  # encoded bytes [start, end) of the chunk (b"" past its end)


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


def decoder(chain: CodecChain, nbytes: int, fetch: Fetch, name: str,
            window_bytes: int = WINDOW_BYTES, limit: int | None = None) -> "RangeDecoder":
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
            raise CorruptChunk(f"{name}: zstd frame needs a window of {window} bytes, more than the "
                               f"{ZSTD_MAX_WINDOW_BYTES} allowed")
        return max(window, ZSTD_MIN_WINDOW_BYTES)
    if cid == "lzma":
        return _lzma_dict(codec, head)
    if cid == "bz2":
        return BZ2_STATE_BYTES
    if cid == "blosc" and len(head) >= BLOSC_HEADER_BYTES:
        nbytes, blocksize = (int.from_bytes(head[i:i + 4], "little") for i in (4, 8))
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
            props = head[at:at + nprops]
            at += nprops
            if fid == XZ_LZMA2_ID and len(props) == 1 and props[0] <= 40:
                bits = props[0]
                return (1 << 32) - 1 if bits == 40 else (2 | (bits & 1)) << (bits // 2 + 11)
    except ValueError:
        pass
    return LZMA_DEFAULT_DICT_BYTES


def span_of(window_bytes: int) -> int:
    """The most bytes of one piece (`regions`) a decoder with this window is asked for."""
    return min(SPAN_BYTES, window_bytes // 4)


def back_of(window_bytes: int) -> int:
    """What a stream decoder with this window keeps behind the last byte it decoded, at least."""
    return window_bytes // 2


class RangeDecoder:
    """Decoded bytes [lo, hi) of one chunk (hi - lo at most `span`), in increasing order
    for the least work; `decoded` counts the bytes decoded so far."""

    nbytes: int
    decoded: int
    name: str
    span: int = SPAN_BYTES

    def cost(self, lo: int) -> int | None:
        """Bytes to decode before byte LO can be had (ranks decoders of one chunk); None when
        this decoder would start again from the chunk's start (a new one does as well)."""
        raise NotImplementedError

    def advance(self, lo: int, budget: int) -> bool:
        """Decode towards byte LO, at most about BUDGET bytes; whether LO is now reached."""
        return True

    def read(self, lo: int, hi: int) -> memoryview:
        raise NotImplementedError

    def _check(self, lo: int, hi: int) -> None:
        if not 0 <= lo < hi <= self.nbytes or hi - lo > self.span:
            raise ValueError(f"range {lo}:{hi} of a {self.nbytes}-byte chunk")


class _Source:
    """A chunk's encoded bytes, read from the store a step at a time (file-like for zstandard)."""

    def __init__(self, fetch: Fetch, step: int) -> None:
        self.fetch, self.step = fetch, step
        self.at = 0

    def read(self, n: int = -1) -> bytes:
        data = self.fetch(self.at, self.at + (self.step if n < 0 else max(1, min(n, self.step))))
        self.at += len(data)
        return data


class StreamDecoder(RangeDecoder):
    """A compressed stream decoded from its start, the last bytes of its output kept (a window)."""

    def __init__(self, codec: Any, nbytes: int, fetch: Fetch, name: str, window_bytes: int = WINDOW_BYTES,
                 stage: Any = None, limit: int | None = None) -> None:
        self.codec, self.nbytes, self.fetch, self.name = codec, nbytes, fetch, name
        self.limit = limit  # the most its decompressor may hold (decoder_limit)
        self.stage = stage  # the chain's BytesBytes, which logs a quirk of the array once
        self.window = np.empty(max(window_bytes, MIN_WINDOW_BYTES), np.uint8)
        self.span = span_of(len(self.window))
        self.out_step = min(OUT_STEP_BYTES, len(self.window) // 4)
        self.back = back_of(len(self.window))
        self.decoded = 0  # every byte decoded, restarts included
        self._restart()

    def _restart(self) -> None:
        self.pos = 0  # the stream's next decoded byte
        self.held = 0  # window[:held] is decoded bytes [pos - held, pos)
        self.source = _Source(self.fetch, min(ENCODED_STEP_BYTES, len(self.window) // 4))
        self.pending = b""  # encoded bytes read and not yet given to the decompressor
        self.ended = False
        self.reader = None
        cid = self.codec.codec_id
        if cid == "zstd":
            most = ZSTD_MAX_WINDOW_BYTES if self.limit is None else min(self.limit, ZSTD_MAX_WINDOW_BYTES)
            dctx = zstandard.ZstdDecompressor(max_window_size=max(most, ZSTD_MIN_WINDOW_BYTES))
            self.reader = dctx.stream_reader(self.source, read_size=self.source.step, read_across_frames=True)
        else:
            self.obj = self._new()

    def _new(self) -> Any:
        cid = self.codec.codec_id
        # (the standard library's zlib: ISA-L's object keeps what max_length held back
        # where unconsumed_tail does not show it)
        if cid == "zlib":
            return zlib.decompressobj()
        if cid == "gzip":  # (or a zlib stream, as an early writer stored under this id)
            return zlib.decompressobj(ZLIB_OR_GZIP_WBITS)
        if cid == "bz2":
            return bz2.BZ2Decompressor()
        if self.codec.format == lzma.FORMAT_RAW or self.limit is None:
            return lzma.LZMADecompressor(format=self.codec.format, filters=self.codec.filters)
        return lzma.LZMADecompressor(format=self.codec.format, memlimit=self.limit + STATE_BASE_BYTES)

    def cost(self, lo: int) -> int | None:
        return max(0, lo - self.pos) if lo >= self.pos - self.held else None

    def _members(self) -> bool:
        """Whether streams may follow one another, as the one-shot functions decode them."""
        cid = self.codec.codec_id
        return cid in ("gzip", "bz2") or (cid == "lzma" and self.codec.format != lzma.FORMAT_RAW)

    def _input(self) -> bytes:
        first = self.source.at == 0
        data = self.pending or self.source.read()
        self.pending = b""
        if not data:
            raise CorruptChunk(f"{self.name}: compressed stream ends early")
        if first and self.stage is not None and self.codec.codec_id == "gzip" and is_zlib_stream(data):
            self.stage.tell_zlib()
        return data

    def _produce(self, n: int) -> bytes:
        """Up to N next decoded bytes (b"" once the stream ended)."""
        if self.ended:
            return b""
        if self.reader is not None:
            out = self.reader.read(n)
            if not out:
                self.ended = True
            return out
        zlib_like = self.codec.codec_id in ("zlib", "gzip")
        while True:
            obj = self.obj
            if obj.eof:
                rest = obj.unused_data + self.pending
                if self._members() and not rest:
                    rest = self.source.read()
                if not self._members() or not rest.strip(b"\0"):  # (gzip may pad with zeros)
                    self.ended = True
                    return b""
                self.obj, self.pending = self._new(), rest
                continue
            if zlib_like:
                out = obj.decompress(obj.unconsumed_tail or self._input(), n)
            else:
                out = obj.decompress(self._input() if obj.needs_input else b"", n)
            if out:
                return out

    def advance(self, lo: int, budget: int) -> bool:
        if lo < self.pos - self.held:  # behind the window: the stream again from its start
            self._restart()
        spent = 0
        while self.pos < lo and spent < budget:
            spent += self._step(min(self.out_step, max(1, lo - self.pos)), lo)
        return self.pos >= lo

    def _step(self, n: int, keep_from: int) -> int:
        """Decode up to N more bytes into the window (what lies before KEEP_FROM may go)."""
        out = self._produce(n)
        if not out:
            raise CorruptChunk(f"{self.name}: compressed stream ends after {self.pos} bytes, "
                               f"{self.nbytes} expected")
        k = len(out)
        if self.pos + k > self.nbytes:
            raise CorruptChunk(f"{self.name}: decodes to more than the {self.nbytes} bytes expected")
        if self.held + k > len(self.window):  # keep the last half (or from KEEP_FROM, if more)
            keep = min(len(self.window) - k, self.held, max(self.back, self.pos - keep_from))
            self.window[:keep] = self.window[self.held - keep:self.held]
            self.held = keep
        self.window[self.held:self.held + k] = np.frombuffer(out, np.uint8)
        self.held += k
        self.pos += k
        self.decoded += k
        return k

    def read(self, lo: int, hi: int) -> memoryview:
        self._check(lo, hi)
        self.advance(lo, self.nbytes)
        while self.pos < hi:
            self._step(min(self.out_step, hi - self.pos), lo)
        start = self.held - (self.pos - lo)
        return memoryview(self.window)[start:start + hi - lo]


class BloscBlocks(RangeDecoder):
    """A blosc (1.x format) chunk: only the blocks holding a range are read and decoded,
    the last ones decoded kept."""

    def __init__(self, nbytes: int, fetch: Fetch, name: str) -> None:
        self.nbytes, self.fetch, self.name = nbytes, fetch, name
        self.decoded = 0
        head = fetch(0, BLOSC_HEADER_BYTES)
        if len(head) < BLOSC_HEADER_BYTES:
            raise CorruptChunk(f"{name}: blosc header cut short ({len(head)} bytes)")
        self.head = bytearray(head)
        self.flags = head[2]
        declared, self.blocksize, self.cbytes = (int.from_bytes(head[i:i + 4], "little") for i in (4, 8, 12))
        if declared != nbytes:
            raise CorruptChunk(f"{name}: blosc header says {declared} bytes, expected {nbytes}")
        if self.blocksize <= 0 or self.cbytes > grown_bound(nbytes):
            raise CorruptChunk(f"{name}: blosc header is not valid (blocksize {self.blocksize}, "
                               f"{self.cbytes} bytes)")
        self.nblocks = -(-nbytes // self.blocksize)
        self.kept_at, self.kept = 0, np.empty(0, np.uint8)  # the blocks decoded last, from byte kept_at
        self.bounds: np.ndarray | None = None  # (start, end) of each block's encoded bytes

    def cost(self, lo: int) -> int | None:
        return 0

    def read(self, lo: int, hi: int) -> memoryview:
        self._check(lo, hi)
        if self.kept_at <= lo and hi <= self.kept_at + len(self.kept):
            return memoryview(self.kept)[lo - self.kept_at:hi - self.kept_at]
        if self.flags & BLOSC_MEMCPYED:  # stored as it is, after the header
            at = BLOSC_HEADER_BYTES
            data = self.fetch(at + lo, at + hi)
            if len(data) != hi - lo:
                raise CorruptChunk(f"{self.name}: blosc chunk cut short")
            self.decoded += hi - lo
            return memoryview(data)
        first, last = lo // self.blocksize, (hi - 1) // self.blocksize
        kept_end = self.kept_at + len(self.kept)
        if self.kept_at <= lo < kept_end:  # its first blocks are the last decoded: the others only
            out = np.empty(hi - lo, np.uint8)
            out[:kept_end - lo] = self.kept[lo - self.kept_at:]
            self._keep(kept_end // self.blocksize, last)
            out[kept_end - lo:] = self.kept[kept_end - self.kept_at:hi - self.kept_at]
            return memoryview(out)
        self._keep(first, last)
        return memoryview(self.kept)[lo - self.kept_at:hi - self.kept_at]

    def _keep(self, first: int, last: int) -> None:
        """Blocks FIRST..LAST decoded and kept (one more before them where blosc needs it)."""
        if first == last == self.nblocks - 1 and first > 0 and self.nbytes % self.blocksize:
            first -= 1  # (blosc refuses a chunk of one block shorter than its blocksize)
        self.kept_at, self.kept = first * self.blocksize, self._blocks(first, last)

    def _table(self) -> np.ndarray:
        """Each block's start and end in the encoded chunk (blocks compressed by several threads
        are stored in the order they were done: a block ends where the next stored one starts)."""
        if self.bounds is None:
            size = 4 * self.nblocks
            if size > BLOSC_TABLE_MAX_BYTES:
                raise CorruptChunk(f"{self.name}: blosc chunk of {self.nblocks} blocks, more than "
                                   f"{BLOSC_TABLE_MAX_BYTES // 4} (blocksize {self.blocksize})")
            raw = self.fetch(BLOSC_HEADER_BYTES, BLOSC_HEADER_BYTES + size)
            if len(raw) != size:
                raise CorruptChunk(f"{self.name}: blosc block starts cut short")
            starts = np.frombuffer(raw, "<u4").astype(np.int64)
            order = np.argsort(starts, kind="stable")
            ends = np.empty_like(starts)
            ends[order[:-1]] = starts[order[1:]]
            ends[order[-1]] = self.cbytes
            if starts[order[0]] < BLOSC_HEADER_BYTES + size or np.any(ends <= starts):
                raise CorruptChunk(f"{self.name}: blosc block starts are not valid")
            self.bounds = np.stack([starts, ends], axis=1)
        return self.bounds

    def _blocks(self, first: int, last: int) -> np.ndarray:
        """Blocks FIRST..LAST decoded: their bytes framed as a blosc chunk of their own (the
        header with their size, their starts, their compressed bytes), which blosc decodes."""
        bounds = self._table()[first:last + 1]
        k = last - first + 1
        size = min(self.nbytes, (last + 1) * self.blocksize) - first * self.blocksize
        lengths = bounds[:, 1] - bounds[:, 0]
        if int(lengths.sum()) > grown_bound(size):
            raise CorruptChunk(f"{self.name}: blosc blocks {first}-{last} take more bytes than they can")
        lo, hi = int(bounds[:, 0].min()), int(bounds[:, 1].max())
        at = BLOSC_HEADER_BYTES + 4 * k
        frame = bytearray(at + int(lengths.sum()))
        if hi - lo <= 2 * lengths.sum():  # (their bytes together, in one read)
            span = self.fetch(lo, hi)
            parts = [memoryview(span)[a - lo:b - lo] for a, b in bounds.tolist()]
        else:
            parts = [self.fetch(a, b) for a, b in bounds.tolist()]
        new_starts = []
        pos = at
        for (a, b), part in zip(bounds.tolist(), parts):
            if len(part) != b - a:
                raise CorruptChunk(f"{self.name}: blosc chunk cut short")
            frame[pos:pos + len(part)] = part
            new_starts.append(pos)
            pos += len(part)
        head = bytearray(self.head)
        head[4:8] = size.to_bytes(4, "little")
        head[12:16] = len(frame).to_bytes(4, "little")
        frame[:BLOSC_HEADER_BYTES] = head
        frame[BLOSC_HEADER_BYTES:at] = np.array(new_starts, "<u4").tobytes()
        out = np.empty(size, np.uint8)
        try:
            numcodecs.blosc.decompress(frame, out)
        except Exception as e:
            raise CorruptChunk(f"{self.name}: cannot decode blosc blocks {first}-{last}: {e}") from None
        self.decoded += size
        return out


def _strides(shape: tuple[int, ...], itemsize: int, order: str) -> list[int]:
    strides = [0] * len(shape)
    step = itemsize
    for d in (range(len(shape) - 1, -1, -1) if order == "C" else range(len(shape))):
        strides[d] = step
        step *= shape[d]
    return strides


def first_byte(shape: tuple[int, ...], itemsize: int, order: str, boxes: list[tuple[slice, ...]]) -> int:
    """The first byte in a chunk of any of its BOXES' elements."""
    strides = _strides(shape, itemsize, order)
    return min(sum(b.start * s for b, s in zip(box, strides)) for box in boxes)


def regions(shape: tuple[int, ...], itemsize: int, order: str, box: tuple[slice, ...], span: int = SPAN_BYTES
            ) -> list[tuple[int, int, tuple[int, ...], tuple[int, ...], tuple[slice, ...]]]:
    """A box of a chunk (SHAPE, elements of ITEMSIZE in ORDER) cut into pieces whose bytes lie
    within SPAN, in increasing order of their bytes: (first byte, stop byte, shape, strides
    of the piece's elements from its first byte, the piece's part of the box as slices of it)."""
    ndim = len(shape)
    strides = _strides(shape, itemsize, order)
    axes = sorted(range(ndim), key=lambda d: -strides[d])  # slowest first
    out: list = []

    def extent(lo_idx: list[int], hi_idx: list[int]) -> tuple[int, int]:
        lo = sum(i * s for i, s in zip(lo_idx, strides))
        return lo, sum((i - 1) * s for i, s in zip(hi_idx, strides)) + itemsize

    def emit(lo_idx: list[int], hi_idx: list[int]) -> None:
        lo, hi = extent(lo_idx, hi_idx)
        out.append((lo, hi, tuple(h - l for l, h in zip(lo_idx, hi_idx)), tuple(strides),
                    tuple(slice(l - b.start, h - b.start) for l, h, b in zip(lo_idx, hi_idx, box))))

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


def fill_sync(dec: RangeDecoder, pieces: list, targets: list[np.ndarray], dtype: np.dtype,
              start: int, budget: int) -> int:
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


def chunk_pieces(shape: tuple[int, ...], dtype: np.dtype, order: str,
                 boxes: list[tuple[slice, ...]], span: int = SPAN_BYTES) -> list[tuple]:
    """Every box's pieces (`regions`), each tagged with its box's number, in increasing order of
    their bytes in the chunk (so that a stream is decoded once for all of them)."""
    pieces = []
    for n, box in enumerate(boxes):
        pieces += [(*r, n) for r in regions(shape, dtype.itemsize, order, box, span)]
    pieces.sort(key=lambda p: p[0])
    return pieces


