"""The pyfuse3 Operations: translate each request to the namespace and engine; the errno boundary."""

from __future__ import annotations

import errno
import functools
import logging
import os
import stat
import time
from typing import Any

import pyfuse3

from .engine import Engine
from .errors import ReadOnly, ZarrfsError
from .model import BrokenNode
from .options import Options
from .tree import Entry, Namespace, fs_name

log = logging.getLogger(__name__)

# Metadata of a read-only mount changes only if the store is changed behind our back;
# a minute keeps lookups off the Python server without hiding such changes for long.
ATTR_TIMEOUT_S = 60.0
BLOCK_SIZE = 512  # st_blocks unit, fixed by POSIX
IO_BLOCK_SIZE = 1 << 20  # st_blksize: tools like cp read in units of this size


def boundary(fn: Any) -> Any:
    """Only FUSEError may leave a handler: map ours to their errno, log and EIO the rest."""

    @functools.wraps(fn)
    async def wrapper(self: "ZarrOperations", *args: Any) -> Any:
        try:
            return await fn(self, *args)
        except pyfuse3.FUSEError:
            raise
        except ZarrfsError as e:
            if e.errno not in (errno.ENOENT, errno.EROFS, errno.ENODATA):
                log.warning("%s: %s", fn.__name__, e)
            raise pyfuse3.FUSEError(e.errno) from None
        except OSError as e:
            log.warning("%s: %s", fn.__name__, e)
            raise pyfuse3.FUSEError(e.errno or errno.EIO) from None
        except Exception:
            log.exception("unexpected error in %s%r", fn.__name__, args[:2])
            raise pyfuse3.FUSEError(errno.EIO) from None

    return wrapper


