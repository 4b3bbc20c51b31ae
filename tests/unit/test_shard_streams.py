"""Shards streamed while they are written (engine/shardstreams.py), without FUSE or S3: a local
directory taken for an object store whose uploads go in parts. zarr-python reads back every
write; the uploads record what went before the shard was complete, and which were aborted."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import trio
import zarr

from zarrfs.engine import Engine
from zarrfs.engine.cache import ChunkCache
from zarrfs.errors import StoreError
from zarrfs.formats import open_hierarchy_sync
from zarrfs.storage.base import Upload
from zarrfs.storage.store import Store
from zarrfs.views.streams import ArrayStream

warnings.filterwarnings("ignore", module="zarr")

PART = 1000  # shards of 2,000 bytes or more stream


class PartsUpload(Upload):
    def __init__(self, store: PartsStore, key: str) -> None:
        self.store, self.key = store, key
        self.data = bytearray()
        self.state = "open"
        self.sent_before_commit = 0  # bytes that would have gone as parts before the commit

    def write_sync(self, data: bytes) -> None:
        assert self.state == "open"
        if self.store.fail_writes:
            raise StoreError(f"uploading {self.key!r} failed: injected")
        self.data += data
        self.sent_before_commit = len(self.data) // PART * PART

    def commit_sync(self) -> None:
        assert self.state == "open"
        self.store.set_sync(self.key, bytes(self.data))
        self.state = "committed"

    def abort_sync(self) -> None:
        self.state = "aborted"


class PartsStore(Store):
    """A local directory taken for an object store with uploads in parts (as S3's)."""

    def __init__(self, source: str) -> None:
        super().__init__(source)
        self.is_local = self.on_local_disk = False
        self.uploads: list[PartsUpload] = []
        self.fail_writes = False

    @property
    def upload_parts(self) -> int | None:
        return PART

    def open_upload_sync(self, key: str) -> Upload | None:
        self.uploads.append(PartsUpload(self, key))
        return self.uploads[-1]


SHAPE, SHARDS, INNER = (100, 70), (40, 40), (10, 10)  # shards at the edges, partly outside


def make(tmp_path, old: np.ndarray):
    path = str(tmp_path / "s")
    a = zarr.create_array(path, name="a", shape=SHAPE, shards=SHARDS, chunks=INNER, dtype="<i4", fill_value=0)
    a[:] = old
    store = PartsStore(path)
    meta = open_hierarchy_sync(store).node_sync("a")
    return path, store, meta, Engine(store, ChunkCache(1 << 24))


async def write_all(engine, stream, pieces) -> StoreError | None:
    """Write the pieces in turn, then flush: the flush's failure, if any."""
    failed = None
    async with trio.open_nursery() as nursery:
        await nursery.start(engine.run)
        for off, data in pieces:
            await engine.write(stream, off, data)
            await trio.sleep(0)  # (the background appends go on between the kernel's requests)
        try:
            await engine.flush()
        except StoreError as e:
            failed = e
        nursery.cancel_scope.cancel()
    return failed


def in_pieces(data: bytes, size: int) -> list[tuple[int, bytes]]:
    return [(off, data[off : off + size]) for off in range(0, len(data), size)]


@pytest.mark.parametrize("order", ["C", "F"])
async def test_a_written_array_reads_back_and_parts_went_before_the_commit(tmp_path, order):
    rng = np.random.default_rng(0)
    path, store, meta, engine = make(tmp_path, rng.integers(0, 1000, SHAPE, dtype="<i4"))
    new = rng.integers(0, 2**31, SHAPE, dtype="<i4")
    new[:10, :10] = 0  # one inner chunk of fill: absent from its shard
    stream = ArrayStream(meta, order, with_header=False)
    assert await write_all(engine, stream, in_pieces(new.tobytes(order=order), 1024)) is None
    np.testing.assert_array_equal(zarr.open_array(f"{path}/a", mode="r")[...], new)
    committed = [u for u in store.uploads if u.state == "committed"]
    assert committed and not [u for u in store.uploads if u.state == "open"]
    if order == "C":  # inner chunks complete in the order of a shard's bytes: parts went early
        assert all(u.sent_before_commit > 0 for u in committed)


async def test_writes_into_chunks_already_sent_abort_the_upload(tmp_path):
    rng = np.random.default_rng(1)
    path, store, meta, engine = make(tmp_path, rng.integers(0, 1000, SHAPE, dtype="<i4"))
    new = rng.integers(0, 2**31, SHAPE, dtype="<i4")
    stream = ArrayStream(meta, "C", with_header=False)
    raw = new.tobytes()
    pieces = in_pieces(raw, 1024)
    some = 7  # rows 0 to 25: the first row of inner chunks of shards (0, 0) and (0, 1) went
    again = rng.integers(0, 2**31, SHAPE[1], dtype="<i4").tobytes()  # row 0 again
    assert await write_all(engine, stream, [*pieces[:some], (0, again), *pieces[some:]]) is None
    new[0] = np.frombuffer(again, "<i4")
    np.testing.assert_array_equal(zarr.open_array(f"{path}/a", mode="r")[...], new)
    assert {u.key for u in store.uploads if u.state == "aborted"} >= {"a/c/0/0", "a/c/0/1"}
    assert not [u for u in store.uploads if u.state == "open"]


async def test_a_failed_part_is_eio_at_flush_and_keeps_the_old_shard(tmp_path):
    rng = np.random.default_rng(2)
    old = rng.integers(0, 1000, SHAPE, dtype="<i4")
    path, store, meta, engine = make(tmp_path, old)
    store.fail_writes = True
    stream = ArrayStream(meta, "C", with_header=False)
    new = rng.integers(0, 2**31, SHAPE, dtype="<i4")
    failed = await write_all(engine, stream, in_pieces(new.tobytes(), 1024))
    assert failed is not None and "injected" in str(failed)
    assert store.uploads and all(u.state == "aborted" for u in store.uploads)
    stored = zarr.open_array(f"{path}/a", mode="r")[...]
    for u in store.uploads:  # the shards whose upload failed hold their old values
        i, j = (int(x) for x in u.key.split("/")[-2:])
        region = np.s_[i * 40 : (i + 1) * 40, j * 40 : (j + 1) * 40]
        np.testing.assert_array_equal(stored[region], old[region])
