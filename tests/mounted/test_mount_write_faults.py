"""Mounted writes when things go wrong: a store write that fails (EIO at fsync/close, the old
chunk kept, the key in the log, the daemon alive) and a daemon killed in the middle of a
large copy (the store still opens, without the half-written array).

Failures are injected by tests/support/failing_store.py: zarrfs's own command line over an
fsspec file system (``failfile://``) whose ``pipe_file`` fails on the Nth write.
"""

from __future__ import annotations

import errno
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from support import builders, mounting, oracles
from support.builders import ArraySpec
from support.oracles import assert_same_array

FORMATS = pytest.mark.parametrize("fmt", [2, 3], ids=["v2", "v3"])
# A failed store write is logged as a WARNING naming the key (the caller gets EIO); the
# daemon logs must hold no ERROR line and no traceback, as for every mounted test.

SPEC = ArraySpec("g/a", "int32", (37, 23), (10, 7), "zstd")


def _store(tmp_path: Path, fmt: int) -> tuple[Path, np.ndarray]:
    root = tmp_path / "fail.zarr"
    builders.create_array(root, SPEC, fmt, np.random.default_rng(21))
    builders.create_array(root, ArraySpec("g/other", "float32", (8, 8), (4, 4), "none"), fmt, np.random.default_rng(22))
    return root, oracles.zarr_value(root, "g/a")


@FORMATS
@pytest.mark.parametrize("at", ["close", "fsync"])
def test_failed_chunk_write_is_eio_and_keeps_the_stored_chunk(mount, tmp_path, fmt, at):
    root, model = _store(tmp_path, fmt)
    key = "g/a/" + oracles.zarr_chunk_key(root, "g/a", (1, 2))  # the chunk holding rows 10-19, cols 14-20
    old_chunk = (root / key).read_bytes()
    calls = tmp_path / "calls.txt"
    mnt, proc, log = mounting.mount_failing(
        mount, root, {"FAILFILE_MATCH": key, "FAILFILE_FAIL_AT": "1", "FAILFILE_CALLS": os.fspath(calls)}
    )
    hlen = oracles.view_header_len(model, "npy")
    new = np.arange(-100, -93, dtype="<i4")  # row 12, columns 14-20: inside chunk (1, 2) only
    fd = os.open(mnt / "g/a.npy", os.O_WRONLY)
    try:
        mounting.pwrite_all(fd, new.tobytes(), hlen + 4 * (12 * 23 + 14))
        if at == "fsync":
            with pytest.raises(OSError) as exc:
                os.fsync(fd)
            assert exc.value.errno == errno.EIO
    finally:
        if at == "close":
            with pytest.raises(OSError) as exc:
                os.close(fd)
            assert exc.value.errno == errno.EIO
        else:
            try:
                os.close(fd)
            except OSError:
                pass  # the error was reported by fsync; close may or may not repeat it
    assert "FAILED" in calls.read_text(), calls.read_text()
    # the store holds the previous chunk, whole
    assert (root / key).read_bytes() == old_chunk
    assert_same_array(oracles.zarr_value(root, "g/a"), model, "zarr after the failed write")
    assert oracles.leftover_temp_files(root) == []
    # the log names the key; the daemon lives and serves what the store holds
    assert mounting.log_lines_naming(log.read_text(), key), log.read_text()
    assert proc.poll() is None and mounting.is_mounted(mnt)
    assert (mnt / "g/a.npy").read_bytes() == oracles.npy_bytes(model)
    assert (mnt / "g/other.npy").read_bytes() == oracles.npy_bytes(oracles.zarr_value(root, "g/other"))
    # later writes work (only the first write of that key was made to fail)
    fd = os.open(mnt / "g/a.npy", os.O_WRONLY)
    try:
        mounting.pwrite_all(fd, new.tobytes(), hlen + 4 * (12 * 23 + 14))
    finally:
        os.close(fd)
    model[12, 14:21] = new
    assert (root / key).read_bytes() != old_chunk
    assert_same_array(oracles.zarr_value(root, "g/a"), model, "zarr after the retried write")
    assert (mnt / "g/a.npy").read_bytes() == oracles.npy_bytes(model)


