"""Other writers' quirks through a real mount, and a failing key's place in the log.

One store, written by hand as those writers wrote it, mounted once for the module:
`gzip` chunks that are zlib streams (an early C++ writer), fill values old zarr-python 2
releases wrote for bytes arrays, and a corrupt chunk read many times.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest

import mounted

pytestmark = pytest.mark.log_errors_expected  # the corrupt chunk's read fails on purpose

ZARR218_PYTHON = Path("/work/main/.venv-zarr218/bin/python")

# A (6, 5) int32 array in (2, 5) chunks: row 0 is zlib at level 1 (header 78 01), row 1 zlib
# at the default level (78 9c), row 2 zlib at level 9 (78 da); row 3 the writer left out.
GZ_SHAPE, GZ_CHUNKS = (8, 5), (2, 5)
GZ_STREAMS = {0: lambda b: zlib.compress(b, 1), 1: lambda b: zlib.compress(b), 2: lambda b: zlib.compress(b, 9)}
CORRUPT_KEY = "corrupt/1"
READS_OF_CORRUPT = 50


def _write_v2(root: Path, name: str, dtype, shape, chunks, fill, compressor, chunks_bytes: dict) -> None:
    (root / name).mkdir(parents=True)
    doc = {"zarr_format": 2, "shape": list(shape), "chunks": list(chunks), "dtype": dtype,
           "compressor": compressor, "fill_value": fill, "order": "C", "filters": None}
    (root / name / ".zarray").write_text(json.dumps(doc))
    for key, data in chunks_bytes.items():
        (root / name / key).write_bytes(data)


def build_store(root: Path) -> dict:
    """The store and the values each array's writer meant (array path -> ndarray)."""
    root.mkdir(parents=True)
    (root / ".zgroup").write_text('{"zarr_format": 2}')
    want = {}

    values = np.arange(np.prod(GZ_SHAPE), dtype="<i4").reshape(GZ_SHAPE) * 7 - 50
    chunks = {f"{row}.0": stream(values[2 * row:2 * row + 2].tobytes()) for row, stream in GZ_STREAMS.items()}
    values[6:] = 3  # the fill value
    _write_v2(root, "zlib_as_gzip", "<i4", GZ_SHAPE, GZ_CHUNKS, 3, {"id": "gzip", "level": 1}, chunks)
    want["zlib_as_gzip"] = values

    # Beside it, real gzip chunks, and one of them a zlib stream: each chunk read as it is.
    mixed = np.arange(20, dtype="<f8").reshape(4, 5) / 4
    _write_v2(root, "mixed_gzip", "<f8", (4, 5), (2, 5), 0.0, {"id": "gzip", "level": 5},
              {"0.0": gzip.compress(mixed[:2].tobytes()), "1.0": zlib.compress(mixed[2:].tobytes())})
    want["mixed_gzip"] = mixed

    corrupt = np.arange(8, dtype="<f4")
    _write_v2(root, "corrupt", "<f4", (8,), (4,), 0.0, {"id": "zlib", "level": 1},
              {"0": zlib.compress(corrupt[:4].tobytes()), "1": b"\x78\x9cnot a zlib stream at all"})
    return want


@pytest.fixture(scope="module")
def quirks(module_mount, tmp_path_factory):
    root = tmp_path_factory.mktemp("quirks") / "store.zarr"
    want = build_store(root)
    return root, module_mount(root, "show_views"), want


def _read(path: Path) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def test_gzip_chunks_that_are_zlib_read_as_the_writer_meant(quirks, module_mount):
    root, mnt, want = quirks
    assert _read(mnt / "zlib_as_gzip.npy") == mounted.npy_bytes(want["zlib_as_gzip"])
    assert _read(mnt / ".zarrfs/raw/zlib_as_gzip.raw") == want["zlib_as_gzip"].tobytes()
    lines = [ln for ln in mounted.log_lines_naming(module_mount.log_text(mnt), "zlib_as_gzip/.zarray")
             if "zlib" in ln]
    assert len(lines) == 1, lines  # said once for the array, not once per chunk or read


def test_gzip_and_zlib_chunks_side_by_side(quirks):
    root, mnt, want = quirks
    assert _read(mnt / "mixed_gzip.npy") == mounted.npy_bytes(want["mixed_gzip"])


def test_failing_key_logged_once_and_counted(quirks, module_mount):
    """Fifty reads of a corrupt chunk: fifty EIO, one log line naming the key, all counted."""
    root, mnt, want = quirks
    before = json.loads(_read(mnt / ".zarrfs/stats.json"))
    failed = 0
    for _ in range(READS_OF_CORRUPT):
        fd = os.open(mnt / "corrupt.npy", os.O_RDONLY | os.O_DIRECT)
        try:
            os.pread(fd, 4096, 0)
        except OSError as e:
            assert e.errno == 5
            failed += 1
        finally:
            os.close(fd)
    assert failed == READS_OF_CORRUPT
    stats = json.loads(_read(mnt / ".zarrfs/stats.json"))
    counted = stats["errors_by_key"][CORRUPT_KEY] - before.get("errors_by_key", {}).get(CORRUPT_KEY, 0)
    assert counted >= READS_OF_CORRUPT
    assert stats["log_lines_suppressed"] - before.get("log_lines_suppressed", 0) >= counted - 1
    lines = mounted.log_lines_naming(module_mount.log_text(mnt), "corrupt")
    assert len(lines) == 1 and CORRUPT_KEY in lines[0], lines
    # The healthy chunk beside it still reads.
    with open(mnt / ".zarrfs/chunks/corrupt/0.npy", "rb") as f:
        assert f.read() == mounted.npy_bytes(np.arange(4, dtype="<f4"))
