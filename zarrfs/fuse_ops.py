"""The pyfuse3 Operations: translate each request to the namespace and engine; the errno boundary."""

from __future__ import annotations

import errno
import functools
import logging
import os
import stat
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any, Concatenate, NoReturn, ParamSpec, TypeVar

import pyfuse3

from .engine import Engine
from .errors import InvalidArgument, NotADir, ReadOnly, ZarrfsError
from .options import Options
from .tree.commits import Commits, entry_path
from .tree.entries import Entry, Kind, fs_name
from .tree.handles import Handle
from .tree.namespace import Namespace

log = logging.getLogger(__name__)

# Metadata of a read-only mount changes only if the store is changed behind our back;
# a minute keeps lookups off the Python server without hiding such changes for long.
ATTR_TIMEOUT_S = 60.0
# With writes, names and sizes change under the kernel's caches: keep them short.
WRITABLE_ATTR_TIMEOUT_S = 1.0
BLOCK_SIZE = 512  # st_blocks unit, fixed by POSIX
# df asks often; summing a local store's file sizes walks it, so a total is reused this long.
STATFS_TTL_S = 30.0
IO_BLOCK_SIZE = 1 << 20  # st_blksize: tools like cp read in units of this size
# Directory entries made per step of a readdir: a readdirplus reply of one page holds about
# 25 (each carries its attributes), so few entries are made for nothing when it fills up.
READDIR_BATCH = 32
XATTR_PREFIX = b"user.zarr."  # the only extended attributes there are (registry.xattrs)


def invalidate_name(parent_inode: int, name: str) -> None:
    """Tell the kernel to drop a name it may cache (a removed or replaced node)."""
    pyfuse3.invalidate_entry_async(parent_inode, os.fsencode(name), ignore_enoent=True)


def invalidate_data_sync(inodes: list[int]) -> None:
    """Tell the kernel to drop the cached pages and attributes of files whose data may have changed
    in the store (after a refresh); runs in a worker thread (the kernel may call back into us)."""
    for inode in inodes:
        try:
            pyfuse3.invalidate_inode(inode, attr_only=False)
        except OSError:  # ENOENT: the kernel holds nothing of it
            pass


# renameat2(2)'s flag that refuses to replace an existing target (linux/fs.h); the others are
# RENAME_EXCHANGE (2) and RENAME_WHITEOUT (4).
RENAME_NOREPLACE = 1


def fuse_error(name: str, args: tuple[object, ...], e: Exception) -> pyfuse3.FUSEError:
    """The FUSEError a handler's exception ends its request with (logged, unless it is one)."""
    if isinstance(e, pyfuse3.FUSEError):
        return e
    if isinstance(e, ZarrfsError):
        level = (
            logging.WARNING
            if e.errno in (errno.EIO, errno.EOPNOTSUPP, errno.EINVAL, errno.EFBIG) and not e.logged
            else logging.DEBUG
        )
        log.log(level, "%s: %s", name, e)
        return pyfuse3.FUSEError(e.errno)
    if isinstance(e, OSError):
        log.warning("%s: %s", name, e)
        return pyfuse3.FUSEError(e.errno or errno.EIO)
    log.error("unexpected error in %s%r", name, args[:2], exc_info=e)
    return pyfuse3.FUSEError(errno.EIO)


P = ParamSpec("P")
R = TypeVar("R")


