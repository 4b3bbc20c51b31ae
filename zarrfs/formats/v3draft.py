"""Zarr v3 drafts: May 2022 core draft, zarr 2.12-2.18's `meta/root`, protocol-draft documents, sharding.

Three generations of pre-release v3 share one shape: an entry point `zarr.json` whose
`zarr_format` is a URI string, metadata documents under `meta/`, chunks under `data/`.

- Core draft of May 2022 (`https://purl.org/zarr/spec/core/3.0`): `meta/group.json` or
  `meta/array.json` for the root, `meta/P.group.json` / `meta/P.array.json` for the node at
  path P, chunks `data/P/c0/1` (the grid's `separator`, default `/`; `c` for 0-d), a
  `codecs` list of `{"type": URI, "configuration": {...}}`, `metadata_encoding` an object
  holding the `metadata_key_suffix`.
- zarr-python 2.12-2.18 with ZARR_V3_EXPERIMENTAL_API (`.../protocol/core/3.0`): the same
  under `meta/root` (`meta/root.group.json`, `meta/root/P.array.json`) and `data/root/P/`,
  a top-level `metadata_key_suffix`, one `compressor` `{"codec": URI, "configuration"}`,
  numcodecs filters in `attributes.filters` (applied, and left in the attributes as zarr
  2.18 shows them), numpy type strings such as `<f8`, 0-d chunk key `c0`.
- Core protocol draft documents (they carry `zarr_format` themselves), read wherever a
  draft layout holds them: `chunk_codecs` of `{"codec": URI, ...inline configuration}`,
  chunk keys without the `c` prefix and with `.` as the default separator (`1.23.45`).

The sharding storage transformer (every spelling of its URI) makes a grid chunk an inner
chunk of a shard: see ShardedChunks.

Writes keep each family in its own format: under `meta/root` arrays are created as zarr
2.18 creates them (`compressor` object, numpy type strings, no compressor for 0-d), in a
May 2022 hierarchy as that draft's text says (`codecs` with `type` URIs, core data type
names, `endian` codec for big-endian elements). Groups are `{"attributes": {...}}` in
both. A node owns its document and everything under its `meta/P/` and `data/P/` prefixes:
that is what erasing and moving it touch. Inner chunks of shards are written by
rewriting their shard (ShardedChunks.write_sync).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import re
import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from .. import dtypes
from ..codecs import ABSENT, BytesBytes, BytesLayout, CodecChain, ShardingIndexed, Transpose, numcodecs_codec
from ..errors import (CorruptChunk, Exists, InvalidArgument, MetadataError, NotFound, UnknownCodec, Unsupported,
                      UserError, ZarrfsError)
from ..model import ArrayMeta, ChunkKeys, GroupMeta, NewArray, Node, ints, join
from ..options import Options
from ..store import Store
from .base import (STAGING_PREFIX, Hierarchy, StagedArray, broken, compressor_config, guess_chunks, json_object,
                   root_zarr_json_sync)

log = logging.getLogger(__name__)

CORE_URI = "https://purl.org/zarr/spec/core/3.0"
PROTOCOL_URI = "https://purl.org/zarr/spec/protocol/core/3.0"
# Same major version ("3"): the drafts say a reader may take any 3.x as compatible.
# The protocol draft spells its URI with http://, zarr 2.18 with https://.
_CORE_RE = re.compile(r"^https?://purl\.org/zarr/spec/core/3\.\d+/?$")
_PROTOCOL_RE = re.compile(r"^https?://purl\.org/zarr/spec/protocol/core/3\.\d+/?$")
# Codec URIs: `.../spec/codec/NAME/1.0` (zarr 2.18), `.../spec/codecs/NAME/1.0` (May 2022),
# `.../spec/codec/NAME` (protocol draft example).
_CODEC_RE = re.compile(r"^https?://purl\.org/zarr/spec/codecs?/([A-Za-z0-9_-]+)(?:/\d+(?:\.\d+)*)?/?$")
# The sharding transformer: `storage_transformers/sharding/1.0` (zarr 2.18, the drafts'
# purl) and the `storage-transformers` / singular spellings of the extension documents.
_SHARDING_RE = re.compile(r"storage[_-]?transformers?/sharding(?:/|$)")

# Data type extensions zarr 2.12-2.18 writes, with a numpy descr as `type` and no fallback.
_NUMPY_TYPE_EXTENSIONS = re.compile(
    r"(core-protocol-v3\.0-dev/protocol/extensions/[a-z-]*dtypes/"           # complex
    r"|zarr-specs\.readthedocs\.io/en/latest/extensions/data-types/datetime/"  # datetime64, timedelta64
    r"|^TODO: [a-z ]*array protocol URL$)")                                   # bytestring, unicode, structured
# Data type strings of the protocol draft (and of the May 2022 draft's own examples).
_TYPESTR_RE = re.compile(r"^[<>|]?(b1|[iu][1248]|f[248]|c(8|16))$")

# Names an array document may hold: the union over the drafts (May 2022: codecs;
# zarr 2.18: compressor; protocol draft: zarr_format, chunk_codecs). Anything else
# refuses the array, as the May 2022 draft requires ("must fail to open").
ARRAY_FIELDS = {"shape", "data_type", "chunk_grid", "chunk_memory_layout", "fill_value", "extensions",
                "attributes", "codecs", "storage_transformers", "compressor", "zarr_format", "chunk_codecs"}
# zarr 2.18 also writes `dimension_separator` when it was given at creation (it reads
# `chunk_grid.separator` and ignores this copy); only the `meta/root` layout takes it.
PROTOCOL_ARRAY_FIELDS = ARRAY_FIELDS | {"dimension_separator"}
GROUP_FIELDS = {"attributes", "zarr_format", "extensions"}
# "Node names" of both drafts: characters in the sets a-z, A-Z, 0-9, -_.
_NODE_NAME_RE = re.compile(r"[A-Za-z0-9._-]+")
# Codec names whose numcodecs configuration differs from the draft's.
_BLOSC_SHUFFLE = {"noshuffle": 0, "shuffle": 1, "bitshuffle": 2}


@dataclasses.dataclass(frozen=True)
class Layout:
    """Where a draft hierarchy keeps its documents and chunks."""

    family: str  # "core" (May 2022) or "protocol" (zarr 2.12-2.18 and older drafts)
    meta: str  # "meta" or "meta/root"
    data: str  # "data" or "data/root"
    suffix: str  # metadata key suffix, ".json" by default
    zero_d: str  # chunk key of a 0-d array: "c" (May 2022) or "c0" (zarr 2.18)

    def meta_key(self, path: str, kind: str) -> str:
        """Key of the `kind` ("array" or "group") document of the node at `path`."""
        if not path:
            return f"meta/{kind}{self.suffix}" if self.family == "core" else f"{self.meta}.{kind}{self.suffix}"
        return f"{self.meta}/{path}.{kind}{self.suffix}"

    def meta_dir(self, path: str) -> str:
        return join(self.meta, path)


class _ReadWriteLock:
    """Many readers or one writer (threads of this process)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._readers = 0
        self._writing = False
        self._writers_waiting = 0

    @contextlib.contextmanager
    def reading(self) -> Iterator[None]:
        with self._cond:
            while self._writing or self._writers_waiting:
                self._cond.wait()
            self._readers += 1
        try:
            yield
        finally:
            with self._cond:
                self._readers -= 1
                if not self._readers:
                    self._cond.notify_all()

    @contextlib.contextmanager
    def writing(self) -> Iterator[None]:
        with self._cond:
            self._writers_waiting += 1
            try:
                while self._writing or self._readers:
                    self._cond.wait()
            finally:
                self._writers_waiting -= 1
            self._writing = True
        try:
            yield
        finally:
            with self._cond:
                self._writing = False
                self._cond.notify_all()


