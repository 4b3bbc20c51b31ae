"""Pins (engine/pins.py): a read that continues one begun before the TTL's last start gets the chunk
versions that start dropped, while the TTL they were checked under has not run out."""

from __future__ import annotations

import time
import warnings

import numpy as np
import trio
import zarr

from zarrfs.engine import Engine
from zarrfs.engine.cache import ChunkCache
from zarrfs.formats import open_hierarchy_sync
from zarrfs.storage.store import Store
from zarrfs.views.streams import ArrayStream

warnings.filterwarnings("ignore", module="zarr")


def _engine(tmp_path):
    path = str(tmp_path / "s")
    root = zarr.open_group(path, mode="w", zarr_format=2)
    root.create_array("a", shape=(8,), chunks=(4,), dtype="<i4")[:] = np.arange(8)
    store = Store(path)
    stream = ArrayStream(open_hierarchy_sync(store).node_sync("a"))
    return path, Engine(store, ChunkCache(1 << 20)), stream


def _elements(data: bytes) -> list[int]:
    return np.frombuffer(data, "<i4").tolist()


async def test_a_read_continuing_across_the_ttls_start_gets_the_version_it_began_with(tmp_path):
    path, engine, stream = _engine(tmp_path)
    h = len(stream.header)
    async with trio.open_nursery() as n:
        await n.start(engine.run)
        assert _elements(await engine.read(stream, h, 8)) == [0, 1]  # chunk 0, cached
        zarr.open_array(path + "/a", mode="r+")[0:4] = -np.arange(1, 5)  # another writer, after the read
        engine.chunks_stale(time.monotonic() + 60)  # the TTL starts; what it drops is pinned a minute
        # The rest of chunk 0: the read that continues gets the version its start showed; any other
        # gets what the store holds now (the array's check dropped the old version).
        assert _elements(await engine.read(stream, h + 8, 8, pinned=True)) == [2, 3]
        assert _elements(await engine.read(stream, h + 8, 8)) == [-3, -4]
        assert engine.counters["pinned_reads"] == 1
        n.cancel_scope.cancel()


async def test_pinned_versions_are_not_used_past_their_ttl(tmp_path):
    path, engine, stream = _engine(tmp_path)
    h = len(stream.header)
    async with trio.open_nursery() as n:
        await n.start(engine.run)
        assert _elements(await engine.read(stream, h, 8)) == [0, 1]
        zarr.open_array(path + "/a", mode="r+")[0:4] = -np.arange(1, 5)
        engine.chunks_stale(time.monotonic())  # the TTL the cached version was checked under ran out
        assert not engine.pins_live()
        assert _elements(await engine.read(stream, h + 8, 8, pinned=True)) == [-3, -4]
        n.cancel_scope.cancel()
