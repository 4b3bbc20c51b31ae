"""Zarr v2: `.zarray`, `.zgroup`, `.zattrs`, consolidated `.zmetadata`; chunk keys `i.j` or `i/j`."""

from __future__ import annotations

import dataclasses
import json
import logging
from typing import Any

import numpy as np

from .. import dtypes
from ..codecs import v2_chain
from ..errors import MetadataError
from ..model import ArrayMeta, ChunkKeys, GroupMeta, NewArray, Node, ints, join
from ..options import Options
from ..store import Store
from .base import NodeDocsHierarchy, compressor_config, guess_chunks, json_object

log = logging.getLogger(__name__)


class V2Hierarchy(NodeDocsHierarchy):
    name = "v2"
    doc_names = (".zarray", ".zgroup", ".zattrs")

    @classmethod
    def detect_sync(cls, store: Store) -> bool:
        files, _ = store.list_dir_sync("")
        if {".zarray", ".zgroup", ".zmetadata"} & set(files):
            return True
        raw = store.get_many_sync([".zgroup", ".zarray", ".zmetadata"])
        return any(v is not None for v in raw.values())

    @classmethod
    def open_sync(cls, store: Store, options: Options | None = None) -> "V2Hierarchy":
        raw = store.get_sync(".zmetadata")
        consolidated = None
        if raw is not None:
            try:
                doc = json_object(".zmetadata", raw) or {}
                meta = doc.get("metadata")
                if not isinstance(meta, dict):
                    raise MetadataError(".zmetadata: no `metadata` object")
                consolidated = {}
                for key, value in meta.items():
                    path, _, name = key.rpartition("/")
                    if name in cls.doc_names:
                        consolidated.setdefault(path, {n: None for n in cls.doc_names})[name] = value
            except MetadataError as e:
                log.warning("ignoring consolidated metadata: %s", e)
                consolidated = None
        return cls(store, consolidated)

    def kind_of_doc(self, name: str) -> str:
        return "array" if name == ".zarray" else "group"

    def kind_guess(self, docs: dict[str, Any]) -> str:
        return "array" if docs.get(".zarray") is not None else "group"

    # --- writes ---------------------------------------------------------------------------

    def create_group_sync(self, path: str) -> GroupMeta:
        self.write_docs_sync(path, {".zgroup": {"zarr_format": 2}})
        return GroupMeta(path, {}, self.name, join(path, ".zgroup"))

    def name_problem(self, name: str) -> str | None:
        """zarr-python 2's normalize_storage_path reads `\\` as `/` and refuses `.` and `..`
        segments (all refused here); names of its documents would be read as documents."""
        if name == ".zmetadata":
            return "the name of the consolidated metadata document"
        return super().name_problem(name)

    def array_docs(self, path: str, new: NewArray) -> tuple[dict[str, bytes], ArrayMeta]:
        fill = new.fill_value if new.fill_value is not None else np.zeros((), new.dtype)
        doc = {
            "zarr_format": 2, "shape": list(new.shape),
            "chunks": list(new.chunks or guess_chunks(new.shape, new.dtype.itemsize)),
            "dtype": dtypes.v2_dtype_json(new.dtype),
            "compressor": compressor_config(new.codec, "blosc", new.dtype.itemsize),
            "fill_value": dtypes.fill_to_json(fill, new.dtype), "order": "C", "filters": None,
            "dimension_separator": ".",
        }
        meta = parse_array(path, doc, {})
        return self.dump_docs(path, {".zarray": doc}), meta

    def set_attributes_sync(self, node: Node, attributes: dict[str, Any]) -> Node:
        self.write_docs_sync(node.path, {".zattrs": attributes})
        return dataclasses.replace(node, attributes=attributes)

    def write_consolidated_sync(self) -> None:
        metadata = {}
        for path, docs in sorted(self.consolidated.items()):
            for name, doc in docs.items():
                if doc is not None:
                    metadata[join(path, name)] = doc
        body = {"zarr_consolidated_format": 1, "metadata": metadata}
        self.store.set_sync(".zmetadata", (json.dumps(body, indent=2) + "\n").encode())

    def parse_docs(self, path: str, docs: dict[str, Any]) -> Node | None:
        attrs = docs.get(".zattrs") or {}
        if not isinstance(attrs, dict):
            raise MetadataError(f"{join(path, '.zattrs')}: attributes must be a JSON object")
        if docs.get(".zarray") is not None:
            return parse_array(path, docs[".zarray"], attrs)
        if docs.get(".zgroup") is not None:
            return GroupMeta(path, attrs, self.name, join(path, ".zgroup"))
        return None


def parse_array(path: str, doc: dict[str, Any], attrs: dict[str, Any]) -> ArrayMeta:
    """An ArrayMeta from a `.zarray` document."""
    key = join(path, ".zarray")
    if doc.get("zarr_format", 2) != 2:
        raise MetadataError(f"{key}: zarr_format {doc.get('zarr_format')!r} is not 2")
    try:
        shape = ints(doc["shape"], "shape", key)
        chunks = ints(doc["chunks"], "chunks", key)
        dtype = dtypes.v2_dtype(doc["dtype"])
    except KeyError as e:
        raise MetadataError(f"{key}: missing field {e}") from None
    order = doc.get("order", "C")
    sep = doc.get("dimension_separator") or "."
    if sep not in (".", "/"):
        raise MetadataError(f"{key}: bad dimension_separator {sep!r}")
    codec = v2_chain(doc.get("compressor"), doc.get("filters"), order, key)
    return ArrayMeta(
        path=path, shape=shape, dtype=dtype, chunk_shape=chunks,
        fill_value=dtypes.fill_value(doc.get("fill_value"), dtype), codec=codec,
        keys=ChunkKeys(path, sep, "", "0"), attributes=attrs, format="v2", metadata_key=key,
        erase_fill_chunks=doc.get("fill_value") is not None)

