"""The Icechunk store adapter without a mount: reads, listings, ranges, detection, following a branch."""

from __future__ import annotations

import icechunk
import numpy as np
import pytest
import zarr

from zarrfs.errors import ReadOnly, UserError
from zarrfs.storage.icechunk import IcechunkStore, looks_like_repository_sync
from zarrfs.storage.icechunk.keys import SNAPSHOT_PREFIX
from zarrfs.storage.store import Store

from support import icechunk_repo


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    return icechunk_repo.build(tmp_path_factory.mktemp("ice") / "repo")


def _session_store(repo, snapshot_id):
    return repo.open().readonly_session(snapshot_id=snapshot_id).store


def sync_list(session_store):
    """Every key of a session's store, as icechunk lists them."""
    from zarr.core.sync import sync

    async def keys():
        return [k async for k in session_store.list()]

    return sorted(sync(keys()))


def _oracle_get(repo, snapshot_id, key):
    from zarr.core.buffer import default_buffer_prototype
    from zarr.core.sync import sync

    got = sync(_session_store(repo, snapshot_id).get(key, default_buffer_prototype()))
    return None if got is None else got.to_bytes()


def test_detection(repo, tmp_path):
    assert looks_like_repository_sync(Store(str(repo.path)))
    plain = tmp_path / "plain.zarr"
    zarr.open_group(str(plain), mode="w", zarr_format=3).create_group("snapshots")
    assert not looks_like_repository_sync(Store(str(plain)))


def test_reads_equal_icechunk(repo):
    store = IcechunkStore(str(repo.path))
    tip = repo.snapshots["main"]
    assert store.snapshot_id == tip
    for key in ("zarr.json", "g/t/zarr.json", "g/t/c/0/0", "s/c/0/0"):
        assert store.get_sync(key, None) == _oracle_get(repo, tip, key)
    assert store.get_sync("g/t/c/3/1") is None  # never written: the fill value
    assert store.get_sync("g") is None and store.get_sync("g/t") is None  # prefixes, not keys
    many = store.get_many_sync(["zarr.json", "g/zarr.json", "nope/zarr.json"])
    assert many["nope/zarr.json"] is None and many["g/zarr.json"] == _oracle_get(repo, tip, "g/zarr.json")


def test_chunks_come_uncopied(repo):
    """A chunk that icechunk reads is handed on in icechunk's own buffer (a copy of each would lie
    on every read's path); a document, which JSON parses, as bytes."""
    store = IcechunkStore(str(repo.path))
    chunk = store.get_sync("a/c/0", 1 << 20)  # (inline: always read by icechunk)
    assert not isinstance(chunk, bytes) and memoryview(chunk).readonly
    assert bytes(chunk) == _oracle_get(repo, repo.snapshots["main"], "a/c/0")
    assert isinstance(store.get_sync("g/t/zarr.json"), bytes)


def test_native_chunks_of_a_local_repository_are_read_from_their_files(repo):
    """Where icechunk lists chunk references (2.x), a read-only store of a local repository tells
    where each native chunk lies (`chunk_file`: icechunk's `chunk_type` says which are), in the
    mounted snapshot and in the history, and reads it from there: the bytes at that place and
    what get_sync gives equal what icechunk reads. Inline and absent chunks and documents are
    placed nowhere, nor are a writable store's. Icechunk 1.x lists nothing: every read goes
    through it."""
    store = IcechunkStore(str(repo.path))
    assert store.chunk_files == icechunk_repo.LISTS_CHUNKS
    assert store.chunk_file("s/c/0/0", load=False) is None  # (not yet known: the trio thread never waits)
    native = 0
    for snapshot, prefix in [
        (repo.snapshots["main"], ""),
        (repo.snapshots["v1"], f"{SNAPSHOT_PREFIX}{repo.snapshots['v1']}/"),
    ]:
        session = repo.open().readonly_session(snapshot_id=snapshot)
        for key in [k for k in sync_list(session.store) if "/c/" in k]:
            array, _, coords = key.partition("/c/")
            kind = session.chunk_type("/" + array, [int(c) for c in coords.split("/")])
            expected = _oracle_get(repo, snapshot, key)
            assert bytes(store.get_sync(prefix + key, None)) == expected
            located = store.chunk_file(prefix + key)
            if not icechunk_repo.LISTS_CHUNKS or kind != icechunk.ChunkType.native:
                assert located is None
                continue
            native += 1
            path, offset, length = located
            assert path.startswith(str(repo.path)) and length == len(expected)
            with open(path, "rb") as f:
                f.seek(offset)
                assert f.read(length) == expected
            assert store.chunk_file(prefix + key, load=False) == located
    assert native >= 6 if icechunk_repo.LISTS_CHUNKS else native == 0
    for key in ("g/t/c/3/1", "g/t/zarr.json", "g/t/c", "nope/c/0/0"):
        assert store.chunk_file(key) is None
    assert store.get_sync("g/t/c/3/1") is None
    writable = IcechunkStore(str(repo.path), writable=True)
    assert not writable.chunk_files and writable.chunk_file("g/t/c/0/0") is None


