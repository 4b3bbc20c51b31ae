"""Reads of chunks larger than the cache: only the bytes a read needs are decoded (rangedecode.py), never a whole chunk.

A read of an array whose chunks are larger than the cache budget, of a codec chain that can
be decoded a range at a time (a lone stream compressor or blosc over the plain bytes layout),
copies each chunk's part of it straight out of a decoder of that chunk: a stream is decoded
from its start up to the read's last byte, blosc only in the blocks the read touches. The
decoders are kept, at most STREAMS_MAX for the whole daemon, so that a sequential reader
continues its chunk's stream where its last read left it: each chunk decoded once. Memory
is then bounded by the decoders' windows and their decompressors' state, together at most
STREAMS_MEMORY_BYTES, whatever the chunk's size, decoded or encoded.
A part of the engine (docs/CONCURRENCY.md: the decoder pool).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
from typing import Any, TypeGuard

import numpy as np
import trio

from ..codecs import rangedecode
from ..codecs.rangedecode import BoxPiece
from ..errors import CorruptChunk, ZarrfsError
from ..grid import Index
from ..model import ArrayMeta
from ..repeats import LogOnce
from ..storage.base import BaseStore
from ..views.streams import ArrayStream, ByteStream, plan_bytes
from .loads import Loads
from .revalidate import Revalidation
from .runtime import Runtime
from .tables import ChunkTables, write_unit

log = logging.getLogger(__name__)

# A box of one chunk and where its values go: (the box as slices of the chunk, the target array).
Box = tuple[tuple[slice, ...], np.ndarray]

# Decoders kept or in use at once, across every reader: each holds a window of
# rangedecode.WINDOW_BYTES and its decompressor's state (zstd's window: a few MiB at the
# levels writers use). Four readers of one array, or one reader of a row of four chunks.
STREAMS_MAX = 6
# An array whose row of chunks holds more chunks has as many decoders, up to STREAMS_WIDE_MAX,
# with windows that share STREAMS_WINDOWS_BYTES (at least rangedecode.MIN_WINDOW_BYTES each): a
# sequential reader of it reads every chunk of the row in turn, and each must continue its
# stream (fewer decoders than that, and every read starts every stream again).
STREAMS_WIDE_MAX = 24
STREAMS_WINDOWS_BYTES = 48 << 20
# What every decoder together may hold (windows, decompressors' windows or dictionaries as
# each chunk's header states them, steps in flight): a decoder that does not fit waits for
# others to be given back (idle ones are dropped for it). Holds one zstd frame of the largest
# window allowed with its own window; one decoder alone is never refused for want of room.
STREAMS_MEMORY_BYTES = 144 << 20
# Decoded bytes of one worker call: a read that needs a long stream prefix is decoded in
# steps, each bounded by the `timeout` like any store call, and interruptible between them.
STEP_DECODE_BYTES = 256 << 20


@dataclasses.dataclass(eq=False)
class _Slot:
    """One chunk's decoder and what it was made for. Used by one task (and its worker
    thread) at a time: it is taken out of the pool while used."""

    path: str
    idx: Index
    generation: int  # ChunkTables.generation: a refresh or the TTL makes it stale
    version: int  # the chunk's write version
    window: int = rangedecode.WINDOW_BYTES  # what its decoder keeps of what it decoded last
    dec: Any = None  # made in the worker thread by its first call
    absent: bool = False  # the chunk is not stored
    size: int = 0  # the chunk's stored bytes
    limit: int = 0  # what its decompressor may hold (rangedecode.decoder_limit)
    opened: bool = False  # its chunk's size and decompressor's need are known (_open_slot)
    cost: int = 0  # its part of STREAMS_MEMORY_BYTES, once opened
    reach: int = 0  # while in use: the byte it decodes up to
    released: trio.Event | None = None  # while in use: set when it is given back
    running: int = 0  # its worker calls not yet ended (an abandoned one may still decode)
    orphan: bool | None = None  # given back while a worker still ran: whether to keep it once it ends


def open_chunk_sync(meta: ArrayMeta, store: BaseStore, key: str) -> tuple[int, bytes] | None:
    """A chunk's stored size and first bytes (rangedecode.HEAD_BYTES), None when it is not stored."""
    size = store.size_sync(key)
    if size is None:
        return None
    if size > meta.max_stored_nbytes:
        raise CorruptChunk(
            f"chunk {key}: holds {size} bytes, more than the {meta.max_stored_nbytes} it can legitimately take"
        )
    return size, store.get_range_sync(key, 0, min(size, rangedecode.HEAD_BYTES))


