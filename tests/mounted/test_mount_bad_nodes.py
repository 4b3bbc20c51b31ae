"""One bad node fails alone (issue 8): absurd shapes, deeply nested or symlinked metadata,
names no file can have, hostile consolidated keys, unknown codecs.

Each bad node sits in a group next to healthy siblings. The siblings must list, stat and
read back exactly (np.save bytes of what zarr-python 3 reads); the bad node fails alone
(EIO, or it is not listed) and the daemon's log names its key and the reason.
"""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import numpy as np
import pytest

from support import builders, mounting, oracles

FORMATS = pytest.mark.parametrize("fmt", [2, 3], ids=["v2", "v3"])
HUGE = 2**62  # 2^62 x 2^62 elements: the byte size overflows st_size
DEEP = 200_000  # levels of nesting: far past the JSON parser's recursion limit
LONG_NAME = "n" * 5000  # bytes: a kernel directory entry holds at most 255
LOCAL_LONG_NAME = "m" * 253  # a directory the local file system allows; NAME.npy has 257 bytes
HEALTHY = {
    "ok": ("int32", (40, 30), (16, 16), "zstd"),
    "g/sibling": ("float32", (20, 20), (8, 8), "gzip"),
    "unknown_codec": ("int16", (10, 3), (4, 2), "zstd"),
}


def doc_name(fmt: int) -> str:
    return ".zarray" if fmt == 2 else "zarr.json"


def _edit_doc(root: Path, path: str, fmt: int, change) -> None:
    p = root / path / doc_name(fmt)
    doc = json.loads(p.read_text())
    change(doc)
    p.write_text(json.dumps(doc))


def _absurd_shape(fmt: int):
    def change(doc):
        doc["shape"] = [HUGE, HUGE]
        if fmt == 2:
            doc["chunks"] = [1, 1]
        else:
            doc["chunk_grid"]["configuration"]["chunk_shape"] = [1, 1]

    return change


def _unknown_codec(fmt: int):
    def change(doc):
        if fmt == 2:
            doc["compressor"] = {"id": "doesnotexist", "level": 3}
        else:
            doc["codecs"].append({"name": "numcodecs.doesnotexist", "configuration": {}})

    return change


def build_bad_store(root: Path, outside: Path, fmt: int) -> dict:
    """Healthy arrays and, beside them in the root group, one bad node of each kind.

    Returns the expected values of the healthy arrays (computed before any damage).
    """
    import zarr

    rng = np.random.default_rng(8)
    zarr.open_group(os.fspath(root), mode="w", zarr_format=fmt)
    for path, (dtype, shape, chunks, codec) in HEALTHY.items():
        builders.create_array(root, builders.ArraySpec(path, dtype, shape, chunks, codec), fmt, rng)
    builders.create_array(root, builders.ArraySpec("huge", "int32", (3,), (3,)), fmt, rng)
    builders.create_array(root, builders.ArraySpec(LOCAL_LONG_NAME, "int8", (2,), (2,)), fmt, rng)
    expected = {path: oracles.expected_for(root, path) for path in HEALTHY}

    _edit_doc(root, "huge", fmt, _absurd_shape(fmt))
    _edit_doc(root, "unknown_codec", fmt, _unknown_codec(fmt))
    (root / "deep").mkdir()
    (root / "deep" / doc_name(fmt)).write_text("[" * DEEP + "]" * DEEP)
    (root / "link").mkdir()
    outside.write_text((root / "ok" / doc_name(fmt)).read_text())  # a valid document, outside the store
    (root / "link" / doc_name(fmt)).symlink_to(outside)
    return expected


@pytest.fixture(scope="module")
def bad(module_mount, tmp_path_factory):
    """``bad(fmt) -> (expected values of the healthy arrays, mountpoint)``, mounted once per format."""
    cache = {}

    def get(fmt):
        if fmt not in cache:
            base = tmp_path_factory.mktemp(f"bad-v{fmt}")
            expected = build_bad_store(base / "store.zarr", base / "outside.json", fmt)
            cache[fmt] = (expected, module_mount(base / "store.zarr"))
        return cache[fmt]

    return get


