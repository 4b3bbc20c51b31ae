"""Remote stores behind a fault-injecting proxy (benchmarks/latency_proxy.py) in front of moto's S3 server:
bounded waits, recovery, request counts of consolidated listings, TTL between two mounts, refresh."""

from __future__ import annotations

import os
import subprocess
import time
import urllib.parse
from pathlib import Path

import numpy as np
import pytest
import zarr

from support import mounting, oracles
from support.remote import assert_recovers, put_v3, read_in_child, s3_options, serving
from support.s3 import BUCKET, CREDENTIALS

# The `timeout` the bounded-wait tests mount with, and what a reader may wait past it (a
# FUSE round trip, the daemon's scheduling on a loaded machine).
TIMEOUT_S = 3
MARGIN_S = 7


def test_silent_store_gives_eio_within_timeout_then_recovers(s3, proxy, tmp_path, mount):
    _, fs = s3
    mnt, values = serving(fs, tmp_path, mount, proxy, "silent.zarr", 1, 3, TIMEOUT_S)
    proxy.set_mode("silent")
    code, seconds, err = read_in_child(mnt / "g0" / "a1.npy", TIMEOUT_S + MARGIN_S)
    assert code is not None, f"the reader still waited after {TIMEOUT_S + MARGIN_S} s"
    assert code != 0 and "Input/output error" in err, err
    assert "did not answer" in mount.log_text() or "timed out" in mount.log_text()
    proxy.set_mode("pass")
    # No remount needed: back as soon as the store answers the request that timed out.
    assert_recovers(mnt, values, "g0/a1")


def test_refused_store_gives_eio_then_recovers(s3, proxy, tmp_path, mount):
    _, fs = s3
    mnt, values = serving(fs, tmp_path, mount, proxy, "refused.zarr", 1, 3, TIMEOUT_S)
    proxy.set_mode("refuse")
    code, _, err = read_in_child(mnt / "g0" / "a2.npy", TIMEOUT_S + MARGIN_S)
    assert code is not None and code != 0 and "Input/output error" in err, (code, err)
    assert (
        "connection refused" in mount.log_text()
        or "cannot connect" in mount.log_text()
        or "did not answer" in mount.log_text()
    )
    proxy.set_mode("pass")
    assert np.array_equal(np.load(mnt / "g0" / "a2.npy"), values["g0/a2"])


