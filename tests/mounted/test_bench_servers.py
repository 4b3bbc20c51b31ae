"""The benchmark's reference servers serve exact bytes: benchmarks/empty_server.py, plain and with --array.

bench.py's `bound`, `gather` and `g*` rows say what zarrfs's reads could reach on the machine
at hand by timing `empty_server.py --array`, which gathers an array's `.npy` from its chunk
files with nothing else; a figure from a server that served other bytes would be no bound.
Mounts for real (root and /dev/fuse); the oracle is `numpy.save` of the values zarr-python
reads from the same store.
"""

from __future__ import annotations

import contextlib
import io
import mmap
import os
import random
import subprocess
import sys
from pathlib import Path

import numcodecs
import numpy as np
import pytest
import zarr
from zarr.codecs import BloscCodec, ZstdCodec

from support import BENCHMARKS, mounting

SERVER = BENCHMARKS / "empty_server.py"


@contextlib.contextmanager
def _serve(mnt: Path, options: list[str], sizes: tuple[int, ...] = ()):
    """The server mounted on MNT for the block: stopped and unmounted afterwards, whatever happens."""
    problem = mounting.check_fuse_available()
    if problem:
        pytest.fail(f"this test mounts: {problem}", pytrace=False)
    mnt.mkdir(exist_ok=True)
    proc = subprocess.Popen(
        [sys.executable, os.fspath(SERVER), *options, os.fspath(mnt), *map(str, sizes)],
        stdin=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        mounting.wait_until(lambda: mounting.is_mounted(mnt) or proc.poll() is not None, mounting.MOUNT_TIMEOUT_S)
        if not mounting.is_mounted(mnt):
            proc.terminate()
            pytest.fail(f"empty_server.py did not mount: {proc.communicate(timeout=mounting.EXIT_TIMEOUT_S)[1]}")
        yield
    finally:
        proc.terminate()
        try:
            proc.wait(mounting.EXIT_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if mounting.is_mounted(mnt):
            mounting.unmount(mnt)


def _npy(values: np.ndarray) -> bytes:
    f = io.BytesIO()
    np.save(f, values)
    return f.getvalue()


def _direct_reads_match(path: Path, want: bytes, rng: random.Random) -> None:
    """O_DIRECT reads (each reaches the server with its own offset and size) equal WANT's bytes."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    try:
        for _ in range(200):
            size = rng.choice([4096, 12288, 65536, 1 << 20])
            off = rng.randrange(0, len(want)) // 4096 * 4096
            buf = mmap.mmap(-1, size)  # page-aligned, as O_DIRECT wants
            got = os.preadv(fd, [buf], off)
            assert buf[:got] == want[off : off + size], (path.name, off, size)
    finally:
        os.close(fd)


def test_array_servers_serve_the_npy_of_zarr_values(tmp_path):
    rng = np.random.default_rng(7)
    stores = []

    def make(name, values, chunks, compressors, zarr_format, **kw):
        arr = zarr.create_array(
            store=os.fspath(tmp_path / name),
            shape=values.shape,
            chunks=chunks,
            dtype=values.dtype,
            compressors=compressors,
            zarr_format=zarr_format,
            **kw,
        )
        arr[...] = values
        stores.append(tmp_path / name)

    # rows not a whole number of chunks (edge chunks padded in their files), chunk rows narrower
    # than a page, every codec the server decodes, both formats and key separators
    make(
        "v2-none",
        rng.standard_normal((1000, 96)),
        (64, 32),
        None,
        2,
        chunk_key_encoding={"name": "v2", "separator": "/"},
    )
    make("v3-none", rng.integers(-999, 999, (333, 48)).astype("<i2"), (100, 16), None, 3)
    make(
        "v3-blosc",
        rng.standard_normal((777, 120)).astype("<f4"),
        (50, 40),
        [BloscCodec(cname="lz4", clevel=5, shuffle="shuffle")],
        3,
    )
    make("v3-zstd", rng.standard_normal((300, 64)).astype("<f4"), (128, 32), [ZstdCodec(level=1)], 3)
    make("v2-zstd", rng.standard_normal((300, 64)).astype("<f8"), (64, 64), numcodecs.Zstd(level=1), 2)
    make("v2-gzip", rng.integers(0, 255, (200, 300)).astype("u1"), (64, 100), numcodecs.GZip(level=1), 2)

    args = [x for s in stores for x in ("--array", os.fspath(s))]
    with _serve(tmp_path / "mnt", args):
        for i, store in enumerate(stores):
            want = _npy(zarr.open_array(os.fspath(store), mode="r")[...])
            path = tmp_path / "mnt" / f"f{i}"
            assert path.stat().st_size == len(want), store.name
            assert path.read_bytes() == want, store.name
            _direct_reads_match(path, want, random.Random(i))


def test_array_server_refuses_what_it_cannot_gather(tmp_path):
    bad = tmp_path / "bad"
    zarr.create_array(
        store=os.fspath(bad), shape=(10, 10), chunks=(5, 3), dtype="f4", zarr_format=3
    )  # 3 does not divide 10
    r = subprocess.run(
        [sys.executable, os.fspath(SERVER), "--array", os.fspath(bad), os.fspath(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode != 0 and "whole chunk columns" in r.stderr
    assert not mounting.is_mounted(tmp_path)


def test_empty_server_serves_zero_files_of_the_sizes_asked(tmp_path):
    with _serve(tmp_path / "mnt", [], (5000, 1048577)):
        assert (tmp_path / "mnt" / "f0").read_bytes() == bytes(5000)
        assert (tmp_path / "mnt" / "f1").read_bytes() == bytes(1048577)