def _assert_log_names(mounter, mnt, *needles):
    """Some WARNING/ERROR line of the daemon's log holds every one of NEEDLES (key and reason)."""

    def found():
        return any(
            all(n in line for n in needles) for line in mounting.log_lines_naming(mounter.log_text(mnt), needles[0])
        )

    assert mounting.wait_until(found, 3.0, 0.05), (
        f"no WARNING/ERROR log line names {needles!r}; log:\n{mounter.log_text(mnt)[-3000:]}"
    )


def _assert_healthy(expected: dict, mnt: Path) -> None:
    for path in ("ok", "g/sibling"):
        p = mnt / f"{path}.npy"
        assert os.stat(p).st_size == len(expected[path].npy), path
        assert p.read_bytes() == expected[path].npy, path


def _listed(mnt: Path, name: str) -> Path:
    """The entry of node NAME in the mount's root: NAME.npy (an array) or NAME (shown as a group)."""
    names = os.listdir(mnt)
    hits = [n for n in (f"{name}.npy", name) if n in names]
    assert len(hits) == 1, f"{name} listed as {hits} in {names}"
    return mnt / hits[0]


def _assert_eio(p: Path) -> None:
    with pytest.raises(OSError) as exc:
        if p.name.endswith(".npy"):
            p.read_bytes()
        else:
            os.listdir(p)
    assert exc.value.errno == errno.EIO, exc.value


@FORMATS
def test_root_lists_and_stats_with_bad_nodes(bad, fmt):
    """`ls -l` of a group holding every kind of bad node works; the healthy siblings read back exactly."""
    expected, mnt = bad(fmt)
    with os.scandir(mnt) as entries:
        stats = {e.name: e.stat() for e in entries}
    assert {"ok.npy", "g", "unknown_codec.npy", "huge.npy"} <= set(stats), sorted(stats)
    assert stats["ok.npy"].st_size == len(expected["ok"].npy)
    _assert_healthy(expected, mnt)


@FORMATS
@pytest.mark.parametrize(
    "name,reason", [("huge", "too large"), ("deep", "nested too deeply"), ("link", "outside the store")]
)
def test_bad_node_fails_alone(bad, module_mount, fmt, name, reason):
    expected, mnt = bad(fmt)
    p = _listed(mnt, name)
    if name == "huge":
        assert p.name == "huge.npy"  # listed as the array its metadata says it is
    _assert_eio(p)
    _assert_log_names(module_mount, mnt, f"{name}/{doc_name(fmt)}", reason)
    _assert_healthy(expected, mnt)


@FORMATS
def test_name_longer_than_a_file_name_is_not_listed(bad, module_mount, fmt):
    """A 253-byte directory holding an array would be a 257-byte NAME.npy, over the 255 bytes statfs
    promises (f_namemax): left out, logged, siblings stay."""
    expected, mnt = bad(fmt)
    names = os.listdir(mnt)
    assert not [n for n in names if n.startswith("mmm")], [n[:20] for n in names]
    with pytest.raises(OSError) as exc:
        os.stat(mnt / f"{LOCAL_LONG_NAME}.npy")
    assert exc.value.errno in (errno.ENOENT, errno.ENAMETOOLONG)
    _assert_log_names(module_mount, mnt, f"{LOCAL_LONG_NAME}/{doc_name(fmt)}", "longer than a file name")
    _assert_healthy(expected, mnt)


@FORMATS
def test_unknown_codec_keeps_its_metadata(bad, module_mount, fmt):
    """getfattr, ls -l and info/ of an array whose codec cannot run come from its metadata; reads give EIO."""
    expected, mnt = bad(fmt)
    want = expected["unknown_codec"]
    p = mnt / "unknown_codec.npy"
    assert os.stat(p).st_size == len(want.npy)
    assert set(os.listxattr(p)) >= {
        "user.zarr.attributes",
        "user.zarr.shape",
        "user.zarr.dtype",
        "user.zarr.chunks",
        "user.zarr.codecs",
    }
    assert json.loads(os.getxattr(p, "user.zarr.shape")) == want.shape
    assert json.loads(os.getxattr(p, "user.zarr.dtype")) == want.descr
    assert json.loads(os.getxattr(p, "user.zarr.chunks")) == want.chunks
    assert json.loads(os.getxattr(p, "user.zarr.attributes")) == want.attributes
    codecs = json.loads(os.getxattr(p, "user.zarr.codecs"))
    assert "doesnotexist" in json.dumps(codecs), codecs
    info = json.loads((mnt / ".zarrfs" / "info" / "unknown_codec.json").read_bytes())
    assert info["shape"] == want.shape and info["logical_bytes"] == want.value.nbytes
    with pytest.raises(OSError) as exc:
        p.read_bytes()
    assert exc.value.errno == errno.EIO
    _assert_log_names(module_mount, mnt, f"unknown_codec/{doc_name(fmt)}", "doesnotexist")
    _assert_healthy(expected, mnt)