# A shard is rewritten whole to change one inner chunk: writers of one shard take turns
# (the engine flushes inner chunks concurrently), and a reader's two ranged reads (index,
# then chunk) never straddle a rewrite. Locks are striped by shard key: bounded memory,
# and only shards sharing a stripe ever wait for each other.
_SHARD_LOCKS = tuple(_ReadWriteLock() for _ in range(128))


def _shard_lock(store: Any, key: str) -> _ReadWriteLock:
    return _SHARD_LOCKS[hash((getattr(store, "root", id(store)), key)) % len(_SHARD_LOCKS)]


@dataclasses.dataclass(frozen=True)
class ShardedChunks:
    """Grid chunks stored as inner chunks of shards (the drafts' sharding storage transformer).

    A shard's key is the chunk key of (chunk index // chunks_per_shard). A shard ends with
    an index of (offset, nbytes) little-endian uint64 pairs, one per inner chunk in C
    order over `chunks_per_shard`; 2^64-1 twice marks an absent chunk. Reading an inner
    chunk costs two ranged reads: the index (a suffix read) and the chunk's bytes.
    Writing one reads the whole shard and stores it again (see `write_sync`).
    """

    keys: ChunkKeys
    chunks_per_shard: tuple[int, ...]

    def key(self, idx: tuple[int, ...]) -> str:
        return self.keys.key(tuple(i // n for i, n in zip(idx, self.chunks_per_shard)))

    def _position(self, idx: tuple[int, ...]) -> int:
        """Index of grid chunk `idx` in its shard's index (C order over chunks_per_shard)."""
        local = tuple(i % n for i, n in zip(idx, self.chunks_per_shard))
        return int(np.ravel_multi_index(local, self.chunks_per_shard)) if local else 0

    def read_sync(self, store: Any, idx: tuple[int, ...]) -> bytes | None:
        """The encoded inner chunk at grid position `idx`, or None when it is not stored."""
        key = self.key(idx)
        with _shard_lock(store, key).reading():
            return self._read_unlocked(store, key, idx)

    def _entry_unlocked(self, store: Any, key: str, idx: tuple[int, ...]) -> tuple[int, int] | None:
        """(offset, nbytes) of inner chunk `idx` from its shard's index, or None when absent."""
        n_inner = math.prod(self.chunks_per_shard)
        index_nbytes = 16 * n_inner
        tail = store.get_suffix_sync(key, index_nbytes)
        if tail is None:
            return None
        if len(tail) < index_nbytes:
            raise CorruptChunk(f"shard {key}: {len(tail)} bytes, shorter than its index of {index_nbytes}")
        index = np.frombuffer(tail, dtype="<u8").reshape(n_inner, 2)
        try:
            return ShardingIndexed.entry(index, self._position(idx))
        except CorruptChunk as e:
            raise CorruptChunk(f"shard {key}: {e}") from None

    def stored_nbytes_sync(self, store: Any, idx: tuple[int, ...]) -> int:
        """Bytes the inner chunk at `idx` takes in its shard (0 when it is not stored)."""
        key = self.key(idx)
        with _shard_lock(store, key).reading():
            found = self._entry_unlocked(store, key, idx)
        return 0 if found is None else found[1]

    def _read_unlocked(self, store: Any, key: str, idx: tuple[int, ...]) -> bytes | None:
        found = self._entry_unlocked(store, key, idx)
        if found is None:
            return None
        offset, nbytes = found
        data = store.get_range_sync(key, offset, offset + nbytes)
        if len(data) != nbytes:
            raise CorruptChunk(f"shard {key}: inner chunk {idx} at {offset}+{nbytes} lies outside the shard")
        return data

    def write_sync(self, store: Any, idx: tuple[int, ...], data: bytes | None) -> None:
        """Store the encoded inner chunk at grid position `idx`, or drop it (None).

        The shard is read whole, the inner chunk replaced or dropped, and the shard stored
        again as its inner chunks back to back (C order over the shard) followed by a fresh
        index; a shard left with no inner chunk is erased. A shard that cannot be parsed is
        left as it is (CorruptChunk): its other inner chunks are not thrown away.
        """
        key = self.key(idx)
        n_inner = math.prod(self.chunks_per_shard)
        index_nbytes = 16 * n_inner
        with _shard_lock(store, key).writing():
            shard = store.get_sync(key, None)  # a whole shard: any size
            inner: list[bytes | None] = [None] * n_inner
            if shard is not None:
                shard = bytes(shard)
                if len(shard) < index_nbytes:
                    raise CorruptChunk(f"shard {key}: {len(shard)} bytes, shorter than its index of "
                                       f"{index_nbytes}; not rewriting it")
                body = len(shard) - index_nbytes
                index = np.frombuffer(shard, dtype="<u8", offset=body).reshape(n_inner, 2)
                for pos, (offset, nbytes) in enumerate(index.tolist()):
                    if offset == ABSENT and nbytes == ABSENT:
                        continue
                    if offset == ABSENT or nbytes == ABSENT or offset + nbytes > body:
                        raise CorruptChunk(f"shard {key}: bad index entry ({offset}, {nbytes}) at position "
                                           f"{pos}; not rewriting it")
                    inner[pos] = shard[offset:offset + nbytes]
            elif data is None:
                return  # nothing stored, nothing to store
            inner[self._position(idx)] = None if data is None else bytes(data)
            if all(chunk is None for chunk in inner):
                store.erase_sync(key)
                return
            index = np.full((n_inner, 2), ABSENT, dtype="<u8")
            parts, offset = [], 0
            for pos, chunk in enumerate(inner):
                if chunk is not None:
                    index[pos] = (offset, len(chunk))
                    parts.append(chunk)
                    offset += len(chunk)
            store.set_sync(key, b"".join(parts) + index.tobytes())


class V3DraftHierarchy(Hierarchy):
    """A hierarchy in one of the v3 draft layouts (or none: `layout` None means no draft entry point)."""

    name = "v3-draft"

    def __init__(self, store: Store, layout: Layout | None) -> None:
        super().__init__(store)
        self.layout = layout
        self._warned: set[str] = set()

    @classmethod
    def detect_sync(cls, store: Store) -> bool:
        doc = root_zarr_json_sync(store)
        return doc is not None and isinstance(doc.get("zarr_format"), str)

    @classmethod
    def open_sync(cls, store: Store, options: Options | None = None) -> V3DraftHierarchy:
        """Read the entry point; refuse (UserError) what the drafts say must stop processing."""
        try:
            doc = json_object("zarr.json", store.get_sync("zarr.json"))
        except MetadataError as e:
            raise UserError(f"{store.source}: {e}") from None
        if not isinstance(doc, dict) or not isinstance(doc.get("zarr_format"), str):
            return cls(store, None)  # no draft entry point: a hierarchy with no nodes
        return cls(store, entry_point_layout(doc, store.source))

    def warn_once(self, message: str) -> None:
        if message not in self._warned:
            self._warned.add(message)
            log.warning("%s", message)

    # --- nodes ------------------------------------------------------------------------

    def node_sync(self, path: str) -> Node | None:
        """The node at `path`; never raises: whatever fails makes it a BrokenNode."""
        try:
            return self._node_sync(path)
        except Exception as e:  # e.g. its meta directory cannot be listed
            return broken(path, "group", path or "/", e)

    def _node_sync(self, path: str) -> Node | None:
        if self.layout is None:
            return None
        array_key, group_key = self.layout.meta_key(path, "array"), self.layout.meta_key(path, "group")
        try:
            raw = self.store.get_many_sync([array_key, group_key])
        except Exception:  # one key failed: fetch them one by one to learn which
            raw = None
        for kind, key in (("array", array_key), ("group", group_key)):
            try:
                value = raw[key] if raw is not None else self.store.get_sync(key)
            except Exception as e:
                return broken(path, kind, key, e)
            if value is not None:
                return self._parse(path, kind, key, value)
        if path == "":
            return GroupMeta("", {}, self.name)  # the root always exists
        files, dirs = self.store.list_dir_sync(self.layout.meta_dir(path))
        return GroupMeta(path, {}, self.name) if files or dirs else None

    def children_sync(self, path: str) -> list[Node]:
        if self.layout is None:
            return []
        files, dirs = self.store.list_dir_sync(self.layout.meta_dir(path))
        found: dict[str, set[str]] = {name: {"dir"} for name in dirs}
        for fname in files:
            for kind in ("array", "group"):
                ending = f".{kind}{self.layout.suffix}"
                if fname.endswith(ending) and len(fname) > len(ending):
                    found.setdefault(fname[: -len(ending)], set()).add(kind)
        out: list[Node] = []
        for name in sorted(found):
            child = join(path, name)
            kinds = found[name]
            if "array" in kinds or "group" in kinds:
                kind = "array" if "array" in kinds else "group"
                key = self.layout.meta_key(child, kind)
                try:
                    raw = self.store.get_sync(key)
                except Exception as e:  # one bad node fails alone
                    out.append(broken(child, kind, key, e))
                    continue
                if raw is not None:
                    out.append(self._parse(child, kind, key, raw))
                    continue
            if "dir" in kinds:
                out.append(GroupMeta(child, {}, self.name))
        return out

    def _parse(self, path: str, kind: str, key: str, raw: bytes) -> Node:
        try:
            doc = json_object(key, raw)
            if kind == "group":
                return parse_group(path, doc, key, self.layout)
            return parse_array(path, doc, key, self.layout, self.warn_once)
        except Exception as e:
            return broken(path, kind, key, e)

    # --- writes: each family in its own format (see the "Writing" section below) --------

    def _writable_layout(self) -> Layout:
        if self.layout is None:
            raise Unsupported("the store has no v3 draft entry point (zarr.json): nothing can be written")
        return self.layout

    def _put_doc(self, key: str, doc: dict[str, Any]) -> None:
        self.store.set_sync(key, dump_doc(doc))

    def _is_group_sync(self, path: str) -> bool:
        """Whether a group (explicit, or implied by anything under its `meta` prefix) is at `path`."""
        layout = self._writable_layout()
        if self.store.get_sync(layout.meta_key(path, "group")) is not None:
            return True
        files, dirs = self.store.list_dir_sync(layout.meta_dir(path))
        return bool(files or dirs)

    def create_group_sync(self, path: str) -> GroupMeta:
        """An explicit group: `{"attributes": {}}`, the document both families write."""
        layout = self._writable_layout()
        if self.store.get_sync(layout.meta_key(path, "array")) is not None:
            raise Exists(f"{path}: an array has this path")
        key = layout.meta_key(path, "group")
        self._put_doc(key, {"attributes": {}})
        return GroupMeta(path, {}, self.name, key)

    def create_array_sync(self, path: str, new: NewArray) -> ArrayMeta:
        """An array document in the family's own format (zarr 2.18's, or the May 2022 draft's)."""
        if path and self._is_group_sync(path):
            raise Exists(f"{path}: a group has this path")
        return super().create_array_sync(path, new)

    def array_docs(self, path: str, new: NewArray) -> tuple[dict[str, bytes], ArrayMeta]:
        layout = self._writable_layout()
        doc = protocol_array_doc(new) if layout.family == "protocol" else core_array_doc(new)
        key = layout.meta_key(path, "array")
        meta = parse_array(path, doc, key, layout, self.warn_once)  # what readers will see, checked first
        return {key: dump_doc(doc)}, meta

    # --- names and staging ------------------------------------------------------------------

    @property
    def case_insensitive(self) -> bool:  # type: ignore[override]
        """The protocol draft ("Node names"): siblings unique under case-insensitive comparison."""
        return self.layout is not None and self.layout.family == "protocol"

    def name_problem(self, name: str) -> str | None:
        """Both drafts' "Node names": only `a-z A-Z 0-9 - _ .`, not periods only (the protocol
        draft also caps names at 255 characters, which the key length check covers)."""
        if not _NODE_NAME_RE.fullmatch(name):
            return "the v3 drafts allow only the characters a-z A-Z 0-9 - _ . in node names"
        if set(name) == {"."}:
            return "a name of periods only"
        return super().name_problem(name)

    def stored_components(self, name: str) -> list[str]:
        suffix = self.layout.suffix if self.layout is not None else ".json"
        return [name, f"{name}.array{suffix}", f"{name}.group{suffix}"]

    def staging_prefix(self, path: str, token: str) -> str:
        """Beside the array's chunks under `data/`: the drafts list nodes under `meta/` only."""
        layout = self._writable_layout()
        return join(layout.data, path.rpartition("/")[0], STAGING_PREFIX + token)

    def commit_array_sync(self, staged: StagedArray, old: Node | None) -> None:
        """On a local store: swap the chunk directories, then write the array document (the
        moment between the two is the commit window); elsewhere the generic key moves."""
        final = staged.final
        data = final.keys.prefix
        if not self.store.is_local or not final.path or (old is None and self.store.is_dir_sync(data)):
            super().commit_array_sync(staged, old)
            return
        self.store.swap_dirs_sync(staged.staging, data)
        try:
            for key, value in staged.docs.items():
                self.store.set_sync(key, value)
        except ZarrfsError:
            self.store.swap_dirs_sync(staged.staging, data)  # the old chunks back under the old document
            raise
        self.store.erase_below_sync(staged.staging)  # the old chunks, now under the staging name

    def set_attributes_sync(self, node: Node, attributes: dict[str, Any]) -> Node:
        """Replace a node's `attributes`; the rest of its document stays as it is.

        An implicit group gets a group document. zarr 2.18 keeps an array's numcodecs
        filters in `attributes.filters`: like zarr 2.18, the stored filters are kept when
        the new attributes leave them out, and changing them (which would change how the
        chunks decode) is refused.
        """
        layout = self._writable_layout()
        kind = "array" if node.kind == "array" else "group"
        key = layout.meta_key(node.path, kind)
        doc = json_object(key, self.store.get_sync(key))
        if doc is None:
            if kind == "array":
                raise NotFound(f"{key} is gone")
            doc = {"attributes": {}}
        attrs = dict(attributes)
        old = doc.get("attributes") if isinstance(doc.get("attributes"), dict) else {}
        if (kind == "array" and layout.family == "protocol" and "codecs" not in doc
                and "zarr_format" not in doc):  # zarr 2.18's documents: filters are attributes
            if "filters" not in attrs and old.get("filters") is not None:
                attrs["filters"] = old["filters"]
            if attrs.get("filters") != old.get("filters"):
                raise InvalidArgument(f"{node.path}: attributes.filters holds the array's numcodecs filters "
                                      f"({old.get('filters')!r}); it cannot be changed through attributes")
        doc["attributes"] = attrs
        self._put_doc(key, doc)
        return dataclasses.replace(node, attributes=attrs)

    def node_keys_sync(self, node: Node) -> list[str]:
        """A node's keys: data first, then the documents below it, its own document last.

        Moves copy in this order (the node appears only once everything is there) and
        erasures go the other way (the node disappears first). A group owns everything
        under its `meta` and `data` prefixes, as the May 2022 draft's "Erase a group" says.
        """
        layout = self._writable_layout()
        kind = "array" if node.kind == "array" else "group"
        own = layout.meta_key(node.path, kind)
        prefixes = [join(layout.data, node.path)]
        if kind == "group":
            prefixes.append(layout.meta_dir(node.path))
        keys: list[str] = []
        for prefix in prefixes:
            below = sorted(self.store.sizes_below_sync(prefix), key=lambda rel: (-rel.count("/"), rel))
            keys.extend(join(prefix, rel) for rel in below)
        keys = [k for k in dict.fromkeys(keys) if k != own and k != "zarr.json"]
        if self.store.get_sync(own) is not None:
            keys.append(own)
        return keys

    def relocate_key(self, key: str, old_path: str, new_path: str) -> str:
        layout = self._writable_layout()
        if not old_path or not new_path:
            raise Unsupported("the root cannot be moved, nor anything moved onto it")
        for kind in ("array", "group"):
            if key == layout.meta_key(old_path, kind):
                return layout.meta_key(new_path, kind)
        for base in (layout.data, layout.meta):
            prefix = join(base, old_path) + "/"
            if key.startswith(prefix):
                return join(base, new_path) + "/" + key[len(prefix):]
        raise MetadataError(f"{key} does not belong to {old_path}")

    def erase_node_sync(self, node: Node) -> None:
        """Remove a node: its own document first (it disappears at once), then the rest."""
        for key in reversed(self.node_keys_sync(node)):
            self.store.erase_sync(key)
        self.after_change_sync()


# ---------------------------------------------------------------------------------------
# Writing: array documents as each family writes them


def dump_doc(doc: dict[str, Any]) -> bytes:
    """A metadata document as zarr 2.18 serialises it (sorted keys, 4-space indent, ASCII)."""
    return json.dumps(doc, indent=4, sort_keys=True, ensure_ascii=True, separators=(",", ": ")).encode("ascii")


# zarr 2.18's data type extensions (meta.get_extended_dtype_info)
Z218_COMPLEX = ("https://zarr-specs.readthedocs.io/en/core-protocol-v3.0-dev/protocol/extensions/"
                "complex-dtypes/v1.0.html")
Z218_DATETIME = "https://zarr-specs.readthedocs.io/en/latest/extensions/data-types/datetime/v1.0.html"
_Z218_DATE_UNITS = {"Y", "M", "W", "D", "h", "m", "s", "ms", "us", "μs", "ns", "ps", "fs", "as"}
_CORE_NAMES = {np.dtype(v): k for k, v in dtypes.V3_NAMES.items() if v is not None}


def _grid(new: NewArray) -> tuple[list[int], dict[str, Any]]:
    chunks = list(new.chunks or guess_chunks(new.shape, new.dtype.itemsize))
    if len(chunks) != len(new.shape):
        raise InvalidArgument(f"chunks {chunks} do not fit shape {list(new.shape)}")
    return chunks, {"chunk_shape": chunks, "separator": "/", "type": "regular"}


def _fill(new: NewArray) -> np.ndarray:
    return np.asarray(new.fill_value if new.fill_value is not None else np.zeros((), new.dtype), dtype=new.dtype)


def zarr218_dtype_json(dtype: np.dtype) -> Any:
    """`data_type` as zarr 2.18 writes it (Metadata3.encode_dtype); Unsupported where it raises."""
    s = dtype.str
    if s in ("|b1", "|u1", "|i1"):
        return {"|b1": "bool", "|u1": "u1", "|i1": "i1"}[s]
    if re.fullmatch(r"[<>][uif][248]", s):
        return s
    if dtype.kind == "c" and dtype.itemsize in (8, 16):
        return {"extension": Z218_COMPLEX, "type": s, "fallback": None}
    if dtype.kind in "mM" and np.datetime_data(dtype)[0] in _Z218_DATE_UNITS and np.datetime_data(dtype)[1] == 1:
        return {"extension": Z218_DATETIME, "type": s, "fallback": None}
    if dtype.kind == "S":
        return {"extension": "TODO: bytestring array protocol URL", "type": s, "fallback": None}
    if dtype.kind == "U":
        return {"extension": "TODO: unicode array protocol URL", "type": s, "fallback": None}
    if dtype.kind == "V" and dtype.subdtype is None:
        # zarr 2.18 writes the descr list; for raw bytes (no fields) it reads `|V3` back the same
        type_ = dtypes.v2_dtype_json(dtype) if dtype.fields is not None else s
        return {"extension": "TODO: structured array protocol URL", "type": type_, "fallback": None}
    raise Unsupported(f"data type {dtype} cannot be written in zarr 2.18's v3 layout")


def protocol_array_doc(new: NewArray) -> dict[str, Any]:
    """An array document as zarr 2.18 writes under `meta/root` (its quirks included: no
    compressor for a 0-d array, chunk key `c0`; numpy type strings; `compressor` object)."""
    _, grid = _grid(new)
    doc: dict[str, Any] = {
        "attributes": {}, "chunk_grid": grid, "chunk_memory_layout": "C",
        "data_type": zarr218_dtype_json(new.dtype), "extensions": [],
        "fill_value": dtypes.fill_to_json(_fill(new), new.dtype), "shape": list(new.shape),
    }
    config = compressor_config(new.codec, "blosc", new.dtype.itemsize)
    if config is not None and new.shape:  # zarr 2.18 drops the compressor of 0-d arrays
        conf = {k: v for k, v in config.items() if k != "id"}
        doc["compressor"] = {"codec": f"https://purl.org/zarr/spec/codec/{config['id']}/1.0", "configuration": conf}
    return doc


def core_dtype_json(dtype: np.dtype) -> tuple[str, str | None]:
    """May 2022 `data_type` (a core name, or `r*` for raw bytes) and the endian codec's
    byte order when the elements are big-endian (None: little, the default)."""
    if dtype.kind == "V" and dtype.fields is None and dtype.subdtype is None:
        return f"r{8 * dtype.itemsize}", None
    big = dtype.str[0] == ">" and dtype.itemsize > 1
    base = dtype.newbyteorder("<") if dtype.byteorder in "<>=" else dtype
    name = _CORE_NAMES.get(base)
    if name is None:
        raise Unsupported(f"data type {dtype} has no core data type in the May 2022 v3 draft "
                          f"(bool, intN, uintN, floatN, complexN, r*)")
    return name, "big" if big else None


def core_fill_json(fill: np.ndarray, dtype: np.dtype) -> Any:
    """May 2022 `fill_value`: numbers and booleans, "NaN"/"+Infinity"/"-Infinity", `0x` bytes for `r*`."""
    value = np.asarray(fill, dtype=dtype)
    if dtype.kind == "V":
        return "0x" + value.tobytes().hex()
    if dtype.kind == "f":
        return dtypes.float_json(float(value[()]), "+Infinity")
    if dtype.kind == "c":  # the draft leaves it open; [real, imaginary] as the later spec writes it
        return [dtypes.float_json(float(v), "+Infinity") for v in (value[()].real, value[()].imag)]
    return dtypes.fill_to_json(value, dtype)


def core_array_doc(new: NewArray) -> dict[str, Any]:
    """An array document of the May 2022 core draft: `codecs` objects with `type` URIs."""
    _, grid = _grid(new)
    data_type, endian = core_dtype_json(new.dtype)
    codecs: list[dict[str, Any]] = []
    if endian is not None:
        codecs.append({"type": "https://purl.org/zarr/spec/codecs/endian/1.0", "configuration": {"endian": endian}})
    config = compressor_config(new.codec, "blosc", new.dtype.itemsize)
    if config is not None:
        conf = {k: v for k, v in config.items() if k != "id"}
        if config["id"] == "zstd":
            conf.setdefault("checksum", False)
        codecs.append({"type": f"https://purl.org/zarr/spec/codecs/{config['id']}/1.0", "configuration": conf})
    return {
        "attributes": {}, "chunk_grid": grid, "chunk_memory_layout": "C", "codecs": codecs,
        "data_type": data_type, "extensions": [], "fill_value": core_fill_json(_fill(new), new.dtype),
        "shape": list(new.shape),
    }


# ---------------------------------------------------------------------------------------
# Entry point


def entry_point_layout(doc: dict[str, Any], source: str) -> Layout:
    """The layout an entry point document describes; UserError for what must not be mounted."""
    fmt = doc["zarr_format"]
    if _CORE_RE.match(fmt):
        family = "core"
    elif _PROTOCOL_RE.match(fmt):
        family = "protocol"
    else:
        raise UserError(f"{source}: zarr.json has zarr_format {fmt!r}; zarrfs reads the v3 drafts "
                        f"{CORE_URI} and {PROTOCOL_URI}")
    suffix = ".json"
    encoding = doc.get("metadata_encoding")
    if isinstance(encoding, dict):
        if "extension" in encoding:
            raise UserError(f"{source}: zarr.json uses the metadata encoding extension "
                            f"{encoding['extension']!r}, which zarrfs does not understand")
        if encoding.get("type", "json") != "json":
            raise UserError(f"{source}: zarr.json: metadata encoding {encoding.get('type')!r} is not json")
        suffix = encoding.get("metadata_key_suffix", suffix)
    elif isinstance(encoding, str):
        # zarr 2.18 writes the protocol URI here, meaning its JSON encoding.
        if not (_PROTOCOL_RE.match(encoding) or _CORE_RE.match(encoding) or encoding == "json"):
            raise UserError(f"{source}: zarr.json: unknown metadata_encoding {encoding!r}")
    elif encoding is not None:
        raise UserError(f"{source}: zarr.json: bad metadata_encoding {encoding!r}")
    if not isinstance(encoding, dict) and "metadata_key_suffix" in doc:
        suffix = doc["metadata_key_suffix"]
    if not isinstance(suffix, str) or "/" in suffix:
        raise UserError(f"{source}: zarr.json: bad metadata_key_suffix {suffix!r}")
    try:
        for uri in unknown_extensions(doc.get("extensions"), "zarr.json"):
            log.info("%s: ignoring extension %s (must_understand: false)", source, uri)
    except Unsupported as e:
        raise UserError(f"{source}: {e}") from None
    except MetadataError as e:
        raise UserError(f"{source}: {e}") from None
    if family == "core":
        return Layout("core", "meta", "data", suffix, "c")
    return Layout("protocol", "meta/root", "data/root", suffix, "c0")


def unknown_extensions(extensions: Any, where: str) -> list[str]:
    """URIs of extensions that may be ignored; Unsupported names one that must be understood.

    zarrfs understands no generic extension, so every one is unknown. An entry without
    `must_understand` (the drafts require it) is taken as required.
    """
    if extensions is None:
        return []
    if not isinstance(extensions, list):
        raise MetadataError(f"{where}: `extensions` must be a list, got {extensions!r}")
    ignored = []
    for ext in extensions:
        if not isinstance(ext, dict) or not isinstance(ext.get("extension"), str):
            raise MetadataError(f"{where}: bad extension entry {ext!r}")
        if ext.get("must_understand", True) is not False:
            raise Unsupported(f"{where} requires extension {ext['extension']} (must_understand: true), "
                              f"which zarrfs does not understand")
        ignored.append(ext["extension"])
    return ignored


# ---------------------------------------------------------------------------------------
# Groups and arrays


def _attributes(doc: dict[str, Any], key: str) -> dict[str, Any]:
    attrs = doc.get("attributes")
    if attrs is None:
        return {}
    if not isinstance(attrs, dict):
        raise MetadataError(f"{key}: attributes must be a JSON object")
    return attrs


def _check_zarr_format(doc: dict[str, Any], key: str) -> bool:
    """Whether the document carries the protocol draft's own `zarr_format`."""
    if "zarr_format" not in doc:
        return False
    fmt = doc["zarr_format"]
    if isinstance(fmt, str) and _PROTOCOL_RE.match(fmt):
        return True
    if isinstance(fmt, str) and _CORE_RE.match(fmt):
        return False
    raise Unsupported(f"{key}: zarr_format {fmt!r} is not a v3 draft")


def parse_group(path: str, doc: dict[str, Any], key: str, layout: Layout) -> GroupMeta:
    unknown = sorted(set(doc) - GROUP_FIELDS)
    if unknown:
        raise Unsupported(f"{key}: unknown field(s) {', '.join(map(repr, unknown))} in a group document")
    _check_zarr_format(doc, key)
    unknown_extensions(doc.get("extensions"), key)
    return GroupMeta(path, _attributes(doc, key), "v3-draft", key)


def parse_array(path: str, doc: dict[str, Any], key: str, layout: Layout,
                warn: Callable[[str], None] = log.warning) -> ArrayMeta:
    """An ArrayMeta from a draft array document (any of the three generations)."""
    unknown = sorted(set(doc) - (PROTOCOL_ARRAY_FIELDS if layout.family == "protocol" else ARRAY_FIELDS))
    if unknown:
        raise Unsupported(f"{key}: unknown field(s) {', '.join(map(repr, unknown))} in an array document")
    protocol_doc = _check_zarr_format(doc, key)
    unknown_extensions(doc.get("extensions"), key)
    try:
        shape = ints(doc["shape"], "shape", key)
        dtype = draft_dtype(doc["data_type"], key, warn)
        grid = doc["chunk_grid"]
        fill = draft_fill_value(doc["fill_value"], dtype, key)
        if doc["fill_value"] is None and layout.family == "core" and not isinstance(doc["data_type"], dict):
            # "For any data type, the fill_value is required. The literal null is not
            # permitted" (May 2022); an extension data type interprets its own fill value.
            raise MetadataError(f"{key}: fill_value null is not permitted for a core data type "
                                f"(core draft of May 2022)")
    except KeyError as e:
        raise MetadataError(f"{key}: missing field {e}") from None
    if not isinstance(grid, dict):
        raise MetadataError(f"{key}: bad chunk_grid {grid!r}")
    if "extension" in grid:
        raise Unsupported(f"{key}: chunk grid extension {grid['extension']!r} not supported")
    if grid.get("type") != "regular":
        raise Unsupported(f"{key}: chunk grid type {grid.get('type')!r} is not `regular`")
    chunks = ints(grid.get("chunk_shape"), "chunk_shape", key)
    order = doc.get("chunk_memory_layout", "C")
    if isinstance(order, dict):
        raise Unsupported(f"{key}: chunk memory layout extension {order.get('extension')!r} not supported")
    if order not in ("C", "F"):
        raise MetadataError(f"{key}: bad chunk_memory_layout {order!r}")
    attrs = _attributes(doc, key)

    given = [name for name in ("codecs", "compressor", "chunk_codecs") if doc.get(name) is not None]
    if len(given) > 1:
        raise MetadataError(f"{key}: both {given[0]!r} and {given[1]!r} given")
    if given == ["codecs"]:
        codec = core_chain(doc["codecs"], len(shape), order, key)
    else:
        steps = []
        if layout.family == "protocol" and not protocol_doc and attrs.get("filters") is not None:
            steps += v2_filters(attrs["filters"], key)  # zarr 2.18 keeps filters among the attributes
        if given == ["compressor"]:
            steps.append(bytes_codec(doc["compressor"], key))
        elif given == ["chunk_codecs"]:
            if not isinstance(doc["chunk_codecs"], list):
                raise MetadataError(f"{key}: `chunk_codecs` must be a list")
            steps += [bytes_codec(c, key) for c in doc["chunk_codecs"]]
        codec = CodecChain((), BytesLayout(None, order), tuple(steps))

    if protocol_doc:  # the protocol draft: `1.23.45`, no `c` prefix
        sep, head, zero_d = grid.get("separator", "."), "", "0"
    else:
        sep, head, zero_d = grid.get("separator", "/"), "c", layout.zero_d
    if sep not in ("/", "."):
        raise MetadataError(f"{key}: bad chunk_grid separator {sep!r}")
    keys = ChunkKeys(join(layout.data, path), sep, head, zero_d)
    source = storage_transformers(doc.get("storage_transformers"), keys, len(shape), key)
    return ArrayMeta(path=path, shape=shape, dtype=dtype, chunk_shape=chunks, fill_value=fill, codec=codec,
                     keys=keys, attributes=attrs, format="v3-draft", metadata_key=key, source=source,
                     erase_fill_chunks=doc["fill_value"] is not None)


def storage_transformers(value: Any, keys: ChunkKeys, ndim: int, key: str) -> ShardedChunks | None:
    """The chunk source the transformers describe (None: one key per chunk); Unsupported otherwise."""
    if not value:
        return None
    if not isinstance(value, list):
        raise MetadataError(f"{key}: `storage_transformers` must be a list")
    if len(value) > 1:
        names = [t.get("extension") if isinstance(t, dict) else t for t in value]
        raise Unsupported(f"{key}: a stack of storage transformers {names!r} is not supported")
    st = value[0]
    uri = st.get("extension") if isinstance(st, dict) else None
    if not isinstance(uri, str):
        raise MetadataError(f"{key}: bad storage transformer {st!r}")
    if not _SHARDING_RE.search(uri):
        raise Unsupported(f"{key}: storage transformer {uri} is not supported")
    if st.get("type", "indexed") != "indexed":
        raise Unsupported(f"{key}: sharding transformer of type {st.get('type')!r} (only `indexed`) not supported")
    conf = st.get("configuration") or {}
    cps = conf.get("chunks_per_shard") if isinstance(conf, dict) else None
    if isinstance(cps, int) and not isinstance(cps, bool):
        cps = [cps] * ndim
    cps = ints(cps, "chunks_per_shard", key)
    if ndim == 0 and all(n == 1 for n in cps):
        cps = ()  # zarr 2.18 writes [1] for a 0-d array
    if len(cps) != ndim or any(n < 1 for n in cps):
        raise MetadataError(f"{key}: chunks_per_shard {list(cps)} does not fit {ndim} dimensions")
    return ShardedChunks(keys, cps)


# ---------------------------------------------------------------------------------------
# Data types and fill values


def draft_dtype(spec: Any, where: str, warn: Callable[[str], None] = log.warning) -> np.dtype:
    """The numpy dtype of a draft `data_type`: a core name, `r*`, a type string, or an extension object."""
    if isinstance(spec, str):
        if spec in dtypes.V3_NAMES or re.fullmatch(r"r\d+", spec):
            return dtypes.v3_dtype(spec)
        if spec == "bool" or _TYPESTR_RE.match(spec):
            text = spec if spec[0] in "<>|" or spec[-1] == "1" or spec == "bool" else "<" + spec
            return np.dtype(text)
        raise Unsupported(f"{where}: unknown data type {spec!r}")
    if not isinstance(spec, dict) or not isinstance(spec.get("extension"), str):
        raise MetadataError(f"{where}: bad data_type {spec!r}")
    uri = spec["extension"]
    if _NUMPY_TYPE_EXTENSIONS.search(uri) and "type" in spec:
        return dtypes.v2_dtype(spec["type"])
    fallback = spec.get("fallback")
    candidates = fallback if isinstance(fallback, list) else [] if fallback is None else [fallback]
    for candidate in candidates:
        try:
            dtype = draft_dtype(candidate, where, warn)
        except ZarrfsError:
            continue
        warn(f"{where}: data type extension {uri} ({spec.get('type')!r}) not understood; "
             f"reading it as its fallback {candidate!r}")
        return dtype
    raise Unsupported(f"{where}: data type extension {uri} ({spec.get('type')!r}) not understood "
                      f"and no known fallback")


def draft_fill_value(value: Any, dtype: np.dtype, where: str) -> np.ndarray:
    """The fill value as a 0-d array; `0x`/`0b` strings are bit patterns of the element.

    For integers and booleans the pattern is the number's bits (two's complement); for
    raw `r*` types the hex digits are the bytes in the order written. Everything else
    (numbers, "NaN", "+Infinity", "-Infinity", float bit patterns, base64) is dtypes'.
    """
    if isinstance(value, str) and value[:2] in ("0x", "0b") and dtype.fields is None and dtype.kind in "biuV":
        try:
            bits = int(value[2:], 16 if value[1] == "x" else 2)
        except ValueError:
            raise MetadataError(f"{where}: bad fill value {value!r}") from None
        if bits >= 1 << (8 * dtype.itemsize):
            raise MetadataError(f"{where}: fill value {value!r} does not fit {dtype}")
        if dtype.kind == "V":
            return np.array(np.frombuffer(bits.to_bytes(dtype.itemsize, "big"), dtype=dtype)[0], dtype=dtype)
        little = np.frombuffer(bits.to_bytes(dtype.itemsize, "little"), dtype=dtype.newbyteorder("<"))
        return np.array(little[0], dtype=dtype)
    try:
        return dtypes.fill_value(value, dtype)
    except ZarrfsError as e:
        raise type(e)(f"{where}: {e}") from None


# ---------------------------------------------------------------------------------------
# Codecs


def _codec_entry(entry: Any, where: str) -> tuple[str, dict[str, Any]]:
    """(codec name, configuration) of a codec object: `type` or `codec` URI, configuration
    in `configuration` or inline (protocol draft)."""
    if not isinstance(entry, dict):
        raise MetadataError(f"{where}: bad codec entry {entry!r}")
    uri = entry.get("type", entry.get("codec"))
    if not isinstance(uri, str):
        raise MetadataError(f"{where}: codec entry {entry!r} has no `type` or `codec` URI")
    m = _CODEC_RE.match(uri)
    if m is None:
        raise UnknownCodec(f"{where}: unknown codec {uri}")
    config = entry.get("configuration")
    if config is None:
        config = {k: v for k, v in entry.items() if k not in ("type", "codec")}
    if not isinstance(config, dict):
        raise MetadataError(f"{where}: bad configuration of codec {uri}")
    return m.group(1), config


def bytes_codec(entry: Any, where: str) -> BytesBytes:
    """A bytes->bytes codec (compressor, checksum) from a draft codec object, over numcodecs."""
    name, config = _codec_entry(entry, where)
    conf = {"id": name, **config}
    if name == "blosc":
        conf.pop("typesize", None)  # later blosc codec drafts; numcodecs derives it
        conf["shuffle"] = _BLOSC_SHUFFLE.get(conf.get("shuffle", 1), conf.get("shuffle", 1))
    try:
        codec = numcodecs_codec(conf, where)
    except UnknownCodec:
        raise UnknownCodec(f"{where}: unknown or invalid codec {name} {config!r}") from None
    return BytesBytes(codec, name)


def v2_filters(filters: Any, where: str) -> list[BytesBytes]:
    """numcodecs filters as zarr 2.18 lists them in `attributes.filters`."""
    if not isinstance(filters, list):
        raise MetadataError(f"{where}: attributes.filters must be a list of numcodecs configurations")
    out = []
    for f in filters:
        if not isinstance(f, dict) or not isinstance(f.get("id"), str):
            raise MetadataError(f"{where}: bad filter {f!r} in attributes.filters")
        out.append(BytesBytes(numcodecs_codec(f, where), f["id"]))
    return out


def _permutation(order: Any, ndim: int, where: str) -> list[int]:
    if order == "C":
        return list(range(ndim))
    if order == "F":
        return list(range(ndim))[::-1]
    if not isinstance(order, list) or sorted(order) != list(range(ndim)):
        raise MetadataError(f"{where}: bad transpose order {order!r}")
    return list(order)


def core_chain(codecs: Any, ndim: int, order: str, where: str) -> CodecChain:
    """A chain from a May 2022 `codecs` list over a chunk in `order` (C or F memory layout).

    The F layout reverses the dimensions before the first codec; it and the `transpose`
    codecs that follow compose into one permutation. `endian` is the array->bytes step
    (without it the elements keep the data type's byte order, little-endian for core
    names); every other codec works on bytes through numcodecs.
    """
    if not isinstance(codecs, list):
        raise MetadataError(f"{where}: `codecs` must be a list")
    perm = _permutation(order, ndim, where)
    layout: BytesLayout | None = None
    steps: list[BytesBytes] = []
    for entry in codecs:
        name, config = _codec_entry(entry, where)
        if name == "transpose":
            if layout is not None or steps:
                raise MetadataError(f"{where}: transpose after a bytes codec")
            p = _permutation(config.get("order"), ndim, where)
            perm = [perm[i] for i in p]
        elif name == "endian":
            if layout is not None or steps:
                raise MetadataError(f"{where}: endian after a bytes codec")
            endian = config.get("endian", "little")
            if endian not in ("little", "big"):
                raise MetadataError(f"{where}: bad endian {endian!r}")
            layout = BytesLayout(endian, "C")
        else:
            steps.append(bytes_codec(entry, where))
    array_array = () if perm == list(range(ndim)) else (Transpose(tuple(perm)),)
    return CodecChain(array_array, layout or BytesLayout(None, "C"), tuple(steps))
