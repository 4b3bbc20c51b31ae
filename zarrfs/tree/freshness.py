"""Freshness: listings, metadata and cached chunks are trusted for `metadata_ttl`, then asked again.

Part of the Namespace (runs in the trio thread, like it). zarrfs adds no coordination of
its own between clients of one store: after the TTL (or `cat MOUNT/.zarrfs/refresh`) the
listings, consolidated metadata and stored sizes are dropped and read again when next
needed, and cached chunks that no write of this mount holds are dropped and read again.

An array another writer replaced is followed too: each entry showing an array checks its
node against the store once per epoch (a TTL or refresh), at its next lookup, stat, open or
read (`follow`). Where only attributes changed it shows the new node. Where the shape, data
type or chunking changed, the entries of the old array retire: they lose their names (the
kernel looks them up again and gets new inodes, with pages of their own) and answer ESTALE,
so a file opened before reads the pages the kernel kept of the old array or ESTALE (the old
version is gone from the store: nothing exact is left to read). Every array node read from
the store is shown to the engine, which forgets chunks decoded with another chunk layout
(engine/revalidate.py `see_layout`).
"""

from __future__ import annotations

import functools
import logging
import math
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

from .. import grid
from ..errors import NotFound, Stale, ZarrfsError
from ..model import ArrayMeta, BrokenNode, GroupMeta, Node
from ..repeats import LogOnce
from ..views import netcdf
from ..views.kinds import ARRAY_FILE_KINDS, Kind
from .versions import is_version_path

if TYPE_CHECKING:
    from ..engine import Engine, Event
    from ..formats.base import Hierarchy
    from ..storage.icechunk import IcechunkStore
    from .contents import Contents
    from .entries import Entry
    from .georefs import Georefs
    from .inodes import Inodes
    from .listings import Listings
    from .statistics import SavedStatistics
    from .versions import Versions

log = logging.getLogger(__name__)

REFRESH_FILE = "refresh"
# The TTL starts this share of itself early (at most PIN_MAX_S), and what it drops stays pinned
# for that long (engine/pins.py): the requests that continue a read begun before it, sent back to
# back, get the versions it showed, and no pinned version outlives its TTL.
PIN_SHARE = 0.25
PIN_MAX_S = 1.0
# Files of a group made from its arrays (laid out again when the group's arrays change).
GROUP_FILES = (Kind.NETCDF, Kind.OMETIFF)


class FreshTree(Protocol):
    """What freshness tells of what went stale: the parts made from it (they ask it whether they
    are fresh), and the namespace's own state (the root's node, the count of open files)."""

    listings: Listings
    contents: Contents
    statistics: SavedStatistics
    georefs: Georefs
    versions: Versions

    @property
    def open_files(self) -> int: ...

    def show_root(self, node: Node) -> None: ...

    def invalidate(self) -> None: ...

    def forget_pages(self, inodes: list[int]) -> None: ...


