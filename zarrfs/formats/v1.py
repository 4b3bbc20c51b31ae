"""Zarr v1 (storage specification version 1): one array per store, keys `meta`, `attrs`, `i.j`."""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import re
from typing import Any

from .. import dtypes
from ..codecs.adapters import compressor_config
from ..codecs.chain import UnusableChain
from ..errors import MetadataError, UnknownCodec, Unsupported
from ..model import ArrayMeta, NewArray, Node, fill_fields, ints
from ..options import Options
from ..storage.base import BaseStore
from ..storage.keys import ChunkKeys
from .base import Hierarchy, broken, common_plain_name_problem, guess_chunks, json_object
from .v2 import v2_chain

log = logging.getLogger(__name__)

META_KEY, ATTRS_KEY = "meta", "attrs"
# The chunk key of a 0-d array. The v1 rule (indices joined with `.`) gives '' for the empty
# index, which is the store's root: zarr 1.1.0 derived '' and could not store it in a
# directory (IsADirectoryError; tests/fixtures/v1/README.md). zarr 2, whose key rule is the
# same, names the one chunk of a 0-d array `0`; zarrfs reads and writes it there.
ZERO_D_KEY = "0"
# Chunk keys: indices joined with `.` (`0` for a 0-d array's one chunk).
_CHUNK_KEY_RE = re.compile(r"\d+(\.\d+)*")


class V1Hierarchy(Hierarchy):
    """A v1 store: its only node is the root array."""

    name = "v1"
    doc_names = (META_KEY, ATTRS_KEY)

    def __init__(self, store: BaseStore, v1_order: str = "spec") -> None:
        super().__init__(store)
        self.v1_order = v1_order

    @classmethod
    def detect_sync(cls, store: BaseStore) -> bool:
        try:
            doc = json_object(META_KEY, store.get_sync(META_KEY))
        except MetadataError:
            return False
        return isinstance(doc, dict) and doc.get("zarr_format") == 1

    @classmethod
    def malformed_sync(cls, store: BaseStore) -> str | None:
        """Why the store's `meta` key cannot be read as JSON (`meta: malformed JSON: ...`), if it cannot.

        Detection skips such a store; this names the cause instead of "not a Zarr hierarchy".
        """
        try:
            json_object(META_KEY, store.get_sync(META_KEY))
        except MetadataError as e:
            return str(e)
        return None

    @classmethod
    def open_sync(cls, store: BaseStore, options: Options | None = None) -> V1Hierarchy:
        return cls(store, (options or Options()).v1_order)

    def node_sync(self, path: str) -> Node | None:
        if path:
            return None
        try:
            raw = self.store.get_many_sync([META_KEY, ATTRS_KEY])
            meta = json_object(META_KEY, raw[META_KEY])
            if meta is None:
                return None
            attrs = json_object(ATTRS_KEY, raw[ATTRS_KEY]) or {}
            return parse_array(meta, attrs, self.v1_order)
        except Exception as e:  # whatever fails makes the array a BrokenNode
            return broken("", "array", META_KEY, e)

    def children_sync(self, path: str) -> list[Node]:
        return []

    # --- writes: a v1 store holds one array, which can be rewritten or replaced ---------

    # Plain files are keys at the store's root beside `meta`, `attrs` and the chunks: a v1
    # reader fetches only those by name, so it never sees them.
    keeps_plain_files = True
    plain_files_beside_root_array = True

    def plain_name_problem(self, name: str) -> str | None:
        """The array's own keys (`meta`, `attrs`, chunk keys such as `0.1`) are refused, and
        every format's document names and the mount's own names."""
        if name in self.doc_names:
            return "a key of the v1 array itself"
        if _CHUNK_KEY_RE.fullmatch(name):
            return "a name a reader could take for a chunk key"
        return common_plain_name_problem(name)

    def node_keys_sync(self, node: Node) -> list[str]:
        """The array's keys: `meta`, `attrs` and chunk keys (plain files beside them stay)."""
        return [key for key in self.store.sizes_below_sync("") if key in self.doc_names or _CHUNK_KEY_RE.fullmatch(key)]

    def set_attributes_sync(self, node: Node, attributes: dict[str, Any]) -> Node:
        self.store.set_sync(ATTRS_KEY, json.dumps(attributes, indent=4, sort_keys=True).encode())
        return dataclasses.replace(node, attributes=attributes)

    def array_docs(self, path: str, new: NewArray) -> tuple[dict[str, bytes], ArrayMeta]:
        if path:
            raise Unsupported("a v1 store holds one array: only the root array can be replaced")
        config = compressor_config(new.codec, "blosc", new.dtype.itemsize)
        compression, opts = ("none", None) if config is None else _v1_compression(config)
        doc = {
            "zarr_format": 1,
            "shape": list(new.shape),
            "chunks": list(new.chunks or guess_chunks(new.shape, new.dtype.itemsize)),
            "dtype": dtypes.v2_dtype_json(new.dtype),
            "compression": compression,
            "compression_opts": opts,
            "fill_value": dtypes.fill_to_json(new.fill, new.dtype, bytes_as_text=True),
            "order": "C",
        }
        meta = parse_array(doc, {}, self.v1_order)
        return {ATTRS_KEY: b"{}", META_KEY: json.dumps(doc, indent=4, sort_keys=True).encode()}, meta


