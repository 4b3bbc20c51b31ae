"""`.zarrfs/versions/` of a versioned store (an Icechunk repository): branches, tags, snapshots, log.json.

A mixin of Namespace (runs in the trio thread, like it). Each version directory is the root
group of a snapshot, seen through the store's keys below `SNAPSHOT_PREFIX + ID`: the same
hierarchy, engine and cache serve it as the main tree, and its files are the main tree's
`.npy` files. Stores without a history (`refs_sync`) have no `versions` directory.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from ..storage.icechunk import SNAPSHOT_PREFIX
from ..model import GroupMeta
from .kinds import Kind

if TYPE_CHECKING:
    from .entries import Entry
    from .namespace import Namespace

VERSIONS_DIR = "versions"
LOG_FILE = "log.json"
REF_DIRS = ("branches", "tags")
SNAPSHOTS_DIR = "snapshots"


def version_path(snapshot_id: str) -> str:
    """The hierarchy path of a snapshot's root group."""
    return SNAPSHOT_PREFIX + snapshot_id


def is_version_path(path: str) -> bool:
    return path.startswith(SNAPSHOT_PREFIX)


class NamespaceVersions:
    """The `versions` view directory and what it holds."""

    @property
    def has_versions(self: "Namespace") -> bool:
        return hasattr(self.hierarchy.store, "refs_sync")

    def _version_root(self: "Namespace", snapshot_id: str) -> "Entry":
        return self._new(Kind.GROUP, "", GroupMeta(version_path(snapshot_id), {}, self.hierarchy.name))

    async def _versions_listing(self: "Namespace", entry: "Entry") -> dict[str, Callable[[], "Entry"]]:
        """Names in `versions/` (entry.key ""), `branches/`, `tags/` or `snapshots/`."""
        store = self.hierarchy.store
        if entry.key == "":
            names: dict[str, Callable[[], Entry]] = {
                d: (lambda d=d: self._new(Kind.VERSIONS, VERSIONS_DIR, key=d)) for d in (*REF_DIRS, SNAPSHOTS_DIR)}
            names[LOG_FILE] = lambda: self._new(Kind.VERSIONLOG, VERSIONS_DIR)
            return names
        if entry.key in REF_DIRS:
            refs = await self.engine.run_io(store.refs_sync, entry.key, key=("refs", entry.key))
        else:
            ancestry = await self.engine.run_io(store.ancestry_sync, key=("ancestry", store.snapshot_id))
            refs = {s["id"]: s["id"] for s in ancestry}
        out = {}
        for name, snapshot_id in refs.items():
            if not self._listable(name, f"{entry.key}/{name}"):
                continue
            self._renamed_version(entry, name, snapshot_id)
            out[name] = lambda s=snapshot_id: self._version_root(s)
        return out

    def _renamed_version(self: "Namespace", entry: "Entry", name: str, snapshot_id: str | None) -> None:
        """A branch that names another snapshot now (or none) is another directory (open files in
        the old one keep reading it): the old entry loses its name."""
        key = (entry.inode, name)
        old = self._entries.get(self._by_name.get(key, -1))
        if old is not None and old.node is not None and (
                snapshot_id is None or old.node.path != version_path(snapshot_id)):
            del self._by_name[key]
            self.on_name_gone(*key)

    async def recheck_versions(self: "Namespace") -> None:
        """After metadata_ttl or a refresh: `versions/` directories are listed again, and branch
        directories the kernel holds whose branch moved lose their names."""
        dirs = {e.inode: e for e in self._entries.values() if e.kind is Kind.VERSIONS}
        for entry in dirs.values():
            entry.listing = None
        named = [(parent, name) for parent, name in self._by_name
                 if parent in dirs and dirs[parent].key == "branches"]
        if not named:
            return
        store = self.hierarchy.store
        refs = await self.engine.run_io(store.refs_sync, "branches", key=("refs", "branches"))
        for parent, name in named:
            self._renamed_version(dirs[parent], name, refs.get(name))

    async def _snapshot_maker(self: "Namespace", name: str) -> Callable[[], "Entry"] | None:
        """`snapshots/ID` of a snapshot not listed (not an ancestor of the one mounted)."""
        store = self.hierarchy.store
        if await self.engine.run_io(store.has_snapshot_sync, name, key=("snapshot", name)):
            return lambda: self._version_root(name)
        return None

    async def _settle_version_log(self: "Namespace", entry: "Entry") -> None:
        """log.json: the ancestry of the snapshot shown, made again when the mount shows another."""
        store: Any = self.hierarchy.store
        entry.key = store.snapshot_id
        entry.content = await self.engine.run_io(store.log_json_sync, key=("log", store.snapshot_id))
        entry.size = entry.stored_bytes = len(entry.content)
