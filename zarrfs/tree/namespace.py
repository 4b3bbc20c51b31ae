"""The namespace: the FUSE layer's entry point to the tree of groups, arrays and `.zarrfs` views.

Runs in the trio thread (its tables need no locks; code between two awaits is atomic);
hierarchy and store I/O go through the engine's worker threads. It composes its parts,
each with one responsibility and its own state: the inode table (inodes.py), listings
(listings.py), freshness (freshness.py), versions (versions.py), changes (changes.py), the
times writers set (times.py), where new names go (newnames.py), arriving NPY files
(ingest.py), plain files (plain.py), saved statistics (statistics.py), georeferences
(georefs.py), the contents of generated files (contents.py) and open files (handles.py).
"""

from __future__ import annotations

import functools
import logging
import math
import re
from collections.abc import Callable

import numpy as np

from .. import grid
from ..engine import Engine
from ..errors import NotFound, Stale, ZarrfsError
from ..formats.base import Hierarchy
from ..model import ArrayMeta, GroupMeta, Node
from ..storage.icechunk import IcechunkStore
from ..storage.staging import LeaseKeeper
from ..views import registry, slices
from ..views.registry import VIEWS_DIR
from .changes import Changes
from .contents import Contents
from .entries import NPY_SUFFIX, Entry, Kind, Maker, name_problem, root_array_stem, slice_stream
from .freshness import Freshness
from .georefs import Georefs
from .handles import Handle, OpenFiles
from .ingest import Ingest
from .inodes import ROOT_INODE, Inodes
from .listings import Listings
from .newnames import NewNames
from .plain import PlainFiles
from .statistics import SavedStatistics
from .times import Times
from .versions import Versions

__all__ = ["ROOT_INODE", "Namespace", "name_problem"]

log = logging.getLogger(__name__)


