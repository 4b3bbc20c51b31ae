#!/usr/bin/env python3
"""zarrfs's read path without FUSE against the least work of the same reads, in one run.

Where bench.py times a cold `cat` through the kernel, this takes the kernel and `cat` away:
each side reads the reference array's ``.npy`` in sequential 1 MiB reads inside one process,
with a trio checkpoint between reads (as between two FUSE requests):

  zarrfs  the daemon's own operations (``daemon.build``, then ``lookup``, ``open`` and ``read``
          of ``bench.npy``), as the mount would run them, read-ahead and decoding threads included
  least   ``empty_server.py``'s gathering server (``--array``): each read gathered from the chunk
          files, or from a row of chunks decoded ahead by a thread per core, and nothing else

Each run is a fresh process; the pairs are interleaved. Printed per store: the ratio (least
work's seconds / zarrfs's: 1 is zarrfs doing only the least work), both sides' seconds, the
CPU seconds of the thread that serves the reads (the trio thread: the one a FUSE daemon cannot
spread over cores) and of all the others (decoding). The stores are bench.py's, written to
``--dir`` if missing and left there. Run with the venv's Python:
``.venv/bin/python benchmarks/bench_engine.py``. Unlike the other benchmarks it imports zarrfs
(its zarrfs side is the package's own code).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import bench  # (build_store, STORES, COLS, MIB)

READ = 1 << 20
KINDS = ("none", "blosc", "zstd")


def _threads_cpu() -> dict[str, float]:
    """CPU seconds so far of each thread of this process, by thread id."""
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            fields = Path(f"/proc/self/task/{tid}/stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue
        out[tid] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return out


def child(side: str, store: Path) -> dict[str, float]:
    """One side's sequential read of the whole .npy in this process: seconds and CPU."""
    import trio

    if side == "zarrfs":
        import pyfuse3

        from zarrfs import daemon, options

        ops = daemon.build(os.fspath(store), options.build_options([f"cache_size={2 << 30}"]))
        ctx = type("Ctx", (), {"pid": os.getpid(), "uid": 0, "gid": 0, "umask": 0o022})()

        async def reads(nursery) -> None:
            await nursery.start(ops.engine.run)
            attr = await ops.lookup(pyfuse3.ROOT_INODE, b"bench.npy", ctx)
            fh = (await ops.open(attr.st_ino, os.O_RDONLY, ctx)).fh
            await timed(lambda off: ops.read(fh, off, READ), attr.st_size)
    else:
        spec = importlib.util.spec_from_file_location("empty_server", bench.HERE / "empty_server.py")
        server = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(server)
        gather = server.GatherArrays([os.fspath(store / "bench")])

        async def reads(nursery) -> None:
            await timed(lambda off: gather.read(2, off, READ), gather.sizes[0])

    result: dict[str, float] = {}

    async def timed(read, size: int) -> None:
        bench.touch_memory(size)
        me = str(threading.get_native_id())
        before, t0 = _threads_cpu(), time.perf_counter()
        for off in range(0, size, READ):
            await read(off)
            await trio.lowlevel.checkpoint()
        result["seconds"] = time.perf_counter() - t0
        after = _threads_cpu()
        spent = {t: c - before.get(t, 0.0) for t, c in after.items()}
        result["serving_cpu"] = spent.pop(me, 0.0)
        result["other_cpu"] = sum(spent.values())

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await reads(nursery)
            nursery.cancel_scope.cancel()

    trio.run(main)
    return result


def run(side: str, store: Path) -> dict[str, float]:
    r = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--child", side, os.fspath(store)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=bench.HERE.parent,
    )
    if r.returncode != 0:
        raise SystemExit(f"bench_engine: the {side} side failed on {store.name}:\n{r.stderr.strip()}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--reps", type=int, default=5, help="pairs per store (default 5)")
    p.add_argument("--stores", default=",".join(KINDS), help=f"store kinds (default {','.join(KINDS)})")
    p.add_argument("--size-mib", type=int, default=1024, help="array size in MiB (default 1024)")
    p.add_argument("--dir", type=Path, default=Path("/dev/shm/zarrfs-bench-stores"))
    p.add_argument("--child", nargs=2, metavar=("SIDE", "STORE"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child[0], Path(args.child[1]))))
        return 0
    nrows = max(1, args.size_mib * bench.MIB // (bench.COLS * 4))
    print(
        f"sequential 1 MiB reads of the {nrows}x{bench.COLS} float32 .npy in-process, {args.reps} pairs; "
        "median [min-max]"
    )
    print(
        f"{'store':6} {'ratio':>6}  {'spread':13}  seconds least / zarrfs; serving thread CPU least / zarrfs; "
        "other threads CPU least / zarrfs"
    )
    for kind in [k for k in args.stores.split(",") if k]:
        codec, fmt, cols = bench.STORES[kind]
        store = args.dir / f"zarrfs-bench-{kind}-{nrows}x{bench.COLS}.zarr"
        bench.build_store(store, codec, fmt, nrows, cols)
        pairs = []
        for rep in range(args.reps):
            order = ("least", "zarrfs") if rep % 2 == 0 else ("zarrfs", "least")
            got = {side: run(side, store) for side in order}
            pairs.append((got["least"], got["zarrfs"]))

        def cells(key: str) -> str:
            return " / ".join(f"{statistics.median(p[i][key] for p in pairs):.3f}" for i in (0, 1))  # noqa: B023

        print(
            f"{kind:6} {bench.ratio_cells([a['seconds'] / b['seconds'] for a, b in pairs])}  "
            f"{cells('seconds')}; {cells('serving_cpu')}; {cells('other_cpu')}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
