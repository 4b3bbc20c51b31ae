"""Mounted: on a read-only mount of a local store, chunks a sequential reader has passed give their
buffers to the next decodes (engine/spares.py). Whatever readers run at once (sequential readers
of one file and of other views, random readers holding chunk views for their replies), every
byte equals np.save's of what zarr-python reads; writable mounts keep the usual decode."""

import json
import os
import random
import threading

import numcodecs
import numpy as np
import zarr

from support.oracles import npy_bytes, npy_f_bytes

VIEWS = ".zarrfs"
# A small cache keeps the read-ahead short (a quarter of the cache), so that readers pass
# chunks while later ones are still to be decoded.
SMALL_CACHE = "cache_size=8M"


def stats(mnt):
    return json.loads((mnt / VIEWS / "stats.json").read_bytes())


def make(root, zarr_format):
    """Three arrays of 256 KiB chunks (blosc in v2 and v3, zstd in v3): {name: value}."""
    rng = np.random.default_rng(zarr_format)
    values = {}
    codecs = {
        "blosc": zarr.codecs.BloscCodec(cname="lz4", shuffle="shuffle")
        if zarr_format == 3
        else numcodecs.Blosc(cname="lz4", clevel=5, shuffle=numcodecs.Blosc.SHUFFLE)
    }
    if zarr_format == 3:
        codecs["zstd"] = zarr.codecs.ZstdCodec(level=1)
    for name, codec in codecs.items():
        value = (rng.standard_normal((1536, 1024)) * 100).round().astype("<f4")  # compresses, a little
        zarr.create_array(
            store=os.fspath(root),
            name=name,
            shape=value.shape,
            dtype=value.dtype,
            chunks=(256, 256),
            zarr_format=zarr_format,
            compressors=[codec],
        )[...] = value
        values[name] = value
    return values


def test_passed_chunks_lend_their_buffers_and_bytes_stay_exact(mount, tmp_path):
    for zarr_format in (2, 3):
        root = tmp_path / f"v{zarr_format}.zarr"
        values = make(root, zarr_format)
        mnt = mount(root, SMALL_CACHE)
        for name, value in values.items():
            assert (mnt / f"{name}.npy").read_bytes() == npy_bytes(value), name
        assert stats(mnt)["buffers_reused"] > 0


def test_readers_at_once_never_see_a_reused_buffer(mount, tmp_path):
    """Two sequential readers of one file, one of its F view, and random readers of small
    pieces (replied from views of cached chunks) at once, again and again."""
    root = tmp_path / "c.zarr"
    value = make(root, 3)["blosc"]
    mnt = mount(root, SMALL_CACHE)
    want, want_f = npy_bytes(value), npy_f_bytes(value)
    failures = []

    def sequential(path, expected, size):
        for _ in range(3):
            fd = os.open(path, os.O_RDONLY | os.O_DIRECT)  # each read reaches the daemon
            with open(fd, "rb", buffering=0) as f:
                got = b"".join(iter(lambda: f.read(size), b""))
            if got != expected:
                failures.append(path)

    def random_reads(seed):
        rng = random.Random(seed)
        fd = os.open(mnt / "blosc.npy", os.O_RDONLY | os.O_DIRECT)
        with open(fd, "rb", buffering=0) as f:
            for _ in range(600):
                off, n = rng.randrange(len(want)), rng.randrange(1, 5000)
                f.seek(off)
                if f.read(n) != want[off : off + n]:
                    failures.append(("random", off, n))

    threads = [
        threading.Thread(target=sequential, args=(mnt / "blosc.npy", want, 1 << 20)),
        threading.Thread(target=sequential, args=(mnt / "blosc.npy", want, 3 << 20)),
        threading.Thread(target=sequential, args=(mnt / VIEWS / "npy-f" / "blosc.npy", want_f, 1 << 20)),
        threading.Thread(target=random_reads, args=(1,)),
        threading.Thread(target=random_reads, args=(2,)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not failures, failures[:5]
    assert stats(mnt)["buffers_reused"] > 0


def test_uncompressed_chunks_are_read_into_given_back_buffers(mount, tmp_path):
    """Chunks stored as their bytes (read straight from their files in C order) are loaded for
    the F view of a 3-d array, whose copies transpose: they are read into buffers given back.
    (A 2-d array's F view copies them from their files into its bands, test_mount_bands.py.)"""
    root = tmp_path / "u.zarr"
    value = np.random.default_rng(9).standard_normal((6, 256, 1024)).astype("<f4")
    zarr.create_array(
        store=os.fspath(root), name="u", shape=value.shape, dtype=value.dtype, chunks=(1, 256, 256), compressors=None
    )[...] = value
    mnt = mount(root, SMALL_CACHE)
    for _ in range(2):  # the second pass loads its chunks again, into the buffers the first gave back
        fd = os.open(mnt / VIEWS / "npy-f" / "u.npy", os.O_RDONLY | os.O_DIRECT)
        with open(fd, "rb", buffering=0) as f:
            assert b"".join(iter(lambda: f.read(1 << 20), b"")) == npy_f_bytes(value)
    assert stats(mnt)["buffers_reused"] > 0
    assert (mnt / "u.npy").read_bytes() == npy_bytes(value)


def test_writable_mounts_decode_as_before(mount, tmp_path):
    root = tmp_path / "w.zarr"
    values = make(root, 3)
    mnt = mount(root, SMALL_CACHE, "writable")
    for name, value in values.items():
        assert (mnt / f"{name}.npy").read_bytes() == npy_bytes(value), name
    assert stats(mnt)["buffers_reused"] == 0
