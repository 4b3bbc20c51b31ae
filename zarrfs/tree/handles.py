"""Open files: one object per open(2), of a class per kind of file, each with read/write/flush/fsync/release.

A handle holds what its open needs: the bytes of a generated file fixed at open, its own
read-ahead state, the entry it reads. The state shared by every open of one file (an
array being written, a held file's bytes) stays with the entry; what all open files share
(how many are open, the bytes their statistics rewrites hold) with `OpenFiles`, which
checks the flags of an open and picks the class. The FUSE layer only maps file handles to
these objects.
"""

from __future__ import annotations

import logging
import math
import os
import time
from typing import TYPE_CHECKING, Protocol

from ..engine import ReadAhead
from ..errors import (
    AccessDenied,
    InvalidArgument,
    IsADir,
    NoSpace,
    NotFound,
    NotPermitted,
    ReadOnly,
    Stale,
    TooBig,
)
from ..model import BrokenNode
from ..views import images
from ..views.kinds import ARRAY_FILE_KINDS, Kind
from ..views.streams import ByteStream

if TYPE_CHECKING:
    from ..engine import Engine
    from .contents import Contents
    from .entries import Entry
    from .freshness import Freshness
    from .inodes import Inodes
    from .plain import PlainFile
    from .statistics import SavedStatistics

log = logging.getLogger(__name__)

WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_TRUNC | os.O_APPEND
# Statistics rewrites held by open descriptors take at most this much memory together (any user
# can write them, read-only mounts too): room for a VRT of some ten thousand bands.
REWRITES_MAX_BYTES = 8 << 20


class FileTree(Protocol):
    """What open files ask of the namespace: its writes, each sent to plain files or arriving
    files by the entry's kind at the time (a held file renamed to NAME.npy while open becomes an
    array), the pages the kernel keeps, and the text of stats.json."""

    async def truncate(self, entry: Entry, size: int = 0) -> None: ...

    async def write(self, entry: Entry, offset: int, data: bytes) -> int: ...

    async def sync(self, entry: Entry) -> None: ...

    async def close(self, entry: Entry) -> None: ...

    async def release(self, entry: Entry) -> None: ...

    def forget_pages(self, inodes: list[int]) -> None: ...

    def stats_bytes(self) -> bytes: ...


class OpenFiles:
    """The files open on a mount: the parts their handles use, how many are open, and the bytes
    their statistics rewrites hold together."""

    def __init__(
        self,
        engine: Engine,
        inodes: Inodes,
        *,
        freshness: Freshness,
        contents: Contents,
        statistics: SavedStatistics,
        tree: FileTree,
        writes_allowed: bool,
    ) -> None:
        self.engine = engine
        self.inodes = inodes
        self.freshness, self.contents, self.statistics = freshness, contents, statistics
        self.tree = tree
        self.writes_allowed = writes_allowed
        self.count = 0  # open handles
        self.rewrite_bytes = 0  # bytes of statistics rewrites held by open descriptors

    def opened(self, entry: Entry, kind: type[Handle] | None = None) -> Handle:
        """A handle on `entry` (of class KIND, else the one its kind of file takes), counted as
        open (a created file, or one `open_file` checked)."""
        entry.opens += 1
        self.count += 1
        return kind(self, entry) if kind is not None else _handle_for(self, entry)

    async def open_file(self, entry: Entry, flags: int) -> Handle:
        """open(2) of an existing file: EISDIR, EROFS, EACCES, EINVAL (O_APPEND on an array),
        EPERM (a read-only representation), or the entry's own error; O_TRUNC starts a replacement."""
        if entry.is_dir:
            raise IsADir("a directory")
        await self.freshness.follow(entry)  # an entry the kernel kept across a refresh shows what the store holds now
        if flags & WRITE_FLAGS:
            self._check_write_open(entry, flags)
            if entry.saves_statistics:
                return self.opened(entry, StatisticsRewriteHandle)
            if flags & os.O_TRUNC:
                await self.tree.truncate(entry)
                return self.opened(entry)
        w = entry.writing
        if entry.error is not None and (w is None or w.pending is None) and entry.kind is not Kind.PLAIN:
            node = entry.node
            what = node.key if isinstance(node, BrokenNode) else node.path if node is not None else entry.key or ""
            if not isinstance(entry.error, Stale):  # (replaced in the store, said once: the kernel looks it up again)
                self.engine.note_failure(entry.error, what)
            raise entry.error
        if entry.kind is Kind.STATS and entry.view == "refresh":
            await self.freshness.revalidate(
                force=True
            )  # opening .zarrfs/refresh (cat, touch) drops listings and metadata
        await self.contents.settle(entry)
        handle = self.opened(entry)
        handle.o_direct = bool(flags & os.O_DIRECT)
        return handle

    def _check_write_open(self, entry: Entry, flags: int) -> None:
        if entry.saves_statistics and flags & os.O_TRUNC and not flags & os.O_APPEND:
            return  # a rewrite that saves statistics (StatisticsRewriteHandle)
        if not self.writes_allowed:
            raise ReadOnly("read-only mount")
        if not entry.writable:
            raise AccessDenied(f"{entry.kind.value} files cannot be written")
        if flags & os.O_APPEND and entry.kind is not Kind.PLAIN:
            raise InvalidArgument("arrays do not grow: O_APPEND is refused")
        reason = getattr(entry.node, "read_only", None)
        if reason and not flags & os.O_TRUNC:  # shown in a form that cannot be written back (vlen strings)
            log.warning("%s: %s", entry.array.metadata_key, reason)
            raise NotPermitted(f"{entry.array.path or '/'}: {reason}")


