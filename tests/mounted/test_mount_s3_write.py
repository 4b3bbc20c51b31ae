"""Writes into an S3 mount (moto behind benchmarks/latency_proxy.py): what zarr-python reads back, and the
requests the proxy counts (a new array: one PUT per chunk; a replacement: no chunk byte read back)."""

from __future__ import annotations

import errno
import os
import shutil
import signal
import subprocess
from pathlib import Path

import numpy as np
import pytest
import zarr
from zarr.codecs import ZstdCodec

from support import mounting
from support.remote import s3_options
from support.s3 import BUCKET, CREDENTIALS

FORMATS = pytest.mark.parametrize("fmt", [2, 3], ids=["v2", "v3"])
# A 128 x 64 float32 array in 8 x 8 chunks: 16 x 8 = 128 chunks.
SHAPE, CHUNKS, NCHUNKS = (128, 64), (8, 8), 128


def _bucket_store(fs, tmp_path, name: str, fmt: int) -> np.ndarray:
    """A group written by zarr-python, with array `old` (what a replacement replaces)."""
    local = tmp_path / name
    root = zarr.open_group(str(local), mode="w", zarr_format=fmt)
    old = np.arange(40 * 30, dtype="<i2").reshape(40, 30)
    root.create_array("old", shape=old.shape, chunks=(16, 16), dtype=old.dtype)[:] = old
    fs.put(str(local), f"{BUCKET}/{name}", recursive=True)
    return old


def _source(tmp_path, seed: int) -> tuple[np.ndarray, os.PathLike]:
    x = np.random.default_rng(seed).normal(size=SHAPE).astype("<f4")
    path = tmp_path / f"x{seed}.npy"
    np.save(path, x)
    return x, path


def _so(endpoint: str | int) -> dict:
    """fsspec's options reaching ENDPOINT (moto's URL, or the proxy's port)."""
    url = endpoint if isinstance(endpoint, str) else f"http://127.0.0.1:{endpoint}"
    return {"client_kwargs": {"endpoint_url": url}, **CREDENTIALS}


def _peer(endpoint: str | int, name: str, path: str) -> np.ndarray:
    """What zarr-python reads."""
    return zarr.open_array(store=f"s3://{BUCKET}/{name}/{path}", mode="r", storage_options=_so(endpoint))[...]


def _settled(mount, mnt) -> None:
    """The mount's background look for staging areas is over (its requests are not the copy's)."""
    assert mounting.wait_until(lambda: "staging check done" in mount.log_text(mnt), 30)


def _chunk_requests(proxy, name: str, path: str, method: str) -> list[str]:
    docs = ("zarr.json", ".zarray", ".zattrs", ".zgroup")
    return [p for m, p in proxy.requests if m == method and f"/{name}/{path}/" in p and not p.endswith(docs)]


def _chunk_keys(fs, name: str, path: str) -> list[str]:
    """The keys below array PATH of bucket store NAME but its documents."""
    fs.invalidate_cache()
    keys = [k.split(f"{name}/{path}/", 1)[1] for k in fs.find(f"{BUCKET}/{name}/{path}")]
    return [k for k in keys if k not in (".zarray", ".zattrs", "zarr.json")]


@FORMATS
def test_new_array_is_one_put_per_chunk(s3, proxy, mount, tmp_path, fmt):
    _, fs = s3
    name = f"new_v{fmt}.zarr"
    _bucket_store(fs, tmp_path, name, fmt)
    mnt = mount(f"s3://{BUCKET}/{name}", "writable", f"chunks={CHUNKS[0]},{CHUNKS[1]}", *s3_options(proxy.port))
    _settled(mount, mnt)
    x, src = _source(tmp_path, 1)
    proxy.reset_counts()
    shutil.copyfile(src, mnt / "x.npy")
    chunk_puts = _chunk_requests(proxy, name, "x", "PUT")
    assert len(chunk_puts) == NCHUNKS, chunk_puts[:5]
    assert _chunk_requests(proxy, name, "x", "GET") == []  # nothing read back
    assert proxy.count() <= 1.2 * NCHUNKS, proxy.requests
    assert not [p for m, p in proxy.requests if m == "PUT" and ".zarrfs-new-" in p and "direct.json" not in p]
    assert proxy.expect_continue == []  # each PUT sent its body at once: one round trip, not two
    np.testing.assert_array_equal(_peer(proxy.port, name, "x"), x)
    # the mount's own staging marker and lease are gone (the lease just after the close)
    assert mounting.wait_until(lambda: not [k for k in fs.find(f"{BUCKET}/{name}") if ".zarrfs" in k], 10)


