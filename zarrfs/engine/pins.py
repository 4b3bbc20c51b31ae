"""Pins: the versions of chunks a revalidation dropped, kept a moment for the reads begun before it.

One read(2) may reach the mount as several requests: an O_DIRECT read larger than the kernel's
largest request (1 MiB) arrives as several, sent together or one after another, and a buffered
read copies the pages the kernel kept and asks for the rest. When the TTL starts between two of them, the
later ones would show the new version of a chunk the earlier ones showed in its old one. So the
chunks a revalidation drops (changed in the store, or not checkable) are held here until the TTL
they were checked under would have run out (`until`: the mount starts the TTL early by the pins'
bound, so a held version is never used past its own TTL), and a request that continues a read
begun before (tree/freshness.py `pinned`) takes them before the cache.
"""

from __future__ import annotations

import math
import time

import numpy as np

from .cache import Key


class Pins:
    """Chunks dropped at the TTL's last start, by cache key, for reads arriving before `until`
    (monotonic). A read decides when it arrives and takes them after its array's check (which
    drops what changed, in one bounded store call): they are let go once that may have ended, or
    at the next start."""

    def __init__(self, wait_s: float) -> None:
        self._held: dict[Key, np.ndarray] = {}
        self.until = self._let_go = -math.inf
        self._wait_s = wait_s  # the longest a read may wait for its array's check (one store call)

    def start(self, until: float) -> None:
        """The TTL starts again: what was held is let go, and chunks dropped from now are held
        for reads arriving until `until`."""
        self._held = {}
        self.until = until
        self._let_go = until + self._wait_s

    def live(self) -> bool:
        """Whether a read arriving now may take held versions."""
        now = time.monotonic()
        if now >= self._let_go:
            self._held = {}
        return now < self.until

    def keep(self, key: Key, arr: np.ndarray | None) -> None:
        """A chunk dropped from the cache: held if reads may still take it (the first version
        dropped is the one reads begun before the TTL started showed)."""
        if arr is not None and self.live():
            self._held.setdefault(key, arr)

    def get(self, key: Key) -> np.ndarray | None:
        """The version of a chunk held since the TTL's last start, if any (asked by a read that
        found them live when it arrived)."""
        if not self._held:
            return None
        if time.monotonic() >= self._let_go:
            self._held = {}
            return None
        return self._held.get(key)
