"""Modification times writers set (utimensat) in a writable mount: kept where the store can, shown for the mount's life.

Part of the Namespace: the one owner of the times set on arrays and groups, which changes
(a node moved or removed) and arriving files (a new array, a writer's `cp -p` time given at
its commit) update through it. A plain file keeps its own time (PlainFile.mtime_ns).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import NotFound
from ..model import ArrayMeta, BrokenNode
from ..storage.keys import join
from ..views.kinds import Kind

if TYPE_CHECKING:
    from ..engine import Engine
    from ..storage.base import BaseStore
    from .entries import Entry


class Times:
    """The modification times writers set on arrays and groups, by hierarchy path."""

    def __init__(self, engine: Engine, store: BaseStore) -> None:
        self.engine = engine
        self.store = store
        # Shown for the mount's life (a local store also keeps them as its metadata document's time).
        self._times: dict[str, int] = {}

    async def set(self, entry: Entry, mtime_ns: int) -> None:
        """utimensat: an array's, a group's or a plain file's modification time, kept where the
        store can (a local store: the time of the metadata document or key) and for the mount's life."""
        if entry.kind is Kind.PLAIN:
            if entry.plain is None:
                raise entry.error or NotFound("removed")
            held = entry.plain
            async with held.lock:  # after a store under way, which took the time it had before
                held.mtime_ns = mtime_ns
                if held.stored and not held.dirty and not held.gone:
                    await self.engine.run_io(self.store.set_mtime_sync, held.kept_key, mtime_ns)
            return
        if entry.kind is Kind.GROUP and entry.view == "":
            group = entry.node
            if group is None or isinstance(group, BrokenNode):
                return
            self._times[group.path] = mtime_ns  # rsync -a sets a directory's time after its files
            if group.metadata_key:  # an implicit group has no document to carry it
                await self.engine.run_io(self.store.set_mtime_sync, group.metadata_key, mtime_ns)
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
            await self.engine.run_io(self.store.set_mtime_sync, node.metadata_key, mtime_ns)

    def forget(self, path: str) -> None:
        """A new array at `path`: the time a writer set on the one before is gone."""
        self._times.pop(path, None)

    def move(self, old: str, new: str | None) -> None:
        """The times set on the node at OLD and below it go with it to NEW (None: removed)."""
        for path in [p for p in self._times if p == old or p.startswith(old + "/")]:
            mtime_ns = self._times.pop(path)
            if new is not None:
                self._times[join(new, path[len(old) :].lstrip("/"))] = mtime_ns

    def of(self, entry: Entry) -> int | None:
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
