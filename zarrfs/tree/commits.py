"""Versioned stores (Icechunk): each completed operation becomes one commit, named for it.

The FUSE layer reports operations here (a file closed or synced, mkdir, rm, mv, setfattr);
on a store with no history (`Versions.repository` None) this is a no-op.
"""

from __future__ import annotations

import pwd
import socket
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..engine import Engine
    from .entries import Entry
    from .inodes import Inodes
    from .versions import Versions


def change_message(operation: str, path: str, uid: int | None) -> str:
    """The message of the commit an operation makes: operation, path, user, host."""
    user = "?"
    if uid is not None:
        try:
            user = pwd.getpwuid(uid).pw_name
        except KeyError:
            user = str(uid)
    return f"zarrfs: {operation} {path} by {user}@{socket.gethostname()}"


def entry_path(entry: Entry) -> str:
    """The hierarchy path (or name) a commit message gives a file."""
    return getattr(entry.node, "path", None) or entry.key or "/"


class Commits:
    """Files open for writing (by file handle: the opener's uid) and the commits operations make."""

    def __init__(
        self, engine: Engine, inodes: Inodes, versions: Versions, writing_files: Callable[[], bool], writable: bool
    ) -> None:
        self.engine, self.inodes, self.versions, self.writable = engine, inodes, versions, writable
        self.writing_files = writing_files  # some array is still being written (its commit comes later)
        self._writers: dict[int, int | None] = {}

    def opened(self, fh: int, uid: int | None) -> None:
        """A file opened (or created) for writing."""
        self._writers[fh] = uid

    def wrote(self, fh: int) -> None:
        """A write through a handle not opened for writing as far as we know (uid unknown)."""
        self._writers.setdefault(fh, None)

    def released(self, fh: int) -> None:
        self._writers.pop(fh, None)

    def path_in(self, parent_inode: int, name: str) -> str:
        """The hierarchy path of NAME in a directory."""
        parent = getattr(self.inodes.get(parent_inode).node, "path", "")
        return f"{parent}/{name}" if parent else name

    async def file_done(self, operation: str, fh: int, entry: Entry) -> None:
        """A close or fsync of a file opened for writing is one commit."""
        if fh in self._writers:
            await self.done(operation, entry_path(entry), self._writers[fh])

    def message(self, operation: str, path: str, uid: int | None) -> str:
        """The message of the commit OPERATION makes ("": none, the store is not versioned)."""
        if self.versions.repository is None or not self.writable:
            return ""
        return change_message(operation, path, uid)

    async def done(self, operation: str, path: str, uid: int | None) -> None:
        """The operation just completed becomes one commit (not while another file is being
        written: its commit then takes this one in)."""
        repository = self.versions.repository
        if repository is None or not self.writable or self.writing_files():
            return
        await self.engine.run_io_long(repository.commit_sync, change_message(operation, path, uid))
