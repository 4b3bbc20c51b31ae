"""Mounting kerchunk references of a netCDF4 file: JSON and Parquet, local and on S3 (moto), read-only.

netCDF4 writes the file (tests/support/reference_files.py) and is the oracle: each variable's `.npy`
equals np.save of what netCDF4 reads, masks and scales off.
"""

from __future__ import annotations

import errno
import json
import os

import numpy as np
import pytest

from support import mounting, oracles
from support import reference_files as rf
from support.s3 import BUCKET, CREDENTIALS


@pytest.fixture(scope="module")
def nc(tmp_path_factory):
    """(directory, netCDF4 file, its values, its references): refs.json and refs.parq beside the file."""
    d = tmp_path_factory.mktemp("nc")
    path = d / "t.nc"
    values = rf.write_netcdf(path)
    assert np.unique(values["chunked"]).size > 1000 and values["small"][2] == 1e10  # not all fill
    refs = rf.kerchunk_refs(path)
    rf.write_json(refs, d / "refs.json")
    rf.write_parquet(refs, str(d / "refs.parq"))
    return d, path, values, refs


def _reads_as_netcdf(mnt, values):
    assert sorted(os.listdir(mnt)) == [f"{name}.npy" for name in rf.VARIABLES]
    for name in rf.VARIABLES:
        assert (mnt / f"{name}.npy").read_bytes() == oracles.npy_bytes(values[name]), name


@pytest.mark.parametrize("how", ["json", "parquet", "reference-url"])
def test_references_read_as_netcdf4(nc, mount, how):
    """Chunked zlib+shuffle, contiguous and inlined variables read as netCDF4 reads them; attributes kept."""
    d, path, values, refs = nc
    assert isinstance(refs["refs"]["small/0"], str)  # kerchunk inlined it: no byte range of the file
    assert isinstance(refs["refs"]["contig/0.0"], list) and "chunked/2.1" in refs["refs"]
    if how == "reference-url":
        mnt = mount("reference://", "storage_options=" + json.dumps({"fo": str(d / "refs.json")}))
    else:
        mnt = mount(d / ("refs.json" if how == "json" else "refs.parq"))
    _reads_as_netcdf(mnt, values)
    assert json.loads(os.getxattr(mnt, "user.zarr.attributes"))["title"] == "reference test"
    assert json.loads(os.getxattr(mnt / "chunked.npy", "user.zarr.attributes"))["units"] == "K"


@pytest.mark.parametrize("kind", ["json", "parquet"])
def test_chunks_left_out_read_as_fill_value(nc, tmp_path, mount, kind):
    """A chunk the references leave out reads as the fill value its .zarray declares, like any store."""
    d, path, values, refs = nc
    refs = json.loads(json.dumps(refs))
    del refs["refs"]["chunked/1.0"]
    zarray = json.loads(refs["refs"]["chunked/.zarray"])
    zarray["fill_value"] = -7.5
    refs["refs"]["chunked/.zarray"] = json.dumps(zarray)
    if kind == "json":
        source = rf.write_json(refs, tmp_path / "gap.json")
    else:
        source = rf.write_parquet(refs, str(tmp_path / "gap.parq"))
    mnt = mount(source)
    want = values["chunked"].copy()
    want[16:32, 0:16] = -7.5
    assert (mnt / "chunked.npy").read_bytes() == oracles.npy_bytes(want)
    assert (mnt / "contig.npy").read_bytes() == oracles.npy_bytes(values["contig"])


def test_a_data_file_gone_fails_its_reads_only(nc, tmp_path, mount):
    """The archive removed under a mount: its chunks' reads fail with EIO and a log line naming the key
    and the file; the inlined variable still reads, and the daemon serves on."""
    d, path, values, refs = nc
    data = tmp_path / "t.nc"
    data.write_bytes(path.read_bytes())
    mnt = mount(rf.write_json(rf.kerchunk_refs(data), tmp_path / "refs.json"))
    data.unlink()
    with pytest.raises(OSError) as e:
        (mnt / "contig.npy").read_bytes()
    assert e.value.errno == errno.EIO
    assert (mnt / "small.npy").read_bytes() == oracles.npy_bytes(values["small"])
    lines = mounting.log_lines_naming(mount.log_text(mnt), "contig/0.0")
    assert lines and all(f"data file {data}: FileNotFoundError" in ln for ln in lines), lines


def test_writable_references_fail_at_start(nc, tmp_path):
    """References describe byte ranges of another file: `-o writable` is refused in one line."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    source = nc[0] / "refs.json"
    cmd = [*mounting.ZARRFS, str(source), str(mnt), "-o", "writable"]
    code, stdout, stderr, was_mounted = mounting.run_expecting_failure(cmd, mnt, tmp_path)
    assert not was_mounted and code == 1
    assert stderr.splitlines() == [f"zarrfs: {source}: references cannot be written; mount it without writable"]


def _s3_options(endpoint: str) -> dict:
    return {"client_kwargs": {"endpoint_url": endpoint}, **CREDENTIALS}


@pytest.mark.parametrize("how", ["json", "parquet", "local-json"])
def test_references_with_data_on_s3(nc, s3, tmp_path, mount, how):
    """References of a file in a bucket: on S3 themselves (the same storage options reach the data),
    or local with `remote_options` for the data."""
    endpoint, fs = s3
    d, path, values, refs = nc
    fs.put(str(path), f"{BUCKET}/refs/t.nc")
    refs = rf.kerchunk_refs(path, url=f"s3://{BUCKET}/refs/t.nc")
    options = "storage_options=" + json.dumps(_s3_options(endpoint))
    if how == "json":
        fs.pipe(f"{BUCKET}/refs/refs.json", json.dumps(refs).encode())
        mnt = mount(f"s3://{BUCKET}/refs/refs.json", options)
    elif how == "parquet":
        source = rf.write_parquet(refs, f"s3://{BUCKET}/refs/refs.parq", **_s3_options(endpoint))
        mnt = mount(source, options)
    else:
        source = rf.write_json(refs, tmp_path / "refs.json")
        mnt = mount(source, "remote_options=" + json.dumps(_s3_options(endpoint)))
    _reads_as_netcdf(mnt, values)
