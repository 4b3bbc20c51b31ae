"""Zarr v3 drafts: May 2022 core draft, zarr 2.12-2.18's `meta/root`, protocol-draft documents, sharding.

Modules: layout (URIs, where documents and chunks live, the entry point), documents
(reading the three generations' documents), writing (documents as each family writes
them), hierarchy (V3DraftHierarchy: nodes, listings, writes).

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
chunk of a shard: see chunksource.ShardedChunks (sharding.py holds its index).

Writes keep each family in its own format: under `meta/root` arrays are created as zarr
2.18 creates them (`compressor` object, numpy type strings, no compressor for 0-d), in a
May 2022 hierarchy as that draft's text says (`codecs` with `type` URIs, core data type
names, `endian` codec for big-endian elements). Groups are `{"attributes": {...}}` in
both. A node owns its document and everything under its `meta/P/` and `data/P/` prefixes:
that is what erasing and moving it touch. Inner chunks of shards are written by
rewriting their shard (ShardedChunks.write_sync; the engine makes writes of one shard take turns).
"""

from ...storage.chunksource import ShardedChunks
from .documents import (
    bytes_codec,
    core_chain,
    draft_dtype,
    draft_fill_value,
    parse_array,
    parse_group,
    storage_transformers,
    v2_filters,
)
from .hierarchy import V3DraftHierarchy
from .layout import CORE_URI, PROTOCOL_URI, Layout, entry_point_layout, unknown_extensions
from .writing import core_array_doc, dump_doc, protocol_array_doc

__all__ = [
    "CORE_URI",
    "PROTOCOL_URI",
    "Layout",
    "ShardedChunks",
    "V3DraftHierarchy",
    "bytes_codec",
    "core_array_doc",
    "core_chain",
    "draft_dtype",
    "draft_fill_value",
    "dump_doc",
    "entry_point_layout",
    "parse_array",
    "parse_group",
    "protocol_array_doc",
    "storage_transformers",
    "unknown_extensions",
    "v2_filters",
]
