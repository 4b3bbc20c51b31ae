#!/usr/bin/env python3
"""Reads of a v3 sharded array: through a zarrfs mount vs zarr-python 3, in one run.

Writes a float32 array with zarr-python 3 (shards of 4096x4096 = 64 MiB holding inner
chunks of 256x256, zstd inside the shard) into /dev/shm, then, on a fresh mount per
repetition (so no cache carries over), interleaved with zarr-python 3:

  random   N reads of 4 KiB at random offsets of ``MOUNT/bench.npy`` (os.pread, with
           POSIX_FADV_RANDOM so the kernel reads no more than the pages asked for), against
           zarr reading the same elements (``arr[row, c0:c1]``); reports the median
           latency of each side and the store bytes zarrfs fetched per read (stats.json)
  seq      the whole file start to end in 1 MiB reads, against ``arr[...]``; GB/s

Reports medians and the ratios mount/zarr (latency: zarr/mount, so above 1 is faster).
Run with the venv's Python: ``.venv/bin/python benchmarks/bench_shards.py``. It never imports
zarrfs; mounting and timing helpers come from benchmarks/bench.py.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import bench  # (mount_zarrfs, unmount, touch_memory)

MIB = 1 << 20
SHARD = (4096, 4096)
INNER = (256, 256)
READ = 4096


def build_store(store: Path, side: int) -> None:
    import zarr
    from zarr.codecs import ZstdCodec

    params = {"side": side, "shard": SHARD, "inner": INNER}
    marker = store / "bench-params.json"
    if marker.exists() and json.loads(marker.read_text()) == params:
        print(f"reusing {store}")
        return
    shutil.rmtree(store, ignore_errors=True)
    zarr.open_group(os.fspath(store), mode="w", zarr_format=3)
    arr = zarr.create_array(
        store=os.fspath(store),
        name="bench",
        shape=(side, side),
        dtype="float32",
        shards=SHARD,
        chunks=INNER,
        compressors=[ZstdCodec(level=1)],
        zarr_format=3,
    )
    rng = np.random.default_rng(0)
    for r0 in range(0, side, SHARD[0]):
        r1 = min(side, r0 + SHARD[0])
        block = np.sin(np.arange(side, dtype=np.float32)[None, :] / 300 + np.arange(r0, r1)[:, None] / 500)
        block = block * 100 + rng.standard_normal((r1 - r0, side), dtype=np.float32)
        arr[r0:r1] = (np.round(block * 16) / 16).astype(np.float32)
    marker.write_text(json.dumps(params))
    stored = sum(f.stat().st_size for f in store.rglob("*") if f.is_file())
    print(f"wrote {store}: {side}x{side} float32, shards {SHARD}, inner chunks {INNER}, {stored / MIB:.0f} MiB stored")


def random_offsets(n: int, side: int, header: int, seed: int) -> list[int]:
    rng = np.random.default_rng(seed)
    data = side * side * 4
    return [header + int(o) // 4 * 4 for o in rng.integers(0, data - READ, n)]


def time_mount_random(path: Path, offsets: list[int]) -> list[float]:
    fd = os.open(path, os.O_RDONLY)
    # No kernel read-ahead: each pread asks the mount for its own pages only.
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
    try:
        out = []
        for off in offsets:
            t0 = time.perf_counter()
            os.pread(fd, READ, off)
            out.append(time.perf_counter() - t0)
        return out
    finally:
        os.close(fd)


def time_zarr_random(store: Path, offsets: list[int], header: int, side: int) -> list[float]:
    import zarr

    arr = zarr.open_array(os.fspath(store / "bench"), mode="r")
    out = []
    for off in offsets:
        first = (off - header) // 4
        row, col = divmod(first, side)
        t0 = time.perf_counter()
        arr[row, col : min(side, col + READ // 4)]  # what one 4 KiB read of the row holds
        out.append(time.perf_counter() - t0)
    return out


def read_whole(path: Path) -> tuple[float, int]:
    """Seconds and bytes for reading PATH start to end in 1 MiB reads."""
    n = 0
    t0 = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        while chunk := f.read(MIB):
            n += len(chunk)
    return time.perf_counter() - t0, n


def time_zarr_whole(store: Path) -> tuple[float, int]:
    """Seconds and bytes for zarr-python 3 reading the whole array (`arr[...]`)."""
    import zarr

    arr = zarr.open_array(os.fspath(store / "bench"), mode="r")
    t0 = time.perf_counter()
    n = arr[...].nbytes
    return time.perf_counter() - t0, n


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--side", type=int, default=8192, help="array side (default 8192: 256 MiB of float32)")
    p.add_argument("--reads", type=int, default=200, help="random reads per repetition (default 200)")
    p.add_argument("--reps", type=int, default=3, help="repetitions of each side (default 3)")
    p.add_argument("--dir", type=Path, default=Path("/dev/shm"))
    p.add_argument("--keep", action="store_true", help="keep the store afterwards")
    args = p.parse_args(argv)

    store = args.dir / f"zarrfs-bench-shards-{args.side}.zarr"
    build_store(store, args.side)
    nbytes = args.side * args.side * 4
    workdir = Path(tempfile.mkdtemp(prefix="zarrfs-bench-shards-"))
    rand = {"mount": [], "zarr": []}
    seq = {"mount": [], "zarr": []}
    fetched = []
    try:
        for rep in range(args.reps):
            mnt = workdir / f"mnt{rep}"
            mnt.mkdir()
            try:
                bench.mount_zarrfs(store, mnt, [], who="bench_shards")
                npy = mnt / "bench.npy"
                header = npy.stat().st_size - nbytes
                offsets = random_offsets(args.reads, args.side, header, rep)
                rand["mount"] += time_mount_random(npy, offsets)
                stats = json.loads((mnt / ".zarrfs" / "stats.json").read_text())
                fetched.append(stats["chunk_bytes"] / args.reads)
                rand["zarr"] += time_zarr_random(store, offsets, header, args.side)
            finally:
                bench.unmount(mnt)
            mnt = workdir / f"seq{rep}"
            mnt.mkdir()
            try:
                bench.mount_zarrfs(store, mnt, [], who="bench_shards")
                bench.touch_memory(nbytes)
                t, n = read_whole(mnt / "bench.npy")
                seq["mount"].append(n / t / 1e9)
            finally:
                bench.unmount(mnt)
            bench.touch_memory(nbytes)
            t, n = time_zarr_whole(store)
            seq["zarr"].append(n / t / 1e9)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
        if not args.keep:
            shutil.rmtree(store, ignore_errors=True)

    def lat(xs: list[float]) -> str:
        return (
            f"median {statistics.median(xs) * 1e3:.2f} ms, mean {statistics.mean(xs) * 1e3:.2f} ms, "
            f"max {max(xs) * 1e3:.1f} ms"
        )

    m_seq, z_seq = statistics.median(seq["mount"]), statistics.median(seq["zarr"])
    shard_mib = SHARD[0] * SHARD[1] * 4 / MIB
    print(f"random {READ} B reads, cold mount, {args.reads} per repetition:")
    print(
        f"  zarrfs {lat(rand['mount'])}; fetched {statistics.median(fetched) / 1024:.0f} KiB per read "
        f"from shards of {shard_mib:.0f} MiB"
    )
    print(f"  zarr   {lat(rand['zarr'])}")
    print(f"  mean latency zarr/zarrfs {statistics.mean(rand['zarr']) / statistics.mean(rand['mount']):.2f}")
    print(f"sequential, cold mount: zarrfs {m_seq:.2f} GB/s, zarr {z_seq:.2f} GB/s (zarrfs/zarr {m_seq / z_seq:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
