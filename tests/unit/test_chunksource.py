"""Chunk sources: keyed chunks, inner chunks of shards read through their index, the drafts' shard rewrites."""

import json

import numpy as np
import pytest
import trio

from zarrfs.engine import Engine
from zarrfs.engine.cache import ChunkCache
from zarrfs.errors import CorruptChunk
from zarrfs.formats import open_hierarchy_sync
from zarrfs.storage.chunksource import KeyedChunks, ShardedChunks, ShardedInner
from zarrfs.storage.keys import ChunkKeys
from zarrfs.storage.store import Store
from zarrfs.views.streams import ArrayStream

from support.v3draft import shard_bytes


class RecordingStore:
    """A store of bytes in memory that records every call (to check ranged reads)."""

    def __init__(self, values: dict[str, bytes]):
        self.values = values
        self.calls: list[tuple] = []

    def get_sync(self, key, max_nbytes=None):
        self.calls.append(("get", key))
        return self.values.get(key)

    def get_suffix_sync(self, key, n):
        self.calls.append(("suffix", key, n))
        return self.values[key][-n:] if key in self.values else None

    def get_range_sync(self, key, start, end):
        self.calls.append(("range", key, start, end))
        return self.values[key][start:end]

    def get_ranges_sync(self, key, ranges):
        return [self.get_range_sync(key, start, end) for start, end in ranges]

    def set_sync(self, key, value):
        self.calls.append(("set", key))
        self.values[key] = bytes(value)

    def erase_sync(self, key):
        self.calls.append(("erase", key))
        self.values.pop(key, None)


def test_sources_say_what_they_can_read_in_part():
    keys = ChunkKeys("a", "/", "c", "c")
    assert not KeyedChunks(keys).partial_reads
    drafts = ShardedChunks(keys, (2,))
    assert drafts.partial_reads and drafts.rewrites_shard and not drafts.shard_is_chunk
    assert ShardedInner.partial_reads and ShardedInner.shard_is_chunk and not ShardedInner.rewrites_shard


def test_sharded_chunks_ranged_reads():
    src = ShardedChunks(ChunkKeys("data/a", ".", "c", "c"), (2, 2))
    store = RecordingStore({"data/a/c1.0": shard_bytes({3: b"three", 1: b"one"}, 4)})
    assert src.read_sync(store, (3, 1)) == b"three"  # local (1, 1) -> position 3
    assert src.read_sync(store, (2, 1)) == b"one"
    assert src.read_sync(store, (2, 0)) is None
    assert src.read_sync(store, (0, 0)) is None  # shard c0.0 is absent
    assert ("get", "data/a/c1.0") not in store.calls  # never the whole shard
    assert store.calls[:2] == [("suffix", "data/a/c1.0", 64), ("range", "data/a/c1.0", 0, 5)]


def test_sharded_chunks_corrupt():
    src = ShardedChunks(ChunkKeys("d", "/", "c", "c"), (2,))
    with pytest.raises(CorruptChunk, match="shorter than its index"):
        src.read_sync(RecordingStore({"d/c0": b"\0" * 20}), (0,))
    index = np.array([[0, 100], [2**64 - 1, 2**64 - 1]], dtype="<u8").tobytes()
    with pytest.raises(CorruptChunk, match="outside the shard"):
        src.read_sync(RecordingStore({"d/c0": b"abc" + index}), (0,))
    index = np.array([[0, 2**64 - 1], [2**64 - 1, 2**64 - 1]], dtype="<u8").tobytes()
    with pytest.raises(CorruptChunk, match="bad index entry"):
        src.read_sync(RecordingStore({"d/c0": index}), (0,))


def test_sharded_chunks_rewrite_keeps_the_others_and_erases_an_empty_shard():
    src = ShardedChunks(ChunkKeys("d", "/", "c", "c"), (3,))
    store = RecordingStore({"d/c0": shard_bytes({0: b"zero", 2: b"two"}, 3)})
    src.write_sync(store, (1,), b"one")
    assert store.values["d/c0"] == shard_bytes({0: b"zero", 1: b"one", 2: b"two"}, 3)
    for i in range(3):
        src.write_sync(store, (i,), None)
    assert "d/c0" not in store.values and ("erase", "d/c0") in store.calls
    src.write_sync(store, (4,), None)  # nothing stored, nothing to store
    assert "d/c1" not in store.values


def draft_store(tmp_path, n_chunks: int, per_shard: int):
    (tmp_path / "meta").mkdir()
    (tmp_path / "zarr.json").write_text(json.dumps({"zarr_format": "https://purl.org/zarr/spec/core/3.0"}))
    st = [
        {
            "extension": "https://purl.org/zarr/spec/storage_transformers/sharding/1.0",
            "type": "indexed",
            "configuration": {"chunks_per_shard": [per_shard]},
        }
    ]
    doc = {
        "shape": [2 * n_chunks],
        "data_type": "uint8",
        "chunk_grid": {"type": "regular", "chunk_shape": [2]},
        "chunk_memory_layout": "C",
        "fill_value": 9,
        "storage_transformers": st,
    }
    (tmp_path / "meta" / "a.array.json").write_text(json.dumps(doc))
    (tmp_path / "data" / "a").mkdir(parents=True)
    for s in range(n_chunks // per_shard):
        chunks = {p: bytes([s * per_shard + p] * 2) for p in range(per_shard)}
        (tmp_path / "data" / "a" / f"c{s}").write_bytes(shard_bytes(chunks, per_shard))
    store = Store(str(tmp_path))
    return store, open_hierarchy_sync(store).node_sync("a")


def test_drafts_index_read_once_per_shard_through_the_engine(tmp_path):
    """The drafts' transformer goes through the engine's index cache and single-flight:
    one index read per shard, however many inner chunks are read, one by one or at once."""
    store, meta = draft_store(tmp_path, 8, 4)

    async def main():
        engine = Engine(store, ChunkCache(1 << 20))
        stream = ArrayStream(meta, "C", with_header=False)
        for i in range(8):  # one chunk at a time: the second shard's index is cached too
            assert bytes(await engine.read(stream, 2 * i, 2)) == bytes([i, i])
        first = engine.stats()["chunk_gets"]
        engine.drop_clean_chunks()  # nothing cached: every chunk at once, concurrently
        assert bytes(await engine.read(stream, 0, 16)) == bytes(i for i in range(8) for _ in range(2))
        return first, engine.stats()["chunk_gets"] - first

    one_by_one, at_once = trio.run(main)
    assert one_by_one == 2 + 8  # two index reads, eight ranges
    assert at_once == 2 + 2  # two index reads, one merged range per shard


def test_drafts_reader_waits_for_a_rewrite_of_its_shard(tmp_path):
    """A reader of one inner chunk while another of its shard is being rewritten reads the
    shard before or after the rewrite, never offsets of one over bytes of the other."""
    store, meta = draft_store(tmp_path, 4, 4)

    async def main():
        engine = Engine(store, ChunkCache(1 << 20))
        stream = ArrayStream(meta, "C", with_header=False)
        for round_ in range(20):
            engine.drop_clean_chunks()
            value = bytes([100 + round_] * 2)
            await engine.write(stream, 0, value)  # chunk 0 dirty: its flush rewrites the shard
            async with trio.open_nursery() as nursery:
                nursery.start_soon(engine.flush)
                got = {}

                async def read(i):
                    got[i] = bytes(await engine.read(stream, 2 * i, 2))  # noqa: B023

                for i in (1, 2, 3):
                    nursery.start_soon(read, i)
            assert got == {1: b"\x01\x01", 2: b"\x02\x02", 3: b"\x03\x03"}

    trio.run(main)