@FORMATS
def test_replacement_is_one_put_per_chunk_and_old_until_close(s3, proxy, mount, tmp_path, fmt):
    _, fs = s3
    name = f"replace_v{fmt}.zarr"
    old = _bucket_store(fs, tmp_path, name, fmt)
    mnt = mount(f"s3://{BUCKET}/{name}", "writable", f"chunks={CHUNKS[0]},{CHUNKS[1]}", *s3_options(proxy.port))
    _settled(mount, mnt)
    x, src = _source(tmp_path, 2)
    proxy.reset_counts()
    with open(mnt / "old.npy", "wb") as f:  # 40 x 30 int16 in 16 x 16 chunks becomes 128 x 64 float32
        f.write(src.read_bytes())
        f.flush()
        os.fsync(f.fileno())  # every chunk in the store: readers still see the old array, whole
        requests = proxy.count()
        np.testing.assert_array_equal(_peer(s3[0], name, "old"), old)
    chunk_puts = _chunk_requests(proxy, name, "old", "PUT")
    assert len(chunk_puts) == NCHUNKS, chunk_puts[:5]
    assert not [p for m, p in proxy.requests if m == "PUT" and ".zarrfs-new-" in p and "direct.json" not in p]
    assert _chunk_requests(proxy, name, "old", "GET") == []
    assert requests <= NCHUNKS + 12
    np.testing.assert_array_equal(_peer(s3[0], name, "old"), x)
    # the commit: documents, then in the background the old keys and the marker in one bulk erase, the lease
    assert mounting.wait_until(lambda: len(_chunk_keys(fs, name, "old")) == NCHUNKS, 10)
    assert proxy.count() - requests <= 8
    assert mounting.wait_until(lambda: not [k for k in fs.find(f"{BUCKET}/{name}") if ".zarrfs" in k], 10)
    # replaced again: back to the first separator, still one PUT per chunk
    y, src2 = _source(tmp_path, 6)
    proxy.reset_counts()
    shutil.copyfile(src2, mnt / "old.npy")
    assert len(_chunk_requests(proxy, name, "old", "PUT")) == NCHUNKS
    np.testing.assert_array_equal(_peer(s3[0], name, "old"), y)


@FORMATS
def test_replacements_in_quick_succession_keep_every_chunk(s3, proxy, mount, tmp_path, fmt):
    """Each replacement's old keys are erased after its close returns; the next replacement, which
    writes under their separator, waits for that erase: zarr-python reads each back exactly, and
    after the unmount only the last array's chunks are left."""
    _, fs = s3
    name = f"quick_v{fmt}.zarr"
    _bucket_store(fs, tmp_path, name, fmt)
    mnt = mount(f"s3://{BUCKET}/{name}", "writable", f"chunks={CHUNKS[0]},{CHUNKS[1]}", *s3_options(proxy.port))
    _settled(mount, mnt)
    proxy.reset_counts()
    for seed in (8, 9, 10):
        x, src = _source(tmp_path, seed)
        shutil.copyfile(src, mnt / "old.npy")
        np.testing.assert_array_equal(_peer(s3[0], name, "old"), x)
    chunk_puts = _chunk_requests(proxy, name, "old", "PUT")
    assert len(chunk_puts) == 3 * NCHUNKS, chunk_puts[:5]  # each replacement written straight, none staged
    assert _chunk_requests(proxy, name, "old", "GET") == []
    mounting.unmount_and_wait(mount, mnt)  # waits for the last erase
    bulk_erases = [p for m, p in proxy.requests if m == "POST" and "delete" in p]
    assert len(bulk_erases) == 3, bulk_erases  # one per replacement: old keys and marker together
    np.testing.assert_array_equal(_peer(s3[0], name, "old"), x)
    assert len(_chunk_keys(fs, name, "old")) == NCHUNKS
    fs.invalidate_cache()
    assert not [k for k in fs.find(f"{BUCKET}/{name}") if ".zarrfs" in k]


def test_replacement_without_other_keys_is_copied_in_the_store(s3, proxy, mount, tmp_path):
    """A 1-d v2 array's chunk keys (`5`) are the same with either separator: the replacement is
    staged, then copied by the store (CopyObject), no chunk byte read back."""
    _, fs = s3
    name = "replace_1d.zarr"
    local = tmp_path / name
    root = zarr.open_group(str(local), mode="w", zarr_format=2)
    root.create_array("v", shape=(100,), chunks=(10,), dtype="<i4")[:] = np.arange(100)
    fs.put(str(local), f"{BUCKET}/{name}", recursive=True)
    mnt = mount(f"s3://{BUCKET}/{name}", "writable", "chunks=8", *s3_options(proxy.port))
    _settled(mount, mnt)
    x = np.arange(NCHUNKS * 8, dtype="<f8") / 3
    np.save(tmp_path / "v.npy", x)
    proxy.reset_counts()
    shutil.copyfile(tmp_path / "v.npy", mnt / "v.npy")
    requests = proxy.count()
    staged_puts = [p for m, p in proxy.requests if m == "PUT" and ".zarrfs-new-" in p]
    copies = _chunk_requests(proxy, name, "v", "PUT")  # CopyObject is a PUT naming its source
    assert len(staged_puts) == NCHUNKS and len(copies) == NCHUNKS
    assert [p for m, p in proxy.requests if m == "GET" and ".zarrfs-new-" in p and "list-type" not in p] == []
    assert requests <= 2 * NCHUNKS + 16
    np.testing.assert_array_equal(_peer(s3[0], name, "v"), x)
    assert mounting.wait_until(lambda: not [k for k in fs.find(f"{BUCKET}/{name}") if ".zarrfs" in k], 10)


