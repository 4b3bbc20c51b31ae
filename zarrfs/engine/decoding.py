"""Decoding of stored chunks in worker threads: one chunk, several, or a local chunk read and decoded in one call."""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np

from ..errors import CorruptChunk, MetadataError, ZarrfsError
from ..grid import Index
from ..model import ArrayMeta
from ..storage import chunksource
from ..storage.base import BaseStore
from .memory import private_buffer

# A local chunk decoded into a buffer given for it is read into its worker thread's scratch
# buffer, of its decoded size and this much more (a compressor's header, incompressible data),
# rounded up to SCRATCH_STEP; chunks that would need more than SCRATCH_MAX_BYTES are read as before.
SCRATCH_SLACK = 64 << 10
SCRATCH_STEP = 1 << 20
SCRATCH_MAX_BYTES = 64 << 20
_scratch = threading.local()  # .buf: this worker thread's scratch buffer


def decode_chunk_sync(meta: ArrayMeta, key: str, raw: bytes, out: np.ndarray | None = None) -> np.ndarray:
    """Decode one stored chunk (maybe into OUT: see CodecChain.decode); any failure becomes a
    CorruptChunk naming the key."""
    fill = None if meta.fill_error is not None else meta.fill_value  # None: a shard's missing inner chunk fails
    try:
        if out is None:
            arr = meta.codec.decode(raw, meta.chunk_shape, meta.dtype, fill)
        else:
            arr = meta.codec.decode(raw, meta.chunk_shape, meta.dtype, fill, out=out)
    except ZarrfsError as e:
        why = f" ({meta.metadata_key}: {meta.fill_error})" if fill is None and isinstance(e, MetadataError) else ""
        raise type(e)(f"chunk {key}: {e}{why}") from None
    except Exception as e:  # numcodecs raises many types for corrupt input
        raise CorruptChunk(f"chunk {key}: cannot decode: {type(e).__name__}: {e}") from None
    if arr.shape != meta.chunk_shape or arr.dtype != meta.dtype:
        raise CorruptChunk(f"chunk {key}: decoded to {arr.shape} {arr.dtype}, expected {meta.chunk_shape} {meta.dtype}")
    return arr


def read_decode_sync(
    meta: ArrayMeta, store: BaseStore, idx: Index, key: str, out: np.ndarray
) -> tuple[int | None, np.ndarray | None, float]:
    """A local chunk read and decoded into OUT in one worker call: (its stored size, the array,
    seconds decoding), or (None, None, 0.0) when it is not stored.

    Its stored bytes go into this thread's scratch buffer, kept for the thread's next chunk:
    read into fresh memory, each chunk's bytes cost their page faults again, and a second
    worker call handed them to a decoding thread. Nothing decoded refers to the scratch buffer: it is copied if it did.
    """
    need = -(-(meta.chunk_nbytes + SCRATCH_SLACK) // SCRATCH_STEP) * SCRATCH_STEP
    buf = getattr(_scratch, "buf", None)
    if need > SCRATCH_MAX_BYTES:
        buf = None
    elif buf is None or len(buf) < need:
        _scratch.buf = None  # the old one freed first
        try:
            buf = _scratch.buf = private_buffer(need)
        except OSError:  # out of memory: read as before
            buf = None
    raw = chunksource.read_chunk_sync(meta, store, idx, buf)
    if raw is None:
        return None, None, 0.0
    began = time.perf_counter()
    arr = decode_chunk_sync(meta, key, raw, out)
    if buf is not None and np.may_share_memory(arr, buf):
        arr = arr.copy()
    return len(raw), arr, time.perf_counter() - began


def decode_chunks_sync(
    meta: ArrayMeta, pieces: list[tuple[str, Any]], outs: list[np.ndarray | None] | None = None
) -> list[np.ndarray]:
    """Decode several stored chunks of one array, each labelled by its key for errors (and
    maybe into the buffer given for it)."""
    outs = outs or [None] * len(pieces)
    return [decode_chunk_sync(meta, key, raw, out) for (key, raw), out in zip(pieces, outs)]
