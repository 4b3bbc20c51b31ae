"""Arrays written straight under their final keys on an object-store-like store (failfile://, local disk
behind fsspec): what zarr-python reads before and after the commit, the old array's keys, the sweep."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import zarr

from zarrfs.engine.writeback import encode_chunk_sync
from zarrfs.formats.v2 import V2Hierarchy
from zarrfs.formats.v3 import V3Hierarchy
from zarrfs.grid import all_chunks, chunk_slices, data_shape
from zarrfs.model import NewArray
from zarrfs.storage import chunksource, staging
from zarrfs.storage.store import Store

import support.failing_store  # noqa: F401 (registers failfile://)

HIERARCHIES = {2: V2Hierarchy, 3: V3Hierarchy}
FORMATS = pytest.mark.parametrize("fmt", [2, 3], ids=["v2", "v3"])


def _open(root, fmt):
    store = Store(f"failfile://{root}")
    return HIERARCHIES[fmt].open_sync(store)


def _write_chunks(h, staged, x: np.ndarray, stop_after: int | None = None) -> None:
    """Encode and store every chunk of X as the engine does (the first STOP_AFTER only), noting
    those stored with data in `staged.stored` as the engine's write-back does."""
    meta = staged.meta
    for n, idx in enumerate(all_chunks(meta.shape, meta.chunk_shape)):
        if stop_after is not None and n >= stop_after:
            return
        part = np.full(meta.chunk_shape, meta.fill_value, dtype=meta.dtype)
        part[tuple(slice(0, b) for b in data_shape(idx, meta.shape, meta.chunk_shape))] = x[
            chunk_slices(idx, meta.shape, meta.chunk_shape)
        ]
        data = encode_chunk_sync(meta, meta.chunk_key(idx), part)
        if data is not None:
            chunksource.write_chunk_sync(meta, h.store, idx, data)
            staged.stored.add(idx)


def _old_chunks(files: list[str]) -> list[str]:
    """The chunk keys of array `a` among FILES (every key below it but its documents)."""
    return [f for f in files if f.startswith("a/") and f.rpartition("/")[2] not in (".zarray", ".zattrs", "zarr.json")]


def _files(root) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def _with_old_array(tmp_path, fmt):
    """A store with array `a` written by zarr-python: (root, its values, its files, the hierarchy
    opened over failfile://, the node of `a`)."""
    root = tmp_path / "s.zarr"
    g = zarr.open_group(str(root), mode="w", zarr_format=fmt)
    old = np.arange(24 * 18, dtype="<i2").reshape(24, 18)
    g.create_array("a", shape=old.shape, chunks=(10, 10), dtype=old.dtype)[:] = old
    h = _open(root, fmt)
    return root, old, _files(root), h, h.node_sync("a")


@FORMATS
def test_new_array_appears_with_its_document(tmp_path, fmt):
    root = tmp_path / "s.zarr"
    zarr.open_group(str(root), mode="w", zarr_format=fmt)
    h = _open(root, fmt)
    x = np.arange(30 * 20, dtype="<f4").reshape(30, 20)
    staged = h.begin_array_sync(h.stage_array("a", NewArray(x.shape, x.dtype, (8, 8)), "w1"), None)
    assert staged.direct and staged.meta.keys.prefix == "a"
    _write_chunks(h, staged, x)
    assert "a" not in zarr.open_group(str(root), mode="r")  # chunks, no document: no node
    h.commit_array_sync(staged, None)
    np.testing.assert_array_equal(zarr.open_array(str(root / "a"), mode="r")[...], x)
    assert h.erases.drain(30) == 0
    assert not [f for f in _files(root) if ".zarrfs" in f]


