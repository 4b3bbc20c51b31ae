#!/usr/bin/env python3
"""Memory and throughput of a large copy into a writable zarrfs mount.

Writes a float32 NPY file of --size GiB (default 2) to --dir (default /dev/shm), makes an
empty Zarr store there, mounts it with ``zarrfs -o writable`` (as a separate process,
found afterwards with pgrep on the mountpoint), copies the file in with ``cp`` and samples
the daemon's resident memory (VmRSS every few ms, VmHWM from /proc/PID/status at the end).
Prints peak RSS beside file size and throughput. It never imports zarrfs: the daemon is
the command line, as a user runs it.

    .venv/bin/python benchmarks/bench_write.py --size 1
    .venv/bin/python benchmarks/bench_write.py --size 2 --format 2 --codec none --verify
    .venv/bin/python benchmarks/bench_write.py --size 0.0625 --codec none --chunks 256:512 --versus-zarr 5

With --versus-zarr N it then times N more copies beside zarr-python (3.x, the test extra)
writing the same array, chunks and codec into the same store, in turn, and prints each side's
best and median and the ratio (zarr-python's seconds / cp's: above 1, cp is faster).

Mind the RAM: /dev/shm holds the source file and the store (the store's size depends on
the codec; the default values compress a little), so --size 2 needs about 5 GiB free.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

SAMPLE_INTERVAL_S = 0.005  # RSS is sampled this often during the copy (VmHWM catches what falls between)
MOUNT_TIMEOUT_S = 30.0


def make_source(path: Path, nbytes: int) -> tuple[int, ...]:
    """A float32 NPY file of about NBYTES: a 2-d array 4096 columns wide, values a smooth ramp with noise."""
    cols = 4096
    rows = max(1, nbytes // (4 * cols))
    out = np.lib.format.open_memmap(path, mode="w+", dtype="<f4", shape=(rows, cols))
    rng = np.random.default_rng(0)
    step = max(1, (64 << 20) // (4 * cols))
    for a in range(0, rows, step):
        b = min(rows, a + step)
        base = np.arange(a, b, dtype=np.float32)[:, None] * 0.001 + np.arange(cols, dtype=np.float32)[None, :]
        out[a:b] = base + rng.standard_normal((b - a, cols), dtype=np.float32)
    out.flush()
    del out
    return rows, cols


def make_store(root: Path, zarr_format: int) -> None:
    """An empty Zarr group, written by hand (no zarr import needed)."""
    root.mkdir(parents=True)
    if zarr_format == 2:
        (root / ".zgroup").write_text(json.dumps({"zarr_format": 2}))
    else:
        (root / "zarr.json").write_text(json.dumps({"zarr_format": 3, "node_type": "group", "attributes": {}}))


def is_mounted(mnt: Path) -> bool:
    target = os.path.abspath(mnt)
    with open("/proc/mounts") as f:
        return any(line.split()[1] == target for line in f if len(line.split()) > 1)


def wait_until(pred, timeout_s: float, interval_s: float = 0.02) -> bool:
    deadline = time.monotonic() + timeout_s
    while not pred():
        if time.monotonic() > deadline:
            return False
        time.sleep(interval_s)
    return True


def daemon_pid(mnt: Path) -> int:
    r = subprocess.run(["pgrep", "-f", f"zarrfs .*{os.path.abspath(mnt)}"], capture_output=True, text=True)
    pids = [int(p) for p in r.stdout.split() if int(p) != os.getpid()]
    if len(pids) != 1:
        raise SystemExit(f"expected one zarrfs daemon serving {mnt}, pgrep found {pids}")
    return pids[0]


def status_kib(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


class RssSampler(threading.Thread):
    """Samples VmRSS of PID until stopped; keeps the largest value."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid, self.peak_kib, self.samples = pid, 0, 0
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.is_set():
            try:
                self.peak_kib = max(self.peak_kib, status_kib(self.pid, "VmRSS"))
                self.samples += 1
            except (OSError, KeyError):
                return
            time.sleep(SAMPLE_INTERVAL_S)

    def stop(self) -> None:
        self._stop_event.set()
        self.join()


