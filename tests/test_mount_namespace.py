"""Mounted tests of lookup counts: entries the kernel forgets are freed, and nothing breaks when they are.

The count is what the daemon reports in `.zarrfs/stats.json` ("entries"); expected bytes
come from zarr-python and np.save.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time

import numpy as np
import zarr

import mounted

VIEWS = ".zarrfs"
# A million grid positions, none stored: every chunk file reads as the fill value.
GRID = (1000, 1000)
# Entries the mount may keep after the kernel dropped its caches: the root, .zarrfs and its
# directories, and the few the test itself looks up.
SLACK_ENTRIES = 300


def entries(mnt) -> int:
    with open(mnt / VIEWS / "stats.json", "rb") as f:
        return json.load(f)["entries"]


def drop_kernel_caches() -> None:
    subprocess.run(["sync"], check=True)
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("2\n")  # dentries and inodes: the kernel sends FORGET for each


def settled_entries(mnt, limit: int, timeout_s: float = 20.0) -> int:
    """The entry count once it is at most `limit` (forgets arrive asynchronously)."""
    n = entries(mnt)
    deadline = time.monotonic() + timeout_s
    while n > limit and time.monotonic() < deadline:
        time.sleep(0.2)
        drop_kernel_caches()
        n = entries(mnt)
    return n


# Entries that must have piled up while find walked the million names (the kernel's references).
MIN_ENTRIES_HELD = 10_000


def test_find_over_a_million_chunk_files_then_drop_caches_frees_the_entries(mount, tmp_path):
    src = tmp_path / "big.zarr"
    arr = zarr.create_array(str(src / "A"), shape=GRID, chunks=(1, 1), dtype="<u2", fill_value=7, zarr_format=3)
    arr[3, 4] = 9  # one stored chunk among a million
    mnt = mount(src)
    chunks = mnt / VIEWS / "chunks" / "A"
    held = os.open(chunks / "3.4.npy", os.O_RDONLY)  # an open file across the forgets
    try:
        start = entries(mnt)
        out = subprocess.run(["find", str(chunks), "-type", "f"], capture_output=True, check=True).stdout
        assert out.count(b"\n") == GRID[0] * GRID[1]
        # The daemon keeps an entry per name the kernel holds: about a million now, fewer when
        # memory pressure (or another process's drop_caches) made the kernel forget some already.
        peak = entries(mnt)
        assert peak - start >= MIN_ENTRIES_HELD, (start, peak)
        drop_kernel_caches()
        after = settled_entries(mnt, start + SLACK_ENTRIES)
        assert after <= start + SLACK_ENTRIES, (start, after)
        # The open file still reads; names looked up again after the forget read correctly.
        want = np.asarray(zarr.open_array(str(src / "A"))[3:4, 4:5])
        assert os.pread(held, 1 << 16, 0) == mounted.npy_bytes(want)
    finally:
        os.close(held)
    np.testing.assert_array_equal(np.load(chunks / "3.4.npy"), want)
    np.testing.assert_array_equal(np.load(chunks / "999.999.npy"),
                                  np.asarray(zarr.open_array(str(src / "A"))[999:, 999:]))


def test_writes_keep_working_across_forgets(mount, tmp_path):
    src = tmp_path / "w.zarr"
    zarr.open_group(str(src), mode="w", zarr_format=3).create_group("g")
    mnt = mount(src, "writable")
    value = np.arange(5000, dtype="<i4").reshape(50, 100)
    np.save(tmp_path / "x.npy", value)
    with open(tmp_path / "x.npy", "rb") as f, open(mnt / "g" / "x.npy", "wb") as out:
        out.write(f.read(1000))
        drop_kernel_caches()  # while the new file is half written
        shutil.copyfileobj(f, out)
    drop_kernel_caches()
    np.testing.assert_array_equal(zarr.open_array(str(src / "g" / "x"))[...], value)
    os.rename(mnt / "g" / "x.npy", mnt / "y.npy")
    drop_kernel_caches()
    assert (mnt / "y.npy").read_bytes() == mounted.npy_bytes(value)
    with open(mnt / "g" / ".tmp.part", "wb") as f:  # a held file outlives the kernel's references
        f.write(mounted.npy_bytes(value[:2]))
    drop_kernel_caches()
    os.rename(mnt / "g" / ".tmp.part", mnt / "g" / "z.npy")
    np.testing.assert_array_equal(zarr.open_array(str(src / "g" / "z"))[...], value[:2])
    assert sorted(os.listdir(mnt / "g")) == ["z.npy"]
