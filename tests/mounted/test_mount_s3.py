"""Mounting s3:// sources served by moto's S3 server on loopback: reads, and writes with -o writable."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import zarr

from support import mounting
from support.s3 import BUCKET, CREDENTIALS


def _options(endpoint: str) -> str:
    return "storage_options=" + json.dumps({"client_kwargs": {"endpoint_url": endpoint}, **CREDENTIALS})


@pytest.mark.parametrize("fmt", [2, 3])
def test_s3_store_reads_like_local(s3, hierarchy_factory, mount, fmt):
    endpoint, fs = s3
    h = hierarchy_factory(fmt)
    fs.put(str(h.root), f"{BUCKET}/read_v{fmt}.zarr", recursive=True)
    mnt = mount(f"s3://{BUCKET}/read_v{fmt}.zarr", _options(endpoint))
    for path in h.arrays:
        assert (mnt / (path + ".npy")).read_bytes() == h.expected(path).npy, path
    for group in h.all_groups():
        assert sorted(p.name for p in (mnt / group).iterdir()) == sorted(h.listing(group)), group


def test_s3_writes_reach_the_bucket(s3, tmp_path, mount):
    endpoint, fs = s3
    local = tmp_path / "w.zarr"
    root = zarr.open_group(str(local), mode="w", zarr_format=3)
    a = root.create_array("a", shape=(20, 30), chunks=(8, 8), dtype="<f8")
    a[:] = np.arange(600).reshape(20, 30)
    fs.put(str(local), f"{BUCKET}/w.zarr", recursive=True)
    mnt = mount(f"s3://{BUCKET}/w.zarr", "writable", _options(endpoint))
    x = np.random.default_rng(1).normal(size=(17, 5)).astype("<f4")
    src = tmp_path / "x.npy"
    np.save(src, x)
    shutil.copyfile(src, mnt / "x.npy")
    m = np.load(mnt / "a.npy", mmap_mode="r+")
    m[3:11, 2:4] = -1
    m.flush()
    del m
    mounting.unmount_and_wait(mount, mnt)
    copy = tmp_path / "copy.zarr"
    fs.get(f"{BUCKET}/w.zarr", str(copy), recursive=True)
    want = np.arange(600, dtype="<f8").reshape(20, 30)
    want[3:11, 2:4] = -1
    np.testing.assert_array_equal(zarr.open_array(str(copy / "a"), mode="r")[...], want)
    np.testing.assert_array_equal(zarr.open_array(str(copy / "x"), mode="r")[...], x)
