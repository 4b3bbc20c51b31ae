"""Engine writes without FUSE: read-modify-write of chunks, flushes, fill chunks erased, errors."""

from __future__ import annotations

import os
import warnings

import numpy as np
import pytest
import trio
import zarr

from zarrfs.engine import Engine, EngineConfig
from zarrfs.engine.cache import ChunkCache
from zarrfs.errors import StoreError
from zarrfs.formats import open_hierarchy_sync
from zarrfs.model import NewArray
from zarrfs.storage.store import Store
from zarrfs.views.streams import ArrayStream

warnings.filterwarnings("ignore", module="zarr")


class FailingSetStore(Store):
    """A real local store whose Nth set fails (fault injection)."""

    def __init__(self, source, fail_at):
        super().__init__(source)
        self.sets, self.fail_at = 0, fail_at

    def set_sync(self, key, value):
        self.sets += 1
        if self.sets == self.fail_at:
            raise StoreError(f"writing {key!r} failed: injected")
        super().set_sync(key, value)


def make(tmp_path, fmt, store_cls=Store, **kw):
    path = str(tmp_path / "s")
    a = zarr.create_array(path, name="a", shape=(10, 9), chunks=(4, 4), dtype="<i4", zarr_format=fmt, fill_value=0)
    a[:] = np.arange(90).reshape(10, 9)
    store = store_cls(path, **kw)
    meta = open_hierarchy_sync(store).node_sync("a")
    return path, store, meta, Engine(store, ChunkCache(1 << 24))


@pytest.mark.parametrize("fmt", [2, 3])
@pytest.mark.parametrize("order", ["C", "F"])
async def test_unaligned_writes_then_peer_reads(tmp_path, fmt, order):
    path, store, meta, engine = make(tmp_path, fmt)
    stream = ArrayStream(meta, order, with_header=False)
    model = np.arange(90, dtype="<i4").reshape(10, 9)
    flat = bytearray(model.tobytes(order=order))
    rng = np.random.default_rng(fmt)
    for _ in range(20):
        off = int(rng.integers(0, len(flat)))
        data = rng.integers(0, 256, int(rng.integers(1, 60)), dtype=np.uint8).tobytes()[: len(flat) - off]
        await engine.write(stream, off, data)
        flat[off : off + len(data)] = data
        assert bytes(await engine.read(stream, 0, len(flat))) == bytes(flat)  # reads see dirty chunks
    await engine.flush()
    expected = np.frombuffer(bytes(flat), "<i4").reshape((10, 9), order=order)
    np.testing.assert_array_equal(zarr.open_array(f"{path}/a", mode="r")[...], expected)


async def test_chunks_of_fill_are_erased(tmp_path):
    path, store, meta, engine = make(tmp_path, 2)
    stream = ArrayStream(meta, "C", with_header=False)
    assert os.path.exists(f"{path}/a/0.0")
    for row in range(4):  # rows 0..3, columns 0..3 hold chunk (0, 0)
        await engine.write(stream, row * 9 * 4, bytes(16))
    await engine.flush("a")
    assert not os.path.exists(f"{path}/a/0.0")
    assert engine.counters["chunks_erased"] == 1
    assert zarr.open_array(f"{path}/a", mode="r")[:4, :4].sum() == 0


async def test_failed_store_write_is_reported_and_keeps_old_chunk(tmp_path):
    path, store, meta, engine = make(tmp_path, 2, FailingSetStore, fail_at=1)
    stream = ArrayStream(meta, "C", with_header=False)
    before = open(f"{path}/a/0.0", "rb").read()
    await engine.write(stream, 0, np.full(4, 7, "<i4").tobytes())
    with pytest.raises(StoreError, match=r"a/0\.0.*injected"):
        await engine.flush("a")
    assert open(f"{path}/a/0.0", "rb").read() == before
    assert not [n for n in os.listdir(f"{path}/a") if n.endswith(".tmp")]
    # what is read now is what the store holds
    assert np.frombuffer(bytes(await engine.read(stream, 0, 16)), "<i4").tolist() == [0, 1, 2, 3]
    await engine.write(stream, 0, np.full(4, 7, "<i4").tobytes())  # the next attempt succeeds
    await engine.flush("a")
    assert zarr.open_array(f"{path}/a", mode="r")[0, :4].tolist() == [7, 7, 7, 7]