@FORMATS
def test_replacement_keeps_the_old_array_until_its_document(tmp_path, fmt):
    root, old, before, h, node = _with_old_array(tmp_path, fmt)
    x = np.random.default_rng(1).normal(size=(33, 7)).astype("<f8")
    staged = h.begin_array_sync(h.stage_array("a", NewArray(x.shape, x.dtype, (8, 4)), "w1"), node)
    assert staged.direct and staged.final.keys.sep != node.keys.sep
    _write_chunks(h, staged, x)
    np.testing.assert_array_equal(zarr.open_array(str(root / "a"), mode="r")[...], old)
    h.commit_array_sync(staged, node)
    np.testing.assert_array_equal(zarr.open_array(str(root / "a"), mode="r")[...], x)
    assert h.erases.drain(30) == 0  # the old keys go in the background
    after = _files(root)
    assert not set(_old_chunks(before)) & set(after)
    assert not [f for f in after if ".zarrfs" in f]


def test_one_dimensional_v2_replacement_is_staged(tmp_path):
    """`5` is a chunk key with either separator: no direct write."""
    root = tmp_path / "s.zarr"
    g = zarr.open_group(str(root), mode="w", zarr_format=2)
    g.create_array("v", shape=(50,), chunks=(10,), dtype="<i4")[:] = np.arange(50)
    h = _open(root, 2)
    staged = h.begin_array_sync(h.stage_array("v", NewArray((40,), np.dtype("<i4"), (8,)), "w1"), h.node_sync("v"))
    assert not staged.direct and staged.meta.keys.prefix.rpartition("/")[2].startswith(".zarrfs-new-")


@FORMATS
def test_new_array_over_stray_keys_erases_those_of_its_encoding(tmp_path, fmt):
    """Keys a writer that died left under a new array's name are listed beside its chunks: those
    of its encoding that it did not store (a chunk it leaves at the fill value) go before its
    document, or zarr-python would read them as its chunks; other keys stay."""
    root = tmp_path / "s.zarr"
    zarr.open_group(str(root), mode="w", zarr_format=fmt)
    h = _open(root, fmt)
    x = np.zeros((4, 4), "<f4")
    x[:2, :2] = 5  # chunk (0, 0) holds data, the other three the fill value
    planned = h.stage_array("b", NewArray(x.shape, x.dtype, (2, 2)), "w1")
    assert planned.final.fill_value == 0
    for idx in ((0, 0), (1, 1)):
        h.store.set_sync(planned.final.keys.key(idx), b"left by a writer that died")
    h.store.set_sync("b/notes", b"x")
    staged = h.begin_array_sync(planned, None)
    assert staged.direct
    _write_chunks(h, staged, x)
    assert staged.stored == {(0, 0)}
    h.commit_array_sync(staged, None)
    np.testing.assert_array_equal(zarr.open_array(str(root / "b"), mode="r")[...], x)
    assert h.erases.drain(30) == 0
    assert (root / "b" / "notes").read_bytes() == b"x"
    assert not [f for f in _files(root) if ".zarrfs" in f]


@FORMATS
@pytest.mark.parametrize("committed", [False, True], ids=["before-commit", "after-commit"])
def test_sweep_of_a_dead_direct_writer(tmp_path, fmt, committed):
    """A writer gone (no lease, keys an hour old) mid-replacement: before its document, its chunks
    go and the old array stays; after it, the old array's leftovers go and the new one stays."""
    root, old, before, h, node = _with_old_array(tmp_path, fmt)
    x = np.random.default_rng(2).normal(size=(20, 20)).astype("<f4")
    staged = h.begin_array_sync(h.stage_array("a", NewArray(x.shape, x.dtype, (8, 8)), "dead"), node)
    _write_chunks(h, staged, x, stop_after=None if committed else 3)
    if committed:  # the document written, the old keys not yet erased
        for key in sorted(staged.docs, key=lambda k: k == staged.final.metadata_key):
            h.store.set_sync(key, staged.docs[key])
    out = staging.sweep_sync(_open(root, fmt), "me", now_s=time.time() + 2 * staging.LEASE_STALE_S)
    assert out["removed"] == 1
    if committed:
        np.testing.assert_array_equal(zarr.open_array(str(root / "a"), mode="r")[...], x)
        assert not set(_old_chunks(before)) & set(_files(root))
    else:
        np.testing.assert_array_equal(zarr.open_array(str(root / "a"), mode="r")[...], old)
        assert _files(root) == before


