"""One read(2), one version of each chunk it covers, on a remote mount whose chunks another writer rewrites.

Each test makes the race it is about happen on purpose (an S3 server on loopback, a rewrite by
zarr-python, the latency proxy slowing one request across a TTL's start); the oracle is the
array's values as zarr-python wrote them. Timing sets the stage, no assertion is on a time.
"""

from __future__ import annotations

import os
import time
import urllib.parse

import numpy as np
import zarr

from support import oracles
from support.remote import s3_options
from support.s3 import BUCKET, CREDENTIALS

CHUNK = 1 << 18  # float32 elements of a chunk: 1 MiB, the kernel's largest request
CHUNKS = 4
HEADER = 128  # the .npy header zarrfs writes for a 1-d float32 array
PAGE = 4096


def _array(endpoint: str, name: str, create: bool = False):
    so = {"client_kwargs": {"endpoint_url": endpoint}, **CREDENTIALS}
    url = f"s3://{BUCKET}/{name}/a"
    if not create:
        return zarr.open_array(url, mode="r+", storage_options=so)
    arr = zarr.create_array(
        url,
        shape=(CHUNK * CHUNKS,),
        chunks=(CHUNK,),
        dtype="<f4",
        compressors=None,
        storage_options=so,
        overwrite=True,
    )
    arr[...] = np.arange(CHUNK * CHUNKS, dtype="<f4")
    return arr


def _versions(data: bytes, offset: int) -> dict[int, set[str]]:
    """Per chunk the read covers, which of its versions (old: arange, new: negated) its elements
    hold (`neither`: an element of no version)."""
    first = (offset - HEADER) // 4
    vals = np.frombuffer(data, "<f4")
    idx = np.arange(first, first + len(vals))
    old, new = vals == idx, vals == -idx
    chunk = idx // CHUNK
    out: dict[int, set[str]] = {}
    for c in np.unique(chunk):
        m = chunk == c
        out[int(c)] = {k for k, hit in (("old", old[m]), ("new", new[m]), ("neither", ~(old | new)[m])) if hit.any()}
    return out


def test_held_descriptor_drops_pages_of_a_chunk_rewritten_before_the_ttl(s3, mount):
    """Pages the kernel kept for a descriptor held open are dropped at its first read after the
    TTL (the time of the file changes, auto_inval_data), not answered from the old chunk."""
    endpoint, _ = s3
    arr = _array(endpoint, "held.zarr", create=True)
    x = arr[...]
    mnt = mount(f"s3://{BUCKET}/held.zarr", *s3_options(urllib.parse.urlparse(endpoint).port, "metadata_ttl=1"))
    fd = os.open(mnt / "a.npy", os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        assert os.pread(fd, size, 0) == oracles.npy_bytes(x)  # every page kept by the kernel
        arr[CHUNK : 2 * CHUNK] = -np.arange(CHUNK, 2 * CHUNK, dtype="<f4")
        x[CHUNK : 2 * CHUNK] *= -1
        time.sleep(1.5)  # past the TTL: no other reader asks the mount anything meanwhile
        assert os.pread(fd, size, 0) == oracles.npy_bytes(x)
    finally:
        os.close(fd)


def test_a_read_of_pages_kept_and_pages_asked_for_shows_one_version(s3, mount):
    """A buffered read(2) that finds one page of a chunk in the kernel's cache and asks the mount for
    the next: the TTL runs out between the kernel's last GETATTR and that read. The kernel keeps a
    file's attributes (and pages) no longer than the mount's TTL, so it asks again before copying
    the kept page, the chunk's new version drops it, and the read shows one version. (Without
    that, the kept page is the old version and the page asked for the new one.)"""
    endpoint, _ = s3
    arr = _array(endpoint, "kept.zarr", create=True)
    port = urllib.parse.urlparse(endpoint).port
    mnt = mount(f"s3://{BUCKET}/kept.zarr", *s3_options(port, "metadata_ttl=2", "disk_cache_size=0"))
    fd = os.open(mnt / "a.npy", os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)  # the kernel reads only the pages asked for
        time.sleep(2.5)  # the attributes the open brought are out of date
        (mnt / ".zarrfs" / "refresh").read_bytes()  # the TTL starts now
        started = time.monotonic()
        page = CHUNK * 4 + PAGE  # the second page of chunk 1
        assert os.pread(fd, PAGE, page) == np.arange(CHUNK + 992, CHUNK + 2016, dtype="<f4").tobytes()
        arr[CHUNK : 2 * CHUNK] = -np.arange(CHUNK, 2 * CHUNK, dtype="<f4")
        time.sleep(max(0.0, started + 0.5 - time.monotonic()))
        os.stat(mnt / "a.npy")  # the kernel asks for the attributes again, 0.5 s into the TTL
        time.sleep(max(0.0, started + 2.2 - time.monotonic()))
        data = os.pread(fd, 2 * PAGE, page)  # the kept page, and the next one asked for
        seen = _versions(data, page)
        assert seen in ({1: {"old"}}, {1: {"new"}}), seen
    finally:
        os.close(fd)
