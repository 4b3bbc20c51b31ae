"""Mounted tests of format rules (issue 8): variable-length strings as fixed-width NPY, refused
must-understand fields, checked fill values, v1 0-d chunks and malformed `meta`.

Oracles: zarr-python 3 reading the same store, numpy's np.save bytes, zlib/numcodecs
decoding v1 chunk files, and zarr-python 3's own refusals.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import tarfile
import warnings
import zlib
from pathlib import Path

import numpy as np
import pytest

from support import FIXTURES, builders, mounting, oracles

V1_FIXTURES = FIXTURES / "v1"
FORMATS = pytest.mark.parametrize("fmt", [2, 3], ids=["v2", "v3"])


def _log_names(mount, mnt, key) -> bool:
    return mounting.wait_until(lambda: mounting.log_lines_naming(mount.log_text(mnt), key), 3.0, 0.05)


# --------------------------------------------------------------------------- variable-length strings


def _vlen_store(root: Path, fmt: int) -> None:
    """zarr-python 3 string arrays: missing chunks, elements of several lengths, non-ASCII."""
    import zarr

    zarr.open_group(os.fspath(root), mode="w", zarr_format=fmt)
    builders.write_vlen_string_array(root, "words", fmt)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a = zarr.create_array(
            store=os.fspath(root), name="g/grid", shape=(5, 9), chunks=(2, 4), dtype=str, zarr_format=fmt
        )
        a[:2, :5] = np.array([["α", "", "naïve", "日本語テキスト", "x"], ["", "b", "", "c", "🙂"]], dtype=object)
    builders.create_array(root, builders.ArraySpec("nums", "int16", (6,), (4,), "zstd"), fmt, np.random.default_rng(1))


def _fixed_width_oracle(root: Path, path: str) -> np.ndarray:
    """What zarr-python 3 reads, as fixed-width unicode of the longest element's width."""
    z = np.asarray(oracles.open_zarr_array(root, path)[...], dtype=object)
    width = max(1, max(len(v) for v in z.reshape(-1)))
    return np.asarray(z, dtype=f"U{width}")


@FORMATS
def test_vlen_strings_read_as_fixed_width_unicode(mount, tmp_path, fmt):
    root = tmp_path / "store.zarr"
    _vlen_store(root, fmt)
    mnt = mount(root)
    for path in ("words", "g/grid"):
        want = _fixed_width_oracle(root, path)
        p = mnt / f"{path}.npy"
        assert os.stat(p).st_size == len(oracles.npy_bytes(want)), path
        assert p.read_bytes() == oracles.npy_bytes(want), path
        got = np.load(p)
        assert got.dtype == want.dtype and got.tolist() == want.tolist(), path
    # a copying tool gets every byte, not an empty file
    out = tmp_path / "copy.tar"
    r = subprocess.run(
        ["tar", "-cf", os.fspath(out), "-C", os.fspath(mnt), "g/grid.npy"], capture_output=True, timeout=60
    )
    assert r.returncode == 0, r.stderr
    with tarfile.open(out) as tar:
        member = tar.getmember("g/grid.npy")
        assert member.size == len(oracles.npy_bytes(_fixed_width_oracle(root, "g/grid")))
        assert tar.extractfile(member).read() == oracles.npy_bytes(_fixed_width_oracle(root, "g/grid"))
    assert (mnt / "nums.npy").read_bytes() == oracles.expected_for(root, "nums").npy


def test_vlen_strings_are_not_writable(mount, tmp_path):
    root = tmp_path / "store.zarr"
    _vlen_store(root, 3)
    before = oracles.store_keys(root)
    mnt = mount(root, "writable")
    with pytest.raises(OSError) as exc:
        os.open(mnt / "words.npy", os.O_WRONLY)
    assert exc.value.errno in (errno.EPERM, errno.EROFS)
    assert _log_names(mount, mnt, "words/zarr.json")
    assert oracles.store_keys(root) == before


