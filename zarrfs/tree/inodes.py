"""The inode table: entries by inode, names by (parent, name), files not yet nodes, lookup counts.

An entry lives while the kernel holds a reference to it (its lookup count, kept by
`remember` and `forget`), a file is open on it, or it holds data not in the store (a file
being written, a held file). Then it is dropped; the next lookup of its name makes a new
one with a new inode.
"""

from __future__ import annotations

from collections.abc import Callable, Collection

from ..errors import NotFound, ZarrfsError
from ..model import Node
from ..storage.keys import join
from .entries import NPY_SUFFIX, Entry, Kind, Maker

ROOT_INODE = 1


class Inodes:
    """Entries by inode and by name; told names go to `on_name_gone` (the kernel drops them)."""

    def __init__(self, on_name_gone: Callable[[int, str], None] | None = None) -> None:
        # Told when a name disappears (the FUSE layer tells the kernel to drop its dentry)
        self.on_name_gone = on_name_gone or (lambda parent, name: None)
        self._entries: dict[int, Entry] = {}
        self._by_name: dict[tuple[int, str], int] = {}
        self._next_inode = ROOT_INODE
        # Files created and not yet arrays: (parent inode, name) -> inode
        self._pending: dict[tuple[int, str], int] = {}

    # --- entries ---------------------------------------------------------------------

    def new(
        self,
        kind: Kind,
        view: str,
        node: Node | None = None,
        *,
        error: ZarrfsError | None = None,
        key: str | None = None,
        size: int = 0,
        origin: tuple[int, ...] | None = None,
    ) -> Entry:
        """A new entry with the next inode."""
        entry = Entry(self._next_inode, kind, view, node, error=error, key=key, size=size, origin=origin)
        self._entries[entry.inode] = entry
        self._next_inode += 1
        return entry

    def get(self, inode: int) -> Entry:
        try:
            return self._entries[inode]
        except KeyError:
            raise NotFound(f"no inode {inode}") from None

    def find(self, inode: int) -> Entry | None:
        """The entry of `inode`, None when there is none."""
        return self._entries.get(inode)

    def all(self) -> list[Entry]:
        """Every entry, by inode (a copy: callers may await while they go through it)."""
        return list(self._entries.values())

    def __len__(self) -> int:
        return len(self._entries)

    # --- names -----------------------------------------------------------------------

    def name(self, parent: int, name: str, entry: Entry) -> None:
        """Give `entry` the name `name` in directory `parent`."""
        self._by_name[(parent, name)] = entry.inode
        entry.name_key = (parent, name)

    def child(self, parent: int, name: str, make: Maker) -> Entry:
        """The entry of `name` in `parent`, made by `make()` unless it exists."""
        inode = self._by_name.get((parent, name))
        if inode is not None and inode in self._entries:
            return self._entries[inode]
        entry = make()
        self.name(parent, name, entry)
        return entry

    def named(self, parent: int, name: str) -> Entry | None:
        """The entry `name` in `parent` names now, if any."""
        return self._entries.get(self._by_name.get((parent, name), -1))

    def drop_name(self, key: tuple[int, str] | None, entry: Entry | None = None, tell: bool = False) -> None:
        """`key` (parent inode, name) names nothing any more (only if it names `entry`, when given);
        `tell`: the kernel is told to drop it."""
        if key is None or key not in self._by_name or (entry is not None and self._by_name[key] != entry.inode):
            return
        del self._by_name[key]
        if tell:
            self.on_name_gone(*key)

    def drop_names_of(self, inodes: Collection[int]) -> None:
        """The names of these inodes, and the names in them, go; the kernel is told."""
        for key in [k for k, inode in self._by_name.items() if inode in inodes or k[0] in inodes]:
            del self._by_name[key]
            self.on_name_gone(*key)

    def names_in(self, parents: Collection[int]) -> list[tuple[int, str]]:
        """(parent inode, name) of every name in these directories."""
        return [(parent, name) for parent, name in self._by_name if parent in parents]

    def parent_dir(self, inode: int) -> Entry:
        """The directory holding directory `inode` (the root's is the root): what `..` names."""
        entry = self.get(inode)
        if entry.name_key is None:
            return entry
        return self._entries.get(entry.name_key[0], entry)

    def path_of(self, entry: Entry) -> str:
        """The file's path in the mount, for log lines."""
        key = entry.name_key
        if key is not None and self._by_name.get(key) == entry.inode and key[0] in self._entries:
            base = self._entries[key[0]].node
            return join(base.path if base is not None else "", key[1])
        return entry.key or (entry.node.path + NPY_SUFFIX if entry.node is not None else f"inode {entry.inode}")

    # --- files not yet nodes -----------------------------------------------------------

    def register(self, parent: int, name: str, entry: Entry) -> None:
        """A file that is not (yet) a node: listed under `name` until it is one or is dropped."""
        self._pending[(parent, name)] = entry.inode
        self.name(parent, name, entry)

    def unregister(self, entry: Entry, keep_name: bool = False, forget: bool = True) -> None:
        """No longer a file apart: it became a node (`keep_name`: same inode, same name) or is
        gone (`forget`: the kernel drops the name; not while it renames it itself)."""
        for key, inode in list(self._pending.items()):
            if inode == entry.inode:
                del self._pending[key]
                if keep_name or self._by_name.get(key) != inode:
                    continue
                del self._by_name[key]
                if forget:
                    self.on_name_gone(*key)

    def drop_pending(self, parent: int, name: str) -> None:
        """`name` in `parent` is no file apart any more (removed)."""
        self._pending.pop((parent, name), None)

    def pending_in(self, parent: int) -> dict[str, Entry]:
        """Name -> entry of the files apart in directory `parent`."""
        return {name: self._entries[inode] for (p, name), inode in self._pending.items() if p == parent}

    # --- lookup counts -----------------------------------------------------------------

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
            if (
                entry.lookups
                or entry.opens
                or entry.inode == ROOT_INODE
                or entry.writing is not None
                or (entry.plain is not None and entry.plain.needs_entry)
                or self._entries.get(entry.inode) is not entry
                or any(parent == entry.inode for parent, _ in self._pending)
            ):
                continue  # a directory holding files apart keeps its inode: their names hang on it
            del self._entries[entry.inode]
            if entry.name_key is not None and self._by_name.get(entry.name_key) == entry.inode:
                del self._by_name[entry.name_key]