class ZarrOperations(pyfuse3.Operations):
    """Read-only file system operations over a Namespace."""

    enable_writeback_cache = False

    def __init__(self, namespace: Namespace, engine: Engine, options: Options) -> None:
        super().__init__()
        self.ns = namespace
        self.engine = engine
        self.options = options
        self.uid = int(_opt(options, "uid", os.getuid()))
        self.gid = int(_opt(options, "gid", os.getgid()))
        self.umask = int(_opt(options, "umask", "0"), 8)
        self.mount_time_ns = time.time_ns()
        # Open files: fh -> (entry, bytes fixed at open for generated files such as stats.json)
        self._handles: dict[int, tuple[Entry, bytes | None]] = {}
        self._next_fh = 1

    def attributes(self, entry: Entry) -> pyfuse3.EntryAttributes:
        attr = pyfuse3.EntryAttributes()
        attr.st_ino = entry.inode
        attr.generation = 0
        attr.entry_timeout = ATTR_TIMEOUT_S
        attr.attr_timeout = ATTR_TIMEOUT_S
        if entry.is_dir:
            attr.st_mode = stat.S_IFDIR | (0o555 & ~self.umask)
            attr.st_nlink = 2
        else:
            attr.st_mode = stat.S_IFREG | (0o444 & ~self.umask)
            attr.st_nlink = 1
        attr.st_size = max(entry.size, 0)
        stored = entry.stored_bytes if entry.stored_bytes is not None else entry.size
        attr.st_blocks = -(-max(stored, 0) // BLOCK_SIZE)
        if entry.kind == "stats":
            attr.attr_timeout = 0.0  # its size changes with every read
        attr.st_blksize = IO_BLOCK_SIZE
        attr.st_uid = self.uid
        attr.st_gid = self.gid
        attr.st_atime_ns = attr.st_mtime_ns = attr.st_ctime_ns = self.mount_time_ns
        return attr

    # --- reading the tree ---------------------------------------------------------

    @boundary
    async def lookup(self, parent_inode: int, name: bytes, ctx: Any = None) -> pyfuse3.EntryAttributes:
        entry = await self.ns.lookup(parent_inode, fs_name(name))
        return self.attributes(entry)

    @boundary
    async def getattr(self, inode: int, ctx: Any = None) -> pyfuse3.EntryAttributes:
        entry = self.ns.get(inode)
        if entry.kind == "stats":
            entry.stored_bytes = None
        await self.ns.settle(entry)
        return self.attributes(entry)

    @boundary
    async def opendir(self, inode: int, ctx: Any) -> int:
        entry = self.ns.get(inode)
        if not entry.is_dir:
            raise pyfuse3.FUSEError(errno.ENOTDIR)
        await self.ns.dir_len(inode)
        return inode

    @boundary
    async def readdir(self, fh: int, start_id: int, token: Any) -> None:
        for i in range(start_id, await self.ns.dir_len(fh)):
            name, entry = await self.ns.dir_item(fh, i)
            if not pyfuse3.readdir_reply(token, os.fsencode(name), self.attributes(entry), i + 1):
                break

    async def releasedir(self, fh: int) -> None:
        pass

    @boundary
    async def open(self, inode: int, flags: int, ctx: Any) -> pyfuse3.FileInfo:
        entry = self.ns.get(inode)
        if entry.is_dir:
            raise pyfuse3.FUSEError(errno.EISDIR)
        if flags & (os.O_WRONLY | os.O_RDWR | os.O_TRUNC | os.O_APPEND):
            raise ReadOnly("read-only mount")
        if entry.error is not None:
            node = entry.node
            log.warning("%s: %s", node.key if isinstance(node, BrokenNode) else node.path, entry.error)
            raise entry.error
        await self.ns.settle(entry)
        snapshot = entry.content
        if entry.kind == "stats":
            snapshot = self.ns.stats_bytes()  # fresh at every open
        fh = self._next_fh
        self._next_fh += 1
        self._handles[fh] = (entry, snapshot)
        # The store is read-only for us, so pages the kernel cached stay valid;
        # generated files bypass the page cache so each open sees its own snapshot.
        generated = entry.kind == "stats"
        return pyfuse3.FileInfo(fh=fh, keep_cache=not generated, direct_io=generated)

    @boundary
    async def read(self, fh: int, off: int, size: int) -> bytes:
        entry, snapshot = self._handles[fh]
        if snapshot is not None:
            return snapshot[off:off + size]
        if entry.kind == "storekey":
            return await self.engine.read_key(entry.key, off, size, entry.size)
        return await self.engine.read(entry.stream, off, size)

    async def release(self, fh: int) -> None:
        self._handles.pop(fh, None)

    async def flush(self, fh: int) -> None:
        pass

    @boundary
    async def access(self, inode: int, mode: int, ctx: Any) -> bool:
        self.ns.get(inode)
        if mode & os.W_OK:
            raise ReadOnly("read-only mount")
        return True

    @boundary
    async def getxattr(self, inode: int, name: bytes, ctx: Any) -> bytes:
        value = self.ns.xattrs(self.ns.get(inode)).get(fs_name(name))
        if value is None:
            raise pyfuse3.FUSEError(pyfuse3.ENOATTR)
        return value

    @boundary
    async def listxattr(self, inode: int, ctx: Any) -> list[bytes]:
        return [n.encode() for n in self.ns.xattrs(self.ns.get(inode))]

    @boundary
    async def statfs(self, ctx: Any) -> pyfuse3.StatvfsData:
        st = pyfuse3.StatvfsData()
        st.f_bsize = IO_BLOCK_SIZE
        st.f_frsize = BLOCK_SIZE
        st.f_blocks = st.f_bfree = st.f_bavail = 0
        st.f_files = st.f_ffree = st.f_favail = 0
        st.f_namemax = 255
        return st

    # --- every change is refused until writes land --------------------------------

    async def _refuse(self, *args: Any) -> None:
        raise pyfuse3.FUSEError(errno.EROFS)

    setattr = mknod = mkdir = unlink = rmdir = symlink = rename = link = _refuse
    create = write = setxattr = removexattr = _refuse


def _opt(options: Options, name: str, default: Any) -> Any:
    for item in options.fuse_options:
        key, _, value = item.partition("=")
        if key == name:
            return value
    return default
