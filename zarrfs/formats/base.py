"""What every format provides (a Hierarchy of nodes) and the shared per-node-documents logic."""

from __future__ import annotations

import abc
import json
import logging
from typing import Any, ClassVar

from ..errors import MetadataError, ZarrfsError
from ..model import ArrayMeta, BrokenNode, GroupMeta, Node, join
from ..store import Store

log = logging.getLogger(__name__)

# Bounds of the search for an implicit group (a directory with a node somewhere below):
# deep enough for real hierarchies, small enough that a stray tree of files stays cheap.
IMPLICIT_SEARCH_MAX_DEPTH = 8
IMPLICIT_SEARCH_MAX_LISTINGS = 256


def parse_json(key: str, raw: bytes | None) -> Any:
    """A metadata document's JSON (old writers' bare NaN/Infinity accepted), or MetadataError."""
    if raw is None:
        return None
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise MetadataError(f"{key}: malformed JSON: {e}") from None


def json_object(key: str, raw: bytes | None) -> dict | None:
    doc = parse_json(key, raw)
    if doc is not None and not isinstance(doc, dict):
        raise MetadataError(f"{key}: expected a JSON object, got {type(doc).__name__}")
    return doc


class Hierarchy(abc.ABC):
    """A Zarr hierarchy in one format. Methods are synchronous: they do store I/O."""

    name: ClassVar[str]

    def __init__(self, store: Store) -> None:
        self.store = store

    @classmethod
    @abc.abstractmethod
    def detect_sync(cls, store: Store) -> bool:
        """Whether the store holds a hierarchy of this format (looking at its documents)."""

    @classmethod
    @abc.abstractmethod
    def open_sync(cls, store: Store, options: Any = None) -> "Hierarchy":
        """Open the hierarchy (reading what must be read once, such as consolidated metadata).

        `options` is the mount's Options; formats take their own settings from it.
        """

    @abc.abstractmethod
    def node_sync(self, path: str) -> Node | None:
        """The node at a hierarchy path ('' is the root), or None if there is none."""

    @abc.abstractmethod
    def children_sync(self, path: str) -> list[Node]:
        """The nodes directly below a group."""

    #: names of metadata documents, never counted as chunk data
    doc_names: ClassVar[tuple[str, ...]] = ()

    def chunk_sizes_sync(self, meta: ArrayMeta) -> dict[str, int | None]:
        """Stored chunk keys of an array with their sizes, from one recursive listing."""
        prefix = meta.keys.prefix
        out = {}
        for rel, size in self.store.sizes_below_sync(prefix).items():
            if rel.rsplit("/", 1)[-1] not in self.doc_names:
                out[join(prefix, rel)] = size
        return out


class NodeDocsHierarchy(Hierarchy):
    """Formats where each node keeps its documents under its own prefix (v2, v3).

    Subclasses name the documents (`doc_names`) and parse them (`parse_docs`);
    consolidated metadata, when present, replaces every store read and listing.
    """

    doc_names: ClassVar[tuple[str, ...]]

    def __init__(self, store: Store, consolidated: dict[str, dict[str, Any]] | None = None) -> None:
        super().__init__(store)
        # path -> {doc name -> parsed JSON}; None when the store has no consolidated metadata
        self.consolidated = consolidated

    @abc.abstractmethod
    def parse_docs(self, path: str, docs: dict[str, Any]) -> Node | None:
        """The node described by its documents (parsed JSON or None each), None if no node."""

    def _docs_sync(self, path: str) -> dict[str, Any] | BrokenNode:
        raw = self.store.get_many_sync([join(path, n) for n in self.doc_names])
        docs: dict[str, Any] = {}
        for name in self.doc_names:
            key = join(path, name)
            try:
                docs[name] = json_object(key, raw[key])
            except ZarrfsError as e:
                return BrokenNode(path, self.kind_of_doc(name), key, e)
        return docs

    def kind_of_doc(self, name: str) -> str:
        return "group"

    def _parse(self, path: str, docs: dict[str, Any]) -> Node | None:
        try:
            return self.parse_docs(path, docs)
        except ZarrfsError as e:
            key = join(path, self.main_doc(docs))
            return BrokenNode(path, self.kind_guess(docs), key, e)

    def main_doc(self, docs: dict[str, Any]) -> str:
        return next((n for n in self.doc_names if docs.get(n) is not None), self.doc_names[0])

    def kind_guess(self, docs: dict[str, Any]) -> str:
        return "group"

    def node_sync(self, path: str) -> Node | None:
        if self.consolidated is not None:
            docs = self.consolidated.get(path)
            if docs is not None:
                return self._parse(path, docs)
            if path == "" or any(p.startswith(path + "/") for p in self.consolidated):
                return GroupMeta(path, {}, self.name)
            return None
        docs = self._docs_sync(path)
        if isinstance(docs, BrokenNode):
            return docs
        node = self._parse(path, docs)
        if node is None and (path == "" or self._contains_node_sync(path)):
            return GroupMeta(path, {}, self.name)
        return node

    def children_sync(self, path: str) -> list[Node]:
        if self.consolidated is not None:
            names = set()
            prefix = path + "/" if path else ""
            for p in self.consolidated:
                if p and p.startswith(prefix):
                    names.add(p[len(prefix):].split("/", 1)[0])
            nodes = (self.node_sync(join(path, n)) for n in sorted(names))
            return [n for n in nodes if n is not None]
        _, dirs = self.store.list_dir_sync(path)
        out = []
        for name in dirs:
            node = self.node_sync(join(path, name))
            if node is not None:
                out.append(node)
        return out

    def _contains_node_sync(self, path: str) -> bool:
        """Whether some node lies below `path` (then `path` is an implicit group)."""
        frontier, listings = [path], 0
        for _depth in range(IMPLICIT_SEARCH_MAX_DEPTH):
            nxt = []
            for prefix in frontier:
                if listings >= IMPLICIT_SEARCH_MAX_LISTINGS:
                    return False
                listings += 1
                files, dirs = self.store.list_dir_sync(prefix)
                if prefix != path and any(n in files for n in self.doc_names):
                    return True
                nxt.extend(join(prefix, d) for d in dirs)
            if not nxt:
                return False
            frontier = nxt
        return False
