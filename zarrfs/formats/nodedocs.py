"""Formats that keep each node's documents under its own prefix (v2, v3): lookups, listings, consolidated metadata, writes."""

from __future__ import annotations

import abc
import concurrent.futures
import dataclasses
import hashlib
import json
import logging
import re
from typing import Any, ClassVar

from ..errors import ZarrfsError
from ..model import ArrayMeta, BrokenNode, GroupMeta, Node
from ..storage.base import BaseStore
from ..storage.keys import DIRECT_MARKER, is_staging_key, join
from .base import (
    Hierarchy,
    StagedArray,
    broken,
    common_plain_name_problem,
    json_object,
    parse_json,
)

# Bounds of the search for an implicit group (a directory with a node somewhere below):
# deep enough for real hierarchies, small enough that a stray tree of files stays cheap.
IMPLICIT_SEARCH_MAX_DEPTH = 8
IMPLICIT_SEARCH_MAX_LISTINGS = 256

# Plain file names refused in a group's directory: what a reader could take for a chunk key
# (v2 `0.1`, v3 `c` and `c.0.1`).
CHUNK_KEY_NAME = re.compile(r"c(\.\d+)*|\d+(\.\d+)*")
# Keys of a root array whose metadata could not be read that may be its chunks, whatever
# its encoding (`0.1`, `0/1`, `c/0/1`, `c.0.1`, a 0-d array's `0` or `c`).
ANY_CHUNK_KEY = re.compile(r"c|(c[./])?\d+([./]\d+)*")

log = logging.getLogger(__name__)


