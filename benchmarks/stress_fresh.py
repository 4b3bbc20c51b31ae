#!/usr/bin/env python3
"""Freshness under load: readers of one array on a remote mount while another process rewrites its chunks.

moto's S3 server on loopback holds a float32 array (zstd, written by zarr-python). One mount
with the disk cache and one without (`disk_cache_size=0`), both with a short `metadata_ttl`,
serve it to several concurrent readers each: `cat` of the whole `.npy`, `dd` of a random span
in 4 KiB blocks, `pread` of a random span after its own open, `pread` with `O_DIRECT` (up to
3 MiB: the kernel splits it into requests of 1 MiB) on a descriptor held open the whole run, and
`pread` through the page cache on a descriptor held open on the array's raw view, a file no other
reader opens. A writer process rewrites chunks with zarr-python
(chunk (0, 0) half the time) and logs when each rewrite began and ended; busy processes
load the machine.

Every element encodes its chunk, a version of that chunk and its row (`Layout.values`), so each
read is checked on its own bytes against the writer's log (`check`):
  - every chunk a read(2) of `pread`, `direct` or `held` covers holds one complete version (`cat`
    and `dd` make many reads: a chunk may change between two; counted as mixed);
  - every version seen was begun by the writer before the read ended (nothing from the future);
  - a read that began more than `metadata_ttl` after a rewrite of a chunk ended holds that
    version or a later one (docs/REMOTE.md, Freshness).

    PYTHONPATH=$PWD .venv/bin/python benchmarks/stress_fresh.py --seconds 600

(as root, from the repository's root: it mounts with `python -m zarrfs`, which takes a `zarrfs`
in the working directory before PYTHONPATH's; `--busy N` busy processes, default one per core;
`--kinds` the readers, e.g. `--kinds direct,held`; `shared`, not run unless asked, is `held` on
the `.npy` the others open, the case docs/CONCURRENCY.md says the rule cannot cover: its mixed
reads are counted, not failed). It prints one
line per mount and reader kind (reads, reads that had to show a rewrite, failures, reads that
saw two versions of a chunk) and every failure, and exits 1 if there was one. The suite's
short version is tests/mounted/test_mount_fresh_stress.py.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import mmap
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from support.s3 import BUCKET, CREDENTIALS, moto_server  # noqa: E402 (the tests' moto, one way to start it)

NAME = "fresh.zarr"
PAGE = 4096
KINDS = ("cat", "dd", "pread", "direct", "held")
# Readers whose every read is one read(2): one version per chunk. `cat` and `dd` make many, and
# may see a chunk change between two of them (each version seen is checked for freshness).
# `held` is pread on a descriptor held open the whole run, through the kernel's page cache, which
# may answer part of a read from pages it kept and ask the mount for the rest; it reads the raw
# view, which no other reader opens. `shared` (not run unless asked) does the same on the `.npy`,
# where another reader's GETATTR may tell the kernel of a rewrite while a read copies kept pages,
# and the kernel drops the rest under it (docs/CONCURRENCY.md: what the rule cannot cover).
ONE_CALL = ("pread", "direct", "held")
# O_DIRECT reads of up to this many pages: past 1 MiB the kernel splits one read(2) into several
# FUSE requests, between which the mount may start a revalidation.
DIRECT_PAGES_MAX = 768


@dataclasses.dataclass(frozen=True)
class Layout:
    """The array: its shape and chunk shape (2-d), and where its .npy's elements start."""

    shape: tuple[int, int] = (2048, 2048)
    chunks: tuple[int, int] = (256, 256)

    @property
    def grid(self) -> tuple[int, int]:
        return (-(-self.shape[0] // self.chunks[0]), -(-self.shape[1] // self.chunks[1]))

    @property
    def nchunks(self) -> int:
        return self.grid[0] * self.grid[1]

    def region(self, chunk: int) -> tuple[slice, slice]:
        i, j = divmod(chunk, self.grid[1])
        r, c = self.chunks
        return slice(i * r, min((i + 1) * r, self.shape[0])), slice(j * c, min((j + 1) * c, self.shape[1]))

    def values(self, chunk: int, version: int) -> np.ndarray:
        """The elements of CHUNK at VERSION: (version * nchunks + chunk) * 4 + row % 4, exact in float32."""
        rows, cols = self.region(chunk)
        q = (version * self.nchunks + chunk) * 4 + (np.arange(rows.start, rows.stop) % self.chunks[0]) % 4
        assert q.max() < 1 << 24, "too many versions for float32"
        return np.repeat(q[:, None], cols.stop - cols.start, axis=1).astype("<f4")


@dataclasses.dataclass
class Read:
    """One read's outcome: when it began and ended, where, and per chunk it covers the versions seen
    (two or more: mixed) or the reason its bytes are no version at all."""

    mount: str
    kind: str
    began: float
    ended: float
    offset: int
    size: int
    versions: dict[int, set[int]]
    broken: str = ""


def decode(layout: Layout, header: int, offset: int, data: bytes) -> tuple[dict[int, set[int]], str]:
    """Per chunk, the versions the elements of DATA (the .npy's bytes from OFFSET) hold, and
    what is wrong with any element that encodes no version of its place."""
    start = max(offset, header)
    first = -(-(start - header) // 4)  # whole elements only
    end = offset + len(data)
    last = (end - header) // 4
    if last <= first:
        return {}, ""
    at = header + first * 4 - offset
    vals = np.frombuffer(data, "<f4", last - first, at)
    e = np.arange(first, last)
    rows, cols = np.divmod(e, layout.shape[1])
    chunk = (rows // layout.chunks[0]) * layout.grid[1] + cols // layout.chunks[1]
    q = vals.astype(np.int64)
    broken = ""
    bad = (q != vals) | (q % 4 != (rows % layout.chunks[0]) % 4) | ((q // 4) % layout.nchunks != chunk)
    if bad.any():
        k = int(np.argmax(bad))
        broken = f"element {int(e[k])} (row {int(rows[k])}, col {int(cols[k])}) holds {float(vals[k])}"
    version = q // (4 * layout.nchunks)
    out: dict[int, set[int]] = {}
    for c in np.unique(chunk):
        out[int(c)] = {int(v) for v in np.unique(version[chunk == c])}
    return out, broken


# --- the store, the writer and the load ---------------------------------------------------------


def s3fs_for(endpoint: str):
    import s3fs

    return s3fs.S3FileSystem(
        client_kwargs={"endpoint_url": endpoint}, skip_instance_cache=True, use_listings_cache=False, **CREDENTIALS
    )


def storage_options(endpoint: str) -> str:
    return json.dumps({"client_kwargs": {"endpoint_url": endpoint}, **CREDENTIALS})


def open_array(endpoint: str, layout: Layout, create: bool = False):
    import zarr
    from zarr.codecs import ZstdCodec

    url = f"s3://{BUCKET}/{NAME}/a"
    so = {"client_kwargs": {"endpoint_url": endpoint}, **CREDENTIALS}
    if create:
        return zarr.create_array(
            url,
            shape=layout.shape,
            chunks=layout.chunks,
            dtype="float32",
            compressors=[ZstdCodec(level=1)],
            storage_options=so,
            overwrite=True,
        )
    return zarr.open_array(url, mode="r+", storage_options=so)


def put_array(endpoint: str, layout: Layout) -> None:
    """The array at version 0 of every chunk, written by zarr-python (the bucket made if need be)."""
    fs = s3fs_for(endpoint)
    if not fs.exists(BUCKET):
        fs.mkdir(BUCKET)
    arr = open_array(endpoint, layout, create=True)
    full = np.empty(layout.shape, "<f4")
    for c in range(layout.nchunks):
        full[layout.region(c)] = layout.values(c, 0)
    arr[...] = full


def write_forever(endpoint: str, layout: Layout, log_path: Path, seed: int, pause_s: float) -> None:
    """The writer process: rewrite chunks (chunk 0 half the time) with zarr-python until killed,
    each version numbered after the last, logging `B chunk version monotonic` before and `E ...`
    after each rewrite."""
    arr = open_array(endpoint, layout)
    rng = random.Random(seed)
    version = 0
    with open(log_path, "a") as log:
        while True:
            version += 1
            chunk = 0 if rng.random() < 0.5 else rng.randrange(layout.nchunks)
            log.write(f"B {chunk} {version} {time.monotonic():.6f}\n")
            log.flush()
            arr[layout.region(chunk)] = layout.values(chunk, version)
            log.write(f"E {chunk} {version} {time.monotonic():.6f}\n")
            log.flush()
            time.sleep(rng.uniform(0, pause_s))


@dataclasses.dataclass
class Rewrite:
    chunk: int
    version: int
    began: float
    ended: float = float("inf")


def rewrites(log_path: Path) -> list[Rewrite]:
    """The writer's log: every rewrite begun (ended: inf when its end was not logged)."""
    out: dict[int, Rewrite] = {}
    for line in log_path.read_text().splitlines():
        parts = line.split()
        if len(parts) != 4:
            continue  # (a line being written when the writer was killed)
        what, chunk, version, t = parts[0], int(parts[1]), int(parts[2]), float(parts[3])
        if what == "B":
            out[version] = Rewrite(chunk, version, t)
        elif version in out:
            out[version].ended = t
    return list(out.values())


@contextlib.contextmanager
def processes(commands: list[list[str]], env: dict | None = None) -> Iterator[list[subprocess.Popen]]:
    """Processes started here and ended here, each by its own pid."""
    procs = [
        subprocess.Popen(c, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
        for c in commands
    ]
    try:
        yield procs
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait(30)


BUSY = [sys.executable, "-c", "while True: pass"]


# --- readers --------------------------------------------------------------------------------


def npy_header(path: Path) -> int:
    with open(path, "rb") as f:
        head = f.read(16)
    return 10 + int.from_bytes(head[8:10], "little") if head[6] == 1 else 12 + int.from_bytes(head[8:12], "little")


class Readers:
    """Reader threads of one mount's array, each of one kind, recording every read until `stop`:
    of its .npy, but `held` of its raw view (elements in C order, no header)."""

    def __init__(self, label: str, mnt: Path, layout: Layout, seed: int) -> None:
        self.label, self.path, self.layout = label, mnt / "a.npy", layout
        self.size = self.path.stat().st_size
        self.header = npy_header(self.path)
        self.raw = mnt / ".zarrfs" / "raw" / "a.raw"
        self.reads: list[Read] = []
        self.errors: list[str] = []
        self.stop = threading.Event()
        self._rng = random.Random(seed)
        self._threads: list[threading.Thread] = []

    def start(self, kinds: tuple[str, ...] = KINDS) -> None:
        for kind in kinds:
            t = threading.Thread(target=self._loop, args=(kind, self._rng.random()), daemon=True)
            t.start()
            self._threads.append(t)

    def join(self) -> None:
        self.stop.set()
        for t in self._threads:
            t.join(120)

    def _record(self, kind: str, began: float, offset: int, data: bytes, want: int, header: int | None = None) -> None:
        ended = time.monotonic()
        if len(data) != want:
            self.errors.append(f"{self.label} {kind}: {len(data)} bytes at {offset}, {want} expected")
            return
        versions, broken = decode(self.layout, self.header if header is None else header, offset, data)
        self.reads.append(Read(self.label, kind, began, ended, offset, len(data), versions, broken))

    def _span(self, rng: random.Random, most: int, size: int | None = None) -> tuple[int, int]:
        size = self.size if size is None else size
        offset = rng.randrange(size)
        return offset, min(rng.randint(1, most), size - offset)

    def _loop(self, kind: str, seed: float) -> None:
        rng = random.Random(seed)
        direct_fd, held_fd, buf = None, None, None
        try:
            while not self.stop.is_set():
                try:
                    if kind == "cat":
                        began = time.monotonic()
                        out = subprocess.run(["cat", str(self.path)], capture_output=True, check=True).stdout
                        self._record(kind, began, 0, out, self.size)
                    elif kind == "dd":
                        block = rng.randrange(-(-self.size // PAGE))
                        count = rng.randint(1, 64)
                        began = time.monotonic()
                        out = subprocess.run(
                            ["dd", f"if={self.path}", f"bs={PAGE}", f"skip={block}", f"count={count}", "status=none"],
                            capture_output=True,
                            check=True,
                        ).stdout
                        self._record(kind, began, block * PAGE, out, min(count * PAGE, self.size - block * PAGE))
                    elif kind == "pread":
                        offset, size = self._span(rng, 256 << 10)
                        began = time.monotonic()
                        fd = os.open(self.path, os.O_RDONLY)
                        try:
                            out = os.pread(fd, size, offset)
                        finally:
                            os.close(fd)
                        self._record(kind, began, offset, out, size)
                    elif kind in ("held", "shared"):
                        if held_fd is None:
                            held_fd = os.open(self.raw if kind == "held" else self.path, os.O_RDONLY)
                        header = 0 if kind == "held" else self.header
                        offset, size = self._span(rng, 256 << 10, self.size - self.header + header)
                        began = time.monotonic()
                        self._record(kind, began, offset, os.pread(held_fd, size, offset), size, header)
                    elif kind == "direct":
                        if direct_fd is None:
                            direct_fd = os.open(self.path, os.O_RDONLY | os.O_DIRECT)
                            buf = mmap.mmap(-1, DIRECT_PAGES_MAX * PAGE)
                        pages = -(-self.size // PAGE)
                        first = rng.randrange(pages)
                        count = min(rng.randint(1, DIRECT_PAGES_MAX), pages - first)
                        view = memoryview(buf)[: count * PAGE]
                        began = time.monotonic()
                        n = os.preadv(direct_fd, [view], first * PAGE)
                        self._record(
                            kind, began, first * PAGE, bytes(view[:n]), min(count * PAGE, self.size - first * PAGE)
                        )
                        del view
                except (OSError, subprocess.CalledProcessError) as e:
                    self.errors.append(f"{self.label} {kind}: {e}")
                    time.sleep(0.1)
        finally:
            for fd in (direct_fd, held_fd):
                if fd is not None:
                    os.close(fd)


# --- the check ----------------------------------------------------------------------------------


def check(reads: list[Read], log: list[Rewrite], ttl_s: float) -> tuple[list[str], dict[tuple[str, str], list[int]]]:
    """The failures among READS against the writer's LOG, and per (mount, kind): [reads, reads
    that had to show a rewrite (began more than TTL_S after it ended), failures, reads that saw
    two versions of a chunk]."""
    by_chunk: dict[int, list[Rewrite]] = {}
    for w in sorted(log, key=lambda w: w.version):
        by_chunk.setdefault(w.chunk, []).append(w)
    failures: list[str] = []
    counts: dict[tuple[str, str], list[int]] = {}
    for r in reads:
        n = counts.setdefault((r.mount, r.kind), [0, 0, 0, 0])
        n[0] += 1
        n[3] += any(len(seen) > 1 for seen in r.versions.values())
        what = f"{r.mount} {r.kind} bytes {r.offset}-{r.offset + r.size} began {r.began:.3f} ended {r.ended:.3f}"
        problems = [r.broken] if r.broken else []
        bound = False
        for chunk, seen in r.versions.items():
            writes = by_chunk.get(chunk, [])
            if len(seen) > 1 and r.kind in ONE_CALL:
                problems.append(f"chunk {chunk} mixes versions {sorted(seen)}")
            for v in sorted(seen):
                if v and not any(w.version == v and w.began < r.ended for w in writes):
                    problems.append(f"chunk {chunk} holds version {v}, not begun before the read ended")
            due = [w for w in writes if w.ended + ttl_s < r.began]
            if due:
                bound = True
                w = due[-1]
                if min(seen) < w.version:
                    problems.append(
                        f"chunk {chunk} holds version {min(seen)}; version {w.version} was stored at "
                        f"{w.ended:.3f}, {r.began - w.ended:.3f} s before the read began"
                    )
        n[1] += bound
        if problems:
            n[2] += 1
            failures.append(f"{what}: {'; '.join(problems)}")
    return failures, counts


# --- a run ------------------------------------------------------------------------------------


def mount_options(endpoint: str, ttl_s: float, disk_cache: Path | None) -> list[str]:
    disk = [f"cache_dir={disk_cache}"] if disk_cache is not None else ["disk_cache_size=0"]
    return ["storage_options=" + storage_options(endpoint), f"metadata_ttl={ttl_s:g}", *disk]


def run(
    endpoint: str,
    mounts: dict[str, Path],
    layout: Layout,
    workdir: Path,
    seconds: float,
    ttl_s: float,
    busy: int,
    seed: int = 0,
    pause_s: float = 1.0,
    kinds: tuple[str, ...] = KINDS,
) -> tuple[list[str], dict[tuple[str, str], list[int]], list[str]]:
    """Readers on each of MOUNTS (label -> mount point, the array already put and mounted), the
    writer and BUSY busy processes for SECONDS; (failures, counts per mount and kind, errors)."""
    log_path = workdir / "writes.log"
    log_path.write_text("")
    readers = [Readers(label, mnt, layout, seed + i) for i, (label, mnt) in enumerate(sorted(mounts.items()))]
    writer = [
        sys.executable,
        os.path.abspath(__file__),
        "--write",
        endpoint,
        str(log_path),
        str(seed),
        f"{pause_s}",
        json.dumps([layout.shape, layout.chunks]),
    ]
    env = dict(os.environ)
    with processes([BUSY] * busy + [writer], env):
        for r in readers:
            r.start(kinds)
        time.sleep(seconds)
        for r in readers:
            r.join()
    failures, counts = check([x for r in readers for x in r.reads], rewrites(log_path), ttl_s)
    return failures, counts, [e for r in readers for e in r.errors]


def report(failures: list[str], counts: dict, errors: list[str], log: list[Rewrite]) -> str:
    lines = [f"rewrites: {len(log)} ({sum(1 for w in log if w.chunk == 0)} of chunk 0)"]
    for (mount, kind), (n, bound, bad, mixed) in sorted(counts.items()):
        lines.append(f"{mount:10} {kind:7} reads {n:6}  bound by a rewrite {bound:6}  failures {bad:3}  mixed {mixed}")
    lines += [f"error: {e}" for e in errors[:20]]
    lines += [f"FAIL {f}" for f in failures[:50]]
    if len(failures) > 50:
        lines.append(f"... and {len(failures) - 50} more failures")
    return "\n".join(lines)


def mount(mnt: Path, options: list[str], log_file: Path) -> None:
    cmd = [
        sys.executable,
        "-m",
        "zarrfs",
        f"s3://{BUCKET}/{NAME}",
        str(mnt),
        "-o",
        ",".join([f"log_file={log_file}", "log_level=info", *options]),
    ]
    subprocess.run(cmd, check=True, stdin=subprocess.DEVNULL, timeout=120)


def unmount(mnt: Path) -> None:
    if os.path.ismount(mnt):
        if subprocess.run(["fusermount3", "-u", str(mnt)], capture_output=True).returncode != 0:
            subprocess.run(["fusermount3", "-uz", str(mnt)], capture_output=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=300)
    p.add_argument("--ttl", type=float, default=2.0, help="metadata_ttl of both mounts")
    p.add_argument("--busy", type=int, default=os.cpu_count() or 2, help="busy processes loading the machine")
    p.add_argument("--pause", type=float, default=1.0, help="the writer waits up to this long between rewrites")
    p.add_argument("--shape", type=int, default=2048, help="the array's side (chunks of 256 x 256)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--keep", action="store_true", help="keep the work directory (the daemons' logs)")
    p.add_argument(
        "--kinds",
        default=",".join(KINDS),
        help="readers, of cat, dd, pread, direct, held (pread on a descriptor held open, through the page cache) "
        "and shared (the same on the .npy the others read)",
    )
    p.add_argument("--write", nargs=5, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.write:
        endpoint, log_path, seed, pause, shape = args.write
        s, c = json.loads(shape)
        write_forever(endpoint, Layout(tuple(s), tuple(c)), Path(log_path), int(seed), float(pause))
        return 0
    layout = Layout((args.shape, args.shape), (256, 256))
    work = Path(tempfile.mkdtemp(prefix="stress-fresh-"))
    mounts = {"disk-cache": work / "mnt-disk", "no-disk": work / "mnt-nodisk"}
    try:
        with moto_server(work / "moto.log") as (endpoint, _):
            put_array(endpoint, layout)
            for label, mnt in mounts.items():
                mnt.mkdir()
                disk = work / "cache" if label == "disk-cache" else None
                mount(mnt, mount_options(endpoint, args.ttl, disk), work / f"{label}.log")
            try:
                failures, counts, errors = run(
                    endpoint,
                    mounts,
                    layout,
                    work,
                    args.seconds,
                    args.ttl,
                    args.busy,
                    args.seed,
                    args.pause,
                    tuple(args.kinds.split(",")),
                )
            finally:
                for mnt in mounts.values():
                    unmount(mnt)
            print(report(failures, counts, errors, rewrites(work / "writes.log")))
            return 1 if failures or errors else 0
    finally:
        if args.keep:
            print(f"work directory: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
