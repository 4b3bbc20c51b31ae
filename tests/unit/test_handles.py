"""Open-file objects without FUSE: what open refuses, each kind's reads and writes, per-open read-ahead.

Expected values come from zarr-python reading the same store and from np.save.
"""

from __future__ import annotations

import errno
import io
import os

import numpy as np
import pytest
import trio
import zarr

from zarrfs.errors import ZarrfsError
from zarrfs.tree.handles import ArrayHandle, PlainFileHandle, SnapshotHandle, StoreKeyHandle
from zarrfs.tree.namespace import ROOT_INODE

from support.core import lookup_path, make_ns, write_namespace_store


@pytest.fixture
def store_dir(tmp_path):
    return write_namespace_store(tmp_path / "s.zarr")


def npy_bytes(value: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, value)
    return buf.getvalue()


async def open_path(ns, flags, *names):
    entry = await lookup_path(ns, *names)
    return await ns.open(entry.inode, flags)


async def refused(coro) -> int:
    with pytest.raises(ZarrfsError) as e:
        await coro
    return e.value.errno


async def test_each_kind_of_file_gets_its_handle(store_dir):
    ns = make_ns(store_dir)
    assert isinstance(await open_path(ns, os.O_RDONLY, "a.npy"), ArrayHandle)
    assert isinstance(await open_path(ns, os.O_RDONLY, ".zarrfs", "chunks", "a", "0.0.npy"), ArrayHandle)
    stats = await open_path(ns, os.O_RDONLY, ".zarrfs", "stats.json")
    assert isinstance(stats, SnapshotHandle) and stats.direct_io
    key = await open_path(ns, os.O_RDONLY, ".zarrfs", "store", "a", "zarr.json")
    assert isinstance(key, StoreKeyHandle)
    assert await key.read(0, 1 << 20) == (store_dir / "a" / "zarr.json").read_bytes()
    info = await open_path(ns, os.O_RDONLY, ".zarrfs", "info", "a.json")
    assert isinstance(info, SnapshotHandle) and not info.direct_io


async def test_open_refuses_what_it_must(store_dir):
    ro = make_ns(store_dir)
    assert await refused(open_path(ro, os.O_WRONLY, "a.npy")) == errno.EROFS
    assert await refused(open_path(ro, os.O_RDONLY, "sub")) == errno.EISDIR
    rw = make_ns(store_dir, writable=True)
    assert await refused(open_path(rw, os.O_WRONLY | os.O_APPEND, "a.npy")) == errno.EINVAL
    assert await refused(open_path(rw, os.O_WRONLY, ".zarrfs", "stats.json")) == errno.EACCES
    assert await refused(open_path(rw, os.O_WRONLY, ".zarrfs", "store", "a", "zarr.json")) == errno.EACCES


async def test_a_snapshot_keeps_the_bytes_of_its_open(store_dir):
    ns = make_ns(store_dir)
    first = await open_path(ns, os.O_RDONLY, ".zarrfs", "stats.json")
    before = await first.read(0, 1 << 20)
    await (await open_path(ns, os.O_RDONLY, "a.npy")).read(0, 1 << 20)
    assert await first.read(0, 1 << 20) == before
    assert await (await open_path(ns, os.O_RDONLY, ".zarrfs", "stats.json")).read(0, 1 << 20) != before


async def test_two_opens_of_one_file_keep_their_own_read_ahead(tmp_path):
    root = tmp_path / "r.zarr"
    a = zarr.create_array(str(root), shape=(64, 40), chunks=(8, 40), dtype="<f8", zarr_format=3)
    a[...] = np.arange(64 * 40, dtype="<f8").reshape(64, 40)
    ns = make_ns(root)
    name = "r.npy"
    one, two = await open_path(ns, os.O_RDONLY, name), await open_path(ns, os.O_RDONLY, name)
    hlen = len(npy_bytes(np.zeros((64, 40), "<f8"))) - 64 * 40 * 8
    row = 40 * 8
    async with trio.open_nursery() as nursery:
        await nursery.start(ns.engine.run)
        for i in range(6):  # interleaved sequential readers far apart: each is sequential on its own
            await one.read(hlen + i * row, row)
            await two.read(hlen + (32 + i) * row, row)
        await trio.sleep(0.2)
        assert ns.engine.counters["prefetched"] > 0
        nursery.cancel_scope.cancel()


async def test_a_new_file_is_read_as_written_and_committed_at_close(store_dir):
    ns = make_ns(store_dir, writable=True)
    value = np.arange(12, dtype=">i2").reshape(3, 4)
    data = npy_bytes(value)
    entry, handle = await ns.create_file(ROOT_INODE, "c.npy")
    await handle.write(0, data[:30])
    assert await handle.read(0, 100) == data[:30]  # no whole header yet: what was written
    await handle.write(30, data[30:])
    assert await handle.read(0, len(data)) == data  # the writer's own layout
    await handle.flush()
    await handle.release()
    np.testing.assert_array_equal(zarr.open_array(str(store_dir / "c"))[...], value)


