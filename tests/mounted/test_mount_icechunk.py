"""Icechunk repositories mounted: the tip of main with every view, ref= and snapshot=, a branch followed."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys

import icechunk
import numpy as np
import pytest

from support import icechunk_repo, mounting, oracles
from support.s3 import BUCKET, CREDENTIALS


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    return icechunk_repo.build(tmp_path_factory.mktemp("icechunk") / "repo")


@pytest.fixture(scope="module")
def main_mnt(repo, module_mount):
    return module_mount(repo.path)


def _assert_tree_equals(mnt, repo, snapshot_id):
    arrays = icechunk_repo.arrays_of(repo, snapshot_id)
    assert arrays, "the oracle found no arrays"
    for path, value in arrays.items():
        assert (mnt / (path + ".npy")).read_bytes() == oracles.npy_bytes(value), path
    for group in icechunk_repo.groups_of(repo, snapshot_id):
        assert (mnt / group).is_dir(), group
    listed = {str(p.relative_to(mnt))[: -len(".npy")] for p in mnt.rglob("*.npy")}
    assert listed == set(arrays)


def test_tip_of_main_equals_icechunk(main_mnt, repo):
    _assert_tree_equals(main_mnt, repo, repo.snapshots["main"])


def test_views_of_a_repository(main_mnt, repo):
    value = icechunk_repo.arrays_of(repo, repo.snapshots["main"])["g/t"]
    views = main_mnt / ".zarrfs"
    assert (views / "npy-f" / "g" / "t.npy").read_bytes() == oracles.npy_f_bytes(value)
    assert (views / "raw" / "g" / "t.raw").read_bytes() == value.tobytes()
    assert (views / "chunks" / "g" / "t" / "1.1.npy").read_bytes() == oracles.npy_bytes(value[16:32, 16:30])
    assert (views / "slice" / "g" / "t[5:12,::3].npy").read_bytes() == oracles.npy_bytes(value[5:12, ::3])
    info = json.loads((views / "info" / "g" / "t.json").read_bytes())
    assert info["shape"] == [50, 30] and info["dtype"] == "<i4" and info["chunks_stored"] == 6
    oracle = repo.open().readonly_session(branch="main").store
    from zarr.core.buffer import default_buffer_prototype
    from zarr.core.sync import sync

    doc = sync(oracle.get("g/t/zarr.json", default_buffer_prototype())).to_bytes()
    assert (views / "store" / "g" / "t" / "zarr.json").read_bytes() == doc
    assert sorted(os.listdir(views / "store")) == ["a", "g", "s", "zarr.json"]
    assert json.loads(os.getxattr(main_mnt / "g", "user.zarr.attributes")) == {"title": "first"}


def test_version_directories_equal_icechunk(main_mnt, repo):
    versions = main_mnt / ".zarrfs" / "versions"
    ancestry = [s.id for s in repo.open().ancestry(branch="main")]
    assert sorted(os.listdir(versions)) == ["branches", "log.json", "snapshots", "tags"]
    assert sorted(os.listdir(versions / "branches")) == ["dev", "main"]
    assert os.listdir(versions / "tags") == ["v1"]
    assert sorted(os.listdir(versions / "snapshots")) == sorted(ancestry)
    snapshots = repo.snapshots
    for where, version in (
        ("tags/v1", "v1"),
        ("branches/main", "main"),
        ("branches/dev", "dev"),
        (f"snapshots/{snapshots['v1']}", "v1"),
        (f"snapshots/{snapshots['main']}", "main"),
        (f"snapshots/{snapshots['dev']}", "dev"),
    ):  # dev's tip: not listed, found by ID
        _assert_tree_equals(versions / where, repo, snapshots[version])
    assert not (versions / "snapshots" / "AAAAAAAAAAAAAAAAAAAA").exists()
    assert not (versions / "tags" / "nope").exists()


def test_log_json_is_the_branch_ancestry(main_mnt, repo):
    log = json.loads((main_mnt / ".zarrfs" / "versions" / "log.json").read_bytes())
    want = list(repo.open().ancestry(branch="main"))
    assert log["branch"] == "main" and log["snapshot"] == repo.snapshots["main"]
    assert [e["id"] for e in log["ancestry"]] == [s.id for s in want]
    assert [e["message"] for e in log["ancestry"]] == [s.message for s in want]
    assert [e["parent"] for e in log["ancestry"]] == [s.parent_id for s in want]
    import datetime

    assert [datetime.datetime.fromisoformat(e["time"]) for e in log["ancestry"]] == [s.written_at for s in want]


def test_diff_of_a_tag_with_the_tip(main_mnt):
    tag = main_mnt / ".zarrfs" / "versions" / "tags" / "v1"
    changed = subprocess.run(["bash", "-c", f"diff <(cat {tag}/g/t.npy) {main_mnt}/g/t.npy"], capture_output=True)
    assert changed.returncode == 1 and b"differ" in changed.stdout
    same = subprocess.run(["diff", str(tag / "a.npy"), str(main_mnt / "a.npy")], capture_output=True)
    assert same.returncode == 0, same


@pytest.mark.parametrize(
    "option, version", [("ref=v1", "v1"), ("ref=dev", "dev"), ("snapshot", "v1")], ids=["tag", "branch", "snapshot"]
)
def test_ref_and_snapshot_mounts(repo, module_mount, option, version):
    if option == "snapshot":
        option = f"snapshot={repo.snapshots[version]}"
    mnt = module_mount(repo.path, option)
    _assert_tree_equals(mnt, repo, repo.snapshots[version])


def test_format_icechunk_and_file_url(repo, module_mount):
    mnt = module_mount(f"file://{repo.path}", "format=icechunk")
    value = icechunk_repo.arrays_of(repo, repo.snapshots["main"])["a"]
    assert (mnt / "a.npy").read_bytes() == oracles.npy_bytes(value)


def _fails(tmp_path, source, *opts, env=None):
    mnt = tmp_path / "mnt"
    mnt.mkdir(parents=True)
    cmd = [*mounting.ZARRFS, str(source), str(mnt), "-f"] + (["-o", ",".join(opts)] if opts else [])
    out_p = tmp_path / "out"
    with open(out_p, "wb") as out:
        proc = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env, timeout=60)
    assert not mounting.is_mounted(mnt)
    assert proc.returncode != 0
    return out_p.read_text()


def test_refusals_are_one_line(repo, tmp_path):
    text = _fails(tmp_path / "a", repo.path, "ref=nope")
    assert "ref=nope: no such branch or tag" in text and "Traceback" not in text
    assert len(text.strip().splitlines()) == 1, text
    plain = tmp_path / "plain.zarr"
    import zarr

    zarr.open_group(str(plain), mode="w", zarr_format=3)
    text = _fails(tmp_path / "b", plain, "ref=v1")
    assert "not one" in text and "Traceback" not in text
    text = _fails(tmp_path / "c", repo.path, "writable", "ref=v1")
    assert "writes go to a branch; ref=v1 is not one" in text and "Traceback" not in text


def test_without_the_extra_the_error_names_it(repo, tmp_path):
    blocker = tmp_path / "block" / "icechunk"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text("raise ImportError('icechunk is not installed')\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(blocker.parent), *sys.path]))
    text = _fails(tmp_path / "w", repo.path, env=env)
    assert "zarrfs[icechunk]" in text and "Traceback" not in text, text
    assert "ZARRFS_EXTRAS=http,s3,gcs,icechunk scripts/install.sh" in text, text  # the system install too


def _copy(repo, tmp_path):
    return icechunk_repo.Repo(shutil.copytree(repo.path, tmp_path / "repo"), dict(repo.snapshots))


def test_new_commits_seen_after_refresh_open_files_keep_theirs(repo, tmp_path, mount):
    repo = _copy(repo, tmp_path)
    mnt = mount(repo.path, "metadata_ttl=inf")
    before = icechunk_repo.arrays_of(repo, repo.snapshots["main"])
    assert (mnt / "g" / "t.npy").read_bytes() == oracles.npy_bytes(before["g/t"])
    _assert_tree_equals(mnt / ".zarrfs" / "versions" / "branches" / "main", repo, repo.snapshots["main"])

    def third(root):
        root["g/t"][:] = np.arange(1500, dtype="<i4").reshape(50, 30)
        root["g"].create_array("w", shape=(4,), chunks=(2,), dtype="<i8")[:] = [1, 2, 3, 4]
        del root["a"]

    new = icechunk_repo.commit(repo.open(), "main", "third", third)
    after = icechunk_repo.arrays_of(repo, new)
    assert (mnt / "g" / "t.npy").read_bytes() == oracles.npy_bytes(before["g/t"])  # trusted until refreshed
    held = open(mnt / "g" / "u.npy", "rb")
    try:
        head = held.read(100)
        (mnt / ".zarrfs" / "refresh").read_bytes()  # a file is open: the mount stays on its snapshot
        assert (mnt / "g" / "t.npy").read_bytes() == oracles.npy_bytes(before["g/t"])
        assert head + held.read() == oracles.npy_bytes(before["g/u"])
    finally:
        held.close()
    (mnt / ".zarrfs" / "refresh").read_bytes()
    _assert_tree_equals(mnt, repo, new)
    _assert_tree_equals(mnt / ".zarrfs" / "versions" / "branches" / "main", repo, new)
    log = json.loads((mnt / ".zarrfs" / "versions" / "log.json").read_bytes())
    assert log["snapshot"] == new and log["ancestry"][0]["message"] == "third"
    assert "g/w" in after and "a" not in after and not (mnt / "a.npy").exists()
    assert f"now showing snapshot {new}" in mount.log_text()


def test_a_branch_is_followed_within_metadata_ttl(repo, tmp_path, mount):
    repo = _copy(repo, tmp_path)
    mnt = mount(repo.path, "ref=dev", "metadata_ttl=0.5")
    assert sorted(os.listdir(mnt)) == ["a.npy", "g", "s.npy"]
    new = icechunk_repo.commit(repo.open(), "dev", "more", lambda root: root["a"].__setitem__(slice(None), 2.5))
    want = oracles.npy_bytes(icechunk_repo.arrays_of(repo, new)["a"])
    assert mounting.wait_until(lambda: (mnt / "a.npy").read_bytes() == want, 20)
    branch = mnt / ".zarrfs" / "versions" / "branches" / "dev"
    assert mounting.wait_until(lambda: (branch / "a.npy").read_bytes() == want, 20)


def test_a_repository_on_s3(s3, module_mount):
    import icechunk
    import zarr

    endpoint, _ = s3
    storage = icechunk.s3_storage(
        bucket=BUCKET,
        prefix="ice/repo",
        endpoint_url=endpoint,
        allow_http=True,
        access_key_id=CREDENTIALS["key"],
        secret_access_key=CREDENTIALS["secret"],
        region="us-east-1",
        force_path_style=True,
    )
    repo = icechunk.Repository.create(storage)
    value = np.arange(600, dtype="<f8").reshape(20, 30)

    def first(root):
        root.create_group("g").create_array("t", shape=value.shape, chunks=(8, 16), dtype=value.dtype)[:] = value

    first_id = icechunk_repo.commit(repo, "main", "first", first)
    repo.create_tag("v1", snapshot_id=first_id)
    icechunk_repo.commit(repo, "main", "second", lambda root: root["g/t"].__setitem__((0, 0), -1.0))
    so = {"client_kwargs": {"endpoint_url": endpoint}, **CREDENTIALS}
    mnt = module_mount(f"s3://{BUCKET}/ice/repo", "storage_options=" + json.dumps(so))
    want = value.copy()
    want[0, 0] = -1.0
    assert (mnt / "g" / "t.npy").read_bytes() == oracles.npy_bytes(want)
    tag = mnt / ".zarrfs" / "versions" / "tags" / "v1" / "g" / "t.npy"
    assert tag.read_bytes() == oracles.npy_bytes(value)
    oracle = zarr.open_array(repo.readonly_session(branch="main").store, path="g/t", mode="r")[...]
    assert np.array_equal(oracle, want)


def test_a_missing_chunk_object_fails_that_read_only(repo, tmp_path, mount):
    repo = _copy(repo, tmp_path)
    for chunk in (repo.path / "chunks").iterdir():
        chunk.unlink()
    mnt = mount(repo.path)
    with pytest.raises(OSError) as e:
        (mnt / "g" / "t.npy").read_bytes()
    assert e.value.errno == errno.EIO
    assert mounting.log_lines_naming(mount.log_text(), "reading 'g/t/c/"), mount.log_text()
    assert sorted(os.listdir(mnt)) == ["a.npy", "g", "s.npy"]  # the daemon still answers
    assert json.loads((mnt / ".zarrfs" / "info" / "g" / "t.json").read_bytes())["shape"] == [50, 30]


def _stats(mnt):
    return json.loads((mnt / ".zarrfs" / "stats.json").read_bytes())


def _read_as_cat_does(path):
    with open(path, "rb", buffering=0) as f:
        return b"".join(iter(lambda: f.read(128 << 10), b""))


def test_a_reader_of_a_local_repository_reads_little_and_bytes_stay_exact(tmp_path, mount):
    """A read-only mount of a local repository: every byte equals np.save's of what icechunk
    reads, and a second read comes from the kernel's pages. With icechunk 2.x the uncompressed
    chunks are read from their files straight into the replies, most without a load; with 1.x,
    the chunks a sequential reader has passed leave the cache (their memory serves the next
    loads). A writable mount keeps its chunks."""
    value = np.random.default_rng(7).random((2048, 1024), dtype="<f4")
    repo = icechunk_repo.Repo(tmp_path / "big", {})
    created = icechunk.Repository.create(icechunk.local_filesystem_storage(str(repo.path)))

    def big(root):
        root.create_array("b", shape=value.shape, chunks=(256, 256), dtype="<f4", compressors=None)[...] = value

    snapshot = icechunk_repo.commit(created, "main", "big", big)
    want = oracles.npy_bytes(icechunk_repo.arrays_of(repo, snapshot)["b"])
    mnt = mount(repo.path)
    assert _read_as_cat_does(mnt / "b.npy") == want
    first = _stats(mnt)
    if icechunk_repo.LISTS_CHUNKS:
        # (the first reads load their chunks while the array's chunk references are read)
        assert first["chunk_gets"] < 32 // 2 and first["chunks_dropped"] == 0
        assert first["direct_reads"] + first["bands_assembled"] > 0
    else:
        # Of 8 rows of 4 chunks, all but the last row (here 28; the kernel may send a read out of
        # order, which passes nothing), and what is still cached is about that row.
        assert first["chunks_dropped"] >= 24
        assert first["cache_bytes"] <= 2 * 4 * 256 * 256 * 4
    assert (mnt / "b.npy").read_bytes() == want
    assert _stats(mnt)["reads"] == first["reads"]  # the kernel's pages: no read reached the mount
    writable = mount(repo.path, "writable")
    assert (writable / "b.npy").read_bytes() == want
    assert _stats(writable)["chunks_dropped"] == 0
    # How the mounts read the repository (storage/icechunk/repository.py local_reads) is not saved in it.
    assert icechunk.Repository.fetch_config(icechunk.local_filesystem_storage(str(repo.path))) is None


def test_pages_of_a_branch_are_kept_until_it_moves(repo, tmp_path, mount):
    """The kernel keeps the pages of a branch mount's files (a second read reaches no store)
    and drops them when the mount moves to the branch's new snapshot."""
    repo = _copy(repo, tmp_path)
    mnt = mount(repo.path, "metadata_ttl=0.5")
    before = oracles.npy_bytes(icechunk_repo.arrays_of(repo, repo.snapshots["main"])["g/t"])
    assert (mnt / "g" / "t.npy").read_bytes() == before
    reads = _stats(mnt)["reads"]
    assert (mnt / "g" / "t.npy").read_bytes() == before
    assert _stats(mnt)["reads"] == reads
    new = icechunk_repo.commit(repo.open(), "main", "t", lambda root: root["g/t"].__setitem__(slice(None), 3))
    after = oracles.npy_bytes(icechunk_repo.arrays_of(repo, new)["g/t"])
    assert after != before
    assert mounting.wait_until(lambda: (mnt / "g" / "t.npy").read_bytes() == after, 20)
