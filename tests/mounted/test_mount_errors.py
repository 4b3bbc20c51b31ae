"""Bad input next to healthy arrays: corrupt chunks, malformed metadata, unsupported dtypes, unknown codecs.

Each format gets one store holding every kind of damage and healthy arrays beside it,
mounted once for the module; the daemon must answer EIO (or EOPNOTSUPP) for the damaged
parts, name the store key in its log, and keep serving everything else.
"""

from __future__ import annotations

import errno
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from support import builders, mounting, oracles

pytestmark = pytest.mark.log_errors_expected

FORMATS = pytest.mark.parametrize("fmt", [2, 3], ids=["v2", "v3"])
PAGE = 4096

# (96, 1024) float64 in (32, 1024) chunks: every chunk is 256 KiB of contiguous C-order
# bytes in the .npy file, so a page-aligned range can lie wholly inside one chunk. That is the
# least a read-only mount of a local store decodes into buffers of its own (engine/spares.py),
# so damaged blosc and zstd chunks are read and decoded in one worker call (engine/loads.py).
CORRUPT_SHAPE = (96, 1024)
CORRUPT_CHUNKS = (32, 1024)
CORRUPT_ROW = 1  # the chunk row that gets damaged
CORRUPT_ARRAYS = {"corrupt_zstd": "zstd", "corrupt_blosc": "blosc", "corrupt_raw": "none"}


@dataclass
class DamagedStore:
    root: Path
    fmt: int
    expected: dict  # array path -> oracles.Expected, computed before the damage
    chunk_keys: dict  # array path -> the damaged chunk's store key


def chunk_key(fmt: int, array: str, index: tuple[int, ...]) -> str:
    if fmt == 2:
        return f"{array}/" + ".".join(map(str, index))
    return f"{array}/c/" + "/".join(map(str, index))


def build_damaged_store(root: Path, fmt: int) -> DamagedStore:
    rng = np.random.default_rng(99)
    import zarr

    zarr.open_group(os.fspath(root), mode="w", zarr_format=fmt, attributes={"damaged": True})
    specs = [
        builders.ArraySpec("good", "int32", (40, 30), (16, 16), "zstd"),
        builders.ArraySpec("g/ok", "float32", (20, 20), (8, 8), "gzip"),
        builders.ArraySpec("g/a", "float32", (20, 20), (8, 8), "gzip"),
        builders.ArraySpec("unknown_codec", "int16", (10,), (4,), "zstd"),
    ] + [
        builders.ArraySpec(name, "float64", CORRUPT_SHAPE, CORRUPT_CHUNKS, codec)
        for name, codec in CORRUPT_ARRAYS.items()
    ]
    for spec in specs:
        builders.create_array(root, spec, fmt, rng)
    expected = {spec.path: oracles.expected_for(root, spec.path) for spec in specs}
    builders.write_vlen_string_array(root, "vlen_str", fmt)

    keys = {}
    for name in CORRUPT_ARRAYS:
        key = chunk_key(fmt, name, (CORRUPT_ROW, 0))
        path = root / key
        assert path.is_file(), path
        if name == "corrupt_raw":
            path.write_bytes(path.read_bytes()[:1000])  # truncated: the wrong size for the chunk
        else:
            path.write_bytes(rng.integers(0, 256, 5000, dtype=np.uint8).tobytes())  # garbage
        keys[name] = key

    meta_key = "g/a/.zarray" if fmt == 2 else "g/a/zarr.json"
    (root / meta_key).write_text('{"zarr_format": 2, "shape": [20, 20], "chunks": [8, 8')  # cut short
    keys["g/a"] = meta_key

    meta_key = "unknown_codec/.zarray" if fmt == 2 else "unknown_codec/zarr.json"
    meta = json.loads((root / meta_key).read_text())
    if fmt == 2:
        meta["compressor"] = {"id": "no_such_codec", "level": 3}
    else:
        meta["codecs"].append({"name": "no_such_codec", "configuration": {}})
    (root / meta_key).write_text(json.dumps(meta))
    keys["unknown_codec"] = meta_key
    return DamagedStore(root, fmt, expected, keys)


@pytest.fixture(scope="module")
def damaged(module_mount, tmp_path_factory):
    """``damaged(fmt) -> (DamagedStore, mountpoint)``, mounted once per format."""
    cache = {}

    def get(fmt):
        if fmt not in cache:
            store = build_damaged_store(tmp_path_factory.mktemp(f"damaged-v{fmt}") / "store.zarr", fmt)
            cache[fmt] = (store, module_mount(store.root))
        return cache[fmt]

    return get


def _read_all(p) -> bytes:
    with open(p, "rb") as f:
        return f.read()


def _assert_log_names(module_mount, mnt, key, timeout_s=3.0):
    ok = mounting.wait_until(lambda: mounting.log_lines_naming(module_mount.log_text(mnt), key), timeout_s, 0.05)
    assert ok, f"no WARNING/ERROR log line names {key!r}; log:\n{module_mount.log_text(mnt)[-3000:]}"


def _assert_healthy(store: DamagedStore, mnt):
    for path in ["good", "g/ok"]:
        assert _read_all(mnt / f"{path}.npy") == store.expected[path].npy, path


