"""What directories list: a group's child nodes, each directory's names, store prefixes, plain files, stored sizes.

Listings are loaded once for concurrent readers and kept until a change or a revalidation
drops them (`invalidate`); a name that cannot be a file name is logged once and left out.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from ..errors import NotFound, ZarrfsError
from ..model import ArrayMeta, BrokenNode, GroupMeta, Node
from ..storage.keys import RESERVED_PREFIX
from ..views import ngff, registry
from ..views.registry import STATS_FILE, VIEW_DIRS
from .entries import Entry, Kind, Maker, name_problem
from .freshness import REFRESH_FILE
from .versions import VERSIONS_DIR

if TYPE_CHECKING:
    from ..engine import Engine
    from ..formats.base import Hierarchy
    from ..views.ngff import ArrayHints
    from ..views.ometiff import OmeTiff
    from .freshness import Freshness
    from .inodes import Inodes
    from .plain import PlainFiles
    from .versions import Versions

log = logging.getLogger(__name__)


def _same(entry: Entry) -> Entry:
    return entry


def _node_key(node: Node) -> str:
    """The store key a log line names for a node: its metadata document, else its path."""
    key = node.key if isinstance(node, BrokenNode) else node.metadata_key
    return key or node.path or "/"


class Listings:
    """Directory listings and what they are made of, cached until invalidated."""

    def __init__(
        self,
        engine: Engine,
        hierarchy: Hierarchy,
        inodes: Inodes,
        *,
        freshness: Freshness,
        versions: Versions,
        plain: PlainFiles,
        ome_tiff: Callable[[GroupMeta], Awaitable[OmeTiff | None]],
        root_node: Callable[[], Node],
        root_stem: str,
        writes_allowed: bool,
    ) -> None:
        self.hierarchy = hierarchy
        self.engine = engine
        self.inodes = inodes
        self.freshness, self.versions, self.plain = freshness, versions, plain
        self.ome_tiff = ome_tiff  # the OME-TIFF layout of an image group (None: it cannot be one)
        self.root_node = root_node  # what the root shows now
        self.root_stem = root_stem  # the name of a root array (its store's)
        self.writes_allowed = writes_allowed
        # Shared by every view of a group: its child nodes; and per array, its stored keys' sizes.
        self._below: dict[str, list[Node]] = {}
        self._sizes: dict[str, dict[str, int | None] | None] = {}
        # Keys whose names cannot be file names (logged once, never listed)
        self._unlistable: set[str] = set()

    def invalidate(self) -> None:
        """Listings are read again after a change (inodes of names the kernel holds stay)."""
        self._below.clear()
        for entry in self.inodes.all():
            if entry.kind in (Kind.GROUP, Kind.VERSIONS) and entry.listing is not None:
                entry.listing = None

    def forget_below(self, path: str) -> None:
        """The child nodes of group `path` are read again when next needed."""
        self._below.pop(path, None)

    # --- stored sizes ------------------------------------------------------------------

    def has_sizes(self, path: str) -> bool:
        """Whether the sizes of the array at `path`'s stored keys were listed (and kept)."""
        return path in self._sizes

    def forget_sizes(self, path: str | None = None) -> None:
        """The stored sizes of the array at `path` (every array when None) are listed again."""
        if path is None:
            self._sizes.clear()
        else:
            self._sizes.pop(path, None)

    async def stored_sizes(self, meta: ArrayMeta) -> dict[str, int | None] | None:
        """Sizes of an array's stored chunk keys (None when the store cannot list them)."""
        if meta.path not in self._sizes:
            try:
                self._sizes[meta.path] = await self.engine.run_io(self.hierarchy.chunk_sizes_sync, meta)
            except ZarrfsError as e:
                log.info("stored size of %s unknown: %s", meta.path or "/", e)
                self._sizes[meta.path] = None
        return self._sizes[meta.path]

    # --- nodes and names ---------------------------------------------------------------

    async def nodes_below(self, path: str) -> list[Node]:
        freshness = self.freshness
        await freshness.revalidate()
        nodes = self._below.get(path)
        if nodes is None:
            epoch = freshness.epoch

            async def load() -> list[Node]:
                try:
                    found = await self.engine.run_io(self.hierarchy.children_sync, path, key=("children", path))
                except ZarrfsError as e:
                    log.warning("listing %s: %s", path or "/", e)
                    raise
                for node in found:
                    if isinstance(node, BrokenNode):
                        self.engine.note_failure(node.error, node.key)
                if epoch == freshness.epoch:  # (else read before a refresh: its callers' alone)
                    self._below[path] = found
                    freshness.saw_nodes(found)
                return found

            # Views of one group list it at once: one read, so no older listing lands after a newer one
            nodes = await self.engine.once(("below", path, epoch), load)
        return nodes

    async def children(self, inode: int) -> dict[str, Maker]:
        """Name -> maker of a directory's entries: the store's, and files not yet arrays."""
        names = dict(await self._listing(inode))  # the cached listing stays as the store has it
        for name, child in self.inodes.pending_in(inode).items():
            names.setdefault(name, functools.partial(_same, child))
        return names

    async def _listing(self, inode: int) -> dict[str, Maker]:
        """Name -> maker of a directory's entries (all but chunk directories, which are computed),
        loaded once for concurrent readers."""
        entry = self.inodes.get(inode)
        await self.freshness.revalidate()
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
        new = self.inodes.new
        if entry.kind is Kind.VIEWS:
            names: dict[str, Maker] = {}
            for view in VIEW_DIRS:
                if view == "store":
                    names[view] = lambda: new(Kind.STOREDIR, "store", key="")
                else:
                    names[view] = functools.partial(self._root_view, view)
            names[STATS_FILE] = lambda: new(Kind.STATS, "stats")
            names[REFRESH_FILE] = lambda: new(Kind.STATS, "refresh")
            if self.versions.present:
                names[VERSIONS_DIR] = lambda: new(Kind.VERSIONS, VERSIONS_DIR, key="")
            return names
        if entry.kind is Kind.VERSIONS:
            return await self.versions.listing(entry)
        if entry.kind is Kind.STOREDIR:
            return await self._store_listing(entry.known_key)
        if entry.kind is not Kind.GROUP:
            raise NotFound("not a directory")
        return await self._group_listing(entry)

    async def _store_listing(self, prefix: str) -> dict[str, Maker]:
        files, dirs = await self.engine.run_io(self.hierarchy.store.list_dir_sync, prefix, key=("list", prefix))
        names: dict[str, Maker] = {}
        new = self.inodes.new
        for d in dirs:
            key = f"{prefix}/{d}" if prefix else d
            if self.listable(d, key):
                names[d] = functools.partial(new, Kind.STOREDIR, "store", key=key)
        for f, size in files.items():
            key = f"{prefix}/{f}" if prefix else f
            if self.listable(f, key):
                names[f] = functools.partial(
                    new, Kind.STOREKEY, "store", key=key, size=size if size is not None else -1
                )
        return names

    async def _group_listing(self, entry: Entry) -> dict[str, Maker]:
        names: dict[str, Maker] = {}
        root = self.root_node()
        group = self._plain_group(entry)
        if group is not None and not (self.hierarchy.store.is_local or self.writes_allowed):
            group = None
        if entry.node is None and root.kind == "array":
            nodes: list[Node] = [root]  # a root array: the root holds NAME.npy (and plain files)
            plain = await self._plain_files(group)
        else:  # the group's nodes and its plain files are listed at once (one round trip, not two)
            nodes, plain = await self.engine.gather(
                lambda: self.nodes_below(entry.node.path if entry.node is not None else ""),
                lambda: self._plain_files(group),
            )
        if entry.view == "info" and isinstance(entry.node, GroupMeta) and entry.node.path == "":
            names[".json"] = lambda: self.inodes.new(Kind.INFO, "info", entry.node)
        group_file = registry.GROUP_FILE_VIEWS.get(entry.view)
        if group_file and isinstance(entry.node, GroupMeta) and entry.node.path == "":  # the root group: NAME.nc
            suffix, kind = group_file
            names[self.root_stem + suffix] = lambda: self.inodes.new(kind, entry.view, entry.node)
        for node in nodes:
            if node.path.rsplit("/", 1)[-1].startswith(RESERVED_PREFIX):
                continue  # a staging area of an array being written (or left by a killed daemon)
            for name, make in self._node_entry(entry.view, node, entry.node):
                if name not in names and self.listable(name, _node_key(node)):
                    names[name] = make
        if entry.view == registry.OME_TIFF_VIEW and isinstance(entry.node, GroupMeta):
            await self._ome_tiff_files(entry.node, nodes, names)
        if group is not None:
            prefix = self.hierarchy.plain_dir(group)
            for name, size in plain.items():
                key = f"{prefix}/{name}" if prefix else name
                if name in names or self.hierarchy.plain_name_problem(name) is not None or not self.listable(name, key):
                    continue
                names[name] = functools.partial(self._plain_entry, key, name, size)
        return names

    async def _ome_tiff_files(self, group: GroupMeta, nodes: list[Node], names: dict[str, Maker]) -> None:
        """IMAGE.ome.tif of each NGFF image among a group's children (and of the root group itself,
        named as a root array is), where its levels make one."""
        images = [n for n in nodes if isinstance(n, GroupMeta) and ngff.is_image(n.attributes)]
        if group.path == "" and ngff.is_image(group.attributes):
            images.insert(0, group)
        for image in images:
            base = image.path.rsplit("/", 1)[-1] if image.path else self.root_stem
            name = base + registry.OME_TIFF_SUFFIX
            if name in names or not self.listable(name, _node_key(image)):
                continue
            layout = await self.ome_tiff(image)
            if layout is not None:
                names[name] = functools.partial(self._ome_tiff_entry, image, layout)

    def _ome_tiff_entry(self, image: GroupMeta, layout: OmeTiff) -> Entry:
        entry = self.inodes.new(Kind.OMETIFF, registry.OME_TIFF_VIEW, image)
        entry.lay_out(layout)
        entry.size = entry.stored_bytes = layout.size
        return entry

    def _node_entry(self, view: str, node: Node, group: Node | None = None) -> list[tuple[str, Maker]]:
        """(name, maker) of a node's entries in a view directory (GROUP: the one listed)."""
        base = node.path.rsplit("/", 1)[-1] if node.path else self.root_stem
        error = node.error if isinstance(node, BrokenNode) else None
        hints = ngff.level_hints(group.attributes, base) if isinstance(group, GroupMeta) and view == "tiff" else None
        return [
            (name, functools.partial(self._new_entry, kind, view, node, error, hints))
            for name, kind in registry.view_names(view, node, base)
        ]

    def _new_entry(
        self, kind: Kind, view: str, node: Node, error: ZarrfsError | None, hints: ArrayHints | None
    ) -> Entry:
        entry = self.inodes.new(kind, view, node, error=error)
        entry.hints = hints  # (an NGFF image's level: axes and resolution of its TIFF)
        return entry

    def _plain_group(self, entry: Entry) -> str | None:
        """The group whose plain files directory `entry` lists (None: it lists none)."""
        if entry.view != "" or not self.hierarchy.keeps_plain_files:
            return None
        if isinstance(entry.node, GroupMeta):
            return entry.node.path
        if entry.node is None and self.root_node().kind == "array" and self.hierarchy.plain_files_beside_root_array:
            return ""
        return None

    async def _plain_files(self, path: str | None) -> dict[str, int | None]:
        """The keys in a group's directory (its plain files are those that are no format's own),
        with their sizes; none for PATH None. Remote read-only mounts leave them out: a listing
        per group (consolidated metadata needs none), and some servers (HTTP) cannot list."""
        if path is None:
            return {}
        prefix = self.hierarchy.plain_dir(path)
        try:
            files, _ = await self.engine.run_io(self.hierarchy.store.list_dir_sync, prefix, key=("list", prefix))
        except ZarrfsError as e:
            log.warning("plain files of %s not listed: %s", path or "/", e)
            return {}
        return files

    def _plain_entry(self, key: str, name: str, size: int | None) -> Entry:
        entry = self.inodes.new(Kind.PLAIN, "", None, key=name)
        entry.plain = self.plain.new(key, size or 0, stored=True)
        return entry

    def listable(self, name: str, key: str) -> bool:
        """Whether `name` can be listed; if not, say so once (naming the key) and leave it out."""
        problem = name_problem(name)
        if problem is not None and key not in self._unlistable:
            self._unlistable.add(key)
            log.warning("%s: not listed: %s", key, problem)
        return problem is None

    def _root_group(self) -> GroupMeta | None:
        root = self.root_node()
        return root if isinstance(root, GroupMeta) else None

    def _root_view(self, view: str) -> Entry:
        """The root group's directory in VIEW, as the root is when it is made."""
        return self.inodes.new(Kind.GROUP, view, self._root_group())
