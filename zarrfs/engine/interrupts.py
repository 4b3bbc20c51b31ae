"""Requests answered EINTR when the process that made them has a signal pending (what a FUSE interrupt would do).

pyfuse3 3.5 never passes the kernel's FUSE_INTERRUPT to a handler, and once a request has reached
the daemon the kernel waits for its answer even for SIGKILL (fuse's request_wait_answer). So a
handler that may wait on the store registers the pid that asked (`watch`); a watcher task reads
the pending and blocked signals of the requests older than POLL_S from /proc every POLL_S, and
cancels the wait of a process with a signal it will take (Ctrl-C, SIGTERM, a caught signal):
the request ends with EINTR, the syscall returns, and the process handles its signal.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import trio

from ..errors import Interrupted

log = logging.getLogger(__name__)

# How often the watcher looks, and how old a request is before its process is looked at: a
# reader's Ctrl-C takes effect within about twice this; requests the store answers quickly
# (almost all) are never looked at.
POLL_S = 0.2


def signal_pending(pid: int) -> bool:
    """Whether the task `pid` (a thread id, as FUSE gives it) has a pending signal it does not block.

    The kernel drops signals that are ignored, so a pending one is one the process will act on."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            fields = dict(line.split(b":", 1) for line in f.read().splitlines() if b":" in line)
    except OSError:  # gone: nobody waits for the answer
        return True
    try:
        pending = int(fields[b"SigPnd"], 16) | int(fields[b"ShdPnd"], 16)
        return bool(pending & ~int(fields[b"SigBlk"], 16))
    except (KeyError, ValueError):
        return False


class _Watch:
    """One request's wait: a cancel scope the watcher cancels; EINTR when it did."""

    __slots__ = ("owner", "pid", "since", "scope")

    def __init__(self, owner: "Interrupts", pid: int) -> None:
        self.owner = owner
        self.pid = pid
        self.since = time.monotonic()
        self.scope = trio.CancelScope()

    def __enter__(self) -> None:
        self.owner._waiting.add(self)
        self.scope.__enter__()

    def __exit__(self, *exc: Any) -> bool:
        self.owner._waiting.discard(self)
        swallowed = self.scope.__exit__(*exc)
        if self.scope.cancelled_caught:
            raise Interrupted(f"interrupted: process {self.pid} got a signal while waiting for the store")
        return swallowed


class _NoWatch:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> bool:
        return False


NO_WATCH = _NoWatch()


class Interrupts:
    """The requests that may wait on the store, by the pid that asked."""

    def __init__(self) -> None:
        self._waiting: set[_Watch] = set()

    def watch(self, pid: int | None) -> Any:
        """`with interrupts.watch(pid):` around a handler's wait (pid 0 or None: not watched)."""
        return _Watch(self, pid) if pid else NO_WATCH

    async def run(self) -> None:
        """Look at the processes of old requests every POLL_S until cancelled."""
        while True:
            await trio.sleep(POLL_S)
            now = time.monotonic()
            for w in [w for w in self._waiting if now - w.since >= POLL_S]:
                if signal_pending(w.pid):
                    log.debug("process %d has a signal pending: its request ends with EINTR", w.pid)
                    w.scope.cancel()
