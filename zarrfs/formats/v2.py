"""Zarr v2: `.zarray`, `.zgroup`, `.zattrs`, consolidated `.zmetadata`; chunk keys `i.j` or `i/j`."""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
from typing import Any, Self

from .. import dtypes
from ..codecs.adapters import BytesBytes, compressor_config, numcodecs_codec
from ..codecs.chain import BytesLayout, CodecChain, UnusableChain
from ..codecs.vlen import VLEN_KINDS, vlen_step
from ..errors import MetadataError, UnknownCodec, Unsupported
from ..model import ArrayMeta, GroupMeta, NewArray, Node, fill_fields, ints
from ..options import Options
from ..storage.base import BaseStore
from ..storage.keys import ChunkKeys, join
from . import vlen
from .base import consolidated_path, guess_chunks, json_object
from .datasets import V2_DIMENSIONS_ATTR
from .nodedocs import NodeDocsHierarchy

log = logging.getLogger(__name__)


class V2Hierarchy(NodeDocsHierarchy):
    name = "v2"
    consolidated_key = ".zmetadata"  # where consolidated metadata lives (read at open, and after metadata_ttl)
    doc_names = (".zarray", ".zgroup", ".zattrs")

    @classmethod
    def detect_sync(cls, store: BaseStore) -> bool:
        files, _ = store.list_dir_sync("")
        if {".zarray", ".zgroup", ".zmetadata"} & set(files):
            return True
        raw = store.get_many_sync([".zgroup", ".zarray", ".zmetadata"])
        return any(v is not None for v in raw.values())

    @classmethod
    def open_sync(cls, store: BaseStore, options: Options | None = None) -> Self:
        raw = store.get_sync(".zmetadata")
        consolidated: dict[str, dict[str, Any]] | None = None
        if raw is not None:
            try:
                doc = json_object(".zmetadata", raw) or {}
                meta = doc.get("metadata")
                if not isinstance(meta, dict):
                    raise MetadataError(".zmetadata: no `metadata` object")
                consolidated = {}
                for key, value in meta.items():
                    path, _, name = key.rpartition("/")
                    if name in cls.doc_names and consolidated_path(key, ".zmetadata") is not None:
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
        doc = {
            "zarr_format": 2,
            "shape": list(new.shape),
            "chunks": list(new.chunks or guess_chunks(new.shape, new.dtype.itemsize)),
            "dtype": dtypes.v2_dtype_json(new.dtype),
            "compressor": compressor_config(new.codec, "blosc", new.dtype.itemsize),
            "fill_value": None if new.fill_null else dtypes.fill_to_json(new.fill, new.dtype),
            "order": "C",
            "filters": None,
            "dimension_separator": ".",
        }
        attrs = dict(new.attributes)
        if new.dimension_names is not None:
            attrs[V2_DIMENSIONS_ATTR] = list(new.dimension_names)
        meta = parse_array(path, doc, attrs)
        return self.dump_docs(path, {".zarray": doc, **({".zattrs": attrs} if attrs else {})}), meta

    def with_separator(self, path: str, docs: dict[str, bytes], sep: str) -> tuple[dict[str, bytes], ArrayMeta]:
        """A new array's documents (from `array_docs`) with chunk keys separated by SEP."""
        doc = json.loads(docs[join(path, ".zarray")])
        doc["dimension_separator"] = sep
        attrs = json.loads(docs[join(path, ".zattrs")]) if join(path, ".zattrs") in docs else {}
        return self.dump_docs(path, {".zarray": doc, **({".zattrs": attrs} if attrs else {})}), parse_array(
            path, doc, attrs
        )

    def set_attributes_sync(self, node: Node, attributes: dict[str, Any]) -> Node:
        self.write_docs_sync(node.path, {".zattrs": attributes})
        return dataclasses.replace(node, attributes=attributes)

    def write_consolidated_sync(self) -> None:
        if self.consolidated is None:
            return
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
            meta = parse_array(path, docs[".zarray"], attrs)
            return vlen.resolve_sync(self.store, meta, self.chunk_sizes_sync) if vlen.is_vlen(meta) else meta
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
        if doc["dtype"] == "|O":
            return _vlen_array(path, doc, attrs, shape, chunks, key)
        dtype = dtypes.v2_dtype(doc["dtype"])
    except KeyError as e:
        raise MetadataError(f"{key}: missing field {e}") from None
    order = doc.get("order", "C")
    sep = _separator(doc, key)
    try:
        codec = v2_chain(doc.get("compressor"), doc.get("filters"), order, key)
    except UnknownCodec as e:  # listed with its metadata; reads fail with this error
        codec = UnusableChain(
            error=e,
            description=v2_description(doc.get("compressor"), doc.get("filters"), order),
            layout_order=order if order in ("C", "F") else "C",
        )
    return ArrayMeta(
        path=path,
        shape=shape,
        dtype=dtype,
        chunk_shape=chunks,
        codec=codec,
        keys=ChunkKeys(path, sep, "", "0"),
        attributes=attrs,
        format="v2",
        metadata_key=key,
        **fill_fields(doc.get("fill_value"), dtype, functools.partial(dtypes.fill_value, legacy=True)),
    )


