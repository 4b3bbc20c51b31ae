"""What every format provides (a Hierarchy of nodes), and helpers every format shares: JSON documents, broken nodes, names, staging."""

from __future__ import annotations

import abc
import concurrent.futures
import dataclasses
import json
import logging
import math
import re
import secrets
from collections.abc import Iterable, Iterator
from typing import Any, ClassVar, Self

from ..errors import (
    InvalidArgument,
    MetadataError,
    NameTooLong,
    NotFound,
    Unsupported,
    ZarrfsError,
)
from ..grid import Index
from ..model import ArrayMeta, BrokenNode, GroupMeta, NewArray, Node
from ..storage.base import BaseStore
from ..storage.keys import RESERVED_PREFIX, STAGING_PREFIX, check_key, is_staging_key, join
from .erasing import PendingErases

log = logging.getLogger(__name__)


# Chunks of arrays created through the mount aim at this many bytes, scaled with the array
# (the h5py/zarr-python heuristic): small arrays get 128 KiB chunks, large ones up to 64 MiB.
CHUNK_BASE_BYTES = 256 << 10
CHUNK_MIN_BYTES = 128 << 10
CHUNK_MAX_BYTES = 64 << 20
# At most this many groups are listed when a mount looks for staging areas: a hierarchy with
# more groups is checked in part (the groups found first), and the log says so.
SWEEP_MAX_GROUPS = 10_000
# Documents of every format with a document per node: a plain file under one of these names could
# make a reader (or format detection) take the directory for a node of that format.
FORMAT_DOCUMENT_NAMES = frozenset({".zarray", ".zgroup", ".zattrs", ".zmetadata", "zarr.json"})
# The temporary files Store.set_sync writes beside a key (local stores): never a plain file's name.
TEMPORARY_KEY_NAME = re.compile(r"\..*\.zarrfs-\d+-[0-9a-f]+\.tmp")
# A key component longer than this cannot be a file name on common file systems (NAME_MAX).
NAME_MAX_BYTES = 255


@dataclasses.dataclass(frozen=True, eq=False)
class StagedArray:
    """An array being created or replaced: its chunks go under `staging` until `commit`.

    `final` is what readers see once committed; `meta` is the same array with its chunk
    keys (and its engine path) under the staging prefix; `docs` are its metadata
    documents (store key -> bytes), written only by the commit.
    """

    final: ArrayMeta
    meta: ArrayMeta
    staging: str
    docs: dict[str, bytes]
    # Chunks written under their final keys (a new array on an object store): the staging area
    # holds only DIRECT_MARKER, naming where they go, until the documents are written.
    direct: bool = False
    # The keys under the array's path, listed beside the first chunks of a direct write (a
    # replacement's old keys; maybe some of its own chunks, and keys a writer that died left).
    found: concurrent.futures.Future[list[str]] | None = None
    # Grid indices of the chunks a direct write stored (the engine's write-back adds each one
    # it stores, and takes away one it finds all fill value): keys of its encoding that the
    # listing found and it did not store are not its own, and go before its documents.
    stored: set[Index] = dataclasses.field(default_factory=set)


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


def parse_json(key: str, raw: bytes | None) -> Any:
    """A metadata document's JSON (old writers' bare NaN/Infinity accepted), or MetadataError."""
    if raw is None:
        return None
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise MetadataError(f"{key}: malformed JSON: {e}") from None
    except RecursionError:
        raise MetadataError(f"{key}: JSON nested too deeply") from None


def json_object(key: str, raw: bytes | None) -> dict[str, Any] | None:
    doc = parse_json(key, raw)
    if doc is not None and not isinstance(doc, dict):
        raise MetadataError(f"{key}: expected a JSON object, got {type(doc).__name__}")
    return doc


def broken(path: str, kind: str, key: str, error: BaseException) -> BrokenNode:
    """The BrokenNode of a node whose documents could not be fetched or used.

    Any exception counts (a store refusal, malformed or absurd metadata, a parser's
    RecursionError): one bad node fails alone, its listing's siblings stay usable.
    """
    if not isinstance(error, ZarrfsError):
        error = MetadataError(f"{key}: {type(error).__name__}: {error}")
    return BrokenNode(path, kind, key, error)


def consolidated_path(path: str, where: str) -> str | None:
    """A node path named by consolidated metadata, checked like a listed key; None (logged) if hostile."""
    try:
        return check_key(path)
    except MetadataError as e:
        log.warning("%s: ignoring an entry of the consolidated metadata: %s", where, e)
        return None


def root_zarr_json_sync(store: BaseStore) -> dict[str, Any] | None:
    """The store's root `zarr.json` (v3 and the v3 drafts tell themselves apart by it), if usable."""
    try:
        return json_object("zarr.json", store.get_sync("zarr.json"))
    except MetadataError:
        return None


