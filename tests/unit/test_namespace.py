"""The namespace without FUSE: names, listings, lookup counts and forgetting, on a tmp_path store.

Expected values come from zarr-python reading the same store and from np.save.
"""

from __future__ import annotations

import io
import os

import numpy as np
import pytest
import trio
import zarr

from zarrfs.errors import NotFound
from zarrfs.tree.namespace import ROOT_INODE, Namespace

from support.core import lookup_path, make_ns, write_namespace_store


def npy_bytes(value: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, value)
    return buf.getvalue()


@pytest.fixture
def store_dir(tmp_path):
    return write_namespace_store(tmp_path / "s.zarr")


async def read_all(ns: Namespace, inode: int) -> bytes:
    handle = await ns.open(inode, os.O_RDONLY)
    try:
        return bytes(await handle.read(0, 1 << 20))
    finally:
        await handle.release()


async def test_a_forgotten_entry_is_dropped_and_comes_back_with_a_new_inode(store_dir):
    ns = make_ns(store_dir)
    start = ns.entry_count
    entry = await lookup_path(ns, "a.npy")
    assert ns.entry_count == start + 1
    ns.forget(entry.inode, 1)
    assert ns.entry_count == start
    with pytest.raises(NotFound):
        ns.get(entry.inode)
    again = await lookup_path(ns, "a.npy")
    assert again.inode != entry.inode
    want = np.asarray(zarr.open_array(str(store_dir / "a"))[...])
    assert await read_all(ns, again.inode) == npy_bytes(want)


async def test_an_entry_lives_while_the_kernel_or_an_open_file_holds_it(store_dir):
    ns = make_ns(store_dir)
    entry = await lookup_path(ns, ".zarrfs", "chunks", "a", "2.1.npy")
    ns.remember(entry)  # looked up twice: two references
    ns.forget(entry.inode, 1)
    assert ns.get(entry.inode) is entry
    handle = await ns.open(entry.inode, os.O_RDONLY)
    ns.forget(entry.inode, 1)
    assert ns.get(entry.inode) is entry  # open: kept
    want = np.asarray(zarr.open_array(str(store_dir / "a"))[4:6, 2:4])
    assert bytes(await handle.read(0, 1 << 20)) == npy_bytes(want)
    await handle.release()
    with pytest.raises(NotFound):
        ns.get(entry.inode)


async def test_listing_a_chunk_directory_does_not_pin_its_entries(store_dir):
    ns = make_ns(store_dir)
    chunks = await lookup_path(ns, ".zarrfs", "chunks", "a")
    start = ns.entry_count
    assert await ns.dir_len(chunks.inode) == 6
    items = await ns.dir_items(chunks.inode, 0, 100)
    assert [n for n, _ in items] == ["0.0.npy", "0.1.npy", "1.0.npy", "1.1.npy", "2.0.npy", "2.1.npy"]
    for _, entry in items[:4]:
        ns.remember(entry)  # as readdirplus does for the entries the reply held
    ns.drop_unused([e for _, e in items[4:]])  # the reply was full: these were never sent
    assert ns.entry_count == start + 4
    for _, entry in items[:4]:
        ns.forget(entry.inode, 1)
    assert ns.entry_count == start


async def test_group_listings_do_not_pin_their_children(store_dir):
    ns = make_ns(store_dir)
    start = ns.entry_count
    items = await ns.dir_items(ROOT_INODE, 0, 100)
    assert sorted(n for n, _ in items) == ["a.npy", "sub"]
    for _, entry in items:
        ns.remember(entry)
        ns.forget(entry.inode, 1)
    assert ns.entry_count == start
    assert sorted(n for n, _ in await ns.dir_items(ROOT_INODE, 0, 100)) == ["a.npy", "sub"]  # listed again


async def test_files_being_written_survive_forget(store_dir):
    ns = make_ns(store_dir, writable=True)
    entry, handle = await ns.create_file(ROOT_INODE, "new.npy")
    ns.remember(entry)
    value = np.arange(10, dtype="<u2")
    data = npy_bytes(value)
    await handle.write(0, data[:20])
    ns.forget(entry.inode, 1)
    assert ns.get(entry.inode) is entry  # holds bytes the store does not have
    await handle.write(20, data[20:])
    await handle.flush()
    await handle.release()
    np.testing.assert_array_equal(zarr.open_array(str(store_dir / "new"))[...], value)
    held, held_handle = await ns.create_file(ROOT_INODE, ".tmp.swp")
    await held_handle.release()
    ns.forget(held.inode, 1)
    assert ns.get(held.inode) is held  # a held file's bytes exist only here


async def test_stats_report_entries_and_open_files(store_dir):
    import json

    ns = make_ns(store_dir)
    stats = await lookup_path(ns, ".zarrfs", "stats.json")
    handle = await ns.open(stats.inode, os.O_RDONLY)
    doc = json.loads(bytes(await handle.read(0, 1 << 20)))
    assert doc["entries"] == ns.entry_count and doc["open_files"] == 1
    await handle.release()


async def test_concurrent_listings_load_once(store_dir, monkeypatch):
    ns = make_ns(store_dir)
    calls = []
    real = ns.hierarchy.children_sync

    def counting(path):
        calls.append(path)
        return real(path)

    monkeypatch.setattr(ns.hierarchy, "children_sync", counting)
    async with trio.open_nursery() as nursery:
        for _ in range(5):
            nursery.start_soon(ns.dir_len, ROOT_INODE)
    assert calls == [""]


