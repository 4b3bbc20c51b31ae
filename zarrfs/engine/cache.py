"""A byte-bounded LRU of decoded chunks (and a slot for chunks larger than it), with counters. Used from one thread."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable

import numpy as np

# Chunks larger than the whole budget that are decoded whole (their codecs cannot be decoded a
# range at a time: engine/streamed.py) are kept apart, at most this many: the one being read, so
# that a sequential pass decodes it once. More would let a mount hold several chunks of any size.
OVERSIZE_SLOTS = 1

# A chunk's key: its array's path first (`discard_prefix`), then what names the chunk there.
Key = tuple[str, *tuple[Hashable, ...]]


class ChunkCache:
    """Least-recently-used decoded chunks, at most `max_bytes` of them (by their own size),
    and at most `oversize_slots` chunks larger than `max_bytes` beside them.

    Chunks are stored read-only so a cached array is never changed by a reader.
    Arrays that own no memory (a fill value broadcast to a chunk) cost nothing.
    """

    def __init__(self, max_bytes: int, oversize_slots: int = OVERSIZE_SLOTS) -> None:
        self.max_bytes = max_bytes
        self.used_bytes = 0
        # Bytes of the budget held elsewhere: written chunks not yet stored (writeback.py), which
        # share `cache_size` with the cache so that a long copy keeps the daemon within it.
        self.reserved_bytes = 0
        self.hits = 0
        self.misses = 0
        self.evictions = 0
        self._items: OrderedDict[Key, tuple[np.ndarray, int]] = OrderedDict()
        self.oversize_slots = oversize_slots
        self.oversize_evictions = 0
        self._oversize: OrderedDict[Key, np.ndarray] = OrderedDict()

    @property
    def oversize_bytes(self) -> int:
        """Bytes held by chunks larger than the budget."""
        return sum(arr.nbytes for arr in self._oversize.values())

    @property
    def oversize_held(self) -> int:
        return len(self._oversize)

    def make_room_oversize(self) -> None:
        """Drop the least recently used oversize chunks until one more fits (before decoding one)."""
        while self._oversize and len(self._oversize) >= self.oversize_slots:
            self._oversize.popitem(last=False)
            self.oversize_evictions += 1

    def __len__(self) -> int:
        return len(self._items)

    @staticmethod
    def cost(arr: np.ndarray) -> int:
        """Bytes an array actually holds (0 for broadcast views of a scalar)."""
        return 0 if 0 in arr.strides and arr.size > 1 else arr.nbytes

    def contains(self, key: Key) -> bool:
        """Whether `key` is cached (no counters, no recency change)."""
        return key in self._items or key in self._oversize

    def get(self, key: Key, count: bool = True) -> np.ndarray | None:
        """A cached array (now the most recently used), or None; `count` moves the hit and
        miss counters (lookups that are not reads, such as a shard's index, do not)."""
        item = self._items.get(key)
        if item is None:
            big = self._oversize.get(key)
            if big is None:
                self.misses += count
                return None
            self._oversize.move_to_end(key)
            self.hits += count
            return big
        self._items.move_to_end(key)
        self.hits += count
        return item[0]

    def put(self, key: Key, arr: np.ndarray) -> None:
        """Keep `arr` (made read-only); evict the least recently used until within budget.

        An array larger than the budget goes to the oversize slots instead.
        """
        cost = self.cost(arr)
        if arr.flags.writeable and arr.base is None:
            arr.flags.writeable = False
        self.discard(key)
        if cost > self.max_bytes:
            if self.oversize_slots > 0:
                self._oversize[key] = arr
                while len(self._oversize) > self.oversize_slots:
                    self._oversize.popitem(last=False)
                    self.oversize_evictions += 1
            return
        self._items[key] = (arr, cost)
        self.used_bytes += cost
        self._evict()

    def reserve(self, nbytes: int) -> None:
        """NBYTES of the budget are held elsewhere from now on: the least recently used go until
        the rest fits (the chunk put last stays, as in `put`)."""
        self.reserved_bytes = nbytes
        self._evict()

    def _evict(self) -> None:
        while self.used_bytes + self.reserved_bytes > self.max_bytes and len(self._items) > 1:
            _, (_, old_cost) = self._items.popitem(last=False)
            self.used_bytes -= old_cost
            self.evictions += 1

    def discard_prefix(self, path: str) -> None:
        """Drop every chunk of an array, or of every array below a group (keys are (path, index))."""
        for key in [
            k for k in (*self._items, *self._oversize) if k[0] == path or k[0].startswith(path + "/") or not path
        ]:
            self.discard(key)

    def keys(self) -> list[Key]:
        """Every key held (a copy: the caller may discard while it walks them)."""
        return [*self._items, *self._oversize]

    def discard(self, key: Key) -> bool:
        """Drop KEY's chunk; whether it was held."""
        oversize = self._oversize.pop(key, None)
        item = self._items.pop(key, None)
        if item is not None:
            self.used_bytes -= item[1]
        return item is not None or oversize is not None
