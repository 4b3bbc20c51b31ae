"""Mounted tests: a mount reading an array that another mount of the same store replaces.

Two mounts of one local store per format: a writable one that replaces arrays (``cp`` over
``NAME.npy``, new arrays chunked by its ``chunks=`` option), and read-only ones, one with
``metadata_ttl=0``, one with the default TTL that a ``cat .zarrfs/refresh`` brings up to date.
After the TTL or the refresh a reader sees the new array (new chunk grid, data type, shape);
a file opened before the replacement reads the old bytes exactly or fails with ESTALE.

Expected values come from numpy (the values written) and zarr-python 3 reading the store.
"""

from __future__ import annotations

import errno
import os
import subprocess
import warnings
from pathlib import Path

import numpy as np
import pytest
import zarr

from support.oracles import npy_bytes, zarr_chunk_shape, zarr_value

FORMATS = [2, 3]
OLD_CHUNKS = (50, 50)
NEW_CHUNKS = (100, 100)  # the writable mount's `chunks=` for the arrays it creates
# What each replacement writes, from the old array's values: the same shape with other values,
# or another data type and shape.
CHANGES = {
    "chunks": lambda old: (old[::-1] * 3 + 1).astype(old.dtype),
    "dtype_shape": lambda old: np.linspace(-1.5, 2.5, old.size * 78 // 100).reshape(
        old.shape[0] * 6 // 10, old.shape[1] * 13 // 10
    ),
}
READERS = ["ttl0", "refresh"]
# Arrays of the open-file tests: large enough that reads far into the file miss the pages the
# kernel read ahead for the first read, so they reach the daemon.
BIG_SHAPE, BIG_OLD_CHUNKS = (1000, 1000), (250, 250)


