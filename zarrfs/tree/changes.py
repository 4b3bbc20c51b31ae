"""Changes to the tree in a writable mount: create, mkdir, rmdir, unlink, rename, times, attributes.

Part of the Namespace; every store change runs in a worker thread through the engine, and
the entries and names the kernel may still hold are kept in step with the store (moved
nodes keep their inodes, removed ones answer ENOENT).
"""

from __future__ import annotations

import contextlib
import json
import logging
from typing import TYPE_CHECKING, Any

from .. import grid
from ..errors import Exists, InvalidArgument, IsADir, NotADir, NotEmpty, NotFound, NotPermitted
from ..formats.datasets import attributes_kept
from ..model import ArrayMeta, BrokenNode, Node
from ..storage.keys import join
from ..views.kinds import Kind
from .entries import NPY_SUFFIX
from .ingest import Incoming
from .inodes import ROOT_INODE
from .plain import is_plain_name

if TYPE_CHECKING:
    from .entries import Entry
    from .namespace import Namespace

log = logging.getLogger(__name__)


def _stems(names: Any) -> list[str]:
    """Node names of a group's listing: NAME.npy is node NAME, a directory its own name."""
    return [n[: -len(NPY_SUFFIX)] if n.endswith(NPY_SUFFIX) else n for n in names]