async def test_dirty_budget_bounds_memory(tmp_path):
    path = str(tmp_path / "s")
    store = Store(path)
    zarr.open_group(path, mode="w", zarr_format=3)
    h = open_hierarchy_sync(store)
    meta = await trio.to_thread.run_sync(h.create_array_sync, "big", NewArray((256, 256), np.dtype("<f8"), (16, 256)))
    engine = Engine(store, ChunkCache(1 << 20), EngineConfig(dirty_max_bytes=4 * 16 * 256 * 8))
    stream = ArrayStream(meta, "C", with_header=False)
    data = np.arange(256 * 256, dtype="<f8")
    peak = 0
    for off in range(0, data.nbytes, 1 << 15):
        await engine.write(stream, off, data.tobytes()[off : off + (1 << 15)])
        peak = max(peak, engine.dirty_bytes)
    await engine.flush()
    assert peak <= engine.dirty_max_bytes + (1 << 15) * 2
    np.testing.assert_array_equal(zarr.open_array(f"{path}/big", mode="r")[...].ravel(), data)


async def test_concurrent_writers_of_one_chunk_write_whole_elements(tmp_path):
    path, store, meta, engine = make(tmp_path, 3)
    stream = ArrayStream(meta, "C", with_header=False)

    async def writer(value):
        for _ in range(20):
            await engine.write(stream, 0, np.full(4, value, "<i4").tobytes())
            await trio.sleep(0)

    async with trio.open_nursery() as n:
        for v in (111, 222, 333):
            n.start_soon(writer, v)
    await engine.flush()
    row = zarr.open_array(f"{path}/a", mode="r")[0, :4].tolist()
    assert len(set(row)) == 1 and row[0] in (111, 222, 333)


async def test_background_flush_overlaps_a_streaming_write_and_reports_failures_at_flush(tmp_path):
    path = str(tmp_path / "s")
    zarr.open_group(path, mode="w", zarr_format=3)
    store = FailingSetStore(path, fail_at=3)
    h = open_hierarchy_sync(store)
    meta = await trio.to_thread.run_sync(h.create_array_sync, "big", NewArray((256, 256), np.dtype("<f8"), (16, 256)))
    engine = Engine(store, ChunkCache(1 << 20), EngineConfig(dirty_max_bytes=8 * 16 * 256 * 8))  # eight chunks
    stream = ArrayStream(meta, "C", with_header=False)
    data = np.arange(256 * 256, dtype="<f8")
    peak = stored_while_writing = 0
    async with trio.open_nursery() as nursery:
        await nursery.start(engine.run)
        reported = []
        for off in range(0, data.nbytes, 1 << 15):
            try:
                await engine.write(stream, off, data.tobytes()[off : off + (1 << 15)])
            except StoreError as e:  # a write past the budget waits for a flush, and may see it fail
                reported.append(e)
            await trio.sleep(0)
            peak = max(peak, engine.dirty_bytes + engine.storing_bytes)
            stored_while_writing = max(stored_while_writing, engine.counters["chunks_stored"])
        assert stored_while_writing > 0  # stored in the background, before any flush
        # The third set failed: whether a write saw it or not, the next flush reports it.
        with pytest.raises(StoreError, match="injected"):
            await engine.flush()
        assert all("injected" in str(e) for e in reported)
        await engine.flush()  # reported; nothing else is pending
        nursery.cancel_scope.cancel()
    assert peak <= engine.dirty_max_bytes + (1 << 15) * 2
    stored = zarr.open_array(f"{path}/big", mode="r")[...].ravel()
    lost = stored != data
    assert lost.sum() <= 16 * 256  # at most the one chunk whose set failed
