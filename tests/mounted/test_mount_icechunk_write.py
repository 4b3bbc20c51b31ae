"""Writes through a mount of an Icechunk branch: one commit per operation, concurrent writers."""

from __future__ import annotations

import errno
import getpass
import json
import os
import shutil
import socket

import numpy as np
import pytest
import zarr

from support import icechunk_repo, mounting, oracles
from support.s3 import BUCKET, CREDENTIALS

# Replacements of one array on S3 while another mount reads it (each a commit to moto).
REPLACEMENTS_ON_S3 = 40


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    return icechunk_repo.build(tmp_path_factory.mktemp("icechunk-w") / "repo")


@pytest.fixture
def repo(built, tmp_path):
    return icechunk_repo.Repo(shutil.copytree(built.path, tmp_path / "repo"), dict(built.snapshots))


def _log(repo):
    return [(s.id, s.message) for s in repo.open().ancestry(branch="main")]


def _tip_arrays(repo):
    return icechunk_repo.arrays_of(repo, repo.open().lookup_branch("main"))


def _written(path, value):
    with open(path, "wb") as f:
        f.write(oracles.npy_bytes(value))


def test_each_operation_is_one_commit(repo, mount):
    mnt = mount(repo.path, "writable")
    who = f"by {getpass.getuser()}@{socket.gethostname()}"
    before = len(_log(repo))
    steps = []

    x = np.arange(600, dtype="<i2").reshape(20, 30)
    _written(mnt / "x.npy", x)
    steps.append("zarrfs: close x " + who)
    assert np.array_equal(_tip_arrays(repo)["x"], x)

    fd = os.open(mnt / "g" / "t.npy", os.O_RDWR)
    try:
        header = len(oracles.npy_bytes(np.zeros((50, 30), "<i4"))) - 50 * 30 * 4
        os.pwrite(fd, np.full(30, 99, "<i4").tobytes(), header + 30 * 4 * 2)  # row 2
    finally:
        os.close(fd)
    steps.append("zarrfs: close g/t " + who)
    want_t = icechunk_repo.arrays_of(repo, repo.snapshots["main"])["g/t"].copy()
    want_t[2] = 99
    assert np.array_equal(_tip_arrays(repo)["g/t"], want_t)

    os.mkdir(mnt / "h")
    steps.append("zarrfs: mkdir h " + who)
    os.setxattr(mnt / "h", "user.zarr.attributes", json.dumps({"k": 1}).encode())
    steps.append("zarrfs: setfattr h " + who)
    os.rename(mnt / "x.npy", mnt / "h" / "y.npy")
    steps.append("zarrfs: mv x.npy -> h/y.npy " + who)
    arrays = _tip_arrays(repo)
    assert "x" not in arrays and np.array_equal(arrays["h/y"], x)
    session = repo.open().readonly_session(branch="main")
    assert zarr.open_group(session.store, path="h", mode="r").attrs.asdict() == {"k": 1}
    os.unlink(mnt / "h" / "y.npy")
    steps.append("zarrfs: rm h/y.npy " + who)
    os.rmdir(mnt / "h")
    steps.append("zarrfs: rmdir h " + who)

    log = _log(repo)
    assert [m for _, m in log[: len(steps)]][::-1] == steps
    assert len(log) == before + len(steps)
    assert set(_tip_arrays(repo)) == {"a", "g/t", "g/u", "s"}
    assert (repo.path.parent / ".repo.zarrfs-lock").exists()  # commits take turns on it


def _chunk_objects(repo):
    return sorted(os.listdir(repo.path / "chunks"))


