"""Read-ahead: after sequential reads, load the chunks of a window that doubles up to a bound, reset on a seek.

Prefetch, a part of the engine, and ReadAhead, one reader's state (tables.py: the tables it reads).
"""

from __future__ import annotations

import logging
import math
from typing import Any, Protocol

import numpy as np

from ..errors import ZarrfsError
from ..grid import Index
from ..model import ArrayMeta
from ..storage.base import BaseStore
from ..views.streams import ByteStream, array_stream
from .cache import ChunkCache
from .runtime import Runtime
from .tables import ChunkTables


class ChunkLoads(Protocol):
    """What read-ahead asks of the engine's loads (loads.Loads): chunks loaded, shared with readers."""

    async def chunks(
        self, meta: ArrayMeta, wanted: tuple[Index, ...] | list[Index], whole: bool = False
    ) -> dict[Index, np.ndarray]: ...


class WholeShards(Protocol):
    """Whether a sequential reader of a stream loads its shards whole (fastpath/shards.ShardReads)."""

    def whole(self, stream: ByteStream) -> bool: ...


log = logging.getLogger(__name__)

# Read-ahead of chunks for sequential readers: the window doubles on each sequential read
# and resets on a seek (as mountpoint-s3 and ratarmount do), bounded in bytes and by a
# share of the cache so that prefetched chunks are not evicted before they are read.
PREFETCH_MAX_BYTES = 256 << 20
PREFETCH_CACHE_SHARE = 4
# A local store's reads take no round trip: its window is smaller, two rows of chunks of a large
# array, each decoded into memory of its own. One row left the decoding threads waiting at the
# end of each row (the next row was asked for only once the reader was in it); more rows cost
# memory and page faults for no speed (docs/PERFORMANCE.md).
LOCAL_PREFETCH_MAX_BYTES = 128 << 20
# A store on local disk whose chunks come in buffers of its own (an Icechunk repository): its
# readers drop the chunks they pass (spares.py), and the memory its loads cycle through is this
# window and the chunks a reader is in; the less of it, the more is reused rather than fresh
# (daemon/allocator.py keeps freed memory for them).
OWN_BUFFERS_PREFETCH_MAX_BYTES = 32 << 20


class ReadAhead:
    """The read-ahead state of one reader (an open file): where its next sequential read
    starts, its window in bytes, and the offset up to which read-ahead was already started;
    its bands by number and its band buffers not in use (bands.py); the chunks it has used
    and not yet passed (spares.py)."""

    __slots__ = ("next_offset", "window", "planned", "planned_row", "bands", "spare", "held", "held_next")

    def __init__(self) -> None:
        self.next_offset, self.window, self.planned = -1, 0, 0
        # (stream, generation, row of chunks) whose every chunk the window asked for
        self.planned_row: tuple[ByteStream, int, int] | None = None
        self.bands: dict[int, Any] = {}  # bands.Band by number (the core never imports fastpath/)
        self.spare: list[np.ndarray] = []
        self.held: dict[
            Index, int
        ] = {}  # chunks its sequential reads used and have not passed, and where they end (spares.py)
        self.held_next = 1 << 63  # where the first of them ends


