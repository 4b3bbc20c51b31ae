"""Helpers for the core's unit tests: read arrays through the engine, no FUSE."""

from __future__ import annotations

import io

import numpy as np
import trio

from zarrfs.engine import Engine
from zarrfs.engine.cache import ChunkCache
from zarrfs.formats import open_hierarchy_sync
from zarrfs.storage.store import Store
from zarrfs.views.streams import ArrayStream


def open_node(source: str, path: str, fmt: str = "auto"):
    store = Store(source)
    hierarchy = open_hierarchy_sync(store, fmt)
    return store, hierarchy, hierarchy.node_sync(path)


def read_npy(source: str, path: str, fmt: str = "auto", ranges=None) -> bytes | list[bytes]:
    """The NPY bytes of an array (or of several byte ranges) read through Engine.read."""
    store, _, meta = open_node(source, path, fmt)
    engine = Engine(store, ChunkCache(64 << 20))
    stream = ArrayStream(meta, "C")

    async def main():
        if ranges is None:
            return await engine.read(stream, 0, stream.size)
        return [await engine.read(stream, off, n) for off, n in ranges]

    return trio.run(main)


def np_save_bytes(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, arr)
    return buf.getvalue()
