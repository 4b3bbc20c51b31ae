#!/usr/bin/env python3
"""A cold read of an OME-Zarr image's `.zarrfs/ome-tiff/IMAGE.ome.tif` against `cat` of its level 0's `.npy`.

Writes one 5-D (t, c, z, y, x) uint16 NGFF 0.4 image into /dev/shm with zarr-python: level 0
of about --size-mib MiB in 512 x 512 chunks (zarr-python's default compressor), and levels 1
and 2 halving y and x. Then, in interleaved pairs, each read is made on a fresh mount (no cache
carries over): `cat` of level 0's `s0.npy`, and `cat` of `image.ome.tif` (every level, so about
1.33 times the bytes). Prints each pair's times, throughputs and their ratio (OME-TIFF MB/s over
.npy MB/s), the median ratio, and the daemon's peak RSS (VmHWM) during the OME-TIFF reads minus
cache_size.

Run as root with the venv's Python: ``.venv/bin/python benchmarks/bench_ome_tiff.py``; for the
memory bound of a 2 GiB pyramid: ``--size-mib 1536 --reps 1``. It never imports zarrfs; mounting
and timing helpers come from benchmarks/bench.py.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import threading
from pathlib import Path

import numpy as np

import bench  # (tmpfs_scratch, mounted, cat, daemon_pid, vm_hwm_bytes)

CHUNK = 512
T, C, Z = 2, 2, 8
LEVELS = 3


def build(root: Path, size_mib: int) -> tuple[Path, int]:
    """The image store (level 0 of about SIZE_MIB MiB) and level 0's size in bytes."""
    import zarr

    side = max(CHUNK, round(math.sqrt(size_mib * (1 << 20) / (2 * T * C * Z)) / CHUNK) * CHUNK)
    store = root / "image.zarr"
    group = zarr.open_group(os.fspath(store), mode="w", zarr_format=2)
    rng = np.random.default_rng(0)
    datasets = []
    for level in range(LEVELS):
        f = 2**level
        arr = group.create_array(
            f"s{level}", shape=(T, C, Z, side // f, side // f), chunks=(1, 1, 1, CHUNK, CHUNK), dtype="u2"
        )
        for t in range(T):
            for c in range(C):
                for z in range(Z):  # a plane at a time: noise over a ramp, compressible like an image
                    ramp = np.add.outer(np.arange(side // f), np.arange(side // f)).astype("u2")
                    arr[t, c, z] = ramp + rng.integers(0, 64, ramp.shape, dtype="u2")
        scale = [1.0, 1.0, 1.0, 0.5 * f, 0.5 * f]
        datasets.append({"path": f"s{level}", "coordinateTransformations": [{"type": "scale", "scale": scale}]})
    axes = [{"name": "t", "type": "time"}, {"name": "c", "type": "channel"}] + [
        {"name": a, "type": "space", "unit": "micrometer"} for a in "zyx"
    ]
    group.attrs["multiscales"] = [{"version": "0.4", "name": "image", "axes": axes, "datasets": datasets}]
    nbytes = T * C * Z * side * side * 2
    print(f"image: {T}x{C}x{Z}x{side}x{side} uint16, level 0 {nbytes / (1 << 20):.0f} MiB, {LEVELS} levels")
    return store, nbytes


def cold(source: Path, mnt: Path, path: str, cache_mib: int) -> tuple[float, int, int]:
    """(seconds for `cat` of PATH, its size, the daemon's peak RSS) on a fresh mount of SOURCE."""
    with bench.mounted(source, mnt, [f"cache_size={cache_mib}M"], "bench_ome_tiff"):
        pid = bench.daemon_pid(mnt)
        size = (mnt / path).stat().st_size
        peak = [0]
        done = threading.Event()

        def watch() -> None:  # VmHWM is the peak already; polled in case the daemon ends first
            while not done.wait(0.2):
                peak[0] = max(peak[0], bench.vm_hwm_bytes(pid))

        watcher = threading.Thread(target=watch)
        watcher.start()
        try:
            seconds = bench.cat(mnt / path)
        finally:
            done.set()
            watcher.join()
        return seconds, size, max(peak[0], bench.vm_hwm_bytes(pid))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mib", type=int, default=256, help="level 0's size (default 256)")
    parser.add_argument("--reps", type=int, default=5, help="pairs of mounts timed (default 5)")
    parser.add_argument("--cache-mib", type=int, default=512, help="cache_size of the mounts (default 512)")
    args = parser.parse_args(argv)
    with bench.tmpfs_scratch("zarrfs-bench-ome-") as root:
        store, _ = build(root, args.size_mib)
        mnt = root / "mnt"
        mnt.mkdir()
        ratios, peaks = [], []
        for rep in range(args.reps):
            tn, sn, _ = cold(store, mnt, "s0.npy", args.cache_mib)
            tt, st, peak = cold(store, mnt, ".zarrfs/ome-tiff/image.ome.tif", args.cache_mib)
            ratio = (st / tt) / (sn / tn)
            ratios.append(ratio)
            peaks.append(peak)
            print(
                f"pair {rep}: s0.npy {sn >> 20} MiB in {tn:.3f} s ({sn / tn / 1e6:.0f} MB/s), "
                f"image.ome.tif {st >> 20} MiB in {tt:.3f} s ({st / tt / 1e6:.0f} MB/s), ratio {ratio:.2f}, "
                f"daemon peak {peak >> 20} MiB ({(peak >> 20) - args.cache_mib:+d} over cache_size)",
                flush=True,
            )
        print(
            f"median throughput ratio (ome.tif / npy): {statistics.median(ratios):.2f} "
            f"({min(ratios):.2f}-{max(ratios):.2f}); peak RSS over cache_size: "
            f"{(max(peaks) >> 20) - args.cache_mib:+d} MiB"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
