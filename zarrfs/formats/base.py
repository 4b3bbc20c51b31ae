"""What every format provides (a Hierarchy of nodes) and the shared per-node-documents logic."""

from __future__ import annotations

import abc
import json
import logging
import math
from typing import Any, ClassVar

from ..errors import MetadataError, NotFound, Unsupported, UserError, ZarrfsError
from ..model import ArrayMeta, BrokenNode, GroupMeta, NewArray, Node, join
from ..store import Store

log = logging.getLogger(__name__)

# Bounds of the search for an implicit group (a directory with a node somewhere below):
# deep enough for real hierarchies, small enough that a stray tree of files stays cheap.
IMPLICIT_SEARCH_MAX_DEPTH = 8
IMPLICIT_SEARCH_MAX_LISTINGS = 256


# Chunks of arrays created through the mount aim at this many bytes, scaled with the array
# (the h5py/zarr-python heuristic): small arrays get 128 KiB chunks, large ones up to 64 MiB.
CHUNK_BASE_BYTES = 256 << 10
CHUNK_MIN_BYTES = 128 << 10
CHUNK_MAX_BYTES = 64 << 20
# Default compression levels when `codec=NAME` gives none.
DEFAULT_LEVELS = {"blosc": 5, "zstd": 0, "gzip": 5, "zlib": 5, "bz2": 5, "lzma": 6, "lz4": 1}


