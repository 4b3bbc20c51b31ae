#!/usr/bin/env python3
"""Sequential read throughput of one large compressed array: through a zarrfs mount vs zarr-python 3 in memory.

Writes a float32 array with zarr-python 3 into /dev/shm (so neither side reads a disk
whose pages the kernel drops after ~30 s; see /work/shared/FACTS.md), then, for each
repetition, interleaved:

  zarr   ``zarr.open_array(STORE/bench)[...]``: decode the whole array into memory
  mount  mount the store with the zarrfs CLI (daemon mode; a fresh mount per repetition
         so neither the page cache nor zarrfs's chunk cache carries over), then read
         ``MOUNT/bench.npy`` start to end with 1 MiB reads into one reused buffer
         (``--method cat`` times ``cat FILE > /dev/null`` instead); mount and unmount
         are not timed

With ``--netcdf``, each repetition also reads the group's netCDF view
(``MOUNT/.zarrfs/netcdf/NAME.nc``: the same array big-endian after a header) on a fresh
mount, reported as a ratio against the ``.npy`` read of the same mount kind.

Before every timed run a buffer the size of the work is written and freed: memory left
free for ~2 s goes back to the host here and the first touch afterwards is up to 10x
slower (FACTS.md). Reports the median of each side in GB/s (10^9 bytes/s) and the ratio
mount/zarr. Run it with the venv's Python: ``.venv/bin/python scripts/bench.py``.
This script never imports zarrfs; it only runs its command line.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

MIB = 1 << 20
READ_SIZE = MIB  # bytes per read() call: what FACTS.md measures as the useful request size
COLS = 16384  # 16384 x 16384 float32 = 1 GiB at the default size
CHUNK = (1024, 1024)  # 4 MiB float32 chunks, the size FACTS.md quotes figures for
ROWS_PER_WRITE = 1024  # generate and write one chunk row at a time (64 MiB), never the whole array


def compressors(codec: str):
    from zarr.codecs import BloscCodec, GzipCodec, ZstdCodec

    return {
        "none": None,
        "blosc": [BloscCodec(cname="lz4", clevel=5, shuffle="shuffle")],
        "zstd": [ZstdCodec(level=1)],
        "gzip": [GzipCodec(level=1)],
    }[codec]


def build_store(store: Path, codec: str, rows: int) -> None:
    """A root group holding the float32 array ``bench`` of shape (rows, COLS)."""
    import zarr

    params = {"codec": codec, "rows": rows, "cols": COLS, "chunks": list(CHUNK), "version": 2}
    marker = store / "bench-params.json"
    if marker.exists() and json.loads(marker.read_text()) == params:
        print(f"reusing {store}")
        return
    shutil.rmtree(store, ignore_errors=True)
    t0 = time.perf_counter()
    zarr.open_group(os.fspath(store), mode="w", zarr_format=3)
    chunks = (min(CHUNK[0], rows), CHUNK[1])
    arr = zarr.create_array(store=os.fspath(store), name="bench", shape=(rows, COLS), chunks=chunks,
                            dtype="float32", compressors=compressors(codec), zarr_format=3)
    rng = np.random.default_rng(0)
    x = np.linspace(0, 8 * np.pi, COLS, dtype=np.float32)
    for r0 in range(0, rows, ROWS_PER_WRITE):
        r1 = min(rows, r0 + ROWS_PER_WRITE)
        y = np.arange(r0, r1, dtype=np.float32)[:, None] / 512
        # a smooth field plus noise, quantised to 1/16 like an instrument's readings: the low
        # mantissa bytes are zero, so it compresses about 2:1, like measured data and unlike zeros
        block = np.sin(x[None, :] + y) * 100 + rng.standard_normal((r1 - r0, COLS), dtype=np.float32)
        arr[r0:r1] = (np.round(block * 16) / 16).astype(np.float32)
    marker.write_text(json.dumps(params))
    stored = sum(f.stat().st_size for f in store.rglob("*") if f.is_file())
    print(f"wrote {store} in {time.perf_counter() - t0:.1f} s: {rows}x{COLS} float32, codec {codec}, "
          f"{stored / MIB:.0f} MiB stored for {rows * COLS * 4 / MIB:.0f} MiB of data")


def touch_memory(nbytes: int) -> None:
    """Write and free a buffer of NBYTES so the timed run does not pay first-touch costs."""
    buf = np.empty(nbytes, dtype=np.uint8)
    buf.fill(1)
    del buf


def is_mounted(path: Path) -> bool:
    target = os.path.abspath(path)
    with open("/proc/mounts") as f:
        return any(line.split()[1] == target for line in f if len(line.split()) > 1)


def mount(store: Path, mnt: Path, options: list[str]) -> None:
    cmd = [sys.executable, "-m", "zarrfs", os.fspath(store), os.fspath(mnt)]
    opts = ["log_level=warning", *options]
    cmd += ["-o", ",".join(opts)]
    r = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                       text=True, timeout=120)
    if r.returncode != 0 or not is_mounted(mnt):
        raise SystemExit(f"bench: mounting failed (exit {r.returncode}): {r.stderr.strip()}")


def unmount(mnt: Path) -> None:
    if not is_mounted(mnt):
        return
    if subprocess.run(["fusermount3", "-u", os.fspath(mnt)], capture_output=True).returncode != 0:
        subprocess.run(["fusermount3", "-uz", os.fspath(mnt)], capture_output=True)
    deadline = time.monotonic() + 10
    while is_mounted(mnt) and time.monotonic() < deadline:
        time.sleep(0.05)


def read_file(path: Path, method: str) -> tuple[float, int]:
    """Seconds to read PATH start to end, and the bytes read."""
    if method == "cat":
        size = path.stat().st_size
        t0 = time.perf_counter()
        subprocess.run(["cat", os.fspath(path)], stdout=subprocess.DEVNULL, check=True)
        return time.perf_counter() - t0, size
    buf = bytearray(READ_SIZE)
    view = memoryview(buf)
    total = 0
    fd = os.open(path, os.O_RDONLY)
    try:
        t0 = time.perf_counter()
        while True:
            n = os.readv(fd, [view])
            if n == 0:
                break
            total += n
        return time.perf_counter() - t0, total
    finally:
        os.close(fd)


def time_zarr(store: Path) -> tuple[float, int]:
    import zarr

    t0 = time.perf_counter()
    value = zarr.open_array(os.fspath(store / "bench"), mode="r")[...]
    elapsed = time.perf_counter() - t0
    nbytes = value.nbytes
    del value
    return elapsed, nbytes


def check_mount(mnt: Path, store: Path) -> None:
    """A cheap correctness check before timing: a few rows through the mount equal zarr's."""
    import zarr

    arr = zarr.open_array(os.fspath(store / "bench"), mode="r")
    mm = np.load(mnt / "bench.npy", mmap_mode="r")
    if mm.shape != arr.shape or mm.dtype != arr.dtype:
        raise SystemExit(f"bench: mount shows {mm.shape} {mm.dtype}, zarr {arr.shape} {arr.dtype}")
    for rows in (slice(0, 2), slice(arr.shape[0] // 2, arr.shape[0] // 2 + 2), slice(-2, None)):
        if not np.array_equal(np.asarray(mm[rows]), arr[rows]):
            raise SystemExit(f"bench: rows {rows} differ between the mount and zarr")
    del mm


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--size-mib", type=int, default=1024, help="array size in MiB (default 1024 = 16384x16384)")
    p.add_argument("--codec", choices=["none", "blosc", "zstd", "gzip"], default="blosc",
                   help="blosc is lz4 with byte shuffle; zstd and gzip at level 1 (default blosc)")
    p.add_argument("--reps", type=int, default=5, help="timed repetitions of each side (default 5)")
    p.add_argument("--method", choices=["read", "cat"], default="read",
                   help="read: 1 MiB read() calls into a reused buffer; cat: cat FILE > /dev/null")
    p.add_argument("--dir", type=Path, default=Path("/dev/shm"), help="where the store is written (default /dev/shm)")
    p.add_argument("--keep", action="store_true", help="keep the store afterwards (reused by the next run)")
    p.add_argument("--netcdf", action="store_true", help="also read the root group's .zarrfs/netcdf file")
    p.add_argument("-o", "--mount-options", default="", help="extra zarrfs -o options, e.g. cache_size=2G")
    args = p.parse_args(argv)

    rows = max(1, args.size_mib * MIB // (COLS * 4))
    nbytes = rows * COLS * 4
    store = args.dir / f"zarrfs-bench-{args.codec}-{rows}x{COLS}.zarr"
    free = shutil.disk_usage(args.dir).free
    if not (store / "bench-params.json").exists() and free < nbytes * 1.2:
        raise SystemExit(f"bench: {args.dir} has {free / MIB:.0f} MiB free, the store may need {nbytes / MIB:.0f}")
    build_store(store, args.codec, rows)
    options = [o for o in args.mount_options.split(",") if o]

    zarr_s, mount_s, nc_s = [], [], []
    nc_bytes = 0
    zarr_bytes = mount_bytes = 0
    workdir = Path(tempfile.mkdtemp(prefix="zarrfs-bench-"))
    try:
        for rep in range(args.reps):
            touch_memory(nbytes)
            t, zarr_bytes = time_zarr(store)
            zarr_s.append(t)

            mnt = workdir / f"mnt{rep}"
            mnt.mkdir()
            try:
                mount(store, mnt, options)
                if rep == 0:
                    check_mount(mnt, store)
                touch_memory(nbytes)
                t, mount_bytes = read_file(mnt / "bench.npy", args.method)
                mount_s.append(t)
            finally:
                unmount(mnt)
            if args.netcdf:
                mnt = workdir / f"mnt{rep}-nc"
                mnt.mkdir()
                try:
                    mount(store, mnt, options)
                    touch_memory(nbytes)
                    t, nc_bytes = read_file(mnt / ".zarrfs" / "netcdf" / (store.name[:-len(".zarr")] + ".nc"),
                                            args.method)
                    nc_s.append(t)
                finally:
                    unmount(mnt)
                print(f"rep {rep + 1}/{args.reps}: netcdf {nc_bytes / nc_s[-1] / 1e9:.2f} GB/s", flush=True)
            print(f"rep {rep + 1}/{args.reps}: zarr {zarr_bytes / zarr_s[-1] / 1e9:.2f} GB/s, "
                  f"mount {mount_bytes / mount_s[-1] / 1e9:.2f} GB/s", flush=True)
    finally:
        for m in workdir.glob("mnt*"):
            unmount(m)
        shutil.rmtree(workdir, ignore_errors=True)
        if not args.keep:
            shutil.rmtree(store, ignore_errors=True)

    zarr_gbs = zarr_bytes / statistics.median(zarr_s) / 1e9
    mount_gbs = mount_bytes / statistics.median(mount_s) / 1e9
    print(f"\narray {rows}x{COLS} float32 ({nbytes / MIB:.0f} MiB), codec {args.codec}, "
          f"{args.reps} reps, median; mount read by {args.method}")
    print(f"zarr-python 3 into memory : {zarr_gbs:6.2f} GB/s")
    print(f"zarrfs mount, sequential  : {mount_gbs:6.2f} GB/s")
    print(f"ratio mount/zarr          : {mount_gbs / zarr_gbs:6.2f}")
    if nc_s:
        nc_gbs = nc_bytes / statistics.median(nc_s) / 1e9
        print(f"zarrfs netCDF view        : {nc_gbs:6.2f} GB/s")
        print(f"ratio netcdf/npy          : {nc_gbs / mount_gbs:6.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