async def test_a_flush_before_the_file_is_complete_leaves_it_to_the_last_close(store_dir):
    """FUSE flushes at every close(2) of a descriptor, a forked child's too: a flush of a file
    short of its header or data neither fails nor ends it; its release decides."""
    ns = make_ns(store_dir, writable=True)
    value = np.arange(600, dtype="<f8").reshape(20, 30)
    data = npy_bytes(value)
    hlen = len(data) - value.nbytes
    _, handle = await ns.create_file(ROOT_INODE, "c.npy")
    done = 0
    for end in (hlen // 2, hlen + value.nbytes // 2, len(data)):
        await handle.write(done, data[done:end])
        done = end
        await handle.flush()  # a child's close: in the header, in the data, then complete
    await handle.release()
    np.testing.assert_array_equal(zarr.open_array(str(store_dir / "c"))[...], value)
    _, short = await ns.create_file(ROOT_INODE, "d.npy")
    await short.write(0, data[: hlen + 8])
    await short.flush()
    assert "d.npy" in await ns.children(ROOT_INODE)
    await short.release()
    assert "d.npy" not in await ns.children(ROOT_INODE)
    assert not (store_dir / "d").exists()


async def test_held_files_read_write_truncate_and_vanish(store_dir):
    ns = make_ns(store_dir, writable=True)
    entry, handle = await ns.create_file(ROOT_INODE, "notes.txt")
    assert isinstance(handle, PlainFileHandle)
    await handle.write(0, b"hello world")
    await ns.truncate(entry, 5)
    assert await handle.read(0, 100) == b"hello"
    await ns.unlink(ROOT_INODE, "notes.txt")
    assert await refused(handle.read(0, 10)) == errno.ENOENT


async def test_closed_plain_files_keep_a_bounded_memory(store_dir, monkeypatch):
    """Plain files closed and waiting for their write-back hold at most PLAIN_MEMORY_MAX_BYTES
    in memory together; a file closed past it moves to TMPDIR and reads back the same."""
    from zarrfs.tree import plain

    monkeypatch.setattr(plain, "PLAIN_MEMORY_MAX_BYTES", 150_000)
    ns = make_ns(store_dir, writable=True)
    data = {f"f{i}.bin": os.urandom(100_000) for i in range(3)}
    for name, value in data.items():
        entry, handle = await ns.create_file(ROOT_INODE, name)
        await handle.write(0, value)
        await handle.flush()
        await handle.release()
    assert ns.plain.memory.bytes == 100_000  # the first file; the others went to TMPDIR
    for name, value in data.items():
        assert await (await open_path(ns, os.O_RDONLY, name)).read(0, 200_000) == value
    await ns.unlink(ROOT_INODE, "f0.bin")
    assert ns.plain.memory.bytes == 0
    await ns.shutdown()  # no engine running: stored here
    assert sorted(p.name for p in store_dir.glob("f*.bin")) == ["f1.bin", "f2.bin"]
    assert (store_dir / "f2.bin").read_bytes() == data["f2.bin"]


async def test_a_sparse_plain_file_keeps_memory_bounded(store_dir):
    """A write far past a plain file's end, or a truncate(2) that extends it, takes no memory
    for the gap: it goes to TMPDIR first (where the gap costs no memory either)."""
    import tracemalloc

    from zarrfs.tree.plain import PLAIN_MEMORY_BYTES

    ns = make_ns(store_dir, writable=True)
    far = 256 << 20
    entry, handle = await ns.create_file(ROOT_INODE, "sparse.bin")
    extended, other = await ns.create_file(ROOT_INODE, "extended.bin")
    tracemalloc.start()
    try:
        await handle.write(far, b"end")
        await ns.truncate(extended, far)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < PLAIN_MEMORY_BYTES, f"{peak} bytes in memory for a sparse file"
    assert entry.size == far + 3 and extended.size == far
    assert await handle.read(far - 2, 10) == b"\0\0end"
    assert await other.read(far - 4, 10) == b"\0" * 4
    await handle.release()
    await other.release()


async def test_a_read_of_a_kept_plain_file_during_its_move_reads_the_new_key(store_dir):
    """A plain file whose bytes are only in the store, read while a rename moves its key: the
    read waits for the move and reads the new key instead of failing on the old one."""
    import trio.testing

    from zarrfs.tree.plain import PlainFile

    ns = make_ns(store_dir, writable=True)
    (store_dir / "old.txt").write_bytes(b"kept bytes")
    held = PlainFile(ns.engine, "old.txt", size=10, stored=True)
    got = []

    async def read() -> None:
        got.append(await held.read(0, 100))

    async with trio.open_nursery() as nursery:
        async with held.lock:  # what a rename holds while it moves the key
            os.rename(store_dir / "old.txt", store_dir / "new.txt")
            nursery.start_soon(read)
            await trio.testing.wait_all_tasks_blocked()
            held.key = "new.txt"
    assert got == [b"kept bytes"]


async def test_statistics_rewrites_share_a_bounded_memory(store_dir, monkeypatch, caplog):
    """Rewrites of gdal/PATH.vrt held by open descriptors (read-only mount) take at most
    REWRITES_MAX_BYTES together: a write past it fails with ENOSPC, and the room comes back
    when a descriptor is released."""
    from zarrfs.tree import handles

    monkeypatch.setattr(handles, "REWRITES_MAX_BYTES", 100_000)
    ns = make_ns(store_dir)
    names = (".zarrfs", "gdal", "a.vrt")
    first = await open_path(ns, os.O_WRONLY | os.O_TRUNC, *names)
    second = await open_path(ns, os.O_WRONLY | os.O_TRUNC, *names)
    assert await first.write(0, b" " * 60_000) == 60_000
    assert await second.write(0, b" " * 30_000) == 30_000
    assert await refused(second.write(30_000, b" " * 30_000)) == errno.ENOSPC
    assert "statistics not saved" in caplog.text
    await first.release()
    assert await second.write(30_000, b" " * 30_000) == 30_000
    await second.release()
    assert ns.files.rewrite_bytes == 0
