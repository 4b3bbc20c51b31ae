"""Variable-length string and bytes arrays (vlen-utf8, vlen-bytes) shown as fixed-width NPY (`U`/`S`).

Such an array has no element size, so it is shown with the width of its longest element:
`<U{width}` for strings, `|S{width}` for bytes. The width is found once, when the array's
metadata is read, by decoding every stored chunk; that scan is bounded (VLEN_SCAN_*), and
an array past the bounds fails alone (EOPNOTSUPP) instead of being shown as anything
else. Reads then go the way of any fixed-width array. Writes are refused (codecs/vlen.py).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from .. import grid
from ..codecs.chain import BytesBytesCodec, CodecChain
from ..codecs.vlen import READ_ONLY_REASON, VLenArrayBytes, fixed_width
from ..dtypes import bytes_value
from ..errors import CorruptChunk, MetadataError, Unsupported, ZarrfsError
from ..model import ArrayMeta
from ..storage.base import BaseStore

# The width scan reads at most this many stored bytes (which bounds the time it takes), and
# decodes at most this many bytes of strings (vlen codecs are not bounded by a chunk's declared
# size: a small stored chunk can hold huge strings).
VLEN_SCAN_MAX_STORED_BYTES = 64 << 20
VLEN_SCAN_MAX_DECODED_BYTES = 256 << 20
# Without a listing of the array's keys, at most this many grid positions are tried.
VLEN_SCAN_MAX_CHUNKS = 4096


def placeholder(
    path: str,
    shape: tuple[int, ...],
    chunks: tuple[int, ...],
    step: VLenArrayBytes,
    bytes_bytes: tuple[BytesBytesCodec, ...],
    fill: Any,
    **kw: Any,
) -> ArrayMeta:
    """An ArrayMeta of a vlen array before its width is known (see `resolve_sync`)."""
    fill_value = _fill(fill, step.kind)
    what = "strings" if step.kind == "U" else "bytes"
    return ArrayMeta(
        path=path,
        shape=shape,
        dtype=fill_value.dtype,
        chunk_shape=chunks,
        fill_value=fill_value,
        codec=CodecChain((), step, bytes_bytes),
        erase_fill_chunks=False,
        read_only=READ_ONLY_REASON.format(what=what, kind=step.kind),
        **kw,
    )


def _fill(fill: Any, kind: str) -> np.ndarray:
    """A vlen fill value (null means empty) as a 0-d U or S array of its own width.

    zarr 2 writes `fill_value: 0` for object arrays: zarr-python 3 reads it as the string
    "0" for vlen-utf8 (so does zarrfs); for vlen-bytes it refuses it, zarrfs reads empty bytes.
    """
    if fill is None or (kind == "S" and fill == 0 and not isinstance(fill, bool)):
        fill = ""
    if kind == "U" and isinstance(fill, int) and not isinstance(fill, bool):
        fill = str(fill)
    if kind == "S" and isinstance(fill, str):
        fill = bytes_value(fill) if fill else b""  # v2/v3 writers store bytes fill values as base64
    if not isinstance(fill, str if kind == "U" else bytes):
        raise MetadataError(f"bad fill value {fill!r} for variable-length {'strings' if kind == 'U' else 'bytes'}")
    return np.array(fill, dtype=f"{kind}{max(1, len(fill))}")


def is_vlen(meta: Any) -> bool:
    return isinstance(meta, ArrayMeta) and isinstance(meta.codec.array_bytes, VLenArrayBytes)


def resolve_sync(store: BaseStore, meta: ArrayMeta, list_keys: Any) -> ArrayMeta:
    """The array with its fixed width: the longest element of every stored chunk and the fill value.

    `list_keys(meta)` gives the stored chunk keys with sizes (ZarrfsError when the store
    cannot list). Unsupported past the scan's bounds, CorruptChunk for a chunk that
    does not decode, each naming the array.
    """
    step: VLenArrayBytes = meta.codec.array_bytes
    width = meta.fill_value.dtype.itemsize // (4 if step.kind == "U" else 1)
    stored = decoded = 0
    count = math.prod(meta.chunk_shape)
    for key in _chunk_keys(meta, list_keys):
        raw = store.get_sync(key)
        if raw is None:
            continue
        stored += len(raw)
        if stored > VLEN_SCAN_MAX_STORED_BYTES:
            raise Unsupported(_too_large(meta, f"more than {VLEN_SCAN_MAX_STORED_BYTES >> 20} MiB stored"))
        try:
            data = raw
            for bb in reversed(meta.codec.bytes_bytes):
                data = bb.decode(data)
            fixed = fixed_width(step.items(data, count), step.kind)
        except ZarrfsError as e:
            raise type(e)(f"chunk {key}: {e}") from None
        except Exception as e:  # numcodecs raises many types for corrupt input
            raise CorruptChunk(f"chunk {key}: cannot decode: {type(e).__name__}: {e}") from None
        decoded += fixed.nbytes
        if decoded > VLEN_SCAN_MAX_DECODED_BYTES:
            raise Unsupported(_too_large(meta, f"more than {VLEN_SCAN_MAX_DECODED_BYTES >> 20} MiB of elements"))
        width = max(width, fixed.dtype.itemsize // (4 if step.kind == "U" else 1))
    dtype = np.dtype(f"<U{width}" if step.kind == "U" else f"|S{width}")
    return dataclasses.replace(meta, dtype=dtype, fill_value=meta.fill_value.astype(dtype))


def _too_large(meta: ArrayMeta, what: str) -> str:
    return (
        f"{meta.metadata_key}: variable-length array too large to show as fixed width: finding its "
        f"longest element would read {what} (zarrfs reads at most {VLEN_SCAN_MAX_STORED_BYTES >> 20} MiB "
        f"stored / {VLEN_SCAN_MAX_DECODED_BYTES >> 20} MiB decoded for that)"
    )


def _chunk_keys(meta: ArrayMeta, list_keys: Any) -> list[str]:
    """The stored chunk keys of the array: from a listing, else every grid position's key (bounded)."""
    try:
        listed = list_keys(meta)
    except ZarrfsError:
        listed = None
    if listed is not None:
        stored = sum(size or 0 for size in listed.values())
        if stored > VLEN_SCAN_MAX_STORED_BYTES:
            raise Unsupported(_too_large(meta, f"{stored} bytes stored"))
        if grid.n_chunks(meta.shape, meta.chunk_shape) > VLEN_SCAN_MAX_CHUNKS:
            return sorted(listed)  # too many positions to name: every stored key is a chunk
        valid = {meta.chunk_key(idx) for idx in _positions(meta)}
        return sorted(key for key in listed if key in valid)
    return [meta.chunk_key(idx) for idx in _positions(meta)]


def _positions(meta: ArrayMeta) -> list[tuple[int, ...]]:
    n = grid.n_chunks(meta.shape, meta.chunk_shape)
    if n > VLEN_SCAN_MAX_CHUNKS:
        raise Unsupported(_too_large(meta, f"{n} chunks, and the store cannot list which are stored"))
    return list(grid.all_chunks(meta.shape, meta.chunk_shape))