def test_vlen_width_scan_limit_fails_the_array_alone(mount, tmp_path):
    """Past the scan's bound (64 MiB stored) the array fails alone with EOPNOTSUPP and a log line."""
    import zarr

    root = tmp_path / "store.zarr"
    zarr.open_group(os.fspath(root), mode="w", zarr_format=2)
    builders.create_array(root, builders.ArraySpec("nums", "int16", (6,), (4,), "zstd"), 2, np.random.default_rng(1))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        big = zarr.create_array(
            store=os.fspath(root), name="big", shape=(2,), chunks=(1,), dtype=str, zarr_format=2, compressors=None
        )
        big[0] = "x" * (40 << 20)  # two chunks of 40 MiB each
        big[1] = "y" * (40 << 20)
    mnt = mount(root)
    assert "big.npy" in os.listdir(mnt)
    with pytest.raises(OSError) as exc:
        (mnt / "big.npy").read_bytes()
    assert exc.value.errno == errno.EOPNOTSUPP
    assert _log_names(mount, mnt, "big/.zarray")
    assert "at most 64 MiB" in mount.log_text(mnt)
    assert (mnt / "nums.npy").read_bytes() == oracles.expected_for(root, "nums").npy


# --------------------------------------------------------------------------- must_understand


def _zarr_refuses_group(path: Path) -> bool:
    import zarr

    try:
        zarr.open_group(os.fspath(path), mode="r")
    except Exception:
        return True
    return False


def test_v3_group_that_must_be_understood_fails_alone(mount, tmp_path):
    import zarr

    root = tmp_path / "store.zarr"
    zarr.open_group(os.fspath(root), mode="w", zarr_format=3).create_group("strict")
    builders.create_array(
        root, builders.ArraySpec("strict/a", "int16", (6,), (4,), "zstd"), 3, np.random.default_rng(1)
    )
    builders.create_array(root, builders.ArraySpec("ok", "int16", (6,), (4,), "zstd"), 3, np.random.default_rng(2))
    doc = json.loads((root / "strict" / "zarr.json").read_text())
    (root / "strict" / "zarr.json").write_text(json.dumps({**doc, "ext": {"must_understand": True}}))
    assert _zarr_refuses_group(root / "strict")
    mnt = mount(root)
    assert sorted(os.listdir(mnt)) == ["ok.npy", "strict"]
    with pytest.raises(OSError) as exc:
        os.listdir(mnt / "strict")
    assert exc.value.errno in (errno.EOPNOTSUPP, errno.EIO)
    assert _log_names(mount, mnt, "strict/zarr.json")
    assert (mnt / "ok.npy").read_bytes() == oracles.expected_for(root, "ok").npy


def test_v3_root_group_that_must_be_understood_refuses_the_mount(tmp_path):
    import zarr

    root = tmp_path / "store.zarr"
    zarr.open_group(os.fspath(root), mode="w", zarr_format=3)
    doc = json.loads((root / "zarr.json").read_text())
    (root / "zarr.json").write_text(json.dumps({**doc, "ext": {"must_understand": True}}))
    assert _zarr_refuses_group(root)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    code, out, err, was_mounted = mounting.run_expecting_failure(
        [*mounting.ZARRFS, os.fspath(root), os.fspath(mnt)], mnt, tmp_path
    )
    assert not was_mounted and code == 1
    assert err.splitlines() == [f"zarrfs: {root}: zarr.json: unknown field 'ext' that must be understood"]


# --------------------------------------------------------------------------- fill values


