"""Reading v3 draft documents of all three generations: groups, arrays, data types, fill values, codecs."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from typing import Any

import numpy as np

from ... import dtypes
from ...codecs.adapters import BytesBytes, blosc_shuffle, numcodecs_codec
from ...codecs.chain import BytesLayout, CodecChain, Transpose, transpose_order
from ...errors import MetadataError, UnknownCodec, Unsupported, ZarrfsError
from ...model import ArrayMeta, GroupMeta, fill_fields, ints
from ...storage.chunksource import ShardedChunks
from ...storage.keys import ChunkKeys, join
from .layout import _CODEC_RE, _CORE_RE, _PROTOCOL_RE, _SHARDING_RE, Layout, unknown_extensions

log = logging.getLogger(__name__)

# Data type extensions zarr 2.12-2.18 writes, with a numpy descr as `type` and no fallback.
_NUMPY_TYPE_EXTENSIONS = re.compile(
    r"(core-protocol-v3\.0-dev/protocol/extensions/[a-z-]*dtypes/"  # complex
    r"|zarr-specs\.readthedocs\.io/en/latest/extensions/data-types/datetime/"  # datetime64, timedelta64
    r"|^TODO: [a-z ]*array protocol URL$)"
)  # bytestring, unicode, structured
# Data type strings of the protocol draft (and of the May 2022 draft's own examples).
_TYPESTR_RE = re.compile(r"^[<>|]?(b1|[iu][1248]|f[248]|c(8|16))$")

# Names an array document may hold: the union over the drafts (May 2022: codecs;
# zarr 2.18: compressor; protocol draft: zarr_format, chunk_codecs). Anything else
# refuses the array, as the May 2022 draft requires ("must fail to open").
ARRAY_FIELDS = {
    "shape",
    "data_type",
    "chunk_grid",
    "chunk_memory_layout",
    "fill_value",
    "extensions",
    "attributes",
    "codecs",
    "storage_transformers",
    "compressor",
    "zarr_format",
    "chunk_codecs",
}
# zarr 2.18 also writes `dimension_separator` when it was given at creation (it reads
# `chunk_grid.separator` and ignores this copy); only the `meta/root` layout takes it.
PROTOCOL_ARRAY_FIELDS = ARRAY_FIELDS | {"dimension_separator"}
GROUP_FIELDS = {"attributes", "zarr_format", "extensions"}


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


def parse_array(
    path: str, doc: dict[str, Any], key: str, layout: Layout, warn: Callable[[str], None] = log.warning
) -> ArrayMeta:
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
        fill = fill_fields(doc["fill_value"], dtype, lambda value, dt: draft_fill_value(value, dt, key))
        if doc["fill_value"] is None and layout.family == "core" and not isinstance(doc["data_type"], dict):
            # "For any data type, the fill_value is required. The literal null is not
            # permitted" (May 2022); an extension data type interprets its own fill value.
            raise MetadataError(
                f"{key}: fill_value null is not permitted for a core data type (core draft of May 2022)"
            )
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
    return ArrayMeta(
        path=path,
        shape=shape,
        dtype=dtype,
        chunk_shape=chunks,
        codec=codec,
        **fill,
        keys=keys,
        attributes=attrs,
        format="v3-draft",
        metadata_key=key,
        source=source,
    )


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
        warn(
            f"{where}: data type extension {uri} ({spec.get('type')!r}) not understood; "
            f"reading it as its fallback {candidate!r}"
        )
        return dtype
    raise Unsupported(f"{where}: data type extension {uri} ({spec.get('type')!r}) not understood and no known fallback")


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
        conf["shuffle"] = blosc_shuffle(conf.get("shuffle", 1))
    try:
        codec = numcodecs_codec(conf, where)
    except UnknownCodec:
        raise UnknownCodec(f"{where}: unknown or invalid codec {name} {config!r}") from None
    return BytesBytes(codec, name, where)


def v2_filters(filters: Any, where: str) -> list[BytesBytes]:
    """numcodecs filters as zarr 2.18 lists them in `attributes.filters`."""
    if not isinstance(filters, list):
        raise MetadataError(f"{where}: attributes.filters must be a list of numcodecs configurations")
    out = []
    for f in filters:
        if not isinstance(f, dict) or not isinstance(f.get("id"), str):
            raise MetadataError(f"{where}: bad filter {f!r} in attributes.filters")
        out.append(BytesBytes(numcodecs_codec(f, where), f["id"], where))
    return out


def core_chain(codecs: Any, ndim: int, order: str, where: str) -> CodecChain:
    """A chain from a May 2022 `codecs` list over a chunk in `order` (C or F memory layout).

    The F layout reverses the dimensions before the first codec; it and the `transpose`
    codecs that follow compose into one permutation. `endian` is the array->bytes step
    (without it the elements keep the data type's byte order, little-endian for core
    names); every other codec works on bytes through numcodecs.
    """
    if not isinstance(codecs, list):
        raise MetadataError(f"{where}: `codecs` must be a list")
    perm = list(transpose_order(order, ndim, where))
    layout: BytesLayout | None = None
    steps: list[BytesBytes] = []
    for entry in codecs:
        name, config = _codec_entry(entry, where)
        if name == "transpose":
            if layout is not None or steps:
                raise MetadataError(f"{where}: transpose after a bytes codec")
            p = transpose_order(config.get("order"), ndim, where)
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
