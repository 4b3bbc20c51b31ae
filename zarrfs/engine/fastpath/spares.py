"""Spares: decoded chunks a sequential reader has left behind give their memory to the next decodes.

A cold `cat` of a compressed array decodes every chunk into fresh memory, and the kernel fills
fresh pages on first touch: a large share of the whole read's time (docs/PERFORMANCE.md). Yet
once a reader of a read-only mount is past a chunk, the kernel's page cache holds the file's
bytes, and the decoded chunk is rarely wanted again. So on read-only mounts of stores whose
chunks lie in files (`chunk_files`: local stores, local Icechunk repositories read by 2.x),
chunks that decode into a buffer of their own size (a lone blosc or zstd compressor) are
decoded into buffers of this engine's (`decode_buffer`), uncompressed chunks read into them,
and a sequential reader gives back the chunks it has passed (`release_behind`): each leaves the
cache, and its buffer, if nothing else holds the chunk or a view of it (reference counts: a
reader's plan, a band being assembled, a reply being sent), is kept for the next decode of that
size, at most SPARE_MAX_BYTES of them.

Stores on local disk whose chunks come in buffers of their own (a local Icechunk repository
read by icechunk 1.x: no file to read into ours) drop behind instead: a chunk a reader has
passed leaves the cache, and the allocator gives its memory to the next loads
(daemon/allocator.py keeps it for them).
A part of the engine (docs/CONCURRENCY.md); used from the trio thread only.
"""

from __future__ import annotations

import mmap
import sys
import weakref
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import numpy as np

from ...codecs.chain import decodes_into, reads_into
from ...grid import Index
from ...model import ArrayMeta
from ..loads import DecodeBuffers
from ..memory import private_buffer
from ..runtime import Runtime
from ..tables import ChunkTables, cache_key
from .gates import SPARE_MIN_BYTES

if TYPE_CHECKING:
    from ..readahead import ReadAhead

__all__ = ["Spares", "private_buffer"]

SPARE_MAX_BYTES = 128 << 20  # buffers kept for reuse, all sizes together
# Buffers alive at once, at most: each is a mapping of its own, and a process has 65,530 by
# default (vm.max_map_count) for everything, malloc's and numpy's large allocations included.
BUFFERS_MAX = 8192
# sys.getrefcount of a released chunk and of its buffer when nothing else holds them: the
# cache's entry (or the chunk's reference to its buffer), the local name, the call's argument.
SOLE = 3


class Spares(DecodeBuffers):
    """Decode buffers given back by sequential readers (ENABLED: read-only mounts of stores whose
    chunks lie in files), or the chunks they passed dropped (DROP_BEHIND)."""

    def __init__(self, runtime: Runtime, tables: ChunkTables, enabled: bool, drop_behind: bool = False) -> None:
        self.runtime, self.tables, self.enabled, self.drop_behind = runtime, tables, enabled, drop_behind
        self._spares: dict[int, list[np.ndarray]] = {}
        self._spare_bytes = 0
        self._buffers = 0  # alive (cached chunks' and spare ones)

    def _recycles(self, meta: ArrayMeta) -> bool:
        return (
            self.enabled
            and meta.source is None
            and meta.chunk_nbytes >= SPARE_MIN_BYTES
            and (decodes_into(meta.codec) or reads_into(meta.codec))
        )

    def decode_buffer(self, meta: ArrayMeta) -> np.ndarray | None:
        """A buffer to decode a chunk of META into (a spare one when there is), or None: decode as usual."""
        if not self._recycles(meta):
            return None
        free = self._spares.get(meta.chunk_nbytes)
        if free:
            self._spare_bytes -= meta.chunk_nbytes
            self.runtime.counters["buffers_reused"] += 1
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

    def release_behind(self, stream: Any, state: ReadAhead, upto: int, chunks: Iterable[Index]) -> None:
        """A sequential reader whose bytes up to UPTO are served (or assembled), and whose
        latest read or band used CHUNKS: give back (or drop) the chunks wholly before UPTO."""
        if getattr(stream, "chunk_end", None) is None or stream.chunk is not None:
            return  # a stream that cannot say where a chunk ends (a slice), or one chunk's file
        if not (self.drop_behind or self._recycles(stream.meta)):
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

    def _recycle(self, meta: ArrayMeta, idx: Index) -> None:
        key = cache_key(meta, idx)
        if self.drop_behind:  # the store's own buffer: freed once its last holder lets go
            if self.tables.cache.discard(key):
                self.runtime.counters["chunks_dropped"] += 1
            return
        arr = self.tables.cache.get(key, count=False)
        if arr is None:
            return
        buf = arr.base
        if (
            sys.getrefcount(arr) != SOLE
            or type(buf) is not np.ndarray
            or not isinstance(buf.base, memoryview)  # (memoryview has no subclasses)
            or type(buf.base.obj) is not mmap.mmap
            or sys.getrefcount(buf) != SOLE
        ):
            return  # not ours, or held elsewhere: it stays cached
        self.tables.cache.discard(key)
        del arr
        if sys.getrefcount(buf) != SOLE - 1 or self._spare_bytes + buf.nbytes > SPARE_MAX_BYTES:
            return
        self._spares.setdefault(buf.nbytes, []).append(buf)
        self._spare_bytes += buf.nbytes
