"""The virtual namespace: inodes, directory entries and names for groups, arrays and views.

Runs in the trio thread (tables need no locks); hierarchy I/O goes through the engine's
worker threads. Inodes are assigned once per path and never reused while mounted.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re

import trio

from .engine import Engine
from .errors import NotFound, ZarrfsError
from .formats.base import Hierarchy
from .model import ArrayMeta, BrokenNode, GroupMeta, Node, join
from .views import ArrayStream

log = logging.getLogger(__name__)

ROOT_INODE = 1
NPY_SUFFIX = ".npy"


@dataclasses.dataclass(eq=False)
class Entry:
    """One file or directory of the mount."""

    inode: int
    is_dir: bool
    node: Node | None = None
    stream: ArrayStream | None = None
    error: ZarrfsError | None = None
    # name -> inode, filled on first listing
    children: dict[str, int] | None = None
    lock: trio.Lock = dataclasses.field(default_factory=trio.Lock)

    @property
    def size(self) -> int:
        return self.stream.size if self.stream is not None else 0


def root_array_name(source: str) -> str:
    """The file name of a root array: SOURCE's last component without `.zarr`, else `array`."""
    last = re.split(r"[/\\]", source.rstrip("/"))[-1]
    last = last.split("::")[-1].split("://")[-1] if "://" in last or "::" in last else last
    stem = last[: -len(".zarr")] if last.endswith(".zarr") else last
    return (stem or "array") + NPY_SUFFIX


class Namespace:
    """Maps inodes and names to groups (directories) and arrays (`.npy` files)."""

    def __init__(self, hierarchy: Hierarchy, root: Node, source: str, engine: Engine) -> None:
        self.hierarchy = hierarchy
        self.engine = engine
        self._entries: dict[int, Entry] = {}
        self._next_inode = ROOT_INODE
        if isinstance(root, (ArrayMeta,)) or (isinstance(root, BrokenNode) and root.kind == "array"):
            # A root array: the root directory holds just NAME.npy.
            top = self._new(True, None)
            top.children = {root_array_name(source): self._entry_for(root).inode}
        else:
            self._new(True, root, error=root.error if isinstance(root, BrokenNode) else None)

    def _new(self, is_dir: bool, node: Node | None, **kw) -> Entry:
        entry = Entry(self._next_inode, is_dir, node, **kw)
        self._entries[entry.inode] = entry
        self._next_inode += 1
        return entry

    def _entry_for(self, node: Node) -> Entry:
        if isinstance(node, GroupMeta):
            return self._new(True, node)
        if isinstance(node, ArrayMeta):
            return self._new(False, node, stream=ArrayStream(node, "C"))
        return self._new(node.kind == "group", node, error=node.error)

    def get(self, inode: int) -> Entry:
        try:
            return self._entries[inode]
        except KeyError:
            raise NotFound(f"no inode {inode}") from None

    async def children(self, inode: int) -> dict[str, int]:
        """The entries of a directory (loaded once from the hierarchy)."""
        entry = self.get(inode)
        if not entry.is_dir:
            raise NotFound("not a directory")
        if entry.children is not None:
            return entry.children
        async with entry.lock:
            if entry.children is not None:
                return entry.children
            if entry.error is not None:
                raise entry.error
            path = entry.node.path if entry.node is not None else ""
            try:
                nodes = await self.engine.run_io(self.hierarchy.children_sync, path)
            except ZarrfsError as e:
                log.warning("listing %s: %s", path or "/", e)
                raise
            names: dict[str, int] = {}
            for node in nodes:
                if isinstance(node, BrokenNode):
                    log.warning("%s: %s", node.key, node.error)
                name = node.path.rsplit("/", 1)[-1]
                if node.kind == "array":
                    name += NPY_SUFFIX
                if name not in names:
                    names[name] = self._entry_for(node).inode
            entry.children = names
            return names

    async def lookup(self, parent: int, name: str) -> Entry:
        children = await self.children(parent)
        inode = children.get(name)
        if inode is None:
            raise NotFound(name)
        return self.get(inode)

    async def list(self, inode: int) -> list[tuple[str, Entry]]:
        children = await self.children(inode)
        return [(name, self._entries[i]) for name, i in children.items()]


def fs_name(name: bytes) -> str:
    return os.fsdecode(name)