@FORMATS
def test_fill_value_the_type_cannot_hold_fails_the_array_alone(mount, tmp_path, fmt):
    """A fill value no zarr-python reads ("forty-two" for an integer type, 1.5 in a v3 document):
    the chunks not stored fail (EIO), the log names the document; the array is listed with its
    size. What zarr-python does read is read as it reads it: `"false"` for a bool is True, and
    1.5 in a v2 document is 1 (zarr-python 2 cuts the fraction off)."""
    import warnings

    import zarr

    root = tmp_path / "store.zarr"
    zarr.open_group(os.fspath(root), mode="w", zarr_format=fmt)
    rng = np.random.default_rng(3)
    arrays = (("flag", "bool", "false"), ("count", "int32", 1.5), ("bad", "int32", "forty-two"), ("ok", "int16", None))
    for name, dtype, bad in arrays:
        builders.create_array(root, builders.ArraySpec(name, dtype, (6,), (4,), "zstd", write="none"), fmt, rng)
        if bad is not None:
            doc_key = f"{name}/.zarray" if fmt == 2 else f"{name}/zarr.json"
            doc = json.loads((root / doc_key).read_text())
            (root / doc_key).write_text(json.dumps({**doc, "fill_value": bad}))
    mnt = mount(root)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        flag = zarr.open_array(os.fspath(root / "flag"), mode="r")[...]
    assert flag.tolist() == [True] * 6
    assert (mnt / "flag.npy").read_bytes() == oracles.npy_bytes(flag)
    failing = ["bad"] if fmt == 2 else ["bad", "count"]
    if fmt == 2:
        assert (mnt / "count.npy").read_bytes() == oracles.npy_bytes(np.full(6, 1, "<i4"))
    for name in failing:
        assert (mnt / f"{name}.npy").stat().st_size == len(oracles.npy_bytes(np.zeros(6, "<i4")))
        with pytest.raises(OSError) as exc:
            (mnt / f"{name}.npy").read_bytes()
        assert exc.value.errno == errno.EIO, name
        assert _log_names(mount, mnt, f"{name}/.zarray" if fmt == 2 else f"{name}/zarr.json")
    assert (mnt / "ok.npy").read_bytes() == oracles.expected_for(root, "ok").npy


# --------------------------------------------------------------------------- v1


def _v1_zerod(tmp_path: Path) -> Path:
    root = tmp_path / "zerod_i4"
    shutil.copytree(V1_FIXTURES / "zerod_i4", root)
    return root


def test_v1_zero_d_chunk_reads_and_writes_at_key_0(mount, tmp_path):
    """A 0-d v1 array's chunk lives at `0` (zarr 1.1.0's key '' is the store's root)."""
    root = _v1_zerod(tmp_path)
    meta = json.loads((root / "meta").read_text())
    assert (meta["compression"], meta["fill_value"]) == ("zlib", 42)
    (root / "0").write_bytes(zlib.compress(np.array(-7, "<i4").tobytes(), 1))
    mnt = mount(root, "writable")
    p = mnt / "zerod_i4.npy"
    assert p.read_bytes() == oracles.npy_bytes(np.array(-7, "<i4"))
    header = len(oracles.npy_bytes(np.array(0, "<i4"))) - 4
    fd = os.open(p, os.O_WRONLY)
    try:
        mounting.pwrite_all(fd, np.array(123456, "<i4").tobytes(), header)
        os.fsync(fd)
    finally:
        os.close(fd)
    assert np.frombuffer(zlib.decompress((root / "0").read_bytes()), "<i4").tolist() == [123456]
    assert p.read_bytes() == oracles.npy_bytes(np.array(123456, "<i4"))


def test_v1_malformed_meta_is_named_at_start_up(tmp_path):
    root = tmp_path / "broken.zarr"
    shutil.copytree(V1_FIXTURES / "zlib_i4_C", root)
    (root / "meta").write_text((root / "meta").read_text()[:-20])  # cut short
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    code, out, err, was_mounted = mounting.run_expecting_failure(
        [*mounting.ZARRFS, os.fspath(root), os.fspath(mnt)], mnt, tmp_path
    )
    assert not was_mounted and code == 1
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"zarrfs: {root}: meta: malformed JSON: "), err
