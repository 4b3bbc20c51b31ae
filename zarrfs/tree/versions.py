"""`.zarrfs/versions/` of a versioned store (an Icechunk repository): branches, tags, snapshots, log.json.

Part of the Namespace (runs in the trio thread, like it). Each version directory is the root
group of a snapshot, seen through the store's keys below `SNAPSHOT_PREFIX + ID`: the same
hierarchy, engine and cache serve it as the main tree, and its files are the main tree's
`.npy` files. Stores without a history (`refs_sync`) have no `versions` directory.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..errors import required
from ..model import GroupMeta
from ..storage.icechunk import SNAPSHOT_PREFIX
from ..views.kinds import Kind

if TYPE_CHECKING:
    from ..engine import Engine
    from ..formats.base import Hierarchy
    from ..storage.icechunk import IcechunkStore
    from .entries import Entry
    from .inodes import Inodes

VERSIONS_DIR = "versions"
LOG_FILE = "log.json"
REF_DIRS = ("branches", "tags")
SNAPSHOTS_DIR = "snapshots"


def version_path(snapshot_id: str) -> str:
    """The hierarchy path of a snapshot's root group."""
    return SNAPSHOT_PREFIX + snapshot_id


def is_version_path(path: str) -> bool:
    return path.startswith(SNAPSHOT_PREFIX)


class Versions:
    """The `versions` view directory and what it holds."""

    def __init__(
        self,
        engine: Engine,
        hierarchy: Hierarchy,
        inodes: Inodes,
        listable: Callable[[str, str], bool],
        repository: IcechunkStore | None = None,
    ) -> None:
        self.repository = repository  # None: the store has no history
        self.engine = engine
        self.hierarchy = hierarchy
        self.inodes = inodes
        self.listable = listable  # whether a name can be listed (said once if not)

    @property
    def present(self) -> bool:
        """Whether the store has a history to show."""
        return self.repository is not None

    def _repository(self) -> IcechunkStore:
        """The repository, asked only where `present` (TypeError: a defect)."""
        return required(self.repository, "the store has no history")

    def _version_root(self, snapshot_id: str) -> Entry:
        return self.inodes.new(Kind.GROUP, "", GroupMeta(version_path(snapshot_id), {}, self.hierarchy.name))

    async def listing(self, entry: Entry) -> dict[str, Callable[[], Entry]]:
        """Names in `versions/` (entry.key ""), `branches/`, `tags/` or `snapshots/`."""
        store = self._repository()
        if entry.key == "":
            new = self.inodes.new
            names: dict[str, Callable[[], Entry]] = {
                d: functools.partial(new, Kind.VERSIONS, VERSIONS_DIR, key=d) for d in (*REF_DIRS, SNAPSHOTS_DIR)
            }
            names[LOG_FILE] = lambda: new(Kind.VERSIONLOG, VERSIONS_DIR)
            return names
        if entry.key in REF_DIRS:
            refs = await self.engine.run_io(store.refs_sync, entry.key, key=("refs", entry.key))
        else:
            ancestry = await self.engine.run_io(store.ancestry_sync, key=("ancestry", store.snapshot_id))
            refs = {s["id"]: s["id"] for s in ancestry}
        out: dict[str, Callable[[], Entry]] = {}
        for name, snapshot_id in refs.items():
            if not self.listable(name, f"{entry.key}/{name}"):
                continue
            self._renamed_version(entry, name, snapshot_id)
            out[name] = functools.partial(self._version_root, snapshot_id)
        return out

    def _renamed_version(self, entry: Entry, name: str, snapshot_id: str | None) -> None:
        """A branch that names another snapshot now (or none) is another directory (open files in
        the old one keep reading it): the old entry loses its name."""
        old = self.inodes.named(entry.inode, name)
        if (
            old is not None
            and old.node is not None
            and (snapshot_id is None or old.node.path != version_path(snapshot_id))
        ):
            self.inodes.drop_name((entry.inode, name), tell=True)

    async def recheck(self) -> None:
        """After metadata_ttl or a refresh: `versions/` directories are listed again, and branch
        directories the kernel holds whose branch moved lose their names."""
        dirs = {e.inode: e for e in self.inodes.all() if e.kind is Kind.VERSIONS}
        for entry in dirs.values():
            entry.listing = None
        named = [(parent, name) for parent, name in self.inodes.names_in(dirs) if dirs[parent].key == "branches"]
        if not named:
            return
        store = self._repository()
        refs = await self.engine.run_io(store.refs_sync, "branches", key=("refs", "branches"))
        for parent, name in named:
            self._renamed_version(dirs[parent], name, refs.get(name))

    async def snapshot_maker(self, name: str) -> Callable[[], Entry] | None:
        """`snapshots/ID` of a snapshot not listed (not an ancestor of the one mounted)."""
        store = self._repository()
        if await self.engine.run_io(store.has_snapshot_sync, name, key=("snapshot", name)):
            return lambda: self._version_root(name)
        return None

    async def settle_log(self, entry: Entry) -> None:
        """log.json: the ancestry of the snapshot shown, made again when the mount shows another."""
        store = self._repository()
        entry.key = store.snapshot_id
        entry.content = await self.engine.run_io(store.log_json_sync, key=("log", store.snapshot_id))
        entry.size = entry.stored_bytes = len(entry.content)
