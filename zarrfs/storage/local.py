"""Local stores' fast paths: keys read with one pread (never a FIFO's hang), written by rename, directories swapped, symlinks kept inside the root."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import stat
from collections.abc import Callable
from typing import Any

from ..errors import StoreError

# Resolved directories of a local store kept for the symlink check (a few MiB at most).
REAL_DIRS_REMEMBERED = 10_000
# renameat2(2): swap two paths atomically (Linux 3.15+, glibc 2.28+); AT_FDCWD per <fcntl.h>.
RENAME_EXCHANGE = 2
AT_FDCWD = -100
# A local key is opened without blocking (a FIFO would hold a worker thread forever) and
# read only when it is a regular file. These are what the others are called in errors.
FILE_KINDS = (
    (stat.S_ISFIFO, "FIFO"),
    (stat.S_ISCHR, "character device"),
    (stat.S_ISBLK, "block device"),
    (stat.S_ISSOCK, "socket"),
)
LOCAL_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC


class InsideRoot:
    """A local store's root: refuses keys that symlinks lead outside it.

    A key's directory is resolved once and remembered (realpath costs a system call per
    component); the key itself is resolved only when it is a symlink.
    """

    def __init__(self, root: str) -> None:
        self.real_root = os.path.realpath(root)
        self._real_dirs: dict[str, str] = {}

    def check(self, key: str, full: str) -> None:
        """Raise StoreError when KEY, at path FULL, resolves outside the root."""
        directory = os.path.dirname(full)
        real_dir = self._real_dirs.get(directory)
        if real_dir is None:
            real_dir = os.path.realpath(directory)
            if len(self._real_dirs) > REAL_DIRS_REMEMBERED:
                self._real_dirs.clear()
            self._real_dirs[directory] = real_dir
        real = os.path.join(real_dir, os.path.basename(full))
        if os.path.islink(real):
            real = os.path.realpath(real)
        if real != self.real_root and not real.startswith(self.real_root + os.sep):
            raise StoreError(f"key {key!r} resolves outside the store ({real})")


def read_file(path: str, key: str, start: int, end: int | None, max_nbytes: int | None = None, into: Any = None) -> Any:
    """Bytes [start, end) of the file of KEY at PATH (start < 0: the last -start bytes; end
    None: to its end), or None when it is absent or a directory; read into INTO (a writable
    buffer) when they fit in it: INTO returned when they are exactly its size, else a view of
    its first bytes.

    Only regular files are values: the key is opened without blocking and checked before
    a byte is read. `max_nbytes` refuses a read that would return more.
    """
    try:
        fd = os.open(path, LOCAL_OPEN_FLAGS)
    except (FileNotFoundError, NotADirectoryError):
        return None
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            return None
        if not stat.S_ISREG(st.st_mode):
            kind = next((name for test, name in FILE_KINDS if test(st.st_mode)), "special file")
            raise StoreError(f"{key!r} is not a regular file: {kind}")
        size = st.st_size
        lo = max(0, size + start) if start < 0 else min(start, size)
        hi = size if end is None else max(lo, min(end, size))
        if max_nbytes is not None and hi - lo > max_nbytes:
            raise StoreError(f"{key!r} holds {hi - lo} bytes, more than the {max_nbytes} it can legitimately take")
        if into is not None and hi - lo <= len(into):
            view, at = memoryview(into).cast("B"), lo
            while at < hi and (got := os.preadv(fd, [view[at - lo : hi - lo]], at)):
                at += got
            if at == hi:
                return into if hi - lo == len(into) else view[: hi - lo]
        data = os.pread(fd, hi - lo, lo)  # one call unless past 2 GiB
        while len(data) < hi - lo and (more := os.pread(fd, hi - lo - len(data), lo + len(data))):
            data += more
        return data
    finally:
        os.close(fd)


def replace_file(path: str, tag: int, write: Callable[[Any], Any]) -> None:
    """Write a local file through WRITE into a temporary file beside it (named with TAG, unique
    among writes in flight), then rename it over PATH: a reader or a crash sees the old bytes or
    the new ones, never a mix."""
    directory = os.path.dirname(path)
    os.makedirs(directory, exist_ok=True)
    tmp = os.path.join(directory, f".{os.path.basename(path)}.zarrfs-{os.getpid()}-{tag:x}.tmp")
    try:
        with open(tmp, "wb") as f:
            write(f)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _renameat2_exchange(a: str, b: str) -> bool:
    """Swap two directories in one step; False when the kernel or file system cannot."""
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except AttributeError:
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if fn(AT_FDCWD, os.fsencode(a), AT_FDCWD, os.fsencode(b), RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
        return False
    raise OSError(code, os.strerror(code), a)


def swap_dirs(a: str, b: str) -> None:
    """Put directory A at B in one step; the old B (if any) ends up at A. Without renameat2's
    exchange, two renames (a moment with no B). OSError when it fails."""
    os.makedirs(a, exist_ok=True)
    if not os.path.isdir(b):
        os.makedirs(os.path.dirname(b), exist_ok=True)
        os.rename(a, b)
        return
    if _renameat2_exchange(a, b):
        return
    trash = a + ".old"
    os.rename(b, trash)
    os.rename(a, b)
    os.rename(trash, a)


def prune_empty_dirs(root: str, key: str) -> None:
    """Remove the directories of KEY below ROOT that a removal left empty, deepest first."""
    parts = key.split("/")[:-1]
    while parts:
        try:
            os.rmdir(os.path.join(root, *parts))
        except OSError:
            return
        parts.pop()


def tree_bytes(root: str) -> int:
    """Bytes of every regular file below ROOT (symlinks not followed; unreadable directories skipped)."""
    total = 0
    stack = [root]
    while stack:
        try:
            with os.scandir(stack.pop()) as it:
                for entry in it:
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(entry.path)
                    elif entry.is_file(follow_symlinks=False):
                        total += entry.stat(follow_symlinks=False).st_size
        except OSError:
            continue
    return total


def free_bytes(path: str) -> int | None:
    """Space left on the file system holding PATH (statfs), None when it cannot be asked."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize
