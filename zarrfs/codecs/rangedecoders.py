"""Decoders of byte ranges of one chunk: a compressed stream decoded from its start with a window of its output kept, blosc by blocks.

The encoded bytes are read from the store a step at a time (`Fetch`): memory does not grow
with the chunk, encoded or decoded. Pure and synchronous; a decoder is used by one thread at
a time. rangedecode.py chooses a decoder for a chain and cuts reads into pieces.
"""

from __future__ import annotations

import bz2
import lzma
import zlib
from collections.abc import Callable
from typing import Any

import numcodecs.blosc
import numpy as np

from ..errors import CorruptChunk
from .bounded import grown_bound, is_zlib_stream

try:  # zstd frames decoded as a stream (numcodecs' Zstd decodes whole frames only)
    import zstandard as zstandard  # (rangedecode.py asks whether it is there)
except ImportError:  # then zstd chunks larger than the cache are decoded whole
    zstandard = None  # type: ignore[assignment]

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
BLOSC_HEADER_BYTES = 16
BLOSC_MEMCPYED = 0x2
# A blosc chunk's table of block starts is read whole, once: refused past this (blocks of
# 256 bytes in a 2 GiB chunk), not read at a hostile header's word.
BLOSC_TABLE_MAX_BYTES = 32 << 20
# zlib's wbits that read a gzip member or a zlib stream, whichever header it finds.
ZLIB_OR_GZIP_WBITS = 32 + zlib.MAX_WBITS

Fetch = Callable[[int, int], bytes]  # encoded bytes [start, end) of the chunk (b"" past its end)


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

    def __init__(
        self,
        codec: Any,
        nbytes: int,
        fetch: Fetch,
        name: str,
        window_bytes: int = WINDOW_BYTES,
        stage: Any = None,
        limit: int | None = None,
    ) -> None:
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
            self.reader = dctx.stream_reader(
                self.source,  # type: ignore[arg-type]  # (file-like: zstandard only calls read)
                read_size=self.source.step,
                read_across_frames=True,
            )
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
            raise CorruptChunk(f"{self.name}: compressed stream ends after {self.pos} bytes, {self.nbytes} expected")
        k = len(out)
        if self.pos + k > self.nbytes:
            raise CorruptChunk(f"{self.name}: decodes to more than the {self.nbytes} bytes expected")
        if self.held + k > len(self.window):  # keep the last half (or from KEEP_FROM, if more)
            keep = min(len(self.window) - k, self.held, max(self.back, self.pos - keep_from))
            self.window[:keep] = self.window[self.held - keep : self.held]
            self.held = keep
        self.window[self.held : self.held + k] = np.frombuffer(out, np.uint8)
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
        return self.window.data[start : start + hi - lo]


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
        declared, self.blocksize, self.cbytes = (int.from_bytes(head[i : i + 4], "little") for i in (4, 8, 12))
        if declared != nbytes:
            raise CorruptChunk(f"{name}: blosc header says {declared} bytes, expected {nbytes}")
        if self.blocksize <= 0 or self.cbytes > grown_bound(nbytes):
            raise CorruptChunk(f"{name}: blosc header is not valid (blocksize {self.blocksize}, {self.cbytes} bytes)")
        self.nblocks = -(-nbytes // self.blocksize)
        self.kept_at, self.kept = 0, np.empty(0, np.uint8)  # the blocks decoded last, from byte kept_at
        self.bounds: np.ndarray | None = None  # (start, end) of each block's encoded bytes

    def cost(self, lo: int) -> int | None:
        return 0

    def read(self, lo: int, hi: int) -> memoryview:
        self._check(lo, hi)
        if self.kept_at <= lo and hi <= self.kept_at + len(self.kept):
            return self.kept.data[lo - self.kept_at : hi - self.kept_at]
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
            out[: kept_end - lo] = self.kept[lo - self.kept_at :]
            self._keep(kept_end // self.blocksize, last)
            out[kept_end - lo :] = self.kept[kept_end - self.kept_at : hi - self.kept_at]
            return out.data
        self._keep(first, last)
        return self.kept.data[lo - self.kept_at : hi - self.kept_at]

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
                raise CorruptChunk(
                    f"{self.name}: blosc chunk of {self.nblocks} blocks, more than "
                    f"{BLOSC_TABLE_MAX_BYTES // 4} (blocksize {self.blocksize})"
                )
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
        bounds = self._table()[first : last + 1]
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
            parts: list[bytes | memoryview] = [memoryview(span)[a - lo : b - lo] for a, b in bounds.tolist()]
        else:
            parts = [self.fetch(a, b) for a, b in bounds.tolist()]
        new_starts = []
        pos = at
        for (a, b), part in zip(bounds.tolist(), parts):
            if len(part) != b - a:
                raise CorruptChunk(f"{self.name}: blosc chunk cut short")
            frame[pos : pos + len(part)] = part
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
