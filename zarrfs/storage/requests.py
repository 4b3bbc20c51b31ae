"""Requests a store sends to its backend (object GETs and PUTs, listings, deletions), counted for stats.json."""

from __future__ import annotations

import threading

# stats.json's names, documented in docs/CONFIGURATION.md (stats.json).
FIELDS = ("store_gets", "store_bytes", "store_lists", "store_puts", "store_put_bytes", "store_deletes")


class RequestCounts:
    """Counters of what a store asked of its backend; a disk cache's answers never reach them.

    Incremented from the worker threads that make the requests, hence the lock (a request costs
    far more than taking it)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(FIELDS, 0)

    def got(self, nbytes: int, requests: int = 1) -> None:
        """REQUESTS reads (whole values or ranges) answered with NBYTES bytes in all."""
        with self._lock:
            self._counts["store_gets"] += requests
            self._counts["store_bytes"] += nbytes

    def listed(self, requests: int = 1) -> None:
        with self._lock:
            self._counts["store_lists"] += requests

    def put(self, nbytes: int, requests: int = 1) -> None:
        with self._lock:
            self._counts["store_puts"] += requests
            self._counts["store_put_bytes"] += nbytes

    def deleted(self, requests: int = 1) -> None:
        with self._lock:
            self._counts["store_deletes"] += requests

    def stats(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)
