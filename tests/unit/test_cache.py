"""The decoded-chunk cache: byte budget, LRU order, oversize slots, counters."""

import numpy as np

from zarrfs.engine.cache import ChunkCache


def chunk(n: int) -> np.ndarray:
    return np.zeros(n, "u1")


def test_lru_within_budget():
    cache = ChunkCache(300)
    for i in range(3):
        cache.put(("a", (i,)), chunk(100))
    assert cache.get(("a", (0,))) is not None  # now the most recently used
    cache.put(("a", (3,)), chunk(100))
    assert not cache.contains(("a", (1,))) and cache.contains(("a", (0,)))
    assert cache.used_bytes == 300 and cache.evictions == 1
    assert (cache.hits, cache.misses) == (1, 0)
    assert cache.get(("a", (1,))) is None and cache.misses == 1
    assert cache.get(("a", (1,)), count=False) is None and cache.misses == 1


def test_bytes_reserved_elsewhere_share_the_budget():
    """Written chunks not yet stored (the write-back's) take their bytes from the cache's budget."""
    cache = ChunkCache(300)
    for i in range(3):
        cache.put(("a", (i,)), chunk(100))
    cache.reserve(150)  # the two least recently used go
    assert cache.used_bytes == 100 and cache.contains(("a", (2,))) and cache.evictions == 2
    cache.put(("a", (3,)), chunk(100))
    assert cache.used_bytes == 100 and cache.contains(("a", (3,)))
    cache.reserve(400)  # more than the budget: the chunk put last stays
    assert cache.used_bytes == 100
    cache.reserve(0)
    cache.put(("a", (4,)), chunk(100))
    assert cache.used_bytes == 200


def test_cached_arrays_are_read_only_and_broadcasts_cost_nothing():
    cache = ChunkCache(100)
    arr = chunk(10)
    cache.put(("a", ()), arr)
    assert not arr.flags.writeable
    cache.put(("b", ()), np.broadcast_to(np.uint8(3), (1000,)))
    assert cache.used_bytes == 10


def test_oversize_slots():
    cache = ChunkCache(100, oversize_slots=2)
    for i in range(3):
        cache.put(("a", (i,)), chunk(1000))
    assert cache.oversize_held == 2 and cache.oversize_evictions == 1 and cache.used_bytes == 0
    assert not cache.contains(("a", (0,))) and cache.get(("a", (2,))) is not None
    cache.make_room_oversize()
    assert cache.oversize_held == 1 and cache.oversize_bytes == 1000


def test_discard_prefix():
    cache = ChunkCache(1000)
    for path in ("g/a", "g/ab", "g/a/b", "h"):
        cache.put((path, (0,)), chunk(10))
    cache.discard_prefix("g/a")
    assert [cache.contains((p, (0,))) for p in ("g/a", "g/ab", "g/a/b", "h")] == [False, True, False, True]
    assert cache.used_bytes == 20
