"""A byte-bounded LRU of decoded chunks, with hit/miss/eviction counters. Used from one thread."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable

import numpy as np


class ChunkCache:
    """Least-recently-used decoded chunks, at most `max_bytes` of them (by their own size).

    Chunks are stored read-only so a cached array is never changed by a reader.
    Arrays that own no memory (a fill value broadcast to a chunk) cost nothing.
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.used_bytes = 0
        self.hits = 0
        self.misses = 0
        self.evictions = 0
        self._items: OrderedDict[Hashable, tuple[np.ndarray, int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._items)

    @staticmethod
    def cost(arr: np.ndarray) -> int:
        """Bytes an array actually holds (0 for broadcast views of a scalar)."""
        return 0 if 0 in arr.strides and arr.size > 1 else arr.nbytes

    def contains(self, key: Hashable) -> bool:
        """Whether `key` is cached (no counters, no recency change)."""
        return key in self._items

    def get(self, key: Hashable, count: bool = True) -> np.ndarray | None:
        """A cached array (now the most recently used), or None; `count` moves the hit and
        miss counters (lookups that are not reads, such as a shard's index, do not)."""
        item = self._items.get(key)
        if item is None:
            self.misses += count
            return None
        self._items.move_to_end(key)
        self.hits += count
        return item[0]

    def put(self, key: Hashable, arr: np.ndarray) -> None:
        """Keep `arr` (made read-only); evict the least recently used until within budget."""
        cost = self.cost(arr)
        if cost > self.max_bytes:
            return
        if arr.flags.writeable and arr.base is None:
            arr.flags.writeable = False
        self.discard(key)
        self._items[key] = (arr, cost)
        self.used_bytes += cost
        while self.used_bytes > self.max_bytes:
            _, (_, old_cost) = self._items.popitem(last=False)
            self.used_bytes -= old_cost
            self.evictions += 1

    def discard_prefix(self, path: str) -> None:
        """Drop every chunk of an array, or of every array below a group (keys are (path, index))."""
        for key in [k for k in self._items if k[0] == path or k[0].startswith(path + "/") or not path]:
            self.discard(key)

    def discard(self, key: Hashable) -> None:
        item = self._items.pop(key, None)
        if item is not None:
            self.used_bytes -= item[1]