def test_sharded_and_partial_writes_read_back(s3, proxy, mount, tmp_path):
    _, fs = s3
    name = "sharded.zarr"
    local = tmp_path / name
    root = zarr.open_group(str(local), mode="w", zarr_format=3)
    y = np.arange(64 * 48, dtype="<f8").reshape(64, 48)
    root.create_array("s", shape=y.shape, shards=(32, 24), chunks=(8, 8), dtype=y.dtype, compressors=[ZstdCodec()])[
        :
    ] = y
    fs.put(str(local), f"{BUCKET}/{name}", recursive=True)
    mnt = mount(f"s3://{BUCKET}/{name}", "writable", *s3_options(proxy.port))
    hlen = len((mnt / "s.npy").read_bytes()) - y.nbytes
    fd = os.open(mnt / "s.npy", os.O_WRONLY)
    try:
        for r in range(5, 40):  # rows 5-39, columns 10-29: parts of four shards
            mounting.pwrite_all(fd, np.full(20, -7, "<f8").tobytes(), hlen + 8 * (r * 48 + 10))
    finally:
        os.close(fd)
    y[5:40, 10:30] = -7
    np.testing.assert_array_equal(_peer(proxy.port, name, "s"), y)
    x, src = _source(tmp_path, 3)
    shutil.copyfile(src, mnt / "s.npy")  # the sharded array replaced
    np.testing.assert_array_equal(_peer(proxy.port, name, "s"), x)
    shutil.copyfile(src, mnt / "t.npy")  # and a new one beside it
    np.testing.assert_array_equal(_peer(proxy.port, name, "t"), x)


def _copy_failing(mount, root, name: str, fail_at: int, tmp_path, seed: int):
    """Mount ROOT over failfile:// with the FAIL_AT-th write of a key under NAME/ failing, and copy
    an NPY file (of `_source(tmp_path, SEED)`) to NAME.npy: its close gives EIO. (mountpoint, the
    daemon's log, the file copied)."""
    mnt, _, log = mounting.mount_failing(
        mount,
        root,
        {"FAILFILE_MATCH": f"/{name}/", "FAILFILE_FAIL_AT": str(fail_at)},
        f"chunks={CHUNKS[0]},{CHUNKS[1]}",
    )
    mount.expect_errors()
    _, src = _source(tmp_path, seed)
    with pytest.raises(OSError) as exc:
        with open(mnt / f"{name}.npy", "wb") as f:
            f.write(src.read_bytes())
    assert exc.value.errno == errno.EIO
    return mnt, log, src


def _old_array(root: Path, fmt: int) -> tuple[np.ndarray, list[Path]]:
    """A store at ROOT holding the array `old`, written by zarr-python: its values and files."""
    g = zarr.open_group(str(root), mode="w", zarr_format=fmt)
    old = np.arange(40 * 30, dtype="<i2").reshape(40, 30)
    g.create_array("old", shape=old.shape, chunks=(16, 16), dtype=old.dtype)[:] = old
    return old, sorted(p.relative_to(root) for p in root.rglob("*") if p.is_file())


def _still_old(root: Path, mnt: Path, old: np.ndarray, before: list[Path]) -> None:
    """zarr-python and the mount read `old` whole, and the store holds its files alone (and a lease)."""
    np.testing.assert_array_equal(zarr.open_array(str(root / "old"), mode="r")[...], old)
    assert np.array_equal(np.load(mnt / "old.npy"), old)
    after = sorted(p.relative_to(root) for p in root.rglob("*") if p.is_file())
    assert [p for p in after if ".zarrfs-lease" not in str(p)] == before


@FORMATS
def test_failed_upload_is_eio_and_keeps_the_old_array(mount, tmp_path, fmt):
    """Fault injection (tests/support/failing_store.py, an object-store-like file system): a chunk
    PUT of a replacement fails; close gives EIO, the old array is read whole, its keys alone stay."""
    root = tmp_path / f"fail_v{fmt}.zarr"
    old, before = _old_array(root, fmt)
    mnt, log, src = _copy_failing(mount, root, "old", 5, tmp_path, 4)
    x = np.load(src)
    _still_old(root, mnt, old, before)
    failed = mounting.log_lines_naming(log.read_text(), "old/")
    # the key and the reason once (the close's own line names the file and what was kept)
    assert len([ln for ln in failed if "injected failure" in ln and "zarrfs.engine" in ln]) == 1, failed
    # written again, it is stored
    shutil.copyfile(src, mnt / "old.npy")
    np.testing.assert_array_equal(zarr.open_array(str(root / "old"), mode="r")[...], x)