class Changes:
    """The changes a writable mount makes to names and nodes."""

    def __init__(self, ns: Namespace) -> None:
        self.ns = ns
        self.engine = ns.engine
        self.hierarchy = ns.hierarchy
        self.inodes = ns.inodes
        # Modification times writers set (utimensat) on arrays, by hierarchy path: shown for the
        # mount's life (a local store also keeps them as its metadata document's time).
        self._times: dict[str, int] = {}

    def _group_dir(self, inode: int, plain: bool = False) -> Entry:
        """The directory `inode` if it takes new names (`plain`: plain files, which the root of a
        store whose root is an array takes when its format keeps them there)."""
        entry = self.inodes.get(inode)
        if entry.kind is not Kind.GROUP or entry.view != "":
            raise NotPermitted("only groups of the main tree take new files and directories")
        if entry.error is not None:
            raise entry.error
        if (
            entry.node is None
            and self.ns.root_node.kind == "array"
            and not (plain and self.hierarchy.plain_files_beside_root_array)
        ):
            raise NotPermitted("a store whose root is an array holds no other nodes")
        return entry

    async def repoint(self, old_path: str, new_path: str, skip: int = 0) -> None:
        """Entries of nodes at or below `old_path` now show the nodes at `new_path` (after a
        move or a replacement); those with nothing left to show give ENOENT."""
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
            other.checked = self.ns.freshness.epoch  # read from the store just now (freshness.py)
        self.ns.listings.forget_sizes(old_path)
        self.ns.listings.forget_sizes(new_path)

    def unname(self, path: str, keep: int = 0) -> None:
        """Entries of a removed or replaced node (and its views, chunk files, descendants)
        lose their names; open files on them get ENOENT from now on."""
        gone = {
            e.inode: e
            for e in self.inodes.all()
            if e.inode != keep
            and e.node is not None
            and (e.node.path == path or e.node.path.startswith(path + "/") or (not path and e.inode != ROOT_INODE))
        }
        self.inodes.drop_names_of(gone)
        for entry in gone.values():
            entry.error = NotFound(f"{path} was removed or replaced")
        self.ns.listings.forget_sizes(path)

    async def new_array_path(self, parent_inode: int, name: str, names: Any) -> str:
        """The hierarchy path of a new array NAME.npy in a group, its name checked against the format."""
        parent = self._group_dir(parent_inode, plain=True)
        stem = name[: -len(NPY_SUFFIX)]
        if parent.node is None and self.ns.root_node.kind == "array":  # a file renamed onto the root array
            if name != self.ns.root_stem + NPY_SUFFIX:
                raise NotPermitted("a store whose root is an array holds no other nodes")
            return ""
        if stem in names:  # an array and a group cannot share a path
            raise Exists(name)
        self.hierarchy.check_name(stem, _stems(names))
        return join(parent.node.path if parent.node else "", stem)

    async def create(self, parent_inode: int, name: str) -> Entry:
        self._group_dir(parent_inode, plain=is_plain_name(name))
        names = await self.ns.listings.children(parent_inode)
        if name in names:
            raise Exists(name)
        if is_plain_name(name):
            key = self._plain_key(parent_inode, name)
            entry = self.inodes.new(Kind.PLAIN, "", None, key=name)
            entry.plain = self.ns.plain.new(key)
        else:
            path = await self.new_array_path(parent_inode, name, names)
            entry = self.inodes.new(Kind.ARRAY, "", None, key=path)
            entry.writing = Incoming(replacing=None)
        self.inodes.register(parent_inode, name, entry)
        return entry

    def _plain_key(self, parent_inode: int, name: str) -> str:
        """The store key a plain file `name` is kept under; refused (logged) when the format
        keeps none or the name could be taken for one of the format's own keys."""
        problem = self.hierarchy.plain_name_problem(name)
        parent = self._group_dir(parent_inode, plain=True)
        key = join(self.hierarchy.plain_dir(parent.node.path if parent.node else ""), name)
        if problem is not None:
            error = (InvalidArgument if self.hierarchy.keeps_plain_files else NotPermitted)(f"{key}: {problem}")
            log.warning("%s; refused", error)
            raise error
        return key

    # --- groups and names ------------------------------------------------------------------

    async def mkdir(self, parent_inode: int, name: str) -> Entry:
        parent = self._group_dir(parent_inode)
        names = await self.ns.listings.children(parent_inode)
        if name in names or name + NPY_SUFFIX in names:  # an array and a group cannot share a path
            raise Exists(name)
        self.hierarchy.check_name(name, _stems(names))
        path = join(parent.node.path if parent.node else "", name)
        await self.engine.run_io(self.hierarchy.create_group_sync, path)
        self.ns.invalidate()
        return await self.ns.lookup(parent_inode, name)

    async def rmdir(self, parent_inode: int, name: str) -> None:
        self._group_dir(parent_inode)
        entry = await self.ns.lookup(parent_inode, name)
        if entry.kind is not Kind.GROUP or entry.node is None:
            raise NotADir(name)
        self.ns.listings.forget_below(entry.node.path)
        entry.listing = None
        if await self.ns.listings.nodes_below(entry.node.path) or await self.ns.listings.children(entry.inode):
            raise NotEmpty(name)  # arrays, groups or plain files
        await self.engine.run_io_long(self.hierarchy.erase_node_sync, entry.node)
        self._move_times(entry.node.path, None)
        self.unname(entry.node.path)
        self.ns.invalidate()

    async def unlink(self, parent_inode: int, name: str) -> None:
        self._group_dir(parent_inode, plain=True)
        entry = await self.ns.lookup(parent_inode, name)
        if entry.kind is not Kind.PLAIN:
            self._group_dir(parent_inode)
        if entry.kind is Kind.PLAIN:
            held = entry.plain
            if held is not None:
                async with held.lock:  # after a write-back under way, if any
                    if held.stored:
                        await self.engine.run_io(self.hierarchy.store.erase_sync, held.key)
                    held.close()
            self.inodes.unregister(entry)
            self.ns.plain.forget(entry, NotFound(f"{name} was removed"))
            self.inodes.drop_name((parent_inode, name))
            self.ns.invalidate()
            return
        if entry.kind is not Kind.ARRAY:
            raise IsADir(name)
        w = entry.writing
        if w is not None and (w.staged is not None or w.pending is not None):
            await self.ns.ingest.abandon(entry)
        node = entry.node
        if node is not None:
            await self.engine.run_io_long(self.hierarchy.erase_node_sync, node)
            self.engine.discard(node.path)
            self.unname(node.path)
        self.inodes.drop_pending(parent_inode, name)
        self.inodes.drop_name((parent_inode, name))
        self.ns.invalidate()

    async def rename(
        self, old_parent: int, old_name: str, new_parent: int, new_name: str, replace: bool = True, message: str = ""
    ) -> None:
        """Move a node; with replace false an existing target is refused (EEXIST), as RENAME_NOREPLACE
        asks. MESSAGE: what a versioned store's commit of the move says."""
        self._group_dir(old_parent, plain=True)
        target_dir = self._group_dir(new_parent, plain=True)
        entry = await self.ns.lookup(old_parent, old_name)
        if entry.kind is not Kind.PLAIN:
            self._group_dir(old_parent)
            target_dir = self._group_dir(new_parent)
        if not replace:
            other = await self.ns.child(new_parent, new_name)
            if other is not None and other.inode != entry.inode:
                raise Exists(new_name)
        if entry.kind is Kind.PLAIN:
            await self._rename_held(entry, new_parent, new_name)
            return
        node, w = entry.node, entry.writing
        if (
            node is None
            or entry.kind not in (Kind.GROUP, Kind.ARRAY)
            or (w is not None and (w.pending is not None or w.staged is not None))
        ):
            raise NotPermitted(f"{old_name} cannot be moved now")
        if (entry.kind is Kind.ARRAY) != new_name.endswith(NPY_SUFFIX) or new_name == NPY_SUFFIX:
            raise NotPermitted(f"{new_name}: arrays are NAME.npy files, groups are directories")
        stem = new_name[: -len(NPY_SUFFIX)] if entry.kind is Kind.ARRAY else new_name
        new_path = join(target_dir.node.path if target_dir.node else "", stem)
        if new_path == node.path or (node.path and new_path.startswith(node.path + "/")):
            raise InvalidArgument(f"cannot move {node.path} into itself")
        siblings = await self.ns.listings.children(new_parent)
        self.hierarchy.check_name(stem, _stems([n for n in siblings if n != old_name or new_parent != old_parent]))
        if new_name in siblings:
            other = await self.ns.child(new_parent, new_name)
            if other is None or other.kind is not Kind.ARRAY or entry.kind is not Kind.ARRAY:
                raise Exists(new_name)
            await self.unlink(new_parent, new_name)  # mv onto an array replaces it
        await self.engine.flush(node.path) if entry.kind is Kind.ARRAY else await self.engine.flush()
        async with contextlib.AsyncExitStack() as stack:
            for held in self.ns.plain.inside(node.path):  # no write-back of a plain file inside crosses the move
                await stack.enter_async_context(held.lock)
            await self.engine.run_io_long(self.hierarchy.move_node_sync, node, new_path, message)
            # Plain files moved with their group: those there now (one removed or moved away
            # while this waited is not, one created meanwhile is).
            old_dir, new_dir = self.hierarchy.plain_dir(node.path), self.hierarchy.plain_dir(new_path)
            for held in self.ns.plain.inside(node.path):
                if held.key is not None:
                    held.key = new_dir + held.key[len(old_dir) :]
        self.engine.discard(node.path)
        self._move_times(node.path, new_path)
        # The kernel keeps the moved inodes under their new names: point them (and every
        # view of the moved nodes) at the new place.
        await self.repoint(node.path, new_path)
        self.inodes.drop_name((old_parent, old_name))
        self.inodes.name(new_parent, new_name, entry)
        self.ns.invalidate()

    async def _rename_held(self, entry: Entry, new_parent: int, new_name: str) -> None:
        """A held file renamed: to NAME.npy it becomes that array; to another held name it moves."""
        if not is_plain_name(new_name):
            await self.ns.ingest.adopt(entry, new_parent, new_name)
            return
        key = self._plain_key(new_parent, new_name)
        other = await self.ns.child(new_parent, new_name)
        if other is not None and other.inode != entry.inode:
            if other.kind is not Kind.PLAIN:
                raise Exists(new_name)
        held = entry.plain
        replaced = other.plain if other is not None and other.inode != entry.inode else None
        # After write-backs under way (of either file), and none of them in between.
        async with held.lock, replaced.lock if replaced is not None else contextlib.nullcontext():
            if held.stored and key != held.key:
                await self.engine.run_io_long(self.hierarchy.store.move_sync, held.key, key)  # replaces `other`'s
            elif replaced is not None and replaced.stored:
                await self.engine.run_io(self.hierarchy.store.erase_sync, replaced.key)
            if replaced is not None:
                replaced.close()
            held.key = key
        if other is not None and other.inode != entry.inode:
            self.inodes.unregister(other, forget=False)
            self.ns.plain.forget(other, NotFound(f"{new_name} was replaced"))
        old_key = entry.name_key
        self.inodes.unregister(entry, forget=False)
        self.inodes.drop_name(old_key, entry)
        entry.key = new_name
        if held.stored:  # listed from the store from now on
            self.inodes.name(new_parent, new_name, entry)
        else:
            self.inodes.register(new_parent, new_name, entry)
        self.ns.invalidate()

    async def set_times(self, entry: Entry, mtime_ns: int) -> None:
        """utimensat: an array's, a group's or a plain file's modification time, kept where the
        store can (a local store: the time of the metadata document or key) and for the mount's life."""
        if entry.kind is Kind.PLAIN:
            if entry.plain is None:
                raise entry.error or NotFound("removed")
            held = entry.plain
            async with held.lock:  # after a store under way, which took the time it had before
                held.mtime_ns = mtime_ns
                if held.stored and not held.dirty and not held.gone:
                    await self.engine.run_io(self.hierarchy.store.set_mtime_sync, held.key, mtime_ns)
            return
        if entry.kind is Kind.GROUP and entry.view == "":
            group = entry.node
            if group is None or isinstance(group, BrokenNode):
                return
            self._times[group.path] = mtime_ns  # rsync -a sets a directory's time after its files
            if group.metadata_key:  # an implicit group has no document to carry it
                await self.engine.run_io(self.hierarchy.store.set_mtime_sync, group.metadata_key, mtime_ns)
            return
        if entry.kind is not Kind.ARRAY or entry.view != "":
            return  # views and chunk files show their array's time
        w = entry.writing
        if w is not None and (w.pending is not None or w.staged is not None):
            w.mtime_ns = mtime_ns  # given to the array when it is committed
            return
        node = entry.node
        if not isinstance(node, ArrayMeta):
            return
        self._times[node.path] = mtime_ns
        if node.metadata_key:
            await self.engine.run_io(self.hierarchy.store.set_mtime_sync, node.metadata_key, mtime_ns)

    def forget_time(self, path: str) -> None:
        """A new array at `path`: the time a writer set on the one before is gone."""
        self._times.pop(path, None)

    def _move_times(self, old: str, new: str | None) -> None:
        """The times set on the node at OLD and below it go with it to NEW (None: removed)."""
        for path in [p for p in self._times if p == old or p.startswith(old + "/")]:
            mtime_ns = self._times.pop(path)
            if new is not None:
                self._times[join(new, path[len(old) :].lstrip("/"))] = mtime_ns

    def time_of(self, entry: Entry) -> int | None:
        """The modification time a writer set on `entry` (None: the store's)."""
        if entry.plain is not None:
            return entry.plain.mtime_ns
        if entry.kind in (Kind.ARRAY, Kind.GROUP) and entry.view == "" and entry.node is not None:
            return self._times.get(entry.node.path)
        return None

    def touched(self, entry: Entry) -> None:
        """A write: the time a writer set before is replaced by now."""
        if entry.plain is not None:
            entry.plain.mtime_ns = None
            return
        if entry.writing is not None:  # a new array's time, given to it at the commit
            entry.writing.mtime_ns = None
        if entry.node is not None:
            self._times.pop(entry.node.path, None)

    async def set_attributes(self, entry: Entry, value: bytes) -> None:
        try:
            attrs = json.loads(value)
        except (ValueError, UnicodeDecodeError) as e:
            raise InvalidArgument(f"user.zarr.attributes must be a JSON object: {e}") from None
        if not isinstance(attrs, dict):
            raise InvalidArgument("user.zarr.attributes must be a JSON object")
        node = entry.node
        if node is None or entry.kind not in (Kind.GROUP, Kind.ARRAY, Kind.CHUNKDIR) or isinstance(node, BrokenNode):
            raise NotPermitted("only groups and arrays have attributes")
        entry.node = await self.engine.run_io(self.hierarchy.set_attributes_sync, node, attributes_kept(node, attrs))
        entry.checked = self.ns.freshness.epoch
        self.ns.invalidate()
