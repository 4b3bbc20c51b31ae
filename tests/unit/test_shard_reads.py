"""Partial reads of v3 shards: a read fetches the shard's index and only the inner chunks it
needs, whatever the view; values always match zarr-python 3, including after writes."""

from __future__ import annotations

import threading
import warnings

import google_crc32c
import numpy as np
import pytest
import trio
import trio.testing
import zarr
import zarr.codecs as zc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zarrfs.engine import Engine
from zarrfs.engine.cache import ChunkCache
from zarrfs.errors import CorruptChunk, StoreError
from zarrfs.formats import open_hierarchy_sync
from zarrfs.storage.store import Store
from zarrfs.views.streams import ArrayStream

from support.core import np_save_bytes

warnings.filterwarnings("ignore", module="zarr")
pytestmark = pytest.mark.filterwarnings("ignore")

SHAPE, SHARD, INNER = (90, 70), (40, 32), (8, 8)


def make(path, index_location="end", inner_codecs=None, fill=7, write=True):
    """A sharded u2 array written by zarr-python 3 (some inner chunks and one shard left out)."""
    inner_codecs = inner_codecs or [zc.BytesCodec(), zc.ZstdCodec(level=1)]
    a = zarr.create_array(
        path,
        name="a",
        shape=SHAPE,
        chunks=SHARD,
        dtype="<u2",
        fill_value=fill,
        compressors=None,
        serializer=zc.ShardingCodec(chunk_shape=INNER, codecs=inner_codecs, index_location=index_location),
    )
    if write:
        rng = np.random.default_rng(1)
        data = rng.integers(0, 60000, SHAPE, dtype="<u2")
        a[:] = data
        a[3:11, 20:29] = fill  # inner chunks all fill value are left out of their shard
        a[40:80, 32:64] = fill  # a whole shard of fill value is not stored
    return np.asarray(zarr.open_array(f"{path}/a", mode="r")[...])


def engine_for(path, cache_bytes=64 << 20):
    store = Store(path)
    meta = open_hierarchy_sync(store).node_sync("a")
    return store, meta, Engine(store, ChunkCache(cache_bytes))


def test_v3_sharding_gets_an_inner_grid(tmp_path):
    make(str(tmp_path / "s"))
    _, meta, _ = engine_for(str(tmp_path / "s"))
    assert meta.chunk_shape == SHARD  # the chunk files of the tree are shards
    assert meta.inner is not None and meta.inner.chunk_shape == INNER


