"""Requests answered EINTR when the process that made them has a signal pending (what a FUSE interrupt would do).

pyfuse3 3.5 never passes the kernel's FUSE_INTERRUPT to a handler, and once a request has reached
the daemon the kernel waits for its answer even for SIGKILL (fuse's request_wait_answer). So a
handler that may wait on the store registers the pid that asked (`watch`); a watcher task reads
the pending and blocked signals of the requests older than POLL_S from /proc every POLL_S, and
cancels the wait of a process with a signal it will take (Ctrl-C, SIGTERM, a caught signal):
the request ends with EINTR, the syscall returns, and the process handles its signal.

A read names no process at all, so a read is watched for the process that opened the file and,
once the mount point is known, for any other: a child that inherited the descriptor, a command
reading a file its shell opened (`exec 3<FILE; dd <&3`). Then the watcher looks for tasks with
a signal pending that are in a read of that file of this mount (/proc: the syscall, its
descriptor's path, inode and position) and ends the waits of that file whose bytes the read
covers (`_readers_interrupted`); all of /proc is read only while a read has waited
OTHER_READERS_AFTER_S.
"""

from __future__ import annotations

import logging
import os
import time
from contextlib import AbstractContextManager
from types import TracebackType

import trio

from ..errors import Interrupted

log = logging.getLogger(__name__)

# How often the watcher looks, and how old a request is before its process is looked at: a
# reader's Ctrl-C takes effect within about twice this; requests the store answers quickly
# (almost all) are never looked at.
POLL_S = 0.2
# Reads waiting this long are also matched against every task with a signal pending (all of
# /proc is read, costly on a busy machine): not every poll of a store that is merely slow.
OTHER_READERS_AFTER_S = 1.0


# Syscalls that read a file (x86_64 and aarch64 numbers): which argument is the descriptor, and
# how the bytes read are known: "count" (read: the descriptor's position, the third argument the
# count), "pread" (pread64: the fourth the offset), or "on" (from the descriptor's position on).
READ_SYSCALLS = {
    # read pread64 readv preadv preadv2
    "x86_64": {
        0: (0, "count"),
        17: (0, "pread"),
        19: (0, "on"),
        295: (0, "on"),
        327: (0, "on"),
        40: (1, "on"),
        275: (0, "on"),
        326: (0, "on"),
    },  # sendfile splice copy_file_range
    "aarch64": {
        63: (0, "count"),
        67: (0, "pread"),
        65: (0, "on"),
        69: (0, "on"),
        286: (0, "on"),
        71: (1, "on"),
        76: (0, "on"),
        285: (0, "on"),
    },
}.get(os.uname().machine, {})


def _status(path: str) -> dict[bytes, bytes] | None:
    try:
        with open(path, "rb") as f:
            return dict(line.split(b":", 1) for line in f.read().splitlines() if b":" in line)
    except OSError:
        return None


def _takes_a_signal(fields: dict[bytes, bytes]) -> bool:
    try:
        pending = int(fields[b"SigPnd"], 16) | int(fields[b"ShdPnd"], 16)
        return bool(pending & ~int(fields[b"SigBlk"], 16))
    except (KeyError, ValueError):
        return False


def signal_pending(pid: int) -> bool:
    """Whether the task `pid` (a thread id, as FUSE gives it) has a pending signal it does not block.

    The kernel drops signals that are ignored, so a pending one is one the process will act on."""
    fields = _status(f"/proc/{pid}/status")
    return True if fields is None else _takes_a_signal(fields)  # gone: nobody waits for the answer


def interrupted_reads(mountpoint: str) -> list[tuple[int, int, int]]:
    """(inode, first byte, stop) of each read of a file under MOUNTPOINT by a task that has a
    signal pending: what it may be waiting for."""
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        process = _status(f"/proc/{pid}/status")  # a signal to the process shows in any thread's
        if process is None or not _takes_a_signal(process):
            continue
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            fields = _status(f"/proc/{pid}/task/{tid}/status")
            if fields is None or not _takes_a_signal(fields):
                continue
            found = _reading(pid, tid, mountpoint)
            if found is not None:
                out.append(found)
    return out