def fill_chunk_sync(
    slot: _Slot,
    meta: ArrayMeta,
    store: BaseStore,
    key: str,
    pieces: list[BoxPiece],
    targets: list[np.ndarray],
    start: int,
    budget: int,
) -> int:
    """A chunk's pieces from START decoded into TARGETS (rangedecode.fill_sync), its decoder
    made first if the slot (opened: open_chunk_sync) has none; -1 when the chunk is not stored."""
    if slot.absent:
        return -1
    if slot.dec is None:
        size = slot.size

        def fetch(a: int, b: int) -> bytes:
            b = min(b, size)
            return store.get_range_sync(key, a, b) if a < b else b""

        slot.dec = rangedecode.decoder(meta.codec, meta.chunk_nbytes, fetch, f"chunk {key}", slot.window, slot.limit)
    stored = meta.codec.array_bytes.stored_dtype(meta.dtype)
    try:
        return rangedecode.fill_sync(slot.dec, pieces, targets, stored, start, budget)
    except ZarrfsError:
        raise
    except Exception as e:  # the decompressors raise many types for corrupt input
        raise CorruptChunk(f"chunk {key}: cannot decode: {type(e).__name__}: {e}") from None


def _streams_max(meta: ArrayMeta) -> int:
    """How many decoders reads of this array may keep: STREAMS_MAX, or for an array whose
    rows of chunks (in C or F order) hold more chunks, that many and two, up to STREAMS_WIDE_MAX."""
    grid = [-(-n // c) for n, c in zip(meta.shape, meta.chunk_shape)]
    across = max(math.prod(grid[1:]), math.prod(grid[:-1])) if grid else 1
    return max(STREAMS_MAX, min(STREAMS_WIDE_MAX, across + 2))


class StreamedReads:
    """Reads of arrays whose chunks are larger than the cache: a pool of chunk decoders."""

    def __init__(self, runtime: Runtime, tables: ChunkTables, loads: Loads, revalidation: Revalidation) -> None:
        self.runtime, self.tables, self.loads, self.revalidation = runtime, tables, loads, revalidation
        self._idle: list[_Slot] = []  # decoders not in use, least recently used first
        self._busy: dict[tuple[str, Index], list[_Slot]] = {}  # decoders in use, by chunk
        self._in_use = 0  # decoders in use (or held by an abandoned worker)
        self._held_bytes = 0  # the decoders' costs (idle, in use, or held by an abandoned worker)
        self._freed = trio.Event()  # set (and replaced) when one is given back, or its cost
        self._streamed_said = LogOnce()  # arrays whose first such read was logged

    def serves(self, stream: ByteStream) -> TypeGuard[ArrayStream]:
        """Whether reads of STREAM decode ranges of its chunks instead of whole chunks: an
        array's own byte stream (any view of it, or one chunk), its chunks larger than the
        cache and stored one key each, of a chain that can be decoded a range at a time."""
        if not stream.is_array_stream:
            return False
        meta = stream.meta
        if meta.chunk_nbytes <= self.tables.cache.max_bytes or meta.source is not None or meta.dtype.hasobject:
            return False
        return rangedecode.supported(meta.codec)

    async def read(self, stream: ArrayStream, offset: int, size: int) -> bytes | memoryview:
        """Bytes [offset, offset+size) of a `streamed` stream."""
        plan = stream.plan(offset, size)
        self.runtime.counters["reads"] += 1
        self.runtime.counters["streamed_reads"] += 1
        if plan.take_bytes == 0:
            return plan.header_part
        meta = stream.meta
        if self._streamed_said.first(meta.path):
            log.info(
                "%s: chunks decode to %d bytes, more than cache_size (%d): reads decode only the "
                "bytes they need, never a whole chunk",
                meta.path or "/",
                meta.chunk_nbytes,
                self.tables.cache.max_bytes,
            )
        self.revalidation.check_layout(meta)
        await self.revalidation.check_cached(meta)
        out = np.empty(stream.element_bytes(plan), np.uint8)
        errors: list[ZarrfsError] = []

        async def one(idx: Index, parts: list[Box]) -> None:
            try:
                await self._copy_streamed_chunk(meta, idx, parts)
            except ZarrfsError as e:
                errors.append(e)

        async with trio.open_nursery() as nursery:
            for idx, parts in stream.chunk_regions(plan, out).items():
                nursery.start_soon(one, idx, parts)
        if errors:
            raise errors[0]
        return plan_bytes(plan, out)

    async def read_boxes(self, meta: ArrayMeta, idx: Index, parts: list[Box]) -> int:
        """Copy boxes of one chunk of an array whose reads are `streamed` into their targets (PARTS:
        (the box as slices of the chunk, an array of its shape)), decoding only what they need
        (a preview's pixels); the bytes decoded."""
        await self.revalidation.check_cached(meta)
        return await self._copy_streamed_chunk(meta, idx, parts)

    async def _copy_streamed_chunk(self, meta: ArrayMeta, idx: Index, parts: list[Box]) -> int:
        """Copy regions of one chunk into their targets: from the chunk itself when it is held
        by a writer or cached, else decoded by a decoder of the chunk; the bytes decoded."""
        if self._copy_whole(meta, idx, parts):
            return 0
        key = meta.chunk_key(idx)
        order = meta.codec.array_bytes.order
        stored = meta.codec.array_bytes.stored_dtype(meta.dtype)
        boxes = [region for region, _ in parts]
        targets = [target for _, target in parts]
        lo = rangedecode.first_byte(meta.chunk_shape, stored.itemsize, order, boxes)
        most = _streams_max(meta)
        while True:  # (no await between the last check and the slot's registration)
            ahead = self._busy_ahead(meta, idx, lo)
            if ahead is not None and ahead.released is not None:  # (set while it is in use)
                await ahead.released.wait()  # then continue its stream instead of starting another
            elif self._in_use >= most:
                await self._freed.wait()
            else:
                break
        slot = self._take_slot(meta, idx, lo, most)
        pieces = rangedecode.chunk_pieces(meta.chunk_shape, stored, order, boxes, rangedecode.span_of(slot.window))
        slot.reach, slot.released = max(p[1] for p in pieces), trio.Event()
        busy = self._busy.setdefault((meta.path, idx), [])
        busy.append(slot)
        self._in_use += 1
        keep = False
        try:
            if not slot.opened:
                await self._open_slot(slot, meta, key)
            # (after the last await: a write that ended meanwhile is seen, and a chunk that
            # became cached is copied, not decoded)
            if self._copy_whole(meta, idx, parts):
                keep = slot.dec is not None or slot.absent
                return 0
            k = decoded = 0
            while 0 <= k < len(pieces):
                before = 0 if slot.dec is None else slot.dec.decoded
                slot.running += 1
                k = await self.runtime.run_io(
                    fill_chunk_sync,
                    slot,
                    meta,
                    self.runtime.store,
                    key,
                    pieces,
                    targets,
                    k,
                    STEP_DECODE_BYTES,
                    key=key,
                    cpu=True,
                    ended=functools.partial(self._worker_ended, slot),
                )
                step = 0 if slot.dec is None else slot.dec.decoded - before
                self.runtime.counters["bytes_decoded"] += step
                decoded += step
            self.runtime.counters["chunk_gets"] += 1
            keep = True
        except ZarrfsError as e:
            self.runtime.count_error(e, key)
            raise
        finally:
            busy.remove(slot)
            if not busy:
                del self._busy[(meta.path, idx)]
            slot.released.set()
            if slot.running:  # its abandoned worker may still decode: counted until it ends
                slot.orphan = keep
            else:  # (a failed one may be broken)
                self._give_back(slot, keep)
        if k < 0:
            fill = self.loads.fill_chunk(meta)  # (raises when the fill value cannot be read)
            for region, target in parts:
                target[...] = fill[region]
        return decoded

    def _copy_whole(self, meta: ArrayMeta, idx: Index, parts: list[Box]) -> bool:
        """Copy the regions from the chunk itself if a writer holds it or it is cached."""
        whole = self.tables.lookup(meta, idx, count=False)
        if whole is None:
            return False
        for region, target in parts:
            target[...] = whole[region]
        return True

    async def _open_slot(self, slot: _Slot, meta: ArrayMeta, key: str) -> None:
        """A new slot's chunk size and decompressor's need read from the store, then its cost
        taken from STREAMS_MEMORY_BYTES once it fits (idle decoders dropped for it, least
        recently used first; else waiting for others to be given back)."""
        opened = await self.runtime.run_io(open_chunk_sync, meta, self.runtime.store, key, key=key)
        cost = 0
        if opened is None:
            slot.absent = True
        else:
            slot.size, head = opened
            slot.limit = rangedecode.decoder_limit(meta.codec, head, f"chunk {key}")
            window = slot.window if rangedecode.is_stream(meta.codec) else 0
            cost = window + rangedecode.STATE_BASE_BYTES + slot.limit
        while True:
            while self._idle and self._held_bytes + cost > STREAMS_MEMORY_BYTES:
                self._drop_idle(self._idle[0])
            if self._held_bytes + cost <= STREAMS_MEMORY_BYTES or not self._held_bytes:
                break
            await self._freed.wait()
        slot.opened, slot.cost = True, cost
        self._held_bytes += cost
        slot.version = self.tables.version(write_unit(meta, slot.idx))  # (what it will decode)

    def _worker_ended(self, slot: _Slot) -> None:
        """A worker call of SLOT ended (in the engine's thread): an orphan slot is given back."""
        slot.running -= 1
        if slot.orphan is not None and not slot.running:
            keep, slot.orphan = slot.orphan, None
            self._give_back(slot, keep)

    def _give_back(self, slot: _Slot, keep: bool) -> None:
        """A slot no longer in use: kept idle (KEEP), or dropped with its cost."""
        self._in_use -= 1
        if keep:
            self._idle.append(slot)
        else:
            self._held_bytes -= slot.cost
        self._freed.set()
        self._freed = trio.Event()

    def _drop_idle(self, slot: _Slot) -> None:
        self._idle.remove(slot)
        self._held_bytes -= slot.cost

    def _busy_ahead(self, meta: ArrayMeta, idx: Index, lo: int) -> _Slot | None:
        """A stream decoder of this chunk in use by another read that will then reach byte LO
        without starting again: a reader following another (or the kernel's reads of one file
        arriving together) waits for it rather than decoding the same prefix again."""
        if not rangedecode.is_stream(meta.codec):
            return None  # (blosc decodes only the blocks it needs: nothing to continue)
        for slot in self._busy.get((meta.path, idx), ()):
            if not slot.absent and lo >= slot.reach - rangedecode.back_of(slot.window):  # (its window keeps that)
                return slot
        return None

    def _take_slot(self, meta: ArrayMeta, idx: Index, lo: int, most: int) -> _Slot:
        """The idle decoder of this chunk that reaches byte LO with the least work, if one does
        without starting again (another reader's may be far ahead); else a new one (the least
        recently used idle ones dropped while MOST or more would be kept)."""
        version = self.tables.version(write_unit(meta, idx))
        for stale in [
            s
            for s in self._idle
            if s.generation != self.tables.generation or s.version != self.tables.version((s.path, s.idx))
        ]:
            self._drop_idle(stale)
        best, cost = None, None
        for slot in self._idle:
            if slot.path == meta.path and slot.idx == idx and (slot.absent or slot.dec is not None):
                c = 0 if slot.absent else slot.dec.cost(lo)
                if c is not None and (cost is None or c < cost):
                    best, cost = slot, c
        if best is not None:
            self._idle.remove(best)
            return best
        while self._idle and len(self._idle) + self._in_use >= most:
            self._drop_idle(self._idle[0])
        window = max(rangedecode.MIN_WINDOW_BYTES, min(rangedecode.WINDOW_BYTES, STREAMS_WINDOWS_BYTES // most))
        return _Slot(meta.path, idx, self.tables.generation, version, window)

    def drop(self) -> None:
        """Forget every idle decoder (their chunks may have changed)."""
        while self._idle:
            self._drop_idle(self._idle[0])

    def forget(self, path: str) -> None:
        """Forget the idle decoders of an array, or of every array below a group."""
        for slot in [s for s in self._idle if s.path == path or s.path.startswith(path + "/")]:
            self._drop_idle(slot)  # (their memory is given back too)

    @property
    def in_use(self) -> int:
        """Decoders in use (or held by an abandoned worker)."""
        return self._in_use

    @property
    def held_bytes(self) -> int:
        """The decoders' costs against STREAMS_MEMORY_BYTES."""
        return self._held_bytes
