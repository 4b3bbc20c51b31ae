"""Shards larger than twice `upload_part_size` go to S3 as multipart uploads (moto's server, through
benchmarks/latency_proxy.py), their parts sent while the shard is still being written:
zarr-python reads back what was written, the proxy counts the parts and when they went, a write
into a part already sent makes the shard go whole, and an upload that S3 refuses is aborted (no
part left) and gives EIO at close."""

from __future__ import annotations

import errno
import os
import time

import numpy as np
import pytest
import zarr

from support import mounting
from support.remote import s3_options
from support.s3 import BUCKET, CREDENTIALS, moto_server

PART = 5 << 20  # S3's smallest part: shards of twice this or more go in parts
# A 2048 x 3072 uint32 array of random values (they do not compress) in two shards of 12 MiB:
# three parts each (5, 5 and 2 MiB).
SHAPE, SHARD, INNER, PARTS_PER_SHARD = (2048, 3072), (2048, 1536), (256, 256), 3


def _sharded(fs, tmp_path, name: str) -> np.ndarray:
    """A sharded v3 array `s` written by zarr-python and put in the bucket; its values."""
    local = tmp_path / name
    old = np.random.default_rng(0).integers(0, 2**32, size=SHAPE, dtype="<u4")
    root = zarr.open_group(str(local), mode="w", zarr_format=3)
    root.create_array("s", shape=SHAPE, shards=SHARD, chunks=INNER, dtype=old.dtype)[:] = old
    fs.put(str(local), f"{BUCKET}/{name}", recursive=True)
    return old


def _overwrite(mnt, new: np.ndarray) -> None:
    """Write NEW over every element of s.npy (the array's file, not truncated): both shards rewritten."""
    hlen = os.path.getsize(mnt / "s.npy") - new.nbytes
    fd = os.open(mnt / "s.npy", os.O_WRONLY)
    try:
        mounting.pwrite_all(fd, new.tobytes(), hlen)
    finally:
        os.close(fd)


def _peer(endpoint: str, name: str) -> np.ndarray:
    so = {"client_kwargs": {"endpoint_url": endpoint}, **CREDENTIALS}
    return zarr.open_array(store=f"s3://{BUCKET}/{name}/s", mode="r", storage_options=so)[...]


def test_large_shards_go_as_multipart_uploads(s3, proxy, mount, tmp_path):
    endpoint, fs = s3
    name = "multipart.zarr"
    _sharded(fs, tmp_path, name)
    mnt = mount(f"s3://{BUCKET}/{name}", "writable", "upload_part_size=5M", *s3_options(proxy.port))
    new = np.random.default_rng(1).integers(0, 2**32, size=SHAPE, dtype="<u4")
    proxy.reset_counts()
    _overwrite(mnt, new)
    shard_requests = [(m, p) for m, p in proxy.requests if f"/{name}/s/c/" in p]
    starts = [p for m, p in shard_requests if m == "POST" and p.endswith("?uploads")]
    parts = [p for m, p in shard_requests if m == "PUT" and "partNumber=" in p]
    ends = [p for m, p in shard_requests if m == "POST" and "uploadId=" in p]
    assert (len(starts), len(parts), len(ends)) == (2, 2 * PARTS_PER_SHARD, 2), shard_requests
    assert not [p for m, p in shard_requests if m == "PUT" and "partNumber=" not in p]  # no shard in one PUT
    # parts of 5 MiB ask before sending (100-continue), as botocore does; only small PUTs do not
    assert sorted(p for m, p in proxy.expect_continue if m == "PUT") == sorted(parts)
    np.testing.assert_array_equal(_peer(endpoint, name), new)
    assert fs.list_multipart_uploads(BUCKET) == []


def _parts(proxy, name: str) -> list[str]:
    return [p for m, p in proxy.requests if m == "PUT" and "partNumber=" in p and f"/{name}/s/c/" in p]


def _wait_for_parts(proxy, name: str, n: int) -> list[str]:
    """The parts the proxy saw once there are N (or after 30 s)."""
    deadline = time.monotonic() + 30
    while len(_parts(proxy, name)) < n and time.monotonic() < deadline:
        time.sleep(0.05)
    return _parts(proxy, name)