class Handle:
    """An open file. Reads and writes of a kind that has none fail (EACCES for writes)."""

    # Bypass the kernel's page cache (files whose every open sees different bytes).
    direct_io = False
    # Opened with O_DIRECT: a read(2) larger than the kernel's largest request comes as several.
    o_direct = False
    # Writes reach it on a read-only mount (else they fail with EROFS before it sees them).
    writes_on_read_only = False

    def __init__(self, files: OpenFiles, entry: Entry) -> None:
        self.files = files
        self.engine = files.engine
        self.entry = entry
        self._told_stale = False

    async def current(self) -> None:
        """Before a read of an array's bytes: the TTL is checked, the entry follows the store (once
        per TTL or refresh); one replaced in the store since this open fails from then on (ESTALE:
        freshness.py)."""
        freshness = self.files.freshness
        if freshness.due():  # the TTL runs out for readers of open files too, not only for lookups
            await freshness.revalidate()
        await freshness.follow(self.entry)
        if isinstance(self.entry.error, Stale) and not self._told_stale:
            self._told_stale = True
            log.warning("%s; reads of a file opened before fail with ESTALE (open it again)", self.entry.error)

    async def read(self, offset: int, size: int) -> bytes | memoryview:
        raise AccessDenied("not a file")

    def read_now(self, offset: int, size: int) -> bytes | memoryview | None:
        """The bytes of a read that needs no wait, replied before any other task runs; None: `read`."""
        return None

    async def write(self, offset: int, data: bytes) -> int:
        raise AccessDenied(f"{self.entry.kind.value} files cannot be written")

    async def flush(self) -> None:
        """close(2) of one descriptor."""

    async def fsync(self) -> None:
        """fsync(2)."""

    async def release(self) -> None:
        """The last descriptor of this open is closed."""
        self.entry.opens -= 1
        self.files.count -= 1
        if self.entry.opens == 0 and self.files.writes_allowed:
            await self.files.tree.release(self.entry)
        self.files.inodes.drop_unused([self.entry])


class SnapshotHandle(Handle):
    """A generated file (stats.json, info/*.json): its bytes as they were at open."""

    def __init__(self, files: OpenFiles, entry: Entry, content: bytes, direct_io: bool = False) -> None:
        super().__init__(files, entry)
        self.content = content
        self.direct_io = direct_io

    async def read(self, offset: int, size: int) -> bytes | memoryview:
        return self.content[offset : offset + size]


class StoreKeyHandle(Handle):
    """A store key under `.zarrfs/store/`, byte for byte."""

    async def read(self, offset: int, size: int) -> bytes | memoryview:
        return await self.engine.read_key(self.entry.known_key, offset, size, self.entry.size)


