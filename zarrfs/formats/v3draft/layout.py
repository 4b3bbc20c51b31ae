"""The v3 drafts' shared parts: URIs, where documents and chunks live (Layout), the entry point, extensions."""

from __future__ import annotations

import dataclasses
import logging
import re
from typing import Any

from ...errors import MetadataError, Unsupported, UserError
from ...storage.keys import join

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
        raise UserError(
            f"{source}: zarr.json has zarr_format {fmt!r}; zarrfs reads the v3 drafts {CORE_URI} and {PROTOCOL_URI}"
        )
    suffix = ".json"
    encoding = doc.get("metadata_encoding")
    if isinstance(encoding, dict):
        if "extension" in encoding:
            raise UserError(
                f"{source}: zarr.json uses the metadata encoding extension "
                f"{encoding['extension']!r}, which zarrfs does not understand"
            )
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
            raise Unsupported(
                f"{where} requires extension {ext['extension']} (must_understand: true), "
                f"which zarrfs does not understand"
            )
        ignored.append(ext["extension"])
    return ignored
