"""The disk cache of remote stores, mounted on moto's S3 server behind a request-counting proxy
(and on ``python -m http.server``, a store without ETags): remounts, bounds, freshness, crashes,
damaged entries, sharing, a full disk, modes. Request counts are asserted, never times."""

from __future__ import annotations

import json
import os
import re
import signal
import stat
import subprocess
import threading
import time
import urllib.parse
from pathlib import Path

import numpy as np
import pytest
import zarr

from benchmarks.latency_proxy import Proxy
from support import mounting, oracles
from support.http_server import HttpServer
from support.s3 import BUCKET, CREDENTIALS

SHAPE = (96, 96)
CHUNKS = (16, 16)  # 36 chunks of 2 KiB
# An S3 object's time is trusted as "not rewritten since the cache read it" only when it is this
# much older than that read (zarrfs' margin for clocks and one-second times, plus a little).
TRUST_AFTER_S = 6.0


def _value(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 1000, SHAPE).astype("<i8")


@pytest.fixture(scope="module")
def bucket(s3, tmp_path_factory):
    """Arrays in the bucket (dense `a`, sharded `s`, per store name); yields (fs, endpoint, values)."""
    endpoint, fs = s3
    local = tmp_path_factory.mktemp("dc-src")
    values = {}
    for name in ("remount", "fresh", "kill", "damage", "shared", "full", "modes", "bound"):
        root = zarr.open_group(str(local / f"{name}.zarr"), mode="w", zarr_format=3)
        x = _value(len(values))
        root.create_array("a", shape=SHAPE, chunks=CHUNKS, dtype=x.dtype)[:] = x
        s = root.create_array("s", shape=SHAPE, chunks=CHUNKS, shards=(48, 48), dtype=x.dtype)
        s[:] = x + 1
        values[name] = x
        fs.put(str(local / f"{name}.zarr"), f"{BUCKET}/{name}.zarr", recursive=True)
    uploaded[0] = time.time()
    return fs, endpoint, values, local


uploaded = [0.0]


def _trusted() -> None:
    """Wait until reads begin late enough after the upload that a listing's times prove the objects
    unchanged since (else each check reads them again, correctly but uselessly); the tests that
    need it run last, so this rarely waits."""
    time.sleep(max(0.0, uploaded[0] + TRUST_AFTER_S - time.time()))


def _opts(port: int, cache_dir: Path, *extra: str) -> list[str]:
    so = {"client_kwargs": {"endpoint_url": f"http://127.0.0.1:{port}"}, **CREDENTIALS}
    return ["storage_options=" + json.dumps(so), f"cache_dir={cache_dir}", *extra]


def _chunk_gets(proxy: Proxy, name: str) -> list[str]:
    """Paths of the GETs of chunk or shard objects of store NAME since the last reset."""
    return [p for m, p in proxy.requests if m == "GET" and f"/{name}.zarr/" in p and "/c/" in p]


def _lists(proxy: Proxy) -> int:
    return sum(1 for m, p in proxy.requests if m == "GET" and "list-type=2" in p)


def _object_gets(proxy: Proxy) -> int:
    """GETs of objects (whole or ranged), listings left out, since the last reset."""
    return sum(1 for m, p in proxy.requests if m == "GET" and "list-type=2" not in p)


def _stats(mnt: Path) -> dict:
    return json.loads((mnt / ".zarrfs" / "stats.json").read_bytes())


def _entry_files(cache_dir: Path) -> list[Path]:
    return sorted(p for p in (cache_dir / "entries").rglob("*") if p.is_file())


def _age(cache_dir: Path, seconds: float = 3600) -> None:
    """Make every entry look validated SECONDS ago (older than any TTL used here)."""
    past = time.time() - seconds
    for p in _entry_files(cache_dir):
        os.utime(p, (past, past))


def _du(path: Path) -> int:
    """Bytes the tree takes on disk, as `du` counts them (blocks, directories included)."""
    total = 0
    for top, dirs, files in os.walk(path):
        for name in [*dirs, *files, ""][:]:
            try:
                total += os.lstat(os.path.join(top, name)).st_blocks * 512 if name else 0
            except FileNotFoundError:
                pass
    return total + os.lstat(path).st_blocks * 512