def _reading(pid: str, tid: str, mountpoint: str) -> tuple[int, int, int] | None:
    """The inode and byte span a task in a read syscall reads from a file under MOUNTPOINT, or None."""
    try:
        with open(f"/proc/{pid}/task/{tid}/syscall") as f:
            call = f.read().split()
        arg, kind = READ_SYSCALLS[int(call[0])]
        fd = int(call[1 + arg], 16)
        if not os.readlink(f"/proc/{pid}/fd/{fd}").startswith(mountpoint + "/"):
            return None
        with open(f"/proc/{pid}/fdinfo/{fd}") as f:
            info = dict(line.split(":", 1) for line in f.read().splitlines() if ":" in line)
        inode = int(info["ino"])
    except (OSError, ValueError, KeyError, IndexError):  # not in a read, gone, or not ours
        return None
    start = int(call[4], 16) if kind == "pread" else int(info["pos"])
    return inode, start, start + int(call[3], 16) if kind != "on" else 1 << 63


class _Watch:
    """One request's wait: a cancel scope the watcher cancels; EINTR when it did."""

    __slots__ = ("owner", "pid", "since", "scope", "inode", "span")

    def __init__(self, owner: Interrupts, pid: int, inode: int = 0, span: tuple[int, int] = (0, 0)) -> None:
        self.owner = owner
        self.pid = pid
        self.since = time.monotonic()
        self.scope = trio.CancelScope()
        self.inode = inode  # a read's file and its bytes [start, stop)
        self.span = span

    def __enter__(self) -> None:
        self.owner._waiting.add(self)
        self.scope.__enter__()

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        self.owner._waiting.discard(self)
        # The scope swallows only its own cancellation (then cancelled_caught), which becomes Interrupted.
        self.scope.__exit__(kind, error, tb)
        if self.scope.cancelled_caught:
            raise Interrupted(f"interrupted: process {self.pid} got a signal while waiting for the store")


class _NoWatch:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


NO_WATCH = _NoWatch()
PAGE = 4096


class Interrupts:
    """The requests that may wait on the store, by the pid that asked."""

    def __init__(self) -> None:
        self._waiting: set[_Watch] = set()
        self.mountpoint: str | None = None  # set once mounted: reads by other processes are watched too

    def watch(self, pid: int | None) -> AbstractContextManager[None, None]:
        """`with interrupts.watch(pid):` around a handler's wait (pid 0 or None: not watched)."""
        return _Watch(self, pid) if pid else NO_WATCH

    def watch_read(self, pid: int | None, inode: int, offset: int, size: int) -> AbstractContextManager[None, None]:
        """`with interrupts.watch_read(...)` around a read's wait: PID opened the file, but any
        process reading those bytes of it may be the one waiting."""
        return _Watch(self, pid or 0, inode, (offset, offset + size))

    async def run(self) -> None:
        """Look at the processes of old requests every POLL_S until cancelled."""
        while True:
            await trio.sleep(POLL_S)
            now = time.monotonic()
            old = [w for w in self._waiting if now - w.since >= POLL_S]
            for w in old:
                if w.pid and signal_pending(w.pid):
                    log.debug("process %d has a signal pending: its request ends with EINTR", w.pid)
                    w.scope.cancel()
            reads = [w for w in old if w.inode and not w.scope.cancel_called and now - w.since >= OTHER_READERS_AFTER_S]
            if reads and self.mountpoint:
                self._readers_interrupted(reads, interrupted_reads(self.mountpoint))

    @staticmethod
    def _readers_interrupted(reads: list[_Watch], readers: list[tuple[int, int, int]]) -> None:
        """End the waits of reads that a task with a signal pending reads (a page of them)."""
        for w in reads:
            start, stop = w.span
            for inode, first, last in readers:
                if inode == w.inode and first // PAGE * PAGE < stop and start < last:
                    log.debug("a reader of inode %d has a signal pending: its read ends with EINTR", inode)
                    w.scope.cancel()
                    break
