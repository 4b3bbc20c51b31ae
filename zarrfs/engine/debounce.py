"""A keyed debounce: calls made a while after they are asked for, one per key; asking again moves the time.

Plain files are stored this way a few seconds after their last close (write-back), so that
one renamed or removed meanwhile is never stored under its temporary name.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Hashable

import trio

log = logging.getLogger(__name__)

Call = Callable[[], Awaitable[None]]


class DelayedCalls:
    """Delayed calls by key, debounced, run in the engine's nursery (nothing runs before `attach`)."""

    def __init__(self) -> None:
        self._due: dict[Hashable, tuple[float, Call]] = {}  # key -> (trio time due, call)
        self._nursery: trio.Nursery | None = None

    def attach(self, nursery: trio.Nursery) -> None:
        """The nursery the calls run in (the engine's, while it runs)."""
        self._nursery = nursery

    def call(self, key: Hashable, delay_s: float, fn: Call) -> bool:
        """Run `await fn()` once, `delay_s` from now; a call of `key` already waiting moves to
        this time and this `fn`. False when nothing runs later (the engine is not running)."""
        if self._nursery is None:
            return False
        waiting = key in self._due
        self._due[key] = (trio.current_time() + delay_s, fn)
        if not waiting:
            self._nursery.start_soon(self._wait_then_call, key)
        return True

    def cancel(self, key: Hashable) -> None:
        """The call of `key` waiting, if any, is not made."""
        self._due.pop(key, None)

    @property
    def waiting(self) -> int:
        """How many calls wait."""
        return len(self._due)

    async def _wait_then_call(self, key: Hashable) -> None:
        # A key cancelled and asked again may have two of these tasks: the first awake at the
        # due time makes the call, the other finds nothing left.
        while True:
            item = self._due.get(key)
            if item is None:
                return
            due, fn = item
            if trio.current_time() >= due:
                break
            await trio.sleep_until(due)
        del self._due[key]
        try:
            await fn()
        except Exception:  # an error left in the engine's nursery would end the daemon
            log.exception("a delayed call (%s) failed", key)
