"""Where a local Icechunk repository's native chunks lie (storage/icechunk/chunkfiles.py), from references as icechunk 2.x lists them."""

from __future__ import annotations

import logging
import threading

import numpy as np
import pytest

from zarrfs.errors import StoreError
from zarrfs.storage.icechunk import chunkfiles
from zarrfs.storage.icechunk.chunkfiles import ArrayChunks, ChunkFiles, split_chunk_key

NATIVE, VIRTUAL, INLINE = 1, 2, 3  # icechunk.ChunkType's values


def batch(rows):
    """One batch as array_chunk_iterator hands it over: (coords, kinds, paths, offsets, lengths, inlined)."""
    coords = np.array([r[0] for r in rows], np.uint32).reshape(len(rows), -1)
    kinds = np.array([r[1] for r in rows], np.uint8)
    paths = [r[2] for r in rows]
    offsets = np.array([r[3] for r in rows], np.uint64)
    lengths = np.array([r[4] for r in rows], np.uint64)
    inlined = {i: b"x" * r[4] for i, r in enumerate(rows) if r[1] == INLINE}
    return coords, kinds, paths, offsets, lengths, inlined


@pytest.mark.parametrize(
    "key, split",
    [
        ("a/b/c/0/12", ("a/b", (0, 12))),
        ("c/3", ("", (3,))),
        ("a/c", ("a", ())),
        ("c", ("", ())),
        ("c/b/c/1", ("c/b", (1,))),  # a group named c
        ("a/c/x", None),
        ("a/zarr.json", None),
        ("c/y/0/1", None),
        ("a/c/0.1", None),
        ("a/0/1", None),
    ],
)
def test_chunk_keys_in_the_default_encoding_are_split(key, split):
    assert split_chunk_key(key) == split


def test_a_table_holds_the_native_chunks_of_every_batch():
    table = ArrayChunks(
        [
            batch([((0, 0), NATIVE, "AAAA", 0, 100), ((0, 1), INLINE, "", 0, 8), ((2, 5), NATIVE, "BBBB", 16, 100)]),
            batch([((1, 3), VIRTUAL, "s3://b/f.nc", 4096, 100), ((7, 0), NATIVE, "CCCC", 0, 99)]),
        ]
    )
    assert len(table) == 3
    assert table.find((0, 0)) == ("AAAA", 0, 100)
    assert table.find((2, 5)) == ("BBBB", 16, 100)
    assert table.find((7, 0)) == ("CCCC", 0, 99)
    for coords in [(0, 1), (1, 3), (3, 3), (8, 0), (0, 6), (0,), (0, 0, 0)]:
        assert table.find(coords) is None  # inline, virtual, absent, past the grid, another rank


def test_a_0_d_array_and_an_empty_one():
    assert ArrayChunks([batch([((), NATIVE, "ZZZZ", 0, 8)])]).find(()) == ("ZZZZ", 0, 8)
    empty = ArrayChunks([])
    assert len(empty) == 0 and empty.find((0,)) is None


def test_chunk_files_are_found_below_the_repository_once_its_references_are_read(tmp_path):
    calls = []
    started = threading.Barrier(4)

    def references(path):
        calls.append(path)
        return [batch([((0, 1), NATIVE, "ID01", 32, 64)])]

    files = ChunkFiles(str(tmp_path), references)
    assert files.locate("g/x/c/0/1", load=False) is None  # not read yet: never waited for here
    assert calls == []
    found = []

    def locate():
        started.wait()
        found.append(files.locate("g/x/c/0/1"))

    threads = [threading.Thread(target=locate) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert found == [(str(tmp_path / "chunks" / "ID01"), 32, 64)] * 4
    assert calls == ["/g/x"]  # read once, by one thread
    assert files.locate("g/x/c/0/1", load=False) == found[0]
    assert files.locate("g/x/c/0/0") is None and files.locate("g/x/zarr.json") is None


def test_an_array_whose_references_cannot_be_read_is_left_to_icechunk(tmp_path, monkeypatch, caplog):
    """Too many chunks, or a failure listing them: its chunks are placed nowhere (icechunk reads
    them), said once in the log."""
    monkeypatch.setattr(chunkfiles, "MAX_REFS", 2)
    calls = []

    def references(path):
        calls.append(path)
        if path == "/bad":
            raise StoreError("listing the chunks of '/bad' failed: gone")
        return [batch([((i,), NATIVE, f"ID{i}", 0, 8) for i in range(3)])]

    files = ChunkFiles(str(tmp_path), references)
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            assert files.locate("big/c/0") is None
            assert files.locate("bad/c/0") is None
    assert calls == ["/big", "/bad"]
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 2 and "'big'" in said[0] and "more than 2 chunks" in said[0] and "gone" in said[1]
