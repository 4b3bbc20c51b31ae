"""Spares: decoded chunks a sequential reader has left behind give their memory to the next decodes.

A cold `cat` of a compressed array decodes every chunk into fresh memory, and the kernel fills
fresh pages on first touch: 308k page faults and about 0.5 s of system time per GiB of blosc
chunks here, a third of what the whole read took. Yet once a reader of a read-only mount is
past a chunk, the kernel's page cache holds the file's bytes, and the decoded chunk is rarely
wanted again. So on read-only mounts of local stores, chunks that decode into a buffer of
their own size (a lone blosc or zstd compressor) are decoded into buffers of this engine's
(`decode_buffer`), uncompressed chunks read into them, and a sequential reader gives back the chunks
it has passed (`release_behind`): each leaves the cache, and its buffer, if nothing else holds
the chunk or a view of it (reference counts: a reader's plan, a band being assembled, a reply
being sent), is kept for the next decode of that size, at most SPARE_MAX_BYTES of them.
Mixed into Engine (docs/CONCURRENCY.md); used from the trio thread only.
"""

from __future__ import annotations

import contextlib
import mmap
import sys
import weakref
from typing import Any

import numpy as np

from ...codecs.chain import decodes_into, reads_into
from ...model import ArrayMeta

SPARE_MAX_BYTES = 128 << 20  # buffers kept for reuse, all sizes together
SPARE_MIN_BYTES = 256 << 10  # smaller chunks cost few page faults: decoded as before
# Buffers alive at once, at most: each is a mapping of its own, and a process has 65,530 by
# default (vm.max_map_count) for everything, malloc's and numpy's large allocations included.
BUFFERS_MAX = 8192
# sys.getrefcount of a released chunk and of its buffer when nothing else holds them: the
# cache's entry (or the chunk's reference to its buffer), the local name, the call's argument.
SOLE = 3


# Buffers of at least this size are asked to be backed by huge pages (private_buffer).
HUGE_PAGE_BYTES = 2 << 20


def private_buffer(nbytes: int) -> np.ndarray:
    """NBYTES of fresh memory (uint8) in a mapping of its own, private as malloc's are (the
    default, shared, faults through tmpfs: 1 GiB took 0.75-0.84 s to touch, against 0.53-0.60 s).
    OSError when out of memory.

    A buffer of HUGE_PAGE_BYTES or more starts at a huge page boundary of a mapping one huge page
    longer, advised to use huge pages (MADV_HUGEPAGE; the kernel's `enabled` setting still
    decides): first touched, it takes a fault per 2 MiB instead of per 4 KiB, and decoding into
    it and copying out of it miss the TLB less. Cold `cat` of the 1 GiB blosc array, interleaved
    pairs: 0.79-0.87 -> 0.74-0.87 s (daemon CPU 1.00-1.09 -> 0.91-1.05 s); with every free block
    of 2 MiB or more taken by other processes (most free memory in 4 KiB pieces), 0.73-1.88 ->
    0.66-1.61 s, faster in each of 6 pairs, and no compaction stall (/proc/vmstat compact_stall)
    during any timed read. An earlier version of this file saw numpy's huge-page allocations
    stall on compaction; numpy asks for them for every large array, fresh each time, where these
    buffers are reused (spares), so few are ever faulted in."""
    if nbytes < HUGE_PAGE_BYTES:
        return np.frombuffer(mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS), np.uint8)
    region = mmap.mmap(-1, nbytes + HUGE_PAGE_BYTES, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    with contextlib.suppress(AttributeError, OSError):  # (no MADV_HUGEPAGE: not Linux, or THP built out)
        region.madvise(mmap.MADV_HUGEPAGE)
    start = np.frombuffer(region, np.uint8, count=0).ctypes.data
    return np.frombuffer(region, np.uint8, count=nbytes, offset=-start % HUGE_PAGE_BYTES)


class Spares:
    """Decode buffers given back by sequential readers (mixed into Engine)."""

    def _init_spares(self) -> None:
        self.recycle_enabled = False  # set by the daemon: read-only mounts of local stores
        self._spares: dict[int, list[np.ndarray]] = {}
        self._spare_bytes = 0
        self._buffers = 0  # alive (cached chunks' and spare ones)

    def _recycles(self, meta: ArrayMeta) -> bool:
        return (self.recycle_enabled and meta.source is None and meta.chunk_nbytes >= SPARE_MIN_BYTES
                and (decodes_into(meta.codec) or reads_into(meta.codec)))

    def decode_buffer(self, meta: ArrayMeta) -> np.ndarray | None:
        """A buffer to decode a chunk of META into (a spare one when there is), or None: decode as usual."""
        if not self._recycles(meta):
            return None
        free = self._spares.get(meta.chunk_nbytes)
        if free:
            self._spare_bytes -= meta.chunk_nbytes
            self.counters["buffers_reused"] += 1
            return free.pop()
        if self._buffers >= BUFFERS_MAX:
            return None
        try:
            buf = private_buffer(meta.chunk_nbytes)
        except OSError:  # out of memory: the codec allocates
            return None
        self._buffers += 1
        weakref.finalize(buf, self._buffer_freed)
        return buf

    def _buffer_freed(self) -> None:
        self._buffers -= 1

    def release_behind(self, stream: Any, state: Any, upto: int, chunks: Any) -> None:
        """A sequential reader whose bytes up to UPTO are served (or assembled), and whose
        latest read or band used CHUNKS: give back the chunks wholly before UPTO."""
        if not stream.is_array_stream or stream.chunk is not None or not self._recycles(stream.meta):
            return
        held = state.held  # chunk -> where it ends in the stream
        for idx in chunks:
            if idx not in held:
                end = held[idx] = stream.chunk_end(idx)
                state.held_next = min(state.held_next, end)
        if upto < state.held_next:  # (chunks as tall as the array: none passed until the end)
            return
        for idx in [i for i, end in held.items() if end <= upto]:
            del held[idx]
            self._recycle(stream.meta, idx)
        state.held_next = min(held.values(), default=1 << 63)

    def _recycle(self, meta: ArrayMeta, idx: Any) -> None:
        key = self._key(meta, idx)
        arr = self.cache.get(key, count=False)
        if arr is None:
            return
        buf = arr.base
        if (sys.getrefcount(arr) != SOLE or type(buf) is not np.ndarray or type(buf.base) is not memoryview
                or type(buf.base.obj) is not mmap.mmap or sys.getrefcount(buf) != SOLE):
            return  # not ours, or held elsewhere: it stays cached
        self.cache.discard(key)
        del arr
        if sys.getrefcount(buf) != SOLE - 1 or self._spare_bytes + buf.nbytes > SPARE_MAX_BYTES:
            return
        self._spares.setdefault(buf.nbytes, []).append(buf)
        self._spare_bytes += buf.nbytes
