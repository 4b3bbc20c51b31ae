"""Changes to the tree in a writable mount: create, mkdir, rmdir, unlink, rename, attributes.

Part of the Namespace; every store change runs in a worker thread through the engine, and
the entries and names the kernel may still hold are kept in step with the store (moved
nodes keep their inodes and follow the store through freshness, removed ones answer ENOENT).
A held file renamed to NAME.npy, or an unfinished array removed, is handed to the arriving
files (ingest.py), which are made before this part.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from ..errors import Exists, InvalidArgument, IsADir, NotADir, NotEmpty, NotFound, NotPermitted
from ..formats.datasets import attributes_kept
from ..model import BrokenNode
from ..storage.keys import join
from ..views.kinds import Kind
from .entries import NPY_SUFFIX
from .incoming import Incoming
from .inodes import ROOT_INODE
from .newnames import stems
from .plain import is_plain_name

if TYPE_CHECKING:
    from ..engine import Engine
    from ..formats.base import Hierarchy
    from .entries import Entry
    from .freshness import Freshness
    from .ingest import Ingest
    from .inodes import Inodes
    from .listings import Listings
    from .newnames import NewNames
    from .plain import PlainFiles
    from .times import Times

log = logging.getLogger(__name__)


class Changes:
    """The changes a writable mount makes to names and nodes."""

    def __init__(
        self,
        engine: Engine,
        hierarchy: Hierarchy,
        inodes: Inodes,
        *,
        freshness: Freshness,
        listings: Listings,
        plain: PlainFiles,
        ingest: Ingest,
        times: Times,
        names: NewNames,
        lookup: Callable[[int, str], Awaitable[Entry]],
        child: Callable[[int, str], Awaitable[Entry | None]],
        invalidate: Callable[[], None],
    ) -> None:
        self.engine = engine
        self.hierarchy = hierarchy
        self.inodes = inodes
        self.freshness, self.listings, self.plain, self.ingest = freshness, listings, plain, ingest
        self.times, self.names = times, names
        self.lookup = lookup  # the namespace's: `name` in `parent`, its attributes ready (NotFound)
        self.child = child  # the namespace's: the entry `name` in `parent`, None when there is none
        self.invalidate = invalidate  # the namespace's: listings and nodes are read again

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
        self.listings.forget_sizes(path)

    async def create(self, parent_inode: int, name: str) -> Entry:
        self.names.group_dir(parent_inode, plain=is_plain_name(name))
        names = await self.listings.children(parent_inode)
        if name in names:
            raise Exists(name)
        if is_plain_name(name):
            key = self.names.plain_key(parent_inode, name)
            entry = self.inodes.new(Kind.PLAIN, "", None, key=name)
            entry.plain = self.plain.new(key)
        else:
            path = self.names.array_path(parent_inode, name, names)
            entry = self.inodes.new(Kind.ARRAY, "", None, key=path)
            entry.writing = Incoming(replacing=None)
        self.inodes.register(parent_inode, name, entry)
        return entry

    # --- groups and names ------------------------------------------------------------------

    async def mkdir(self, parent_inode: int, name: str) -> Entry:
        parent = self.names.group_dir(parent_inode)
        names = await self.listings.children(parent_inode)
        if name in names or name + NPY_SUFFIX in names:  # an array and a group cannot share a path
            raise Exists(name)
        self.hierarchy.check_name(name, stems(names))
        path = join(parent.node.path if parent.node else "", name)
        await self.engine.run_io(self.hierarchy.create_group_sync, path)
        self.invalidate()
        return await self.lookup(parent_inode, name)

    async def rmdir(self, parent_inode: int, name: str) -> None:
        self.names.group_dir(parent_inode)
        entry = await self.lookup(parent_inode, name)
        if entry.kind is not Kind.GROUP or entry.node is None:
            raise NotADir(name)
        self.listings.forget_below(entry.node.path)
        entry.listing = None
        if await self.listings.nodes_below(entry.node.path) or await self.listings.children(entry.inode):
            raise NotEmpty(name)  # arrays, groups or plain files
        await self.engine.run_io_long(self.hierarchy.erase_node_sync, entry.node)
        self.times.move(entry.node.path, None)
        self.unname(entry.node.path)
        self.invalidate()

    async def unlink(self, parent_inode: int, name: str) -> None:
        self.names.group_dir(parent_inode, plain=True)
        entry = await self.lookup(parent_inode, name)
        if entry.kind is not Kind.PLAIN:
            self.names.group_dir(parent_inode)
        if entry.kind is Kind.PLAIN:
            held = entry.plain
            if held is not None:
                async with held.lock:  # after a write-back under way, if any
                    if held.stored:
                        await self.engine.run_io(self.hierarchy.store.erase_sync, held.kept_key)
                    held.close()
            self.inodes.unregister(entry)
            self.plain.forget(entry, NotFound(f"{name} was removed"))
            self.inodes.drop_name((parent_inode, name))
            self.invalidate()
            return
        if entry.kind is not Kind.ARRAY:
            raise IsADir(name)
        w = entry.writing
        if w is not None and (w.staged is not None or w.pending is not None):
            await self.ingest.abandon(entry)
        node = entry.node
        if node is not None:
            await self.engine.run_io_long(self.hierarchy.erase_node_sync, node)
            self.engine.discard(node.path)
            self.unname(node.path)
        self.inodes.drop_pending(parent_inode, name)
        self.inodes.drop_name((parent_inode, name))
        self.invalidate()

    async def rename(
        self, old_parent: int, old_name: str, new_parent: int, new_name: str, replace: bool = True, message: str = ""
    ) -> None:
        """Move a node; with replace false an existing target is refused (EEXIST), as RENAME_NOREPLACE
        asks. MESSAGE: what a versioned store's commit of the move says."""
        self.names.group_dir(old_parent, plain=True)
        target_dir = self.names.group_dir(new_parent, plain=True)
        entry = await self.lookup(old_parent, old_name)
        if entry.kind is not Kind.PLAIN:
            self.names.group_dir(old_parent)
            target_dir = self.names.group_dir(new_parent)
        if not replace:
            other = await self.child(new_parent, new_name)
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
        siblings = await self.listings.children(new_parent)
        self.hierarchy.check_name(stem, stems([n for n in siblings if n != old_name or new_parent != old_parent]))
        if new_name in siblings:
            other = await self.child(new_parent, new_name)
            if other is None or other.kind is not Kind.ARRAY or entry.kind is not Kind.ARRAY:
                raise Exists(new_name)
            await self.unlink(new_parent, new_name)  # mv onto an array replaces it
        await self.engine.flush(node.path) if entry.kind is Kind.ARRAY else await self.engine.flush()
        async with contextlib.AsyncExitStack() as stack:
            for held in self.plain.inside(node.path):  # no write-back of a plain file inside crosses the move
                await stack.enter_async_context(held.lock)
            await self.engine.run_io_long(self.hierarchy.move_node_sync, node, new_path, message)
            # Plain files moved with their group: those there now (one removed or moved away
            # while this waited is not, one created meanwhile is).
            old_dir, new_dir = self.hierarchy.plain_dir(node.path), self.hierarchy.plain_dir(new_path)
            for held in self.plain.inside(node.path):
                if held.key is not None:
                    held.key = new_dir + held.key[len(old_dir) :]
        self.engine.discard(node.path)
        self.times.move(node.path, new_path)
        # The kernel keeps the moved inodes under their new names: point them (and every
        # view of the moved nodes) at the new place.
        await self.freshness.repoint(node.path, new_path)
        self.inodes.drop_name((old_parent, old_name))
        self.inodes.name(new_parent, new_name, entry)
        self.invalidate()

    async def _rename_held(self, entry: Entry, new_parent: int, new_name: str) -> None:
        """A held file renamed: to NAME.npy it becomes that array; to another held name it moves."""
        if not is_plain_name(new_name):
            await self.ingest.adopt(entry, new_parent, new_name)
            return
        key = self.names.plain_key(new_parent, new_name)
        other = await self.child(new_parent, new_name)
        if other is not None and other.inode != entry.inode:
            if other.kind is not Kind.PLAIN:
                raise Exists(new_name)
        held = entry.held
        replaced = other.plain if other is not None and other.inode != entry.inode else None
        # After write-backs under way (of either file), and none of them in between.
        async with held.lock, replaced.lock if replaced is not None else contextlib.nullcontext():
            if held.stored and key != held.key:
                await self.engine.run_io_long(self.hierarchy.store.move_sync, held.kept_key, key)  # replaces `other`'s
            elif replaced is not None and replaced.stored:
                await self.engine.run_io(self.hierarchy.store.erase_sync, replaced.kept_key)
            if replaced is not None:
                replaced.close()
            held.key = key
        if other is not None and other.inode != entry.inode:
            self.inodes.unregister(other, forget=False)
            self.plain.forget(other, NotFound(f"{new_name} was replaced"))
        old_key = entry.name_key
        self.inodes.unregister(entry, forget=False)
        self.inodes.drop_name(old_key, entry)
        entry.key = new_name
        if held.stored:  # listed from the store from now on
            self.inodes.name(new_parent, new_name, entry)
        else:
            self.inodes.register(new_parent, new_name, entry)
        self.invalidate()

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
        entry.checked = self.freshness.epoch
        self.invalidate()