def _write_in_halves(mnt, proxy, name: str, new: np.ndarray, between: bytes = b"") -> list[str]:
    """Write NEW over s.npy: its first half, then (once both shards' first parts went, or after
    30 s) BETWEEN at the first element, then the second half; the parts seen before that."""
    raw, half = new.tobytes(), new.nbytes // 2
    hlen = os.path.getsize(mnt / "s.npy") - new.nbytes
    proxy.reset_counts()
    fd = os.open(mnt / "s.npy", os.O_WRONLY)
    try:
        mounting.pwrite_all(fd, raw[:half], hlen)
        early = _wait_for_parts(proxy, name, 2)
        mounting.pwrite_all(fd, between, hlen)
        mounting.pwrite_all(fd, raw[half:], hlen + half)
    finally:
        os.close(fd)
    return early


def test_parts_of_a_shard_go_while_it_is_written(s3, proxy, mount, tmp_path):
    """Half the rows written: each shard's first part (its first 5 MiB of inner chunks) is in the
    store before the other half is written; the rest and the index go once it is complete."""
    endpoint, fs = s3
    name = "streamed.zarr"
    _sharded(fs, tmp_path, name)
    mnt = mount(f"s3://{BUCKET}/{name}", "writable", "upload_part_size=5M", *s3_options(proxy.port))
    new = np.random.default_rng(3).integers(0, 2**32, size=SHAPE, dtype="<u4")
    early = _write_in_halves(mnt, proxy, name, new)
    assert sorted(p.split("?")[0].split(f"/{name}/")[1] for p in early) == ["s/c/0/0", "s/c/0/1"], early
    shard_requests = [(m, p) for m, p in proxy.requests if f"/{name}/s/c/" in p]
    starts = [p for m, p in shard_requests if m == "POST" and p.endswith("?uploads")]
    ends = [p for m, p in shard_requests if m == "POST" and "uploadId=" in p]
    assert (len(starts), len(_parts(proxy, name)), len(ends)) == (2, 2 * PARTS_PER_SHARD, 2), shard_requests
    np.testing.assert_array_equal(_peer(endpoint, name), new)
    assert fs.list_multipart_uploads(BUCKET) == []


def test_a_write_into_a_part_sent_stores_the_shard_whole(s3, proxy, mount, tmp_path):
    """After each shard's first part went, its first row is written again: the upload is
    aborted and the shard stored whole at close, with the values written last."""
    endpoint, fs = s3
    name = "rewritten.zarr"
    _sharded(fs, tmp_path, name)
    mnt = mount(f"s3://{BUCKET}/{name}", "writable", "upload_part_size=5M", *s3_options(proxy.port))
    new = np.random.default_rng(4).integers(0, 2**32, size=SHAPE, dtype="<u4")
    first_row = np.arange(SHAPE[1], dtype="<u4")
    assert len(_write_in_halves(mnt, proxy, name, new, first_row.tobytes())) == 2
    new[0] = first_row
    np.testing.assert_array_equal(_peer(endpoint, name), new)
    aborted = [p for m, p in proxy.requests if m == "DELETE" and "uploadId=" in p and f"/{name}/s/c/" in p]
    assert len(aborted) == 2, proxy.requests
    assert fs.list_multipart_uploads(BUCKET) == []


def test_refused_multipart_upload_is_aborted_and_eio(mount, tmp_path, monkeypatch):
    """Fault injection: a moto server that takes only parts of 6 MiB or more refuses to complete the
    upload (EntityTooSmall). The close gives EIO, no part is left, and the old array stays whole."""
    monkeypatch.setenv("S3_UPLOAD_PART_MIN_SIZE", str(6 << 20))
    with moto_server(tmp_path / "moto.log") as (endpoint, fs):
        name = "refused.zarr"
        old = _sharded(fs, tmp_path, name)
        port = int(endpoint.rsplit(":", 1)[1])
        mnt = mount(f"s3://{BUCKET}/{name}", "writable", "upload_part_size=5M", *s3_options(port))
        mount.expect_errors()
        with pytest.raises(OSError) as exc:
            _overwrite(mnt, np.random.default_rng(2).integers(0, 2**32, size=SHAPE, dtype="<u4"))
        assert exc.value.errno == errno.EIO
        assert fs.list_multipart_uploads(BUCKET) == []
        np.testing.assert_array_equal(_peer(endpoint, name), old)
        failed = mounting.log_lines_naming(mount.log_text(mnt), "s/c/")
        # each shard's key and the reason once (the close's own line names the file)
        engine = [ln for ln in failed if "minimum allowed" in ln and "zarrfs.engine" in ln]
        assert sorted(k for ln in engine for k in ("s/c/0/0", "s/c/0/1") if k in ln) == ["s/c/0/0", "s/c/0/1"], failed
        mounting.unmount_and_wait(mount, mnt)