def du_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def versus_zarr(src: Path, root: Path, mnt: Path, args: argparse.Namespace, chunks: list[int]) -> str:
    """`cp` of SRC into the mount and zarr-python writing the same array into the store, in
    turn, --versus-zarr times each: one line with both sides' runs and the ratio of the bests."""
    import numcodecs
    import zarr
    from zarr.codecs import ZstdCodec

    codec = args.codec or "none"
    if codec != "none" and not codec.startswith("zstd"):
        raise SystemExit("--versus-zarr: give --codec none or zstd[:LEVEL]")
    level = int(codec.partition(":")[2] or 0) if codec != "none" else 0
    compressors: list | None = None
    if codec != "none":  # v2 arrays take numcodecs' codec, v3 zarr's own
        compressors = [numcodecs.Zstd(level=level) if args.format == 2 else ZstdCodec(level=level)]
    x = np.load(src, mmap_mode="r")
    ours, peer = [], []
    for run in range(args.versus_zarr):
        t0 = time.perf_counter()
        subprocess.run(["cp", os.fspath(src), os.fspath(mnt / f"w{run}.npy")], check=True)
        ours.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        z = zarr.create_array(
            store=os.fspath(root / f"p{run}"),
            shape=x.shape,
            chunks=tuple(chunks),
            dtype=x.dtype,
            compressors=compressors,
            zarr_format=args.format,
        )
        z[:] = x
        peer.append(time.perf_counter() - t0)

    def spread(runs: list[float]) -> str:
        return f"best {min(runs):.3f} s, median {sorted(runs)[len(runs) // 2]:.3f} s"

    return (
        f"versus zarr-python {zarr.__version__} ({args.versus_zarr} runs each, in turn): "
        f"cp {spread(ours)}; zarr-python {spread(peer)}; ratio of bests {min(peer) / min(ours):.2f}"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=float, default=2.0, help="GiB of float32 to copy (default 2)")
    ap.add_argument("--dir", default="/dev/shm", help="where the source file and the store go (default /dev/shm)")
    ap.add_argument("--format", type=int, choices=(2, 3), default=3, help="Zarr format of the store (default 3)")
    ap.add_argument("--codec", default=None, help="zarrfs codec= option (default: the format's own)")
    ap.add_argument("--chunks", default=None, help="zarrfs chunks= option, N:N (default: zarrfs's choice)")
    ap.add_argument("--cache-size", default=None, help="zarrfs cache_size= option")
    ap.add_argument("--verify", action="store_true", help="read the array back through the mount and compare")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    ap.add_argument("--versus-zarr", type=int, default=0, metavar="N", help="N more copies beside zarr-python's write")
    args = ap.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="zarrfs-bench-write-", dir=args.dir))
    src, root, mnt, log = work / "src.npy", work / "store.zarr", work / "mnt", work / "zarrfs.log"
    mnt.mkdir()
    try:
        t0 = time.perf_counter()
        shape = make_source(src, int(args.size * (1 << 30)))
        size = src.stat().st_size
        print(f"source: {src} {shape} float32, {size / (1 << 20):.0f} MiB (made in {time.perf_counter() - t0:.1f}s)")
        make_store(root, args.format)
        opts = ["writable", f"log_file={log}", "log_level=info"]
        opts += [f"codec={args.codec}"] if args.codec else []
        opts += [f"chunks={args.chunks}"] if args.chunks else []
        opts += [f"cache_size={args.cache_size}"] if args.cache_size else []
        cmd = [sys.executable, "-m", "zarrfs", os.fspath(root), os.fspath(mnt), "-o", ",".join(opts)]
        subprocess.run(cmd, check=True, timeout=MOUNT_TIMEOUT_S)
        if not wait_until(lambda: is_mounted(mnt), 10):
            raise SystemExit(f"{mnt} is not mounted")
        pid = daemon_pid(mnt)
        rss_before = status_kib(pid, "VmRSS")
        sampler = RssSampler(pid)
        sampler.start()
        t0 = time.perf_counter()
        subprocess.run(["cp", os.fspath(src), os.fspath(mnt / "a.npy")], check=True)
        seconds = time.perf_counter() - t0
        sampler.stop()
        hwm = status_kib(pid, "VmHWM")
        meta = json.loads((root / "a" / (".zarray" if args.format == 2 else "zarr.json")).read_text())
        chunks = meta["chunks"] if args.format == 2 else meta["chunk_grid"]["configuration"]["chunk_shape"]
        stored = du_bytes(root)
        ok = None
        if args.verify:
            a = np.load(mnt / "a.npy", mmap_mode="r")
            b = np.load(src, mmap_mode="r")
            step = max(1, (256 << 20) // (4 * shape[1]))
            ok = all(np.array_equal(a[i : i + step], b[i : i + step]) for i in range(0, shape[0], step))
            del a, b
        versus = versus_zarr(src, root, mnt, args, chunks) if args.versus_zarr else None
        subprocess.run(["fusermount3", "-u", os.fspath(mnt)], check=True)
        wait_until(lambda: not os.path.exists(f"/proc/{pid}"), 30)

        mib = 1 << 20
        print(f"zarr v{args.format}, chunks {chunks}, codec {args.codec or 'default'}, stored {stored / mib:.0f} MiB")
        print(
            f"{'file MiB':>9} {'cp s':>7} {'MiB/s':>7} {'RSS before':>11} {'peak RSS':>9} {'VmHWM':>9} "
            f"{'peak-before':>12}"
        )
        print(
            f"{size / mib:9.0f} {seconds:7.2f} {size / mib / seconds:7.0f} {rss_before / 1024:9.0f}Mi "
            f"{sampler.peak_kib / 1024:7.0f}Mi {hwm / 1024:7.0f}Mi {(hwm - rss_before) / 1024:10.0f}Mi"
        )
        print(
            f"({sampler.samples} RSS samples)"
            + ("" if ok is None else f"; read back through the mount: {'identical' if ok else 'DIFFERENT'}")
        )
        if versus is not None:
            print(versus)
        return 0 if ok in (None, True) else 1
    finally:
        if is_mounted(mnt):
            subprocess.run(["fusermount3", "-u", os.fspath(mnt)])
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
