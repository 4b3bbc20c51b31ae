"""The contents of `.zarrfs/`: its view directories, info JSON documents, stats.json, and xattrs.

Pure functions of nodes and counters (no I/O, no trio): the namespace asks them which
names a view directory shows and what a generated file holds.
"""

from __future__ import annotations

import base64
import json
import math
from typing import Any

import numpy as np

from .. import grid
from ..model import ArrayMeta, GroupMeta, Node
from . import images
from .kinds import Kind

VIEWS_DIR = ".zarrfs"
STATS_FILE = "stats.json"
# The array views under .zarrfs: name -> (file suffix, element order, with NPY header);
# "" is the main tree's NAME.npy.
ARRAY_VIEWS = {
    "": (".npy", "C", True),
    "npy-f": (".npy", "F", True),
    "raw": (".raw", "C", False),
    "raw-f": (".raw", "F", False),
}
VIEW_DIRS = ("npy-f", "raw", "raw-f", "chunks", "store", "info", "slice", "netcdf", *images.IMAGE_VIEWS, "ome-tiff")
# The OME-TIFF view: its directories list groups; its files (IMAGE.ome.tif, beside image groups)
# are listed once their levels are read and found to make one (tree/listings.py).
OME_TIFF_VIEW, OME_TIFF_SUFFIX = "ome-tiff", ".ome.tif"
# Views whose directories list groups only: their files are looked up by name (slice/A[SEL].npy).
LOOKUP_ONLY_VIEWS = ("slice",)
# Views of groups, not arrays: name -> (file suffix, entry kind) (a group's file sits beside its directory).
GROUP_FILE_VIEWS = {"netcdf": (".nc", Kind.NETCDF)}


def view_names(view: str, node: Node, base: str) -> list[tuple[str, Kind]]:
    """(name, entry kind) of a node named `base` in a view directory (info lists groups twice:
    NAME.json and the directory NAME)."""
    is_array = node.kind == "array"
    if view in images.IMAGE_VIEWS:
        return images.view_names(view, node, base)
    if view == OME_TIFF_VIEW:
        return [] if is_array else [(base, Kind.GROUP)]
    if view == "info":
        return [(base + ".json", Kind.INFO)] + ([] if is_array else [(base, Kind.GROUP)])
    if view in GROUP_FILE_VIEWS:
        suffix, kind = GROUP_FILE_VIEWS[view]
        return [] if is_array else [(base + suffix, kind), (base, Kind.GROUP)]
    if not is_array:
        return [(base, Kind.GROUP)]
    if view in LOOKUP_ONLY_VIEWS:
        return []
    if view == "chunks":
        return [(base, Kind.CHUNKDIR)]
    return [(base + ARRAY_VIEWS[view][0], Kind.ARRAY)] + images.beside(view, node, base)


def chunk_name(idx: tuple[int, ...]) -> str:
    """The file name of a grid position: indices joined with `.` (`0.npy` for a 0-d array)."""
    return (".".join(map(str, idx)) or "0") + ".npy"


def jsonable(value: Any) -> Any:
    """A fill value or attribute as JSON: NaN/Infinity as strings, bytes as base64."""
    if isinstance(value, np.ndarray):
        value = value.tolist() if value.dtype.kind not in "SVmM" or value.dtype.fields else value[()]
    if isinstance(value, np.void):
        value = value.tobytes()
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if isinstance(value, (np.datetime64, np.timedelta64)):
        return str(value)
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, complex):
        return [jsonable(value.real), jsonable(value.imag)]
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, np.generic):
        return jsonable(value.item())
    return value


def info_json(node: Node, sizes: dict[str, int | None] | None) -> bytes:
    """`info/PATH.json`: a node's shape, dtype, chunks, codecs, attributes, logical and stored bytes
    (`sizes`: its stored chunk keys' sizes, None when the store cannot list them)."""
    info: dict[str, Any] = {"path": node.path, "kind": node.kind}
    if isinstance(node, ArrayMeta):
        info.update(
            format=node.format,
            shape=list(node.shape),
            dtype=np.lib.format.dtype_to_descr(node.dtype),
            chunk_shape=list(node.chunk_shape),
            order=node.codec.order,
            codecs=node.codec.describe(),
            fill_value=jsonable(node.fill_value),
            dimension_names=jsonable(node.dimension_names),
            attributes=node.attributes,
            metadata_key=node.metadata_key,
            chunks_total=grid.n_chunks(node.shape, node.chunk_shape),
            chunks_stored=len(sizes) if sizes is not None else None,
            logical_bytes=node.nbytes,
            stored_bytes=sum(s or 0 for s in sizes.values()) if sizes is not None else None,
        )
        if node.fill_error is not None:
            info.update(fill_value=None, fill_value_error=node.fill_error)
    elif isinstance(node, GroupMeta):
        info.update(
            format=node.format,
            attributes=node.attributes,
            metadata_key=node.metadata_key,
            implicit=node.metadata_key is None,
        )
    return (json.dumps(info, indent=2) + "\n").encode()


def stats_json(engine_stats: dict[str, Any], entries: int, open_files: int) -> bytes:
    """`stats.json`: the engine's counters, and the namespace's entries and open files right now."""
    return (json.dumps({**engine_stats, "entries": entries, "open_files": open_files}, indent=2) + "\n").encode()


def xattrs(node: Node | None) -> dict[str, bytes]:
    """The `user.zarr.*` attributes of a group or array (main tree and views)."""
    if node is None:
        return {}
    out: dict[str, Any] = {"attributes": node.attributes}
    if isinstance(node, ArrayMeta):
        out.update(
            shape=list(node.shape),
            dtype=np.lib.format.dtype_to_descr(node.dtype),
            chunks=list(node.chunk_shape),
            codecs=node.codec.describe(),
        )
    return {"user.zarr." + k: json.dumps(jsonable(v)).encode() for k, v in out.items()}
