"""Zarr v3 inside an Icechunk session: the v3 format, with writes ordered as icechunk takes them.

Icechunk stores a chunk only for an array it knows (its `zarr.json` first). Icechunk 1.x moves
nothing (a move is a copy); 2.x moves a node in a commit of moves only. Every change of one
operation lands in one commit, so readers elsewhere see an array replaced all or nothing
whatever the order within it.
"""

from __future__ import annotations

import json

from ..model import GroupMeta, NewArray, Node
from ..storage.icechunk import IcechunkStore
from ..storage.keys import join
from .base import StagedArray
from .v3 import V3Hierarchy

ROOT_GROUP = {"zarr_format": 3, "node_type": "group", "attributes": {}}


class IcechunkHierarchy(V3Hierarchy):
    """A v3 hierarchy whose store is an IcechunkStore."""

    keeps_plain_files = False  # a repository holds Zarr nodes only: icechunk refuses any other key
    plain_files_beside_root_array = False
    direct_writes = False  # a commit orders the writes: chunks staged, documents first

    @property
    def session(self) -> IcechunkStore:
        """The store, as the Icechunk session it is."""
        if not isinstance(self.store, IcechunkStore):
            raise TypeError(f"an IcechunkHierarchy over {self.store!r}")
        return self.store

    def plain_name_problem(self, name: str) -> str | None:
        return "an Icechunk repository keeps no files other than NAME.npy arrays"

    def stage_array(self, path: str, new: NewArray, writer: str = "") -> StagedArray:
        """As for v3; the staging area gets the array's documents before its first chunk."""
        staged = super().stage_array(path, new, writer)
        docs = {join(staged.staging, key[len(path) :].lstrip("/")): value for key, value in staged.docs.items()}
        self.session.stage_docs(staged.staging, docs)
        return staged

    def _ensure_root_sync(self) -> None:
        """A repository just created has no root group: icechunk lists no node without it."""
        if self.store.get_sync("zarr.json") is None:
            self.store.set_sync("zarr.json", (json.dumps(ROOT_GROUP) + "\n").encode())

    def create_group_sync(self, path: str) -> GroupMeta:
        self._ensure_root_sync()
        return super().create_group_sync(path)

    def commit_array_sync(self, staged: StagedArray, old: Node | None) -> None:
        """The old node goes, the new documents are written, then the chunks move in."""
        final = staged.final
        self._ensure_root_sync()
        try:
            if old is not None and old.path:
                self.store.erase_below_sync(old.path)
            elif old is not None:
                for key in self.node_keys_sync(old):
                    self.store.erase_sync(key)
            for key in sorted(staged.docs, key=lambda k: k != final.metadata_key):
                self.store.set_sync(key, staged.docs[key])
            docs = set(self.doc_names)
            for rel in self.store.sizes_below_sync(staged.staging):
                if rel.rsplit("/", 1)[-1] not in docs:
                    self.store.move_sync(join(staged.staging, rel), join(final.keys.prefix, rel))
        finally:
            self.store.erase_below_sync(staged.staging)

    def move_node_sync(self, node: Node, new_path: str, message: str = "") -> None:
        """Move a node as one commit of its own where icechunk moves nodes (2.x), else copy every
        key of it to its new place (documents first, parents before children), then remove the
        old node."""
        if self.node_sync(new_path) is not None:
            from ..errors import Unsupported

            raise Unsupported(f"{new_path} exists")
        if node.path and self.session.move_node_sync(
            node.path, new_path, message or f"zarrfs: mv {node.path} -> {new_path}"
        ):
            return
        keys = self.node_keys_sync(node)
        docs = set(self.doc_names)

        def order(key: str) -> tuple[bool, int]:
            return key.rsplit("/", 1)[-1] not in docs, key.count("/")

        for key in sorted(keys, key=order):
            value = self.store.get_sync(key, None)
            if value is not None:
                self.store.set_sync(self.relocate_key(key, node.path, new_path), value)
        self.store.erase_below_sync(node.path)

    def erase_node_sync(self, node: Node) -> None:
        if not node.path:  # a root array: its keys one by one, the repository's root stays
            super().erase_node_sync(node)
            return
        self.store.erase_below_sync(node.path)

    def discard_staging_sync(self, staged: StagedArray) -> None:
        self.store.erase_below_sync(staged.staging)
