"""Other writers' quirks through a real mount, and a failing key's place in the log.

One store, written by hand as those writers wrote it, mounted once for the module:
`gzip` chunks that are zlib streams (an early C++ writer), `fill_value: 0` that old
zarr-python 2 releases wrote for bytes arrays, a fill value nothing can read, and a corrupt
chunk read many times.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import zlib
from pathlib import Path

import numpy as np
import pytest

from support import ZARR218_PYTHON, mounting, oracles

pytestmark = pytest.mark.log_errors_expected  # the corrupt chunk's read fails on purpose


# An (8, 5) int32 array in (2, 5) chunks: row 0 is zlib at level 1 (header 78 01), row 1 zlib
# at the default level (78 9c), row 2 zlib at level 9 (78 da); row 3 the writer left out.
GZ_SHAPE, GZ_CHUNKS = (8, 5), (2, 5)
GZ_STREAMS = {0: lambda b: zlib.compress(b, 1), 1: lambda b: zlib.compress(b), 2: lambda b: zlib.compress(b, 9)}
CORRUPT_KEY = "corrupt/1"
READS_OF_CORRUPT = 50


def _write_v2(root: Path, name: str, dtype, shape, chunks, fill, compressor, chunks_bytes: dict) -> None:
    (root / name).mkdir(parents=True)
    doc = {
        "zarr_format": 2,
        "shape": list(shape),
        "chunks": list(chunks),
        "dtype": dtype,
        "compressor": compressor,
        "fill_value": fill,
        "order": "C",
        "filters": None,
    }
    (root / name / ".zarray").write_text(json.dumps(doc))
    for key, data in chunks_bytes.items():
        (root / name / key).write_bytes(data)


def build_store(root: Path) -> dict:
    """The store and the values each array's writer meant (array path -> ndarray)."""
    root.mkdir(parents=True)
    (root / ".zgroup").write_text('{"zarr_format": 2}')
    want = {}

    values = np.arange(np.prod(GZ_SHAPE), dtype="<i4").reshape(GZ_SHAPE) * 7 - 50
    chunks = {f"{row}.0": stream(values[2 * row : 2 * row + 2].tobytes()) for row, stream in GZ_STREAMS.items()}
    values[6:] = 3  # the fill value
    _write_v2(root, "zlib_as_gzip", "<i4", GZ_SHAPE, GZ_CHUNKS, 3, {"id": "gzip", "level": 1}, chunks)
    want["zlib_as_gzip"] = values

    # Beside it, real gzip chunks, and one of them a zlib stream: each chunk read as it is.
    mixed = np.arange(20, dtype="<f8").reshape(4, 5) / 4
    _write_v2(
        root,
        "mixed_gzip",
        "<f8",
        (4, 5),
        (2, 5),
        0.0,
        {"id": "gzip", "level": 5},
        {"0.0": gzip.compress(mixed[:2].tobytes()), "1.0": zlib.compress(mixed[2:].tobytes())},
    )
    want["mixed_gzip"] = mixed

    # Old zarr-python 2 releases: `S` arrays with `fill_value: 0`. One with every chunk stored
    # (the fill value is never used), one with a chunk left out (zarr 2.18 reads it as b"0").
    text = np.array([b"a", b"b", b"c", b"d", b"e", b"f"], dtype="|S1")
    _write_v2(root, "bytes_fill0", "|S1", (6,), (3,), 0, None, {"0": text[:3].tobytes(), "1": text[3:].tobytes()})
    want["bytes_fill0"] = text
    _write_v2(root, "bytes_fill0_sparse", "|S1", (6,), (3,), 0, None, {"0": text[:3].tobytes()})

    # A fill value no reader can read: the array is listed, sized and its stored chunk read.
    ints = np.arange(4, dtype="<i4") + 40
    _write_v2(root, "unreadable_fill", "<i4", (8,), (4,), "forty-two", None, {"0": ints.tobytes()})
    want["unreadable_fill/0"] = ints

    (root / "broken").mkdir()
    (root / "broken" / ".zarray").write_text('{"zarr_format": 2, "shape": [4], "chunks": [')  # cut short

    corrupt = np.arange(8, dtype="<f4")
    _write_v2(
        root,
        "corrupt",
        "<f4",
        (8,),
        (4,),
        0.0,
        {"id": "zlib", "level": 1},
        {"0": zlib.compress(corrupt[:4].tobytes()), "1": b"\x78\x9cnot a zlib stream at all"},
    )
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
    assert _read(mnt / "zlib_as_gzip.npy") == oracles.npy_bytes(want["zlib_as_gzip"])
    assert _read(mnt / ".zarrfs/raw/zlib_as_gzip.raw") == want["zlib_as_gzip"].tobytes()
    (mnt / ".zarrfs/refresh").read_bytes()  # (its metadata parsed again, its chunks decoded again)
    assert _read(mnt / ".zarrfs/npy-f/zlib_as_gzip.npy") == oracles.npy_f_bytes(want["zlib_as_gzip"])
    lines = [ln for ln in mounting.log_lines_naming(module_mount.log_text(mnt), "zlib_as_gzip/.zarray") if "zlib" in ln]
    assert len(lines) == 1, lines  # said once for the array, not once per chunk, read or refresh


def test_gzip_and_zlib_chunks_side_by_side(quirks):
    root, mnt, want = quirks
    assert _read(mnt / "mixed_gzip.npy") == oracles.npy_bytes(want["mixed_gzip"])


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
    lines = mounting.log_lines_naming(module_mount.log_text(mnt), "corrupt")
    assert len(lines) == 1 and CORRUPT_KEY in lines[0], lines
    # The healthy chunk beside it still reads.
    with open(mnt / ".zarrfs/chunks/corrupt/0.npy", "rb") as f:
        assert f.read() == oracles.npy_bytes(np.arange(4, dtype="<f4"))


def test_bytes_fill_value_0_with_every_chunk_stored(quirks):
    root, mnt, want = quirks
    assert (mnt / "bytes_fill0.npy").stat().st_size == len(oracles.npy_bytes(want["bytes_fill0"]))
    assert _read(mnt / "bytes_fill0.npy") == oracles.npy_bytes(want["bytes_fill0"])
    info = json.loads(_read(mnt / ".zarrfs/info/bytes_fill0.json"))
    assert info["fill_value"] == "0" or info["fill_value"] == "MA==", info["fill_value"]


def test_bytes_fill_value_0_reads_as_zarr_2_18_reads_it(quirks):
    root, mnt, want = quirks
    script = (
        f"import zarr; a = zarr.open_array({str(root / 'bytes_fill0_sparse')!r}, mode='r'); "
        f"print(a[...].tobytes().hex())"
    )
    r = subprocess.run([str(ZARR218_PYTHON), "-c", script], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    oracle = np.frombuffer(bytes.fromhex(r.stdout.strip()), dtype="|S1")
    assert oracle.tolist() == [b"a", b"b", b"c", b"0", b"0", b"0"]
    assert _read(mnt / "bytes_fill0_sparse.npy") == oracles.npy_bytes(oracle)


def test_unreadable_fill_value_fails_only_the_chunks_not_stored(quirks, module_mount):
    root, mnt, want = quirks
    assert "unreadable_fill.npy" in os.listdir(mnt)
    header = len(oracles.npy_bytes(np.zeros(8, "<i4"))) - 32
    assert (mnt / "unreadable_fill.npy").stat().st_size == header + 32
    fd = os.open(mnt / "unreadable_fill.npy", os.O_RDONLY | os.O_DIRECT)  # no page: the read asked alone
    try:
        assert os.pread(fd, 16, header) == want["unreadable_fill/0"].tobytes()  # the stored chunk
    finally:
        os.close(fd)
    assert _read(mnt / ".zarrfs/chunks/unreadable_fill/0.npy") == oracles.npy_bytes(want["unreadable_fill/0"])
    for _ in range(3):
        with pytest.raises(OSError) as e:
            _read(mnt / ".zarrfs/chunks/unreadable_fill/1.npy")
        assert e.value.errno == 5
    info = json.loads(_read(mnt / ".zarrfs/info/unreadable_fill.json"))
    assert info["fill_value"] is None and "forty-two" in info["fill_value_error"]
    assert info["shape"] == [8] and info["chunks_stored"] == 1
    lines = mounting.log_lines_naming(module_mount.log_text(mnt), "unreadable_fill")
    assert len(lines) == 1 and "unreadable_fill/.zarray" in lines[0] and "forty-two" in lines[0], lines


def test_broken_node_opened_many_times_logged_once(quirks, module_mount):
    root, mnt, want = quirks
    for _ in range(20):
        with pytest.raises(OSError) as e:
            _read(mnt / "broken.npy")
        assert e.value.errno == 5
    lines = mounting.log_lines_naming(module_mount.log_text(mnt), "broken")
    assert len(lines) == 1 and "broken/.zarray" in lines[0], lines
    stats = json.loads(_read(mnt / ".zarrfs/stats.json"))
    assert stats["errors_by_key"]["broken/.zarray"] >= 20