@FORMATS
def test_failed_claim_stores_no_chunk_and_is_eio(mount, tmp_path, fmt):
    """The marker of a replacement written straight under its keys goes up before its first chunk;
    when its PUT fails, no chunk is stored, the copy fails with EIO, the old array is read whole,
    and the log names the key and the reason once."""
    root = tmp_path / f"failclaim_v{fmt}.zarr"
    old, before = _old_array(root, fmt)
    calls = tmp_path / "calls"
    mnt, _, log = mounting.mount_failing(
        mount,
        root,
        {"FAILFILE_MATCH": "direct.json", "FAILFILE_FAIL_AT": "1", "FAILFILE_CALLS": str(calls)},
        f"chunks={CHUNKS[0]},{CHUNKS[1]}",
    )
    mount.expect_errors()
    _, src = _source(tmp_path, 6)
    with pytest.raises(OSError) as exc:
        with open(mnt / "old.npy", "wb") as f:
            f.write(src.read_bytes())
    assert exc.value.errno == errno.EIO
    _still_old(root, mnt, old, before)
    written = calls.read_text().splitlines()
    markers = [ln for ln in written if "direct.json" in ln]
    assert len(markers) == 1 and markers[0].endswith("FAILED"), written
    assert not [ln for ln in written if "/old/" in ln], written  # no chunk, no document
    failed = [ln for ln in log.read_text().splitlines() if "injected failure" in ln]
    assert len(failed) == 1 and "direct.json" in failed[0], log.read_text()


@FORMATS
def test_failed_upload_of_a_new_array_leaves_nothing(mount, tmp_path, fmt):
    """A new array written straight under its keys: a failed chunk PUT gives EIO at close and
    leaves no key under its name (zarr-python finds no such array)."""
    name = f"failnew_v{fmt}.zarr"
    root = tmp_path / name
    zarr.open_group(str(root), mode="w", zarr_format=fmt)
    _copy_failing(mount, root, "new", 7, tmp_path, 5)
    assert not (root / "new").exists() or not any(p.is_file() for p in (root / "new").rglob("*"))
    assert not [p for p in root.rglob("*") if ".zarrfs" in p.name and p.is_file()]
    assert "new" not in zarr.open_group(str(root), mode="r")


def test_a_writer_killed_mid_copy_leaves_the_old_array_and_is_swept(s3, mount, tmp_path):
    """A daemon killed while writing a new array and replacing another straight under their keys:
    zarr-python reads the old array and no new one; the next writable mount removes the chunks it
    left (the keys of their encoding only) and its markers."""
    endpoint, fs = s3
    name = "killed.zarr"
    old = _bucket_store(fs, tmp_path, name, 3)
    before = sorted(fs.find(f"{BUCKET}/{name}"))
    mnt = mount(
        f"s3://{BUCKET}/{name}",
        "writable",
        f"chunks={CHUNKS[0]},{CHUNKS[1]}",
        *s3_options(int(endpoint.rsplit(":", 1)[1])),
    )
    mount.expect_errors()
    x, src = _source(tmp_path, 7)
    data = src.read_bytes()
    pids = mounting.pids_serving(mnt)
    fds = [os.open(mnt / f, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644) for f in ("old.npy", "n.npy")]
    for fd in fds:
        mounting.pwrite_all(fd, data[: len(data) // 2], 0)
        os.fsync(fd)
    assert [k for k in fs.find(f"{BUCKET}/{name}/n") if "/c/" in k]  # half of its chunks are there
    os.kill(pids[0], signal.SIGKILL)
    assert mounting.wait_until(lambda: not mounting.pid_alive(pids[0]), 10)
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass  # the daemon is gone
    subprocess.run(["fusermount3", "-uz", os.fspath(mnt)], capture_output=True, check=True)
    np.testing.assert_array_equal(_peer(endpoint, name, "old"), old)
    assert "n" not in zarr.open_group(store=f"s3://{BUCKET}/{name}", mode="r", storage_options=_so(endpoint))
    again = mount(f"s3://{BUCKET}/{name}", "writable", *s3_options(int(endpoint.rsplit(":", 1)[1])))
    _settled(mount, again)
    assert sorted(fs.find(f"{BUCKET}/{name}")) == before
    np.testing.assert_array_equal(_peer(endpoint, name, "old"), old)