def _old_values(shape: tuple[int, ...], seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(-(2**31), 2**31 - 1, size=shape, dtype=np.int32)


def _write(root: Path, fmt: int, path: str, values: np.ndarray, chunks: tuple[int, ...], **kw) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        group = zarr.open_group(os.fspath(root), mode="a", zarr_format=fmt)
        group.create_array(path, shape=values.shape, chunks=chunks, dtype=values.dtype, **kw)[...] = values


@pytest.fixture(scope="module")
def stores(module_mount, tmp_path_factory):
    """fmt -> (store root, writable mount, metadata_ttl=0 mount, default-TTL mount, old values by path)."""
    out = {}
    for fmt in FORMATS:
        root = tmp_path_factory.mktemp(f"replaced-v{fmt}") / "s.zarr"
        olds = {}
        for i, (change, reader) in enumerate((c, r) for c in CHANGES for r in READERS):
            path = f"g/{change}_{reader}"
            olds[path] = _old_values((100, 100), 100 * fmt + i)
            _write(root, fmt, path, olds[path], OLD_CHUNKS)
        if fmt == 3:  # shards of 50x50 read in part (inner chunks of 25x25)
            olds["g/sharded"] = _old_values((100, 100), 7)
            _write(root, fmt, "g/sharded", olds["g/sharded"], (25, 25), shards=OLD_CHUNKS)
        olds["v/x"] = _old_values((100, 100), 10 * fmt)
        _write(root, fmt, "v/x", olds["v/x"], OLD_CHUNKS)
        for i, change in enumerate(CHANGES):
            path = f"g/open_{change}"
            olds[path] = _old_values(BIG_SHAPE, 1000 * fmt + i)
            _write(root, fmt, path, olds[path], BIG_OLD_CHUNKS)
        writer = module_mount(root, "writable", "chunks=" + ",".join(map(str, NEW_CHUNKS)))
        ttl0 = module_mount(root, "metadata_ttl=0")
        default = module_mount(root)
        out[fmt] = (root, writer, ttl0, default, olds)
    return out


def _replace(writer: Path, path: str, values: np.ndarray, tmp_path: Path) -> None:
    """`cp` an NPY file of VALUES over the array at PATH through the writable mount."""
    src = tmp_path / "new.npy"
    np.save(src, values)
    subprocess.run(["cp", os.fspath(src), os.fspath(writer / f"{path}.npy")], check=True, timeout=60)


@pytest.mark.parametrize("fmt", FORMATS, ids=["v2", "v3"])
@pytest.mark.parametrize("change", list(CHANGES))
@pytest.mark.parametrize("reader", READERS)
def test_a_reader_sees_the_replacement_with_its_new_metadata(stores, fmt, change, reader, tmp_path):
    root, writer, ttl0, default, olds = stores[fmt]
    path = f"g/{change}_{reader}"
    mnt = ttl0 if reader == "ttl0" else default
    old = olds[path]
    assert (mnt / f"{path}.npy").read_bytes() == npy_bytes(old)  # read (and cached) before the change

    new = CHANGES[change](old)
    _replace(writer, path, new, tmp_path)
    assert zarr_chunk_shape(root, path) == NEW_CHUNKS  # the store holds the new grid
    stored = zarr_value(root, path)
    assert np.array_equal(stored, new) and stored.dtype == new.dtype

    if reader == "refresh":
        (mnt / ".zarrfs" / "refresh").read_bytes()
    want = npy_bytes(stored)
    assert os.stat(mnt / f"{path}.npy").st_size == len(want)
    got = (mnt / f"{path}.npy").read_bytes()
    assert got == want, f"{path} after the replacement: {len(got)} bytes, not np.save of the new values"
    assert (mnt / ".zarrfs" / "npy-f" / f"{path}.npy").read_bytes()[-8:] == np.asfortranarray(stored).tobytes("F")[-8:]


@pytest.mark.parametrize("fmt", FORMATS, ids=["v2", "v3"])
@pytest.mark.parametrize("change", list(CHANGES))
def test_a_file_opened_before_the_replacement_reads_the_old_bytes_or_estale(stores, fmt, change, tmp_path):
    root, writer, ttl0, _, olds = stores[fmt]
    path = f"g/open_{change}"
    old_bytes = npy_bytes(olds[path])
    file = ttl0 / f"{path}.npy"
    fd = os.open(file, os.O_RDONLY)
    try:
        assert os.pread(fd, 4096, 0) == old_bytes[:4096]
        new = CHANGES[change](olds[path])
        _replace(writer, path, new, tmp_path)
        new_bytes = npy_bytes(zarr_value(root, path))
        assert (ttl0 / f"{path}.npy").read_bytes() == new_bytes  # a new open: the new array
        # Offsets past what the kernel read ahead for the first read.
        for offset in (len(old_bytes) // 2, len(old_bytes) - 70_000, 3 << 20, 5000):
            try:
                got = os.pread(fd, 65536, offset)
            except OSError as e:
                assert e.errno == errno.ESTALE, f"read at {offset} of a file opened before: {e}"
                continue
            assert got == old_bytes[offset : offset + len(got)], f"read at {offset}: neither the old bytes nor ESTALE"
    finally:
        os.close(fd)
    assert (ttl0 / f"{path}.npy").read_bytes() == new_bytes


@pytest.mark.parametrize("fmt", FORMATS, ids=["v2", "v3"])
def test_views_follow_the_replacement(stores, fmt, tmp_path):
    from scipy.io import netcdf_file

    root, writer, ttl0, _, olds = stores[fmt]
    views = ttl0 / ".zarrfs"

    def nc_values() -> np.ndarray:
        with netcdf_file(views / "netcdf" / "v.nc", "r", mmap=False) as nc:
            return np.array(nc.variables["x"][:])

    def check(values: np.ndarray, chunk: tuple[int, int]) -> None:
        assert (views / "raw" / "v" / "x.raw").read_bytes() == values.tobytes()
        assert (views / "chunks" / "v" / "x" / "0.0.npy").read_bytes() == npy_bytes(values[: chunk[0], : chunk[1]])
        assert (views / "slice" / "v" / "x[3:9].npy").read_bytes() == npy_bytes(values[3:9])
        assert np.array_equal(nc_values(), values)

    check(olds["v/x"], OLD_CHUNKS)
    new = CHANGES["chunks"](olds["v/x"])
    _replace(writer, "v/x", new, tmp_path)
    stored = zarr_value(root, "v/x")
    assert np.array_equal(stored, new) and zarr_chunk_shape(root, "v/x") == NEW_CHUNKS
    check(stored, NEW_CHUNKS)


def test_a_sharded_array_replaced_is_read_with_its_new_metadata(stores, tmp_path):
    root, writer, ttl0, _, olds = stores[3]
    old = olds["g/sharded"]
    assert (ttl0 / "g" / "sharded.npy").read_bytes() == npy_bytes(old)
    _replace(writer, "g/sharded", CHANGES["chunks"](old), tmp_path)
    assert zarr_chunk_shape(root, "g/sharded") == NEW_CHUNKS
    assert (ttl0 / "g" / "sharded.npy").read_bytes() == npy_bytes(zarr_value(root, "g/sharded"))
