#!/usr/bin/env python3
"""A cold `cat` of an array in an Icechunk repository against the same array in a plain v3 store.

Writes one uncompressed float32 array (square, 1024x1024 chunks) both ways into /dev/shm:
a Zarr v3 directory store, and an Icechunk repository on the local file system (one
commit on `main`). Then, in interleaved pairs, each is mounted afresh (no cache carries
over) and its ``a.npy`` read whole with `cat`. Prints each pair's times and ratio
(icechunk / plain), then the median ratio.

Run with the venv's Python: ``.venv/bin/python benchmarks/bench_icechunk.py``. It never
imports zarrfs; mounting and timing helpers come from benchmarks/bench.py.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
from pathlib import Path

import numpy as np

import bench  # (tmpfs_scratch, mounted, cat)

CHUNK = 1024


def build(root: Path, size_mib: int) -> tuple[Path, Path]:
    """The plain store and the repository, each holding array `a` of about SIZE_MIB MiB."""
    import icechunk
    import zarr

    side = max(CHUNK, round(math.sqrt(size_mib * (1 << 20) / 4) / CHUNK) * CHUNK)
    data = np.random.default_rng(0).random((side, side), dtype="f4")
    plain, repo_dir = root / "plain.zarr", root / "repo"
    zarr.create_array(
        os.fspath(plain), name="a", shape=data.shape, chunks=(CHUNK, CHUNK), dtype="f4", compressors=None, zarr_format=3
    )[...] = data
    repo = icechunk.Repository.create(icechunk.local_filesystem_storage(os.fspath(repo_dir)))
    session = repo.writable_session("main")
    group = zarr.group(store=session.store, zarr_format=3)
    group.create_array("a", shape=data.shape, chunks=(CHUNK, CHUNK), dtype="f4", compressors=None)[...] = data
    session.commit("a")
    print(f"array a: {side}x{side} float32 ({data.nbytes / (1 << 20):.0f} MiB), {CHUNK}x{CHUNK} chunks")
    return plain, repo_dir


def cold_cat(source: Path, mnt: Path) -> float:
    """Seconds for `cat` of a.npy on a fresh mount of SOURCE."""
    with bench.mounted(source, mnt, [], "bench_icechunk"):
        return bench.cat(mnt / "a.npy")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mib", type=int, default=256, help="the array's size (default 256)")
    parser.add_argument("--reps", type=int, default=5, help="pairs of mounts timed (default 5)")
    args = parser.parse_args(argv)
    with bench.tmpfs_scratch("zarrfs-bench-icechunk-") as root:
        plain, repo = build(root, args.size_mib)
        mnt = root / "mnt"
        mnt.mkdir()
        ratios = []
        for rep in range(args.reps):
            p = cold_cat(plain, mnt)
            c = cold_cat(repo, mnt)
            ratios.append(c / p)
            print(f"pair {rep}: plain {p:.3f} s, icechunk {c:.3f} s, ratio {c / p:.2f}", flush=True)
        print(f"median ratio (icechunk / plain): {statistics.median(ratios):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
