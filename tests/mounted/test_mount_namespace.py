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

from support import oracles

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
        assert os.pread(held, 1 << 16, 0) == oracles.npy_bytes(want)
    finally:
        os.close(held)
    np.testing.assert_array_equal(np.load(chunks / "3.4.npy"), want)
    np.testing.assert_array_equal(
        np.load(chunks / "999.999.npy"), np.asarray(zarr.open_array(str(src / "A"))[999:, 999:])
    )


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
    assert (mnt / "y.npy").read_bytes() == oracles.npy_bytes(value)
    with open(mnt / "g" / ".tmp.part", "wb") as f:  # a held file outlives the kernel's references
        f.write(oracles.npy_bytes(value[:2]))
    drop_kernel_caches()
    os.rename(mnt / "g" / ".tmp.part", mnt / "g" / "z.npy")
    np.testing.assert_array_equal(zarr.open_array(str(src / "g" / "z"))[...], value[:2])
    assert sorted(os.listdir(mnt / "g")) == ["z.npy"]


def _ls_inodes(path) -> list[tuple[str, int]]:
    """(name, inode) of every entry `ls -a1i` shows, in its order."""
    r = subprocess.run(["ls", "-a1iU", os.fspath(path)], capture_output=True, text=True, check=True)
    return [(name, int(ino)) for ino, name in (line.split(None, 1) for line in r.stdout.splitlines())]


def test_dot_and_dotdot_are_listed_with_their_inodes(mount, tmp_path):
    src = tmp_path / "dots.zarr"
    root = zarr.open_group(str(src), mode="w", zarr_format=3)
    root.create_group("g").create_group("h")
    # 3,000 chunk files: a listing that takes many readdir requests, each resuming at an offset.
    root.create_array("g/x", shape=(60, 50), chunks=(1, 1), dtype="u1", fill_value=3)
    mnt = mount(src, "show_views")
    top = dict(_ls_inodes(mnt))
    # (ls shows the root's `..` as the directory the mountpoint is in, whatever the mount answers)
    assert top["."] == os.stat(mnt).st_ino and {".", "..", "g", VIEWS} <= set(top)
    g = dict(_ls_inodes(mnt / "g"))
    assert g["."] == top["g"] == os.stat(mnt / "g").st_ino and g[".."] == top["."]
    assert dict(_ls_inodes(mnt / "g" / "h"))[".."] == g["."]
    chunks = _ls_inodes(mnt / VIEWS / "chunks" / "g" / "x")
    names = [name for name, _ in chunks]
    assert names[:2] == [".", ".."] and len(names) == len(set(names)) == 3000 + 2
    assert chunks[1][1] == os.stat(mnt / VIEWS / "chunks" / "g").st_ino
    # os.listdir and the walkers skip the two themselves
    assert "." not in os.listdir(mnt) and ".." not in os.listdir(mnt / "g")
    r = subprocess.run(["find", os.fspath(mnt)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    found = r.stdout.splitlines()
    assert len(found) == len(set(found)) and os.fspath(mnt / "g" / "h") in found
    walked = sum(len(dirs) + len(files) for _, dirs, files in os.walk(mnt)) + 1
    assert len(found) == walked