def _separator(doc: dict[str, Any], key: str) -> str:
    sep = doc.get("dimension_separator") or "."
    if sep not in (".", "/"):
        raise MetadataError(f"{key}: bad dimension_separator {sep!r}")
    return sep


def _vlen_array(
    path: str, doc: dict[str, Any], attrs: dict[str, Any], shape: tuple[int, ...], chunks: tuple[int, ...], key: str
) -> ArrayMeta:
    """An object array whose first filter is vlen-utf8 or vlen-bytes (its width still to be found)."""
    filters = doc.get("filters") or []
    first = filters[0].get("id") if filters and isinstance(filters[0], dict) else None
    if first not in VLEN_KINDS:
        raise Unsupported(
            f"{key}: data type '|O' with filters {filters!r}: only vlen-utf8 and vlen-bytes object arrays are readable"
        )
    order = doc.get("order", "C")
    rest = v2_chain(doc.get("compressor"), filters[1:], order, key)
    return vlen.placeholder(
        path,
        shape,
        chunks,
        vlen_step(first, order, key),
        rest.bytes_bytes,
        doc.get("fill_value"),
        keys=ChunkKeys(path, _separator(doc, key), "", "0"),
        attributes=attrs,
        format="v2",
        metadata_key=key,
    )


def v2_description(compressor: Any, filters: Any, order: str) -> list[dict[str, Any]]:
    """The codecs of v1/v2 metadata as CodecChain.describe shows them, straight from the document."""
    steps = [*(filters if isinstance(filters, list) else []), *([compressor] if compressor is not None else [])]
    return [
        {"name": "bytes", "configuration": {"order": order}},
        *({"name": s.get("id") if isinstance(s, dict) else None, "configuration": s} for s in steps),
    ]


def v2_chain(compressor: Any, filters: Any, order: str, where: str) -> CodecChain:
    """A chain for v1/v2: filters, then the compressor, over the raw element bytes in `order`."""
    steps = []
    for f in filters or []:
        if not isinstance(f, dict) or "id" not in f:
            raise MetadataError(f"bad filter {f!r} in {where}")
        steps.append(BytesBytes(numcodecs_codec(f, where), f["id"], where))
    if compressor is not None:
        if not isinstance(compressor, dict) or "id" not in compressor:
            raise MetadataError(f"bad compressor {compressor!r} in {where}")
        steps.append(BytesBytes(numcodecs_codec(compressor, where), compressor["id"], where))
    if order not in ("C", "F"):
        raise MetadataError(f"bad order {order!r} in {where}")
    return CodecChain((), BytesLayout(None, "F" if order == "F" else "C"), tuple(steps))