def common_plain_name_problem(name: str) -> str | None:
    """Why no format keeps a plain file under `name`: every format's document names (format
    detection looks for them) and the mount's own temporary names (None: no such reason)."""
    if name in FORMAT_DOCUMENT_NAMES:
        return "the name of a metadata document"
    if name.startswith(RESERVED_PREFIX) or TEMPORARY_KEY_NAME.fullmatch(name):
        return "a name zarrfs keeps for its own temporary keys"
    return None


class Hierarchy(abc.ABC):
    """A Zarr hierarchy in one format. Methods are synchronous: they do store I/O."""

    name: ClassVar[str]

    def __init__(self, store: BaseStore) -> None:
        self.store = store
        # Replaced arrays' old keys being erased after the new array was published
        self.erases = PendingErases()

    @classmethod
    @abc.abstractmethod
    def detect_sync(cls, store: BaseStore) -> bool:
        """Whether the store holds a hierarchy of this format (looking at its documents)."""

    @classmethod
    @abc.abstractmethod
    def open_sync(cls, store: BaseStore, options: Any = None) -> Self:
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

    def array_docs(self, path: str, new: NewArray) -> tuple[dict[str, bytes], ArrayMeta]:
        """The metadata documents (key -> bytes) of a new array and what readers will see.

        Pure: raises (Unsupported, InvalidArgument, UserError) for a data type, codec or
        path the format cannot hold, before anything in the store changes.
        """
        raise Unsupported(f"creating arrays in {self.name} hierarchies is not supported")

    def create_array_sync(self, path: str, new: NewArray) -> ArrayMeta:
        """Write a new array's documents at once (no staging)."""
        docs, meta = self.array_docs(path, new)
        self.write_array_docs_sync(path, docs)
        return meta

    def write_array_docs_sync(self, path: str, docs: dict[str, bytes]) -> None:
        for key, value in docs.items():
            self.store.set_sync(key, value)
        self.after_change_sync()

    # --- names ----------------------------------------------------------------------------

    #: sibling names must differ under case-insensitive comparison (the protocol draft)
    case_insensitive: ClassVar[bool] = False

    def name_problem(self, name: str) -> str | None:
        """Why a node may not be called `name` in this format (None: it may)."""
        if not name or name in (".", "..") or "/" in name or "\\" in name or "\0" in name:
            return "not a node name"
        if name.startswith(RESERVED_PREFIX):
            return f"names starting with {RESERVED_PREFIX!r} are reserved by zarrfs"
        if name in self.doc_names:
            return "the name of a metadata document"
        return None

    #: whether files that are no arrays are kept as store keys in their group's directory
    keeps_plain_files: ClassVar[bool] = False
    #: whether a store whose root is an array keeps plain files at its root (beside the
    #: array's own keys, which its erasure and replacement then leave alone)
    plain_files_beside_root_array: ClassVar[bool] = False

    def plain_name_problem(self, name: str) -> str | None:
        """Why a plain file (not an array) may not be kept under `name` (None: it may)."""
        return f"{self.name} hierarchies keep no files other than NAME.npy arrays"

    def plain_dir(self, group: str) -> str:
        """The store prefix holding the plain files of the group at `group`."""
        return group

    def stored_components(self, name: str) -> list[str]:
        """The key components a node called `name` is stored under (its directory, its documents)."""
        return [name]

    def check_name(self, name: str, siblings: Iterable[str] = ()) -> None:
        """Refuse a new node name before anything is written: InvalidArgument, NameTooLong."""
        problem = self.name_problem(name)
        if problem is not None:
            raise InvalidArgument(f"{name!r}: {problem} ({self.name})")
        longest = max(len(c.encode("utf-8", "surrogateescape")) for c in self.stored_components(name))
        if longest > NAME_MAX_BYTES:
            raise NameTooLong(f"{name!r}: its store key component would be {longest} bytes (at most {NAME_MAX_BYTES})")
        if self.case_insensitive:
            folded = name.casefold()
            clash = next((s for s in siblings if s != name and s.casefold() == folded), None)
            if clash is not None:
                raise InvalidArgument(
                    f"{name!r}: sibling {clash!r} differs only in case; {self.name} "
                    f"requires case-insensitively unique sibling names"
                )

    # --- staged arrays: all-or-nothing create and replace ----------------------------------

    def staging_dir(self, group: str) -> str:
        """The store prefix holding the staging areas of arrays written into `group`."""
        return group

    def staging_dirs(self, max_groups: int = SWEEP_MAX_GROUPS) -> Iterator[str]:
        """The store prefixes that may hold staging areas: one per group, found from the root down."""
        stack, seen = [""], 0
        while stack and seen < max_groups:
            group = stack.pop()
            seen += 1
            yield self.staging_dir(group)
            if not group and not isinstance(self.node_sync(""), GroupMeta):
                break  # a root array (every v1 store): its directories are chunks, not groups
            stack.extend(sorted((c.path for c in self.children_sync(group) if isinstance(c, GroupMeta)), reverse=True))
        if stack:
            log.info("looked for staging areas in the first %d groups only", max_groups)

    def staging_prefix(self, path: str, token: str) -> str:
        """Where chunks of the array being written at `path` go until it is committed."""
        return join(self.staging_dir(path.rpartition("/")[0]), STAGING_PREFIX + token)

    def stage_array(self, path: str, new: NewArray, writer: str = "") -> StagedArray:
        """Plan a new array at `path` (pure: every check before the store changes); the
        staging area's name starts with WRITER, the id of the daemon's lease."""
        docs, final = self.array_docs(path, new)
        token = secrets.token_hex(8)
        staging = self.staging_prefix(path, f"{writer}-{token}" if writer else token)
        keys = dataclasses.replace(final.keys, prefix=staging)
        meta = dataclasses.replace(final, path=staging, keys=keys, inner=None, source=None)
        return StagedArray(final, meta, staging, docs)

    def commit_array_sync(self, staged: StagedArray, old: Node | None) -> None:
        """Make a staged array the node at its path, replacing `old`.

        This generic commit moves keys: the chunks first, then the old array's other keys
        are removed, then the documents are written, the metadata document last; readers
        see the old array until the chunks start to move. Formats with directories per
        node override it on local stores with one directory swap.
        """
        final = staged.final
        moved: list[str] = []
        try:
            sizes = self.store.sizes_below_sync(staged.staging)
            moves = {join(staged.staging, rel): join(final.keys.prefix, rel) for rel in sizes}
            moved = list(moves.values())
            # Copies made by the store itself, many at once (a local store: renames)
            self.store.move_many_sync(moves, {join(staged.staging, rel): n for rel, n in sizes.items()})
            keep = set(moved) | set(staged.docs)
            if old is not None:
                gone = [key for key in self.node_keys_sync(old) if key not in keep and not is_staging_key(key)]
                self.store.erase_many_sync(gone)
            for key in sorted(staged.docs, key=lambda k: k == final.metadata_key):
                self.store.set_sync(key, staged.docs[key])
        except ZarrfsError:
            if old is None:  # nothing was there: take the partial copy away again
                self.store.erase_many_sync(moved)
            self.store.erase_below_sync(staged.staging)
            raise
        if self.store.is_local:  # the directories the renames left
            self.store.erase_below_sync(staged.staging)
        self.after_change_sync()

    def begin_array_sync(self, staged: StagedArray, old: Node | None) -> StagedArray:
        """Where a staged array's chunks go, decided once its staging area is claimed: under the
        staging prefix here; formats override it (NodeDocsHierarchy: a new array on an object
        store goes straight under its final keys)."""
        return staged

    def discard_staging_sync(self, staged: StagedArray) -> None:
        """Drop what a staged array wrote (a copy that failed or stopped short)."""
        self.store.erase_below_sync(staged.staging)

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
        self.erases.wait_for(node.path)
        for key in self.node_keys_sync(node):
            self.store.erase_sync(key)
        self.after_change_sync()

    def move_node_sync(self, node: Node, new_path: str, message: str = "") -> None:
        """Copy every key of a node to its new place, then remove the old keys (MESSAGE: what a
        versioned store's commit of the move says).

        The old name disappears only once the new one is complete: a failure part-way
        leaves the original whole (and maybe a partial copy, which the next try replaces).
        """
        if not node.path:
            raise Unsupported("the root cannot be moved")
        if self.node_sync(new_path) is not None:
            raise Unsupported(f"{new_path} exists")
        self.erases.wait_for(node.path)
        self.erases.wait_for(new_path)
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

    def after_change_sync(self) -> None:  # noqa: B027 (a hook: most formats have nothing to do)
        """Called after metadata changed (formats with consolidated metadata refresh it)."""

    def chunk_sizes_sync(self, meta: ArrayMeta) -> dict[str, int | None]:
        """Stored chunk keys of an array with their sizes, from one recursive listing."""
        prefix = meta.keys.prefix
        out = {}
        for rel, size in self.store.sizes_below_sync(prefix).items():
            if rel.rsplit("/", 1)[-1] in self.doc_names or is_staging_key(rel):
                continue
            if not prefix and not meta.keys.is_key(rel):  # plain files beside a root array's chunks
                continue
            out[join(prefix, rel)] = size
        return out
