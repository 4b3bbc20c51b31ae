"""Modification times: those writers set (utimensat), kept where the store can, and those the store shows.

Part of the Namespace: the one owner of the times set on arrays and groups, which changes
(a node moved or removed) and arriving files (a new array, a writer's `cp -p` time given at
its commit) update through it, and of the times read from the store's keys. A plain file keeps
its own time (PlainFile.mtime_ns).
"""

from __future__ import annotations

import functools
import logging
import time
from typing import TYPE_CHECKING

from ..errors import NotFound, ZarrfsError
from ..model import ArrayMeta, BrokenNode
from ..storage.keys import join
from ..views.kinds import Kind

if TYPE_CHECKING:
    from ..engine import Engine
    from ..formats.base import Hierarchy
    from .entries import Entry

log = logging.getLogger(__name__)


class Times:
    """The modification times writers set on arrays and groups, by hierarchy path."""

    def __init__(self, engine: Engine, hierarchy: Hierarchy) -> None:
        self.engine = engine
        self.hierarchy = hierarchy
        self.store = hierarchy.store
        self.mount_time_ns = time.time_ns()
        # Shown for the mount's life (a local store also keeps them as its metadata document's time).
        self._times: dict[str, int] = {}
        # Modification times by store key (the store's own, so stable across remounts).
        self._stored: dict[str, int] = {}

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
        key = self._key(entry)
        if key is not None:
            self._stored[key] = time.time_ns()
        if entry.plain is not None:
            entry.plain.mtime_ns = None
            return
        if entry.writing is not None:  # a new array's time, given to it at the commit
            entry.writing.mtime_ns = None
        if entry.node is not None:
            self._times.pop(entry.node.path, None)

    def set_in_store(self, entry: Entry) -> None:
        """After `set`: the key's time is asked of the store again (it may have taken the time)."""
        key = self._key(entry)
        if key is not None:
            self._stored.pop(key, None)

    # --- the times the store shows -----------------------------------------------------

    def _key(self, entry: Entry) -> str | None:
        """The store key whose modification time an entry shows (None: the mount time). Remote
        stores with consolidated metadata: that document's, for every node (one request, not one per
        node); without it, the mount time: a document's time would cost a request per node (the GET
        that reads it does not return it through fsspec), doubling what `ls -l` of a group costs."""
        if entry.kind is Kind.STOREKEY:
            return entry.key
        if entry.plain is not None and entry.plain.stored and self.store.is_local:
            return entry.plain.key  # a kept plain file: its key's time
        node = entry.node
        if node is None:
            return None
        if not self.store.is_local:
            consolidated = getattr(self.hierarchy, "consolidated", None) is not None
            return getattr(self.hierarchy, "consolidated_key", None) if consolidated else None
        return getattr(node, "metadata_key", None) or getattr(node, "key", None)

    def shown_ns(self, entry: Entry) -> int:
        """The modification time `entry` shows: a writer's, else its key's in the store, else the
        mount's (a remote key's time is known only after `resolve`)."""
        chosen = self.of(entry)
        if chosen is not None:
            return chosen
        key = self._key(entry)
        if key is None:
            return self.mount_time_ns
        known = self._stored.get(key)
        if known is None and self.store.is_local:  # one stat, no network: asked here
            known = self._stored[key] = self.store.mtime_ns_sync(key) or self.mount_time_ns
        return known if known is not None else self.mount_time_ns

    async def resolve(self, entries: list[Entry]) -> None:
        """Remote stores: fetch the times not known yet (once per key and mount), concurrently."""
        if self.store.is_local:
            return
        keys = {k for k in map(self._key, entries) if k is not None and k not in self._stored}
        if not keys:
            return

        async def one(key: str) -> None:
            try:
                mtime = await self.engine.once(
                    ("mtime", key), lambda: self.engine.run_io(self.store.mtime_ns_sync, key)
                )  # one request for concurrent lookups
                self._stored[key] = mtime or self.mount_time_ns
            except ZarrfsError as e:  # a time is not worth an error: the mount time, asked again next time
                log.info("modification time of %s unknown: %s", key, e)

        await self.engine.gather(*(functools.partial(one, key) for key in keys))
