"""The disk cache's directory: entries written by rename and checked on read, bounded in bytes with LRU eviction across processes.

Layout of CACHE_DIR (mode 0700, files 0600)::

    lock                 flock(2) target: accounting and eviction take turns across processes
    usage                bytes the entries take (text), corrected by every eviction scan
    entries/H            the whole value of a key, H = sha256(store identity, key): no bucket
                         or key name shows in a file name
    entries/H.parts/P    part P of that key: `rA-B` bytes [A, B), `sN` the last N, `pN` the first N

An entry file is a header (magic, body length, CRC-32C of body and header, when the GET that
read it began, the object's size where known, absent flag) and the body. Its mtime is when it
was last known to match the store (the GET's start, or the listing that confirmed it); its
atime is when it was last used (set explicitly: relatime would not keep it).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import shutil
import stat
import struct
import threading
import time
from collections.abc import Iterable, Iterator

import google_crc32c

from ...repeats import LogOnce

log = logging.getLogger(__package__)  # one logger for the disk cache, named as before its split

MAGIC = b"ZFSDC01\n"
# magic, body length, crc32c, GET start (s since the epoch), object size (-1 unknown), flags
HEADER = struct.Struct("<8sQIdqB")
FLAG_ABSENT = 1
ENTRIES_DIR = "entries"
PARTS_SUFFIX = ".parts"
TMP_PREFIX = ".tmp-"
# What one entry is counted as: its size rounded up to the file system's usual block, so that the
# bound holds for what `du` reports, not only for the bytes written.
BLOCK_BYTES = 4096
# An eviction frees down to this share of the bound: one directory scan then makes room for a
# tenth of the cache instead of one entry.
EVICT_TO_SHARE = 0.9
# A temporary file older than this belongs to a writer that died (writing one entry takes
# milliseconds): eviction scans remove it.
TMP_STALE_S = 60.0
# Tries to create an entry's file in a parts directory that another process's scan may remove
# while it is empty: each try makes it again first.
DIR_ATTEMPTS = 4


def default_cache_dir() -> str:
    """`$XDG_CACHE_HOME/zarrfs` when XDG_CACHE_HOME is set, else `/var/cache/zarrfs` for root
    and `~/.cache/zarrfs` for other users."""
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg:
        return os.path.join(xdg, "zarrfs")
    if os.geteuid() == 0:
        return "/var/cache/zarrfs"
    return os.path.join(os.path.expanduser("~"), ".cache", "zarrfs")


def _blocks(nbytes: int) -> int:
    return -(-nbytes // BLOCK_BYTES) * BLOCK_BYTES


class Entry:
    """An entry read back and checked: its body (None: the key was absent) and the version it was read at."""

    __slots__ = ("body", "began", "size", "validated")

    def __init__(self, body: bytes | None, began: float, size: int | None, validated: float) -> None:
        self.body = body
        self.began = began  # when the GET that read it began (wall clock)
        self.size = size  # the object's size, where the read told it
        self.validated = validated  # when it was last known to match the store


class Corrupt(Exception):
    """An entry that is not what was written (truncated, flipped, foreign)."""


class DiskCache:
    """The cache directory: write, read, drop entries by name; size accounting and LRU eviction."""

    def __init__(self, directory: str, max_bytes: int) -> None:
        self.directory = os.path.abspath(directory)
        self.entries = os.path.join(self.directory, ENTRIES_DIR)
        self.max_bytes = max_bytes
        self.hits = self.misses = self.evictions = self.errors = 0
        self._lock = threading.Lock()  # flock is per open file: threads of one process take turns here
        self._lock_fd = -1
        self._usage_fd = -1
        self._said = LogOnce()  # failure reasons logged (one line each)
        self.usable = self._open()

    # --- set-up ---------------------------------------------------------------------------

    def _open(self) -> bool:
        try:
            os.makedirs(os.path.dirname(self.directory), exist_ok=True)
            try:
                os.mkdir(self.directory, 0o700)
            except FileExistsError:
                pass
            st = os.lstat(self.directory)
            if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
                raise PermissionError(errno.EPERM, "not a directory owned by this user")
            if stat.S_IMODE(st.st_mode) != 0o700:
                os.chmod(self.directory, 0o700)  # entries are the user's data: nobody else may list them
            os.makedirs(self.entries, 0o700, exist_ok=True)
            self._lock_fd = os.open(os.path.join(self.directory, "lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            self._usage_fd = os.open(
                os.path.join(self.directory, "usage"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600
            )
            with self._locked():
                self._set_usage(self._scan_and_evict(self.max_bytes))
        except OSError as e:
            log.warning(
                "disk cache %s cannot be used (%s): every read goes to the store", self.directory, e.strerror or e
            )
            self.errors += 1
            return False
        return True

    def close(self) -> None:
        for fd in (self._lock_fd, self._usage_fd):
            if fd >= 0:
                os.close(fd)
        self._lock_fd = self._usage_fd = -1

    # --- accounting -----------------------------------------------------------------------

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """Accounting and eviction: one thread of one process at a time."""
        with self._lock:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(self._lock_fd, fcntl.LOCK_UN)

    def _usage(self) -> int:
        raw = os.pread(self._usage_fd, 32, 0)
        try:
            return max(0, int(raw.split(b"\n")[0] or b"0"))
        except ValueError:
            return 0

    def _set_usage(self, nbytes: int) -> None:
        data = b"%d\n" % max(0, nbytes)
        os.pwrite(self._usage_fd, data.ljust(32, b" "), 0)

    @property
    def used_bytes(self) -> int:
        """Bytes the entries take, as last accounted."""
        if not self.usable:
            return 0
        try:
            return self._usage()
        except OSError:
            return 0

    def _files(self) -> Iterable[tuple[str, os.stat_result]]:
        """Every file and parts directory under entries/ (temporary files too), with its stat;
        empty parts directories are removed on the way."""
        try:
            top = list(os.scandir(self.entries))
        except FileNotFoundError:
            return
        for entry in top:
            try:
                st = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            if stat.S_ISDIR(st.st_mode):
                try:
                    inner = list(os.scandir(entry.path))
                except FileNotFoundError:
                    continue
                if not inner:
                    try:
                        os.rmdir(entry.path)  # its last part was evicted
                        continue
                    except OSError:
                        pass
                yield entry.path, st
                for part in inner:
                    try:
                        yield part.path, part.stat(follow_symlinks=False)
                    except FileNotFoundError:
                        continue
            else:
                yield entry.path, st

    def _scan_and_evict(self, target: int) -> int:
        """With the lock held: the bytes the entries take, after removing dead writers' temporary
        files and least recently used entries until they take at most `target`."""
        now = time.time()
        live: list[tuple[int, int, str]] = []
        total = 0
        for path, st in self._files():
            nbytes = BLOCK_BYTES if stat.S_ISDIR(st.st_mode) else _blocks(st.st_size)
            total += nbytes
            if stat.S_ISDIR(st.st_mode):
                continue  # counted until it is found empty
            if os.path.basename(path).startswith(TMP_PREFIX):
                if now - st.st_mtime > TMP_STALE_S and self._unlink(path):
                    total -= nbytes
                continue  # a live writer's file: counted, never evicted
            live.append((st.st_atime_ns, nbytes, path))
        if total > target:
            live.sort()
            for _, nbytes, path in live:
                if total <= target:
                    break
                if self._unlink(path):
                    total -= nbytes
                    self.evictions += 1
        return total

    @staticmethod
    def _unlink(path: str) -> bool:
        try:
            os.unlink(path)
            return True
        except FileNotFoundError:
            return False

    def failed(self, what: str, e: OSError) -> None:
        """Count a failure of the directory (WHAT could not be done); each reason is logged once."""
        self.errors += 1
        reason = e.strerror or str(e)
        if self._said.first(reason):
            log.warning("disk cache %s: cannot %s (%s); reads are served from the store", self.directory, what, reason)

    # --- entries --------------------------------------------------------------------------

    def path(self, name: str, part: str | None = None) -> str:
        return (
            os.path.join(self.entries, name) if part is None else os.path.join(self.entries, name + PARTS_SUFFIX, part)
        )

    def read_sync(self, path: str) -> Entry | None:
        """The entry at PATH, checked; None when there is none. Raises Corrupt."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except (FileNotFoundError, NotADirectoryError):
            return None
        try:
            st = os.fstat(fd)
            head = os.pread(fd, HEADER.size, 0)
            if len(head) < HEADER.size:
                raise Corrupt(f"{len(head)} bytes, shorter than its header")
            magic, nbytes, crc, began, size, flags = HEADER.unpack(head)
            if magic != MAGIC:
                raise Corrupt("not an entry of this version")
            if st.st_size != HEADER.size + nbytes:
                raise Corrupt(f"{st.st_size - HEADER.size} bytes where {nbytes} were written")
            body = os.pread(fd, nbytes, HEADER.size) if nbytes else b""
            while len(body) < nbytes and (more := os.pread(fd, nbytes - len(body), HEADER.size + len(body))):
                body += more
            if _crc(body, head) != crc:
                raise Corrupt("checksum mismatch")
            # Used now (LRU order), still validated when it was.
            os.utime(fd, ns=(time.time_ns(), st.st_mtime_ns))
        finally:
            os.close(fd)
        return Entry(None if flags & FLAG_ABSENT else body, began, None if size < 0 else size, st.st_mtime_ns / 1e9)

    def write_sync(self, path: str, body: bytes | None, began: float, size: int | None) -> bool:
        """Keep an entry (None: the key is absent), validated as of `began`. False when it could
        not be written (logged once per reason)."""
        if not self.usable:
            return False
        data = b"" if body is None else body
        head = HEADER.pack(MAGIC, len(data), 0, began, -1 if size is None else size, FLAG_ABSENT if body is None else 0)
        head = HEADER.pack(
            MAGIC, len(data), _crc(data, head), began, -1 if size is None else size, FLAG_ABSENT if body is None else 0
        )
        nbytes = _blocks(HEADER.size + len(data))
        if nbytes > self.max_bytes:
            return False
        directory = os.path.dirname(path)
        tmp = os.path.join(directory, f"{TMP_PREFIX}{os.getpid()}-{threading.get_ident():x}")
        try:
            for attempt in range(DIR_ATTEMPTS):
                try:
                    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
                    break
                except FileNotFoundError:
                    # The first part of a key: its directory, counted as a block. Another process's
                    # eviction scan may remove it, empty, before our file is in it: made again then.
                    if attempt == DIR_ATTEMPTS - 1:
                        raise
                    os.makedirs(directory, 0o700, exist_ok=True)
                    nbytes += BLOCK_BYTES if attempt == 0 else 0
            try:
                view = memoryview(head + data) if len(data) < (1 << 16) else None
                if view is not None:
                    _write_all(fd, view)
                else:
                    _write_all(fd, memoryview(head))
                    _write_all(fd, memoryview(data))
                validated_ns = int(began * 1e9)
                os.utime(fd, ns=(time.time_ns(), validated_ns))
            finally:
                os.close(fd)
            with self._locked():
                old = _size_of(path)
                used = self._usage() + nbytes - old
                if used > self.max_bytes:
                    # The scan counts this entry's temporary file and the entry it replaces (if
                    # that is not evicted meanwhile).
                    total = self._scan_and_evict(int(self.max_bytes * EVICT_TO_SHARE) + old)
                    used = total - _size_of(path)
                os.replace(tmp, path)
                self._set_usage(used)
        except OSError as e:
            self._unlink_quietly(tmp)
            self.failed("write entries", e)
            return False
        return True

    @staticmethod
    def _unlink_quietly(path: str) -> None:
        try:
            os.unlink(path)
        except OSError:
            pass

    def drop_sync(self, path: str) -> None:
        """Remove an entry (absent: nothing to do)."""
        if not self.usable:
            return
        try:
            with self._locked():
                try:
                    nbytes = _blocks(os.stat(path).st_size)
                except FileNotFoundError:
                    return
                if self._unlink(path):
                    self._set_usage(self._usage() - nbytes)
        except OSError as e:
            self.failed("remove entries", e)

    def parts_sync(self, name: str) -> list[str]:
        """The parts kept of one key."""
        try:
            return [
                p for p in os.listdir(os.path.join(self.entries, name + PARTS_SUFFIX)) if not p.startswith(TMP_PREFIX)
            ]
        except (FileNotFoundError, NotADirectoryError):
            return []
        except OSError as e:
            self.failed("list entries", e)
            return []

    def drop_key_sync(self, name: str) -> None:
        """Remove every entry of one key: its whole value and its parts."""
        self.drop_sync(self.path(name))
        for part in self.parts_sync(name):
            self.drop_sync(self.path(name, part))

    def clear_sync(self) -> int:
        """Remove every entry; the bytes they took."""
        if not self.usable:
            return 0
        with self._locked():
            freed = self._usage()
            shutil.rmtree(self.entries, ignore_errors=True)
            os.makedirs(self.entries, 0o700, exist_ok=True)
            self._set_usage(0)
        return freed


def _size_of(path: str) -> int:
    """What an entry file counts for; 0 when there is none."""
    try:
        return _blocks(os.stat(path).st_size)
    except FileNotFoundError:
        return 0


def _crc(body: bytes, head: bytes) -> int:
    """CRC-32C of the body, then of the header with its checksum field zeroed."""
    blank = head[:16] + b"\0\0\0\0" + head[20:]
    return google_crc32c.extend(google_crc32c.value(body), blank)


def _write_all(fd: int, view: memoryview) -> None:
    while view:
        view = view[os.write(fd, view) :]
