"""Plain files: any name but NAME.npy, held (memory, then TMPDIR) while written, kept as a store key of its own.

A plain file is kept under its key at fsync, at unmount, or PLAIN_WRITE_BACK_S after a
close; renamed to NAME.npy before that it becomes that array (ingest.py) without ever
being stored as a plain key. No trio here (the engine runs threads and makes locks).
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..errors import NotFound, ZarrfsError, required
from .entries import NPY_SUFFIX

if TYPE_CHECKING:
    from ..engine import Engine, Lock
    from ..formats.base import Hierarchy
    from .entries import Entry
    from .inodes import Inodes

Spool = tempfile.SpooledTemporaryFile[bytes]
log = logging.getLogger(__name__)

# A held-aside file (a temporary name) stays in memory up to this size, then spills to a
# file in tempfile.gettempdir() (TMPDIR, else /tmp): editors' and rsync's temporary files
# of small arrays never touch the disk, a large one costs no memory.
PLAIN_MEMORY_BYTES = 8 << 20
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


def is_plain_name(name: str) -> bool:
    """Names of plain files (never arrays until renamed): anything but NAME.npy, and hidden
    names (`.x.npy.AbC123` of rsync, `.x.swp` of editors)."""
    return name.startswith(".") or not name.endswith(NPY_SUFFIX) or name == NPY_SUFFIX


class PlainFile:
    """The bytes of a plain file (any name but NAME.npy): kept in the store under `key` at
    fsync and write-back, until then in memory up to PLAIN_MEMORY_BYTES, then in TMPDIR.

    A kept file nobody writes has no local copy: reads go to its key; the first write
    copies it into the spool, block by block.
    """

    def __init__(
        self, engine: Engine, key: str | None, size: int = 0, stored: bool = False, memory: PlainMemory | None = None
    ) -> None:
        self._engine = engine
        self._memory = memory if memory is not None else PlainMemory()
        self._spool: Spool | None = None if stored else self._new_spool()
        self._lock = engine.new_lock()  # one seek-and-transfer at a time
        self.key = key  # where it is kept (None: the format keeps no plain files)
        self.size = size
        self.stored = stored  # the key holds it (as of the last store, if dirty)
        self.dirty = not stored  # bytes the key does not hold yet (a new file counts, even empty)
        self.mtime_ns: int | None = None  # set by the writer (utimensat), given to the key when kept
        self.failing = False  # the last write-back failed (said once, tried again)
        self.gone = False  # removed, replaced or an array now: nothing is stored any more
        self._spilled = False  # the spool's bytes are in TMPDIR, not in memory
        self._memory_bytes = 0  # what this file adds to `memory`

    @property
    def kept_key(self) -> str:
        """`key`, asked only of a file the format keeps (TypeError: a defect)."""
        return required(self.key, "a plain file the format keeps nowhere")

    @staticmethod
    def _new_spool() -> Spool:
        return tempfile.SpooledTemporaryFile(max_size=PLAIN_MEMORY_BYTES, prefix="zarrfs-held-")

    @property
    def lock(self) -> Lock:
        """Held while its bytes or key change (a store, a move): `async with held.lock`."""
        return self._lock

    @property
    def needs_entry(self) -> bool:
        """Whether its bytes exist only here (then its entry must stay)."""
        return self.dirty

    def _account(self) -> None:
        """Bring the count of plain files' bytes in memory up to date with this file's."""
        now = self.size if self._spool is not None and not self._spilled else 0
        self._memory.bytes += now - self._memory_bytes
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
                return await self._engine.run_io(
                    self._engine.store.get_range_sync, self.kept_key, offset, offset + size
                )

            def get() -> bytes:
                spool.seek(offset)
                return spool.read(size)

            return await self._engine.run_io(get)

    def _load_sync(self) -> None:
        """Copy the kept bytes into a new spool (the first write to a kept file)."""
        spool = self._new_spool()
        try:
            for start in range(0, self.size, ADOPT_BLOCK_BYTES):
                spool.write(
                    self._engine.store.get_range_sync(self.kept_key, start, min(start + ADOPT_BLOCK_BYTES, self.size))
                )
        except BaseException:
            spool.close()
            raise
        self._spool = spool

    async def _change(self, fn: Callable[[Spool], None], load: bool = True) -> None:
        def run() -> int:
            if self._spool is None:
                if load:
                    self._load_sync()
                else:  # truncated to nothing: the kept bytes are not needed
                    self._spool = self._new_spool()
            spool = self._spool
            assert spool is not None  # (loaded, or made just now)
            fn(spool)
            spool.seek(0, os.SEEK_END)
            return spool.tell()

        async with self._lock:
            fresh = self._spool is None
            try:
                self.size = await self._engine.run_io(run)
            finally:
                if fresh and self._spool is not None:
                    self._spilled = False
                self._spilled = self._spilled or self.size > PLAIN_MEMORY_BYTES  # the spool rolled over
                self._account()
            self.dirty = True

    async def write(self, offset: int, data: bytes) -> int:
        def put(spool: Spool) -> None:
            if offset + len(data) > PLAIN_MEMORY_BYTES:
                spool.rollover()  # before a seek past the end: in memory the gap takes memory
            spool.seek(offset)
            spool.write(data)

        await self._change(put)
        return len(data)

    async def resize(self, size: int) -> None:
        def resize(spool: Spool) -> None:
            spool.seek(0, os.SEEK_END)
            end = spool.tell()
            if size < end or size > PLAIN_MEMORY_BYTES:
                spool.truncate(size)  # past PLAIN_MEMORY_BYTES it rolls over, and a file's truncate extends
            elif size > end:  # in memory, truncate does not extend: write the zeros
                spool.write(bytes(size - end))

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
                    assert spool is not None  # (what was written is in it)
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


class PlainMemory:
    """Bytes of plain files held in memory, all files together (PlainFiles owns the count)."""

    def __init__(self) -> None:
        self.bytes = 0


class PlainFiles:
    """The Namespace's steps of plain files: truncate, fsync, close, last close, write-back, unmount."""

    def __init__(self, engine: Engine, hierarchy: Hierarchy, inodes: Inodes, invalidate: Callable[[], None]) -> None:
        self.engine = engine
        self.hierarchy = hierarchy
        self.inodes = inodes
        self.invalidate = invalidate  # listings and nodes are read again (a file was stored)
        self.memory = PlainMemory()

    def new(self, key: str | None, size: int = 0, stored: bool = False) -> PlainFile:
        """A plain file kept under KEY (None: the format keeps none), counted in `memory`."""
        return PlainFile(self.engine, key, size, stored, self.memory)

    async def truncate(self, entry: Entry, size: int) -> None:
        """A held file takes any size."""
        if entry.plain is None:
            raise entry.error or NotFound("removed")
        await entry.plain.resize(size)
        if entry.opens == 0:  # truncate(2) by path: no close will follow
            self.keep_later(entry)

    async def keep(self, entry: Entry) -> None:
        """A plain file's bytes and time into its store key; from then on the store lists it."""
        held = entry.plain
        if held is None or not (held.dirty or held.mtime_ns is not None):
            return
        self.engine.delayed.cancel(("keep", entry.inode))
        await held.keep()
        if held.stored and entry.plain is held:
            self.inodes.unregister(entry, keep_name=True)
            self.invalidate()

    def keep_later(self, entry: Entry, delay_s: float = PLAIN_WRITE_BACK_S) -> None:
        """Store a plain file written since its last store `delay_s` from now (write-back):
        one renamed to NAME.npy or removed before then is never stored under its name."""
        held = entry.plain
        if held is not None and held.dirty:
            self.engine.delayed.call(("keep", entry.inode), delay_s, lambda: self._write_back(entry, held))

    def cancel_keep(self, entry: Entry) -> None:
        """No write-back of this file is due (it is becoming an array)."""
        self.engine.delayed.cancel(("keep", entry.inode))

    async def _write_back(self, entry: Entry, held: PlainFile) -> None:
        """The delayed store of a plain file; a failure is said once, and it is tried again
        later (and at unmount) while its bytes stay here."""
        if entry.plain is not held or not held.dirty:
            return
        name = self.inodes.path_of(entry)
        try:
            await self.keep(entry)
        except ZarrfsError as e:
            if not held.failing:
                log.warning(
                    "%s: storing this plain file failed: %s; its bytes stay in the daemon, "
                    "tried again every %g s and at unmount",
                    name,
                    e,
                    PLAIN_RETRY_S,
                )
            held.failing = True
            self.keep_later(entry, PLAIN_RETRY_S)
            return
        if held.failing:
            log.info("%s: plain file stored after all", name)
            held.failing = False
        if entry.opens == 0:
            held.unload()

    async def sync(self, entry: Entry) -> None:
        """fsync: the file is in its store key when it returns."""
        try:
            await self.keep(entry)
        except ZarrfsError as e:
            log.warning("%s: keeping it in the store failed: %s", self.inodes.path_of(entry), e)
            self.keep_later(entry, PLAIN_RETRY_S)  # its bytes stay here: tried again later
            raise

    async def close(self, entry: Entry) -> None:
        """close(2): stored later (write-back); past the memory bound its bytes move to TMPDIR."""
        self.keep_later(entry)
        if entry.plain is not None and self.memory.bytes > PLAIN_MEMORY_MAX_BYTES:
            try:
                await entry.plain.spill()
            except (OSError, ZarrfsError) as e:  # TMPDIR full: it stays in memory
                log.warning("%s: its bytes stay in memory, TMPDIR refused them: %s", self.inodes.path_of(entry), e)

    def release(self, entry: Entry) -> None:
        """The last close: a kept file's local copy goes (reads go to its key)."""
        if entry.plain is not None:
            entry.plain.unload()

    async def shutdown(self, entry: Entry) -> None:
        """Unmount: what is not stored yet is stored (or said lost)."""
        if entry.held.dirty:
            name = self.inodes.path_of(entry)
            try:
                await self.keep(entry)
            except ZarrfsError as e:
                log.error("%s: plain file not stored at unmount, its bytes are lost: %s", name, e)
                return
            log.info("%s: plain file stored at unmount", name)
        entry.held.close()

    def inside(self, path: str) -> list[PlainFile]:
        """The plain files kept below group `path` (none for the root), by inode."""
        if not path:
            return []
        prefix = self.hierarchy.plain_dir(path) + "/"
        inside = [
            e
            for e in self.inodes.all()
            if e.plain is not None and e.plain.key is not None and not e.plain.gone and e.plain.key.startswith(prefix)
        ]
        return [e.held for e in sorted(inside, key=lambda e: e.inode)]

    def forget(self, entry: Entry, error: ZarrfsError) -> None:
        """A plain file removed or replaced: open files on it get `error`."""
        if entry.plain is not None:
            entry.plain.close()
        entry.plain = None
        entry.error = error