async def test_a_directory_holding_a_file_apart_keeps_its_inode(store_dir):
    ns = make_ns(store_dir, writable=True)
    sub = await lookup_path(ns, "sub")
    held, handle = await ns.create_file(sub.inode, ".x.npy.AbC123")
    ns.remember(held)
    await handle.release()
    ns.forget(held.inode, 1)
    ns.forget(sub.inode, 1)  # the kernel forgot both; the held file's name hangs on sub's inode
    again = await lookup_path(ns, "sub")
    assert again is sub
    assert await ns.lookup(sub.inode, ".x.npy.AbC123") is held


async def test_a_time_set_while_a_plain_file_is_stored_reaches_its_key(store_dir, monkeypatch):
    """utimensat arriving while the file's store (fsync, write-back) is under way: the key
    ends with the time set, as the store's own file time says."""
    import threading

    import trio.testing

    ns = make_ns(store_dir, writable=True)
    entry, handle = await ns.create_file(ROOT_INODE, "notes.txt")
    await handle.write(0, b"kept")
    started, go_on = threading.Event(), threading.Event()
    real = ns.hierarchy.store.put_stream_sync

    def slow_put(key, source):
        started.set()
        go_on.wait()
        real(key, source)

    monkeypatch.setattr(ns.hierarchy.store, "put_stream_sync", slow_put)
    when_ns = 1_300_000_000_123_456_789
    async with trio.open_nursery() as nursery:
        nursery.start_soon(handle.fsync)
        await trio.to_thread.run_sync(started.wait)
        nursery.start_soon(ns.set_times, entry, when_ns)
        await trio.testing.wait_all_tasks_blocked()
        go_on.set()
    await handle.release()
    assert (store_dir / "notes.txt").read_bytes() == b"kept"
    assert os.stat(store_dir / "notes.txt").st_mtime_ns == when_ns


async def test_a_group_moved_while_a_plain_file_inside_is_removed(store_dir, monkeypatch):
    """rm of a plain file in a group (its key being erased) and mv of the group at once: the
    move waits for the removal, then moves the rest; the removed file stays removed."""
    import threading

    import trio.testing

    ns = make_ns(store_dir, writable=True)
    sub = await lookup_path(ns, "sub")
    for name in ("gone.txt", "kept.txt"):
        entry, handle = await ns.create_file(sub.inode, name)
        await handle.write(0, name.encode())
        await handle.fsync()
        await handle.release()
    started, go_on = threading.Event(), threading.Event()
    real = ns.hierarchy.store.erase_sync

    def slow_erase(key):
        if key.endswith("gone.txt"):
            started.set()
            go_on.wait()
        real(key)

    monkeypatch.setattr(ns.hierarchy.store, "erase_sync", slow_erase)
    await lookup_path(ns, "sub", "gone.txt")  # listings loaded: neither call below waits for one
    await lookup_path(ns, "sub", "kept.txt")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(ns.unlink, sub.inode, "gone.txt")
        await trio.to_thread.run_sync(started.wait)
        nursery.start_soon(ns.rename, ROOT_INODE, "sub", ROOT_INODE, "moved")
        await trio.testing.wait_all_tasks_blocked()
        go_on.set()
    assert sorted(p.name for p in (store_dir / "moved").iterdir()) == ["b", "kept.txt", "zarr.json"]
    assert not (store_dir / "sub").exists()
    moved = await lookup_path(ns, "moved")
    assert sorted(await ns.children(moved.inode)) == ["b.npy", "kept.txt"]
    assert await read_all(ns, (await ns.lookup(moved.inode, "kept.txt")).inode) == b"kept.txt"


def test_an_open_while_a_versioned_store_moves_starts_without_the_kernel_s_pages():
    """freshness.keep_pages: a versioned store's files keep the kernel's pages while it shows the
    snapshot they were read in; an open once it shows another (its old pages not yet dropped)
    starts without them. Other stores keep them only without a TTL."""
    from types import SimpleNamespace

    from zarrfs.tree.entries import Entry
    from zarrfs.tree.freshness import Freshness
    from zarrfs.views.kinds import Kind

    def freshness_of(store, ttl, versioned=False):
        hierarchy = SimpleNamespace(store=store)
        return Freshness(None, hierarchy, None, None, "", None, ttl, store if versioned else None)

    repo = SimpleNamespace(snapshot_id="S1", follow_tip_sync=lambda may_move: False)
    fresh, entry = freshness_of(repo, 10.0, versioned=True), Entry(2, Kind.ARRAY)
    assert not fresh.keep_pages(entry)  # its first open: no pages of a known snapshot
    assert fresh.keep_pages(entry)
    repo.snapshot_id = "S2"  # moved; `revalidate` has not dropped the pages yet
    assert not fresh.keep_pages(entry)
    assert fresh.keep_pages(entry)
    plain = SimpleNamespace()
    assert freshness_of(plain, float("inf")).keep_pages(Entry(3, Kind.ARRAY))
    assert not freshness_of(plain, 10.0).keep_pages(Entry(3, Kind.ARRAY))