@pytest.mark.parametrize("index_location", ["start", "end"])
def test_small_read_fetches_a_fraction_of_the_shard(tmp_path, index_location):
    path = str(tmp_path / "s")
    expected = make(path, index_location)
    store, meta, engine = engine_for(path)
    shard = open(f"{path}/a/c/0/0", "rb").read()
    n_inner = (SHARD[0] // INNER[0]) * (SHARD[1] // INNER[1])
    index_nbytes = 16 * n_inner + 4  # bytes + crc32c, zarr's default index codecs
    raw_index = shard[-index_nbytes:-4] if index_location == "end" else shard[: index_nbytes - 4]
    index = np.frombuffer(raw_index, "<u8").reshape(SHARD[0] // INNER[0], SHARD[1] // INNER[1], 2)
    stream = ArrayStream(meta, "C", with_header=False)
    row, col = 13, 5  # one element, inside shard (0, 0)
    off = (row * SHAPE[1] + col) * 2

    async def main():
        return bytes(await engine.read(stream, off, 2))

    assert trio.run(main) == expected[row, col].tobytes()
    s = engine.stats()
    assert s["chunk_gets"] == 2  # the index, then one inner chunk
    assert s["chunk_bytes"] == index_nbytes + int(index[13 // INNER[0], 5 // INNER[1], 1])
    assert s["chunk_bytes"] < len(shard) / 2


@pytest.mark.parametrize("index_location", ["start", "end"])
@pytest.mark.parametrize("order", ["C", "F"])
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_random_ranges_match_zarr(tmp_path_factory, index_location, order, data):
    path = str(tmp_path_factory.mktemp("s"))
    expected = make(
        path, index_location, inner_codecs=[zc.TransposeCodec(order=(1, 0)), zc.BytesCodec(), zc.GzipCodec(level=1)]
    )
    _, meta, engine = engine_for(path, cache_bytes=data.draw(st.sampled_from([0, 20_000, 64 << 20])))
    stream = ArrayStream(meta, order)
    oracle = np_save_bytes(np.asfortranarray(expected) if order == "F" else expected)
    assert stream.size == len(oracle)
    ranges = data.draw(st.lists(st.tuples(st.integers(0, len(oracle)), st.integers(1, 30_000)), min_size=1, max_size=6))

    async def main():
        return [bytes(await engine.read(stream, off, n)) for off, n in ranges]

    for (off, n), got in zip(ranges, trio.run(main)):
        assert got == oracle[off : off + n]


def test_chunk_file_of_a_shard_reads_in_part(tmp_path):
    path = str(tmp_path / "s")
    expected = make(path)
    store, meta, engine = engine_for(path)
    shard = (1, 2)  # at the array's edge: clipped to 40 x 6
    stream = ArrayStream(meta, "C", chunk=shard)
    oracle = np_save_bytes(expected[40:80, 64:70])

    async def main():
        whole = bytes(await engine.read(stream, 0, stream.size))
        part = bytes(await engine.read(stream, len(stream.header) + 100, 20))
        return whole, part

    whole, part = trio.run(main)
    assert whole == oracle
    assert part == oracle[len(stream.header) + 100 : len(stream.header) + 120]


def test_writes_are_seen_by_partial_reads(tmp_path):
    path = str(tmp_path / "s")
    expected = make(path).copy()
    store, meta, engine = engine_for(path)
    reader = ArrayStream(meta, "C", with_header=False)
    writer = ArrayStream(meta, "C", with_header=False)
    row = 17 * SHAPE[1] * 2

    async def main():
        before = bytes(await engine.read(reader, row, 140))  # caches index and inner chunks
        await engine.write(writer, row + 20, np.arange(10, dtype="<u2").tobytes())
        dirty = bytes(await engine.read(reader, row, 140))
        await engine.flush()
        stored = bytes(await engine.read(reader, row, 140))
        return before, dirty, stored

    before, dirty, stored = trio.run(main)
    assert before == expected[17].tobytes()
    expected[17, 10:20] = np.arange(10)
    assert dirty == stored == expected[17].tobytes()
    assert np.array_equal(zarr.open_array(f"{path}/a", mode="r")[...], expected)


def test_fill_shard_and_empty_array(tmp_path):
    path = str(tmp_path / "s")
    make(path, write=False)
    store, meta, engine = engine_for(path)
    stream = ArrayStream(meta, "C")

    async def main():
        return bytes(await engine.read(stream, 0, stream.size))

    assert trio.run(main) == np_save_bytes(np.full(SHAPE, 7, "<u2"))


def test_corrupt_inner_chunk_fails_only_its_reads(tmp_path):
    path = str(tmp_path / "s")
    expected = make(path, inner_codecs=[zc.BytesCodec(), zc.ZstdCodec(level=1)])
    key = f"{path}/a/c/0/0"
    raw = bytearray(open(key, "rb").read())
    index = np.frombuffer(bytes(raw[-(16 * 5 * 4 + 4) : -4]), "<u8").reshape(5, 4, 2)
    offset, nbytes = (int(x) for x in index[0, 0])
    raw[offset : offset + nbytes] = b"\xff" * nbytes  # inner chunk (0, 0) of shard (0, 0)
    open(key, "wb").write(bytes(raw))
    _, meta, engine = engine_for(path)
    stream = ArrayStream(meta, "C", with_header=False)

    async def main():
        good = bytes(await engine.read(stream, (20 * SHAPE[1]) * 2, 16))  # inner chunk (2, 0)
        with pytest.raises(CorruptChunk, match=r"a/c/0/0 \(inner chunk \(0, 0\)\)"):
            await engine.read(stream, 0, 16)
        return good

    assert trio.run(main) == expected[20, :8].tobytes()


class SlowRangeStore(Store):
    """A real local store whose ranged reads wait until released (to order a race)."""

    def __init__(self, source):
        super().__init__(source)
        self.release = threading.Event()

    def get_range_sync(self, key, start, end):
        self.release.wait(10)
        return super().get_range_sync(key, start, end)


def test_a_load_overtaken_by_a_write_is_not_cached(tmp_path):
    path = str(tmp_path / "s")
    expected = make(path).copy()
    store = SlowRangeStore(path)
    meta = open_hierarchy_sync(store).node_sync("a")
    engine = Engine(store, ChunkCache(64 << 20))
    stream = ArrayStream(meta, "C", with_header=False)
    row = 5 * SHAPE[1] * 2
    new = np.arange(SHAPE[1], dtype="<u2")

    async def main():
        async with trio.open_nursery() as nursery:
            first = []

            async def slow_reader():
                first.append(bytes(await engine.read(stream, row, SHAPE[1] * 2)))

            nursery.start_soon(slow_reader)
            await trio.testing.wait_all_tasks_blocked()  # its inner chunks wait in get_range
            await engine.write(stream, row, new.tobytes())  # whole rows of two shards: no ranged read
            await engine.flush()
            store.release.set()
        return first[0], bytes(await engine.read(stream, row, SHAPE[1] * 2))

    first, second = trio.run(main)
    assert first in (expected[5].tobytes(), new.tobytes())
    assert second == new.tobytes()


@pytest.mark.parametrize("entry", [(2**40, 100), (0, 2**62), (10, 2**64 - 2), (2**64 - 1, 5)])
def test_hostile_index_entries_fail_their_reads_only(tmp_path, entry):
    path = str(tmp_path / "s")
    expected = make(path, inner_codecs=[zc.BytesCodec()])
    key = f"{path}/a/c/0/0"
    raw = bytearray(open(key, "rb").read())
    n = 16 * 5 * 4
    index = np.frombuffer(bytes(raw[-(n + 4) : -4]), "<u8").reshape(5, 4, 2).copy()
    index[0, 0] = entry  # inner chunk (0, 0) of shard (0, 0)
    raw[-(n + 4) : -4] = index.tobytes()
    raw[-4:] = google_crc32c.value(bytes(raw[-(n + 4) : -4])).to_bytes(4, "little")  # a valid checksum over it
    open(key, "wb").write(bytes(raw))
    _, meta, engine = engine_for(path)
    stream = ArrayStream(meta, "C", with_header=False)

    async def main():
        with pytest.raises(CorruptChunk, match=r"a/c/0/0"):
            await engine.read(stream, 0, 16)
        return bytes(await engine.read(stream, (20 * SHAPE[1]) * 2, 16))  # inner chunk (2, 0)

    assert trio.run(main) == expected[20, :8].tobytes()


def _inner_bytes(shard: bytes, per_shard: tuple[int, int]) -> dict:
    """Encoded inner chunks of a zarr-python shard (index at the end, crc32c), by position."""
    n = per_shard[0] * per_shard[1]
    index = np.frombuffer(shard[-(16 * n + 4) : -4], "<u8").reshape(*per_shard, 2)
    return {
        (i, j): shard[int(o) : int(o) + int(k)]
        for i in range(per_shard[0])
        for j in range(per_shard[1])
        for o, k in [index[i, j]]
        if int(o) != 2**64 - 1
    }


def test_small_write_re_encodes_only_the_inner_chunks_it_touches(tmp_path):
    path = str(tmp_path / "s")
    expected = make(path).copy()
    per_shard = (SHARD[0] // INNER[0], SHARD[1] // INNER[1])
    before = _inner_bytes(open(f"{path}/a/c/0/0", "rb").read(), per_shard)
    store, meta, engine = engine_for(path)
    stream = ArrayStream(meta, "C", with_header=False)

    async def main():
        await engine.write(stream, (17 * SHAPE[1] + 3) * 2, np.array([1, 2, 3], "<u2").tobytes())
        await engine.flush()

    trio.run(main)
    expected[17, 3:6] = [1, 2, 3]
    np.testing.assert_array_equal(zarr.open_array(f"{path}/a", mode="r")[...], expected)
    after = _inner_bytes(open(f"{path}/a/c/0/0", "rb").read(), per_shard)
    assert after.keys() == before.keys()
    assert after[(2, 0)] != before[(2, 0)]  # the one inner chunk written
    assert {p: b for p, b in after.items() if p != (2, 0)} == {p: b for p, b in before.items() if p != (2, 0)}


class FirstSetFailsLate(Store):
    """A real local store whose first set waits until released, then fails (fault injection)."""

    def __init__(self, source):
        super().__init__(source)
        self.release, self.sets = threading.Event(), 0

    def set_sync(self, key, value):
        self.sets += 1
        if self.sets == 1:
            self.release.wait(10)
            raise StoreError(f"writing {key!r} failed: injected")
        super().set_sync(key, value)


def test_a_shard_written_while_its_store_fails_keeps_both_writes(tmp_path):
    path = str(tmp_path / "s")
    expected = make(path).copy()
    store = FirstSetFailsLate(path)
    meta = open_hierarchy_sync(store).node_sync("a")
    engine = Engine(store, ChunkCache(64 << 20))
    stream = ArrayStream(meta, "C", with_header=False)

    async def main():
        await engine.write(stream, (17 * SHAPE[1] + 3) * 2, np.array([1, 2], "<u2").tobytes())
        async with trio.open_nursery() as nursery:

            async def first_flush():
                with pytest.raises(StoreError, match="injected"):
                    await engine.flush()

            nursery.start_soon(first_flush)
            await trio.testing.wait_all_tasks_blocked()  # the shard is being stored
            # Written again meanwhile: patched from the copy being stored, not from the store.
            await engine.write(stream, (30 * SHAPE[1] + 20) * 2, np.array([9], "<u2").tobytes())
            store.release.set()
        await engine.flush()

    trio.run(main)
    expected[17, 3:5] = [1, 2]
    expected[30, 20] = 9
    np.testing.assert_array_equal(zarr.open_array(f"{path}/a", mode="r")[...], expected)


def test_index_with_a_bad_checksum_fails_only_its_shard(tmp_path):
    path = str(tmp_path / "s")
    expected = make(path)
    key = f"{path}/a/c/0/0"
    raw = bytearray(open(key, "rb").read())
    raw[-1] ^= 0xFF  # the crc32c of the index
    open(key, "wb").write(bytes(raw))
    _, meta, engine = engine_for(path)
    stream = ArrayStream(meta, "C", with_header=False)

    async def main():
        with pytest.raises(CorruptChunk, match=r"shard a/c/0/0: cannot decode its index"):
            await engine.read(stream, 0, 16)
        return bytes(await engine.read(stream, (0 * SHAPE[1] + 40) * 2, 16))  # shard (0, 1)

    assert trio.run(main) == expected[0, 40:48].tobytes()
    assert engine.stats()["errors"] == {"CorruptChunk": 1}