class ArrayHandle(Handle):
    """An array's file in one layout (the main tree's .npy, npy-f, raw, raw-f, a chunk file),
    or a new NPY file being written; read-ahead follows this open's sequential reads only."""

    def __init__(self, files: OpenFiles, entry: Entry) -> None:
        super().__init__(files, entry)
        self.readahead = ReadAhead()
        # This open's run of reads, each starting where the last ended: where it ends, when a read
        # of it last arrived or was answered, and the freshness epoch whose versions it shows.
        self._run_end = -1
        self._touched = -math.inf
        self._run_epoch = -1

    def _continues(self, offset: int) -> bool:
        """Whether a read arriving now continues this open's run back to back: the kernel sends the
        requests of one O_DIRECT read(2) larger than 1 MiB together, or one after another."""
        gap = time.monotonic() - self._touched
        return self.o_direct and offset == self._run_end and gap <= self.files.freshness.pin_s

    def _pinned(self, continues: bool) -> bool:
        """Whether a read takes the versions the TTL's last start dropped: it continues an O_DIRECT
        read whose earlier requests showed them, or the kernel may hold pages of them
        (freshness.pinned)."""
        freshness = self.files.freshness
        return freshness.pinned(self.entry, continues and self._run_epoch < freshness.epoch)

    def _shows(self, offset: int, size: int, continues: bool, pinned: bool) -> None:
        """A read of the run arrived (or was answered): the run shows what it shows."""
        self._run_end, self._touched = offset + size, time.monotonic()
        if not (continues and pinned):
            epoch = self.files.freshness.epoch
            self._run_epoch = epoch - 1 if pinned else epoch

    def read_now(self, offset: int, size: int) -> bytes | memoryview | None:
        entry = self.entry
        freshness = self.files.freshness
        if (
            entry.writing is not None
            or entry.error is not None
            or entry.checked != freshness.epoch
            or freshness.due()  # the TTL ran out: `read` starts it again first
            or (entry.kind is Kind.TIFF and entry.laid_out is None)  # its header needs its georeference
        ):
            return None
        continues = self._continues(offset)
        if self._pinned(continues):  # (fast paths know nothing of pinned versions)
            return None
        data = self.engine.read_now(entry.stream, offset, size, self.readahead)
        if data is not None:
            self._shows(offset, size, continues, False)
        return data

    async def read(self, offset: int, size: int) -> bytes | memoryview:
        entry, w = self.entry, self.entry.writing
        if w is not None and w.stream is not None:  # a file being written: the writer's own layout
            return await self.engine.read(w.stream, offset, size, readahead=self.readahead)
        if w is not None and w.pending is not None:  # no NPY header yet: only what was written so far
            return bytes(w.pending[offset : offset + size])
        continues = self._continues(offset)
        self._run_end, self._touched = offset + size, time.monotonic()  # a request sent with it continues it
        await self.current()
        if entry.error is not None:
            raise entry.error
        if entry.kind is Kind.TIFF and entry.laid_out is None:  # shown another node: its header is made again
            await self.files.contents.settle(entry)
        pinned = self._pinned(continues)
        self._shows(offset, size, continues, pinned)
        data = await self.engine.read(entry.stream, offset, size, readahead=self.readahead, reply=True, pinned=pinned)
        self._touched = time.monotonic()
        return data

    async def write(self, offset: int, data: bytes) -> int:
        return await self.files.tree.write(self.entry, offset, data)

    async def flush(self) -> None:
        """The written chunks are in the store when it returns (or it fails with EIO); a new
        array completed by this close is committed. One still incomplete is left to the last
        close (release): FUSE flushes at the close of every descriptor, a forked child's too."""
        if self.files.writes_allowed:
            await self.files.tree.close(self.entry)

    async def fsync(self) -> None:
        if self.files.writes_allowed:
            await self.files.tree.sync(self.entry)


class LaidOutHandle(Handle):
    """A file laid out as header bytes and parts of arrays (netCDF, OME-TIFF): header reads made
    at once from their offsets, the parts read through the engine with one read-ahead state each
    (a reader of the whole file reads each in turn)."""

    def __init__(self, files: OpenFiles, entry: Entry) -> None:
        super().__init__(files, entry)
        self.readaheads: dict[int, ReadAhead] = {}

    def read_now(self, offset: int, size: int) -> bytes | None:
        """A read of header bytes alone (directories, tables, the OME-XML: what readers parse
        first, in many small reads) is made from their offsets at once."""
        entry = self.entry
        freshness = self.files.freshness
        if entry.error is not None or entry.checked != freshness.epoch or freshness.due() or entry.laid_out is None:
            return None
        parts = list(entry.laid_out.parts(offset, size))
        if not all(isinstance(p, bytes) for p in parts):
            return None
        return parts[0] if len(parts) == 1 else b"".join(parts)

    async def read(self, offset: int, size: int) -> bytes | memoryview:
        await self.current()
        if self.entry.error is not None:
            raise self.entry.error
        out: list[bytes | memoryview] = []
        for part in self.entry.stream.parts(offset, size):
            if isinstance(part, bytes):
                out.append(part)
            else:
                i, stream, off, n = part
                ahead = self.readaheads.setdefault(i, ReadAhead())
                out.append(await self.read_part(i, stream, off, n, ahead))
        return out[0] if len(out) == 1 else b"".join(out)

    async def read_part(self, i: int, stream: ByteStream, off: int, n: int, ahead: ReadAhead) -> bytes | memoryview:
        """Bytes [OFF, OFF+N) of part I, whose bytes STREAM holds."""
        return await self.engine.read(stream, off, n, readahead=ahead)


class NetcdfHandle(LaidOutHandle):
    """A group's netCDF file: each variable's big-endian elements made from its array's bytes."""

    async def read_part(self, i: int, stream: ByteStream, off: int, n: int, ahead: ReadAhead) -> bytes | memoryview:
        var = self.entry.stream.variables[i]
        start, length = var.source_range(off, n)
        raw = await self.engine.read(stream, start, length, readahead=ahead)
        return var.data_bytes(raw, off, n)