def boundary(
    fn: Callable[Concatenate[ZarrOperations, P], Awaitable[R]],
) -> Callable[Concatenate[ZarrOperations, P], Coroutine[Any, Any, R]]:
    """Only FUSEError may leave a handler: map ours to their errno, log and EIO the rest."""

    @functools.wraps(fn)
    async def wrapper(self: ZarrOperations, /, *args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return await fn(self, *args, **kwargs)
        except Exception as e:
            raise fuse_error(fn.__name__, args, e) from None

    return wrapper


class ZarrOperations(pyfuse3.Operations):
    """Read-only file system operations over a Namespace."""

    enable_writeback_cache = False

    def __init__(self, namespace: Namespace, engine: Engine, options: Options) -> None:
        super().__init__()
        self.ns = namespace
        self.engine = engine
        self.options = options
        self.uid = int(_opt(options, "uid", str(os.getuid())))
        self.gid = int(_opt(options, "gid", str(os.getgid())))
        self.umask = int(_opt(options, "umask", "0"), 8)
        self._statfs: tuple[float, int | None, int | None] | None = None  # (when, stored, free)
        self._handles: dict[int, Handle] = {}  # open files by fh
        # Who opened each file and directory: pyfuse3 names no process in read and readdir, and a
        # request waiting on the store ends early when that process gets a signal (engine.interrupts).
        self._openers: dict[int, int] = {}
        self._dir_openers: dict[int, int] = {}
        self._next_fh = 1
        self.commits = Commits(engine, namespace.inodes, namespace.versions, namespace.writing_files, options.writable)

    def attributes(self, entry: Entry) -> pyfuse3.EntryAttributes:
        attr = pyfuse3.EntryAttributes()
        attr.st_ino = entry.inode
        attr.generation = 0
        # The kernel keeps names, sizes and pages no longer than zarrfs trusts them (metadata_ttl).
        attr.entry_timeout = min(ATTR_TIMEOUT_S, self.ns.freshness.metadata_ttl_s)
        attr.attr_timeout = min(ATTR_TIMEOUT_S, self.ns.freshness.tell(entry))
        writable = (
            self.options.writable and (entry.writable or (entry.kind is Kind.GROUP and entry.view == ""))
        ) or entry.saves_statistics
        if entry.is_dir:
            attr.st_mode = stat.S_IFDIR | ((0o755 if writable else 0o555) & ~self.umask)
            attr.st_nlink = 2
        else:
            attr.st_mode = stat.S_IFREG | ((0o644 if writable else 0o444) & ~self.umask)
            attr.st_nlink = 1
        if self.options.writable:
            # Sizes change when an array is replaced through any of its names: the kernel
            # asks again each time (reads past the size it knows refresh it too).
            attr.entry_timeout = WRITABLE_ATTR_TIMEOUT_S
            attr.attr_timeout = 0.0
            staged = entry.writing is not None and entry.writing.staged is not None
            if entry.kind is Kind.PLAIN or (entry.kind is Kind.ARRAY and (entry.node is None or staged)):
                attr.entry_timeout = attr.attr_timeout = 0.0  # may vanish, or become an array
        attr.st_size = max(entry.size, 0)
        stored = entry.stored_bytes if entry.stored_bytes is not None else entry.size
        attr.st_blocks = -(-max(stored, 0) // BLOCK_SIZE)
        if entry.kind is Kind.STATS:
            attr.attr_timeout = 0.0  # its size changes with every read
        attr.st_blksize = IO_BLOCK_SIZE
        attr.st_uid = self.uid
        attr.st_gid = self.gid
        mtime = max(self.ns.times.shown_ns(entry), self.ns.freshness.changed_ns(entry))  # (the kernel drops pages)
        attr.st_atime_ns = attr.st_mtime_ns = attr.st_ctime_ns = mtime
        return attr

    # --- reading the tree ---------------------------------------------------------

    async def _reply(self, entry: Entry) -> pyfuse3.EntryAttributes:
        """Attributes of an entry the reply hands to the kernel, which then holds a reference."""
        try:
            await self.ns.times.resolve([entry])
            attr = self.attributes(entry)
        except BaseException:
            self.ns.drop_unused([entry])
            raise
        self.ns.remember(entry)
        return attr

    @boundary
    async def lookup(
        self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext | None = None
    ) -> pyfuse3.EntryAttributes:
        with self.engine.interrupts.watch(getattr(ctx, "pid", None)):
            return await self._reply(await self.ns.lookup(parent_inode, fs_name(name)))

    async def forget(self, inode_list: Sequence[tuple[int, int]]) -> None:
        """The kernel dropped references: entries nothing refers to are freed (must not raise)."""
        for inode, nlookup in inode_list:
            try:
                self.ns.forget(inode, nlookup)
            except Exception:
                log.exception("forget of inode %d", inode)

    @boundary
    async def getattr(self, inode: int, ctx: pyfuse3.RequestContext | None = None) -> pyfuse3.EntryAttributes:
        entry = self.ns.get(inode)
        if entry.kind is Kind.STATS:
            entry.stored_bytes = None
        with self.engine.interrupts.watch(getattr(ctx, "pid", None)):
            await self.ns.freshness.check_file(entry)  # the kernel drops pages of changed chunks
            await self.ns.settle(entry)
            await self.ns.times.resolve([entry])
        return self.attributes(entry)

    @boundary
    async def opendir(self, inode: int, ctx: pyfuse3.RequestContext) -> int:
        if not self.ns.get(inode).is_dir:
            raise NotADir("not a directory")
        self._dir_openers[inode] = ctx.pid
        with self.engine.interrupts.watch(ctx.pid):
            await self.ns.dir_len(inode)
        return inode

    @boundary
    async def readdir(self, fh: int, start_id: int, token: pyfuse3.ReaddirToken) -> None:
        # Offsets 1 and 2 are `.` and `..` (as ls -a, find and file managers expect); the kernel
        # takes no reference on either, so they are not remembered.
        dots = ((b".", self.ns.get(fh)), (b"..", self.ns.parent_dir(fh)))
        for i in range(start_id, len(dots)):
            if not pyfuse3.readdir_reply(token, dots[i][0], self.attributes(dots[i][1]), i + 1):
                return
        start = max(start_id - len(dots), 0)
        while batch := await self._watched(self._dir_openers.get(fh), self.ns.dir_items(fh, start, READDIR_BATCH)):
            await self._watched(self._dir_openers.get(fh), self.ns.times.resolve([entry for _, entry in batch]))
            for i, (name, entry) in enumerate(batch):
                if not pyfuse3.readdir_reply(
                    token, os.fsencode(name), self.attributes(entry), len(dots) + start + i + 1
                ):
                    self.ns.drop_unused([e for _, e in batch[i:]])  # not sent: no reference taken
                    return
                self.ns.remember(entry)
            start += len(batch)

    async def releasedir(self, fh: int) -> None:
        self._dir_openers.pop(fh, None)

    async def _watched(self, pid: int | None, awaitable: Awaitable[R]) -> R:
        """`await awaitable`, ended with EINTR when process `pid` gets a signal meanwhile."""
        with self.engine.interrupts.watch(pid):
            return await awaitable

    def _file_info(self, handle: Handle) -> pyfuse3.FileInfo:
        fh = self._next_fh
        self._next_fh += 1
        self._handles[fh] = handle
        # Read-only: pages the kernel cached stay valid. Writable: another view or writer may
        # have changed the data, so each open starts without cached pages. Generated files
        # bypass the page cache so each open sees its own snapshot.
        return pyfuse3.FileInfo(
            fh=fh,
            keep_cache=not handle.direct_io
            and not self.options.writable
            and self.ns.freshness.keep_pages(handle.entry),  # else this open reads anew
            direct_io=handle.direct_io,
        )

    @boundary
    async def open(self, inode: int, flags: int, ctx: pyfuse3.RequestContext) -> pyfuse3.FileInfo:
        with self.engine.interrupts.watch(ctx.pid):
            info = self._file_info(await self.ns.open(inode, flags))
        self._openers[info.fh] = ctx.pid
        if flags & (os.O_WRONLY | os.O_RDWR):
            self.commits.opened(info.fh, ctx.uid)
        return info

    async def read(self, fh: int, off: int, size: int) -> bytes | memoryview:  # type: ignore[override]
        # The errno boundary written out (no @boundary): the most frequent request, one
        # coroutine less.
        try:
            handle = self._handles[fh]
            data = handle.read_now(off, size)  # no wait: nothing to watch (most random reads)
            if data is None:
                with self.engine.interrupts.watch_read(self._openers.get(fh), handle.entry.inode, off, size):
                    data = await handle.read(off, size)
            return data
        except Exception as e:
            raise fuse_error("read", (fh, off), e) from None

    @boundary
    async def release(self, fh: int) -> None:
        self._openers.pop(fh, None)
        self.commits.released(fh)
        await self._handles.pop(fh).release()

    @boundary
    async def flush(self, fh: int) -> None:
        """close(): see ArrayHandle.flush."""
        handle = self._handles[fh]
        await handle.flush()
        await self.commits.file_done("close", fh, handle.entry)

    @boundary
    async def fsync(self, fh: int, datasync: bool) -> None:
        handle = self._handles[fh]
        await handle.fsync()
        await self.commits.file_done("fsync", fh, handle.entry)

    # --- writes (with -o writable) --------------------------------------------------

    def _check_writable(self) -> None:
        if not self.options.writable:
            raise ReadOnly("read-only mount")

    @boundary
    async def write(self, fh: int, off: int, buf: bytes) -> int:
        handle = self._handles[fh]
        if handle.writes_on_read_only:  # statistics GDAL saves: the array and its time are unchanged
            return await handle.write(off, buf)
        self._check_writable()
        self.commits.wrote(fh)
        self.ns.touched(handle.entry)
        return await handle.write(off, buf)

    @boundary
    async def create(
        self, parent_inode: int, name: bytes, mode: int, flags: int, ctx: pyfuse3.RequestContext
    ) -> tuple[pyfuse3.FileInfo, pyfuse3.EntryAttributes]:
        self._check_writable()
        entry, handle = await self.ns.create_file(parent_inode, fs_name(name))
        info = self._file_info(handle)
        self.commits.opened(info.fh, ctx.uid)
        return info, await self._reply(entry)

    @boundary
    async def setattr(
        self,
        inode: int,
        attr: pyfuse3.EntryAttributes,
        fields: pyfuse3.SetattrFields,
        fh: int | None,
        ctx: pyfuse3.RequestContext,
    ) -> pyfuse3.EntryAttributes:
        entry = self.ns.get(inode)
        # The kernel does not refuse these on a read-only mount (it is not mounted `ro`).
        self._check_writable()
        if fields.update_size:
            if attr.st_size == 0 or entry.kind is Kind.PLAIN:
                await self.ns.truncate(entry, attr.st_size)
            elif attr.st_size != entry.size:
                raise InvalidArgument(f"arrays have a fixed size ({entry.size}); truncate to 0 to replace one")
        if fields.update_mtime:
            await self.ns.set_times(entry, attr.st_mtime_ns)
        # Modes, owners and access times are not stored by Zarr: accepted (cp -p, touch), not kept.
        return self.attributes(entry)

    @boundary
    async def mkdir(
        self, parent_inode: int, name: bytes, mode: int, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.EntryAttributes:
        self._check_writable()
        entry = await self.ns.mkdir(parent_inode, fs_name(name))
        await self.commits.done("mkdir", self.commits.path_in(parent_inode, fs_name(name)), ctx.uid)
        return await self._reply(entry)

    @boundary
    async def rmdir(self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> None:
        self._check_writable()
        await self.ns.rmdir(parent_inode, fs_name(name))
        await self.commits.done("rmdir", self.commits.path_in(parent_inode, fs_name(name)), ctx.uid)

    @boundary
    async def unlink(self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> None:
        self._check_writable()
        await self.ns.unlink(parent_inode, fs_name(name))
        await self.commits.done("rm", self.commits.path_in(parent_inode, fs_name(name)), ctx.uid)

    @boundary
    async def rename(
        self,
        parent_inode_old: int,
        name_old: bytes,
        parent_inode_new: int,
        name_new: bytes,
        flags: int,
        ctx: pyfuse3.RequestContext,
    ) -> None:
        self._check_writable()
        if flags & ~RENAME_NOREPLACE:
            # RENAME_EXCHANGE / RENAME_WHITEOUT: callers such as mv fall back to a plain rename on EINVAL.
            log.debug("rename %s: flags %#x are not supported", fs_name(name_old), flags)
            raise pyfuse3.FUSEError(errno.EINVAL)
        what = (
            f"{self.commits.path_in(parent_inode_old, fs_name(name_old))} -> "
            f"{self.commits.path_in(parent_inode_new, fs_name(name_new))}"
        )
        await self.ns.rename(
            parent_inode_old,
            fs_name(name_old),
            parent_inode_new,
            fs_name(name_new),
            replace=not flags & RENAME_NOREPLACE,
            message=self.commits.message("mv", what, ctx.uid),
        )
        await self.commits.done("mv", what, ctx.uid)

    @boundary
    async def setxattr(self, inode: int, name: bytes, value: bytes, ctx: pyfuse3.RequestContext) -> None:
        self._check_writable()
        if fs_name(name) != "user.zarr.attributes":
            raise pyfuse3.FUSEError(errno.EPERM if fs_name(name).startswith("user.zarr.") else errno.ENOTSUP)
        entry = self.ns.get(inode)
        await self.ns.set_attributes(entry, value)
        await self.commits.done("setfattr", entry_path(entry), ctx.uid)

    async def removexattr(self, inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> None:
        raise pyfuse3.FUSEError(errno.EROFS if not self.options.writable else errno.EPERM)

    async def _refuse(self, *args: object) -> NoReturn:
        raise pyfuse3.FUSEError(errno.EROFS if not self.options.writable else errno.EPERM)

    mknod = symlink = link = _refuse  # type: ignore[assignment]  # (refused whatever their arguments)

    @boundary
    async def access(self, inode: int, mode: int, ctx: pyfuse3.RequestContext) -> bool:
        entry = self.ns.get(inode)
        if mode & os.W_OK and not entry.saves_statistics:
            if not self.options.writable:
                raise ReadOnly("read-only mount")
            if not (entry.writable or (entry.kind is Kind.GROUP and entry.view == "")):
                raise pyfuse3.FUSEError(errno.EACCES)
        return True

    @boundary
    async def getxattr(self, inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> bytes:
        if not name.startswith(XATTR_PREFIX):
            # `ls -l` asks every file for security.* and system.* attributes: answered before
            # any user.zarr.* value (JSON) is built.
            raise pyfuse3.FUSEError(pyfuse3.ENOATTR)
        value = self.ns.xattrs(self.ns.get(inode)).get(fs_name(name))
        if value is None:
            raise pyfuse3.FUSEError(pyfuse3.ENOATTR)
        return value

    @boundary
    async def listxattr(self, inode: int, ctx: pyfuse3.RequestContext) -> list[bytes]:
        return [n.encode() for n in self.ns.xattrs(self.ns.get(inode))]

    @boundary
    async def statfs(self, ctx: pyfuse3.RequestContext) -> pyfuse3.StatvfsData:
        st = pyfuse3.StatvfsData()
        st.f_bsize = IO_BLOCK_SIZE
        st.f_frsize = BLOCK_SIZE
        now = time.monotonic()
        if self._statfs is None or now - self._statfs[0] > STATFS_TTL_S:
            store = self.engine.store
            stored = await self.engine.run_io(store.stored_bytes_sync)
            free = await self.engine.run_io(store.free_bytes_sync) if self.options.writable else None
            self._statfs = (now, stored, free)
        _, stored, free = self._statfs
        # Used space is what the hierarchy stores (0 where the store cannot tell cheaply: remote);
        # free space is the local store's file system's when writable, else none.
        used_blocks = -(-(stored or 0) // BLOCK_SIZE)
        free_blocks = (free or 0) // BLOCK_SIZE
        st.f_blocks = used_blocks + free_blocks
        st.f_bfree = st.f_bavail = free_blocks
        st.f_files = st.f_ffree = st.f_favail = 0
        st.f_namemax = 255
        return st


def _opt(options: Options, name: str, default: str) -> str:
    given = dict(item.partition("=")[::2] for item in reversed(options.fuse_options))  # (the first wins)
    return given.get(name, default)
