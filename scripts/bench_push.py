#!/usr/bin/env python3
"""Does storing a file in the page cache ahead of its reader (FUSE_NOTIFY_STORE) beat replying to reads?

A cold `cat` of a file from ``scripts/empty_server.py``, which serves reads from memory, on a
fresh mount per timing, interleaved in pairs: the server as it is (the ceiling row of
``bench.py``) against the same server with ``--push THREADS``, whose threads store the whole
file in the kernel's page cache with ``pyfuse3.notify_store`` while `cat` reads it. The push
costs no planning, no decoding and no store read: what it gains here is the most a daemon
that pushes decoded bytes ahead of its readers could gain on this machine.

Prints, per variant, the median of the per-pair ratios (plain seconds / pushing seconds: above
1 pushing is faster) with their spread, the seconds of both sides and the server's CPU seconds
(all its threads). Run as root with the venv's Python: ``.venv/bin/python scripts/bench_push.py``.
Never imports zarrfs.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402  (Bench.empty, cat, unmount)

MIB = 1 << 20


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--size-mib", type=int, default=1024, help="file size in MiB (default 1024)")
    p.add_argument("--reps", type=int, default=8, help="pairs per variant (default 8)")
    p.add_argument("--threads", default="1,2", help="pushing threads of each variant (default 1,2)")
    args = p.parse_args(argv)
    variants = [int(t) for t in args.threads.split(",") if t]
    size = args.size_mib * MIB + 128  # the size of the .npy of bench.py's array
    workdir = Path(tempfile.mkdtemp(prefix="zarrfs-bench-push-", dir="/tmp"))
    b = bench.Bench(argparse.Namespace(mount_options="", cache_mib=0), workdir)
    runs: dict[int, list[tuple[float, float]]] = {t: [] for t in [0, *variants]}  # (seconds, server CPU)

    def timed(push: int) -> None:
        runs[push].append((b.empty([size], lambda m: bench.cat(m / "f0"), push=push), b.empty_cpu_s))

    try:
        for rep in range(args.reps):
            order = [0, *variants] if rep % 2 == 0 else [*variants, 0]  # neither side always first
            for push in order:
                timed(push)
            print(f"pair {rep + 1}/{args.reps}: " + ", ".join(
                f"push {t}: {runs[t][-1][0]:.2f} s" for t in [0, *variants]), flush=True)
    finally:
        for m in workdir.glob("mnt*"):
            bench.unmount(m)
        shutil.rmtree(workdir, ignore_errors=True)

    plain = [s for s, _ in runs[0]]
    print(f"\ncold cat of {args.size_mib} MiB, {args.reps} pairs; seconds and server CPU: median [min-max]")
    print(f"{'variant':10} {'ratio':>6}  {'spread':13}  {'seconds':24}  server CPU s")
    for t in [0, *variants]:
        secs, cpu = [s for s, _ in runs[t]], [c for _, c in runs[t]]
        ratios = [a / s for a, s in zip(plain, secs)]
        print(f"{'plain' if t == 0 else f'push {t}':10} {bench.ratio_cells(ratios)}  {bench._spread(tuple(secs)):24}  "
              f"{bench._spread(tuple(cpu))}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