def _v1_compression(config: dict[str, Any]) -> tuple[str, Any]:
    """v1 `compression`, `compression_opts` of a numcodecs config (v1 knows four compressors)."""
    kind = config["id"]
    if kind == "blosc":
        return "blosc", {"cname": config["cname"], "clevel": config["clevel"], "shuffle": config["shuffle"]}
    if kind in ("zlib", "bz2"):
        return kind, config["level"]
    if kind == "lzma":
        return "lzma", {"format": 1, "check": -1, "preset": config.get("preset"), "filters": None}
    raise Unsupported(f"v1 stores know none, zlib, bz2, lzma and blosc, not {kind}")


def v1_compressor_config(compression: Any, opts: Any) -> dict[str, Any] | None:
    """The numcodecs config of a v1 `compression` / `compression_opts` pair."""
    if compression in (None, "none"):
        return None
    if compression in ("zlib", "gzip"):  # gzip is the writer's alias of zlib (a zlib stream)
        return {"id": "zlib", "level": 1 if opts is None else int(opts)}
    if compression == "bz2":
        return {"id": "bz2", "level": 1 if opts is None else int(opts)}
    if compression == "lzma":
        opts = opts or {}
        fmt = opts.get("format", 1)
        # Only raw streams (format 3) need the filter chain to decode; containers carry it.
        return {
            "id": "lzma",
            "format": fmt,
            "check": opts.get("check", -1),
            "preset": opts.get("preset"),
            "filters": opts.get("filters") if fmt == 3 else None,
        }
    if compression == "blosc":
        opts = opts or {}
        return {
            "id": "blosc",
            "cname": opts.get("cname", "lz4"),
            "clevel": opts.get("clevel", 5),
            "shuffle": opts.get("shuffle", 1),
        }
    raise Unsupported(f"{META_KEY}: unknown compression {compression!r}")


def parse_array(doc: dict[str, Any], attrs: dict[str, Any], v1_order: str) -> ArrayMeta:
    if not isinstance(attrs, dict):
        raise MetadataError(f"{ATTRS_KEY}: attributes must be a JSON object")
    try:
        shape = ints(doc["shape"], "shape", META_KEY)
        chunks = ints(doc["chunks"], "chunks", META_KEY)
        dtype = dtypes.v2_dtype(doc["dtype"])
        compression = doc["compression"]
        order = doc.get("order", "C")
    except KeyError as e:
        raise MetadataError(f"{META_KEY}: missing field {e}") from None
    # zarr 1.1.0, the one real writer, laid out F-order chunks in F order only with blosc.
    stored_order = order if v1_order == "spec" or compression == "blosc" else "C"
    try:
        codec = v2_chain(v1_compressor_config(compression, doc.get("compression_opts")), None, stored_order, META_KEY)
    except (UnknownCodec, Unsupported) as e:  # listed with its metadata; reads fail with this error
        description = [
            {"name": "bytes", "configuration": {"order": stored_order}},
            {"name": compression, "configuration": doc.get("compression_opts")},
        ]
        codec = UnusableChain(
            error=UnknownCodec(str(e)),
            description=description,
            layout_order=stored_order if stored_order in ("C", "F") else "C",
        )
    return ArrayMeta(
        path="",
        shape=shape,
        dtype=dtype,
        chunk_shape=chunks,
        codec=codec,
        keys=ChunkKeys("", ".", "", ZERO_D_KEY),
        attributes=attrs,
        format="v1",
        metadata_key=META_KEY,
        **fill_fields(
            doc.get("fill_value"), dtype, functools.partial(dtypes.fill_value, bytes_as_text=True, legacy=True)
        ),
    )