def test_a_move_is_one_commit_and_copies_no_chunk_where_icechunk_moves(repo, mount):
    """mv of an array and of a group: one commit each, named for it, and the data at the new
    place is what icechunk read at the old. Icechunk 2.x moves the nodes (its diff says so) and
    no chunk object is written; 1.x copies them. mv onto an array replaces it, in one commit."""
    mnt = mount(repo.path, "writable")
    who = f"by {getpass.getuser()}@{socket.gethostname()}"
    was = icechunk_repo.arrays_of(repo, repo.snapshots["main"])
    moves = hasattr(repo.open(), "rearrange_session")
    objects = _chunk_objects(repo)
    before = _log(repo)
    os.rename(mnt / "s.npy", mnt / "s2.npy")
    os.rename(mnt / "g", mnt / "k")
    log = _log(repo)
    assert [m for _, m in log[:2]] == ["zarrfs: mv g -> k " + who, "zarrfs: mv s.npy -> s2.npy " + who]
    assert len(log) == len(before) + 2
    arrays = _tip_arrays(repo)
    assert set(arrays) == {"a", "s2", "k/t", "k/u"}
    for old, new in [("s", "s2"), ("g/t", "k/t"), ("g/u", "k/u")]:
        assert np.array_equal(arrays[new], was[old])
        assert (mnt / f"{new}.npy").read_bytes() == oracles.npy_bytes(was[old])
    if moves:
        diff = repo.open().diff(from_snapshot_id=before[0][0], to_snapshot_id=log[0][0])
        assert {("/g", "/k"), ("/s", "/s2")} <= set(diff.moved_nodes)
        assert _chunk_objects(repo) == objects
    else:
        assert len(_chunk_objects(repo)) > len(objects)
    os.rename(mnt / "k" / "u.npy", mnt / "s2.npy")  # onto an array: replaces it
    log = _log(repo)
    assert log[0][1] == "zarrfs: mv k/u.npy -> s2.npy " + who and len(log) == len(before) + 3
    arrays = _tip_arrays(repo)
    assert set(arrays) == {"a", "s2", "k/t"} and np.array_equal(arrays["s2"], was["g/u"])


def test_a_replaced_array_is_one_commit(repo, mount):
    mnt = mount(repo.path, "writable")
    value = np.arange(64 * 64, dtype="<f8").reshape(64, 64)
    before = _log(repo)
    _written(mnt / "g" / "t.npy", value)
    after = _log(repo)
    assert len(after) == len(before) + 1 and after[0][1].startswith("zarrfs: close g/t ")
    assert np.array_equal(_tip_arrays(repo)["g/t"], value)
    assert (mnt / "g" / "t.npy").read_bytes() == oracles.npy_bytes(value)
    # the snapshot before is whole: the old array, never a part of the new one
    old = icechunk_repo.arrays_of(repo, before[0][0])["g/t"]
    assert np.array_equal(old, icechunk_repo.arrays_of(repo, repo.snapshots["main"])["g/t"])


def test_two_writers_on_different_arrays_both_land(repo, mount):
    one = mount(repo.path, "writable")
    two = mount(repo.path, "writable")
    x, y = np.arange(10, dtype="<u1"), np.arange(20, dtype="<u2")
    with open(two / "y.npy", "wb") as late:  # begun before the other commit, closed after it
        late.write(oracles.npy_bytes(y))
        _written(one / "x.npy", x)
    arrays = _tip_arrays(repo)
    assert np.array_equal(arrays["x"], x) and np.array_equal(arrays["y"], y)
    (one / ".zarrfs" / "refresh").read_bytes()
    assert (one / "y.npy").read_bytes() == oracles.npy_bytes(y)


def test_two_writers_on_one_array_lose_nothing(repo, mount):
    one = mount(repo.path, "writable")
    two = mount(repo.path, "writable")
    first, second = np.zeros((5, 5), "<i8"), np.ones((5, 5), "<i8")
    late = open(two / "g" / "t.npy", "wb")
    try:
        late.write(oracles.npy_bytes(second))
        _written(one / "g" / "t.npy", first)
        with pytest.raises(OSError) as e:
            late.close()
        assert e.value.errno == errno.EBUSY
    finally:
        if not late.closed:
            late.close()
    assert np.array_equal(_tip_arrays(repo)["g/t"], first)
    branches = [b for b in repo.open().list_branches() if b.startswith("main.zarrfs-conflict-")]
    assert len(branches) == 1
    kept = icechunk_repo.arrays_of(repo, repo.open().lookup_branch(branches[0]))["g/t"]
    assert np.array_equal(kept, second)
    assert mounting.log_lines_naming(mount.log_text(two), branches[0])


def test_an_array_written_in_small_pieces_is_one_commit(repo, mount):
    """Pieces that fill a chunk part by part: the chunk of the array being made is read back
    before it was ever stored."""
    mnt = mount(repo.path, "writable")
    value = np.random.default_rng(5).random((300, 70))
    data = oracles.npy_bytes(value)
    before = len(_log(repo))
    fd = os.open(mnt / "g" / "n.npy", os.O_WRONLY | os.O_CREAT)
    try:
        for at in range(0, len(data), 1000):
            os.write(fd, data[at : at + 1000])
    finally:
        os.close(fd)
    log = _log(repo)
    assert len(log) == before + 1 and log[0][1].startswith("zarrfs: close g/n ")
    assert np.array_equal(_tip_arrays(repo)["g/n"], value)


