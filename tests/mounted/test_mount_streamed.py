"""Chunks far larger than the cache, read by several readers at once, through a real mount.

One chunk of 1 GiB (a pattern that compresses well, so the store stays small) under a
64 MiB cache, compressed with zstd and with blosc: four concurrent readers each get exactly
np.save's bytes, and the daemon's peak memory stays within the cache and a bounded margin,
because no chunk is ever decoded whole (engine/streamed.py).
"""

from __future__ import annotations

import json
import os
import threading
import zlib
from pathlib import Path

import numpy as np
import pytest

from support import mounting

CACHE_BYTES = 64 << 20
SHAPE = (16384, 65536)  # uint8: one chunk of 1 GiB
PERIOD = 251  # the values: arange % 251, whose bytes repeat every 251
READERS = 4
# What the daemon may use past its resident size after mounting: the cache, and a margin for
# the decoders (six windows of 8 MiB and their decompressors' state), the readers' replies
# and the kernel's reads in flight. A whole chunk decoded once would be 1024 MiB more.
MARGIN_BYTES = 150 << 20
READ_BYTES = 4 << 20  # each reader's reads (the kernel cuts them into its own)


def _pattern(start: int, stop: int) -> np.ndarray:
    """Elements [start, stop) of the array in C order (arange % PERIOD as uint8)."""
    shift, n = start % PERIOD, stop - start
    out = np.empty(n + shift + PERIOD, np.uint8)
    out[:PERIOD] = np.arange(PERIOD, dtype=np.uint8)
    filled = PERIOD
    while filled < len(out):  # (doubling copies: memory speed)
        more = min(filled, len(out) - filled)
        out[filled : filled + more] = out[:more]
        filled += more
    return out[shift : shift + n]


def _npy_header() -> bytes:
    """np.save's header for the array, from numpy's own writer."""
    import io

    header = np.lib.format.header_data_from_array_1_0(np.zeros((1, 1), np.uint8))
    header["shape"] = SHAPE
    out = io.BytesIO()
    np.lib.format.write_array_header_1_0(out, header)
    return out.getvalue()


def _crc32_of_file(path: str) -> int:
    """CRC-32 of a file read start to end (no Python lock held while reading or summing)."""
    crc = 0
    with open(path, "rb", buffering=0) as f:
        while data := f.read(READ_BYTES):
            crc = zlib.crc32(data, crc)
    return crc


def _write_array(root: Path, name: str, compressor, values: np.ndarray) -> None:
    """A zarr v2 array of one chunk: its metadata from zarr-python, its chunk encoded by numcodecs."""
    import zarr

    zarr.create_array(
        store=os.fspath(root),
        name=name,
        zarr_format=2,
        shape=SHAPE,
        chunks=SHAPE,
        dtype="u1",
        compressors=compressor,
        fill_value=0,
    )
    (root / name / "0.0").write_bytes(compressor.encode(values))


def _vm_hwm(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) << 10
    raise AssertionError("no VmHWM")


def _vm_rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) << 10
    raise AssertionError("no VmRSS")


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> tuple[Path, int]:
    """The store of both arrays, and the CRC-32 of np.save's bytes of their values."""
    import numcodecs

    root = tmp_path_factory.mktemp("streamed") / "big.zarr"
    values = _pattern(0, SHAPE[0] * SHAPE[1])
    _write_array(root, "zstd", numcodecs.Zstd(level=1), values)
    _write_array(root, "blosc", numcodecs.Blosc(cname="lz4", clevel=5, shuffle=numcodecs.Blosc.SHUFFLE), values)
    return root, zlib.crc32(values, zlib.crc32(_npy_header()))


@pytest.mark.parametrize("name", ["zstd", "blosc"])
def test_four_readers_of_a_1_gib_chunk_stay_within_the_cache(mount, store, name):
    """Four concurrent readers of one 1 GiB chunk under a 64 MiB cache: each reads np.save's
    bytes, and the daemon's peak resident memory grows by less than the cache and the margin."""
    root, expected = store
    mnt = mount(root, f"cache_size={CACHE_BYTES}")
    (pid,) = mounting.pids_serving(mnt)
    baseline = _vm_rss(pid)
    path = os.fspath(mnt / f"{name}.npy")
    sums: dict[int, int | str] = {}

    def reader(i: int) -> None:
        try:
            sums[i] = _crc32_of_file(path)
        except OSError as e:
            sums[i] = str(e)

    threads = [threading.Thread(target=reader, args=(i,)) for i in range(READERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(sums[i] == expected for i in range(READERS)), sums
    peak = _vm_hwm(pid)
    stats = json.loads((mnt / ".zarrfs" / "stats.json").read_text())
    assert peak - baseline < CACHE_BYTES + MARGIN_BYTES, (
        f"peak RSS {peak >> 20} MiB, {(peak - baseline) >> 20} MiB over the {baseline >> 20} MiB after mounting; "
        f"stats {stats}"
    )
    assert stats["oversize_loads"] == 0