def test_size_bound_under_a_stream_of_distinct_chunks(bucket, proxy, mount, tmp_path):
    _, _, values, _ = bucket
    cache = tmp_path / "cache"
    bound = 64 << 10
    mnt = mount(f"s3://{BUCKET}/bound.zarr", *_opts(proxy.port, cache, "disk_cache_size=64K"))
    peak = [0]
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], _du(cache))
            time.sleep(0.005)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        assert (mnt / "a.npy").read_bytes() == oracles.npy_bytes(values["bound"])  # about 3x the bound
        assert (mnt / "s.npy").read_bytes() == oracles.npy_bytes(values["bound"] + 1)
    finally:
        done.set()
        watcher.join()
    peak[0] = max(peak[0], _du(cache))
    stats = _stats(mnt)
    assert stats["disk_evictions"] > 0
    assert stats["disk_bytes"] <= bound
    # The stated slack: entries being written (one per store thread, 16 here, 8 KiB each at most),
    # and the directory's own files (itself, entries/, usage).
    assert peak[0] <= bound + 16 * 8192 + 3 * 4096, peak[0]


def test_kill_9_while_writing_entries_then_a_remount_reads_exact_bytes(bucket, s3, mount, tmp_path):
    _, endpoint, values, _ = bucket
    cache = tmp_path / "cache"
    slow = Proxy(urllib.parse.urlparse(endpoint).port, latency_s=0.05).start()
    try:
        src = f"s3://{BUCKET}/kill.zarr"
        mnt = mount(src, *_opts(slow.port, cache))
        pids = mount.records[-1].daemon_pids
        assert pids
        reader = subprocess.Popen(
            ["cat", str(mnt / "a.npy"), str(mnt / "s.npy")], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        assert mounting.wait_until(lambda: len(_entry_files(cache)) >= 8, 30)
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        reader.wait(30)
        mounting.unmount(mnt)
        # A writer that died leaves at worst a temporary file; plant one more, half-written.
        (cache / "entries" / ".tmp-999999-1").write_bytes(b"ZFSDC01\n" + b"\0" * 10)
        mnt = mount(src, *_opts(slow.port, cache))
        assert (mnt / "a.npy").read_bytes() == oracles.npy_bytes(values["kill"])
        assert (mnt / "s.npy").read_bytes() == oracles.npy_bytes(values["kill"] + 1)
        assert _stats(mnt)["disk_errors"] == 0
    finally:
        slow.stop()


def test_damaged_entries_are_dropped_read_again_and_logged(bucket, proxy, mount, tmp_path):
    _, _, values, local = bucket
    cache = tmp_path / "cache"
    src = f"s3://{BUCKET}/damage.zarr"
    mnt = mount(src, *_opts(proxy.port, cache))
    assert (mnt / "a.npy").read_bytes() == oracles.npy_bytes(values["damage"])
    mounting.unmount_and_wait(mount, mnt)
    # The entries of chunks (0, 0) and (1, 1): the files that end with those objects' bytes.
    objects = [(local / "damage.zarr" / "a" / "c" / i / j).read_bytes() for i, j in (("0", "0"), ("1", "1"))]
    truncated, flipped = [next(p for p in _entry_files(cache) if p.read_bytes().endswith(o)) for o in objects]
    with open(truncated, "r+b") as f:
        f.truncate(truncated.stat().st_size - 100)
    with open(flipped, "r+b") as f:
        f.seek(flipped.stat().st_size // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0x40]))
    proxy.reset_counts()
    mnt = mount(src, *_opts(proxy.port, cache))
    assert (mnt / "a.npy").read_bytes() == oracles.npy_bytes(values["damage"])
    assert len(_chunk_gets(proxy, "damage")) == 2
    damaged = [ln for ln in mount.log_text(mnt).splitlines() if " WARNING " in ln and "damaged" in ln]
    assert len(damaged) == 2, damaged
    assert any("checksum" in ln for ln in damaged) and any("were written" in ln for ln in damaged)
    assert sorted(ln.split("'")[1] for ln in damaged) == ["a/c/0/0", "a/c/1/1"]
    assert _stats(mnt)["disk_errors"] == 2


def test_two_mounts_share_one_cache_directory(bucket, proxy, mount, tmp_path):
    _, _, values, _ = bucket
    cache = tmp_path / "cache"
    src = f"s3://{BUCKET}/shared.zarr"
    m1 = mount(src, *_opts(proxy.port, cache, "disk_cache_size=160K"))
    m2 = mount(src, *_opts(proxy.port, cache, "disk_cache_size=160K"))
    want = {"a.npy": oracles.npy_bytes(values["shared"]), "s.npy": oracles.npy_bytes(values["shared"] + 1)}
    got: dict = {}

    def read(mnt: Path, tag: str) -> None:
        for _ in range(2):
            for name in want:
                try:
                    got[(tag, name, _)] = (mnt / name).read_bytes()
                except OSError as e:  # shown by the assertion below
                    got[(tag, name, _)] = e

    threads = [threading.Thread(target=read, args=(m, t)) for m, t in ((m1, "1"), (m2, "2"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wrong = {k: v if isinstance(v, OSError) else len(v) for k, v in got.items() if v != want[k[1]]}
    assert not wrong and len(got) == 8, wrong
    for m in (m1, m2):
        stats = _stats(m)
        assert stats["disk_errors"] == 0, (stats, mount.log_text(m)[-3000:])
    assert _du(cache / "entries") <= (160 << 10) + 2 * 16 * 8192, _du(cache / "entries")


def test_full_disk_under_the_cache_does_not_fail_reads(bucket, proxy, mount, tmp_path):
    _, _, values, _ = bucket
    small = tmp_path / "small"
    small.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(small)], check=True)
    try:
        cache = small / "cache"
        mnt = mount(f"s3://{BUCKET}/full.zarr", *_opts(proxy.port, cache, "disk_cache_size=1G"))
        assert (mnt / "a.npy").read_bytes() == oracles.npy_bytes(values["full"])
        assert (mnt / "s.npy").read_bytes() == oracles.npy_bytes(values["full"] + 1)
        assert _stats(mnt)["disk_errors"] > 0
        told = [ln for ln in mount.log_text(mnt).splitlines() if "No space left on device" in ln]
        assert len(told) == 1 and " WARNING " in told[0], told
        mounting.unmount_and_wait(mount, mnt)
    finally:
        if subprocess.run(["umount", str(small)]).returncode != 0:
            subprocess.run(["umount", "-l", str(small)])


def test_modes_and_names_keep_the_cache_private(bucket, proxy, mount, tmp_path):
    _, _, values, _ = bucket
    cache = tmp_path / "cache"
    mnt = mount(f"s3://{BUCKET}/modes.zarr", *_opts(proxy.port, cache))
    assert (mnt / "a.npy").read_bytes() == oracles.npy_bytes(values["modes"])
    assert (mnt / "s.npy").read_bytes() == oracles.npy_bytes(values["modes"] + 1)
    for p in [cache, *cache.rglob("*")]:
        mode = stat.S_IMODE(p.lstat().st_mode)
        assert mode == (0o700 if p.is_dir() else 0o600), (p, oct(mode))
        assert p.lstat().st_uid == os.geteuid()
    # Entry names are hashes: neither the bucket nor a key shows.
    names = [p.name.removesuffix(".parts") for p in (cache / "entries").iterdir()]
    assert names and all(len(n) == 64 and set(n) <= set("0123456789abcdef") for n in names)


def test_http_store_without_etags_remounts_from_disk_within_the_ttl(mount, tmp_path):
    docroot = tmp_path / "www"
    x = _value(99)
    root = zarr.open_group(str(docroot / "h.zarr"), mode="w", zarr_format=2)
    root.create_array("a", shape=SHAPE, chunks=CHUNKS, dtype=x.dtype)[:] = x
    log = tmp_path / "http.log"
    server = HttpServer(docroot, log)
    server.start()
    try:
        cache = tmp_path / "cache"
        opts = (f"cache_dir={cache}", "metadata_ttl=3600")

        def chunk_gets() -> int:
            return len(re.findall(r'"GET /h\.zarr/a/\d+\.\d+ ', log.read_text()))

        mnt = mount(server.url("h.zarr"), *opts)
        assert (mnt / "a.npy").read_bytes() == oracles.npy_bytes(x)
        mounting.unmount_and_wait(mount, mnt)
        first = chunk_gets()
        assert first == 36
        mnt = mount(server.url("h.zarr"), *opts)
        assert (mnt / "a.npy").read_bytes() == oracles.npy_bytes(x)
        assert chunk_gets() == first
    finally:
        server.stop()


def test_remount_reads_from_disk_then_revalidates_by_listing(bucket, proxy, mount, tmp_path):
    fs, _, values, _ = bucket
    cache = tmp_path / "cache"
    src = f"s3://{BUCKET}/remount.zarr"
    _trusted()
    want_a, want_s = oracles.npy_bytes(values["remount"]), oracles.npy_bytes(values["remount"] + 1)
    mnt = mount(src, *_opts(proxy.port, cache))
    assert (mnt / "a.npy").read_bytes() == want_a
    assert (mnt / "s.npy").read_bytes() == want_s
    assert _chunk_gets(proxy, "remount")  # the first mount read the store
    mounting.unmount_and_wait(mount, mnt)

    # Within the TTL: no chunk GET, no listing.
    proxy.reset_counts()
    mnt = mount(src, *_opts(proxy.port, cache))
    assert (mnt / "a.npy").read_bytes() == want_a
    assert (mnt / "s.npy").read_bytes() == want_s
    assert _chunk_gets(proxy, "remount") == []
    stats = _stats(mnt)
    assert stats["disk_hits"] > 0 and stats["disk_errors"] == 0
    assert stats["disk_cache_dir"] == str(cache)
    # stats.json tells the disk's answers from the store's: the chunks came from the disk, and
    # store_gets counts the GETs the server saw (documents, at most), not the chunks read.
    assert stats["chunk_gets"] >= 36, stats
    assert stats["store_gets"] == _object_gets(proxy), (stats, proxy.requests)
    mounting.unmount_and_wait(mount, mnt)

    # Past the TTL: one listing per array checks the entries; still no chunk GET.
    _age(cache)
    proxy.reset_counts()
    mnt = mount(src, *_opts(proxy.port, cache))
    assert (mnt / "a.npy").read_bytes() == want_a
    assert (mnt / "s.npy").read_bytes() == want_s
    assert _chunk_gets(proxy, "remount") == []
    # A few listings (two arrays, a shard's size, a listing asked again when a read outlives
    # its wait on a loaded machine), never one per chunk (each array has 36 or more).
    assert 1 <= _lists(proxy) <= 8, [p for m, p in proxy.requests if "list-type=2" in p]
    mounting.unmount_and_wait(mount, mnt)

    # zarrfs --clear-cache empties it: the next mount reads the store again.
    r = subprocess.run(
        [*mounting.ZARRFS, "--clear-cache", "-o", f"cache_dir={cache}"], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, r.stderr
    assert _entry_files(cache) == []
    proxy.reset_counts()
    mnt = mount(src, *_opts(proxy.port, cache))
    assert (mnt / "a.npy").read_bytes() == want_a
    assert len(_chunk_gets(proxy, "remount")) >= 36
    assert _stats(mnt)["store_gets"] == _object_gets(proxy)


def test_chunk_rewritten_by_another_client_is_read_again_after_the_ttl(bucket, proxy, mount, tmp_path):
    fs, _, values, local = bucket
    cache = tmp_path / "cache"
    src = f"s3://{BUCKET}/fresh.zarr"
    _trusted()
    mnt = mount(src, *_opts(proxy.port, cache))
    assert (mnt / "a.npy").read_bytes() == oracles.npy_bytes(values["fresh"])
    mounting.unmount_and_wait(mount, mnt)
    # Another client rewrites chunk (1, 2): zarr-python on a copy, that one object uploaded.
    arr = zarr.open_array(str(local / "fresh.zarr" / "a"), mode="r+")
    arr[16:32, 32:48] = -7
    fs.put_file(str(local / "fresh.zarr" / "a" / "c" / "1" / "2"), f"{BUCKET}/fresh.zarr/a/c/1/2")
    want = arr[...]

    proxy.reset_counts()
    mnt = mount(src, *_opts(proxy.port, cache))  # within the TTL: the kept bytes
    assert (mnt / "a.npy").read_bytes() == oracles.npy_bytes(values["fresh"])
    assert _chunk_gets(proxy, "fresh") == []
    mounting.unmount_and_wait(mount, mnt)

    _age(cache)
    proxy.reset_counts()
    mnt = mount(src, *_opts(proxy.port, cache))
    assert (mnt / "a.npy").read_bytes() == oracles.npy_bytes(want)
    assert _chunk_gets(proxy, "fresh") == [f"/{BUCKET}/fresh.zarr/a/c/1/2"]  # the new bytes, fetched once
    proxy.reset_counts()
    assert (mnt / "a.npy").read_bytes() == oracles.npy_bytes(want)
    mounting.unmount_and_wait(mount, mnt)
    proxy.reset_counts()
    mnt = mount(src, *_opts(proxy.port, cache))
    assert (mnt / "a.npy").read_bytes() == oracles.npy_bytes(want)
    assert _chunk_gets(proxy, "fresh") == []