@FORMATS
def test_failed_write_of_one_chunk_stores_the_others(mount, tmp_path, fmt):
    root, model = _store(tmp_path, fmt)
    key = "g/a/" + oracles.zarr_chunk_key(root, "g/a", (0, 0))
    old_chunk = (root / key).read_bytes()
    mnt, proc, log = mounting.mount_failing(mount, root, {"FAILFILE_MATCH": key, "FAILFILE_FAIL_AT": "1"})
    m = np.load(mnt / "g/a.npy", mmap_mode="r+")
    m[:, :] = -5  # every chunk
    code = None
    try:
        m.flush()  # msync: FUSE fsync
    except OSError as e:  # not kept: its traceback holds the mapping, which would keep the mount busy
        code = e.errno
    del m
    assert code == errno.EIO
    want = np.full(model.shape, -5, model.dtype)
    want[0:10, 0:7] = model[0:10, 0:7]  # the one chunk that failed keeps its stored values
    assert (root / key).read_bytes() == old_chunk
    assert_same_array(oracles.zarr_value(root, "g/a"), want, "zarr after one chunk failed")
    assert mounting.log_lines_naming(log.read_text(), key)
    assert proc.poll() is None


@FORMATS
def test_failed_metadata_write_leaves_no_array(mount, tmp_path, fmt):
    root, _ = _store(tmp_path, fmt)
    doc = ".zarray" if fmt == 2 else "zarr.json"
    mnt, proc, log = mounting.mount_failing(mount, root, {"FAILFILE_MATCH": f"g/new/{doc}", "FAILFILE_FAIL_AT": "1"})
    x = np.arange(30.0).reshape(5, 6)
    np.save(tmp_path / "x.npy", x)
    # one write of the whole file (shutil.copyfile would quietly retry a failed first sendfile);
    # the metadata document is written when the close completes the array: that close fails
    fd = os.open(mnt / "g/new.npy", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.write(fd, oracles.npy_bytes(x))
    with pytest.raises(OSError) as exc:
        os.close(fd)
    assert exc.value.errno == errno.EIO
    assert "new.npy" not in os.listdir(mnt / "g")
    assert oracles.store_keys(root, "g/new") == []
    assert not [k for k in oracles.store_keys(root) if ".zarrfs" in k], "the staged chunks were left behind"
    assert [ln for ln in mounting.log_lines_naming(log.read_text(), "g/new.npy") if "nothing was created" in ln]
    assert proc.poll() is None
    shutil.copyfile(tmp_path / "x.npy", mnt / "g/new.npy")  # the second try is not made to fail
    assert_same_array(oracles.zarr_value(root, "g/new"), x, "zarr after the retried copy")
    assert "new.npy" in os.listdir(mnt / "g")


# --------------------------------------------------------------------------- SIGKILL mid-copy

BIG_SHAPE = (12800, 4096)  # float32: 200 MiB
BLOCK = 1 << 20
FSYNC_EVERY = 16 << 20  # so that chunks are stored (and being stored) when the daemon dies


def _big_npy(p: Path) -> None:
    """A 200 MiB float32 NPY file whose element i is (i % 1000003) + 1: never 0 (the fill value), exact in float32."""
    out = np.lib.format.open_memmap(p, mode="w+", dtype="<f4", shape=BIG_SHAPE)
    flat = out.reshape(-1)
    step = 1 << 22
    for a in range(0, flat.size, step):
        idx = np.arange(a, min(a + step, flat.size), dtype=np.int64)
        flat[a : a + idx.size] = (idx % 1000003 + 1).astype("<f4")
    out.flush()
    del out


@FORMATS
def test_sigkill_in_the_middle_of_a_large_copy_leaves_the_store_without_it(mount, tmp_path, fmt):
    import zarr

    root = tmp_path / "kill.zarr"
    zarr.open_group(os.fspath(root), mode="w", zarr_format=fmt)
    src = tmp_path / "big.npy"
    _big_npy(src)
    size = src.stat().st_size
    mnt = mount(root, "writable")
    pids = mounting.pids_serving(mnt)
    assert len(pids) == 1, pids
    written = 0
    failure: list[BaseException] = []

    def copy() -> None:
        nonlocal written
        try:
            fd = os.open(mnt / "big.npy", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            with open(src, "rb") as f:
                since_sync = 0
                while block := f.read(BLOCK):
                    os.write(fd, block)
                    written += len(block)
                    since_sync += len(block)
                    if since_sync >= FSYNC_EVERY:
                        os.fsync(fd)
                        since_sync = 0
            os.close(fd)
        except OSError as e:
            failure.append(e)

    t = threading.Thread(target=copy)
    t.start()
    assert mounting.wait_until(lambda: written >= size // 2 or not t.is_alive(), 120, 0.001)
    assert t.is_alive(), f"the copy ended before half was written: {failure}"
    os.kill(pids[0], signal.SIGKILL)
    t.join(60)
    assert not t.is_alive()
    assert failure, "the copy went on after the daemon was killed"
    r = subprocess.run(["fusermount3", "-uz", os.fspath(mnt)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert mounting.wait_until(lambda: not mounting.is_mounted(mnt), 5)
    killed_at = written

    # the store opens and holds no array `big`: a new array becomes a node only once it is
    # complete. Its chunks stored so far lie in a staging area that no reader lists.
    group = zarr.open_group(os.fspath(root), mode="r")
    assert [name for name, _ in group.members()] == [], f"killed after {killed_at} of {size} bytes"
    leftovers = [k for k in oracles.store_keys(root) if k.startswith(".zarrfs-new-")]
    assert leftovers, f"no chunk stored after {killed_at} of {size} bytes with fsync every {FSYNC_EVERY}"
    again = mount(root, "writable")
    assert os.listdir(again) == []
    # the new mount removes them: their writer is gone
    said = [
        ln
        for ln in mounting.log_lines_naming(_swept(mount, again), "of a writer that died")
        if f"{len(leftovers)} keys" in ln
    ]
    assert len(said) == 1 and _staged(root) == {}, f"{len(leftovers)} keys staged before: {_staged(root)}"
    # the same copy made again, whole, over the leftover staging area
    shutil.copyfile(src, again / "big.npy")
    arr = oracles.open_zarr_array(root, "big")
    assert arr.shape == BIG_SHAPE and arr.dtype == np.dtype("<f4")
    source = np.load(src, mmap_mode="r")
    assert_same_array(arr[:100], np.asarray(source[:100]), "zarr-python reads the second copy")
    assert_same_array(arr[-100:], np.asarray(source[-100:]), "zarr-python reads the second copy")


# --------------------------------------------------------------------------- staging a killed writer left

NEW = ArraySpec("g/a", "float64", (64, 48), (8, 8), "zstd")  # 48 chunks: half a copy stores many


def _kill_mid_copy(mounter: mounting.Mounter, mnt: Path, name: str, data: bytes) -> int:
    """Write the first half of DATA to MNT/g/NAME, fsync it (its chunks are then in the store,
    staged), kill -9 the daemon and clean up the dead mount; returns the pid killed."""
    pids = mounting.pids_serving(mnt)
    assert len(pids) == 1, pids
    fd = os.open(mnt / "g" / name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    mounting.pwrite_all(fd, data[: len(data) // 2], 0)
    os.fsync(fd)
    os.kill(pids[0], signal.SIGKILL)
    assert mounting.wait_until(lambda: not mounting.pid_alive(pids[0]), 10)
    try:
        os.close(fd)
    except OSError:
        pass  # the daemon is gone: ENOTCONN or ECONNABORTED
    r = subprocess.run(["fusermount3", "-uz", os.fspath(mnt)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert mounting.wait_until(lambda: not mounting.is_mounted(mnt), 5)
    return pids[0]


def _swept(mounter: mounting.Mounter, mnt: Path) -> str:
    """The log of a writable mount once it has looked for staging of writers that died."""
    assert mounting.wait_until(lambda: "staging check done" in mounter.log_text(mnt), 30), mounter.log_text(mnt)
    return mounter.log_text(mnt)


def _staged(root: Path) -> dict[str, list[str]]:
    """Staging areas in the store (read from the disk) and the keys in each."""
    out: dict[str, list[str]] = {}
    for key in oracles.store_keys(root):
        parts = key.split("/")
        at = next((i for i, p in enumerate(parts) if p.startswith(".zarrfs-new-")), None)
        if at is not None:
            out.setdefault("/".join(parts[: at + 1]), []).append(key)
    return out


@FORMATS
def test_a_writable_mount_removes_the_staging_a_killed_writer_left(mount, tmp_path, fmt):
    root = tmp_path / "kill.zarr"
    builders.create_array(root, NEW, fmt, np.random.default_rng(31))
    old = oracles.zarr_value(root, "g/a")
    x = builders.sample_data(np.dtype("<f8"), NEW.shape, np.random.default_rng(32))
    pid = _kill_mid_copy(mount, mount(root, "writable", "chunks=8:8"), "a.npy", oracles.npy_bytes(x))
    staged = _staged(root)
    assert len(staged) == 1, staged
    ((area, keys),) = staged.items()
    assert area.startswith("g/.zarrfs-new-") and len(keys) > 1, keys
    leases = [k for k in os.listdir(root) if k.startswith(".zarrfs-lease-")]
    assert len(leases) == 1, os.listdir(root)
    assert_same_array(oracles.zarr_value(root, "g/a"), old, "zarr-python after the kill")

    again = mount(root, "writable")
    log = _swept(mount, again)
    assert _staged(root) == {}, "the dead writer's staging is still in the store"
    assert not [k for k in os.listdir(root) if k.startswith(".zarrfs-lease-")], "its lease is still there"
    said = mounting.log_lines_naming(log, area)
    assert len(said) == 1 and f"{len(keys)} keys" in said[0] and f"pid {pid}" in said[0], log
    assert f"host {os.uname().nodename}" in said[0], said
    assert_same_array(oracles.zarr_value(root, "g/a"), old, "zarr-python after the clean-up")
    assert (again / "g" / "a.npy").read_bytes() == oracles.npy_bytes(old)


# Copy file argv[1] to argv[2]: the first half, fsync, "half" on stdout, then the rest once a
# line arrives on stdin.
HALF_THEN_REST = """
import os, sys
data = open(sys.argv[1], "rb").read()
fd = os.open(sys.argv[2], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
at = 0
for end in (len(data) // 2, len(data)):
    while at < end:
        at += os.write(fd, data[at:end])
    if end < len(data):
        os.fsync(fd)
        print("half", flush=True)
        sys.stdin.readline()
os.close(fd)
"""


def _plant(root: Path, area: str, age_s: float = 0.0) -> None:
    """A staging area of one chunk-like key, last written AGE_S seconds ago."""
    (root / area).mkdir(parents=True)
    (root / area / "0.0").write_bytes(b"\x01" * 100)
    when = time.time() - age_s
    os.utime(root / area / "0.0", (when, when))


def test_staging_of_writers_still_at_work_is_kept(mount, tmp_path):
    import json

    root = tmp_path / "live.zarr"
    builders.create_array(root, NEW, 2, np.random.default_rng(33))
    writer = mount(root, "writable")
    assert "0 kept" in _swept(mount, writer)
    # another machine's writer whose lease was refreshed a minute ago
    lease = {
        "writer": "feedfacecafe",
        "host": "elsewhere.example",
        "boot_id": "x",
        "pid_namespace": "y",
        "pid": 1,
        "pid_start_ticks": 1,
        "mounted": time.time() - 600,
        "refreshed": time.time() - 60,
    }
    (root / ".zarrfs-lease-feedfacecafe").write_text(json.dumps(lease))
    _plant(root, "g/.zarrfs-new-feedfacecafe-0011223344556677")
    # staging with no lease (older daemons): kept while recent, removed after two hours untouched
    _plant(root, "g/.zarrfs-new-00112233445566aa")
    _plant(root, "g/.zarrfs-new-00112233445566bb", age_s=7200)
    planted = set(_staged(root))
    # a writer of this machine at work: a copy into the first mount, stopped halfway with its
    # chunks fsynced. It runs in a process of its own: a descriptor of ours would be closed in
    # every child the next mount forks, and the mount takes that close (a FUSE flush) for the end.
    x = builders.sample_data(np.dtype("<i4"), (40, 40), np.random.default_rng(34))
    np.save(tmp_path / "b.npy", x)
    copy = subprocess.Popen(
        [sys.executable, "-c", HALF_THEN_REST, os.fspath(tmp_path / "b.npy"), os.fspath(writer / "g" / "b.npy")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        assert copy.stdout.readline() == b"half\n"
        live = sorted(set(_staged(root)) - planted)
        assert len(live) == 1, _staged(root)

        other = mount(root, "writable")
        log = _swept(mount, other)
        assert set(_staged(root)) == {
            "g/.zarrfs-new-feedfacecafe-0011223344556677",
            "g/.zarrfs-new-00112233445566aa",
            *live,
        }, log
        removed = mounting.log_lines_naming(log, "g/.zarrfs-new-00112233445566bb")
        assert len(removed) == 1 and "1 keys, 100 bytes" in removed[0] and "no lease" in removed[0], log
        assert (root / ".zarrfs-lease-feedfacecafe").exists()
    finally:
        copy.communicate(b"go on\n", timeout=30)
    assert copy.returncode == 0
    assert_same_array(oracles.zarr_value(root, "g/b"), x, "zarr-python after the copy completed")
    assert live[0] not in _staged(root)
    mounting.unmount_and_wait(mount, writer)
    assert sorted(k for k in os.listdir(root) if k.startswith(".zarrfs")) == [".zarrfs-lease-feedfacecafe"], (
        "the writer's lease outlived its unmount"
    )
