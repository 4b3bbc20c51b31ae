"""Read-ahead: after sequential reads, load the chunks of a window that doubles up to a bound, reset on a seek.

The Prefetch mixin of Engine, and ReadAhead, one reader's state (the package's __init__ owns the tables; docs/CONCURRENCY.md).
"""

from __future__ import annotations

import logging
import math

from ..errors import ZarrfsError
from ..model import ArrayMeta
from ..layouts import ArrayStream

log = logging.getLogger(__name__)

Index = tuple[int, ...]

# Read-ahead of chunks for sequential readers: the window doubles on each sequential read
# and resets on a seek (as mountpoint-s3 and ratarmount do), bounded in bytes and by a
# share of the cache so that prefetched chunks are not evicted before they are read.
PREFETCH_MAX_BYTES = 256 << 20
PREFETCH_CACHE_SHARE = 4


class ReadAhead:
    """The read-ahead state of one reader (an open file): where its next sequential read
    starts, its window in bytes, and the offset up to which read-ahead was already started."""

    __slots__ = ("next_offset", "window", "planned")

    def __init__(self) -> None:
        self.next_offset, self.window, self.planned = -1, 0, 0


class Prefetch:
    """Prefetch for sequential readers (mixed into Engine)."""

    def _read_ahead(self, stream: ArrayStream, offset: int, size: int, state: ReadAhead) -> None:
        """After a sequential read, start loading the chunks of the next window.

        Shards that fit in the window are loaded whole; in a smaller window, only the
        inner chunks the window covers.
        """
        if self._nursery is None or self.prefetch_max_bytes <= 0:
            return
        window, planned = state.window, state.planned
        if offset == state.next_offset:
            window = min(max(window * 2, size), self.prefetch_max_bytes)
        else:
            window, planned = 0, 0
        end = offset + size
        # Only the part of the window not planned by an earlier read is planned now.
        start = max(end, planned)
        stop = min(end + window, stream.size)
        state.next_offset, state.window, state.planned = end, window, max(planned, stop)
        if start >= stop:
            return
        meta = stream.meta
        if (meta.inner is not None and not self.store.ranges_ignored
                and math.prod(meta.chunk_shape) * meta.dtype.itemsize > window):
            stream = stream.for_reads()
            meta = stream.meta
        ahead = []
        for idx in stream.plan(start, stop - start).chunks:
            if self._key(meta, idx) not in self._inflight and not self._known(meta, idx):
                ahead.append(idx)
        if ahead:
            self.counters["prefetched"] += len(ahead)
            self._nursery.start_soon(self._prefetch, meta, ahead)

    async def _prefetch(self, meta: ArrayMeta, idxs: list[Index]) -> None:
        try:
            await self.chunks(meta, idxs)
        except ZarrfsError:
            pass  # reported when a reader asks for these chunks
        except Exception:  # background work must not end the daemon
            log.exception("unexpected error in read-ahead of %s", meta.path or "/")

    # --- writes -------------------------------------------------------------------------