class NodeDocsHierarchy(Hierarchy):
    """Formats where each node keeps its documents under its own prefix (v2, v3).

    Subclasses name the documents (`doc_names`) and parse them (`parse_docs`);
    consolidated metadata, when present, replaces every store read and listing.
    """

    doc_names: ClassVar[tuple[str, ...]]

    def __init__(self, store: BaseStore, consolidated: dict[str, dict[str, Any]] | None = None) -> None:
        super().__init__(store)
        # path -> {doc name -> parsed JSON}; None when the store has no consolidated metadata.
        # A snapshot, never changed in place: worker threads read it while another computes
        # the next one and publishes it with one assignment (readers keep a consistent view).
        self.consolidated = consolidated

    @abc.abstractmethod
    def parse_docs(self, path: str, docs: dict[str, Any]) -> Node | None:
        """The node described by its documents (parsed JSON or None each), None if no node."""

    def _docs_sync(self, path: str) -> dict[str, Any] | BrokenNode:
        """A node's parsed documents, or the BrokenNode naming the first that cannot be read."""
        keys = [join(path, n) for n in self.doc_names]
        try:
            raw = self.store.get_many_sync(keys)
        except Exception:  # one key failed: fetch them one by one to learn which
            raw = None
        docs: dict[str, Any] = {}
        for name, key in zip(self.doc_names, keys):
            try:
                docs[name] = json_object(key, raw[key] if raw is not None else self.store.get_sync(key))
            except Exception as e:
                return broken(path, self.kind_of_doc(name), key, e)
        return docs

    def kind_of_doc(self, name: str) -> str:
        return "group"

    keeps_plain_files = True

    def plain_name_problem(self, name: str) -> str | None:
        """Keys a reader could take for the format's own (documents, chunk keys) and the mount's
        own names are refused; any other name is kept as a key beside the nodes."""
        if CHUNK_KEY_NAME.fullmatch(name):
            return "a name a reader could take for a chunk key"
        return common_plain_name_problem(name)

    def _parse(self, path: str, docs: dict[str, Any]) -> Node | None:
        try:
            return self.parse_docs(path, docs)
        except Exception as e:
            return broken(path, self._kind_guess_safe(docs), join(path, self.main_doc(docs)), e)

    def _kind_guess_safe(self, docs: dict[str, Any]) -> str:
        try:
            return self.kind_guess(docs)
        except Exception:  # a document of the wrong shape (consolidated entries are not checked)
            return "group"

    def main_doc(self, docs: dict[str, Any]) -> str:
        return next((n for n in self.doc_names if docs.get(n) is not None), self.doc_names[0])

    def kind_guess(self, docs: dict[str, Any]) -> str:
        return "group"

    def node_sync(self, path: str) -> Node | None:
        """The node at `path`; never raises: whatever fails makes it a BrokenNode."""
        try:
            return self._node_sync(path)
        except Exception as e:  # e.g. listing below an implicit group refused
            return broken(path, "group", path or "/", e)

    def _node_sync(self, path: str) -> Node | None:
        consolidated = self.consolidated  # one snapshot for the whole lookup
        if consolidated is not None:
            docs = consolidated.get(path)
            if docs is not None:
                return self._parse(path, docs)
            if path == "" or any(p.startswith(path + "/") for p in consolidated):
                return GroupMeta(path, {}, self.name)
            return None
        read = self._docs_sync(path)
        if isinstance(read, BrokenNode):
            return read
        node = self._parse(path, read)
        if node is None and (path == "" or self._contains_node_sync(path)):
            return GroupMeta(path, {}, self.name)
        return node

    def children_sync(self, path: str) -> list[Node]:
        consolidated = self.consolidated  # one snapshot for the whole listing
        if consolidated is not None:
            names = set()
            prefix = path + "/" if path else ""
            for p in consolidated:
                if p and p.startswith(prefix):
                    names.add(p[len(prefix) :].split("/", 1)[0])
            nodes = (self.node_sync(join(path, n)) for n in sorted(names))
            return [n for n in nodes if n is not None]
        _, dirs = self.store.list_dir_sync(path)
        prefetched = self._docs_of_many_sync([join(path, name) for name in dirs])
        out = []
        for name in dirs:
            child = join(path, name)
            docs = prefetched.get(child)
            node = self._parse(child, docs) if docs is not None else None
            if node is None:  # an implicit group, or a document that failed: the one-node path decides
                node = self.node_sync(child)
            if node is not None:
                out.append(node)
        return out

    def _docs_of_many_sync(self, paths: list[str]) -> dict[str, dict[str, Any]]:
        """Parsed documents of many nodes, fetched concurrently in one batch (a remote listing
        costs one round trip, not one per child); nodes whose documents failed are left out."""
        keys = [join(p, n) for p in paths for n in self.doc_names]
        if len(keys) < 2:
            return {}
        try:
            raw = self.store.get_many_sync(keys)
        except Exception:  # one key failed: each node is read on its own, which names it
            return {}
        out: dict[str, dict[str, Any]] = {}
        for p in paths:
            try:
                out[p] = {n: json_object(join(p, n), raw[join(p, n)]) for n in self.doc_names}
            except Exception:
                continue
        return out

    # --- writes shared by the per-node-documents formats ----------------------------------

    # A store whose root is an array keeps plain files beside the array's documents and chunks:
    # a reader fetches those by name only, and the array's keys (below) leave the others alone.
    plain_files_beside_root_array = True

    def node_keys_sync(self, node: Node) -> list[str]:
        """Every key below the node's path; for a root array only its documents and the keys
        shaped like its chunk keys (plain files and any other key beside them are no part of it)."""
        keys = [join(node.path, rel) for rel in self.store.sizes_below_sync(node.path)]
        if node.path or node.kind != "array":
            return keys
        is_chunk = node.keys.is_key if isinstance(node, ArrayMeta) else ANY_CHUNK_KEY.fullmatch
        return [key for key in keys if key in self.doc_names or is_chunk(key)]

    def relocate_key(self, key: str, old_path: str, new_path: str) -> str:
        return new_path + key[len(old_path) :] if old_path else join(new_path, key)

    def write_array_docs_sync(self, path: str, docs: dict[str, bytes]) -> None:
        self.write_docs_sync(path, {key[len(path) :].lstrip("/"): json.loads(value) for key, value in docs.items()})

    def dump_docs(self, path: str, docs: dict[str, Any]) -> dict[str, bytes]:
        """A node's documents as the store will hold them (store key -> bytes)."""
        return {join(path, name): (json.dumps(doc, indent=2) + "\n").encode() for name, doc in docs.items()}

    # Whether a new array on an object store is written straight under its final keys (Icechunk
    # orders its own writes: no).
    direct_writes = True

    def begin_array_sync(self, staged: StagedArray, old: Node | None) -> StagedArray:
        """On an object store, chunks go straight under their final keys: a new array's, or a
        replacement's whose chunk keys take the other separator (`/` or `.`) than the old
        array's, which keeps every key of the old one. Readers follow the old documents (or
        none) until the commit writes the new ones, so no copy is needed. The staging area holds
        only the marker naming them (DIRECT_MARKER), for the sweep of a writer that dies. What
        lies under the path is listed beside the first chunks (`found`), not before them."""
        path = staged.final.path
        self.erases.wait_for(path)  # a replacement's old keys: they may take this one's separator
        if not self.direct_writes or self.store.is_local or not path:
            return staged
        if old is not None and not isinstance(old, ArrayMeta):
            return staged
        direct = staged
        if old is not None:
            sep = "/" if old.keys.sep == "." else "."
            docs, final = self.with_separator(path, staged.docs, sep)
            direct = dataclasses.replace(staged, final=final, docs=docs)
            if not _disjoint(old, final):
                return staged
        final = direct.final
        self.store.set_sync(join(staged.staging, DIRECT_MARKER), _marker(direct))
        pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="zarrfs-found")
        found = pool.submit(lambda: [join(path, rel) for rel in self.store.sizes_below_sync(path)])
        pool.shutdown(wait=False)  # its thread ends with the listing
        meta = dataclasses.replace(final, path=staged.meta.path, inner=None, source=None)
        return dataclasses.replace(direct, meta=meta, direct=True, found=found)

    def with_separator(self, path: str, docs: dict[str, bytes], sep: str) -> tuple[dict[str, bytes], ArrayMeta]:
        """A new array's documents (from `array_docs`) with chunk keys separated by SEP."""
        raise NotImplementedError

    def discard_staging_sync(self, staged: StagedArray) -> None:
        if staged.direct:  # the chunks it wrote: the keys of its encoding under its path
            keys = staged.final.keys
            self.store.erase_many_sync([k for k in self.node_keys_sync(staged.final) if keys.is_key(k)])
        super().discard_staging_sync(staged)

    def _commit_direct_sync(self, staged: StagedArray, old: Node | None) -> None:
        """The documents of an array whose chunks are in place (the metadata document last), the
        consolidated metadata; then, in the background, the old array's keys."""
        final = staged.final
        found = staged.found.result() if staged.found is not None else []
        # Keys of this encoding that it did not store (left by a writer that died, or by an erase
        # that failed) would read as its chunks: they go first
        own = {final.keys.key(idx) for idx in staged.stored}
        strays = [key for key in found if final.keys.is_key(key) and key not in own]
        if strays:
            self.store.erase_many_sync(strays)
        for key in sorted(staged.docs, key=lambda k: k == final.metadata_key):
            self.store.set_sync(key, staged.docs[key])
        self._consolidate(final.path, staged.docs)
        # The old array's keys as listed when the write began (none of this encoding's), and the
        # marker, in one bulk erase that the close does not wait for: no reader follows them now,
        # and a write under the path waits for it (begin_array_sync)
        gone = [
            key
            for key in found
            if old is not None and key not in staged.docs and not final.keys.is_key(key) and not is_staging_key(key)
        ]
        self.erases.start(final.path, lambda: self._erase_old_sync(final.path, staged.staging, gone))

    def _erase_old_sync(self, path: str, staging: str, gone: list[str]) -> None:
        try:
            self.store.erase_many_sync([*gone, join(staging, DIRECT_MARKER)])
        except ZarrfsError as e:  # the new array is whole; the sweep removes what is left
            log.warning("%s: stored, but keys of the old array or its marker %s stay: %s", path, staging, e)

    def _consolidate(self, path: str, docs: dict[str, bytes]) -> None:
        """Add a new array's documents to the consolidated metadata, if the store has any."""
        if self.consolidated is not None:
            entry = {n: None for n in self.doc_names}
            entry.update({key[len(path) + 1 :]: json.loads(value) for key, value in docs.items()})
            self.consolidated = {**self.consolidated, path: entry}
            self.write_consolidated_sync()

    def commit_array_sync(self, staged: StagedArray, old: Node | None) -> None:
        """On a local store, one directory swap: the documents are written into the staging
        directory, which then trades places with the array's directory (renameat2), so
        readers see the old array whole until that instant, then the new one whole."""
        path = staged.final.path
        self.erases.wait_for(path)
        if staged.direct:
            self._commit_direct_sync(staged, old)
            return
        if not self.store.is_local or not path or (old is None and self.store.is_dir_sync(path)):
            super().commit_array_sync(staged, old)  # remote, root, or stray files at the path
            return
        for key, value in staged.docs.items():
            self.store.set_sync(join(staged.staging, key[len(path) + 1 :]), value)
        self.store.swap_dirs_sync(staged.staging, path)
        self.store.erase_below_sync(staged.staging)  # the old array, now under the staging name
        self._consolidate(path, staged.docs)

    def write_docs_sync(self, path: str, docs: dict[str, Any]) -> None:
        """Write a node's documents (None erases one) and keep consolidated metadata current."""
        for name, doc in docs.items():
            key = join(path, name)
            if doc is None:
                self.store.erase_sync(key)
            else:
                self.store.set_sync(key, (json.dumps(doc, indent=2) + "\n").encode())
        snapshot = self.consolidated
        if snapshot is not None:
            entry = {**snapshot.get(path, dict.fromkeys(self.doc_names)), **docs}
            self.consolidated = {**snapshot, path: entry}
            self.write_consolidated_sync()

    def after_change_sync(self) -> None:
        if self.consolidated is None:
            return
        # Re-read what is left (the documents of every node still in the consolidated set)
        # into a new snapshot, published at once.
        fresh: dict[str, dict[str, Any]] = {}
        for path in self.consolidated:
            raw = self.store.get_many_sync([join(path, n) for n in self.doc_names])
            docs = {n: parse_json(join(path, n), raw[join(path, n)]) for n in self.doc_names}
            if path == "" or any(d is not None for d in docs.values()):
                fresh[path] = docs
        for key in self.store.sizes_below_sync(""):
            path, _, name = key.rpartition("/")
            if name in self.doc_names and path not in fresh:
                fresh[path] = {n: parse_json(join(path, n), self.store.get_sync(join(path, n))) for n in self.doc_names}
        self.consolidated = fresh
        self.write_consolidated_sync()

    def reread_consolidated_sync(self) -> None:
        """Read the consolidated metadata again (another client may have changed the hierarchy);
        published as one new snapshot. A hierarchy without it has nothing to read."""
        if self.consolidated is None:
            return
        fresh = type(self).open_sync(self.store).consolidated
        if fresh is not None:
            self.consolidated = fresh

    def write_consolidated_sync(self) -> None:
        """Rewrite the store's consolidated metadata from `self.consolidated`."""

    def _contains_node_sync(self, path: str) -> bool:
        """Whether some node lies below `path` (then `path` is an implicit group)."""
        frontier, listings = [path], 0
        for _depth in range(IMPLICIT_SEARCH_MAX_DEPTH):
            nxt: list[str] = []
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


def _marker(direct: StagedArray) -> bytes:
    """DIRECT_MARKER's value: where an array written straight under its keys goes, and its document's hash."""
    final = direct.final
    marker = {
        "prefix": final.keys.prefix,
        "separator": final.keys.sep,
        "head": final.keys.head,
        "zero_d": final.keys.zero_d,
        "documents": sorted(direct.docs),
        "metadata_key": final.metadata_key,
        "metadata_sha256": hashlib.sha256(direct.docs[final.metadata_key]).hexdigest(),
    }
    return json.dumps(marker).encode()


def _disjoint(old: ArrayMeta, new: ArrayMeta) -> bool:
    """Whether no chunk key of NEW can be one of OLD's, nor the reverse (each checked on its first
    chunk against the other's pattern of any rank: a 1-d v2 array's `5` is one with either separator)."""
    first_new = new.keys.key((0,) * len(new.shape))
    first_old = old.keys.key((0,) * len(old.shape))
    return first_new != first_old and not old.keys.is_key(first_new) and not new.keys.is_key(first_old)
