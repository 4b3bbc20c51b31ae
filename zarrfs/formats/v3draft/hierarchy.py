"""V3DraftHierarchy: nodes, listings and writes of a hierarchy in one of the v3 draft layouts."""

from __future__ import annotations

import dataclasses
import logging
import re
from typing import Any

from ...errors import (
    Exists,
    InvalidArgument,
    MetadataError,
    NotFound,
    Unsupported,
    UserError,
    ZarrfsError,
)
from ...model import ArrayMeta, GroupMeta, NewArray, Node
from ...options import Options
from ...storage.base import BaseStore
from ...storage.keys import join
from ..base import (
    Hierarchy,
    StagedArray,
    broken,
    common_plain_name_problem,
    json_object,
    root_zarr_json_sync,
)
from .documents import parse_array, parse_group
from .layout import Layout, entry_point_layout
from .writing import core_array_doc, dump_doc, protocol_array_doc

log = logging.getLogger(__name__)

# "Node names" of both drafts: characters in the sets a-z, A-Z, 0-9, -_.
_NODE_NAME_RE = re.compile(r"[A-Za-z0-9._-]+")


class V3DraftHierarchy(Hierarchy):
    """A hierarchy in one of the v3 draft layouts (or none: `layout` None means no draft entry point)."""

    name = "v3-draft"

    def __init__(self, store: BaseStore, layout: Layout | None) -> None:
        super().__init__(store)
        self.layout = layout
        self._warned: set[str] = set()

    @classmethod
    def detect_sync(cls, store: BaseStore) -> bool:
        doc = root_zarr_json_sync(store)
        return doc is not None and isinstance(doc.get("zarr_format"), str)

    @classmethod
    def open_sync(cls, store: BaseStore, options: Options | None = None) -> V3DraftHierarchy:
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
            if doc is None or self.layout is None:
                raise MetadataError(f"{key}: expected a JSON object, got null")
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

    # Plain files are keys in their group's `meta` directory (`meta/root/g/notes.txt`): both
    # drafts find children there by the `.array`/`.group` document suffixes alone, so readers
    # pass over them, and a group's move or erasure takes them along.
    keeps_plain_files = True

    def plain_name_problem(self, name: str) -> str | None:
        """Names a reader would take for a node's document (`x.array.json`, the core draft's
        root `group.json`) are refused, and every format's document names and the mount's own."""
        if self.layout is None:
            return "the store has no v3 draft entry point (zarr.json)"
        for kind in ("array", "group"):
            doc = f"{kind}{self.layout.suffix}"
            if name == doc or name.endswith("." + doc):
                return "a name a reader could take for a node's metadata document"
        return common_plain_name_problem(name)

    def plain_dir(self, group: str) -> str:
        return self.layout.meta_dir(group) if self.layout is not None else join("meta", group)

    def stored_components(self, name: str) -> list[str]:
        suffix = self.layout.suffix if self.layout is not None else ".json"
        return [name, f"{name}.array{suffix}", f"{name}.group{suffix}"]

    def staging_dir(self, group: str) -> str:
        """Beside the arrays' chunks under `data/`: the drafts list nodes under `meta/` only."""
        return join(self._writable_layout().data, group)

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
        stored = doc.get("attributes")
        old: dict[str, Any] = stored if isinstance(stored, dict) else {}
        if (
            kind == "array" and layout.family == "protocol" and "codecs" not in doc and "zarr_format" not in doc
        ):  # zarr 2.18's documents: filters are attributes
            if "filters" not in attrs and old.get("filters") is not None:
                attrs["filters"] = old["filters"]
            if attrs.get("filters") != old.get("filters"):
                raise InvalidArgument(
                    f"{node.path}: attributes.filters holds the array's numcodecs filters "
                    f"({old.get('filters')!r}); it cannot be changed through attributes"
                )
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
                return join(base, new_path) + "/" + key[len(prefix) :]
        raise MetadataError(f"{key} does not belong to {old_path}")

    def erase_node_sync(self, node: Node) -> None:
        """Remove a node: its own document first (it disappears at once), then the rest."""
        for key in reversed(self.node_keys_sync(node)):
            self.store.erase_sync(key)
        self.after_change_sync()