def test_silent_store_bounds_a_first_listing(s3, proxy, tmp_path, mount):
    _, fs = s3
    put_v3(fs, tmp_path, "silentls.zarr", 3, 2, consolidated=False)
    mnt = mount(f"s3://{BUCKET}/silentls.zarr", *s3_options(proxy.port, f"timeout={TIMEOUT_S}"))
    mount.expect_errors()
    proxy.set_mode("silent")
    proc = subprocess.Popen(["ls", str(mnt / "g1")], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        _, err = proc.communicate(timeout=TIMEOUT_S + MARGIN_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        pytest.fail(f"ls of a group not listed yet still waited after {TIMEOUT_S + MARGIN_S} s")
    assert proc.returncode != 0 and b"Input/output error" in err, err
    proxy.set_mode("pass")

    def listed() -> bool:
        try:
            return sorted(os.listdir(mnt / "g1")) == ["a0.npy", "a1.npy"]
        except OSError:  # until the store answers the listing that timed out
            return False

    assert mounting.wait_until(listed, 5)


@pytest.mark.parametrize("fmt_listing", ["ls -lR", "find"])
def test_consolidated_tree_costs_few_requests(s3, proxy, tmp_path, mount, fmt_listing):
    _, fs = s3
    values = put_v3(fs, tmp_path, f"cons-{fmt_listing[:2]}.zarr", 5, 12, consolidated=True)
    mnt = mount(f"s3://{BUCKET}/cons-{fmt_listing[:2]}.zarr", *s3_options(proxy.port))
    proxy.reset_counts()
    cmd = ["ls", "-lR", str(mnt)] if fmt_listing == "ls -lR" else ["find", str(mnt), "-name", "*.npy"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    assert all(f"a{a}.npy" in out for a in range(12))
    assert proxy.count() <= 10, proxy.requests
    # Sizes stat reports are the NPY files' sizes (logical), whatever the listing cost.
    for path, x in list(values.items())[:3]:
        assert os.stat(mnt / (path + ".npy")).st_size == len(oracles.npy_bytes(x))


def _writer_adds_array(mnt_w: Path, tmp_path: Path, name: str) -> np.ndarray:
    x = np.arange(30, dtype="<f8").reshape(5, 6) * 0.5
    src = tmp_path / f"{name}.npy"
    np.save(src, x)
    (mnt_w / "g0" / f"{name}.npy").write_bytes(src.read_bytes())
    return x


@pytest.mark.parametrize("consolidated", [False, True])
def test_reader_sees_writers_changes_within_ttl(s3, tmp_path, mount, consolidated):
    endpoint, fs = s3
    name = f"ttl{int(consolidated)}.zarr"
    values = put_v3(fs, tmp_path, name, 1, 2, consolidated=consolidated)
    port = urllib.parse.urlparse(endpoint).port
    reader = mount(f"s3://{BUCKET}/{name}", *s3_options(port, "metadata_ttl=1"))
    writer = mount(f"s3://{BUCKET}/{name}", *s3_options(port, "writable"))
    assert sorted(os.listdir(reader / "g0")) == ["a0.npy", "a1.npy"]
    assert np.array_equal(np.load(reader / "g0" / "a0.npy"), values["g0/a0"])
    x = _writer_adds_array(writer, tmp_path, "new")
    assert mounting.wait_until(lambda: "new.npy" in os.listdir(reader / "g0"), 20), os.listdir(reader / "g0")
    assert mounting.wait_until(lambda: (reader / "g0" / "new.npy").stat().st_size == len(oracles.npy_bytes(x)), 20)
    assert np.array_equal(np.load(reader / "g0" / "new.npy"), x)
    m = np.load(writer / "g0" / "a0.npy", mmap_mode="r+")
    m[0, :] = -7
    m.flush()
    del m
    want = values["g0/a0"].copy()
    want[0, :] = -7
    assert mounting.wait_until(lambda: np.array_equal(np.load(reader / "g0" / "a0.npy"), want), 20)


def test_refresh_shows_changes_at_once(s3, tmp_path, mount):
    endpoint, fs = s3
    values = put_v3(fs, tmp_path, "refresh.zarr", 1, 1, consolidated=False)
    port = urllib.parse.urlparse(endpoint).port
    reader = mount(f"s3://{BUCKET}/refresh.zarr", *s3_options(port, "metadata_ttl=inf"))
    assert os.listdir(reader / "g0") == ["a0.npy"]
    assert np.array_equal(np.load(reader / "g0" / "a0.npy"), values["g0/a0"])
    local = tmp_path / "other.zarr"
    z = zarr.open_group(str(local), mode="w", zarr_format=3)
    y = np.arange(6, dtype="<u2")
    z.create_array("b", shape=y.shape, chunks=(4,), dtype=y.dtype)[:] = y
    fs.put(str(local / "b"), f"{BUCKET}/refresh.zarr/g0/b", recursive=True)
    fs.pipe(f"{BUCKET}/refresh.zarr/g0/a0/c/0/0", fs.cat(f"{BUCKET}/refresh.zarr/g0/a0/c/1/1"))
    assert os.listdir(reader / "g0") == ["a0.npy"]  # trusted until refreshed
    (reader / ".zarrfs" / "refresh").read_bytes()
    assert sorted(os.listdir(reader / "g0")) == ["a0.npy", "b.npy"]
    assert np.array_equal(np.load(reader / "g0" / "b.npy"), y)
    oracle = zarr.open_array(
        store=f"s3://{BUCKET}/refresh.zarr/g0/a0",
        mode="r",
        storage_options={"client_kwargs": {"endpoint_url": endpoint}, **CREDENTIALS},
    )[...]
    assert not np.array_equal(oracle, values["g0/a0"])
    assert np.array_equal(np.load(reader / "g0" / "a0.npy"), oracle)


def test_plain_tree_costs_one_listing_per_group_and_one_get_per_node(s3, proxy, tmp_path, mount):
    """Without consolidated metadata `ls -lR` costs one delimiter listing per directory and one GET
    of each node's document (fetched concurrently); no request per node for its time or size."""
    _, fs = s3
    groups, arrays = 3, 10
    put_v3(fs, tmp_path, "plain-count.zarr", groups, arrays, consolidated=False)
    mnt = mount(f"s3://{BUCKET}/plain-count.zarr", *s3_options(proxy.port))
    proxy.reset_counts()
    out = subprocess.run(["ls", "-lR", str(mnt)], check=True, capture_output=True, text=True).stdout
    assert out.count(".npy") == groups * arrays
    listings = 1 + groups  # the root was listed at mount; again if the TTL ran out meanwhile
    gets = groups + groups * arrays  # each node's zarr.json
    small = 6  # the root's document and listing again, the bucket's region
    assert proxy.count() <= listings + gets + small, sorted(proxy.requests)
    assert proxy.count("HEAD") <= small, [r for r in proxy.requests if r[0] == "HEAD"]


# zarrfs keeps a cached chunk on the strength of its stored time only if it was written this long
# before it was read (engine/revalidate.py FETCH_MARGIN_S); the test's chunks are older than that.
WRITTEN_BEFORE_S = 5.5


def test_cached_chunks_are_revalidated_after_the_ttl_not_read_again(s3, proxy, tmp_path, mount):
    endpoint, fs = s3
    values = put_v3(fs, tmp_path, "reval.zarr", 1, 2, consolidated=False)
    time.sleep(WRITTEN_BEFORE_S)
    reader = mount(f"s3://{BUCKET}/reval.zarr", *s3_options(proxy.port, "metadata_ttl=1"))
    writer = mount(f"s3://{BUCKET}/reval.zarr", *s3_options(urllib.parse.urlparse(endpoint).port, "writable"))
    want = oracles.npy_bytes(values["g0/a0"])
    assert (reader / "g0" / "a0.npy").read_bytes() == want
    time.sleep(1.5)  # past the TTL
    proxy.reset_counts()
    assert (reader / "g0" / "a0.npy").read_bytes() == want
    chunk_gets = [p for m, p in proxy.requests if m == "GET" and "/g0/a0/c/" in p]
    assert chunk_gets == [], proxy.requests  # checked by a listing, not read again
    assert sum(1 for m, p in proxy.requests if "list-type=2" in p) <= 3, proxy.requests
    m = np.load(writer / "g0" / "a0.npy", mmap_mode="r+")
    m[0, :] = -7  # chunks (0, 0) and (0, 1) rewritten by another client
    m.flush()
    del m
    expected = values["g0/a0"].copy()
    expected[0, :] = -7
    assert mounting.wait_until(lambda: (reader / "g0" / "a0.npy").read_bytes() == oracles.npy_bytes(expected), 20)
