"""Files being written: an NPY file arriving under NAME.npy, and plain files under other names.

An arriving file buffers its bytes until its NPY header is whole, then streams them into a
staged array (Hierarchy.stage_array) that the close completing it commits, all or nothing.
A file under any other name is a plain file: its bytes are held (memory, then TMPDIR) while
written and kept as a store key of its own at fsync, at unmount, or PLAIN_WRITE_BACK_S after
a close; renamed to NAME.npy before that it becomes that array without ever being stored as
a plain key.
The IncomingWrites mixin gives the Namespace these steps; no trio here (the engine runs
threads and makes locks).
"""

from __future__ import annotations

import bisect
import logging
import os
import tempfile
from typing import TYPE_CHECKING, Any

import numpy as np

from ..views import npy
from ..dtypes import check_fixed_size
from ..errors import (
    Exists,
    Incomplete,
    InvalidArgument,
    NotFound,
    TooBig,
    Unsupported,
    ZarrfsError,
)
from ..formats.datasets import in_dataset
from ..views.streams import ArrayStream
from ..model import NewArray, Node
from .kinds import Kind

if TYPE_CHECKING:
    from .entries import Entry
    from .namespace import Namespace

log = logging.getLogger(__name__)

NPY_SUFFIX = ".npy"
# A held-aside file (a temporary name) stays in memory up to this size, then spills to a
# file in tempfile.gettempdir() (TMPDIR, else /tmp): editors' and rsync's temporary files
# of small arrays never touch the disk, a large one costs no memory.
HELD_MEMORY_BYTES = 8 << 20
# A held file renamed to NAME.npy is streamed into the array in blocks of this size.
ADOPT_BLOCK_BYTES = 1 << 20
# A plain file is stored this long after its last close (unless fsync or unmount stores it
# first): rsync, download tools and editors rename their temporary file right after closing
# it, so its bytes are written once, as the array's chunks. It is also how long a crash of
# the daemon can lose a closed file that was not fsynced (the kernel's own page cache keeps
# dirty pages up to 30 s).
PLAIN_WRITE_BACK_S = 5.0
# After a failed write-back, the next attempt comes this much later.
PLAIN_RETRY_S = 30.0
# Plain files keep at most this many bytes in memory together (a burst of small files closed
# within the write-back delay); past it, a file closed moves its bytes to TMPDIR.
PLAIN_MEMORY_MAX_BYTES = 64 << 20


def is_held_name(name: str) -> bool:
    """Names of plain files (never arrays until renamed): anything but NAME.npy, and hidden
    names (`.x.npy.AbC123` of rsync, `.x.swp` of editors)."""
    return name.startswith(".") or not name.endswith(NPY_SUFFIX) or name == NPY_SUFFIX


class Coverage:
    """Which bytes of a range arrived: sorted, disjoint, merged [start, end) spans."""

    def __init__(self) -> None:
        self._spans: list[tuple[int, int]] = []

    def add(self, start: int, end: int) -> None:
        if end <= start:
            return
        i = bisect.bisect_left(self._spans, (start, start))
        if i and self._spans[i - 1][1] >= start:
            i -= 1
        j = i
        while j < len(self._spans) and self._spans[j][0] <= end:
            start, end = min(start, self._spans[j][0]), max(end, self._spans[j][1])
            j += 1
        self._spans[i:j] = [(start, end)]

    @property
    def covered(self) -> int:
        return sum(end - start for start, end in self._spans)


class HeldFile:
    """The bytes of a plain file (any name but NAME.npy): kept in the store under `key` at
    fsync and write-back, until then in memory up to HELD_MEMORY_BYTES, then in TMPDIR.

    A kept file nobody writes has no local copy: reads go to its key; the first write
    copies it into the spool, block by block.
    """

    def __init__(self, engine: Any, key: str | None, size: int = 0, stored: bool = False) -> None:
        self._engine = engine
        self._spool: Any = None if stored else self._new_spool()
        self._lock = engine.new_lock()  # one seek-and-transfer at a time
        self.key = key  # where it is kept (None: the format keeps no plain files)
        self.size = size
        self.stored = stored  # the key holds it (as of the last store, if dirty)
        self.dirty = not stored  # bytes the key does not hold yet (a new file counts, even empty)
        self.mtime_ns: int | None = None  # set by the writer (utimensat), given to the key when kept
        self.failing = False  # the last write-back failed (said once, tried again)
        self.gone = False  # removed, replaced or an array now: nothing is stored any more
        self._spilled = False  # the spool's bytes are in TMPDIR, not in memory
        self._memory_bytes = 0  # what this file adds to engine.held_memory_bytes

    @staticmethod
    def _new_spool() -> Any:
        return tempfile.SpooledTemporaryFile(max_size=HELD_MEMORY_BYTES, prefix="zarrfs-held-")

    @property
    def lock(self) -> Any:
        """Held while its bytes or key change (a store, a move): `async with held.lock`."""
        return self._lock

    @property
    def needs_entry(self) -> bool:
        """Whether its bytes exist only here (then its entry must stay)."""
        return self.dirty

    def _account(self) -> None:
        """Bring the engine's count of plain files' bytes in memory up to date with this file's."""
        now = self.size if self._spool is not None and not self._spilled else 0
        self._engine.held_memory_bytes += now - self._memory_bytes
        self._memory_bytes = now

    async def spill(self) -> None:
        """Move the bytes held in memory to TMPDIR (SpooledTemporaryFile's rollover)."""
        async with self._lock:
            if self._spool is None or self._spilled:
                return
            await self._engine.run_io(self._spool.rollover)
            self._spilled = True
            self._account()

    async def read(self, offset: int, size: int) -> bytes:
        # Under the lock, kept files too: a rename or group move changes the key under it.
        async with self._lock:
            size = max(0, min(size, self.size - offset))
            spool = self._spool
            if spool is None:
                if size == 0:
                    return b""
                return await self._engine.run_io(self._engine.store.get_range_sync, self.key, offset, offset + size)

            def get() -> bytes:
                spool.seek(offset)
                return spool.read(size)

            return await self._engine.run_io(get)

    def _load_sync(self) -> None:
        """Copy the kept bytes into a new spool (the first write to a kept file)."""
        spool = self._new_spool()
        try:
            for start in range(0, self.size, ADOPT_BLOCK_BYTES):
                spool.write(self._engine.store.get_range_sync(self.key, start, min(start + ADOPT_BLOCK_BYTES,
                                                                                     self.size)))
        except BaseException:
            spool.close()
            raise
        self._spool = spool

    async def _change(self, fn: Any, load: bool = True) -> None:
        def run() -> int:
            if self._spool is None:
                if load:
                    self._load_sync()
                else:  # truncated to nothing: the kept bytes are not needed
                    self._spool = self._new_spool()
            fn()
            self._spool.seek(0, os.SEEK_END)
            return self._spool.tell()

        async with self._lock:
            fresh = self._spool is None
            try:
                self.size = await self._engine.run_io(run)
            finally:
                if fresh and self._spool is not None:
                    self._spilled = False
                self._spilled = self._spilled or self.size > HELD_MEMORY_BYTES  # the spool rolled over
                self._account()
            self.dirty = True

    async def write(self, offset: int, data: bytes) -> int:
        def put() -> None:
            if offset + len(data) > HELD_MEMORY_BYTES:
                self._spool.rollover()  # before a seek past the end: in memory the gap takes memory
            self._spool.seek(offset)
            self._spool.write(data)

        await self._change(put)
        return len(data)

    async def resize(self, size: int) -> None:
        def resize() -> None:
            self._spool.seek(0, os.SEEK_END)
            end = self._spool.tell()
            if size < end or size > HELD_MEMORY_BYTES:
                self._spool.truncate(size)  # past HELD_MEMORY_BYTES it rolls over, and a file's truncate extends
            elif size > end:  # in memory, truncate does not extend: write the zeros
                self._spool.write(bytes(size - end))

        await self._change(resize, load=size > 0)

    async def keep(self) -> None:
        """Store what changed under `key` (streamed from the spool), with the writer's time."""
        if self.key is None:
            return
        async with self._lock:
            if self.gone:  # removed or renamed to an array while this waited
                return
            key, dirty, mtime_ns, spool = self.key, self.dirty, self.mtime_ns, self._spool

            def put() -> None:
                if dirty:
                    spool.seek(0)
                    self._engine.store.put_stream_sync(key, spool)
                if mtime_ns is not None:
                    self._engine.store.set_mtime_sync(key, mtime_ns)

            await self._engine.run_io_long(put)
            if dirty:
                self._engine.counters["plain_files_stored"] += 1
                self._engine.counters["plain_bytes_stored"] += self.size
            self.dirty, self.stored = False, True

    def unload(self) -> None:
        """Drop the local copy of a kept file (its last close): reads go to the store."""
        if self.stored and not self.dirty and self._spool is not None:
            self._spool.close()
            self._spool = None
            self._account()

    def close(self) -> None:
        """Its bytes are no longer needed here (stored, removed, or an array now)."""
        self.gone = True
        if self._spool is not None:
            self._spool.close()
            self._spool = None
            self._account()


class Incoming:
    """An NPY file being written into an array: its bytes until the header is whole (`pending`),
    then the staged array it fills (`staged`), the writer's own layout (`stream`: its order and
    header), the data bytes that arrived (`received`), or why it will not be an array (`rejected`).
    After the commit only `stream` is left, for the writer's own reads until its last close."""

    def __init__(self, replacing: Node | None) -> None:
        self.pending: bytearray | None = bytearray()
        self.replacing = replacing  # the array it replaces
        self.staged: Any = None
        self.stream: ArrayStream | None = None
        self.received: Coverage | None = None
        self.rejected: ZarrfsError | None = None
        self.mtime_ns: int | None = None  # set by the writer before the commit (cp -p)

    @property
    def size(self) -> int | None:
        if self.stream is not None:
            return self.stream.size
        return len(self.pending) if self.pending is not None else None

    def reject(self, error: ZarrfsError) -> ZarrfsError:
        """It will not become an array: later writes fail too, the last close drops it."""
        self.pending = bytearray()
        self.rejected = error
        return error

    def header_problem(self, name: str) -> InvalidArgument | None:
        """Why a file given some bytes but no whole NPY header cannot be an array (None: it is fine)."""
        if self.pending is None or self.rejected is not None or not self.pending:
            return None
        return InvalidArgument(f"{name}: {npy.incomplete_reason(self.pending)}")

    def missing(self) -> tuple[int, int]:
        """(data bytes received, data bytes its header declares) of a staged file."""
        return self.received.covered, self.stream.size - len(self.stream.header)

    @property
    def complete(self) -> bool:
        """Every data byte its header declares arrived (a staged file)."""
        got, want = self.missing()
        return got == want


def parse_npy_header(head: bytes, label: str) -> tuple[Any, ...] | None:
    """(shape, fortran, dtype, header length) of a whole NPY header, None when incomplete;
    InvalidArgument when it is no NPY header or holds a data type without a fixed size."""
    try:
        parsed = npy.parse_header(head)
        if parsed is not None:
            check_fixed_size(parsed[2])
    except (npy.NotNpy, Unsupported) as e:
        raise InvalidArgument(f"{label}: {e}") from None
    return parsed


class IncomingWrites:
    """Namespace steps of files being written: truncate, write, fsync, close, last close, unmount,
    and a held file becoming an array."""

    async def truncate(self: "Namespace", entry: "Entry", size: int = 0) -> None:
        """A held file takes any size; a .npy file only 0: its next NPY header defines the
        array that replaces it (the old one stays until the new one is complete)."""
        if entry.kind is Kind.HELD:
            if entry.held is None:
                raise entry.error or NotFound("removed")
            await entry.held.resize(size)
            if entry.opens == 0:  # truncate(2) by path: no close will follow
                self._keep_later(entry)
            return
        if entry.kind is not Kind.ARRAY or entry.view != "":
            raise InvalidArgument("only .npy files of the main tree can be truncated (to replace the array)")
        if size != 0:
            raise InvalidArgument(f"arrays have a fixed size ({entry.size}); truncate to 0 to replace one")
        if entry.writing is not None and entry.writing.staged is not None:
            await self._drop_staged(entry)
        entry.writing = Incoming(replacing=entry.node)

    async def write(self: "Namespace", entry: "Entry", offset: int, data: bytes) -> int:
        """Bytes into an array's file: a file being created or replaced, or the data of an array."""
        if entry.node is not None:
            self.forget_statistics(entry.node.path)
        w = entry.writing
        if w is not None and w.pending is not None:
            return await self._ingest(entry, offset, data)
        if entry.error is not None:
            raise entry.error
        stream = w.stream if w is not None and w.stream is not None else entry.stream
        if offset + len(data) > stream.size:
            raise TooBig(f"{entry.key or stream.meta.path}: an array's file cannot grow "
                         f"(write ends at {offset + len(data)}, size {stream.size}); truncate to replace it")
        hlen = len(stream.header)
        if offset < hlen and data[: hlen - offset] != stream.header[offset:offset + len(data)]:
            raise InvalidArgument("a write to the NPY header may not change shape or dtype; truncate first")
        await self.engine.write(stream, offset, data)
        if w is not None and w.received is not None:
            w.received.add(max(offset, hlen), offset + len(data))
        self._sizes.pop(stream.meta.path, None)
        entry.stored_bytes = None
        return len(data)

    async def _ingest(self: "Namespace", entry: "Entry", offset: int, data: bytes) -> int:
        w = entry.writing
        if w.rejected is not None:
            raise w.rejected
        buf = w.pending
        if offset > npy.MAX_HEADER_BYTES:
            raise w.reject(InvalidArgument(f"{self._name_of(entry)}: the NPY header must be written first"))
        if offset > len(buf):
            buf.extend(bytes(offset - len(buf)))
        buf[offset:offset + len(data)] = data
        try:
            parsed = parse_npy_header(buf, self._name_of(entry))
        except InvalidArgument as e:
            raise w.reject(e) from None
        if parsed is None:
            return len(data)
        shape, fortran, dtype, hlen = parsed
        path = w.replacing.path if w.replacing is not None else entry.key
        try:  # every check of the format (data type, codec, chunks) before the store changes
            w.staged = self.hierarchy.stage_array(path, await self._new_array(path, shape, dtype), self.lease.writer)
        except ZarrfsError as e:
            raise w.reject(type(e)(f"{self._name_of(entry)}: {e}")) from None
        w.stream = ArrayStream(w.staged.meta, "F" if fortran else "C", header=bytes(buf[:hlen]), dtype=dtype)
        w.received = Coverage()
        w.pending = None
        rest = bytes(buf[hlen:])
        await self._claim_staging(w.staged.staging)
        if rest:
            if len(buf) > w.stream.size:
                raise TooBig(f"{path}: {len(buf)} bytes written, more than the {w.stream.size} "
                             f"its NPY header declares")
            await self.engine.write(w.stream, hlen, rest)
            w.received.add(hlen, len(buf))
        return len(data)

    async def _new_array(self: "Namespace", path: str, shape: tuple[int, ...], dtype: np.dtype) -> NewArray:
        """The array a new NPY file at `path` makes: the mount's chunks and codec, and in an
        xarray dataset the dimension names and fill value xarray reads as intended."""
        chunks = self.create_chunks if self.create_chunks and len(self.create_chunks) == len(shape) else None
        new = NewArray(shape, dtype, chunks, self.create_codec)
        if self.hierarchy.name not in ("v2", "v3") or not path:
            return new
        siblings = await self.nodes_below(path.rpartition("/")[0])
        return in_dataset(new, siblings, self.hierarchy.name)

    async def _commit(self: "Namespace", entry: "Entry") -> None:
        """A staged array that is complete becomes the node at its path (all-or-nothing)."""
        w = entry.writing
        staged, old = w.staged, w.replacing
        try:
            await self.engine.flush(staged.meta.path)
            await self.engine.run_io_long(self.hierarchy.commit_array_sync, staged, old)
        except ZarrfsError as e:
            what = "the old array is kept" if old is not None else "nothing was created"
            name = self._name_of(entry)
            await self._abandon(entry)
            raise type(e)(f"{name}: storing the new array failed ({e}); {what}") from None
        self.engine.discard(staged.meta.path)
        if old is not None:
            self.engine.discard(old.path)
        meta = staged.final
        entry.show(meta)
        entry.checked = self.fresh_epoch  # what this mount just stored: current (freshness.py)
        w.replacing, w.staged, w.received = None, None, None
        w.stream = ArrayStream(meta, w.stream.order, header=w.stream.header, dtype=w.stream.dtype)
        if not meta.path:
            self.root_node = meta
        self._unregister(entry, keep_name=True)
        self._sizes.pop(meta.path, None)
        self.times.pop(meta.path, None)
        if w.mtime_ns is not None:
            await self.set_times(entry, w.mtime_ns)
        # Views of an array replaced here, or removed and now created again, are names the
        # kernel may still hold: they show the new array.
        await self._repoint(meta.path, meta.path, skip=entry.inode)
        self._invalidate()
        await self._release_staging(staged.staging)

    async def _drop_staged(self: "Namespace", entry: "Entry") -> None:
        """Forget a staged array's chunks (held and stored): the old array, if any, stays."""
        w = entry.writing
        staged = w.staged
        w.staged, w.stream, w.received = None, None, None
        self.engine.discard(staged.meta.path)
        await self.engine.run_io_long(self.hierarchy.discard_staging_sync, staged)
        await self._release_staging(staged.staging)

    async def _claim_staging(self: "Namespace", staging: str) -> None:
        """A staging area comes into use: this daemon's lease is in the store before its first key."""
        self.lease.claim(staging)
        await self.renew_lease()

    async def _release_staging(self: "Namespace", staging: str) -> None:
        """A staging area is committed or dropped: the lease goes once no other is in use."""
        self.lease.release(staging)
        await self.renew_lease()

    async def renew_lease(self: "Namespace", refresh: bool = False) -> None:
        """Bring this daemon's lease up to date (with REFRESH, rewrite it while staging: the
        periodic renewal). One step at a time, so that a write and an erase never cross."""
        async with self._lease_lock:
            step = self.lease.due(refresh)
            if step is not None:
                try:
                    await self.engine.run_io(step)
                except ZarrfsError as e:
                    self.lease.failed(e)

    async def _abandon(self: "Namespace", entry: "Entry") -> None:
        """A file that did not become an array: its staged chunks go; a replaced array stays
        as it was; a created one disappears."""
        w = entry.writing
        if w is None:
            return
        if w.staged is not None:
            await self._drop_staged(entry)
        entry.writing = None
        if w.replacing is None:
            self._unregister(entry)
            entry.error = NotFound(f"{entry.key} was never stored")

    async def sync(self: "Namespace", entry: "Entry") -> None:
        """fsync: what was written is in the store (a staged array's chunks, in its staging area)."""
        problem = entry.writing.header_problem(self._name_of(entry)) if entry.writing is not None else None
        if problem is not None:
            raise problem
        await self._flush_entry(entry)

    async def _keep(self: "Namespace", entry: "Entry") -> None:
        """A plain file's bytes and time into its store key; from then on the store lists it."""
        held = entry.held
        if held is None or not (held.dirty or held.mtime_ns is not None):
            return
        self.engine.later.cancel(("keep", entry.inode))
        await held.keep()
        if held.stored and entry.held is held:
            self._unregister(entry, keep_name=True)
            self._invalidate()

    def _keep_later(self: "Namespace", entry: "Entry", delay_s: float = PLAIN_WRITE_BACK_S) -> None:
        """Store a plain file written since its last store `delay_s` from now (write-back):
        one renamed to NAME.npy or removed before then is never stored under its name."""
        held = entry.held
        if held is not None and held.dirty:
            self.engine.later.call(("keep", entry.inode), delay_s, lambda: self._write_back(entry, held))

    async def _write_back(self: "Namespace", entry: "Entry", held: HeldFile) -> None:
        """The delayed store of a plain file; a failure is said once, and it is tried again
        later (and at unmount) while its bytes stay here."""
        if entry.held is not held or not held.dirty:
            return
        name = self._name_of(entry)
        try:
            await self._keep(entry)
        except ZarrfsError as e:
            if not held.failing:
                log.warning("%s: storing this plain file failed: %s; its bytes stay in the daemon, "
                            "tried again every %g s and at unmount", name, e, PLAIN_RETRY_S)
            held.failing = True
            self._keep_later(entry, PLAIN_RETRY_S)
            return
        if held.failing:
            log.info("%s: plain file stored after all", name)
            held.failing = False
        if entry.opens == 0:
            held.unload()

    async def _flush_entry(self: "Namespace", entry: "Entry") -> None:
        if entry.kind is Kind.HELD:
            try:
                await self._keep(entry)
            except ZarrfsError as e:
                log.warning("%s: keeping it in the store failed: %s", self._name_of(entry), e)
                self._keep_later(entry, PLAIN_RETRY_S)  # its bytes stay here: tried again later
                raise
            return
        w = entry.writing
        stream = w.stream if w is not None and w.staged is not None else entry.stream
        if stream is not None and entry.kind in (Kind.ARRAY, Kind.CHUNK):
            await self.engine.flush(stream.meta.path)
            self._sizes.pop(stream.meta.path, None)
            entry.stored_bytes = None

    async def close(self: "Namespace", entry: "Entry") -> None:
        """close(2) of one descriptor: what was written is stored, and a new array complete now is
        committed. One still short of its header or data stays as it is: the close of every
        descriptor sharing the open file (a forked child's, a dup's) comes here, while others
        may still write, so only the last close (`release`) ends it. A plain file is stored
        later (write-back), unless renamed to NAME.npy or removed first."""
        if entry.kind is Kind.HELD:
            self._keep_later(entry)
            if entry.held is not None and self.engine.held_memory_bytes > PLAIN_MEMORY_MAX_BYTES:
                try:
                    await entry.held.spill()
                except (OSError, ZarrfsError) as e:  # TMPDIR full: it stays in memory
                    log.warning("%s: its bytes stay in memory, TMPDIR refused them: %s", self._name_of(entry), e)
            return
        w = entry.writing
        if w is not None and w.staged is not None and w.complete:
            await self._commit(entry)
            return
        if w is not None and (w.staged is not None or w.pending):
            log.debug("%s: a descriptor closed before the file was complete; its last close decides",
                      self._name_of(entry))
        await self._flush_entry(entry)

    async def release(self: "Namespace", entry: "Entry") -> None:
        """The last close: a new array complete now is committed (unless a close did); one short
        of its NPY header or data is dropped with a WARNING, the old array staying (an empty
        NAME.npy stays, held aside); a committed writer's own layout is forgotten. Nothing here
        reaches the closing process (close(2) has returned): the log line says it."""
        w = entry.writing
        if entry.kind is Kind.HELD and entry.held is not None:
            entry.held.unload()
        if entry.kind is not Kind.ARRAY or w is None:
            return
        if w.rejected is not None:  # its write failed with the reason already
            log.warning("%s: closed before it was a complete array; dropped", self._name_of(entry))
            await self._abandon(entry)
            return
        try:
            await self._finish(entry, "at its last close")
        except ZarrfsError as e:
            log.warning("%s", e)
            return
        if entry.writing is not None and (entry.writing.pending is None or entry.writing.replacing is not None):
            entry.writing = None  # committed, or truncated and never rewritten: the old array stays

    async def _finish(self: "Namespace", entry: "Entry", when: str) -> bool:
        """End a file being written that nobody writes any more: complete, it is committed (True);
        short of its NPY header or data, it is dropped (the old array stays) with a WARNING naming
        it and what arrived. An empty file stays as it is (False)."""
        w = entry.writing
        name = self._name_of(entry)
        if w.staged is not None:
            got, want = w.missing()
            if got == want:
                await self._commit(entry)
                return True
            reason = f"received {got} of {want} data bytes its NPY header declares"
        elif w.pending:
            reason = npy.incomplete_reason(w.pending)
        else:
            return False
        what = "the old array is kept" if w.replacing is not None else "not stored"
        await self._abandon(entry)
        log.warning("%s: %s %s; %s", name, reason, when, what)
        return False

    async def shutdown(self: "Namespace") -> None:
        """Unmount: complete staged arrays are committed, the rest dropped, each with a log line."""
        for entry in list(self._entries.values()):
            w = entry.writing
            try:
                if entry.held is not None:
                    if entry.held.dirty:
                        name = self._name_of(entry)
                        try:
                            await self._keep(entry)
                        except ZarrfsError as e:
                            log.error("%s: plain file not stored at unmount, its bytes are lost: %s", name, e)
                            continue
                        log.info("%s: plain file stored at unmount", name)
                    entry.held.close()
                elif w is not None and (w.staged is not None or w.pending):
                    name = self._name_of(entry)
                    if await self._finish(entry, "at unmount"):
                        log.info("%s: complete at unmount; stored", name)
                elif w is not None and w.pending is not None and entry.node is None:
                    log.info("%s: empty file, never an array; dropped at unmount", self._name_of(entry))
            except ZarrfsError as e:
                log.warning("unmount: %s", e)

    async def _adopt(self: "Namespace", entry: "Entry", parent_inode: int, name: str) -> None:
        """A held file renamed to NAME.npy becomes array NAME (staged, streamed in, committed),
        its bytes never stored as a plain key unless they were already. On any error the held
        file stays as it was (its write-back still to come) and the rename fails."""
        self.engine.later.cancel(("keep", entry.inode))
        try:
            await self._adopt_now(entry, parent_inode, name)
        except BaseException:
            self._keep_later(entry)
            raise

    async def _adopt_now(self: "Namespace", entry: "Entry", parent_inode: int, name: str) -> None:
        other = await self.child(parent_inode, name)
        busy = other is not None and other.writing is not None and (
            other.writing.staged is not None or other.writing.pending is not None)
        if other is not None and (other.kind is not Kind.ARRAY or other.node is None or busy):
            raise Exists(f"{name} is being written or is not an array")
        names = await self.children(parent_inode)
        path = await self._new_array_path(parent_inode, name, {n: m for n, m in names.items() if n != name})
        old = other.node if other is not None else None
        label = self._name_of(entry)
        head = await entry.held.read(0, npy.MAX_HEADER_BYTES)
        parsed = parse_npy_header(head, f"{label}: cannot become {path}")
        if parsed is None:
            raise InvalidArgument(f"{label}: {npy.incomplete_reason(head)}")
        shape, fortran, dtype, hlen = parsed
        staged = self.hierarchy.stage_array(path, await self._new_array(path, shape, dtype), self.lease.writer)
        ingest = ArrayStream(staged.meta, "F" if fortran else "C", header=bytes(head[:hlen]), dtype=dtype)
        if entry.size != ingest.size:
            kind = Incomplete if entry.size < ingest.size else InvalidArgument
            raise kind(f"{label}: holds {entry.size - hlen} data bytes, its NPY header declares "
                       f"{ingest.size - hlen}; not renamed to {name}")
        try:
            await self._store_held(entry, staged, ingest, old)
        except ZarrfsError:
            await self.renew_lease()  # its staging dropped: the lease too, unless another is in use
            raise
        held = entry.held
        async with held.lock:  # after a write-back under way, if any
            if held.stored:  # it was kept as a plain file: now it is the array
                try:
                    await self.engine.run_io(self.hierarchy.store.erase_sync, held.key)
                except ZarrfsError as e:
                    log.warning("%s: became %s, but its plain key stays: %s", label, path, e)
            held.close()
        old_name = entry.name_key
        self._unregister(entry, forget=False)
        if old_name is not None and self._by_name.get(old_name) == entry.inode:
            del self._by_name[old_name]
        mtime_ns = held.mtime_ns
        entry.held, entry.kind, entry.key = None, Kind.ARRAY, path
        entry.show(staged.final)
        entry.checked = self.fresh_epoch
        if not path:
            self.root_node = staged.final
        self._name(parent_inode, name, entry)
        self._sizes.pop(path, None)
        self.times.pop(path, None)
        if mtime_ns is not None:  # rsync sets the time before renaming
            await self.set_times(entry, mtime_ns)
        await self._repoint(path, path, skip=entry.inode)
        self._invalidate()
        await self.renew_lease()

    async def _store_held(self: "Namespace", entry: "Entry", staged: Any, ingest: ArrayStream,
                          old: Node | None) -> None:
        """Stream a held file's data into a staged array and commit it (nothing left on failure)."""
        try:
            await self._claim_staging(staged.staging)
            for offset in range(len(ingest.header), ingest.size, ADOPT_BLOCK_BYTES):
                block = await entry.held.read(offset, ADOPT_BLOCK_BYTES)
                await self.engine.write(ingest, offset, block)
            await self.engine.flush(staged.meta.path)
            await self.engine.run_io_long(self.hierarchy.commit_array_sync, staged, old)
        except BaseException:
            self.engine.discard(staged.meta.path)
            await self.engine.run_io_shielded(self.hierarchy.discard_staging_sync, staged)
            self.lease.release(staged.staging)  # the lease goes at the next renewal
            raise
        self.lease.release(staged.staging)  # the lease goes at the end of the rename (_adopt)
        self.engine.discard(staged.meta.path)
        if old is not None:
            self.engine.discard(old.path)