class Freshness:
    """Drops listings and metadata older than `metadata_ttl_s` (inf: never, unless refreshed)."""

    def __init__(
        self,
        engine: Engine,
        hierarchy: Hierarchy,
        inodes: Inodes,
        tree: FreshTree,
        root_stem: str,
        on_data_stale_sync: Callable[[list[int]], None] | None = None,
        metadata_ttl_s: float = math.inf,
        repository: IcechunkStore | None = None,
    ) -> None:
        self.engine = engine
        self.hierarchy = hierarchy
        self.inodes = inodes
        self.tree = tree  # the parts made from this one, which it tells what went stale
        self.root_stem = root_stem  # the name of a root array (its store's)
        self.on_data_stale_sync = on_data_stale_sync  # files whose cached pages a refresh made stale
        self.metadata_ttl_s = metadata_ttl_s
        self.pin_s = min(PIN_MAX_S, PIN_SHARE * metadata_ttl_s) if metadata_ttl_s != math.inf else 0.0
        self._trusted_s = metadata_ttl_s - self.pin_s  # the TTL as it is counted: started pin_s early
        # A versioned store (an Icechunk repository) changes only by moving to another snapshot.
        self.repository = repository
        self.versioned = repository is not None
        self.epoch = 0  # bumped by each revalidation: entries checked in an older one are checked again
        self._fresh_since = time.monotonic()
        self._under_way: Event | None = None  # the revalidation under way: an event set when it ends
        # Nodes read from the store in this epoch, by path (listings, or one array's document)
        self._now_nodes: dict[str, Node | None] = {}
        self._replaced_said = LogOnce()  # paths whose replacement was logged in this epoch
        self._changed_ns: dict[str, int] = {}  # array path -> when its chunks were last found changed

    def keep_pages(self, entry: Entry) -> bool:
        """Whether an open of ENTRY's file on a read-only mount may use the pages the kernel kept of
        it. Without a TTL (metadata_ttl=inf), what changes them is a refresh, which drops them
        (`revalidate`). A versioned store changes only by moving to another snapshot, which drops
        every file's pages too, whatever the TTL; an open while it moves (the store shows the new
        snapshot, the old pages are not dropped yet) starts without them, so that no reader mixes
        pages of one snapshot with reads of another."""
        if self.repository is None:
            return self.metadata_ttl_s == math.inf
        shown = self.repository.snapshot_id
        kept, entry.pages_of = entry.pages_of == shown, shown
        return kept

    def saw_nodes(self, nodes: Sequence[Node | None], paths: list[str] | None = None) -> None:
        """Nodes read from the store in this epoch (a listing, or one node at each of `paths`): the
        entries of their paths follow them, and the engine their arrays' chunk layouts."""
        for i, node in enumerate(nodes):
            if paths is not None:
                path = paths[i]
            else:
                assert node is not None  # (a listing's nodes)
                path = node.path
            self._now_nodes[path] = node
            if isinstance(node, ArrayMeta):
                self.engine.see_layout(node)

    def forget_nodes(self) -> None:
        """This mount changed the store: nodes read before are not what it holds now."""
        self._now_nodes.clear()

    async def node_now(self, path: str) -> Node | None:
        """The node at `path` as the store holds it in this epoch (read once per epoch)."""
        if path in self._now_nodes:
            return self._now_nodes[path]
        epoch = self.epoch

        async def load() -> Node | None:
            node = await self.engine.run_io(self.hierarchy.node_sync, path, key=("node", path))
            if epoch == self.epoch:
                self.saw_nodes([node], [path])
            return node

        return await self.engine.once(("node", path, epoch), load)

    async def follow(self, entry: Entry) -> None:
        """Make an entry showing an array (or a group's netCDF file) show what the store holds now,
        once per epoch; a failure to read its metadata fails the request (EIO, logged)."""
        epoch = self.epoch
        if entry.checked == epoch:
            return
        node = entry.node
        if (
            not (isinstance(node, ArrayMeta) or (entry.kind in GROUP_FILES and isinstance(node, GroupMeta)))
            or entry.writing is not None
            or entry.plain is not None
            or entry.error is not None
        ):
            entry.checked = epoch  # groups: their listings are read again; the rest has no node to follow
            return
        try:
            fresh = await self.node_now(node.path)
        except ZarrfsError as e:
            log.warning("%s: metadata not read again: %s", node.metadata_key or node.path or "/", e)
            raise
        if entry.node is not node or entry.checked == epoch or self.epoch != epoch or entry.writing is not None:
            return  # changed while it was read: checked again at its next use
        entry.checked = epoch
        if entry.kind is Kind.NETCDF:
            if isinstance(fresh, GroupMeta):
                await self._follow_netcdf(entry, fresh)
        elif entry.kind is Kind.OMETIFF:
            await self._follow_ome_tiff(entry, fresh)
        elif fresh is not node and isinstance(node, ArrayMeta):  # (any other entry shows an array)
            self._take(entry, node, fresh)

    def _take(self, entry: Entry, old: ArrayMeta, fresh: Node | None) -> None:
        """An entry of array `old` meets `fresh`, what the store holds at its path now: shown in
        place when its files' bytes keep their layout, else every entry of the old array retires."""
        if not old.path and fresh is not None:  # a root array: the root's listing shows it
            self.tree.show_root(fresh)
            self.tree.invalidate()
        if isinstance(fresh, ArrayMeta) and fresh.file_layout == old.file_layout:
            entry.show(fresh)  # (attributes changed)
            entry.checked = self.epoch
        else:
            self._retire(old.path, fresh)

    def _retire(self, path: str, fresh: Node | None) -> None:
        """Entries of the array at `path` that show another layout than `fresh` (or of an array that
        is gone) lose their names and read ESTALE: the kernel then looks the names up again and gets
        new inodes (fresh pages); files opened before keep the old inode, its pages, and ESTALE."""
        layout = fresh.file_layout if isinstance(fresh, ArrayMeta) else None
        gone = [
            e
            for e in self.inodes.all()
            if isinstance(e.node, ArrayMeta)
            and e.node.path == path
            and e.writing is None
            and e.plain is None
            and e.error is None
            and e.node.file_layout != layout
        ]
        self.retire_entries(gone, f"{path or '/'} was replaced in the store ({_what_now(fresh)})")
        self.tree.listings.forget_sizes(path)
        if gone and self._replaced_said.first(path):
            log.info(
                "%s: replaced in the store (%s); files of it opened before read ESTALE", path or "/", _what_now(fresh)
            )

    def retire_entries(self, gone: list[Entry], why: str) -> None:
        """These entries lose their names and answer ESTALE (`why`) from now on."""
        inodes = {e.inode for e in gone}
        for e in gone:
            e.error = Stale(why)
        self.inodes.drop_names_of(inodes)
        self.inodes.drop_unused(gone)

    async def repoint(self, old_path: str, new_path: str, skip: int = 0) -> None:
        """Entries of nodes at or below `old_path` now show the nodes at `new_path` (after a move,
        a replacement, or a move to another snapshot); those with nothing left to show give ENOENT."""
        fresh_nodes: dict[str, Node | None] = {}  # one metadata read per node, however many views
        for other in self.inodes.all():
            was = other.node
            if (
                other.inode == skip
                or was is None
                or isinstance(was, BrokenNode)
                or not (was.path == old_path or (old_path and was.path.startswith(old_path + "/")))
            ):
                continue
            target = new_path + was.path[len(old_path) :]
            if target not in fresh_nodes:
                fresh_nodes[target] = await self.engine.run_io(self.hierarchy.node_sync, target)
            fresh = fresh_nodes[target]
            if fresh is None or fresh.kind != was.kind:
                other.error = NotFound(f"{was.path} is gone")
                continue
            if (
                other.kind is Kind.CHUNK
                and isinstance(fresh, ArrayMeta)
                and (
                    len(other.position) != len(fresh.shape)
                    or any(i >= n for i, n in zip(other.position, grid.grid_shape(fresh.shape, fresh.chunk_shape)))
                )
            ):
                other.error = NotFound(f"chunk {other.origin} of {fresh.path} no longer exists")
                continue
            other.show(fresh)
            other.checked = self.epoch  # read from the store just now
        self.tree.listings.forget_sizes(old_path)
        self.tree.listings.forget_sizes(new_path)

    async def _follow_netcdf(self, entry: Entry, group: GroupMeta) -> None:
        """A group's netCDF file laid out again from its arrays now; it retires if its bytes moved
        (its header changed)."""
        old = entry.laid_out
        entry.node = group
        if old is None:  # not laid out yet: done when first needed
            return
        nc = netcdf.group_file(group.attributes, await self.tree.listings.nodes_below(group.path))
        if entry.laid_out is not old or entry.error is not None:
            return  # laid out again, or retired, meanwhile
        if nc.header != old.header or nc.size != old.size:
            self.retire_entries([entry], f"netcdf/{group.path or self.root_stem}: its arrays changed in the store")
        else:
            entry.lay_out(nc)  # the same bytes, read through the arrays' new metadata

    async def _follow_ome_tiff(self, entry: Entry, fresh: Node | None) -> None:
        """An image's OME-TIFF laid out again from its levels now; it retires if its bytes moved
        (another pyramid, shape, type or tiling) or it can no longer be shown."""
        old = entry.laid_out
        new = await self.tree.contents.ome_tiff(fresh) if isinstance(fresh, GroupMeta) else None
        if entry.laid_out is not old or entry.error is not None:
            return  # laid out again, or retired, meanwhile
        name = f"ome-tiff/{entry.shown.path or self.root_stem}.ome.tif"
        if new is None or old is None or not new.same_layout(old):
            self.retire_entries([entry], f"{name}: its image changed in the store")
        else:
            entry.node = fresh
            entry.lay_out(new)  # the same bytes, read through the levels' new metadata

    def array_changed(self, path: str) -> None:
        """Chunks of the array at `path` changed in the store: its files show a new modification
        time, so the kernel drops their pages at its next GETATTR, before a buffered read copies
        any. Pages no read asks about (mmap) are dropped in the background once the pinned versions
        are let go, not at once: the kernel ignores the attributes of a GETATTR answered while it
        drops them, and a read would then copy the pages it keeps until they are gone."""
        self._changed_ns[path] = time.time_ns()
        self.tree.statistics.forget(path)
        later = functools.partial(self._forget_pages_later, path)
        if not self.engine.delayed.call(("pages", path), max(self.engine.pins_left_s(), self.pin_s), later):
            self._forget_pages(path)

    async def _forget_pages_later(self, path: str) -> None:
        self._forget_pages(path)

    def _forget_pages(self, path: str) -> None:
        self.tree.forget_pages(
            [
                e.inode
                for e in self.inodes.all()
                if not e.is_dir and e.node is not None and getattr(e.node, "path", None) == path
            ]
        )

    @staticmethod
    def _array_file(entry: Entry) -> ArrayMeta | None:
        """The array whose chunks an entry's file shows as they are read (None: another file)."""
        node = entry.node
        if (
            not isinstance(node, ArrayMeta)
            or entry.kind not in ARRAY_FILE_KINDS
            or entry.writing is not None
            or entry.error is not None
        ):
            return None
        return node

    def changed_ns(self, entry: Entry) -> int:
        """When this mount last found the chunks of the array an entry's file shows changed (0: never):
        the file's modification time is at least this."""
        node = self._array_file(entry)
        return self._changed_ns.get(node.path, 0) if node is not None else 0

    async def check_file(self, entry: Entry) -> None:
        """Before the attributes of a file go to the kernel in answer to its GETATTR: the TTL, and
        the chunks of the array it shows checked (its metadata is followed at the read). With
        auto_inval_data (libfuse's default) the kernel sends GETATTR at the start of a buffered
        read whose attributes expired, and drops the file's pages itself, before it copies any,
        when the time changed."""
        if self.due():
            await self.revalidate()
        node = self._array_file(entry)
        if node is not None and entry.opens and self.metadata_ttl_s != math.inf:  # (an open drops pages)
            await self.engine.check_chunks(node)

    def tell(self, entry: Entry) -> float:
        """An entry's attributes go to the kernel now: how long it may keep them, and with them a
        file's pages (it asks again at the first read after): until the TTL runs out, so that a read
        begun after it finds the pages of changed chunks dropped; none for a file whose array has
        chunks read before the TTL's last start that are not checked yet (the kernel's GETATTR
        checks them; a file not open needs no check, its next open drops its pages, but pages read
        from pinned versions after that open must go when the pins do). Once it has a checked
        file's time, reads of the file get no pinned version."""
        if self.metadata_ttl_s == math.inf:
            return math.inf
        left = max(0.0, self._fresh_since + self._trusted_s - time.monotonic())
        node = self._array_file(entry)
        if node is not None and not self.engine.chunks_checked(node.path):
            if entry.opens:
                return 0.0
            pinned_s = self.engine.pins_left_s()
            return min(left, pinned_s) if pinned_s > 0 else left
        entry.told = self.epoch
        return left

    def pinned(self, entry: Entry, continues: bool) -> bool:
        """Whether a read of an entry's file takes the versions of chunks the TTL's last start
        dropped (engine/pins.py): while they are pinned, if it `continues` a read begun before that
        start (an O_DIRECT reader's next request), or the kernel has not had the file's checked
        time since (it may hold pages of the old versions, and copy them in the read that sent
        this request; it drops them at its next GETATTR, the time having changed)."""
        return (continues or entry.told < self.epoch) and self.engine.pins_live()

    async def _show_other_snapshot(self) -> None:
        """The store shows another snapshot: entries the kernel holds show their node in it (or
        give ENOENT when it has none), as after a replacement."""
        tops = {
            e.node.path.split("/", 1)[0]
            for e in self.inodes.all()
            if e.node is not None and not isinstance(e.node, BrokenNode) and not is_version_path(e.node.path)
        }
        for top in sorted(tops):
            await self.repoint(top, top)

    def due(self) -> bool:
        """Whether the TTL ran out (or a revalidation is under way): a read must `revalidate` first."""
        return self._under_way is not None or time.monotonic() - self._fresh_since > self._trusted_s

    async def revalidate(self, force: bool = False) -> None:
        """Drop what is older than the TTL (everything when `force`), before a listing, lookup or
        read uses it. A caller that finds one under way waits for its end: until then, what it
        drops may still be in use."""
        while self._under_way is not None:
            await self._under_way.wait()
            if not force:
                return
        now = time.monotonic()
        store = self.repository
        pending = store is not None and store.tip_pending is not None and self.tree.open_files == 0
        if not force and not pending and now - self._fresh_since <= self._trusted_s:
            return
        # What this start drops was checked under the last one: pinned until that one's TTL runs out.
        pins_until, self._fresh_since = self._fresh_since + self.metadata_ttl_s, now
        under_way = self._under_way = self.engine.new_event()
        try:
            force = await self._drop_stale(force, pins_until)
        finally:
            self._under_way = None
            under_way.set()
        # Outside the turn: a read holding one of these pages locked may wait for it.
        if force and self.on_data_stale_sync is not None:  # the kernel may keep pages (metadata_ttl=inf)
            files = [e.inode for e in self.inodes.all() if not e.is_dir and e.kind is not Kind.STATS]
            if files:
                await self.engine.run_io(self.on_data_stale_sync, files)

    async def _drop_stale(self, force: bool, pins_until: float) -> bool:
        """`revalidate`'s work; whether everything was dropped (a refresh, or another snapshot)."""
        store = self.repository
        moved = False
        if store is not None:  # only a move to another snapshot makes anything stale
            moved = await self.engine.run_io(store.follow_tip_sync, self.tree.open_files == 0)
            # Shown here, with no await between the check and the move: a file opened while the
            # tip was looked up keeps the mount on the snapshot it reads.
            moved = moved and store.show_ready(self.tree.open_files == 0)
            await self.tree.versions.recheck()
            if not moved:
                return False
            force = True
        self.epoch += 1
        self._now_nodes.clear()
        self._replaced_said.forget()
        # Before any await: a read in this epoch never uses a chunk, band or disk-cache entry of
        # the last one unchecked (engine/revalidate.py).
        if force:
            self.engine.drop_clean_chunks()
        else:  # checked against the store when next read (engine/revalidate.py)
            self.engine.chunks_stale(pins_until)
        self.engine.store.refresh()  # a disk cache's entries are checked before their next use
        if moved:
            await self._show_other_snapshot()
        reread = getattr(self.hierarchy, "reread_consolidated_sync", None)
        if reread is not None:
            await self.engine.run_io(reread)
        self.tree.invalidate()
        self.tree.listings.forget_sizes()
        self.tree.statistics.forget()
        self.tree.georefs.forget()
        for entry in self.inodes.all():
            if entry.kind in (Kind.ARRAY, Kind.CHUNK) and entry.writing is None and entry.plain is None:
                entry.stored_bytes = None  # settled again from what the store holds now
        log.debug("listings, metadata and cached chunks dropped (%s)", "refresh" if force else "metadata_ttl")
        return force


def _what_now(node: Node | None) -> str:
    """What the store holds at a replaced array's path, for a log line."""
    if isinstance(node, ArrayMeta):
        return f"now shape {node.shape}, {node.dtype}, chunks {node.chunk_shape}"
    if isinstance(node, BrokenNode):
        return f"its metadata cannot be used: {node.error}"
    return "removed" if node is None else "a group now"
