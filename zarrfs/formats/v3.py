"""Zarr v3 (final spec): a `zarr.json` per node, chunk key encodings, codecs, consolidated metadata."""

from __future__ import annotations

import dataclasses
import json
import logging
from typing import Any, Self

from .. import dtypes
from ..codecs.adapters import (
    BLOSC_SHUFFLE_NAMES,
    BytesBytes,
    NumcodecsArray,
    NumcodecsArrayBytes,
    blosc_shuffle,
    compressor_config,
    numcodecs_codec,
)
from ..codecs.chain import (
    ArrayArrayCodec,
    BytesBytesCodec,
    BytesLayout,
    CodecChain,
    Transpose,
    UnusableChain,
    transpose_order,
)
from ..codecs.sharding import ShardingIndexed
from ..codecs.vlen import vlen_step
from ..errors import MetadataError, UnknownCodec, Unsupported, UserError
from ..model import ArrayMeta, GroupMeta, NewArray, Node, fill_fields, ints
from ..options import Options
from ..storage.base import BaseStore
from ..storage.keys import ChunkKeys, join
from . import vlen
from .base import consolidated_path, guess_chunks, json_object, root_zarr_json_sync
from .nodedocs import NodeDocsHierarchy

log = logging.getLogger(__name__)

ARRAY_FIELDS = {
    "zarr_format",
    "node_type",
    "shape",
    "data_type",
    "chunk_grid",
    "chunk_key_encoding",
    "fill_value",
    "codecs",
    "attributes",
    "dimension_names",
    "storage_transformers",
}
GROUP_FIELDS = {"zarr_format", "node_type", "attributes", "consolidated_metadata"}


