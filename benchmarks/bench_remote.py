#!/usr/bin/env python3
"""zarrfs on a remote store vs zarr-python 3 + s3fs, in one run: moto's S3 server on loopback behind
benchmarks/latency_proxy.py (which adds LATENCY to each request and counts requests).

Rows (each with both sides' seconds, their ratio peer/zarrfs where there is a peer, and
the requests the proxy counted):
  seq        sequential read of an unsharded v3 zstd array (MOUNT/seq.npy with 1 MiB reads vs arr[...])
  seq-shard  the same for a sharded array (SHARD^2 shards of 256^2 inner chunks)
  (both seq rows also show the bytes the store sent each side, the bytes stored, and the daemon's VmHWM)
  random     N random 4 KiB reads of seq.npy (pread) vs arr[row, c0:c1] of the same elements
  find-cons  `find MNT -name '*.npy'` over GROUPS x ARRAYS arrays, consolidated v3 metadata,
             vs zarr.open_consolidated + listing every array
  lslR-cons  `ls -lR` of the same tree
  lslR-plain `ls -lR` of the same tree without consolidated metadata, vs zarr.open_group + members()
  lslR-http  the same over HTTP (`python -m http.server`, whose directory pages fsspec lists)
  moto-gets  the store's own rate: s3fs alone fetching the plain tree's documents at once (req/s)
  silent     the store stops answering in the middle of reading: seconds until the reader's EIO
  refused    the store refuses connections: seconds until EIO
  sigint     a Python reader waiting on a silent store gets SIGINT: seconds until it ends
  fresh      another client adds an array: seconds until `ls` shows it
  reval      ten arrays read again after metadata_ttl=1: requests (and chunk GETs among them)
  rewritten  another client rewrites a chunk: seconds until the reader (metadata_ttl=1) reads it
  recached   disk cache: a second mount (cold memory cache) reads seq.npy that a first mount read:
             seconds and chunk GETs, against the same array mounted from a local directory
  recached-shard  the same for shard.npy, read in part by random reads in the first mount: bytes fetched
  larger-than-memory  two passes over seq.npy with cache_size a quarter of it: second pass chunk GETs
  bounded    reading 3x disk_cache_size of distinct chunks: the most `du` of cache_dir ever showed
  changed    another client rewrites a chunk; after metadata_ttl=1: its GETs and whether the new bytes are read
  write-new  `cp x.npy MNT/` of a new SIDE^2 float32 array (chunks 256x512, zstd-1) vs zarr-python's
             `z[:] = x` of the same array into a new array (both: requests, PUTs among them)
  write-replace  `cp` over that array again vs zarr-python writing over its array again
  write-shard  `dd conv=notrunc bs=1M` of new values over a sharded SIDE^2 float32 array's .npy
             (shards of SHARD rows x SIDE, inner chunks 256x512, zstd-1; the values noisy, so that
             they compress little) with upload_part_size=5M, vs zarr-python's `z[:] = x` on its own
             copy of the array (both: requests, and the multipart parts among them)
  rclone     the peer: `rclone mount --vfs-cache-mode full` of seq's chunk objects, read by a first mount
             then by a second one: requests and bytes of the second read (needs rclone: apt install rclone)
(rows other than the disk cache's mount with disk_cache_size=0: they measure the store)

    .venv/bin/python benchmarks/bench_remote.py --latency 0.02
It never imports zarrfs; it runs its command line (PYTHONPATH selects which zarrfs).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np

import bench  # (mount, unmount)
from latency_proxy import Proxy

BUCKET = "bench"
CREDENTIALS = {"key": "testing", "secret": "testing"}
MIB = 1 << 20
INNER = (256, 256)
TIMEOUT_S = 5  # the mount's timeout= for the failure rows
ROWS = (
    "seq",
    "seq-shard",
    "random",
    "find-cons",
    "lslR-cons",
    "lslR-plain",
    "lslR-http",
    "moto-gets",
    "silent",
    "refused",
    "sigint",
    "fresh",
    "reval",
    "rewritten",
    "recached",
    "recached-shard",
    "larger-than-memory",
    "bounded",
    "changed",
    "rclone",
    "write-new",
    "write-replace",
    "write-shard",
)
DISK_CACHE_ON = [""]  # --disk-cache: where the store rows' fresh cache directories go
DISK_ROWS = ("recached", "recached-shard", "larger-than-memory", "bounded", "changed", "rclone")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_moto(workdir: Path) -> tuple[subprocess.Popen, int]:
    port = free_port()
    log = open(workdir / "moto.log", "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 30
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}", timeout=2)
            return proc, port
        except OSError:
            if time.monotonic() > deadline:
                raise SystemExit("moto server did not start") from None
            time.sleep(0.1)


def s3fs_for(port: int):
    import s3fs

    return s3fs.S3FileSystem(
        client_kwargs={"endpoint_url": f"http://127.0.0.1:{port}"},
        skip_instance_cache=True,
        use_listings_cache=False,
        **CREDENTIALS,
    )


def build(fs, workdir: Path, side: int, shard: int, groups: int, arrays: int, trees: bool, noisy: bool = False) -> None:
    import zarr
    from zarr.codecs import ZstdCodec

    fs.mkdir(BUCKET)
    local = workdir / "data.zarr"
    root = zarr.open_group(str(local), mode="w", zarr_format=3)
    x = (np.sin(np.arange(side * side, dtype=np.float32) / 1000).reshape(side, side) * 100).round(1)
    if noisy:
        x += np.random.default_rng(0).random(x.shape, dtype=np.float32)
    root.create_array("seq", shape=x.shape, chunks=(1024, 1024), dtype="float32", compressors=[ZstdCodec(level=1)])[
        :
    ] = x
    root.create_array(
        "shard", shape=x.shape, shards=(shard, shard), chunks=INNER, dtype="float32", compressors=[ZstdCodec(level=1)]
    )[:] = x
    fs.put(str(local), f"{BUCKET}/data.zarr", recursive=True)
    for name, consolidated in (("tree-cons.zarr", True), ("tree-plain.zarr", False)) if trees else ():
        tree = workdir / name
        t = zarr.open_group(str(tree), mode="w", zarr_format=3)
        for g in range(groups):
            grp = t.create_group(f"g{g}")
            for a in range(arrays):
                grp.create_array(f"a{a}", shape=(4, 4), chunks=(4, 4), dtype="i2")[:] = a
        if consolidated:
            zarr.consolidate_metadata(str(tree))
        fs.put(str(tree), f"{BUCKET}/{name}", recursive=True)


def mount(port: int, name: str, mnt: Path, *extra: str) -> None:
    so = {"client_kwargs": {"endpoint_url": f"http://127.0.0.1:{port}"}, **CREDENTIALS}
    if not any(o.startswith(("cache_dir=", "disk_cache_size=")) for o in extra):
        # Rows of the store itself: no disk cache, or (--disk-cache) a new empty one each mount, to see
        # what keeping entries costs.
        if DISK_CACHE_ON[0]:
            extra = (*extra, f"cache_dir={tempfile.mkdtemp(prefix='dc-', dir=DISK_CACHE_ON[0])}")
        else:
            extra = (*extra, "disk_cache_size=0")
    mount_source(f"s3://{BUCKET}/{name}", mnt, "storage_options=" + json.dumps(so), *extra)


def mount_source(source: str, mnt: Path, *options: str) -> None:
    cmd = [sys.executable, "-m", "zarrfs", source, os.fspath(mnt), "-o", ",".join(["log_level=warning", *options])]
    r = subprocess.run(
        cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=120
    )
    if r.returncode != 0 or not bench.is_mounted(mnt):
        raise SystemExit(f"bench_remote: mounting failed (exit {r.returncode}): {r.stderr.strip()}")


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def read_whole(path: Path) -> None:
    buf = bytearray(MIB)
    with open(path, "rb", buffering=0) as f:
        while f.readinto(buf):
            pass


def row(
    name: str, ours: float, ours_req: int, peer: float | None = None, peer_req: int | None = None, extra: str = ""
) -> None:
    ratio = f"{peer / ours:6.2f}x" if peer else "      "
    peer_s = f"{peer:8.3f} s {peer_req:6d} req" if peer is not None else ""
    print(f"{name:11s} zarrfs {ours:8.3f} s {ours_req:6d} req   {ratio}   zarr+s3fs {peer_s}{extra}", flush=True)


def spread(runs: list[float]) -> str:
    """Seconds of repeated runs: min/median/max."""
    runs = sorted(runs)
    return "/".join(f"{t:.3f}" for t in (runs[0], runs[len(runs) // 2], runs[-1]))


def stored_mb(fs, name: str) -> float:
    """Bytes the array's chunk objects take in the bucket, MB."""
    return sum(fs.du(f"{BUCKET}/data.zarr/{name}", total=False).values()) / 1e6


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--latency", type=float, default=0.02)
    p.add_argument("--side", type=int, default=4096, help="side of the float32 arrays read (4096: 64 MiB)")
    p.add_argument("--shard", type=int, default=2048)
    p.add_argument("--groups", type=int, default=20)
    p.add_argument("--arrays", type=int, default=100, help="arrays per group")
    p.add_argument("--random", type=int, default=200)
    p.add_argument("--repeat", type=int, default=1, help="runs of the seq rows; each side's best is shown")
    p.add_argument("--noisy", action="store_true", help="add noise to the arrays' values (compress little)")
    p.add_argument("--rows", default=",".join(ROWS), help="comma-separated rows to run (default: all)")
    p.add_argument(
        "--disk-cache",
        action="store_true",
        help="run the store's rows with an empty disk cache (what writing entries costs)",
    )
    args = p.parse_args(argv)
    rows = set(args.rows.split(","))
    if rows - set(ROWS):
        p.error(f"unknown rows {sorted(rows - set(ROWS))}; rows are {','.join(ROWS)}")
    import zarr

    work = Path(tempfile.mkdtemp(prefix="bench-remote-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None))
    moto, port = start_moto(work)
    proxy = Proxy(port, 0.0).start()
    mnt = work / "mnt"
    mnt.mkdir()
    if args.disk_cache:
        DISK_CACHE_ON[0] = str(work)
    try:
        build(
            s3fs_for(port),
            work,
            args.side,
            args.shard,
            args.groups,
            args.arrays,
            bool(
                rows & {"find-cons", "lslR-cons", "lslR-plain", "lslR-http", "moto-gets", "fresh", "reval", "rewritten"}
            ),
            args.noisy,
        )
        proxy.latency_s = args.latency
        print(f"latency {args.latency * 1000:g} ms; arrays {args.side}^2 float32; tree {args.groups}x{args.arrays}")
        peer_fs = s3fs_for(proxy.port)
        peer_opts = {"client_kwargs": {"endpoint_url": f"http://127.0.0.1:{proxy.port}"}, **CREDENTIALS}

        def peer_array(name):
            return zarr.open_array(store=f"s3://{BUCKET}/data.zarr/{name}", mode="r", storage_options=peer_opts)

        for label, name in (("seq", "seq"), ("seq-shard", "shard")):
            if label not in rows:
                continue
            ours_runs, peer_runs = [], []
            for _ in range(args.repeat):  # each side's best, on a fresh mount and a fresh array each time
                mount(proxy.port, "data.zarr", mnt)
                proxy.reset_counts()
                ours_runs.append(timed(lambda: read_whole(mnt / f"{name}.npy")))  # noqa: B023
                ours_req, ours_mb = proxy.count(), proxy.bytes_down / 1e6
                hwm = bench.vm_hwm_bytes(bench.daemon_pid(mnt)) >> 20
                bench.unmount(mnt)
                proxy.reset_counts()
                peer_runs.append(timed(lambda: peer_array(name)[...]))  # noqa: B023
            row(
                label,
                min(ours_runs),
                ours_req,
                min(peer_runs),
                proxy.count(),
                f"   fetched {ours_mb:.0f} MB (zarr+s3fs {proxy.bytes_down / 1e6:.0f}) "
                f"of {stored_mb(peer_fs, name):.0f} MB stored; daemon VmHWM {hwm} MiB; "
                f"runs zarrfs {spread(ours_runs)}, zarr+s3fs {spread(peer_runs)}",
            )

        if "random" in rows:
            random_row(args, proxy, mnt, peer_array)
        tree_rows(rows, proxy, mnt, peer_opts)
        if "lslR-http" in rows:
            http_row(proxy, mnt, work)
        if "moto-gets" in rows:
            moto_row(args, proxy)
        failure_rows(rows, args, proxy, mnt)
        if "sigint" in rows:
            sigint_row(proxy, mnt)
        if "fresh" in rows:
            fresh_row(proxy, mnt, peer_fs)
        if rows & {"reval", "rewritten"}:
            revalidation_rows(proxy, mnt, peer_fs)
        if rows & {"write-new", "write-replace"}:
            write_rows(rows, args, proxy, mnt, work, peer_opts)
        if "write-shard" in rows:
            write_shard_row(args, proxy, mnt, work, peer_opts)
        if rows & set(DISK_ROWS):
            disk_cache_rows(rows, args, proxy, mnt, work, peer_fs)
    finally:
        bench.unmount(mnt)
        proxy.stop()
        moto.terminate()
        moto.wait(10)
        shutil.rmtree(work, ignore_errors=True)
    return 0


WRITE_CHUNKS = (256, 512)


def write_rows(rows: set[str], args, proxy, mnt: Path, work: Path, peer_opts: dict) -> None:
    """`cp` of a new NPY file into a writable mount, then over it again, beside zarr-python writing
    the same array with the same chunks and codec; each side's best of --repeat runs."""
    import zarr
    from zarr.codecs import ZstdCodec

    x = (np.sin(np.arange(args.side * args.side, dtype=np.float32) / 1000).reshape(args.side, args.side) * 100).round(1)
    if args.noisy:
        x += np.random.default_rng(1).random(x.shape, dtype=np.float32)
    src = work / "x.npy"
    np.save(src, x)
    options = ("writable", f"chunks={WRITE_CHUNKS[0]},{WRITE_CHUNKS[1]}", "codec=zstd:1")
    for label in ("write-new", "write-replace"):
        if label not in rows:
            continue
        ours_runs, peer_runs, ours_req, peer_req, hwm = [], [], (0, 0), (0, 0), 0
        for run in range(args.repeat):
            name = f"w{run}"
            mount(proxy.port, "data.zarr", mnt, *options)
            cp = ["cp", str(src), str(mnt / f"{name}.npy")]
            if label == "write-replace":
                subprocess.run(cp, check=True)
            proxy.reset_counts()
            ours_runs.append(timed(lambda: subprocess.run(cp, check=True)))  # noqa: B023
            ours_req = (proxy.count(), proxy.count("PUT"))
            hwm = bench.vm_hwm_bytes(bench.daemon_pid(mnt)) >> 20
            bench.unmount(mnt)
            store = f"s3://{BUCKET}/data.zarr/p{run}"
            if label == "write-replace":
                zarr.create_array(
                    store=store,
                    shape=x.shape,
                    chunks=WRITE_CHUNKS,
                    dtype="float32",
                    compressors=[ZstdCodec(level=1)],
                    storage_options=peer_opts,
                    overwrite=True,
                )[:] = x

            def peer_write():
                z = zarr.create_array(
                    store=store,  # noqa: B023
                    shape=x.shape,
                    chunks=WRITE_CHUNKS,
                    dtype="float32",
                    compressors=[ZstdCodec(level=1)],
                    storage_options=peer_opts,
                    overwrite=True,
                )
                z[:] = x

            proxy.reset_counts()
            peer_runs.append(timed(peer_write))
            peer_req = (proxy.count(), proxy.count("PUT"))
            mount(proxy.port, "data.zarr", mnt)
            same = np.array_equal(np.load(mnt / f"{name}.npy"), x)
            bench.unmount(mnt)
        row(
            label,
            min(ours_runs),
            ours_req[0],
            min(peer_runs),
            peer_req[0],
            f"   PUTs zarrfs {ours_req[1]} (zarr+s3fs {peer_req[1]}) for {x.size * 4 // (np.prod(WRITE_CHUNKS) * 4)} "
            f"chunks; read back equal: {same}; daemon VmHWM {hwm} MiB; "
            f"runs zarrfs {spread(ours_runs)}, zarr+s3fs {spread(peer_runs)}",
        )


def write_shard_row(args, proxy, mnt: Path, work: Path, peer_opts: dict) -> None:
    """Every element of a sharded array written in place through the mount, beside zarr-python
    writing the same values into its own copy; each side's best of --repeat runs."""
    import zarr
    from zarr.codecs import ZstdCodec

    rng = np.random.default_rng(2)
    shape, shards = (args.side, args.side), (args.shard, args.side)
    old = rng.random(shape, dtype=np.float32)
    x = rng.random(shape, dtype=np.float32)
    src = work / "x-shard.npy"
    np.save(src, x)

    def create(store: str):
        return zarr.create_array(
            store=store,
            shape=shape,
            shards=shards,
            chunks=WRITE_CHUNKS,
            dtype="float32",
            compressors=[ZstdCodec(level=1)],
            storage_options=peer_opts,
            overwrite=True,
        )

    ours_runs, peer_runs, ours_req, peer_req, hwm, same = [], [], (0, 0), (0, 0), 0, True
    for run in range(args.repeat):
        create(f"s3://{BUCKET}/shards.zarr/s{run}")[:] = old
        mount(proxy.port, "shards.zarr", mnt, "writable", "upload_part_size=5M")
        target = mnt / f"s{run}.npy"
        with open(target, "rb") as f, open(src, "rb") as g:
            header = os.path.getsize(src) - x.nbytes
            assert f.read(header) == g.read(header), "the mount's NPY header differs from np.save's"
        dd = ["dd", f"if={src}", f"of={target}", "bs=1M", "conv=notrunc,fsync", "status=none"]
        proxy.reset_counts()
        ours_runs.append(timed(lambda: subprocess.run(dd, check=True)))  # noqa: B023
        ours_req = (proxy.count(), sum(1 for m, p in proxy.requests if m == "PUT" and "partNumber=" in p))
        hwm = bench.vm_hwm_bytes(bench.daemon_pid(mnt)) >> 20
        bench.unmount(mnt)
        peer = create(f"s3://{BUCKET}/shards.zarr/p{run}")
        peer[:] = old
        proxy.reset_counts()
        peer_runs.append(timed(lambda: peer.__setitem__(slice(None), x)))  # noqa: B023
        peer_req = (proxy.count(), sum(1 for m, p in proxy.requests if m == "PUT" and "partNumber=" in p))
        got = zarr.open_array(store=f"s3://{BUCKET}/shards.zarr/s{run}", mode="r", storage_options=peer_opts)[...]
        same = same and np.array_equal(got, x)
    row(
        "write-shard",
        min(ours_runs),
        ours_req[0],
        min(peer_runs),
        peer_req[0],
        f"   parts zarrfs {ours_req[1]} (zarr+s3fs {peer_req[1]}) for {args.side // args.shard} shards; "
        f"read back equal: {same}; daemon VmHWM {hwm} MiB; "
        f"runs zarrfs {spread(ours_runs)}, zarr+s3fs {spread(peer_runs)}",
    )


def random_row(args, proxy, mnt: Path, peer_array) -> None:
    rng = random.Random(0)
    header = 128
    picks = [(rng.randrange(args.side), rng.randrange(0, args.side - 1024)) for _ in range(args.random)]
    mount(proxy.port, "data.zarr", mnt)
    proxy.reset_counts()
    fd = os.open(mnt / "seq.npy", os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
    ours = timed(lambda: [os.pread(fd, 4096, header + (r * args.side + c) * 4) for r, c in picks])
    os.close(fd)
    ours_req = proxy.count()
    bench.unmount(mnt)
    arr = peer_array("seq")
    proxy.reset_counts()
    peer = timed(lambda: [arr[r, c : c + 1024] for r, c in picks])
    row("random", ours / args.random, ours_req, peer / args.random, proxy.count())


def tree_rows(rows: set[str], proxy, mnt: Path, peer_opts: dict) -> None:
    import zarr

    for label, name, cmd in (
        ("find-cons", "tree-cons.zarr", ["find", str(mnt), "-name", "*.npy"]),
        ("lslR-cons", "tree-cons.zarr", ["ls", "-lR", str(mnt)]),
        ("lslR-plain", "tree-plain.zarr", ["ls", "-lR", str(mnt)]),
    ):
        if label not in rows:
            continue
        mount(proxy.port, name, mnt)
        proxy.reset_counts()
        ours = timed(lambda: subprocess.run(cmd, stdout=subprocess.DEVNULL, check=True))  # noqa: B023
        ours_req = proxy.count()
        bench.unmount(mnt)
        if name == "tree-cons.zarr":
            proxy.reset_counts()

            def peer_list():
                g = zarr.open_consolidated(store=f"s3://{BUCKET}/{name}", storage_options=peer_opts)  # noqa: B023
                return [a.shape for _, a in g.arrays()] + [list(sub.arrays()) for _, sub in g.groups()]
        else:
            proxy.reset_counts()

            def peer_list():
                g = zarr.open_group(
                    store=f"s3://{BUCKET}/{name}",  # noqa: B023
                    mode="r",
                    use_consolidated=False,
                    storage_options=peer_opts,
                )
                return list(g.members(max_depth=None))

        peer = timed(peer_list)
        peer_req = proxy.count()
        row(label, ours, ours_req, peer, peer_req)


def http_row(proxy, mnt: Path, work: Path) -> None:
    """`ls -lR` of the plain tree served by `python -m http.server` (through its own latency proxy)."""
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "http.server", "-b", "127.0.0.1", "-d", str(work), str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    hproxy = Proxy(port, proxy.latency_s).start()
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise SystemExit("http.server did not start") from None
                time.sleep(0.1)
        mount_source(f"http://127.0.0.1:{hproxy.port}/tree-plain.zarr", mnt)
        hproxy.reset_counts()
        ours = timed(lambda: subprocess.run(["ls", "-lR", str(mnt)], stdout=subprocess.DEVNULL, check=True))
        row("lslR-http", ours, hproxy.count())
        bench.unmount(mnt)
    finally:
        hproxy.stop()
        server.terminate()
        server.wait(10)


def moto_row(args, proxy) -> None:
    fs = s3fs_for(proxy.port)
    keys = [f"{BUCKET}/tree-plain.zarr/g{g}/a{a}/zarr.json" for g in range(args.groups) for a in range(args.arrays)]
    proxy.reset_counts()
    seconds = timed(lambda: fs.cat(keys))
    print(
        f"{'moto-gets':11s} s3fs   {seconds:8.3f} s {proxy.count():6d} req   {proxy.count() / seconds:8.0f} req/s "
        f"(the store's own rate: s3fs alone fetching the plain tree's {len(keys)} documents at once)",
        flush=True,
    )


def failure_rows(rows: set[str], args, proxy, mnt: Path) -> None:
    for label, mode in (("silent", "silent"), ("refused", "refuse")):
        if label not in rows:
            continue
        mount(proxy.port, "data.zarr", mnt, f"timeout={TIMEOUT_S}")
        proxy.reset_counts()
        with open(mnt / "seq.npy", "rb") as f:
            f.read(MIB)
            proxy.set_mode(mode)
            t0 = time.perf_counter()
            try:
                f.seek(args.side * args.side * 2)
                f.read(MIB)
                outcome = "read (no error)"
            except OSError as e:
                outcome = e.strerror
            waited = time.perf_counter() - t0
        proxy.set_mode("pass")
        print(f"{label:11s} zarrfs {waited:8.3f} s until: {outcome} (timeout={TIMEOUT_S})", flush=True)
        bench.unmount(mnt)


def sigint_row(proxy, mnt: Path) -> None:
    mount(proxy.port, "data.zarr", mnt, f"timeout={TIMEOUT_S}")
    proxy.set_mode("silent")
    # Python takes SIGINT only if it was not ignored when it started, and a shell's background job
    # (`bench_remote.py ... &`) starts with SIGINT ignored: the reader takes it in any case.
    reader = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import signal; signal.signal(signal.SIGINT, signal.default_int_handler); "
            f"open({str(mnt / 'seq.npy')!r}, 'rb').read()",
        ],
        stderr=subprocess.DEVNULL,
    )
    time.sleep(1)
    t0 = time.perf_counter()
    reader.send_signal(signal.SIGINT)
    reader.wait(60)
    waited = time.perf_counter() - t0
    proxy.set_mode("pass")
    print(
        f"{'sigint':11s} zarrfs {waited:8.3f} s until a Python reader (which catches SIGINT) ended "
        f"(timeout={TIMEOUT_S})",
        flush=True,
    )
    bench.unmount(mnt)


def revalidation_rows(proxy, mnt: Path, peer_fs) -> None:
    """Ten arrays read, read again after metadata_ttl=1 (requests), then one chunk rewritten by another
    client (seconds until the reader sees it)."""
    mount(proxy.port, "tree-plain.zarr", mnt, "metadata_ttl=1")
    files = [mnt / "g1" / f"a{a}.npy" for a in range(10)]
    first = [f.read_bytes() for f in files]
    time.sleep(1.5)
    proxy.reset_counts()
    again = [f.read_bytes() for f in files]
    chunk_gets = sum(1 for m, p in proxy.requests if m == "GET" and "/c/" in p)
    print(
        f"{'reval':11s} zarrfs {proxy.count():6d} req ({chunk_gets} chunk GETs) to read 10 arrays again after "
        f"metadata_ttl=1 (same bytes: {first == again})",
        flush=True,
    )
    peer_fs.pipe(f"{BUCKET}/tree-plain.zarr/g1/a0/c/0/0", peer_fs.cat(f"{BUCKET}/tree-plain.zarr/g1/a1/c/0/0"))
    t0 = time.perf_counter()
    while files[0].read_bytes() == first[0] and time.perf_counter() - t0 < 60:
        time.sleep(0.1)
    print(
        f"{'rewritten':11s} zarrfs {time.perf_counter() - t0:8.3f} s until a rewritten chunk is read (metadata_ttl=1)",
        flush=True,
    )
    bench.unmount(mnt)


def chunk_gets(proxy, name: str) -> list[str]:
    return [p for m, p in proxy.requests if m == "GET" and f"/data.zarr/{name}/c/" in p]


def du_bytes(path: Path) -> int:
    total = os.lstat(path).st_blocks * 512
    for top, dirs, files in os.walk(path):
        for n in dirs + files:
            try:
                total += os.lstat(os.path.join(top, n)).st_blocks * 512
            except FileNotFoundError:
                pass
    return total


def disk_cache_rows(rows: set[str], args, proxy, mnt: Path, work: Path, peer_fs) -> None:
    """The disk cache's figures; each row with a cache directory of its own."""
    import threading

    nbytes = args.side * args.side * 4
    if "recached" in rows:
        cache = work / "dc-recached"
        mount(proxy.port, "data.zarr", mnt, f"cache_dir={cache}")
        read_whole(mnt / "seq.npy")
        bench.unmount(mnt)
        mount(proxy.port, "data.zarr", mnt, f"cache_dir={cache}")
        proxy.reset_counts()
        ours = timed(lambda: read_whole(mnt / "seq.npy"))
        gets, req = len(chunk_gets(proxy, "seq")), proxy.count()
        bench.unmount(mnt)
        mount_source(str(work / "data.zarr"), mnt)
        local = timed(lambda: read_whole(mnt / "seq.npy"))
        bench.unmount(mnt)
        print(
            f"{'recached':11s} zarrfs {ours:8.3f} s {req:6d} req ({gets} chunk GETs); the same array on a local "
            f"directory {local:.3f} s: {ours / local:.2f}x its time; cache {du_bytes(cache) / 1e6:.0f} MB",
            flush=True,
        )
    if "recached-shard" in rows:
        cache = work / "dc-shard"
        mount(proxy.port, "data.zarr", mnt, f"cache_dir={cache}")
        rng = random.Random(1)
        proxy.reset_counts()
        fd = os.open(mnt / "shard.npy", os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        for _ in range(args.random // 4):
            os.pread(fd, 4096, 128 + rng.randrange(nbytes - 4096))
        os.close(fd)
        first_mb = proxy.bytes_down / 1e6
        bench.unmount(mnt)
        mount(proxy.port, "data.zarr", mnt, f"cache_dir={cache}")
        proxy.reset_counts()
        ours = timed(lambda: read_whole(mnt / "shard.npy"))
        print(
            f"{'recached-shard':11s} zarrfs {ours:8.3f} s {proxy.count():6d} req: fetched "
            f"{proxy.bytes_down / 1e6:.0f} MB of {stored_mb(peer_fs, 'shard'):.0f} MB stored, after "
            f"{args.random // 4} random reads of a first mount fetched {first_mb:.0f} MB",
            flush=True,
        )
        bench.unmount(mnt)
    if "larger-than-memory" in rows:
        cache = work / "dc-ltm"
        mount(
            proxy.port,
            "data.zarr",
            mnt,
            f"cache_dir={cache}",
            f"cache_size={max(nbytes // 4, 16 * MIB)}",
            f"disk_cache_size={2 * nbytes}",
        )
        first = timed(lambda: read_whole(mnt / "seq.npy"))
        proxy.reset_counts()
        second = timed(lambda: read_whole(mnt / "seq.npy"))
        print(
            f"{'larger-than-memory':11s} zarrfs pass 1 {first:.3f} s, pass 2 {second:.3f} s {proxy.count()} req "
            f"({len(chunk_gets(proxy, 'seq'))} chunk GETs), cache_size {max(nbytes // 4, 16 * MIB) >> 20} MiB",
            flush=True,
        )
        bench.unmount(mnt)
    if "bounded" in rows:
        cache = work / "dc-bounded"
        bound = nbytes // 3
        mount(proxy.port, "data.zarr", mnt, f"cache_dir={cache}", f"disk_cache_size={bound}")
        peak, done = [0], threading.Event()

        def watch() -> None:
            while not done.is_set():
                peak[0] = max(peak[0], du_bytes(cache))
                time.sleep(0.01)

        watcher = threading.Thread(target=watch)
        watcher.start()
        read_whole(mnt / "seq.npy")
        done.set()
        watcher.join()
        stats = json.loads((mnt / ".zarrfs" / "stats.json").read_bytes())
        print(
            f"{'bounded':11s} zarrfs du of cache_dir at most {peak[0] / 1e6:.1f} MB, disk_cache_size "
            f"{bound / 1e6:.1f} MB ({peak[0] / bound:.3f}x); {stats['disk_evictions']} evictions",
            flush=True,
        )
        bench.unmount(mnt)
    if "changed" in rows:
        cache = work / "dc-changed"
        mount(proxy.port, "data.zarr", mnt, f"cache_dir={cache}", "metadata_ttl=1")
        before = (mnt / "seq.npy").read_bytes()
        peer_fs.pipe(f"{BUCKET}/data.zarr/seq/c/0/0", peer_fs.cat(f"{BUCKET}/data.zarr/seq/c/0/1"))
        time.sleep(1.5)
        proxy.reset_counts()
        after = (mnt / "seq.npy").read_bytes()
        gets = chunk_gets(proxy, "seq")
        print(
            f"{'changed':11s} zarrfs {len(gets)} chunk GETs ({gets.count(f'/{BUCKET}/data.zarr/seq/c/0/0')} of the "
            f"rewritten one), {proxy.count()} req; new bytes read: {after != before}",
            flush=True,
        )
        bench.unmount(mnt)
        peer_fs.pipe(f"{BUCKET}/data.zarr/seq/c/0/0", (work / "data.zarr" / "seq" / "c" / "0" / "0").read_bytes())
    if "rclone" in rows and shutil.which("rclone"):
        rclone_row(proxy, mnt, work)


def rclone_row(proxy, mnt: Path, work: Path) -> None:
    """rclone's VFS cache on the same bucket: the chunk objects of seq read twice, a remount between."""
    env = {
        **os.environ,
        "RCLONE_CONFIG_MOTO_TYPE": "s3",
        "RCLONE_CONFIG_MOTO_PROVIDER": "Other",
        "RCLONE_CONFIG_MOTO_ENDPOINT": f"http://127.0.0.1:{proxy.port}",
        "RCLONE_CONFIG_MOTO_ACCESS_KEY_ID": CREDENTIALS["key"],
        "RCLONE_CONFIG_MOTO_SECRET_ACCESS_KEY": CREDENTIALS["secret"],
    }
    env.pop("AWS_CA_BUNDLE", None)  # rclone's S3 client cannot take one over plain HTTP
    cache = work / "rclone-cache"
    seconds, reqs, mbs = [], [], []
    for _ in range(2):
        proc = subprocess.Popen(
            [
                "rclone",
                "mount",
                f"moto:{BUCKET}/data.zarr/seq",
                str(mnt),
                "--vfs-cache-mode",
                "full",
                "--cache-dir",
                str(cache),
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=open(work / "rclone.log", "ab"),
        )
        deadline = time.monotonic() + 30
        while not bench.is_mounted(mnt) and time.monotonic() < deadline:
            time.sleep(0.1)
        proxy.reset_counts()
        files = [Path(top) / f for top, _, names in os.walk(mnt) for f in names]
        seconds.append(timed(lambda: [read_whole(f) for f in files]))  # noqa: B023
        reqs.append(proxy.count())
        mbs.append(proxy.bytes_down / 1e6)
        subprocess.run(["fusermount3", "-u", str(mnt)], check=False)
        proc.wait(30)
    if not reqs[0]:
        print(f"rclone did not mount: {(work / 'rclone.log').read_text()[-2000:]}", flush=True)
    print(
        f"{'rclone':11s} rclone first read {seconds[0]:.3f} s {reqs[0]} req {mbs[0]:.1f} MB; after a remount "
        f"{seconds[1]:.3f} s {reqs[1]} req {mbs[1]:.1f} MB fetched (encoded chunk objects, not .npy)",
        flush=True,
    )


def fresh_row(proxy, mnt: Path, peer_fs) -> None:
    mount(proxy.port, "tree-plain.zarr", mnt)
    os.listdir(mnt / "g0")
    t0 = time.perf_counter()
    peer_fs.pipe(
        f"{BUCKET}/tree-plain.zarr/g0/new/zarr.json",
        json.dumps(
            {
                "zarr_format": 3,
                "node_type": "array",
                "shape": [2],
                "data_type": "int8",
                "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [2]}},
                "chunk_key_encoding": {"name": "default"},
                "fill_value": 0,
                "codecs": [{"name": "bytes"}],
            }
        ).encode(),
    )
    while "new.npy" not in os.listdir(mnt / "g0") and time.perf_counter() - t0 < 60:
        time.sleep(0.2)
    print(
        f"{'fresh':11s} zarrfs {time.perf_counter() - t0:8.3f} s until a new array is listed (metadata_ttl default)",
        flush=True,
    )
    bench.unmount(mnt)


if __name__ == "__main__":
    sys.exit(main())