class OmeTiffHandle(LaidOutHandle):
    """An image's OME-TIFF file: each level's tiles read through the engine."""


class StatisticsRewriteHandle(Handle):
    """gdal/PATH.vrt or raw/PATH.raw.aux.xml opened to be rewritten whole (O_TRUNC), as GDAL does
    to save the statistics it computed: they are kept (read-only mounts too), any other change
    is refused."""

    # Accepted on a read-only mount: GDAL reports an error when it cannot save statistics.
    writes_on_read_only = True
    # Each open reads the text made from the kept statistics, not pages left by the writer.
    direct_io = True

    def __init__(self, files: OpenFiles, entry: Entry) -> None:
        super().__init__(files, entry)
        self.written = bytearray()
        self.changed = False  # written to since the last close of a descriptor

    async def read(self, offset: int, size: int) -> bytes | memoryview:
        return bytes(self.written[offset : offset + size])

    async def write(self, offset: int, data: bytes) -> int:
        end = offset + len(data)
        name = f"{self.entry.view}/{self.entry.array.path}"
        if end > images.max_rewrite_bytes(self.entry.array):
            raise TooBig(f"{name}: a rewrite of {end} bytes is more than statistics")
        grow = end - len(self.written)
        if grow > 0:
            if self.files.rewrite_bytes + grow > REWRITES_MAX_BYTES:
                error = NoSpace(
                    f"{name}: statistics not saved: the rewrites open on this mount would hold "
                    f"more than {REWRITES_MAX_BYTES >> 20} MiB"
                )
                self.engine.note_failure(error, name)  # said once a minute at most
                raise error
            self.files.rewrite_bytes += grow
            self.written.extend(bytes(grow))
        self.written[offset:end] = data
        self.changed = True
        return len(data)

    async def flush(self) -> None:
        """close(2): the statistics the written text adds are kept; EROFS (EACCES on a writable
        mount) for a text that changes anything else."""
        if not self.changed:
            return
        self.changed = False
        if not await self.files.statistics.keep(self.entry, bytes(self.written)):
            log.warning(
                "%s/%s: a rewrite that changes more than band statistics is refused (%s)",
                self.entry.view,
                self.entry.array.path,
                self.entry.kind.value,
            )
            raise (AccessDenied if self.files.writes_allowed else ReadOnly)("only statistics can be saved here")

    async def release(self) -> None:
        self.files.rewrite_bytes -= len(self.written)
        self.written = bytearray()
        await super().release()
        # The kernel keeps the writer's pages and size: drop them, the text is made again.
        self.files.tree.forget_pages([self.entry.inode])


class PlainFileHandle(Handle):
    """A plain file (any name but NAME.npy): its bytes in the daemon while written, kept in
    the store at fsync and a few seconds after a close (write-back)."""

    def _held(self) -> PlainFile:
        if self.entry.plain is None:
            raise self.entry.error or NotFound("removed")
        return self.entry.plain

    async def read(self, offset: int, size: int) -> bytes | memoryview:
        return await self._held().read(offset, size)

    async def write(self, offset: int, data: bytes) -> int:
        return await self._held().write(offset, data)

    async def flush(self) -> None:
        """close(2): the file is stored a few seconds later (unless renamed to NAME.npy or
        removed first), as a file system's page cache writes back; fsync stores it at once."""
        if self.files.writes_allowed and self.entry.plain is not None:
            await self.files.tree.close(self.entry)

    async def fsync(self) -> None:
        if self.files.writes_allowed and self.entry.plain is not None:
            await self.files.tree.sync(self.entry)


def _handle_for(files: OpenFiles, entry: Entry) -> Handle:
    if entry.kind is Kind.STATS and entry.view == "refresh":
        return SnapshotHandle(files, entry, b"", direct_io=True)
    if entry.kind is Kind.STATS:
        return SnapshotHandle(files, entry, files.tree.stats_bytes(), direct_io=True)  # fresh at every open
    if entry.kind in (Kind.INFO, Kind.TEXT, Kind.PAM, Kind.PREVIEW, Kind.VERSIONLOG):
        return SnapshotHandle(files, entry, entry.content or b"")
    if entry.kind is Kind.STOREKEY:
        return StoreKeyHandle(files, entry)
    if entry.kind is Kind.PLAIN:
        return PlainFileHandle(files, entry)
    if entry.kind is Kind.NETCDF:
        return NetcdfHandle(files, entry)
    if entry.kind is Kind.OMETIFF:
        return OmeTiffHandle(files, entry)
    if entry.kind in ARRAY_FILE_KINDS:
        return ArrayHandle(files, entry)
    return Handle(files, entry)