@FORMATS
def test_second_replacement_waits_for_the_first_ones_erase(tmp_path, fmt):
    """The first replacement's old keys take the separator the second one writes under: the
    second begins (lists the path) only once that erase is over, and keeps all its chunks."""
    root = tmp_path / "s.zarr"
    g = zarr.open_group(str(root), mode="w", zarr_format=fmt)
    g.create_array("a", shape=(24, 18), chunks=(10, 10), dtype="<i2")[:] = 1
    h = _open(root, fmt)
    events: list[str] = []
    erase_may_run = threading.Event()
    erase_many, sizes_below = h.store.erase_many_sync, h.store.sizes_below_sync

    def held_erase(keys):
        erase_may_run.wait()
        erase_many(keys)
        events.append("erased")

    def listing(prefix):
        events.append("listed")
        return sizes_below(prefix)

    h.store.erase_many_sync, h.store.sizes_below_sync = held_erase, listing
    x = np.random.default_rng(3).normal(size=(30, 20)).astype("<f4")
    first = h.begin_array_sync(h.stage_array("a", NewArray(x.shape, x.dtype, (8, 8)), "w1"), h.node_sync("a"))
    _write_chunks(h, first, x)
    h.commit_array_sync(first, h.node_sync("a"))  # returns with the erase held
    np.testing.assert_array_equal(zarr.open_array(str(root / "a"), mode="r")[...], x)
    events.clear()
    y = np.random.default_rng(4).normal(size=(30, 20)).astype("<f4")
    begun: list = []
    node = h.node_sync("a")
    second = threading.Thread(
        target=lambda: begun.append(h.begin_array_sync(h.stage_array("a", NewArray(y.shape, y.dtype, (8, 8))), node))
    )
    second.start()
    erase_may_run.set()
    second.join()
    staged = begun[0]
    staged.found.result()  # (listed beside its first chunks)
    assert events[:2] == ["erased", "listed"]
    assert staged.direct and staged.final.keys.sep != node.keys.sep
    _write_chunks(h, staged, y)
    h.commit_array_sync(staged, node)
    assert h.erases.drain(30) == 0
    np.testing.assert_array_equal(zarr.open_array(str(root / "a"), mode="r")[...], y)
    assert len(_old_chunks(_files(root))) == 4 * 3
    assert not [f for f in _files(root) if ".zarrfs" in f]


@FORMATS
def test_sweep_keeps_the_keys_of_a_writer_at_work_on_the_same_array(tmp_path, fmt):
    """A writer died mid-replacement; this mount's writer (the sweep's own) replaces the same
    array again, under the same key names, while the sweep runs: the dead writer's marker no
    longer decides over those keys, and the new array reads whole once committed."""
    root, old, _, h, node = _with_old_array(tmp_path, fmt)
    dead = h.begin_array_sync(h.stage_array("a", NewArray((20, 20), np.dtype("<f4"), (8, 8)), "dead"), node)
    _write_chunks(h, dead, np.ones((20, 20), "<f4"), stop_after=3)
    x = np.random.default_rng(5).normal(size=(20, 20)).astype("<f4")
    live = h.begin_array_sync(h.stage_array("a", NewArray(x.shape, x.dtype, (8, 8)), "me"), node)
    assert live.final.keys == dead.final.keys  # the same names: the dead writer's sweep would erase these
    _write_chunks(h, live, x)
    out = staging.sweep_sync(_open(root, fmt), "me", now_s=time.time() + 2 * staging.LEASE_STALE_S)
    assert out["removed"] == 1
    h.commit_array_sync(live, node)
    np.testing.assert_array_equal(zarr.open_array(str(root / "a"), mode="r")[...], x)