def window_bound(store: BaseStore, cache: ChunkCache) -> int:
    """Read-ahead's bound by default: by the store's kind, and a share of the cache."""
    if store.chunk_files:  # (chunks read from files, into buffers of ours)
        bound = LOCAL_PREFETCH_MAX_BYTES
    elif store.on_local_disk:
        bound = OWN_BUFFERS_PREFETCH_MAX_BYTES
    else:
        bound = PREFETCH_MAX_BYTES
    return min(bound, cache.max_bytes // PREFETCH_CACHE_SHARE)


class Prefetch:
    """Prefetch for sequential readers: chunks of a window ahead of each, loaded in the background."""

    def __init__(
        self, runtime: Runtime, tables: ChunkTables, loads: ChunkLoads, shards: WholeShards, max_bytes: int
    ) -> None:
        self.runtime, self.tables, self.loads, self.shards = runtime, tables, loads, shards
        self.max_bytes = max_bytes  # the window's bound

    def read_ahead(self, stream: ByteStream, offset: int, size: int, state: ReadAhead, sequential: bool) -> None:
        """After a sequential read (the reader's previous read ended at `offset`), start loading
        the chunks of the next window.

        Shards that fit in the window are loaded whole; in a smaller window, only the
        inner chunks the window covers. A sequential reader of a remote store
        (ShardReads.whole) gets every shard the read and the window touch read whole, and
        this is called before the read's own loads, so that they share one request.
        """
        if not self.runtime.running or self.max_bytes <= 0:
            return
        if (stream.meta.inner or stream.meta).chunk_nbytes > self.tables.cache.max_bytes:
            return  # one such chunk decoded at a time: one ahead would evict the one being read
        whole = sequential and self.shards.whole(stream)
        window, planned = state.window, state.planned
        if sequential:
            # Reading whole shards, the window is at least one row of them (in the stream's order)
            # ahead: one shard ahead left the next row's fetch to start only at the next read.
            least = stream.chunk_row_bytes() if whole and array_stream(stream) else size
            window = min(max(window * 2, least), self.max_bytes)
        else:
            window, planned = 0, 0
            state.planned_row = None  # what it asked for behind or ahead may be gone: ask again
        end = offset + size
        # Only the part of the window not planned by an earlier read is planned now (whole
        # shards: the read's own part too).
        start = max(offset if whole else end, planned)
        stop = min(end + window, stream.size)
        state.window, state.planned = window, max(planned, stop)  # next_offset: set by the read as it starts
        if start >= stop:
            return
        if whole:
            self._shards_ahead(stream, start, stop)
            return
        meta = stream.meta
        if (
            meta.inner is not None
            and not self.runtime.store.ranges_ignored
            and math.prod(meta.chunk_shape) * meta.dtype.itemsize > window
        ):
            stream = stream.for_reads()
            meta = stream.meta
        # A window that grows inside a row of chunks a whole row of which it already covered
        # asks for no chunk that was not asked for (unless cached chunks were dropped since):
        # the plan of its new part is skipped (a large read plans a chunk per chunk column).
        last = stream.last_chunk_row(start, stop)
        if last is not None and last[1] and state.planned_row == (stream, self.tables.generation, last[0]):
            return
        state.planned_row = (stream, self.tables.generation, last[0]) if last is not None and last[2] else None
        ahead = []
        for idx in stream.plan(start, stop - start).chunks:
            if not self.tables.loading(meta, idx) and not self.tables.known(meta, idx):
                ahead.append(idx)
        if ahead:
            self.runtime.counters["prefetched"] += len(ahead)
            self.runtime.start_soon(self._prefetch, meta, ahead)

    def _shards_ahead(self, stream: ByteStream, start: int, stop: int) -> None:
        """Start loading every inner chunk not yet loaded or in flight of the shards that bytes
        [start, stop) touch, each shard read whole (one request for all its batches)."""
        inner = stream.for_reads().meta
        ahead = []
        for shard in stream.plan(start, stop - start).chunks:
            if not self.tables.known(stream.meta, shard):
                ahead += [
                    idx
                    for idx in inner.source.inner_of(shard)
                    if not self.tables.loading(inner, idx) and not self.tables.known(inner, idx)
                ]
        if ahead:
            self.runtime.counters["prefetched"] += len(ahead)
            self.runtime.start_soon(self._prefetch, inner, ahead, True)

    async def _prefetch(self, meta: ArrayMeta, idxs: list[Index], whole: bool = False) -> None:
        """Load chunks in the background; their errors reach the readers that ask for them."""
        try:
            await self.loads.chunks(meta, idxs, whole)
        except ZarrfsError:
            pass  # reported when a reader asks for these chunks
        except Exception:  # background work must not end the daemon
            log.exception("unexpected error in read-ahead of %s", meta.path or "/")
