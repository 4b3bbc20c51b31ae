"""Mounting http:// sources served by ``python -m http.server``: consolidated metadata and plain directory listings."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import warnings
import zlib

import numpy as np
import pytest

from benchmarks.latency_proxy import Proxy
from support import builders, mounting, oracles
from support.http_server import HttpServer

# What zarrfs opens at most to a web server at once (remote.HTTP_CONNECTIONS).
HTTP_CONNECTIONS = 6  # zarrfs/storage/remote.py


@pytest.fixture(scope="module")
def served(tmp_path_factory, hierarchy_factory):
    """An http.server over copies of the test hierarchies; yields (server, {name: Hierarchy})."""
    root = tmp_path_factory.mktemp("http")
    docroot = root / "www"
    docroot.mkdir()
    stores = {}
    for fmt in (2, 3):
        plain = hierarchy_factory(fmt)
        shutil.copytree(plain.root, docroot / f"plain_v{fmt}.zarr")
        stores[f"plain_v{fmt}"] = plain
        # zarr-python 3 cannot see groups that have no metadata document, so the
        # consolidated stores are built without them.
        full = hierarchy_factory(fmt, implied=False)
        shutil.copytree(full.root, docroot / f"consolidated_v{fmt}.zarr")
        builders.consolidate(docroot / f"consolidated_v{fmt}.zarr", fmt)
        stores[f"consolidated_v{fmt}"] = full
    builders.build_root_array(docroot / "temps.zarr", 3)
    server = HttpServer(docroot, root / "http.server.log")
    server.start()
    try:
        yield server, stores
    finally:
        server.stop()


STORES = ["plain_v2", "plain_v3", "consolidated_v2", "consolidated_v3"]


def _check_mounted_hierarchy(h: builders.Hierarchy, mnt) -> list[str]:
    problems = []
    dirs, files = set(), set()
    for top, _dirnames, filenames in os.walk(mnt):
        rel = os.path.relpath(top, mnt)
        dirs.add("" if rel == "." else rel)
        files.update(os.path.join("" if rel == "." else rel, f) for f in filenames)
    if dirs != set(h.all_groups()):
        problems.append(
            f"directories: extra {sorted(dirs - set(h.all_groups()))}, missing {sorted(set(h.all_groups()) - dirs)}"
        )
    want_files = {a + ".npy" for a in h.arrays}
    if files != want_files:
        problems.append(f"files: extra {sorted(files - want_files)}, missing {sorted(want_files - files)}")
    for path in h.arrays:
        p = mnt / (path + ".npy")
        expected = h.expected(path).npy
        try:
            size = os.stat(p).st_size
            data = p.read_bytes()
        except OSError as exc:
            problems.append(f"{path}: {exc!r}")
            continue
        if size != len(expected):
            problems.append(f"{path}: st_size {size}, want {len(expected)}")
        if data != expected:
            problems.append(f"{path}: contents differ from np.save bytes")
            continue
        rng = np.random.default_rng(zlib.crc32(path.encode()))
        with open(p, "rb", buffering=0) as f:
            for _ in range(8):
                off = int(rng.integers(0, len(expected) + 10))
                n = int(rng.integers(0, 70_000))
                if os.pread(f.fileno(), n, off) != expected[off : off + n]:
                    problems.append(f"{path}: pread({n}, {off}) differs")
                    break
    for group in h.all_groups():
        if sorted(os.listdir(mnt / group if group else mnt)) != h.listing(group):
            problems.append(f"listing of {group!r} differs")
    return problems


@pytest.mark.parametrize("store", STORES)
def test_http_store_reads_like_local(mount, served, store):
    server, stores = served
    h = stores[store]
    mnt = mount(server.url(f"{store}.zarr"))
    problems = _check_mounted_hierarchy(h, mnt)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("store", STORES)
def test_http_store_xattrs(mount, served, store):
    import json

    server, stores = served
    h = stores[store]
    mnt = mount(server.url(f"{store}.zarr"))
    for path in ["top", "dtypes/float64", "codecs/zstd", "fill/scalar_0d"]:
        e = h.expected(path)
        p = mnt / (path + ".npy")
        assert json.loads(os.getxattr(p, "user.zarr.attributes")) == e.attributes
        assert json.loads(os.getxattr(p, "user.zarr.shape")) == e.shape
        assert json.loads(os.getxattr(p, "user.zarr.dtype")) == e.descr
        assert json.loads(os.getxattr(p, "user.zarr.chunks")) == e.chunks
    for group, attrs in h.groups.items():
        assert json.loads(os.getxattr(mnt / group if group else mnt, "user.zarr.attributes")) == attrs


@pytest.mark.parametrize("fmt", [2, 3], ids=["v2", "v3"])
def test_local_consolidated_store(mount, served, fmt):
    """The same consolidated stores read from disk rather than over HTTP."""
    server, stores = served
    h = stores[f"consolidated_v{fmt}"]
    mnt = mount(server.directory / f"consolidated_v{fmt}.zarr")
    problems = _check_mounted_hierarchy(h, mnt)
    assert not problems, "\n".join(problems)


def test_http_root_array(mount, served):
    server, _ = served
    e = oracles.expected_for(server.directory / "temps.zarr", "")
    mnt = mount(server.url("temps.zarr"))
    assert os.listdir(mnt) == ["temps.npy"]
    assert (mnt / "temps.npy").read_bytes() == e.npy


def test_http_missing_source_is_a_user_error(served, tmp_path):
    server, _ = served
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    code, stdout, stderr, was_mounted = mounting.run_expecting_failure(
        [*mounting.ZARRFS, server.url("no_such_store.zarr"), str(mnt)], mnt, tmp_path
    )
    assert not was_mounted
    lines = stderr.splitlines()
    assert code != 0
    assert "Traceback" not in stderr + stdout
    assert len(lines) == 1 and lines[0].startswith("zarrfs: "), stderr


def test_http_server_ignoring_range_gets_whole_shards(mount, served):
    """python -m http.server answers a ranged GET with the whole object: once zarrfs sees
    that, it reads shards whole instead of fetching the whole shard once per inner chunk.
    The server's own request log counts the GETs."""
    import zarr

    server, _ = served
    root = server.directory / "sharded_big.zarr"
    zarr.open_group(str(root), mode="w", zarr_format=3)
    arr = zarr.create_array(
        str(root), name="s", shape=(512, 512), dtype="<f4", shards=(256, 256), chunks=(32, 32), zarr_format=3
    )
    value = np.random.default_rng(5).normal(size=(512, 512)).astype("<f4")
    arr[:] = value
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # consolidated metadata is not in the v3 spec (zarr says so)
        zarr.consolidate_metadata(str(root))

    def shard_gets() -> int:  # GETs of shard keys that the server answered (listings aside)
        text = server.log_path.read_text(errors="replace")
        return len(re.findall(r'"GET /sharded_big\.zarr/s/c/\d+/\d+ HTTP/1\.[01]" 200 ', text))

    mnt = mount(server.url("sharded_big.zarr"))
    before = shard_gets()
    # Small reads in 16 different inner chunks, one after the other; each kernel page of
    # the file holds two rows, so each read touches shards (0, 0) and (0, 1).
    fd = os.open(mnt / "s.npy", os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        hlen = os.fstat(fd).st_size - value.nbytes
        for k in range(16):
            row, col = 32 * (k // 2) + 5, 32 * (k % 2 * 4) + 7
            assert os.pread(fd, 4, hlen + (row * 512 + col) * 4) == value[row, col].tobytes()
    finally:
        os.close(fd)
    # Per shard, the index and one part come back whole; then the shard is read whole once
    # and serves every other read. Parts of it would cost a whole shard each (18 GETs).
    assert shard_gets() - before <= 2 * 3, shard_gets() - before
    assert "ignores Range requests" in mount.log_text()
    assert np.array_equal(np.load(mnt / "s.npy"), value)


def test_plain_listing_over_http_keeps_to_a_few_connections(mount, served, tmp_path):
    """`ls -lR` of 60 arrays without consolidated metadata: one GET per document and per directory
    page, never more than HTTP_CONNECTIONS connections at once (counted by a proxy between
    zarrfs and the server). Unbounded, the documents of a group were asked all at once: most
    connections of such a burst wait for a SYN retransmit behind http.server's backlog of 5,
    and the listing of 2,000 arrays took 566 s."""
    import zarr

    server, _ = served
    root = server.directory / "many.zarr"
    zarr.open_group(str(root), mode="w", zarr_format=3)
    names = {f"g{g}": [f"a{a}.npy" for a in range(30)] for g in range(2)}
    for g, files in names.items():
        for f in files:
            zarr.create_array(str(root), name=f"{g}/{f[:-4]}", shape=(4,), dtype="<i2", zarr_format=3)
    proxy = Proxy(server.port).start()
    try:
        mnt = mount(f"http://127.0.0.1:{proxy.port}/many.zarr")
        proxy.reset_counts()
        out = subprocess.run(["ls", "-lR", str(mnt)], capture_output=True, text=True, timeout=120, check=True).stdout
        assert all(f in out for files in names.values() for f in files), out
        # The proxy counts a connection from its accept until the server's close is read, a moment
        # longer than zarrfs holds it (7-9 seen; 144-168 before the bound).
        assert proxy.open_peak <= 2 * HTTP_CONNECTIONS, proxy.open_peak
        documents = [p for m, p in proxy.requests if p.endswith("/zarr.json")]
        assert len(documents) == len(set(documents)) == 60 + 2, sorted(documents)  # the arrays' and the groups'
    finally:
        proxy.stop()
