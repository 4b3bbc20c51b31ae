"""The commit lock of an Icechunk branch: writes shared and commits exclusive within one daemon
(`CommitLock`), commits of several mounts of one local repository (a lock file beside it, `locked`)."""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
from collections.abc import Iterator


class CommitLock:
    """A shared/exclusive lock: writes into a writable session hold it shared (any number at
    once), the commits that replace the session exclusive (one at a time, with no write under
    way): a write never lands in a session that was committed already. A write waits only for
    a commit being made, not for one waiting."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._writes = 0
        self._swapping = False

    @contextlib.contextmanager
    def writing(self) -> Iterator[None]:
        with self._cond:
            while self._swapping:
                self._cond.wait()
            self._writes += 1
        try:
            yield
        finally:
            with self._cond:
                self._writes -= 1
                self._cond.notify_all()

    @contextlib.contextmanager
    def committing(self) -> Iterator[None]:
        with self._cond:
            while self._swapping or self._writes:
                self._cond.wait()
            self._swapping = True
        try:
            yield
        finally:
            with self._cond:
                self._swapping = False
                self._cond.notify_all()


def lock_path(directory: str | None) -> str | None:
    """The lock file that commits of a repository in local DIRECTORY hold, beside it; None for
    object stores (icechunk's own conditional writes order the commits)."""
    if directory is None:
        return None
    path = directory.rstrip("/")
    return os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.zarrfs-lock")


@contextlib.contextmanager
def locked(path: str | None) -> Iterator[None]:
    """An exclusive flock on PATH (None: nothing to hold) for a `with` block."""
    if path is None:
        yield
        return
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock
