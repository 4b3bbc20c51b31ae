"""The namespace: inodes and names of groups, arrays and `.zarrfs` views; listings; lookup counts.

Runs in the trio thread (its tables need no locks; code between two awaits is atomic);
hierarchy and store I/O go through the engine's worker threads. An entry lives while the
kernel holds a reference to it (its lookup count, kept by `remember` and `forget`), a file
is open on it, or it holds data not in the store (a file being written, a held file).
Then it is dropped; the next lookup of its name makes a new one with a new inode.
"""

from __future__ import annotations

import logging
import math
import re
from typing import Any, Callable

import numpy as np

from ..views import registry, images, netcdf, slices
from .. import grid
from . import handles
from ..views.previews import Previews
from ..views.registry import STATS_FILE, VIEW_DIRS, VIEWS_DIR
from ..engine import Engine
from ..errors import NotFound, Stale, ZarrfsError
from ..formats.base import RESERVED_PREFIX, Hierarchy
from ..storage.staging import LeaseKeeper
from ..model import ArrayMeta, BrokenNode, GroupMeta, Node
from .freshness import REFRESH_FILE, NamespaceFreshness
from .ingest import HeldFile
from .versions import VERSIONS_DIR, NamespaceVersions
from .changes import NamespaceWrites
from .entries import NPY_SUFFIX, Entry, Kind, Maker, name_problem, root_array_stem, slice_stream

log = logging.getLogger(__name__)

ROOT_INODE = 1


def _node_key(node: Node) -> str:
    """The store key a log line names for a node: its metadata document, else its path."""
    key = node.key if isinstance(node, BrokenNode) else node.metadata_key
    return key or node.path or "/"


