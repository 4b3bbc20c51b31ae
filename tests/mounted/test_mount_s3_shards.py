"""Sharded arrays on S3 (moto behind benchmarks/latency_proxy.py, which counts requests and bytes):
a sequential reader gets whole shards, one GET each; a random reader only the index and its inner chunk."""

from __future__ import annotations

import os
import subprocess

import numpy as np
import pytest
import zarr
from zarr.codecs import ZstdCodec

from support import oracles
from support.remote import s3_options
from support.s3 import BUCKET

SHAPE = (2048, 512)  # float32: 4 MiB, 16 shards of 4 inner chunks
SHARDS = (128, 512)
INNER = (32, 512)
# What each response adds to the bytes the proxy counts: the status line and headers
# (moto sends about 400 bytes).
HEADERS_NBYTES = 2048
# Per-shard index: (offset, nbytes) as two little-endian u64 per inner chunk, then its crc32c.
PER_SHARD = SHARDS[0] // INNER[0]
INDEX_NBYTES = 16 * PER_SHARD + 4


@pytest.fixture
def sharded(s3, tmp_path):
    """A v3 sharded float32 array of noise (stored about as large as it decodes) in the bucket:
    (its name, the values, the stored size of each shard by key)."""
    _, fs = s3
    values = np.random.default_rng(7).random(SHAPE, dtype=np.float32)
    local = tmp_path / "shards.zarr"
    root = zarr.open_group(str(local), mode="w", zarr_format=3)
    root.create_array("a", shape=SHAPE, shards=SHARDS, chunks=INNER, dtype="float32", compressors=[ZstdCodec(level=1)])[
        :
    ] = values
    name = f"shards-{tmp_path.name}.zarr"
    fs.put(str(local), f"{BUCKET}/{name}", recursive=True)
    stored = {
        p.relative_to(local / "a").as_posix(): p.stat().st_size for p in (local / "a" / "c").rglob("*") if p.is_file()
    }
    return name, values, stored


def _gets(proxy) -> list[str]:
    return [path for method, path in proxy.requests if method == "GET"]


def test_sequential_cat_fetches_each_shard_once(s3, proxy, sharded, mount):
    name, values, stored = sharded
    assert len(stored) == 16
    mnt = mount(f"s3://{BUCKET}/{name}", *s3_options(proxy.port))
    os.stat(mnt / "a.npy")  # metadata before counting
    proxy.reset_counts()
    out = subprocess.run(["cat", str(mnt / "a.npy")], stdout=subprocess.PIPE, check=True).stdout
    assert out == oracles.npy_bytes(values)
    gets = _gets(proxy)
    # Every shard fetched once, whole, the first too (cat's first read, 1 MiB at offset 0, is
    # a sequential start): no index request, no range of a shard fetched again whole.
    assert sorted(gets) == sorted(f"/{BUCKET}/{name}/a/{key}" for key in stored), "\n".join(gets)
    assert proxy.bytes_down <= sum(stored.values()) + HEADERS_NBYTES * len(gets), (
        proxy.bytes_down,
        sum(stored.values()),
        gets,
    )


def test_a_peek_at_the_header_fetches_no_whole_shard(s3, proxy, sharded, mount):
    """`head -c 4096` (a file manager reading a header; the kernel asks 16 KiB) fetches the first
    shard's index and its first inner chunk only, not the shard whole."""
    _, fs = s3
    name, values, stored = sharded
    mnt = mount(f"s3://{BUCKET}/{name}", *s3_options(proxy.port))
    os.stat(mnt / "a.npy")
    proxy.reset_counts()
    out = subprocess.run(["head", "-c", "4096", str(mnt / "a.npy")], stdout=subprocess.PIPE, check=True).stdout
    assert out == oracles.npy_bytes(values)[:4096]
    index = _shard_index(fs, f"{BUCKET}/{name}/a/c/0/0", PER_SHARD)
    gets = _gets(proxy)
    assert gets == [f"/{BUCKET}/{name}/a/c/0/0"] * 2, gets  # its index, then its first inner chunk
    asked = [n for p, n in proxy.ranges if p == f"/{BUCKET}/{name}/a/c/0/0"]
    assert len(asked) == 2 and sum(asked) <= INDEX_NBYTES + int(index[0][1]), (asked, index[0], stored["c/0/0"])


def _shard_index(fs, key: str, per_shard: int) -> np.ndarray:
    """(offset, nbytes) of each inner chunk, parsed from the shard's last bytes (index + crc32c)."""
    raw = fs.cat_file(key)
    return np.frombuffer(raw[-(16 * per_shard + 4) : -4], dtype="<u8").reshape(per_shard, 2)


def test_random_reads_fetch_the_index_and_their_inner_chunk(s3, proxy, sharded, mount):
    _, fs = s3
    name, values, _ = sharded
    mnt = mount(f"s3://{BUCKET}/{name}", *s3_options(proxy.port))
    path = mnt / "a.npy"
    header = len(oracles.npy_bytes(values)) - values.nbytes
    row_nbytes = SHAPE[1] * 4
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        # A sequential start, then reads far apart: each a page in the middle of an inner chunk.
        assert os.pread(fd, 1 << 20, 0) == oracles.npy_bytes(values)[: 1 << 20]
        for shard, inner in ((9, 2), (5, 1), (14, 3)):
            row = shard * SHARDS[0] + inner * INNER[0] + INNER[0] // 2
            offset = (header + row * row_nbytes) // 4096 * 4096
            proxy.reset_counts()
            got = os.pread(fd, 4096, offset)
            want = oracles.npy_bytes(values)[offset : offset + 4096]
            assert got == want
            index = _shard_index(fs, f"{BUCKET}/{name}/a/c/{shard}/0", PER_SHARD)
            gets = _gets(proxy)
            assert gets == [f"/{BUCKET}/{name}/a/c/{shard}/0"] * 2, gets  # its index, then its inner chunk
            # What was asked of this shard (other keys' answers may still be arriving on a busy machine).
            asked = [n for p, n in proxy.ranges if p == f"/{BUCKET}/{name}/a/c/{shard}/0"]
            assert len(asked) == 2 and sum(asked) <= INDEX_NBYTES + int(index[inner][1]), (asked, index[inner])
    finally:
        os.close(fd)


def test_cat_of_a_slice_of_a_sharded_array(s3, proxy, sharded, mount):
    """A sequential reader of a slice file of a remote sharded array: its reads take whole shards
    as the array's own file does, and its read-ahead (which reads whole shards ahead for a slice
    too) gives numpy's selection."""
    name, values, _ = sharded
    mnt = mount(f"s3://{BUCKET}/{name}", *s3_options(proxy.port))
    path = mnt / ".zarrfs" / "slice" / "a[100:1900:3].npy"
    out = subprocess.run(["cat", str(path)], stdout=subprocess.PIPE, check=True).stdout
    assert out == oracles.npy_bytes(values[100:1900:3])