class V3Hierarchy(NodeDocsHierarchy):
    name = "v3"
    consolidated_key = "zarr.json"  # where consolidated metadata lives (read at open, and after metadata_ttl)
    doc_names = ("zarr.json",)

    @classmethod
    def detect_sync(cls, store: BaseStore) -> bool:
        doc = root_zarr_json_sync(store)
        return doc is not None and doc.get("zarr_format") == 3

    @classmethod
    def open_sync(cls, store: BaseStore, options: Options | None = None) -> Self:
        root = json_object("zarr.json", store.get_sync("zarr.json")) or {}
        if root.get("node_type") == "group":
            # The root group is the mount: one it must not read refuses the mount (docs/SEMANTICS.md).
            try:
                check_fields(root, GROUP_FIELDS, "zarr.json")
            except Unsupported as e:
                raise UserError(f"{store.source}: {e}") from None
        cm = root.get("consolidated_metadata")
        consolidated = None
        if isinstance(cm, dict) and cm.get("kind", "inline") == "inline" and isinstance(cm.get("metadata"), dict):
            consolidated = {"": {"zarr.json": root}}
            for path, doc in cm["metadata"].items():
                if path and consolidated_path(path, "zarr.json") is not None:  # the root is not its own entry
                    consolidated[path] = {"zarr.json": doc}
                elif not path:
                    log.warning("zarr.json: ignoring an entry of the consolidated metadata: empty path")
        return cls(store, consolidated)

    def kind_guess(self, docs: dict[str, Any]) -> str:
        doc = docs.get("zarr.json") or {}
        return "array" if doc.get("node_type") == "array" else "group"

    def kind_of_doc(self, name: str) -> str:
        return "group"

    # --- writes ---------------------------------------------------------------------------

    def create_group_sync(self, path: str) -> GroupMeta:
        self.write_docs_sync(path, {"zarr.json": {"zarr_format": 3, "node_type": "group", "attributes": {}}})
        return GroupMeta(path, {}, self.name, join(path, "zarr.json"))

    def name_problem(self, name: str) -> str | None:
        """Zarr v3 core spec, "Node names": not empty, no `/`, not only periods, and
        "must not start with the reserved prefix `__`"."""
        if name.startswith("__"):
            return "names starting with '__' are reserved by the v3 spec"
        if name and set(name) == {"."}:
            return "a name of periods only"
        return super().name_problem(name)

    def array_docs(self, path: str, new: NewArray) -> tuple[dict[str, bytes], ArrayMeta]:
        data_type, endian = dtypes.v3_dtype_json(new.dtype)
        codecs: list[dict[str, Any]] = [{"name": "bytes", "configuration": {"endian": endian}}]
        compressor = compressor_config(new.codec, "zstd", new.dtype.itemsize)
        if compressor is not None:
            codecs.append(v3_codec_json(compressor, new.dtype.itemsize))
        doc = {
            "zarr_format": 3,
            "node_type": "array",
            "shape": list(new.shape),
            "data_type": data_type,
            "chunk_grid": {
                "name": "regular",
                "configuration": {"chunk_shape": list(new.chunks or guess_chunks(new.shape, new.dtype.itemsize))},
            },
            "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
            "fill_value": dtypes.fill_to_json(new.fill, new.dtype),
            "codecs": codecs,
            "attributes": dict(new.attributes),
        }
        if new.dimension_names is not None:
            doc["dimension_names"] = list(new.dimension_names)
        meta = parse_array(path, doc, doc["attributes"])
        return self.dump_docs(path, {"zarr.json": doc}), meta

    def with_separator(self, path: str, docs: dict[str, bytes], sep: str) -> tuple[dict[str, bytes], ArrayMeta]:
        """A new array's documents (from `array_docs`) with chunk keys separated by SEP."""
        doc = json.loads(docs[join(path, "zarr.json")])
        doc["chunk_key_encoding"] = {"name": "default", "configuration": {"separator": sep}}
        return self.dump_docs(path, {"zarr.json": doc}), parse_array(path, doc, doc["attributes"])

    def set_attributes_sync(self, node: Node, attributes: dict[str, Any]) -> Node:
        key = join(node.path, "zarr.json")
        doc = json_object(key, self.store.get_sync(key))
        if doc is None:  # an implicit group gets a document of its own
            doc = {"zarr_format": 3, "node_type": "group"}
        doc["attributes"] = attributes
        self.write_docs_sync(node.path, {"zarr.json": doc})
        return dataclasses.replace(node, attributes=attributes)

    def write_consolidated_sync(self) -> None:
        if self.consolidated is None:
            return
        root = dict((self.consolidated.get("") or {}).get("zarr.json") or {"zarr_format": 3, "node_type": "group"})
        metadata = {
            path: docs["zarr.json"]
            for path, docs in sorted(self.consolidated.items())
            if path and docs.get("zarr.json") is not None
        }
        root["consolidated_metadata"] = {"kind": "inline", "must_understand": False, "metadata": metadata}
        self.store.set_sync("zarr.json", (json.dumps(root, indent=2) + "\n").encode())

    def parse_docs(self, path: str, docs: dict[str, Any]) -> Node | None:
        doc = docs.get("zarr.json")
        if doc is None:
            return None
        key = join(path, "zarr.json")
        if doc.get("zarr_format") != 3:
            raise MetadataError(f"{key}: zarr_format {doc.get('zarr_format')!r} is not 3")
        attrs = doc.get("attributes") or {}
        if not isinstance(attrs, dict):
            raise MetadataError(f"{key}: attributes must be a JSON object")
        kind = doc.get("node_type")
        if kind == "group":
            check_fields(doc, GROUP_FIELDS, key)
            return GroupMeta(path, attrs, self.name, key)
        if kind == "array":
            meta = parse_array(path, doc, attrs)
            return vlen.resolve_sync(self.store, meta, self.chunk_sizes_sync) if vlen.is_vlen(meta) else meta
        raise MetadataError(f"{key}: unknown node_type {kind!r}")


def v3_codec_json(config: dict[str, Any], itemsize: int) -> dict[str, Any]:
    """The v3 `codecs` entry of a numcodecs compressor config."""
    conf = {k: v for k, v in config.items() if k != "id"}
    if config["id"] == "blosc":
        shuffle = BLOSC_SHUFFLE_NAMES[conf.get("shuffle", 1)]
        return {"name": "blosc", "configuration": {**conf, "shuffle": shuffle, "typesize": itemsize}}
    if config["id"] == "zstd":
        return {"name": "zstd", "configuration": {"level": conf.get("level", 0), "checksum": False}}
    if config["id"] == "gzip":
        return {"name": "gzip", "configuration": conf}
    return {"name": f"numcodecs.{config['id']}", "configuration": conf}


def _extension_ok(name: str, value: Any) -> bool:
    """Unknown fields may be ignored only when they say `must_understand: false`."""
    return isinstance(value, dict) and value.get("must_understand") is False


def check_fields(doc: dict[str, Any], known: set[str], key: str) -> None:
    """Refuse a node document with an unknown field that does not say `must_understand: false`.

    The v3 spec: implementations must fail to open a node with such a field (zarr-python 3
    refuses every unknown field of a group, even one that may be ignored).
    """
    for field in doc:
        if field not in known and not _extension_ok(field, doc[field]):
            raise Unsupported(f"{key}: unknown field {field!r} that must be understood")