def guess_chunks(shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    """A chunk shape for a new array: halve dimensions in turn until the chunk is small enough."""
    if not shape:
        return ()
    chunks = [max(1, n) for n in shape]
    total = math.prod(chunks) * max(itemsize, 1)
    target = CHUNK_BASE_BYTES * 2 ** math.log10(max(total, 1) / (1 << 20)) if total > 0 else CHUNK_MIN_BYTES
    target = min(max(target, CHUNK_MIN_BYTES), CHUNK_MAX_BYTES)
    i = 0
    while math.prod(chunks) * itemsize > target and any(c > 1 for c in chunks):
        d = i % len(chunks)
        chunks[d] = -(-chunks[d] // 2)
        i += 1
    return tuple(chunks)


def compressor_config(codec: str | None, default: str, itemsize: int) -> dict | None:
    """The numcodecs config of a `codec=NAME[:LEVEL]` option (or of the format's default)."""
    name, _, level_text = (codec or default).partition(":")
    name = name.lower()
    if name == "none":
        return None
    if name not in DEFAULT_LEVELS:
        raise UserError(f"codec={codec}: expected one of none, {', '.join(DEFAULT_LEVELS)}")
    level = int(level_text) if level_text else DEFAULT_LEVELS[name]
    return {
        "blosc": {"id": "blosc", "cname": "lz4", "clevel": level, "shuffle": 1, "blocksize": 0},
        "zstd": {"id": "zstd", "level": level},
        "gzip": {"id": "gzip", "level": level},
        "zlib": {"id": "zlib", "level": level},
        "bz2": {"id": "bz2", "level": max(1, level)},
        "lzma": {"id": "lzma", "preset": level},
        "lz4": {"id": "lz4", "acceleration": level},
    }[name]


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


def root_zarr_json_sync(store: Store) -> dict | None:
    """The store's root `zarr.json` (v3 and the v3 drafts tell themselves apart by it), if usable."""
    try:
        return json_object("zarr.json", store.get_sync("zarr.json"))
    except MetadataError:
        return None


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

    # --- writes: synchronous, run by the engine in worker threads -------------------------

    def create_group_sync(self, path: str) -> GroupMeta:
        raise Unsupported(f"{self.name} hierarchies have no groups to create")

    def create_array_sync(self, path: str, new: NewArray) -> ArrayMeta:
        raise Unsupported(f"creating arrays in {self.name} hierarchies is not supported")

    def set_attributes_sync(self, node: Node, attributes: dict[str, Any]) -> Node:
        raise Unsupported(f"writing attributes of {self.name} nodes is not supported")

    def node_keys_sync(self, node: Node) -> list[str]:
        """Every store key that belongs to a node and its descendants."""
        raise Unsupported(f"{self.name} nodes cannot be listed for removal")

    def relocate_key(self, key: str, old_path: str, new_path: str) -> str:
        """Where `key` of the node at `old_path` goes when the node moves to `new_path`."""
        raise Unsupported(f"moving {self.name} nodes is not supported")

    def erase_node_sync(self, node: Node) -> None:
        """Remove a node (an array with all its chunks, or an empty group)."""
        for key in self.node_keys_sync(node):
            self.store.erase_sync(key)
        self.after_change_sync()

    def move_node_sync(self, node: Node, new_path: str) -> None:
        """Copy every key of a node to its new place, then remove the old keys.

        The old name disappears only once the new one is complete: a failure part-way
        leaves the original whole (and maybe a partial copy, which the next try replaces).
        """
        if not node.path:
            raise Unsupported("the root cannot be moved")
        if self.node_sync(new_path) is not None:
            raise Unsupported(f"{new_path} exists")
        keys = self.node_keys_sync(node)
        moved = {key: self.relocate_key(key, node.path, new_path) for key in keys}
        # Metadata documents last, so that the new node appears only once its data is there.
        order = sorted(keys, key=lambda k: k.rsplit("/", 1)[-1] in self.doc_names)
        for key in order:
            value = self.store.get_sync(key, None)  # chunks too: any size
            if value is None:
                raise NotFound(f"{key} vanished while moving {node.path}")
            self.store.set_sync(moved[key], value)
        for key in reversed(order):
            self.store.erase_sync(key)
        self.after_change_sync()

    def after_change_sync(self) -> None:
        """Called after metadata changed (formats with consolidated metadata refresh it)."""

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
        try:
            raw = self.store.get_many_sync([join(path, n) for n in self.doc_names])
        except ZarrfsError:  # one unreadable document (a FIFO...): read one by one to name it
            raw = None
        docs: dict[str, Any] = {}
        for name in self.doc_names:
            key = join(path, name)
            try:
                docs[name] = json_object(key, raw[key] if raw is not None else self.store.get_sync(key))
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

    # --- writes shared by the per-node-documents formats ----------------------------------

    def node_keys_sync(self, node: Node) -> list[str]:
        return [join(node.path, rel) for rel in self.store.sizes_below_sync(node.path)]

    def relocate_key(self, key: str, old_path: str, new_path: str) -> str:
        return new_path + key[len(old_path):] if old_path else join(new_path, key)

    def write_docs_sync(self, path: str, docs: dict[str, Any]) -> None:
        """Write a node's documents (None erases one) and keep consolidated metadata current."""
        for name, doc in docs.items():
            key = join(path, name)
            if doc is None:
                self.store.erase_sync(key)
            else:
                self.store.set_sync(key, (json.dumps(doc, indent=2) + "\n").encode())
        if self.consolidated is not None:
            entry = self.consolidated.setdefault(path, {n: None for n in self.doc_names})
            entry.update(docs)
            self.write_consolidated_sync()

    def after_change_sync(self) -> None:
        if self.consolidated is None:
            return
        # Re-read what is left: the documents of every node still in the consolidated set.
        for path in list(self.consolidated):
            raw = self.store.get_many_sync([join(path, n) for n in self.doc_names])
            docs = {n: parse_json(join(path, n), raw[join(path, n)]) for n in self.doc_names}
            if all(d is None for d in docs.values()) and path:
                del self.consolidated[path]
            else:
                self.consolidated[path] = docs
        for key in self.store.sizes_below_sync(""):
            path, _, name = key.rpartition("/")
            if name in self.doc_names and path not in self.consolidated:
                self.consolidated[path] = {
                    n: parse_json(join(path, n), self.store.get_sync(join(path, n))) for n in self.doc_names}
        self.write_consolidated_sync()

    def write_consolidated_sync(self) -> None:
        """Rewrite the store's consolidated metadata from `self.consolidated`."""

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