def test_a_new_repository_gets_its_root_group(tmp_path, mount):
    import icechunk

    path = tmp_path / "new"
    repo = icechunk.Repository.create(icechunk.local_filesystem_storage(str(path)))
    mnt = mount(path, "writable")
    value = np.arange(12, dtype="<i4").reshape(3, 4)
    _written(mnt / "x.npy", value)
    os.mkdir(mnt / "g")
    assert sorted(os.listdir(mnt)) == ["g", "x.npy"]
    root = zarr.open_group(repo.readonly_session(branch="main").store, mode="r", zarr_format=3)
    assert np.array_equal(root["x"][...], value) and "g" in root


def _replace_while_reading(writer, reader, versions):
    """WRITER replaces g/t VERSIONS times while another thread reads it through READER in a loop:
    every read must be one whole version. Returns the versions the reader saw."""
    import threading

    shape = (64, 128)  # several chunks, each replaced
    _written(writer / "g" / "t.npy", np.full(shape, -1, "<i4"))
    seen, bad, done = set(), [], threading.Event()

    def read_loop():
        while not done.is_set():
            try:
                got = np.load(reader / "g" / "t.npy")
            except (OSError, ValueError) as e:  # the file may be between two versions' names
                bad.append(f"read failed: {e!r}")
                continue
            values = np.unique(got)
            if got.shape != shape or len(values) != 1:
                bad.append(f"a mix: {values[:5]}")
            else:
                seen.add(int(values[0]))

    thread = threading.Thread(target=read_loop)
    thread.start()
    try:
        for k in range(versions):
            _written(writer / "g" / "t.npy", np.full(shape, k, "<i4"))
    finally:
        done.set()
        thread.join(60)
    assert not bad, bad[:5]
    assert seen and seen <= set(range(-1, versions)), seen
    (reader / ".zarrfs" / "refresh").read_bytes()
    assert np.array_equal(np.load(reader / "g" / "t.npy"), np.full(shape, versions - 1, "<i4"))
    return seen


def test_a_reader_never_sees_a_mix_of_two_replacements(repo, mount):
    """One mount replaces an array again and again; another reads it in a loop, following the
    branch at every lookup: each read is one whole version."""
    _replace_while_reading(mount(repo.path, "writable"), mount(repo.path, "metadata_ttl=0"), 20)


def test_on_s3_a_reader_never_sees_a_mix_of_two_replacements(s3, built, mount):
    """The same with two mounts of one repository on S3 (moto), where icechunk alone orders the
    commits."""
    import icechunk

    endpoint, fs = s3
    fs.put(str(built.path), f"{BUCKET}/ice/replaced", recursive=True)
    repo = icechunk.Repository.open(
        icechunk.s3_storage(
            bucket=BUCKET,
            prefix="ice/replaced",
            endpoint_url=endpoint,
            allow_http=True,
            region="us-east-1",
            access_key_id=CREDENTIALS["key"],
            secret_access_key=CREDENTIALS["secret"],
            force_path_style=True,
        )
    )
    opts = "storage_options=" + json.dumps({"client_kwargs": {"endpoint_url": endpoint}, **CREDENTIALS})
    source = f"s3://{BUCKET}/ice/replaced"
    versions = REPLACEMENTS_ON_S3
    seen = _replace_while_reading(mount(source, opts, "writable"), mount(source, opts, "metadata_ttl=0"), versions)
    assert len(seen) > 1, seen  # the reader did see the array change under it
    messages = [s.message for s in repo.ancestry(branch="main")]
    assert sum("close g/t" in m for m in messages) == versions + 1
    tip = repo.readonly_session(branch="main").store
    assert np.array_equal(zarr.open_array(tip, path="g/t", mode="r")[...], np.full((64, 128), versions - 1, "<i4"))


def test_a_plain_file_is_refused_at_create(repo, mount):
    mnt = mount(repo.path, "writable")
    with pytest.raises(OSError) as e:
        (mnt / "notes.txt").write_bytes(b"hello")
    assert e.value.errno == errno.EPERM
    assert mounting.log_lines_naming(mount.log_text(), "notes.txt: an Icechunk repository keeps no files")
    assert not (mnt / "notes.txt").exists()