def chunk_keys(path: str, encoding: Any, key: str) -> ChunkKeys:
    if encoding is None:
        encoding = {"name": "default"}
    if not isinstance(encoding, dict):
        raise MetadataError(f"{key}: bad chunk_key_encoding {encoding!r}")
    name, conf = encoding.get("name"), encoding.get("configuration") or {}
    if name == "default":
        sep = conf.get("separator", "/")
        if sep not in ("/", "."):
            raise MetadataError(f"{key}: bad separator {sep!r}")
        return ChunkKeys(path, sep, "c" + sep, "c")
    if name == "v2":
        sep = conf.get("separator", ".")
        if sep not in ("/", "."):
            raise MetadataError(f"{key}: bad separator {sep!r}")
        return ChunkKeys(path, sep, "", "0")
    raise Unsupported(f"{key}: unknown chunk_key_encoding {name!r}")


def parse_array(path: str, doc: dict[str, Any], attrs: dict[str, Any]) -> ArrayMeta:
    """An ArrayMeta from a final-v3 array `zarr.json`."""
    key = join(path, "zarr.json")
    check_fields(doc, ARRAY_FIELDS, key)
    if doc.get("storage_transformers"):
        raise Unsupported(f"{key}: storage transformers {doc['storage_transformers']!r} not supported")
    try:
        shape = ints(doc["shape"], "shape", key)
        grid = doc["chunk_grid"]
        if not isinstance(grid, dict) or grid.get("name") != "regular":
            raise Unsupported(f"{key}: chunk grid {grid!r} is not `regular`")
        chunks = ints((grid.get("configuration") or {}).get("chunk_shape"), "chunk_shape", key)
        if isinstance(doc["data_type"], str) and doc["data_type"] in VLEN_DATA_TYPES:
            return _vlen_array(path, doc, attrs, shape, chunks, key)
        dtype = dtypes.v3_dtype(doc["data_type"])
        try:
            codec = v3_chain(doc["codecs"], len(shape), key)
        except UnknownCodec as e:  # listed with its metadata; reads fail with this error
            codec = UnusableChain(error=e, description=tuple(doc["codecs"]))
        fill = fill_fields(doc["fill_value"], dtype, dtypes.fill_value)
    except KeyError as e:
        raise MetadataError(f"{key}: missing field {e}") from None
    names = doc.get("dimension_names")
    return ArrayMeta(
        path=path,
        shape=shape,
        dtype=dtype,
        chunk_shape=chunks,
        codec=codec,
        **fill,
        keys=chunk_keys(path, doc.get("chunk_key_encoding"), key),
        attributes=attrs,
        format="v3",
        metadata_key=key,
        dimension_names=tuple(names) if isinstance(names, list) else None,
    ).with_inner_reads()


# zarr-python 3's variable-length types and the array->bytes codec each must have.
VLEN_DATA_TYPES = {"string": "vlen-utf8", "variable_length_bytes": "vlen-bytes", "bytes": "vlen-bytes"}


def _vlen_array(
    path: str, doc: dict[str, Any], attrs: dict[str, Any], shape: tuple[int, ...], chunks: tuple[int, ...], key: str
) -> ArrayMeta:
    """A `string` / `bytes` array: codecs vlen-utf8 or vlen-bytes, then bytes->bytes codecs."""
    codecs = doc["codecs"]
    first = codecs[0].get("name") if isinstance(codecs, list) and codecs and isinstance(codecs[0], dict) else None
    if first != VLEN_DATA_TYPES[doc["data_type"]]:
        raise Unsupported(
            f"{key}: data type {doc['data_type']!r} with codecs {codecs!r}: only "
            f"{VLEN_DATA_TYPES[doc['data_type']]} first is readable"
        )
    rest = v3_chain([{"name": "bytes"}, *codecs[1:]], len(shape), key)
    if rest.array_array or not isinstance(rest.array_bytes, BytesLayout):
        raise Unsupported(f"{key}: codecs after {first} must be bytes->bytes codecs")
    names = doc.get("dimension_names")
    return vlen.placeholder(
        path,
        shape,
        chunks,
        vlen_step(first, "C", key),
        rest.bytes_bytes,
        doc["fill_value"],
        keys=chunk_keys(path, doc.get("chunk_key_encoding"), key),
        attributes=attrs,
        format="v3",
        metadata_key=key,
        dimension_names=tuple(names) if isinstance(names, list) else None,
    )


