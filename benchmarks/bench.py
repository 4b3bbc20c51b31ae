#!/usr/bin/env python3
"""Read speed of zarrfs against its peers in one run: an empty pyfuse3 server, zarr-python 3, tmpfs.

Writes float32 arrays (16384 columns, ``--size-mib`` of data) with zarr-python 3 into
/dev/shm (so both sides read memory: the kernel drops pages of a disk file unused for a while),
then for each of ``--reps`` pairs measures every row of the table below, each zarrfs read
on a fresh mount (neither the page cache nor the chunk cache carries over), and prints the
median of the per-pair ratios with their spread (min-max), and the seconds of both sides of
each ratio (the numerator is the peer's, or zarrfs's own reference read; rand4k: 20,000 reads).

  ceiling  cold ``cat`` of the uncompressed ``bench.npy`` / cat of a file of the same size
           from ``benchmarks/empty_server.py`` (same mount options and read-ahead)
  bound    cold cat of the same ``.npy`` from ``empty_server.py --array`` (a server that only
           gathers each read from the chunk files: the least work serving it takes) / cat from
           the empty server: the most the ceiling row can reach on this machine
  gather   the gathering server's cold cat / zarrfs's (how near zarrfs is to that least work)
  gnone, gblosc, gzstd
           zarr-python at its best / a cold cat from the gathering server of that row's store
           (compressed chunks decoded a row of chunks ahead by a thread per core, into reused
           buffers): what the none, blosc and zstd rows reach with that least work
  none, blosc, zstd, zstd2 (v2), gzip
           cold ``cat`` / zarr-python at its best: its own process reading the whole array
           into a reused, touched output (``get_basic_selection(..., out=)``) after an
           untimed warm-up read; only that read is timed
  columns  chunks (rows x 64), uncompressed, cold cat / the ceiling row's zarrfs figure
  fview    cold cat of ``.zarrfs/npy-f/bench.npy`` / the ``.npy`` cold cat
  rand4k   20,000 random 4 KiB O_DIRECT preads of cached chunks, reads/s / the empty server's:
           the same preads are made once untimed first (a cold cat reads uncompressed chunk
           files directly and leaves no chunk in the cache)
  warm     a second cat of the same ``.npy`` / the first cat of a tmpfs file of its size, just
           written: on both sides the second time the pages are touched. (The first re-read of
           pages moves them to the kernel's active list, a quarter of its time in a profile of a
           warm cat: a third cat of either is faster than a second.)
  boundwarm
           a second cat of the empty server's file / the first cat of the tmpfs file: the warm
           row's most (no read reaches any server then: the kernel's page cache of a FUSE file)
  two      two uncompressed arrays cat at once, aggregate / two readers of the empty server
  bound2   the same two arrays from the gathering server / two readers of the empty server: the
           most the two row can reach
  netcdf   cold cat of the root group's ``.zarrfs/netcdf/NAME.nc`` (the same array
           big-endian after a header) / the ``.npy`` cold cat
  memory   the daemons' peak RSS (VmHWM) over the run minus cache_size, MiB (no ratio)

The column "least" repeats, beside a target row, the median of the row that bounds it when both
ran (ceiling: bound, none: gnone, blosc: gblosc, zstd: gzstd, warm: boundwarm, two: bound2):
what a server doing nothing but that read's least work reaches on this machine. A last line
names the rows during which the machine stalled (a side's slowest read over STALL_SPREAD times
its fastest): their medians may be off.

Before every timed read a buffer of the read's size is written and freed: memory left free
for ~2 s goes back to the host and the first touch afterwards is up to 10x slower.
Run it as root with the venv's Python: ``.venv/bin/python benchmarks/bench.py --size-mib 256``.
This script never imports zarrfs; it runs its command line (``python -m zarrfs``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import mmap
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np

MIB = 1 << 20
COLS = 16384  # 16384 x 16384 float32 = 1 GiB at the default size
CHUNK = (1024, 1024)  # 4 MiB float32 chunks, the size the README's figures are for
COLUMN_CHUNK_COLS = 64  # the columns row: a 1 MiB C-order read touches 256 chunks
ROWS_PER_WRITE = 1024  # generate and write one chunk row at a time, never the whole array
RAND_READS = 20_000
RAND_SIZE = 4096
HERE = Path(__file__).resolve().parent
ROWS = (
    "ceiling",
    "bound",
    "gather",
    "none",
    "blosc",
    "zstd",
    "zstd2",
    "gzip",
    "gnone",
    "gblosc",
    "gzstd",
    "columns",
    "fview",
    "rand4k",
    "warm",
    "boundwarm",
    "two",
    "bound2",
    "netcdf",
)
GATHERED = {"gnone": "none", "gblosc": "blosc", "gzstd": "zstd"}  # row: the row it bounds
# A row whose reads on one side took over this many times their fastest ran while the machine
# stalled (these VMs stop for seconds at times); the table names them below it.
STALL_SPREAD = 2.0
# target row: the row of the least work that reading takes (the table's "least" column)
LEAST = {"ceiling": "bound", "two": "bound2", "warm": "boundwarm", **{of: row for row, of in GATHERED.items()}}
TARGETS = {
    "ceiling": ">= 0.80",
    "bound": "-",
    "boundwarm": "-",
    "gather": "-",
    "bound2": "-",
    "gnone": "-",
    "gblosc": "-",
    "gzstd": "-",
    "none": ">= 0.75",
    "blosc": ">= 0.75",
    "zstd": ">= 1.0",
    "zstd2": ">= 1.0",
    "gzip": ">= 1.3",
    "columns": ">= 0.5",
    "fview": ">= 0.7",
    "rand4k": ">= 0.80",
    "warm": ">= 0.90",
    "two": ">= 0.75",
    "netcdf": "-",
}
# Store kind per row: (codec, zarr_format, chunk columns or None for CHUNK)
STORES = {
    "none": ("none", 3, None),
    "blosc": ("blosc", 3, None),
    "zstd": ("zstd", 3, None),
    "zstd2": ("zstd", 2, None),
    "gzip": ("gzip", 3, None),
    "columns": ("none", 3, COLUMN_CHUNK_COLS),
}


def compressors(codec: str, zarr_format: int):
    if zarr_format == 2:
        import numcodecs

        return {"none": None, "zstd": [numcodecs.Zstd(level=1)]}[codec]
    from zarr.codecs import BloscCodec, GzipCodec, ZstdCodec

    return {
        "none": None,
        "blosc": [BloscCodec(cname="lz4", clevel=5, shuffle="shuffle")],
        "zstd": [ZstdCodec(level=1)],
        "gzip": [GzipCodec(level=1)],
    }[codec]


def build_store(store: Path, codec: str, zarr_format: int, rows: int, chunk_cols: int | None, copies: int = 1) -> None:
    """A root group holding float32 arrays ``bench`` (and ``bench2``...: copies) of shape (rows, COLS)."""
    import zarr

    chunks = (rows, chunk_cols) if chunk_cols else (min(CHUNK[0], rows), CHUNK[1])
    params = {
        "codec": codec,
        "rows": rows,
        "cols": COLS,
        "chunks": list(chunks),
        "version": 3,
        "zarr_format": zarr_format,
        "copies": copies,
    }
    marker = store / "bench-params.json"
    if marker.exists() and json.loads(marker.read_text()) == params:
        return
    shutil.rmtree(store, ignore_errors=True)
    t0 = time.perf_counter()
    zarr.open_group(os.fspath(store), mode="w", zarr_format=zarr_format)
    arr = zarr.create_array(
        store=os.fspath(store),
        name="bench",
        shape=(rows, COLS),
        chunks=chunks,
        dtype="float32",
        compressors=compressors(codec, zarr_format),
        zarr_format=zarr_format,
    )
    rng = np.random.default_rng(0)
    x = np.linspace(0, 8 * np.pi, COLS, dtype=np.float32)
    step = max(ROWS_PER_WRITE, chunks[0])
    for r0 in range(0, rows, step):
        r1 = min(rows, r0 + step)
        y = np.arange(r0, r1, dtype=np.float32)[:, None] / 512
        # a smooth field plus noise, quantised to 1/16 like an instrument's readings: the low
        # mantissa bytes are zero, so it compresses about 2:1, like measured data and unlike zeros
        block = np.sin(x[None, :] + y) * 100 + rng.standard_normal((r1 - r0, COLS), dtype=np.float32)
        arr[r0:r1] = (np.round(block * 16) / 16).astype(np.float32)
    for i in range(2, copies + 1):
        shutil.copytree(store / "bench", store / f"bench{i}")
    marker.write_text(json.dumps(params))
    print(f"wrote {store.name} in {time.perf_counter() - t0:.1f} s", flush=True)


def touch_memory(nbytes: int) -> None:
    """Write and free a buffer of NBYTES so the timed run does not pay first-touch costs."""
    buf = np.empty(nbytes, dtype=np.uint8)
    buf.fill(1)
    del buf


def tmpfs_dir() -> Path:
    """/dev/shm, checked to be a tmpfs: the warm row's reference. (Not the work directory: /tmp
    is a disk file system on these machines, whose page cache keeps large folios that a cat
    reads 2x faster than tmpfs's pages or a FUSE file's.)"""
    with open("/proc/mounts") as f:
        if any(line.split()[1:3] == ["/dev/shm", "tmpfs"] for line in f):
            return Path("/dev/shm")
    raise SystemExit("bench: the warm rows need /dev/shm to be a tmpfs")


def is_mounted(path: Path) -> bool:
    target = os.path.abspath(path)
    with open("/proc/mounts") as f:
        return any(line.split()[1] == target for line in f if len(line.split()) > 1)


def wait_mounted(mnt: Path, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + 30
    while not is_mounted(mnt):
        if time.monotonic() > deadline or (proc is not None and proc.poll() is not None):
            raise SystemExit(f"bench: {mnt} did not mount")
        time.sleep(0.02)


def unmount(mnt: Path) -> None:
    if not is_mounted(mnt):
        return
    if subprocess.run(["fusermount3", "-u", os.fspath(mnt)], capture_output=True).returncode != 0:
        subprocess.run(["fusermount3", "-uz", os.fspath(mnt)], capture_output=True)
    deadline = time.monotonic() + 10
    while is_mounted(mnt) and time.monotonic() < deadline:
        time.sleep(0.05)


def mount_zarrfs(source: Path, mnt: Path, options: list[str], who: str = "bench") -> None:
    """SOURCE mounted at MNT by zarrfs's command line, with -o log_level=warning and OPTIONS; a
    SystemExit naming WHO (the script) when it does not mount."""
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "zarrfs",
            os.fspath(source),
            os.fspath(mnt),
            "-o",
            ",".join(["log_level=warning", *options]),
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        timeout=120,
    )
    if r.returncode != 0 or not is_mounted(mnt):
        raise SystemExit(f"{who}: mounting {source} failed (exit {r.returncode}): {r.stderr.strip()}")


@contextlib.contextmanager
def mounted(source: Path, mnt: Path, options: list[str], who: str = "bench") -> Iterator[Path]:
    """A fresh zarrfs mount of SOURCE at MNT (`mount_zarrfs`), unmounted at the end however it ends."""
    mount_zarrfs(source, mnt, options, who)
    try:
        yield mnt
    finally:
        unmount(mnt)


@contextlib.contextmanager
def tmpfs_scratch(prefix: str) -> Iterator[Path]:
    """A new directory in /dev/shm (`tmpfs_dir`) for a run's stores and mount points, removed at the end."""
    root = Path(tempfile.mkdtemp(prefix=prefix, dir=tmpfs_dir()))
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def daemon_pid(mnt: Path) -> int | None:
    """The zarrfs daemon serving MNT (its command line names the mount point)."""
    target = os.fspath(mnt).encode()
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                args = (d / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if target in args and any(a.endswith(b"zarrfs") for a in args):
                return int(d.name)
    return None


def cpu_seconds(pid: int) -> float:
    """User and system CPU of process PID so far, all its threads."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def vm_hwm_bytes(pid: int | None) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except (OSError, TypeError):
        pass
    return 0


class Bench:
    def __init__(self, args: argparse.Namespace, workdir: Path) -> None:
        self.args = args
        self.workdir = workdir
        self.n = 0
        self.peak_rss = 0
        self.empty_cpu_s = 0.0
        self.options = [o for o in args.mount_options.split(",") if o]

    def _mnt(self) -> Path:
        self.n += 1
        mnt = self.workdir / f"mnt{self.n}"
        mnt.mkdir()
        return mnt

    def zarrfs(self, store: Path, timed):
        """TIMED(mount point) on a fresh zarrfs mount of STORE; records the daemon's peak RSS."""
        mnt = self._mnt()
        mount_zarrfs(store, mnt, [f"cache_size={self.args.cache_mib}M", *self.options])
        pid = daemon_pid(mnt)
        try:
            return timed(mnt)
        finally:
            self.peak_rss = max(self.peak_rss, vm_hwm_bytes(pid))
            unmount(mnt)

    def empty(self, sizes: list[int], timed, arrays: tuple[Path, ...] = ()):
        """TIMED(mount point) on a fresh mount of the empty server with files f0.. of SIZES, or,
        given ARRAYS, with their .npy gathered from chunk files; the server's CPU seconds over
        TIMED go to `empty_cpu_s`."""
        mnt = self._mnt()
        proc = subprocess.Popen(
            [
                sys.executable,
                os.fspath(HERE / "empty_server.py"),
                *[x for a in arrays for x in ("--array", os.fspath(a))],
                os.fspath(mnt),
                *map(str, sizes),
            ],
            stdin=subprocess.DEVNULL,
        )
        try:
            wait_mounted(mnt, proc)
            time.sleep(0.2)  # the read-ahead is tuned right after the mount answers
            cpu = cpu_seconds(proc.pid)
            out = timed(mnt)
            self.empty_cpu_s = cpu_seconds(proc.pid) - cpu
            return out
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
            unmount(mnt)

    def gathered(self, *arrays: Path) -> float:
        """Seconds for a cold `cat` of each array's .npy at once from the gathering server
        (`empty_server.py --array`)."""
        return self.empty([], lambda m: cat(*(m / f"f{i}" for i in range(len(arrays)))), arrays=arrays)


def cat(*paths: Path) -> float:
    """Seconds for `cat` of each path at once (one process each), after touching their total size."""
    touch_memory(sum(p.stat().st_size for p in paths))
    t0 = time.perf_counter()
    procs = [subprocess.Popen(["cat", os.fspath(p)], stdout=subprocess.DEVNULL) for p in paths]
    if any(p.wait() != 0 for p in procs):
        raise SystemExit(f"bench: cat {paths} failed")
    return time.perf_counter() - t0


def rand4k(path: Path, seed: int) -> float:
    """Seconds for RAND_READS O_DIRECT preads of RAND_SIZE bytes at aligned random offsets,
    the second time they are made (the first, untimed, loads the chunks they touch)."""
    size = path.stat().st_size
    rng = random.Random(seed)
    offsets = [rng.randrange(size // RAND_SIZE) * RAND_SIZE for _ in range(RAND_READS)]
    buf = mmap.mmap(-1, RAND_SIZE)  # page-aligned, as O_DIRECT wants
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    try:
        for off in offsets:
            os.preadv(fd, [buf], off)
        t0 = time.perf_counter()
        for off in offsets:
            os.preadv(fd, [buf], off)
        return time.perf_counter() - t0
    finally:
        os.close(fd)


ZARR_BEST = r"""
import sys, time, numpy as np, zarr
from zarr.core.buffer.cpu import NDBuffer
a = zarr.open_array(sys.argv[1], mode="r")
out = np.empty(a.shape, a.dtype); out.fill(0)
buf = NDBuffer.from_numpy_array(out)
a.get_basic_selection(..., out=buf)
t0 = time.perf_counter(); a.get_basic_selection(..., out=buf); print(time.perf_counter() - t0)
"""


def zarr_best(store: Path) -> float:
    r = subprocess.run(
        [sys.executable, "-c", ZARR_BEST, os.fspath(store / "bench")], capture_output=True, text=True, check=True
    )
    return float(r.stdout.strip().splitlines()[-1])


def check_exact(mnt: Path, store: Path) -> None:
    """A cheap correctness check before timing: a few rows through the mount equal zarr's."""
    import zarr

    arr = zarr.open_array(os.fspath(store / "bench"), mode="r")
    mm = np.load(mnt / "bench.npy", mmap_mode="r")
    for rows in (slice(0, 2), slice(arr.shape[0] // 2, arr.shape[0] // 2 + 2), slice(-2, None)):
        if not np.array_equal(np.asarray(mm[rows]), arr[rows]):
            raise SystemExit(f"bench: rows {rows} differ between the mount and zarr in {store.name}")
    del mm


def one_pair(
    b: Bench, stores: dict[str, Path], rows: list[str], rep: int, seconds: dict[str, list[tuple[float, float]]]
) -> dict[str, float]:
    """Every wanted row's ratio for one pair of runs (numerator / denominator); both appended to SECONDS."""
    ratios: dict[str, float] = {}

    def ratio(row: str, num: float, den: float) -> None:
        ratios[row] = num / den
        seconds[row].append((num, den))

    npy = "bench.npy"
    none = stores["none"]
    results: dict[str, float] = {}

    def npy_cold(mnt: Path) -> float:
        if rep == 0:
            check_exact(mnt, store_now[0])
        return cat(mnt / npy)

    store_now = [none]
    need_none = any(r in rows for r in ("ceiling", "gather", "none", "columns", "rand4k", "warm"))
    if need_none:

        def none_run(mnt: Path) -> dict[str, float]:
            out = {"cold": npy_cold(mnt)}
            out["warm"] = cat(mnt / npy)
            if "rand4k" in rows:
                out["rand"] = rand4k(mnt / npy, rep)
            return out

        results.update({f"none_{k}": v for k, v in b.zarrfs(none, none_run).items()})
    fsize = b.file_size
    if "ceiling" in rows or "rand4k" in rows or "bound" in rows or "boundwarm" in rows:

        def empty_run(mnt: Path) -> dict[str, float]:
            out = {"cold": cat(mnt / "f0")}
            if "boundwarm" in rows:
                out["warm"] = cat(mnt / "f0")
            if "rand4k" in rows:
                out["rand"] = rand4k(mnt / "f0", rep)
            return out

        results.update({f"empty_{k}": v for k, v in b.empty([fsize], empty_run).items()})
    if "ceiling" in rows:
        ratio("ceiling", results["empty_cold"], results["none_cold"])
    if "bound" in rows or "gather" in rows:
        t_g = b.gathered(none / "bench")
        if "bound" in rows:
            ratio("bound", results["empty_cold"], t_g)
        if "gather" in rows:
            ratio("gather", t_g, results["none_cold"])
    if "rand4k" in rows:
        ratio("rand4k", results["empty_rand"], results["none_rand"])
    if "warm" in rows or "boundwarm" in rows:
        tmp = tmpfs_dir() / f"zarrfs-bench-tmpfs-{os.getpid()}"
        try:
            with open(tmp, "wb") as f:  # written bytes: a sparse file's holes read as zero pages, 4x faster
                block = np.full(64 * MIB, 1, np.uint8)
                for at in range(0, fsize, len(block)):
                    f.write(block[: fsize - at])
            # its first cat: like the .npy's second, it meets pages touched once before (written
            # here, filled by the cold cat there), which this read moves to the active list
            t_tmp = cat(tmp)
            if "warm" in rows:
                ratio("warm", t_tmp, results["none_warm"])
            if "boundwarm" in rows:
                ratio("boundwarm", t_tmp, results["empty_warm"])
        finally:
            tmp.unlink(missing_ok=True)
    best: dict[str, float] = {}
    for row in ("none", "blosc", "zstd", "zstd2", "gzip"):
        if row not in rows:
            continue
        store_now[0] = stores[row]
        touch_memory(b.nbytes)
        z = best[row] = zarr_best(stores[row])
        t = results["none_cold"] if row == "none" else b.zarrfs(stores[row], npy_cold)
        ratio(row, z, t)
    for row, of in GATHERED.items():
        if row in rows:
            if of not in best:
                touch_memory(b.nbytes)
                best[of] = zarr_best(stores[of])
            ratio(row, best[of], b.gathered(stores[of] / "bench"))
    if "columns" in rows:
        store_now[0] = stores["columns"]
        ratio("columns", results["none_cold"], b.zarrfs(stores["columns"], npy_cold))
    if "fview" in rows:
        # each on a fresh mount: the F view read cold, the .npy read cold
        t_c = b.zarrfs(none, lambda m: cat(m / npy))
        t_f = b.zarrfs(none, lambda m: cat(m / ".zarrfs" / "npy-f" / npy))
        ratio("fview", t_c, t_f)
    if "netcdf" in rows:
        t_c = b.zarrfs(none, lambda m: cat(m / npy))
        t_n = b.zarrfs(none, lambda m: cat(m / ".zarrfs" / "netcdf" / (none.name[: -len(".zarr")] + ".nc")))
        ratio("netcdf", t_c, t_n)
    if "two" in rows or "bound2" in rows:
        t_e = b.empty([fsize, fsize], lambda m: cat(m / "f0", m / "f1"))
        if "two" in rows:
            ratio("two", t_e, b.zarrfs(stores["two"], lambda m: cat(m / "bench.npy", m / "bench2.npy")))
        if "bound2" in rows:
            ratio("bound2", t_e, b.gathered(stores["two"] / "bench", stores["two"] / "bench2"))
    return ratios


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--size-mib", type=int, default=1024, help="array size in MiB (default 1024 = 16384x16384)")
    p.add_argument("--reps", type=int, default=5, help="pairs per row (default 5)")
    p.add_argument("--rows", default=",".join(ROWS), help=f"rows to measure (default all: {','.join(ROWS)})")
    p.add_argument(
        "--dir",
        type=Path,
        default=Path("/dev/shm/zarrfs-bench-stores"),
        help="where stores are written (default /dev/shm/zarrfs-bench-stores)",
    )
    p.add_argument("--keep", action="store_true", help="keep the stores afterwards (reused by the next run)")
    p.add_argument(
        "--cache-mib",
        type=int,
        default=0,
        help="zarrfs cache_size in MiB (default: the array's size + 25%%, at least 512)",
    )
    p.add_argument("-o", "--mount-options", default="", help="extra zarrfs -o options")
    args = p.parse_args(argv)
    rows = [r for r in args.rows.split(",") if r]
    if unknown := set(rows) - set(ROWS):
        raise SystemExit(f"bench: unknown rows {sorted(unknown)}")

    args.dir.mkdir(parents=True, exist_ok=True)
    nrows = max(1, args.size_mib * MIB // (COLS * 4))
    args.cache_mib = args.cache_mib or max(512, nrows * COLS * 4 * 5 // 4 // MIB)
    needed = {"none"} | {r for r in rows if r in STORES} | {GATHERED[r] for r in rows if r in GATHERED}
    stores: dict[str, Path] = {}
    for kind in sorted(needed):
        codec, fmt, cols = STORES[kind]
        stores[kind] = args.dir / f"zarrfs-bench-{kind}-{nrows}x{COLS}.zarr"
        build_store(stores[kind], codec, fmt, nrows, cols)
    if "two" in rows or "bound2" in rows:
        stores["two"] = args.dir / f"zarrfs-bench-two-{nrows}x{COLS}.zarr"
        build_store(stores["two"], "none", 3, nrows, None, copies=2)

    workdir = Path(tempfile.mkdtemp(prefix="zarrfs-bench-", dir="/tmp"))
    b = Bench(args, workdir)
    b.nbytes = nrows * COLS * 4
    per_row: dict[str, list[float]] = {r: [] for r in rows}
    seconds: dict[str, list[tuple[float, float]]] = {r: [] for r in rows}
    try:
        b.file_size = b.zarrfs(stores["none"], lambda m: (m / "bench.npy").stat().st_size)
        for rep in range(args.reps):
            ratios = one_pair(b, stores, rows, rep, seconds)
            for r, v in ratios.items():
                per_row[r].append(v)
            print(f"pair {rep + 1}/{args.reps}: " + ", ".join(f"{r} {v:.2f}" for r, v in ratios.items()), flush=True)
    finally:
        for m in workdir.glob("mnt*"):
            unmount(m)
        shutil.rmtree(workdir, ignore_errors=True)
        if not args.keep:
            for s in stores.values():
                shutil.rmtree(s, ignore_errors=True)

    print(
        f"\narray {nrows}x{COLS} float32 ({b.nbytes / MIB:.0f} MiB), cache_size {args.cache_mib} MiB, "
        f"{args.reps} pairs; ratio = median of per-pair ratios [min-max]"
    )
    print(
        f"{'row':8} {'target':8} {'ratio':>6}  {'spread':13}  {'least':>5}  "
        "seconds, median [min-max]: numerator / denominator"
    )
    for r in rows:
        v = per_row[r]
        num, den = zip(*seconds[r])
        least = per_row.get(LEAST.get(r, ""))
        print(
            f"{r:8} {TARGETS[r]:8} {ratio_cells(v)}  {f'{statistics.median(least):.2f}' if least else '':>5}  "
            f"{_spread(num)} / {_spread(den)}"
        )
    print(
        f"{'memory':8} {'<= +150':8} {(b.peak_rss >> 20) - args.cache_mib:+6d}  MiB over cache_size "
        f"(peak VmHWM {b.peak_rss >> 20} MiB)"
    )
    stalled = [r for r in rows if any(max(side) > STALL_SPREAD * min(side) for side in zip(*seconds[r]))]
    if stalled:
        print(
            f"stalled: {', '.join(stalled)}: a side's slowest read took over {STALL_SPREAD:g}x its fastest "
            "(the machine stopped for a while; these medians may be off: run again)"
        )
    return 0


def ratio_cells(v: list[float]) -> str:
    """Per-pair ratios as the tables print them: the median, then the spread [min-max]."""
    return f"{statistics.median(v):6.2f}  {f'[{min(v):.2f}-{max(v):.2f}]':13}"


def _spread(v: tuple[float, ...]) -> str:
    return f"{statistics.median(v):.3f} [{min(v):.3f}-{max(v):.3f}]"


if __name__ == "__main__":
    sys.exit(main())