class Namespace(NamespaceWrites, NamespaceFreshness, NamespaceVersions):
    """Maps inodes and names to groups, arrays and views."""

    def __init__(self, hierarchy: Hierarchy, root: Node, source: str, engine: Engine, show_views: bool = False,
                 writable: bool = False, create_chunks: tuple[int, ...] | None = None,
                 create_codec: str | None = None, on_name_gone: Callable[[int, str], None] | None = None,
                 metadata_ttl_s: float = math.inf,
                 on_data_stale_sync: Callable[[list[int]], None] | None = None) -> None:
        self.hierarchy = hierarchy
        self.on_data_stale_sync = on_data_stale_sync  # files whose cached pages a refresh made stale
        self.start_fresh(metadata_ttl_s)
        # Remote stores: an array's stored bytes cost a listing of its chunks, so stat reports the
        # logical size until info/ asked for them (README: Remote stores).
        self.stored_sizes_lazy = not hierarchy.store.is_local
        self.engine = engine
        engine.on_array_changed = self._array_changed  # freshness.py
        if isinstance(root, ArrayMeta):
            engine.see_layout(root)
        self.show_views = show_views
        self.writes_allowed = writable
        self.open_files = 0
        self.root_stem = root_array_stem(source)
        self.root_node = root
        # Chunking and codec of arrays created through the mount (options chunks=, codec=)
        self.create_chunks = create_chunks
        self.create_codec = create_codec
        # This daemon's claim on its staging areas (written only once it stages an array)
        self.lease = LeaseKeeper(hierarchy.store)
        self._lease_lock = engine.new_lock()
        # Told when a name disappears (the FUSE layer tells the kernel to drop its dentry)
        self.on_name_gone = on_name_gone or (lambda parent, name: None)
        self._entries: dict[int, Entry] = {}
        self._by_name: dict[tuple[int, str], int] = {}
        self._next_inode = ROOT_INODE
        # Shared by every view of a group: its child nodes; and per array, its stored keys' sizes.
        self._below: dict[str, list[Node]] = {}
        self._sizes: dict[str, dict[str, int | None] | None] = {}
        # Keys whose names cannot be file names (logged once, never listed)
        self._unlistable: set[str] = set()
        self.previews = Previews(engine)
        # Statistics GDAL saved into an array's gdal/PATH.vrt or raw/PATH.raw.aux.xml (the same
        # bands), by path, with the node they are of; kept until the array changes or a refresh
        # (never stored: GDAL computes them again).
        self.statistics: dict[str, tuple[Node, list[dict[str, str]]]] = {}
        self._statistics_epoch = 0  # counts forget_statistics: a rewrite parsed meanwhile is stale
        # Bytes of statistics rewrites held by open descriptors (StatisticsRewriteHandle)
        self.rewrite_bytes = 0
        # Files created and not yet arrays: (parent inode, name) -> inode
        self._pending_names: dict[tuple[int, str], int] = {}
        # Modification times writers set (utimensat) on arrays, by hierarchy path: shown for the
        # mount's life (a local store also keeps them as its metadata document's time).
        self.times: dict[str, int] = {}
        self._new(Kind.GROUP, "", root if isinstance(root, GroupMeta) else None)

    # --- entries and lookup counts ----------------------------------------------------

    def _new(self, kind: Kind, view: str, node: Node | None = None, **kw: Any) -> Entry:
        entry = Entry(self._next_inode, kind, view, node, **kw)
        self._entries[entry.inode] = entry
        self._next_inode += 1
        return entry

    def _name(self, parent: int, name: str, entry: Entry) -> None:
        """Give `entry` the name `name` in directory `parent`."""
        self._by_name[(parent, name)] = entry.inode
        entry.name_key = (parent, name)

    def _child(self, parent: int, name: str, make: Maker) -> Entry:
        """The entry of `name` in `parent`, made by `make()` unless it exists."""
        inode = self._by_name.get((parent, name))
        if inode is not None and inode in self._entries:
            return self._entries[inode]
        entry = make()
        self._name(parent, name, entry)
        return entry

    def get(self, inode: int) -> Entry:
        try:
            return self._entries[inode]
        except KeyError:
            raise NotFound(f"no inode {inode}") from None

    def parent_dir(self, inode: int) -> Entry:
        """The directory holding directory `inode` (the root's is the root): what `..` names."""
        entry = self.get(inode)
        if entry.name_key is None:
            return entry
        return self._entries.get(entry.name_key[0], entry)

    def writing_files(self) -> bool:
        """Whether some file is being written into an array that is not complete yet."""
        return any(e.writing is not None and e.writing.staged is not None for e in self._entries.values())

    @property
    def entry_count(self) -> int:
        return len(self._entries)

    def remember(self, entry: Entry) -> None:
        """The kernel took a reference (a reply to lookup, create, mkdir, or a readdirplus entry)."""
        entry.lookups += 1

    def forget(self, inode: int, n: int) -> None:
        """The kernel dropped `n` references; an entry nothing refers to any more is dropped."""
        entry = self._entries.get(inode)
        if entry is not None:
            entry.lookups = max(entry.lookups - n, 0)
            self.drop_unused([entry])

    def drop_unused(self, entries: list[Entry]) -> None:
        """Drop entries that neither the kernel nor an open file refers to and that hold nothing
        the store does not (entries made for a reply that was never sent, or forgotten)."""
        for entry in entries:
            if (entry.lookups or entry.opens or entry.inode == ROOT_INODE or entry.writing is not None
                    or (entry.held is not None and entry.held.needs_entry)
                    or self._entries.get(entry.inode) is not entry
                    or any(parent == entry.inode for parent, _ in self._pending_names)):
                continue  # a directory holding files apart keeps its inode: their names hang on it
            del self._entries[entry.inode]
            if entry.name_key is not None and self._by_name.get(entry.name_key) == entry.inode:
                del self._by_name[entry.name_key]

    def _node_entry(self, view: str, node: Node) -> list[tuple[str, Maker]]:
        """(name, maker) of a node's entries in a view directory."""
        base = node.path.rsplit("/", 1)[-1] if node.path else self.root_stem
        error = node.error if isinstance(node, BrokenNode) else None
        return [(name, lambda kind=kind: self._new(kind, view, node, error=error))
                for name, kind in registry.view_names(view, node, base)]

    # --- directories --------------------------------------------------------------

    async def nodes_below(self, path: str) -> list[Node]:
        await self.revalidate()
        nodes = self._below.get(path)
        if nodes is None:
            epoch = self.fresh_epoch

            async def load() -> list[Node]:
                try:
                    found = await self.engine.run_io(self.hierarchy.children_sync, path, key=("children", path))
                except ZarrfsError as e:
                    log.warning("listing %s: %s", path or "/", e)
                    raise
                for node in found:
                    if isinstance(node, BrokenNode):
                        self.engine.note_failure(node.error, node.key)
                if epoch == self.fresh_epoch:  # (else read before a refresh: its callers' alone)
                    self._below[path] = found
                    self.saw_nodes(found)
                return found

            # Views of one group list it at once: one read, so no older listing lands after a newer one
            nodes = await self.engine.once(("below", path, epoch), load)
        return nodes

    async def _listing(self, inode: int) -> dict[str, Maker]:
        """Name -> maker of a directory's entries (all but chunk directories, which are computed),
        loaded once for concurrent readers."""
        entry = self.get(inode)
        await self.revalidate()
        if entry.listing is None:
            async def load() -> dict[str, Maker]:
                if entry.listing is None:
                    entry.listing = await self._load_listing(entry)
                return entry.listing

            return await self.engine.once(("listing", inode), load)
        return entry.listing

    async def _load_listing(self, entry: Entry) -> dict[str, Maker]:
        if entry.error is not None:
            raise entry.error
        if entry.kind is Kind.VIEWS:
            names: dict[str, Maker] = {}
            for view in VIEW_DIRS:
                if view == "store":
                    names[view] = lambda: self._new(Kind.STOREDIR, "store", key="")
                else:
                    names[view] = lambda v=view: self._new(Kind.GROUP, v, self._root_group())
            names[STATS_FILE] = lambda: self._new(Kind.STATS, "stats")
            names[REFRESH_FILE] = lambda: self._new(Kind.STATS, "refresh")
            if self.has_versions:
                names[VERSIONS_DIR] = lambda: self._new(Kind.VERSIONS, VERSIONS_DIR, key="")
            return names
        if entry.kind is Kind.VERSIONS:
            return await self._versions_listing(entry)
        if entry.kind is Kind.STOREDIR:
            return await self._store_listing(entry.key)
        if entry.kind is not Kind.GROUP:
            raise NotFound("not a directory")
        return await self._group_listing(entry)

    async def _store_listing(self, prefix: str) -> dict[str, Maker]:
        files, dirs = await self.engine.run_io(self.hierarchy.store.list_dir_sync, prefix, key=("list", prefix))
        names: dict[str, Maker] = {}
        for d in dirs:
            key = f"{prefix}/{d}" if prefix else d
            if self._listable(d, key):
                names[d] = lambda key=key: self._new(Kind.STOREDIR, "store", key=key)
        for f, size in files.items():
            key = f"{prefix}/{f}" if prefix else f
            if self._listable(f, key):
                names[f] = lambda key=key, s=size: self._new(Kind.STOREKEY, "store", key=key,
                                                             size=s if s is not None else -1)
        return names

    async def _group_listing(self, entry: Entry) -> dict[str, Maker]:
        names: dict[str, Maker] = {}
        if entry.node is None and self.root_node.kind == "array":
            nodes: list[Node] = [self.root_node]  # a root array: the root holds NAME.npy (and plain files)
        else:
            nodes = await self.nodes_below(entry.node.path if entry.node is not None else "")
        if entry.view == "info" and isinstance(entry.node, GroupMeta) and entry.node.path == "":
            names[".json"] = lambda: self._new(Kind.INFO, "info", entry.node)
        group_file = registry.GROUP_FILE_VIEWS.get(entry.view)
        if group_file and isinstance(entry.node, GroupMeta) and entry.node.path == "":  # the root group: NAME.nc
            suffix, kind = group_file
            names[self.root_stem + suffix] = lambda: self._new(kind, entry.view, entry.node)
        for node in nodes:
            if node.path.rsplit("/", 1)[-1].startswith(RESERVED_PREFIX):
                continue  # a staging area of an array being written (or left by a killed daemon)
            for name, make in self._node_entry(entry.view, node):
                if name not in names and self._listable(name, _node_key(node)):
                    names[name] = make
        group = self._plain_group(entry)
        if group is not None and (self.hierarchy.store.is_local or self.writes_allowed):
            await self._plain_files(group, names)
        return names

    def _plain_group(self, entry: Entry) -> str | None:
        """The group whose plain files directory `entry` lists (None: it lists none)."""
        if entry.view != "" or not self.hierarchy.keeps_plain_files:
            return None
        if isinstance(entry.node, GroupMeta):
            return entry.node.path
        if entry.node is None and self.root_node.kind == "array" and self.hierarchy.plain_files_beside_root_array:
            return ""
        return None

    async def _plain_files(self, path: str, names: dict[str, Maker]) -> None:
        """Plain files kept in a group's directory: its keys that are no format's own. Remote
        read-only mounts leave them out: a listing per group (consolidated metadata needs none),
        and some servers (HTTP) cannot list."""
        prefix = self.hierarchy.plain_dir(path)
        try:
            files, _ = await self.engine.run_io(self.hierarchy.store.list_dir_sync, prefix, key=("list", prefix))
        except ZarrfsError as e:
            log.warning("plain files of %s not listed: %s", path or "/", e)
            return
        for name, size in files.items():
            key = f"{prefix}/{name}" if prefix else name
            if name in names or self.hierarchy.plain_name_problem(name) is not None or not self._listable(name, key):
                continue
            names[name] = lambda key=key, name=name, size=size: self._plain_entry(key, name, size)

    def _plain_entry(self, key: str, name: str, size: int | None) -> Entry:
        entry = self._new(Kind.HELD, "", None, key=name)
        entry.held = HeldFile(self.engine, key, size or 0, stored=True)
        return entry

    def _listable(self, name: str, key: str) -> bool:
        """Whether `name` can be listed; if not, say so once (naming the key) and leave it out."""
        problem = name_problem(name)
        if problem is not None and key not in self._unlistable:
            self._unlistable.add(key)
            log.warning("%s: not listed: %s", key, problem)
        return problem is None

    def _root_group(self) -> GroupMeta | None:
        return self.root_node if isinstance(self.root_node, GroupMeta) else None

    @staticmethod
    def _grid(entry: Entry) -> tuple[int, ...]:
        if entry.error is not None:
            raise entry.error
        return grid.grid_shape(entry.node.shape, entry.node.chunk_shape)

    async def dir_len(self, inode: int) -> int:
        entry = self.get(inode)
        await self.follow(entry)
        if entry.kind is Kind.CHUNKDIR:
            return math.prod(self._grid(entry))
        n = len(await self.children(inode))
        return n + (1 if inode == ROOT_INODE and self.show_views else 0)

    async def dir_items(self, inode: int, start: int, count: int) -> list[tuple[str, Entry]]:
        """Entries [start, start+count) of a directory, in a stable order (chunk directories are
        computed, never materialized whole)."""
        entry = self.get(inode)
        await self.follow(entry)
        makers: dict[str, Maker] = {}
        if entry.kind is Kind.CHUNKDIR:
            shape = self._grid(entry)
            for i in range(start, min(start + count, math.prod(shape))):
                idx = tuple(int(x) for x in np.unravel_index(i, shape)) if shape else ()
                name = registry.chunk_name(idx)
                makers[name] = lambda idx=idx: self._chunk_entry(entry, idx)
        else:
            children = await self.children(inode)
            names = list(children)
            if inode == ROOT_INODE and self.show_views:
                names.append(VIEWS_DIR)
            for name in names[start:start + count]:
                if name == VIEWS_DIR and inode == ROOT_INODE:
                    makers[name] = lambda: self._new(Kind.VIEWS, "views")
                else:
                    makers[name] = children[name]
        out = [(name, self._child(inode, name, make)) for name, make in makers.items()]
        for i, (name, child) in enumerate(out):
            try:
                try:
                    await self.settle(child)
                except Stale:  # retired just now (replaced in the store): the name leads to what it holds
                    self.drop_unused([child])
                    out[i] = (name, self._child(inode, name, makers[name]))
                    await self.settle(out[i][1])
            except BaseException:
                self.drop_unused([e for _, e in out[i:]])
                raise
        return out

    def _chunk_entry(self, parent: Entry, idx: tuple[int, ...]) -> Entry:
        return self._new(Kind.CHUNK, "chunks", parent.node, origin=idx)

    async def child(self, parent: int, name: str) -> Entry | None:
        """The entry `name` in directory `parent`, None when there is none (not counted)."""
        entry = self.get(parent)
        await self.follow(entry)
        if parent == ROOT_INODE and name == VIEWS_DIR:
            return self._child(parent, name, lambda: self._new(Kind.VIEWS, "views"))
        if entry.kind is Kind.CHUNKDIR:
            idx = self._chunk_index(entry, name)
            return None if idx is None else self._child(parent, name, lambda: self._chunk_entry(entry, idx))
        make = (await self.children(parent)).get(name)
        if make is None and entry.view in registry.LOOKUP_ONLY_VIEWS and entry.kind is Kind.GROUP:
            make = await self._slice_maker(entry, name)
        if make is None and entry.kind is Kind.VERSIONS and entry.key == "snapshots":
            make = await self._snapshot_maker(name)
        return None if make is None else self._child(parent, name, make)

    async def _slice_maker(self, group: Entry, name: str) -> Maker | None:
        """The maker of `BASE[SEL].npy` in a `slice/` directory; None (logged) when there is none."""
        parts = slices.split_name(name)
        if parts is None:
            return None
        if group.node is None and self.root_node.kind == "array":
            nodes: list[Node] = [self.root_node]
        else:
            nodes = await self.nodes_below(group.node.path if group.node is not None else "")
        base = parts[0]
        for node in nodes:
            if isinstance(node, ArrayMeta) and (node.path.rsplit("/", 1)[-1] if node.path else self.root_stem) == base:
                try:
                    slice_stream(node, name)
                except slices.BadSelection as e:
                    log.warning("slice/%s: %s", name, e)
                    return None
                return lambda: self._new(Kind.SLICE, "slice", node, key=name)
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
            self.drop_unused([child])
            if not again:
                raise
            return await self._lookup(parent, name, again=False)
        except BaseException:
            self.drop_unused([child])
            raise
        return child

    def _chunk_index(self, entry: Entry, name: str) -> tuple[int, ...] | None:
        shape = self._grid(entry)
        m = re.fullmatch(r"(\d+(?:\.\d+)*)\.npy", name)
        if not m:
            return None
        idx = tuple(int(x) for x in m.group(1).split("."))
        if not entry.node.shape:
            idx = () if idx == (0,) else (-1,)
        if len(idx) != len(shape) or any(i >= n for i, n in zip(idx, shape)) or name != registry.chunk_name(idx):
            return None
        return idx

    # --- open files ------------------------------------------------------------------

    async def open(self, inode: int, flags: int) -> handles.Handle:
        """open(2): a handle of the file's kind (see handles.open_file for what it refuses)."""
        return await handles.open_file(self, self.get(inode), flags)

    async def create_file(self, parent: int, name: str) -> tuple[Entry, handles.Handle]:
        """open(2) with O_CREAT of a new name: the new entry and its open handle."""
        entry = await self.create(parent, name)
        return entry, handles.opened(self, entry)

    # --- sizes, stored bytes, generated files ---------------------------------------

    async def stored_sizes(self, meta: ArrayMeta) -> dict[str, int | None] | None:
        """Sizes of an array's stored chunk keys (None when the store cannot list them)."""
        if meta.path not in self._sizes:
            try:
                self._sizes[meta.path] = await self.engine.run_io(self.hierarchy.chunk_sizes_sync, meta)
            except ZarrfsError as e:
                log.info("stored size of %s unknown: %s", meta.path or "/", e)
                self._sizes[meta.path] = None
        return self._sizes[meta.path]

    async def settle(self, entry: Entry) -> None:
        """Fill in what an entry's attributes need (after following what the store holds now):
        stored bytes, sizes of generated files."""
        await self.follow(entry)
        if isinstance(entry.error, Stale):  # (the kernel looks its name up again: errors.Stale)
            raise entry.error
        if entry.kind is Kind.VERSIONLOG and entry.key != getattr(self.hierarchy.store, "snapshot_id", None):
            entry.stored_bytes = None  # the mount shows another snapshot: its log is another
        if entry.stored_bytes is not None or entry.error is not None:
            return
        if entry.kind is Kind.ARRAY and entry.node is None:  # created, no header yet
            entry.stored_bytes = 0
        elif entry.kind is Kind.ARRAY or entry.kind is Kind.CHUNK:
            lazy = self.stored_sizes_lazy and entry.node.path not in self._sizes
            sizes = None if lazy else await self.stored_sizes(entry.node)
            if sizes is None:
                entry.stored_bytes = entry.size
            elif entry.kind is Kind.ARRAY:
                entry.stored_bytes = sum(s or 0 for s in sizes.values())
            else:
                entry.stored_bytes = await self._chunk_stored_bytes(entry, sizes)
        elif entry.kind is Kind.INFO:
            entry.content = registry.info_json(
                entry.node, await self.stored_sizes(entry.node) if isinstance(entry.node, ArrayMeta) else None)
            entry.size = entry.stored_bytes = len(entry.content)
        elif entry.kind in (Kind.TEXT, Kind.PAM):
            kept = self.statistics.get(entry.node.path)
            statistics = kept[1] if kept is not None and kept[0] is entry.node else None
            entry.content = (images.pam(entry.node, statistics) if entry.kind is Kind.PAM else
                             images.text(entry.view, entry.node, self._npy_name(entry.node), statistics))
            entry.size = entry.stored_bytes = len(entry.content)
        elif entry.kind is Kind.PREVIEW:
            entry.content = await self.previews.get(entry.node)
            entry.size = entry.stored_bytes = len(entry.content)
        elif entry.kind is Kind.STOREKEY:
            if entry.size < 0:
                size = await self.engine.run_io(self.hierarchy.store.size_sync, entry.key)
                entry.size = size or 0
            entry.stored_bytes = entry.size
        elif entry.kind is Kind.STATS:
            entry.size = 0 if entry.view == "refresh" else len(self.stats_bytes())
            entry.stored_bytes = 0
        elif entry.kind is Kind.NETCDF:
            await self._settle_netcdf(entry)
        elif entry.kind is Kind.VERSIONLOG:
            await self._settle_version_log(entry)
        else:
            entry.stored_bytes = entry.size

    def _npy_name(self, meta: Node) -> str:
        """The file name of an array in the main tree."""
        return (meta.path.rsplit("/", 1)[-1] or self.root_stem) + NPY_SUFFIX

    async def keep_statistics(self, entry: Entry, written: bytes) -> bool:
        """A rewrite of a file that saves statistics: keep the ones it adds (False, and nothing
        kept, when it changes anything else)."""
        meta, epoch = entry.node, self._statistics_epoch
        # Parsed in a worker thread: a text of thousands of bands takes a while.
        if entry.kind is Kind.PAM:
            statistics = await self.engine.run_cpu(images.pam_statistics, written, meta)
        else:
            statistics = await self.engine.run_cpu(images.vrt_statistics, written, meta, self._npy_name(meta))
        if statistics is None:
            return False
        if epoch != self._statistics_epoch:
            return True  # the array changed (or a refresh came) while it was parsed: they are stale
        self.statistics[meta.path] = (meta, statistics)
        self._statistics_changed(meta.path)
        return True

    def _statistics_changed(self, path: str | None) -> None:
        """The files that show the statistics of `path` (every array when None) are made again,
        and the kernel drops what it keeps of them."""
        files = [e for e in self._entries.values() if e.saves_statistics and (path is None or e.node.path == path)]
        for entry in files:
            entry.stored_bytes = None
        self.forget_pages([e.inode for e in files])

    def forget_pages(self, inodes: list[int]) -> None:
        """The kernel drops the cached pages and attributes of these files (in the background)."""
        if inodes and self.on_data_stale_sync is not None:
            self.engine.start_soon_thread(self.on_data_stale_sync, inodes)

    def forget_statistics(self, path: str | None = None) -> None:
        """The array at `path` (every array when None) changed: its saved statistics are gone."""
        self._statistics_epoch += 1
        if path is None:
            if not self.statistics:
                return
            self.statistics.clear()
        elif self.statistics.pop(path, None) is None:
            return
        self._statistics_changed(path)

    async def _settle_netcdf(self, entry: Entry) -> None:
        """Lay out a group's netCDF file from its arrays (what it leaves out is logged, and said in the file)."""
        group = entry.node
        children = await self.nodes_below(group.path)
        fit = {meta.path for meta in netcdf.group_arrays(children)
               if netcdf.scan_wanted(meta) and await self._fits_int32(meta)}
        nc = netcdf.group_file(group.attributes, children, fit)
        if nc.left_out:
            log.warning("netcdf/%s: left out: %s", group.path or self.root_stem, "; ".join(nc.left_out))
        entry._stream = nc
        entry.size = entry.stored_bytes = nc.size

    async def _fits_int32(self, meta: ArrayMeta) -> bool:
        """Whether every value of a (small) 64-bit integer array fits netCDF's int; when its
        chunks cannot be read, no (the variable stays 64-bit)."""
        wanted = list(grid.all_chunks(meta.shape, meta.chunk_shape))
        try:
            chunks = await self.engine.chunks(meta, wanted)
        except ZarrfsError as e:  # the engine logged the key
            log.warning("netcdf: %s kept 64-bit (CDF-5): its values could not be read: %s", meta.path, e)
            return False
        return all(netcdf.fits_int32(chunks[idx][tuple(slice(0, n) for n in
                                                        grid.data_shape(idx, meta.shape, meta.chunk_shape))])
                   for idx in wanted)

    async def _chunk_stored_bytes(self, entry: Entry, sizes: dict[str, int | None]) -> int:
        stored = sizes.get(entry.node.chunk_key(entry.origin)) or 0
        inner_size = getattr(entry.node.source, "stored_nbytes_sync", None)
        if inner_size is not None and stored:  # an inner chunk: its part of the shard
            try:
                stored = await self.engine.run_io(inner_size, self.hierarchy.store, entry.origin)
            except ZarrfsError as e:
                log.info("stored size of chunk %s of %s unknown: %s", entry.origin, entry.node.path or "/", e)
        return stored

    def stats_bytes(self) -> bytes:
        return registry.stats_json(self.engine.stats(), len(self._entries), self.open_files)

    def xattrs(self, entry: Entry) -> dict[str, bytes]:
        """The read-only `user.zarr.*` attributes of groups and arrays (main tree and views)."""
        if entry.kind not in (Kind.GROUP, Kind.ARRAY, Kind.CHUNKDIR):
            return {}
        return registry.xattrs(entry.node)