class Namespace:
    """Maps inodes and names to groups, arrays and views."""

    # (declared here: callables given to versions and listings name them before they are made)
    listings: Listings
    contents: Contents

    def __init__(
        self,
        hierarchy: Hierarchy,
        root: Node,
        source: str,
        engine: Engine,
        show_views: bool = False,
        writable: bool = False,
        create_chunks: tuple[int, ...] | None = None,
        create_codec: str | None = None,
        on_name_gone: Callable[[int, str], None] | None = None,
        metadata_ttl_s: float = math.inf,
        on_data_stale_sync: Callable[[list[int]], None] | None = None,
    ) -> None:
        self.hierarchy = hierarchy
        self.engine = engine
        self.on_data_stale_sync = on_data_stale_sync  # files whose cached pages a refresh made stale
        self.show_views = show_views
        self.writes_allowed = writable
        self.root_stem = root_array_stem(source)
        self.root_node = root
        # This daemon's claim on its staging areas (written only once it stages an array)
        self.lease = LeaseKeeper(hierarchy.store)
        self.inodes = Inodes(on_name_gone)
        # The repository a versioned store shows (its snapshots, branches and commits), if any.
        repository = hierarchy.store if isinstance(hierarchy.store, IcechunkStore) else None
        # (made first: the other parts ask it whether they are fresh; it tells them through `self`)
        self.freshness = Freshness(
            engine, hierarchy, self.inodes, self, self.root_stem, on_data_stale_sync, metadata_ttl_s, repository
        )
        self.plain = PlainFiles(engine, hierarchy, self.inodes, self.invalidate)
        # (versions and listings need each other: versions asks listings whether a name can be listed)
        self.versions = Versions(
            engine, hierarchy, self.inodes, lambda name, key: self.listings.listable(name, key), repository
        )
        self.listings = Listings(
            engine,
            hierarchy,
            self.inodes,
            freshness=self.freshness,
            versions=self.versions,
            plain=self.plain,
            ome_tiff=lambda group: self.contents.ome_tiff(group),
            root_node=lambda: self.root_node,
            root_stem=self.root_stem,
            writes_allowed=writable,
        )
        self.georefs = Georefs(engine, self.freshness, self.listings)
        self.statistics = SavedStatistics(engine, self.inodes, self.georefs, self.npy_name, self.forget_pages)
        self.contents = Contents(
            engine,
            hierarchy,
            freshness=self.freshness,
            listings=self.listings,
            versions=self.versions,
            georefs=self.georefs,
            statistics=self.statistics,
            root_stem=self.root_stem,
            npy_name=self.npy_name,
            stats_bytes=self.stats_bytes,
        )
        self.times = Times(engine, hierarchy)
        self.names = NewNames(hierarchy, self.inodes, lambda: self.root_node, self.root_stem)
        # (arriving files are made before changes, which hand them a renamed held file or an
        # unfinished array removed)
        self.ingest = Ingest(
            engine,
            hierarchy,
            self.inodes,
            freshness=self.freshness,
            listings=self.listings,
            plain=self.plain,
            statistics=self.statistics,
            times=self.times,
            names=self.names,
            lease=self.lease,
            child=self.child,
            show_root=self.show_root,
            invalidate=self.invalidate,
            create_chunks=create_chunks,
            create_codec=create_codec,
        )
        self.changes = Changes(
            engine,
            hierarchy,
            self.inodes,
            freshness=self.freshness,
            listings=self.listings,
            plain=self.plain,
            ingest=self.ingest,
            times=self.times,
            names=self.names,
            lookup=self.lookup,
            child=self.child,
            invalidate=self.invalidate,
        )
        self.files = OpenFiles(
            engine,
            self.inodes,
            freshness=self.freshness,
            contents=self.contents,
            statistics=self.statistics,
            tree=self,
            writes_allowed=writable,
        )
        engine.on_array_changed = self.freshness.array_changed
        if isinstance(root, ArrayMeta):
            engine.see_layout(root)
        self.inodes.new(Kind.GROUP, "", root if isinstance(root, GroupMeta) else None)

    def show_root(self, node: Node) -> None:
        """The root shows NODE now (a root array stored by this mount, or found changed in the store):
        the one place that changes it."""
        self.root_node = node

    @property
    def open_files(self) -> int:
        return self.files.count

    # --- entries and lookup counts (the inode table's) ------------------------------------

    def get(self, inode: int) -> Entry:
        return self.inodes.get(inode)

    def parent_dir(self, inode: int) -> Entry:
        """The directory holding directory `inode` (the root's is the root): what `..` names."""
        return self.inodes.parent_dir(inode)

    @property
    def entry_count(self) -> int:
        return len(self.inodes)

    def remember(self, entry: Entry) -> None:
        """The kernel took a reference (a reply to lookup, create, mkdir, or a readdirplus entry)."""
        self.inodes.remember(entry)

    def forget(self, inode: int, n: int) -> None:
        """The kernel dropped `n` references; an entry nothing refers to any more is dropped."""
        self.inodes.forget(inode, n)

    def drop_unused(self, entries: list[Entry]) -> None:
        """Drop entries nothing refers to (made for a reply that was never sent, or forgotten)."""
        self.inodes.drop_unused(entries)

    def invalidate(self) -> None:
        """Listings and nodes are read again after a change (inodes of names the kernel holds stay)."""
        self.listings.invalidate()
        self.freshness.forget_nodes()

    # --- directories and lookups ------------------------------------------------------

    async def children(self, inode: int) -> dict[str, Maker]:
        """Name -> maker of a directory's entries: the store's, and files not yet arrays."""
        return await self.listings.children(inode)

    @staticmethod
    def _grid(entry: Entry) -> tuple[int, ...]:
        if entry.error is not None:
            raise entry.error
        return grid.grid_shape(entry.array.shape, entry.array.chunk_shape)

    async def dir_len(self, inode: int) -> int:
        entry = self.inodes.get(inode)
        await self.freshness.follow(entry)
        if entry.kind is Kind.CHUNKDIR:
            return math.prod(self._grid(entry))
        n = len(await self.listings.children(inode))
        return n + (1 if inode == ROOT_INODE and self.show_views else 0)

    async def dir_items(self, inode: int, start: int, count: int) -> list[tuple[str, Entry]]:
        """Entries [start, start+count) of a directory, in a stable order (chunk directories are
        computed, never materialized whole)."""
        entry = self.inodes.get(inode)
        await self.freshness.follow(entry)
        makers: dict[str, Maker] = {}
        if entry.kind is Kind.CHUNKDIR:
            shape = self._grid(entry)
            for i in range(start, min(start + count, math.prod(shape))):
                idx = tuple(int(x) for x in np.unravel_index(i, shape)) if shape else ()
                name = registry.chunk_name(idx)
                makers[name] = functools.partial(self._chunk_entry, entry, idx)
        else:
            children = await self.listings.children(inode)
            names = list(children)
            if inode == ROOT_INODE and self.show_views:
                names.append(VIEWS_DIR)
            for name in names[start : start + count]:
                if name == VIEWS_DIR and inode == ROOT_INODE:
                    makers[name] = lambda: self.inodes.new(Kind.VIEWS, "views")
                else:
                    makers[name] = children[name]
        out = [(name, self.inodes.child(inode, name, make)) for name, make in makers.items()]
        for i, (name, child) in enumerate(out):
            try:
                try:
                    await self.settle(child)
                except Stale:  # retired just now (replaced in the store): the name leads to what it holds
                    self.inodes.drop_unused([child])
                    out[i] = (name, self.inodes.child(inode, name, makers[name]))
                    await self.settle(out[i][1])
            except BaseException:
                self.inodes.drop_unused([e for _, e in out[i:]])
                raise
        return out

    def _chunk_entry(self, parent: Entry, idx: tuple[int, ...]) -> Entry:
        return self.inodes.new(Kind.CHUNK, "chunks", parent.node, origin=idx)

    async def child(self, parent: int, name: str) -> Entry | None:
        """The entry `name` in directory `parent`, None when there is none (not counted)."""
        entry = self.inodes.get(parent)
        await self.freshness.follow(entry)
        if parent == ROOT_INODE and name == VIEWS_DIR:
            return self.inodes.child(parent, name, lambda: self.inodes.new(Kind.VIEWS, "views"))
        if entry.kind is Kind.CHUNKDIR:
            idx = self._chunk_index(entry, name)
            return None if idx is None else self.inodes.child(parent, name, lambda: self._chunk_entry(entry, idx))
        make = (await self.listings.children(parent)).get(name)
        if make is None and entry.view in registry.LOOKUP_ONLY_VIEWS and entry.kind is Kind.GROUP:
            make = await self._slice_maker(entry, name)
        if make is None and entry.kind is Kind.VERSIONS and entry.key == "snapshots":
            make = await self.versions.snapshot_maker(name)
        return None if make is None else self.inodes.child(parent, name, make)

    async def _slice_maker(self, group: Entry, name: str) -> Maker | None:
        """The maker of `BASE[SEL].npy` in a `slice/` directory; None (logged) when there is none."""
        parts = slices.split_name(name)
        if parts is None:
            return None
        if group.node is None and self.root_node.kind == "array":
            nodes: list[Node] = [self.root_node]
        else:
            nodes = await self.listings.nodes_below(group.node.path if group.node is not None else "")
        base = parts[0]
        for node in nodes:
            if isinstance(node, ArrayMeta) and (node.path.rsplit("/", 1)[-1] if node.path else self.root_stem) == base:
                try:
                    slice_stream(node, name)
                except slices.BadSelection as e:
                    log.warning("slice/%s: %s", name, e)
                    return None
                return lambda: self.inodes.new(Kind.SLICE, "slice", node, key=name)
        log.warning("slice/%s: no array %r here", name, base)
        return None

    async def lookup(self, parent: int, name: str) -> Entry:
        """`name` in `parent`, its attributes ready (NotFound when there is none)."""
        return await self._lookup(parent, name, again=True)

    async def _lookup(self, parent: int, name: str, again: bool) -> Entry:
        child = await self.child(parent, name)
        if child is None:
            raise NotFound(name)
        try:
            await self.settle(child)
        except Stale:  # retired just now (replaced in the store): the name leads to what it holds
            self.inodes.drop_unused([child])
            if not again:
                raise
            return await self._lookup(parent, name, again=False)
        except BaseException:
            self.inodes.drop_unused([child])
            raise
        return child

    def _chunk_index(self, entry: Entry, name: str) -> tuple[int, ...] | None:
        shape = self._grid(entry)
        m = re.fullmatch(r"(\d+(?:\.\d+)*)\.npy", name)
        if not m:
            return None
        idx = tuple(int(x) for x in m.group(1).split("."))
        if not entry.array.shape:
            idx = () if idx == (0,) else (-1,)
        if len(idx) != len(shape) or any(i >= n for i, n in zip(idx, shape)) or name != registry.chunk_name(idx):
            return None
        return idx

    # --- open files ------------------------------------------------------------------

    async def open(self, inode: int, flags: int) -> Handle:
        """open(2): a handle of the file's kind (see OpenFiles.open_file for what it refuses)."""
        return await self.files.open_file(self.get(inode), flags)

    async def create_file(self, parent: int, name: str) -> tuple[Entry, Handle]:
        """open(2) with O_CREAT of a new name: the new entry and its open handle."""
        entry = await self.changes.create(parent, name)
        return entry, self.files.opened(entry)

    async def settle(self, entry: Entry) -> None:
        """Fill in what an entry's attributes need (after following what the store holds now)."""
        await self.contents.settle(entry)

    # --- writes: to plain files (plain.py) or arrays (ingest.py) -----------------------

    async def truncate(self, entry: Entry, size: int = 0) -> None:
        """A held file takes any size; a .npy file only 0 (the array is replaced: ingest.py)."""
        if entry.kind is Kind.PLAIN:
            await self.plain.truncate(entry, size)
        else:
            await self.ingest.truncate(entry, size)

    async def write(self, entry: Entry, offset: int, data: bytes) -> int:
        """Bytes into an array's file: a file being created or replaced, or the data of an array."""
        return await self.ingest.write(entry, offset, data)

    async def sync(self, entry: Entry) -> None:
        """fsync: what was written is in the store."""
        if entry.kind is Kind.PLAIN:
            await self.plain.sync(entry)
        else:
            await self.ingest.sync(entry)

    async def close(self, entry: Entry) -> None:
        """close(2) of one descriptor (see Ingest.close and PlainFiles.close)."""
        if entry.kind is Kind.PLAIN:
            await self.plain.close(entry)
        else:
            await self.ingest.close(entry)

    async def release(self, entry: Entry) -> None:
        """The last close of a file (see Ingest.release and PlainFiles.release)."""
        if entry.kind is Kind.PLAIN:
            self.plain.release(entry)
        else:
            await self.ingest.release(entry)

    async def shutdown(self) -> None:
        """Unmount: plain files are stored, complete staged arrays committed, the rest dropped,
        each with a log line."""
        for entry in self.inodes.all():
            try:
                if entry.plain is not None:
                    await self.plain.shutdown(entry)
                else:
                    await self.ingest.shutdown(entry)
            except ZarrfsError as e:
                log.warning("unmount: %s", e)

    def writing_files(self) -> bool:
        """Whether some file is being written into an array that is not complete yet."""
        return self.ingest.writing_files()

    async def renew_lease(self, refresh: bool = False) -> None:
        """Bring this daemon's staging lease up to date (see Ingest.renew_lease)."""
        await self.ingest.renew_lease(refresh)

    # --- changes to names and nodes (changes.py) ----------------------------------------

    async def create(self, parent: int, name: str) -> Entry:
        return await self.changes.create(parent, name)

    async def mkdir(self, parent: int, name: str) -> Entry:
        return await self.changes.mkdir(parent, name)

    async def rmdir(self, parent: int, name: str) -> None:
        await self.changes.rmdir(parent, name)

    async def unlink(self, parent: int, name: str) -> None:
        await self.changes.unlink(parent, name)

    async def rename(
        self, old_parent: int, old_name: str, new_parent: int, new_name: str, replace: bool = True, message: str = ""
    ) -> None:
        """Move a node; with replace false an existing target is refused (EEXIST)."""
        await self.changes.rename(old_parent, old_name, new_parent, new_name, replace, message)

    async def set_attributes(self, entry: Entry, value: bytes) -> None:
        await self.changes.set_attributes(entry, value)

    async def set_times(self, entry: Entry, mtime_ns: int) -> None:
        await self.times.set(entry, mtime_ns)
        self.times.set_in_store(entry)

    def time_of(self, entry: Entry) -> int | None:
        """The modification time a writer set on `entry` (None: the store's)."""
        return self.times.of(entry)

    def touched(self, entry: Entry) -> None:
        """A write: the time a writer set before is replaced by now."""
        self.times.touched(entry)

    # --- generated files ---------------------------------------------------------------

    def npy_name(self, meta: Node) -> str:
        """The file name of an array in the main tree."""
        return (meta.path.rsplit("/", 1)[-1] or self.root_stem) + NPY_SUFFIX

    def forget_pages(self, inodes: list[int]) -> None:
        """The kernel drops the cached pages and attributes of these files (in the background)."""
        if inodes and self.on_data_stale_sync is not None:
            self.engine.start_soon_thread(self.on_data_stale_sync, inodes)

    def stats_bytes(self) -> bytes:
        engine = {**self.engine.stats(), "plain_memory_bytes": self.plain.memory.bytes}
        return registry.stats_json(engine, len(self.inodes), self.open_files)

    def xattrs(self, entry: Entry) -> dict[str, bytes]:
        """The read-only `user.zarr.*` attributes of groups and arrays (main tree and views)."""
        if entry.kind not in (Kind.GROUP, Kind.ARRAY, Kind.CHUNKDIR):
            return {}
        return registry.xattrs(entry.node)
