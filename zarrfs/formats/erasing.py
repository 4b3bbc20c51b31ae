"""Old keys of replaced arrays, erased in the background once the new array is published; writes under their path wait for them."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)


def _overlap(a: str, b: str) -> bool:
    """Whether node paths A and B are one node or one lies below the other ('' is the root)."""
    return a == b or not a or not b or a.startswith(b + "/") or b.startswith(a + "/")


class PendingErases:
    """Erases running in background threads, by the path of the node whose keys they remove.

    Each erase is one or a few bulk requests, each bounded by the store's own timeouts. A write
    under a path (a replacement, a removal, a move) first waits for the erases at that path, above
    or below it: an erase never removes a key written after it began.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: dict[str, list[threading.Thread]] = {}

    def start(self, path: str, erase: Callable[[], None]) -> None:
        """Run ERASE in a thread of its own; it logs its own failures."""
        thread = threading.Thread(target=self._run, args=(path, erase), name=f"zarrfs-erase {path}", daemon=True)
        with self._lock:
            self._pending.setdefault(path, []).append(thread)
        thread.start()

    def _run(self, path: str, erase: Callable[[], None]) -> None:
        try:
            erase()
        except Exception:  # a bug, not a store failure (those are logged by ERASE): never lost silently
            log.exception("%s: erasing the old array's keys in the background failed", path)
        finally:
            with self._lock:
                threads = self._pending.get(path, [])
                threads.remove(threading.current_thread())
                if not threads:
                    self._pending.pop(path, None)

    def _overlapping(self, path: str) -> list[threading.Thread]:
        with self._lock:
            return [t for p, threads in self._pending.items() if _overlap(p, path) for t in threads]

    def wait_for(self, path: str) -> None:
        """Return once no erase at, above or below PATH is running."""
        for thread in self._overlapping(path):
            thread.join()

    def drain(self, timeout_s: float) -> int:
        """Wait up to TIMEOUT_S for every erase (unmount); how many still run then."""
        deadline = time.monotonic() + timeout_s
        for thread in self._overlapping(""):
            thread.join(max(deadline - time.monotonic(), 0))
        left = len(self._overlapping(""))
        if left:
            log.warning(
                "%d erases of replaced arrays' keys still run at unmount; a later replacement or the "
                "staging sweep removes what they leave",
                left,
            )
        return left