# --------------------------------------------------------------------------- consolidated metadata


def build_consolidated(root: Path, fmt: int) -> tuple[dict, list[str]]:
    """A consolidated store with hand-written hostile entries; returns the healthy values and those keys."""
    import zarr

    rng = np.random.default_rng(9)
    zarr.open_group(os.fspath(root), mode="w", zarr_format=fmt)
    for path in ("ok", "g/sibling"):
        dtype, shape, chunks, codec = HEALTHY[path]
        builders.create_array(root, builders.ArraySpec(path, dtype, shape, chunks, codec), fmt, rng)
    expected = {path: oracles.expected_for(root, path) for path in ("ok", "g/sibling")}
    builders.consolidate(root, fmt)
    array_doc = json.loads((root / "ok" / doc_name(fmt)).read_text())
    if fmt == 2:
        hostile = ["/evil/.zarray", "../.zarray", "g/../up/.zarray"]
        doc = json.loads((root / ".zmetadata").read_text())
        for key in [*hostile, f"{LONG_NAME}/.zarray"]:
            doc["metadata"][key] = array_doc
        (root / ".zmetadata").write_text(json.dumps(doc))
    else:
        hostile = ["/evil", "..", "g/.."]
        doc = json.loads((root / "zarr.json").read_text())
        for key in [*hostile, LONG_NAME]:
            doc["consolidated_metadata"]["metadata"][key] = array_doc
        (root / "zarr.json").write_text(json.dumps(doc))
    return expected, hostile


@FORMATS
def test_consolidated_metadata_keys_are_checked(mount, tmp_path, fmt):
    """Leading `/` and `..` keys are ignored and logged; a 5,000-byte name is never sent to the kernel."""
    expected, hostile = build_consolidated(tmp_path / "store.zarr", fmt)
    mnt = mount(tmp_path / "store.zarr")
    assert sorted(os.listdir(mnt)) == ["g", "ok.npy"]
    assert sorted(os.listdir(mnt / "g")) == ["sibling.npy"]
    with os.scandir(mnt) as entries:
        assert sorted(e.name for e in entries if e.is_dir()) == ["g"]
    _assert_healthy(expected, mnt)
    for key in hostile:
        _assert_log_names(mount, mnt, repr(key), "hostile key")
    _assert_log_names(mount, mnt, LONG_NAME, "longer than a file name")


# --------------------------------------------------------------------------- root arrays


def _v1_root(root: Path) -> None:
    root.mkdir()
    (root / "meta").write_text(
        json.dumps(
            {
                "zarr_format": 1,
                "shape": [HUGE, HUGE],
                "chunks": [1, 1],
                "dtype": "<i4",
                "compression": "none",
                "compression_opts": None,
                "fill_value": 0,
                "order": "C",
            }
        )
    )
    (root / "attrs").write_text("{}")


@pytest.mark.parametrize("fmt", [1, 2, 3], ids=["v1", "v2", "v3"])
def test_root_array_with_absurd_shape_refuses_the_mount(tmp_path, fmt):
    """A store whose only node cannot be used: one line naming the key and the reason, exit 1, nothing mounted."""
    store = tmp_path / "store.zarr"
    if fmt == 1:
        _v1_root(store)
        key = "meta"
    else:
        builders.build_root_array(store, fmt)
        key = doc_name(fmt)
        p = store / key
        doc = json.loads(p.read_text())
        _absurd_shape(fmt)(doc)
        p.write_text(json.dumps(doc))
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    cmd = [*mounting.ZARRFS, os.fspath(store), os.fspath(mnt)]
    code, stdout, stderr, was_mounted = mounting.run_expecting_failure(cmd, mnt, tmp_path)
    assert not was_mounted, f"mounted instead of failing (exit {code}, stderr {stderr!r})"
    assert code == 1, (code, stderr)
    lines = stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in stderr + stdout, stderr
    assert lines[0].startswith(f"zarrfs: {store}: {key}: shape") and "too large" in lines[0], lines[0]
