"""Helpers for the core's unit tests, no FUSE: arrays read through the engine, a namespace over a store, chunks in memory."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import trio
import zarr

from zarrfs import grid
from zarrfs.codecs.chain import CodecChain
from zarrfs.engine import Engine
from zarrfs.engine.cache import ChunkCache
from zarrfs.formats import open_hierarchy_sync
from zarrfs.model import ArrayMeta
from zarrfs.storage.keys import ChunkKeys
from zarrfs.storage.store import Store
from zarrfs.tree.namespace import ROOT_INODE, Namespace
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


def write_namespace_store(root: Path) -> Path:
    """A small v3 store written by zarr-python at ROOT: array `a` (6x4 int32 0..23 in 2x2 chunks)
    and group `sub` with array `b` (3 float64, no chunk written); returns ROOT."""
    g = zarr.open_group(str(root), mode="w", zarr_format=3)
    a = g.create_array("a", shape=(6, 4), chunks=(2, 2), dtype="<i4")
    a[...] = np.arange(24, dtype="<i4").reshape(6, 4)
    g.create_group("sub").create_array("b", shape=(3,), chunks=(2,), dtype="<f8")
    return root


def make_ns(root, writable: bool = False) -> Namespace:
    """The namespace the daemon would serve for the store at ROOT (no FUSE)."""
    store = Store(str(root))
    hierarchy = open_hierarchy_sync(store, "auto")
    engine = Engine(store, ChunkCache(16 << 20))
    return Namespace(hierarchy, hierarchy.node_sync(""), str(root), engine, writable=writable)


async def lookup_path(ns: Namespace, *names: str):
    """Look NAMES up one after the other from the root, remembering each entry as the kernel would; the last entry."""
    inode = ROOT_INODE
    for name in names:
        entry = await ns.lookup(inode, name)
        ns.remember(entry)
        inode = entry.inode
    return entry


# The dtypes the layout tests draw from: one byte, both byte orders, complex, bytes, a structure.
LAYOUT_DTYPES = ["|u1", "<i2", ">f4", "<c16", "|S3", [("a", "<i2"), ("b", "|u1")]]


def meta_and_chunks(arr: np.ndarray, chunks: tuple, chunk_order: str):
    """ARR as a v2 array of CHUNKS without codecs: (its ArrayMeta, {chunk index: the chunk in
    CHUNK_ORDER, padded past the edge with random bytes})."""
    meta = ArrayMeta(
        path="a",
        shape=arr.shape,
        dtype=arr.dtype,
        chunk_shape=chunks,
        fill_value=np.zeros((), arr.dtype),
        codec=CodecChain(),
        keys=ChunkKeys("a"),
        attributes={},
        format="v2",
        metadata_key="a/.zarray",
    )
    rng = np.random.default_rng(0)
    chunk_arrays = {}
    for idx in grid.all_chunks(arr.shape, chunks):
        # Padding past the edge holds junk: a view must never copy it out.
        junk = rng.integers(0, 256, int(np.prod(chunks, dtype=int)) * arr.dtype.itemsize, dtype=np.uint8)
        full = junk.view(arr.dtype).reshape(chunks, order=chunk_order).copy(order=chunk_order)
        sl = grid.chunk_slices(idx, arr.shape, chunks)
        full[tuple(slice(0, s.stop - s.start) for s in sl)] = arr[sl]
        chunk_arrays[idx] = full
    return meta, chunk_arrays
