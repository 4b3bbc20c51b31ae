"""Mounted: uncompressed local arrays are read straight from their chunk files on read-only mounts, and equal
np.save bytes; writable mounts, compressed arrays and absent chunks take the chunk cache."""

import json
import os
import random
import resource
from pathlib import Path

import numpy as np
import zarr

from support.mounting import pids_serving
from support.oracles import npy_bytes

VIEWS = ".zarrfs"


def stats(mnt):
    return json.loads((mnt / VIEWS / "stats.json").read_bytes())


def make(root, name, data, zarr_format, compressors=None, chunks=(200, 500)):
    arr = zarr.create_array(
        store=os.fspath(root),
        name=name,
        shape=data.shape,
        dtype=data.dtype,
        chunks=chunks,
        zarr_format=zarr_format,
        compressors=compressors,
        fill_value=7,
    )
    arr[...] = data
    return arr


def check_reads(mnt, root, name, sizes=(256 << 10, 600_000)):
    """The whole file, then reads of SIZES at random places (O_DIRECT: each reaches the daemon)."""
    want = npy_bytes(zarr.open_array(os.fspath(root / name), mode="r")[...])
    assert (mnt / f"{name}.npy").read_bytes() == want, name
    fd = os.open(mnt / f"{name}.npy", os.O_RDONLY | os.O_DIRECT)
    with open(fd, "rb", buffering=0) as f:
        for _ in range(50):
            off, n = random.randrange(len(want)), random.randrange(*sizes)
            f.seek(off)
            assert f.read(n) == want[off : off + n], (name, off, n)


def test_uncompressed_arrays_are_read_from_their_files(mount, tmp_path):
    # Reads of 256 KiB or more touch at most 4 chunks: pieces large enough to be read directly.
    data = np.random.default_rng(3).standard_normal((1000, 1000)).astype("<f4")
    v2, v3 = tmp_path / "v2.zarr", tmp_path / "v3.zarr"
    make(v2, "a", data, 2)
    make(v3, "a", data.astype(">f8"), 3)  # v3 `bytes` stores little-endian: a copy of the file
    sparse = make(v3, "sparse", np.full((1000, 1000), 7, "<i2"), 3)
    sparse[200:400, 500:1000] = 5  # one stored chunk; every other is the fill value
    make(v3, "zstd", data, 3, compressors=[zarr.codecs.ZstdCodec(level=1)])
    mnt2 = mount(v2)
    check_reads(mnt2, v2, "a")
    assert (mnt2 / VIEWS / "raw" / "a.raw").read_bytes() == data.tobytes()
    s = stats(mnt2)
    assert s["direct_reads"] > 0 and s["direct_bytes"] >= 2 * data.nbytes
    assert s["bytes_decoded"] == 0  # no chunk went through the chunk cache
    for i, j in ((0, 0), (2, 1), (4, 1)):  # one chunk's file: a stream of its own grid, placed in the array's
        want = npy_bytes(data[i * 200 : (i + 1) * 200, j * 500 : (j + 1) * 500])
        assert (mnt2 / VIEWS / "chunks" / "a" / f"{i}.{j}.npy").read_bytes() == want, (i, j)
    assert stats(mnt2)["direct_reads"] > s["direct_reads"]
    mnt3 = mount(v3)
    check_reads(mnt3, v3, "a")
    assert stats(mnt3)["bytes_decoded"] == 0
    check_reads(mnt3, v3, "a", sizes=(1, 64 << 10))  # small random reads: the chunk cache
    assert stats(mnt3)["bytes_decoded"] > 0
    for name in ("sparse", "zstd"):  # absent chunks and compressed chunks: the chunk cache
        check_reads(mnt3, v3, name, sizes=(1, 300_000))


def test_writable_mounts_read_through_the_chunk_cache(mount, tmp_path):
    data = np.arange(300 * 200, dtype="<i4").reshape(300, 200)
    root = tmp_path / "w.zarr"
    make(root, "a", data, 3)
    mnt = mount(root, "writable")
    with open(mnt / "a.npy", "r+b") as f:  # a write the store does not hold yet is read back
        f.seek(len(npy_bytes(data)) - 4)
        f.write(np.array([-1], "<i4").tobytes())
        f.seek(0)
        got = f.read()
    want = data.copy()
    want[-1, -1] = -1
    assert got == npy_bytes(want)
    assert stats(mnt)["direct_reads"] == 0


def test_narrow_chunks_are_read_from_their_files_with_many_kept_open(mount, tmp_path):
    """Chunks of 16 columns, full height: a 1 MiB read touches 256 of them. The reads come from
    their files (none is loaded into the cache whole), the first in the trio thread, then in
    bands filled by worker threads that each keep 256 files open; the daemon raises a soft
    open-file limit of 1,024 so that they can."""
    data = np.random.default_rng(5).standard_normal((1500, 4096)).astype("<f4")  # 24 MB, 256 chunk columns
    root = tmp_path / "n.zarr"
    zarr.open_group(os.fspath(root), mode="w")
    make(root, "a", data, 3, chunks=(1500, 16))
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(1024, hard), hard))
    try:
        mnt = mount(root)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    limits = Path(f"/proc/{pids_serving(mnt)[0]}/limits").read_text()
    daemon_soft = next(line.split()[3] for line in limits.splitlines() if line.startswith("Max open files"))
    assert int(daemon_soft) == (1 << 16 if hard == resource.RLIM_INFINITY else min(hard, 1 << 16))
    want = npy_bytes(zarr.open_array(os.fspath(root / "a"), mode="r")[...])
    assert (mnt / "a.npy").read_bytes() == want
    s = stats(mnt)
    assert s["direct_reads"] > 0 and s["bands_assembled"] > 0, s
    # Reads of 512 KiB (2 KiB of each chunk) too: loading their chunks would copy 3,000 times more.
    fd = os.open(mnt / "a.npy", os.O_RDONLY | os.O_DIRECT)
    with open(fd, "rb", buffering=0) as f:
        for off in (0, 5 << 20, 20 << 20):
            f.seek(off)
            assert f.read(512 << 10) == want[off : off + (512 << 10)]
    assert stats(mnt)["bytes_decoded"] == 0, stats(mnt)  # no chunk loaded whole
    check_reads(mnt, root, "a", sizes=(1 << 20, 3 << 20))  # and reads at random places
