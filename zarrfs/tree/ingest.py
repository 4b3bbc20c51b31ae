"""Arriving NPY files: an NPY file written under NAME.npy, or a plain file renamed to it, becomes an array.

An arriving file buffers its bytes until its NPY header is whole, then streams them into a
staged array (Hierarchy.stage_array) that the close completing it commits, all or nothing.
A plain file renamed to NAME.npy is streamed into a staged array and committed at the
rename. Either way the stored array is published once (`_publish`): the entry shows it, what
was kept of the path's old node goes, and the entries of that path follow it. No trio here
(the engine runs threads and makes locks).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import numpy as np

from .. import npy
from ..errors import (
    Exists,
    Incomplete,
    InvalidArgument,
    NotFound,
    TooBig,
    ZarrfsError,
)
from ..formats.base import StagedArray
from ..formats.datasets import in_dataset
from ..model import ArrayMeta, NewArray, Node
from ..storage.staging import LeaseKeeper
from ..views.kinds import Kind
from ..views.streams import ArrayStream
from .incoming import Coverage, Incoming, parse_npy_header
from .plain import ADOPT_BLOCK_BYTES

if TYPE_CHECKING:
    from ..engine import Engine
    from ..formats.base import Hierarchy
    from .entries import Entry
    from .freshness import Freshness
    from .inodes import Inodes
    from .listings import Listings
    from .newnames import NewNames
    from .plain import PlainFiles
    from .statistics import SavedStatistics
    from .times import Times

log = logging.getLogger(__name__)


class Ingest:
    """The Namespace's steps of NPY files being written: truncate, write, fsync, close, last close,
    unmount, and a held file becoming an array."""

    def __init__(
        self,
        engine: Engine,
        hierarchy: Hierarchy,
        inodes: Inodes,
        *,
        freshness: Freshness,
        listings: Listings,
        plain: PlainFiles,
        statistics: SavedStatistics,
        times: Times,
        names: NewNames,
        lease: LeaseKeeper,
        child: Callable[[int, str], Awaitable[Entry | None]],
        show_root: Callable[[Node], None],
        invalidate: Callable[[], None],
        create_chunks: tuple[int, ...] | None = None,
        create_codec: str | None = None,
    ) -> None:
        self.engine = engine
        self.hierarchy = hierarchy
        self.inodes = inodes
        self.freshness, self.listings, self.plain, self.statistics = freshness, listings, plain, statistics
        self.times, self.names = times, names
        self.child = child  # the namespace's: the entry `name` in `parent`, None when there is none
        self.show_root = show_root  # the namespace's: the root shows this node now
        self.invalidate = invalidate  # the namespace's: listings and nodes are read again
        # This daemon's claim on its staging areas (written only once it stages an array)
        self.lease = lease
        self._lease_lock = engine.new_lock()
        # Chunking and codec of arrays created through the mount (options chunks=, codec=)
        self.create_chunks = create_chunks
        self.create_codec = create_codec

    def writing_files(self) -> bool:
        """Whether some file is being written into an array that is not complete yet."""
        return any(e.writing is not None and e.writing.staged is not None for e in self.inodes.all())

    async def truncate(self, entry: Entry, size: int = 0) -> None:
        """A .npy file only to 0: its next NPY header defines the array that replaces it (the
        old one stays until the new one is complete)."""
        if entry.kind is not Kind.ARRAY or entry.view != "":
            raise InvalidArgument("only .npy files of the main tree can be truncated (to replace the array)")
        if size != 0:
            raise InvalidArgument(f"arrays have a fixed size ({entry.size}); truncate to 0 to replace one")
        if entry.writing is not None and entry.writing.staged is not None:
            await self._drop_staged(entry)
        entry.writing = Incoming(replacing=entry.node)

    async def write(self, entry: Entry, offset: int, data: bytes) -> int:
        """Bytes into an array's file: a file being created or replaced, or the data of an array."""
        if entry.node is not None:
            self.statistics.forget(entry.node.path)
        w = entry.writing
        if w is not None and w.pending is not None:
            return await self._ingest(entry, offset, data)
        if entry.error is not None:
            raise entry.error
        stream = w.stream if w is not None and w.stream is not None else entry.stream
        if offset + len(data) > stream.size:
            raise TooBig(
                f"{entry.key or stream.meta.path}: an array's file cannot grow "
                f"(write ends at {offset + len(data)}, size {stream.size}); truncate to replace it"
            )
        hlen = len(stream.header)
        if offset < hlen and data[: hlen - offset] != stream.header[offset : offset + len(data)]:
            raise InvalidArgument("a write to the NPY header may not change shape or dtype; truncate first")
        await self.engine.write(stream, offset, data)
        if w is not None and w.received is not None:
            w.received.add(max(offset, hlen), offset + len(data))
        self.listings.forget_sizes(stream.meta.path)
        entry.stored_bytes = None
        return len(data)

    async def _ingest(self, entry: Entry, offset: int, data: bytes) -> int:
        w = entry.incoming
        if w.rejected is not None:
            raise w.rejected
        buf = w.header_bytes
        if offset > npy.MAX_HEADER_BYTES:
            raise w.reject(InvalidArgument(f"{self.inodes.path_of(entry)}: the NPY header must be written first"))
        if offset > len(buf):
            buf.extend(bytes(offset - len(buf)))
        buf[offset : offset + len(data)] = data
        try:
            parsed = parse_npy_header(buf, self.inodes.path_of(entry))
        except InvalidArgument as e:
            raise w.reject(e) from None
        if parsed is None:
            return len(data)
        shape, fortran, dtype, hlen = parsed
        path = w.replacing.path if w.replacing is not None else entry.known_key
        try:  # every check of the format (data type, codec, chunks) before the store changes
            staged = self.hierarchy.stage_array(path, await self._new_array(path, shape, dtype), self.lease.writer)
        except ZarrfsError as e:
            raise w.reject(type(e)(f"{self.inodes.path_of(entry)}: {e}")) from None
        try:
            begun = w.staged = await self._begin(staged, w.replacing)
        except ZarrfsError as e:
            raise w.reject(type(e)(f"{self.inodes.path_of(entry)}: {e}")) from None
        stream = w.stream = ArrayStream(begun.meta, "F" if fortran else "C", header=bytes(buf[:hlen]), dtype=dtype)
        received = w.received = Coverage()
        w.pending = None
        rest = bytes(buf[hlen:])
        if rest:
            if len(buf) > stream.size:
                raise TooBig(f"{path}: {len(buf)} bytes written, more than the {stream.size} its NPY header declares")
            await self.engine.write(stream, hlen, rest)
            received.add(hlen, len(buf))
        return len(data)

    async def _new_array(self, path: str, shape: tuple[int, ...], dtype: np.dtype) -> NewArray:
        """The array a new NPY file at `path` makes: the mount's chunks and codec, and in an
        xarray dataset the dimension names and fill value xarray reads as intended."""
        chunks = self.create_chunks if self.create_chunks and len(self.create_chunks) == len(shape) else None
        new = NewArray(shape, dtype, chunks, self.create_codec)
        if self.hierarchy.name not in ("v2", "v3") or not path:
            return new
        siblings = await self.listings.nodes_below(path.rpartition("/")[0])
        return in_dataset(new, siblings, self.hierarchy.name)

    async def commit(self, entry: Entry) -> None:
        """A staged array that is complete becomes the node at its path (all-or-nothing)."""
        w = entry.incoming
        staged, old = w.array, w.replacing
        try:
            await self.engine.flush(staged.meta.path)
            await self.engine.run_io_long(self.hierarchy.commit_array_sync, staged, old)
        except ZarrfsError as e:
            what = "the old array is kept" if old is not None else "nothing was created"
            name = self.inodes.path_of(entry)
            await self.abandon(entry)
            raise type(e)(f"{name}: storing the new array failed ({e}); {what}") from None
        self._discard(staged, old)
        meta = staged.final
        mine = w.layout
        w.replacing, w.staged, w.received = None, None, None
        w.stream = ArrayStream(meta, mine.order, header=mine.header, dtype=mine.dtype)
        self.inodes.unregister(entry, keep_name=True)
        await self._publish(entry, meta, w.mtime_ns)
        # On a remote store the lease goes in the background: the close does not wait for that
        # round trip (unmount erases it too)
        self.lease.release(staged.staging)
        if self.engine.runtime.running and not self.engine.store.is_local:
            self.engine.runtime.start_soon(self.renew_lease)
        else:
            await self.renew_lease()

    async def _publish(self, entry: Entry, meta: ArrayMeta, mtime_ns: int | None) -> None:
        """ENTRY shows the array this mount just stored (a new NPY file, or a plain file that became
        one), current as of now (freshness.py); at the root, the root shows it. What was kept of
        the path's old node goes (stored sizes, times); the writer's time, if any, is set. Views
        of an array replaced here, or removed and now created again, are names the kernel may
        still hold: they show the new array."""
        entry.show(meta)
        entry.checked = self.freshness.epoch
        if not meta.path:
            self.show_root(meta)
        self.listings.forget_sizes(meta.path)
        self.times.forget(meta.path)
        if mtime_ns is not None:
            await self.times.set(entry, mtime_ns)
        await self.freshness.repoint(meta.path, meta.path, skip=entry.inode)
        self.invalidate()

    def _discard(self, staged: StagedArray, old: Node | None) -> None:
        """The engine forgets the chunks of a committed staged array and of the array it replaced."""
        self.engine.discard(staged.meta.path)
        if old is not None:
            self.engine.discard(old.path)

    async def _drop_staged(self, entry: Entry) -> None:
        """Forget a staged array's chunks (held and stored): the old array, if any, stays."""
        w = entry.incoming
        staged = w.array
        w.staged, w.stream, w.received = None, None, None
        self.engine.discard(staged.meta.path)
        await self.engine.run_io_long(self.hierarchy.discard_staging_sync, staged)
        await self._release_staging(staged.staging)

    async def _begin(self, staged: StagedArray, old: Node | None) -> StagedArray:
        """Claim a staged array's staging area and learn where its chunks go (straight under their
        final keys for a new array on an object store); the claim is released if that fails."""
        self.lease.claim(staged.staging)
        try:  # the lease goes up beside the first keys: a sweep keeps an area without one while it is recent
            _, begun = await self.engine.gather(
                self.renew_lease, lambda: self.engine.run_io(self.hierarchy.begin_array_sync, staged, old)
            )
        except ZarrfsError:
            await self._release_staging(staged.staging)
            raise
        self.engine.starts_empty(begun.meta.path, begun.stored)
        return begun

    async def _release_staging(self, staging: str) -> None:
        """A staging area is committed or dropped: the lease goes once no other is in use."""
        self.lease.release(staging)
        await self.renew_lease()

    async def renew_lease(self, refresh: bool = False) -> None:
        """Bring this daemon's lease up to date (with REFRESH, rewrite it while staging: the
        periodic renewal). One step at a time, so that a write and an erase never cross."""
        async with self._lease_lock:
            step = self.lease.due(refresh)
            if step is not None:
                try:
                    await self.engine.run_io(step)
                except ZarrfsError as e:
                    self.lease.failed(e)

    async def abandon(self, entry: Entry) -> None:
        """A file that did not become an array: its staged chunks go; a replaced array stays
        as it was; a created one disappears."""
        w = entry.writing
        if w is None:
            return
        if w.staged is not None:
            await self._drop_staged(entry)
        entry.writing = None
        if w.replacing is None:
            self.inodes.unregister(entry)
            entry.error = NotFound(f"{entry.key} was never stored")

    async def sync(self, entry: Entry) -> None:
        """fsync: what was written is in the store (a staged array's chunks, in its staging area)."""
        problem = entry.writing.header_problem(self.inodes.path_of(entry)) if entry.writing is not None else None
        if problem is not None:
            raise problem
        await self._flush_entry(entry)

    async def _flush_entry(self, entry: Entry) -> None:
        w = entry.writing
        stream = w.stream if w is not None and w.staged is not None else entry.stream
        if stream is not None and entry.kind in (Kind.ARRAY, Kind.CHUNK):
            await self.engine.flush(stream.meta.path)
            self.listings.forget_sizes(stream.meta.path)
            entry.stored_bytes = None

    async def close(self, entry: Entry) -> None:
        """close(2) of one descriptor: what was written is stored, and a new array complete now is
        committed. One still short of its header or data stays as it is: the close of every
        descriptor sharing the open file (a forked child's, a dup's) comes here, while others
        may still write, so only the last close (`release`) ends it."""
        w = entry.writing
        if w is not None and w.staged is not None and w.complete:
            await self.commit(entry)
            return
        if w is not None and (w.staged is not None or w.pending):
            log.debug(
                "%s: a descriptor closed before the file was complete; its last close decides",
                self.inodes.path_of(entry),
            )
        await self._flush_entry(entry)

    async def release(self, entry: Entry) -> None:
        """The last close: a new array complete now is committed (unless a close did); one short
        of its NPY header or data is dropped with a WARNING, the old array staying (an empty
        NAME.npy stays, held aside); a committed writer's own layout is forgotten. Nothing here
        reaches the closing process (close(2) has returned): the log line says it."""
        w = entry.writing
        if entry.kind is not Kind.ARRAY or w is None:
            return
        if w.rejected is not None:  # its write failed with the reason already
            log.warning("%s: closed before it was a complete array; dropped", self.inodes.path_of(entry))
            await self.abandon(entry)
            return
        try:
            await self.finish(entry, "at its last close")
        except ZarrfsError as e:
            log.warning("%s", e)
            return
        if entry.writing is not None and (entry.writing.pending is None or entry.writing.replacing is not None):
            entry.writing = None  # committed, or truncated and never rewritten: the old array stays

    async def finish(self, entry: Entry, when: str) -> bool:
        """End a file being written that nobody writes any more: complete, it is committed (True);
        short of its NPY header or data, it is dropped (the old array stays) with a WARNING naming
        it and what arrived. An empty file stays as it is (False)."""
        w = entry.incoming
        name = self.inodes.path_of(entry)
        if w.staged is not None:
            got, want = w.missing()
            if got == want:
                await self.commit(entry)
                return True
            reason = f"received {got} of {want} data bytes its NPY header declares"
        elif w.pending:
            reason = npy.incomplete_reason(w.pending)
        else:
            return False
        what = "the old array is kept" if w.replacing is not None else "not stored"
        await self.abandon(entry)
        log.warning("%s: %s %s; %s", name, reason, when, what)
        return False

    async def shutdown(self, entry: Entry) -> None:
        """Unmount: a complete staged array is committed, the rest dropped, each with a log line."""
        w = entry.writing
        if w is not None and (w.staged is not None or w.pending):
            name = self.inodes.path_of(entry)
            if await self.finish(entry, "at unmount"):
                log.info("%s: complete at unmount; stored", name)
        elif w is not None and w.pending is not None and entry.node is None:
            log.info("%s: empty file, never an array; dropped at unmount", self.inodes.path_of(entry))

    async def adopt(self, entry: Entry, parent_inode: int, name: str) -> None:
        """A held file renamed to NAME.npy becomes array NAME (staged, streamed in, committed),
        its bytes never stored as a plain key unless they were already. On any error the held
        file stays as it was (its write-back still to come) and the rename fails."""
        self.plain.cancel_keep(entry)
        try:
            await self._adopt_now(entry, parent_inode, name)
        except BaseException:
            self.plain.keep_later(entry)
            raise

    async def _adopt_now(self, entry: Entry, parent_inode: int, name: str) -> None:
        other = await self.child(parent_inode, name)
        busy = (
            other is not None
            and other.writing is not None
            and (other.writing.staged is not None or other.writing.pending is not None)
        )
        if other is not None and (other.kind is not Kind.ARRAY or other.node is None or busy):
            raise Exists(f"{name} is being written or is not an array")
        names = await self.listings.children(parent_inode)
        path = self.names.array_path(parent_inode, name, [n for n in names if n != name])
        old = other.node if other is not None else None
        label = self.inodes.path_of(entry)
        head = await entry.held.read(0, npy.MAX_HEADER_BYTES)
        parsed = parse_npy_header(head, f"{label}: cannot become {path}")
        if parsed is None:
            raise InvalidArgument(f"{label}: {npy.incomplete_reason(head)}")
        shape, fortran, dtype, hlen = parsed
        staged = self.hierarchy.stage_array(path, await self._new_array(path, shape, dtype), self.lease.writer)
        ingest = ArrayStream(staged.meta, "F" if fortran else "C", header=bytes(head[:hlen]), dtype=dtype)
        if entry.size != ingest.size:
            kind = Incomplete if entry.size < ingest.size else InvalidArgument
            raise kind(
                f"{label}: holds {entry.size - hlen} data bytes, its NPY header declares "
                f"{ingest.size - hlen}; not renamed to {name}"
            )
        try:
            staged = await self._store_held(entry, staged, ingest, old)
        except ZarrfsError:
            await self.renew_lease()  # its staging dropped: the lease too, unless another is in use
            raise
        held = entry.held
        async with held.lock:  # after a write-back under way, if any
            if held.stored:  # it was kept as a plain file: now it is the array
                try:
                    await self.engine.run_io(self.hierarchy.store.erase_sync, held.kept_key)
                except ZarrfsError as e:
                    log.warning("%s: became %s, but its plain key stays: %s", label, path, e)
            held.close()
        old_name = entry.name_key
        self.inodes.unregister(entry, forget=False)
        self.inodes.drop_name(old_name, entry)
        mtime_ns = held.mtime_ns  # (rsync sets the time before renaming)
        entry.plain, entry.kind, entry.key = None, Kind.ARRAY, path
        self.inodes.name(parent_inode, name, entry)
        await self._publish(entry, staged.final, mtime_ns)
        await self.renew_lease()

    async def _store_held(
        self, entry: Entry, staged: StagedArray, ingest: ArrayStream, old: Node | None
    ) -> StagedArray:
        """Stream a held file's data into a staged array and commit it (nothing left on failure);
        the staged array as begun (its final keys may differ from the plan's)."""
        staged = await self._begin(staged, old)
        ingest = ArrayStream(staged.meta, ingest.order, header=ingest.header, dtype=ingest.dtype)
        try:
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
        self.lease.release(staged.staging)  # the lease goes at the end of the rename (adopt)
        self._discard(staged, old)
        return staged