def _chunk_row_pages(npy_len: int, header_len: int, row: int) -> tuple[int, int]:
    """A page-aligned byte range of the .npy file lying wholly inside chunk row ROW."""
    row_bytes = CORRUPT_CHUNKS[0] * CORRUPT_SHAPE[1] * 8
    start = header_len + row * row_bytes
    end = start + row_bytes
    start = -(-start // PAGE) * PAGE
    end = end // PAGE * PAGE
    return start, end


@FORMATS
@pytest.mark.parametrize("array", list(CORRUPT_ARRAYS))
def test_corrupt_chunk_is_eio_and_other_chunks_read(damaged, module_mount, fmt, array):
    store, mnt = damaged(fmt)
    expected = store.expected[array].npy
    header_len = len(expected) - int(np.prod(CORRUPT_SHAPE)) * 8
    p = mnt / f"{array}.npy"
    assert f"{array}.npy" in os.listdir(mnt)
    assert os.stat(p).st_size == len(expected)

    fd = os.open(p, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)  # no readahead into the bad chunk
        bad_start, bad_end = _chunk_row_pages(len(expected), header_len, CORRUPT_ROW)
        with pytest.raises(OSError) as exc:
            os.pread(fd, 100, bad_start + 10)
        assert exc.value.errno == errno.EIO
        for row in range(CORRUPT_SHAPE[0] // CORRUPT_CHUNKS[0]):
            if row == CORRUPT_ROW:
                continue
            start, end = _chunk_row_pages(len(expected), header_len, row)
            assert os.pread(fd, end - start, start) == expected[start:end], f"chunk row {row}"
        # the NPY header needs no chunk
        assert os.pread(fd, header_len, 0) == expected[:header_len]
        # still failing on a second try: a failed load is not cached as data
        with pytest.raises(OSError) as exc:
            os.pread(fd, bad_end - bad_start, bad_start)
        assert exc.value.errno == errno.EIO
    finally:
        os.close(fd)

    with pytest.raises(OSError) as exc:
        _read_all(p)
    assert exc.value.errno == errno.EIO
    _assert_log_names(module_mount, mnt, store.chunk_keys[array])
    _assert_healthy(store, mnt)


@FORMATS
def test_chunks_after_a_corrupt_one_read_with_plain_reads(damaged, fmt):
    """Ordinary buffered reads (readahead on) of the chunks after the damaged one."""
    store, mnt = damaged(fmt)
    expected = store.expected["corrupt_zstd"].npy
    header_len = len(expected) - int(np.prod(CORRUPT_SHAPE)) * 8
    start, _ = _chunk_row_pages(len(expected), header_len, CORRUPT_ROW + 1)
    with open(mnt / "corrupt_zstd.npy", "rb") as f:
        f.seek(start)
        assert f.read() == expected[start:]


@pytest.mark.parametrize("fmt", [2], ids=["v2"])  # a broken v3 zarr.json no longer says "array"
def test_malformed_zarray(damaged, module_mount, fmt):
    """A .zarray that is not valid JSON: the array is still listed; opening or reading it gives EIO."""
    store, mnt = damaged(fmt)
    assert sorted(os.listdir(mnt / "g")) == ["a.npy", "ok.npy"]
    with pytest.raises(OSError) as exc:
        _read_all(mnt / "g" / "a.npy")
    assert exc.value.errno == errno.EIO
    _assert_log_names(module_mount, mnt, store.chunk_keys["g/a"])
    _assert_healthy(store, mnt)


@FORMATS
def test_variable_length_strings_read_beside_the_damage(damaged, module_mount, fmt):
    """vlen strings are fixed-width unicode files (tests/mounted/test_mount_formats.py), never 0 bytes."""
    store, mnt = damaged(fmt)
    assert "vlen_str.npy" in os.listdir(mnt)
    z = np.asarray(oracles.open_zarr_array(store.root, "vlen_str")[...], dtype=object)
    want = np.asarray(z, dtype=f"U{max(len(v) for v in z)}")
    assert _read_all(mnt / "vlen_str.npy") == oracles.npy_bytes(want)
    _assert_healthy(store, mnt)


@FORMATS
def test_unknown_codec_is_eio(damaged, module_mount, fmt):
    """An unknown codec never kills the daemon; the read returns EIO and the log says why."""
    store, mnt = damaged(fmt)
    assert "unknown_codec.npy" in os.listdir(mnt)
    with pytest.raises(OSError) as exc:
        _read_all(mnt / "unknown_codec.npy")
    assert exc.value.errno == errno.EIO
    _assert_log_names(module_mount, mnt, "unknown_codec")
    _assert_healthy(store, mnt)


@FORMATS
def test_daemon_still_serves_everything_else(damaged, fmt):
    """After all the failures above, the healthy nodes read exactly and the tree still lists."""
    store, mnt = damaged(fmt)
    time.sleep(0.1)
    assert mounting.is_mounted(mnt)
    names = sorted(os.listdir(mnt))
    assert {"good.npy", "g", "corrupt_zstd.npy", "vlen_str.npy"} <= set(names), names
    _assert_healthy(store, mnt)