# ---------------------------------------------------------------------------------------
# Codecs: the `codecs` list of an array document

# numcodecs ids by the role zarr-python 3 gives them under `numcodecs.<id>` in v3 metadata.
ARRAY_ARRAY_IDS = {"delta", "bitround", "fixedscaleoffset", "quantize", "packbits", "astype"}
ARRAY_BYTES_IDS = {"pcodec", "zfpy"}
# The index codecs of `sharding_indexed` when the document names none.
DEFAULT_INDEX_CODECS = [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}]


def _numcodecs(name: str, config: dict[str, Any], where: str) -> Any:
    """The numcodecs codec of a v3 codec entry that is not one of the core array codecs."""
    if name == "blosc":
        conf = {
            "id": "blosc",
            "cname": config.get("cname", "lz4"),
            "clevel": config.get("clevel", 5),
            "shuffle": blosc_shuffle(config.get("shuffle", "noshuffle")),
            "blocksize": config.get("blocksize", 0),
            "typesize": config.get("typesize"),
        }  # the element size to shuffle by when encoding
        return numcodecs_codec(conf, where)
    if name == "gzip":
        return numcodecs_codec({"id": "gzip", "level": config.get("level", 5)}, where)
    if name == "zstd":
        return numcodecs_codec(
            {"id": "zstd", "level": config.get("level", 0), "checksum": config.get("checksum", False)}, where
        )
    if name == "crc32c":
        return numcodecs_codec({"id": "crc32c"}, where)
    if name.startswith("numcodecs."):
        return numcodecs_codec({"id": name[len("numcodecs.") :], **config}, where)
    raise UnknownCodec(f"unknown codec {name!r} in {where}")


def _sharding(config: dict[str, Any], ndim: int, where: str) -> ShardingIndexed:
    try:
        inner = tuple(int(c) for c in config["chunk_shape"])
    except (KeyError, TypeError, ValueError):
        raise MetadataError(f"sharding_indexed without a valid chunk_shape in {where}") from None
    location = config.get("index_location", "end")
    if location not in ("start", "end"):
        raise MetadataError(f"bad index_location {location!r} in {where}")
    index_codecs = config.get("index_codecs") or DEFAULT_INDEX_CODECS
    return ShardingIndexed(
        inner, v3_chain(config.get("codecs"), ndim, where), v3_chain(index_codecs, ndim + 1, where), location == "end"
    )


def _stage(name: str, config: dict[str, Any], ndim: int, where: str) -> Any:
    """One codec of the chain, in its role."""
    if name == "transpose":
        return Transpose(transpose_order(config.get("order"), ndim, where))
    if name in ("bytes", "endian"):
        return BytesLayout(config.get("endian", "little"), "C")
    if name == "sharding_indexed":
        return _sharding(config, ndim, where)
    codec = _numcodecs(name, config, where)
    short = name[len("numcodecs.") :] if name.startswith("numcodecs.") else ""
    if short in ARRAY_ARRAY_IDS:
        return NumcodecsArray(codec, name)
    if short in ARRAY_BYTES_IDS:
        return NumcodecsArrayBytes(codec, name)
    return BytesBytes(codec, name, where)


def v3_chain(codecs: Any, ndim: int, where: str) -> CodecChain:
    """A chain from a final-v3 `codecs` list, each codec checked to stand in its role's place."""
    if not isinstance(codecs, list) or not codecs:
        raise MetadataError(f"`codecs` must be a non-empty list in {where}")
    array_array: list[ArrayArrayCodec] = []
    array_bytes = None
    bytes_bytes: list[BytesBytesCodec] = []
    for item in codecs:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise MetadataError(f"bad codec entry {item!r} in {where}")
        name = item["name"]
        stage = _stage(name, item.get("configuration") or {}, ndim, where)
        if isinstance(stage, (Transpose, NumcodecsArray)):
            if array_bytes is not None:
                raise MetadataError(f"array->array codec {name!r} after the array->bytes codec in {where}")
            array_array.append(stage)
        elif isinstance(stage, BytesBytes):
            if array_bytes is None:
                raise MetadataError(f"bytes->bytes codec {name!r} before the array->bytes codec in {where}")
            bytes_bytes.append(stage)
        else:
            if array_bytes is not None:
                raise MetadataError(f"two array->bytes codecs in {where}")
            array_bytes = stage
    if array_bytes is None:
        raise MetadataError(f"no array->bytes codec (such as `bytes`) in {where}")
    return CodecChain(tuple(array_array), array_bytes, tuple(bytes_bytes))