def test_ranges_and_suffixes(repo):
    store = IcechunkStore(str(repo.path))
    whole = _oracle_get(repo, repo.snapshots["main"], "s/c/0/0")
    assert store.get_range_sync("s/c/0/0", 3, 40) == whole[3:40]
    assert store.get_ranges_sync("s/c/0/0", [(0, 4), (10, 10), (5, 9)]) == [whole[:4], b"", whole[5:9]]
    assert store.get_suffix_sync("s/c/0/0", 20) == whole[-20:]
    assert store.get_suffix_sync("s/c/0/0", len(whole) + 100) == whole  # longer than the object
    assert store.get_prefix_sync("s/c/0/0", 10) == whole[:10]
    assert store.get_suffix_sync("s/c/9/9", 16) is None
    assert store.size_sync("s/c/0/0") == len(whole) and store.size_sync("s/c/9/9") is None


def test_listings(repo):
    store = IcechunkStore(str(repo.path))
    files, dirs = store.list_dir_sync("")
    assert set(files) == {"zarr.json"} and dirs == ["a", "g", "s"]
    files, dirs = store.list_dir_sync("g/t")
    assert list(files) == ["zarr.json"] and dirs == ["c"]
    sizes = store.sizes_below_sync("g/t")
    assert "zarr.json" in sizes and "c/0/0" in sizes and "c/3/1" not in sizes
    assert sizes["c/0/0"] == len(_oracle_get(repo, repo.snapshots["main"], "g/t/c/0/0"))


def test_versions_and_refusals(repo):
    assert IcechunkStore(str(repo.path), ref="v1").snapshot_id == repo.snapshots["v1"]
    assert IcechunkStore(str(repo.path), ref="dev").snapshot_id == repo.snapshots["dev"]
    assert IcechunkStore(str(repo.path), snapshot=repo.snapshots["v1"]).snapshot_id == repo.snapshots["v1"]
    with pytest.raises(UserError, match="no such branch or tag.*dev, main.*v1"):
        IcechunkStore(str(repo.path), ref="nope")
    with pytest.raises(UserError, match="snapshot=AAAA"):
        IcechunkStore(str(repo.path), snapshot="AAAA")
    with pytest.raises(ReadOnly):
        IcechunkStore(str(repo.path)).set_sync("a/zarr.json", b"{}")


def test_follows_the_branch_when_allowed(tmp_path):
    repo = icechunk_repo.build(tmp_path / "repo")
    store = IcechunkStore(str(repo.path))
    tag = IcechunkStore(str(repo.path), ref="v1")
    new = icechunk_repo.commit(repo.open(), "main", "third", lambda root: root["a"].__setitem__(slice(None), 5.0))
    assert not store.follow_tip_sync(may_move=False)  # a file is open: later
    assert store.snapshot_id == repo.snapshots["main"] and store.tip_pending == new
    assert store.follow_tip_sync(may_move=True)  # found, not shown yet
    assert not store.show_ready(may_move=False)  # a file was opened meanwhile: it keeps its snapshot
    assert store.snapshot_id == repo.snapshots["main"] and store.tip_pending == new
    assert store.follow_tip_sync(may_move=True) and store.show_ready(may_move=True)
    assert store.snapshot_id == new and store.tip_pending is None
    assert not store.follow_tip_sync(may_move=True) and not store.show_ready(may_move=True)
    assert not tag.follow_tip_sync(may_move=True) and tag.snapshot_id == repo.snapshots["v1"]
    chunk = np.frombuffer(store.get_sync("a/c/0", None), dtype="u1")
    assert chunk.size > 0


def test_a_call_that_hangs_is_a_store_error(repo):
    import asyncio

    from zarrfs.errors import StoreError

    store = IcechunkStore(str(repo.path), timeout_s=0.2)

    class Hanging:
        async def get(self, *args):
            await asyncio.sleep(60)

    store.version.store = Hanging()
    with pytest.raises(StoreError, match="timed out"):
        store.get_sync("zarr.json")


def test_a_commit_waits_for_the_writes_under_way_and_writes_for_a_commit():
    """CommitLock: a commit that replaces the session waits for the writes under way (none lands in a
    session committed already), a write waits for a commit being made, and a write begun while a
    commit waits is not held up by it (a thread may write twice within one operation)."""
    import threading
    import time

    from zarrfs.storage.icechunk.commitlock import CommitLock

    turns, order = CommitLock(), []
    inside = threading.Event()

    def swap():
        with turns.committing():
            inside.set()
            order.append("commit")
            time.sleep(0.05)
            order.append("commit done")

    with turns.writing():
        thread = threading.Thread(target=swap)
        thread.start()
        time.sleep(0.05)
        assert not inside.is_set()  # waits for the write
        with turns.writing():  # not held up by the commit waiting
            order.append("second write")
        order.append("write done")
    thread.join(5)
    assert order == ["second write", "write done", "commit", "commit done"]
    order.clear()
    inside.clear()
    thread = threading.Thread(target=swap)
    thread.start()
    assert inside.wait(5)
    with turns.writing():  # waits for the commit being made
        order.append("write")
    thread.join(5)
    assert order == ["commit", "commit done", "write"]
