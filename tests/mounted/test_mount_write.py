"""Mounted tests of writes (``-o writable``, issue 5) for Zarr v1, v2 and v3.

In-place writes through every view (the .npy tree by mmap and by pwrite at unaligned
offsets, npy-f, raw, raw-f, chunk files), NPY header writes, ``cp`` creating and replacing
arrays, chunks equal to the fill value erased, mkdir/rmdir/rm/mv/setxattr, durability
(close, fsync, unmount, SIGTERM), concurrent writers, v1 root arrays.

Every expected value comes from outside zarrfs: numpy applying the same byte patch to
``np.save``'s bytes, zarr-python 3 and tensorstore reading the store directly, the store's
files on disk, and numcodecs decoding v1 chunk files. zarrfs is reached only through
its command line and the file system.
"""

from __future__ import annotations

import errno
import io
import itertools
import json
import os
import shutil
import signal
import stat
import subprocess
import threading
import time
import warnings
import zlib
from pathlib import Path

import numcodecs
import numpy as np
import pytest

from support import FIXTURES, builders, mounting, oracles
from support.builders import ArraySpec
from support.oracles import assert_same_array

FORMATS = pytest.mark.parametrize("fmt", [2, 3], ids=["v2", "v3"])
V1_FIXTURES = FIXTURES / "v1"

# Arrays the in-place tests write into: every codec family, C and F order, big-endian
# types, a structured type, v3 transpose and sharding, chunks never written (fill).
INPLACE_SPECS = {
    2: [
        ArraySpec("inplace/blosc_i4", "int32", (37, 23), (10, 7), "blosc"),
        ArraySpec("inplace/zstd_f8_F", "float64", (37, 23), (10, 7), "zstd", kwargs={"order": "F"}),
        ArraySpec("inplace/gzip_be_i2", ">i2", (37, 23), (10, 7), "gzip"),
        ArraySpec(
            "inplace/none_u1_partial",
            "uint8",
            (37, 23),
            (10, 7),
            "none",
            fill_value=9,
            write=(slice(0, 10), slice(0, 7)),
        ),
        ArraySpec(
            "inplace/slash_f4_3d_F",
            "float32",
            (5, 6, 7),
            (2, 4, 3),
            "zstd",
            kwargs={"order": "F", "chunk_key_encoding": {"name": "v2", "separator": "/"}},
        ),
        ArraySpec("inplace/struct", [("a", "<i4"), ("b", "<f8")], (20, 9), (6, 4), "blosc"),
    ],
    3: [
        ArraySpec("inplace/blosc_i4", "int32", (37, 23), (10, 7), "blosc"),
        ArraySpec("inplace/zstd_crc32c_f8", "float64", (37, 23), (10, 7), "zstd_crc32c"),
        ArraySpec("inplace/transpose_f4", "float32", (37, 23), (10, 7), "zstd", kwargs={"transpose": (1, 0)}),
        ArraySpec("inplace/big_endian_i2", "int16", (37, 23), (10, 7), "gzip", kwargs={"big_endian": True}),
        ArraySpec(
            "inplace/sharded_f4",
            "float32",
            (37, 23),
            (5, 7),
            "zstd",
            fill_value=-1.5,
            write=(slice(0, 10), slice(0, 7)),
            kwargs={"shards": (20, 14)},
        ),
        ArraySpec(
            "inplace/sharded_start_i2",
            "int16",
            (37, 23),
            (20, 14),
            "none",
            write=(slice(0, 37), slice(0, 9)),
            kwargs={"sharding_index_start": (5, 7)},
        ),
        ArraySpec(
            "inplace/key_v2_u1_3d",
            "uint8",
            (5, 6, 7),
            (2, 4, 3),
            "none",
            fill_value=9,
            write=(slice(0, 2), slice(0, 4), slice(0, 3)),
            kwargs={"chunk_key_encoding": {"name": "v2", "separator": "."}},
        ),
    ],
}
INPLACE_VIEWS = ["npy-mmap", "npy", "npy-f", "raw", "raw-f", "chunk"]
INPLACE_CASES = [(fmt, spec.path, view) for fmt in (2, 3) for spec in INPLACE_SPECS[fmt] for view in INPLACE_VIEWS]

# Arrays of the other tests in the shared writable store of each format.
OTHER_SPECS = [
    ArraySpec("hdr/a", "float32", (37, 23), (10, 7), "zstd"),
    ArraySpec("hdr/b", "int16", (12, 5), (5, 5), "none"),
    ArraySpec("hdr/c", "int32", (9, 4), (4, 4), "none"),
    ArraySpec("hdr/d", "float64", (30,), (8,), "zstd"),
    ArraySpec("replace/copyfile", "int32", (37, 23), (10, 7), "zstd", attributes={"old": True}),
    ArraySpec("replace/cp", "int32", (37, 23), (10, 7), "zstd", attributes={"old": True}),
    ArraySpec("replace/keep", "int32", (37, 23), (10, 7), "zstd"),
    ArraySpec("views/cp_over", "int32", (37, 23), (10, 7), "zstd"),
    ArraySpec("views/rm_then_cp", "int32", (37, 23), (10, 7), "zstd"),
    ArraySpec("fill/int7", "int32", (37, 23), (10, 7), "zstd", fill_value=7),
    ArraySpec("fill/nan", "float64", (37, 23), (10, 7), "blosc", fill_value=float("nan")),
    ArraySpec("fill/zero", "float32", (37, 23), (10, 7), "none", fill_value=0.0),
    ArraySpec("ns/rm_me", "float64", (37, 23), (10, 7), "zstd"),
    ArraySpec("ns/mv_a", "int16", (37, 23), (10, 7), "gzip", attributes={"moved": "yes"}),
    ArraySpec("ns/mv_over_src", "int16", (12, 5), (5, 5), "none"),
    ArraySpec("ns/mv_over_dst", "float64", (37, 23), (10, 7), "zstd"),
    ArraySpec("ns/mvg/x", "float32", (20, 9), (6, 4), "zstd"),
    ArraySpec("ns/mvg/sub/y", "uint8", (7,), (3,), "none"),
    ArraySpec("ns/attrs_arr", "int8", (4, 4), (2, 2), "none", attributes={"before": 1}),
    ArraySpec("dur/fsync", "float64", (37, 23), (10, 7), "zstd"),
    ArraySpec("dd/a", "int32", (37, 23), (10, 7), "blosc"),
    ArraySpec("conc/diff", "int32", (64, 64), (8, 8), "zstd"),
    ArraySpec("conc/same", "int64", (16, 24), (16, 12), "blosc"),
]
SHARDED_FILL_SPEC = ArraySpec(
    "fill/sharded", "float32", (40, 28), (5, 7), "zstd", fill_value=-1.5, kwargs={"shards": (20, 14)}
)
EXTRA_GROUPS = ["cp", "ns/sub", "ns/empty"]


def build_write_store(root: Path, fmt: int) -> None:
    """The shared writable store of one format, written by zarr-python 3."""
    import zarr

    rng = np.random.default_rng(5150 + fmt)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        g = zarr.open_group(os.fspath(root), mode="w", zarr_format=fmt, attributes={"store": "writes"})
        for spec in INPLACE_SPECS[fmt] + OTHER_SPECS + ([SHARDED_FILL_SPEC] if fmt == 3 else []):
            builders.create_array(root, spec, fmt, rng)
        for name in EXTRA_GROUPS:
            g.require_group(name)


@pytest.fixture(scope="module")
def wstore(module_mount, tmp_path_factory):
    """``wstore(fmt) -> (store root, mountpoint)``: one writable mount per format for this module."""
    built: dict = {}

    def get(fmt: int):
        if fmt not in built:
            root = tmp_path_factory.mktemp(f"writes-v{fmt}") / "w.zarr"
            build_write_store(root, fmt)
            built[fmt] = (root, module_mount(root, "writable"))
        return built[fmt]

    return get


def c_order(x: np.ndarray) -> np.ndarray:
    """A C-contiguous copy that keeps 0-d arrays 0-d (np.ascontiguousarray does not)."""
    return np.array(x, order="C", copy=True)


def seed_of(*parts) -> int:
    return zlib.crc32(repr(parts).encode())


def random_bytes(rng: np.random.Generator, n: int) -> bytes:
    return rng.integers(0, 256, n, dtype=np.uint8).tobytes()


def check_peers(root: Path, path: str, fmt: int, want: np.ndarray, what: str, *, tensorstore: bool = True) -> None:
    """zarr-python (and tensorstore) read WANT from the store at PATH."""
    assert_same_array(oracles.zarr_value(root, path), want, f"{what}: zarr-python reads")
    if tensorstore:
        ts_value = oracles.tensorstore_value(root, path, fmt)
        assert_same_array(
            ts_value.astype(want.dtype) if want.dtype.names is None else ts_value, want, f"{what}: tensorstore reads"
        )


def read_npy(p: Path) -> np.ndarray:
    return np.load(p, allow_pickle=False)


def expect_oserror(code: int, fn, *args, **kw) -> OSError:
    with pytest.raises(OSError) as exc:
        fn(*args, **kw)
    assert exc.value.errno == code, f"{fn.__name__}{args}: expected {errno.errorcode[code]}, got {exc.value!r}"
    return exc.value


def sane_ts(dtype: np.dtype, fmt: int) -> bool:
    """Whether tensorstore reads this data type: numbers, and v2 records of numbers (field by field);
    it knows no S/U/datetime, nor v3 structured types."""
    if dtype.names:
        return fmt == 2 and all(dtype[n].kind in "biufc" for n in dtype.names)
    return dtype.kind in "biufc"


# --------------------------------------------------------------------------- read-only sanity


@FORMATS
def test_without_writable_every_write_is_erofs(mount, tmp_path, fmt):
    root = tmp_path / "ro.zarr"
    builders.create_array(root, ArraySpec("a", "int32", (6, 4), (3, 3), "none"), fmt, np.random.default_rng(1))
    before = oracles.store_keys(root)
    mnt = mount(root)
    expect_oserror(errno.EROFS, os.open, mnt / "a.npy", os.O_WRONLY)
    expect_oserror(errno.EROFS, os.open, mnt / "new.npy", os.O_WRONLY | os.O_CREAT, 0o644)
    expect_oserror(errno.EROFS, os.mkdir, mnt / "g")
    expect_oserror(errno.EROFS, os.unlink, mnt / "a.npy")
    expect_oserror(errno.EROFS, os.setxattr, mnt / "a.npy", "user.zarr.attributes", b"{}")
    assert oracles.store_keys(root) == before


# --------------------------------------------------------------------------- in-place writes


def _inplace_pwrites(rng: np.random.Generator, size: int, hlen: int, item: int) -> list[tuple[int, int]]:
    """(offset, length) of writes into the data part of a file: partial elements at both ends,
    inside one element, spanning many chunks, up to the very last byte."""
    data = size - hlen
    out = []
    if item > 1:
        out.append((hlen + item * int(rng.integers(0, data // item)) + 1, item - 1))  # inside one element
    start = hlen + int(rng.integers(0, data // 2))
    out.append((start, int(rng.integers(1, min(data - (start - hlen), 3000)))))  # unaligned, many chunks
    tail = int(rng.integers(1, min(data, 2 * item + 3) + 1))
    out.append((size - tail, tail))  # up to the end, starting inside an element
    first = int(rng.integers(1, min(data, 5 * item) + 1))
    out.append((hlen, first))  # right after the header
    whole = item * int(rng.integers(1, max(2, data // item // 3)))
    at = hlen + item * int(rng.integers(0, (data - whole) // item + 1))
    out.append((at, whole))  # whole elements, aligned
    return out


@pytest.mark.parametrize("fmt,path,view", INPLACE_CASES, ids=[f"v{f}:{p}:{v}" for f, p, v in INPLACE_CASES])
def test_in_place_write(wstore, fmt, path, view):
    root, mnt = wstore(fmt)
    rng = np.random.default_rng(seed_of(fmt, path, view))
    docs = oracles.metadata_docs(root, path)
    model = oracles.zarr_value(root, path)
    item = model.dtype.itemsize

    if view == "npy-mmap":
        m = np.load(mnt / (path + ".npy"), mmap_mode="r+")
        assert m.shape == model.shape and m.dtype == model.dtype
        boxes = [
            tuple(slice(int(rng.integers(0, n // 2 + 1)), int(rng.integers(n // 2 + 1, n + 1))) for n in model.shape),
            tuple(slice(n - 1, n) for n in model.shape),
        ]  # the last element: an edge chunk
        for box in boxes:
            new = builders.sample_data(model.dtype, model[box].shape, rng)
            m[box] = new
            model[box] = new
        m.flush()
        del m
    elif view == "chunk":
        chunks = oracles.zarr_chunk_shape(root, path)
        grid = [-(-s // c) for s, c in zip(model.shape, chunks)]
        for idx in [tuple(n - 1 for n in grid), tuple(0 for _ in grid), tuple(n // 2 for n in grid)]:
            region = oracles.chunk_slices(idx, chunks, model.shape)
            part = c_order(model[region])
            p = oracles.chunk_file(mnt, path, idx)
            want = oracles.npy_bytes(part)
            assert p.stat().st_size == len(want), f"{p}: size"
            hlen = len(want) - part.nbytes
            assert p.read_bytes()[:hlen] == want[:hlen], f"{p}: header"
            fd = os.open(p, os.O_WRONLY)
            try:
                for off, n in _inplace_pwrites(rng, len(want), hlen, item):
                    data = random_bytes(rng, n)
                    mounting.pwrite_all(fd, data, off)
                    part = oracles.patched(part, "npy", off, data)
            finally:
                os.close(fd)
            model[region] = part
    else:
        p = oracles.view_file(mnt, path, view)
        want = oracles.view_bytes(model, view)
        hlen = len(want) - model.nbytes
        assert p.stat().st_size == len(want)
        assert p.read_bytes()[:hlen] == want[:hlen], f"{p}: header"
        fd = os.open(p, os.O_WRONLY)
        try:
            for off, n in _inplace_pwrites(rng, len(want), hlen, item):
                data = random_bytes(rng, n)
                mounting.pwrite_all(fd, data, off)
                model = oracles.patched(model, view, off, data)
        finally:
            os.close(fd)

    # close() returned: the chunks are in the store, encoded with the array's own codecs and layout
    check_peers(root, path, fmt, model, f"{path} after writes through {view}", tensorstore=sane_ts(model.dtype, fmt))
    assert oracles.metadata_docs(root, path) == docs, "the metadata documents changed"
    assert oracles.leftover_temp_files(root) == []
    # and the mount reads them back through every view
    assert mnt.joinpath(path + ".npy").read_bytes() == oracles.npy_bytes(model)
    assert oracles.view_file(mnt, path, "raw-f").read_bytes() == model.tobytes(order="F")


@FORMATS
def test_dd_conv_notrunc_patches_bytes(wstore, fmt, tmp_path):
    root, mnt = wstore(fmt)
    path = "dd/a"
    model = oracles.zarr_value(root, path)
    hlen = oracles.view_header_len(model, "npy")
    patch = tmp_path / "patch"
    data = random_bytes(np.random.default_rng(fmt), 777)
    patch.write_bytes(data)
    offset = hlen + 4 * 231 + 3
    r = subprocess.run(
        [
            "dd",
            f"if={patch}",
            f"of={mnt / (path + '.npy')}",
            "bs=100",
            f"seek={offset}",
            "oflag=seek_bytes",
            "conv=notrunc,fsync",
            "status=none",
        ],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    model = oracles.patched(model, "npy", offset, data)
    check_peers(root, path, fmt, model, "after dd")
    assert (mnt / (path + ".npy")).stat().st_size == len(oracles.npy_bytes(model))


# --------------------------------------------------------------------------- the NPY header


@FORMATS
def test_header_write_with_the_same_bytes_is_accepted(wstore, fmt):
    root, mnt = wstore(fmt)
    path = "hdr/a"
    model = oracles.zarr_value(root, path)
    full = oracles.npy_bytes(model)
    hlen = len(full) - model.nbytes
    p = mnt / (path + ".npy")
    fd = os.open(p, os.O_WRONLY)
    try:
        assert os.pwrite(fd, full[:hlen], 0) == hlen
        assert os.pwrite(fd, full[5:23], 5) == 18
        # the header's last bytes and data after them, in one write
        data = np.arange(10, dtype=model.dtype).tobytes()
        assert os.pwrite(fd, full[hlen - 7 : hlen] + data, hlen - 7) == 7 + len(data)
        model.reshape(-1)[:10] = np.arange(10, dtype=model.dtype)
    finally:
        os.close(fd)
    check_peers(root, path, fmt, model, "after header rewrite")
    assert p.read_bytes() == oracles.npy_bytes(model)


def _npy_header(descr, fortran: bool, shape) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        buf, {"descr": np.lib.format.dtype_to_descr(np.dtype(descr)), "fortran_order": fortran, "shape": tuple(shape)}
    )
    return buf.getvalue()


@FORMATS
@pytest.mark.parametrize("change", ["shape", "dtype", "fortran_order", "magic"])
def test_header_write_that_changes_the_array_is_einval(wstore, fmt, change):
    root, mnt = wstore(fmt)
    path = "hdr/b"
    docs = oracles.metadata_docs(root, path)
    model = oracles.zarr_value(root, path)
    hlen = oracles.view_header_len(model, "npy")
    new = {
        "shape": _npy_header(model.dtype, False, (5, 12)),
        "dtype": _npy_header(np.dtype("uint16"), False, model.shape),
        "fortran_order": _npy_header(model.dtype, True, model.shape),
        "magic": b"\x93NUMPX" + oracles.npy_bytes(model)[6:hlen],
    }[change]
    assert len(new) == hlen
    fd = os.open(mnt / (path + ".npy"), os.O_WRONLY)
    try:
        expect_oserror(errno.EINVAL, os.pwrite, fd, new, 0)
        diff = next(i for i in range(hlen) if new[i] != oracles.npy_bytes(model)[i])
        expect_oserror(errno.EINVAL, os.pwrite, fd, new[diff : diff + 1], diff)
    finally:
        os.close(fd)
    assert oracles.metadata_docs(root, path) == docs
    check_peers(root, path, fmt, model, "after refused header writes")
    assert (mnt / (path + ".npy")).read_bytes() == oracles.npy_bytes(model)


@FORMATS
def test_truncate_then_a_new_header_replaces_the_array(wstore, fmt):
    root, mnt = wstore(fmt)
    path = "hdr/c"
    p = mnt / (path + ".npy")
    x = np.asfortranarray(builders.sample_data(np.dtype("float64"), (6, 11), np.random.default_rng(3)))
    os.truncate(p, 0)
    body = oracles.npy_f_bytes(x)
    fd = os.open(p, os.O_WRONLY)
    try:
        mounting.pwrite_all(fd, body[:40], 0)  # the header arrives in two pieces
        mounting.pwrite_all(fd, body[40:], 40)
    finally:
        os.close(fd)
    check_peers(root, path, fmt, c_order(x), "after truncate and rewrite")
    assert read_npy(p).shape == (6, 11)
    assert p.read_bytes() == oracles.npy_bytes(x)


@FORMATS
def test_resize_to_another_nonzero_size_is_einval(wstore, fmt):
    root, mnt = wstore(fmt)
    path = "hdr/d"
    model = oracles.zarr_value(root, path)
    p = mnt / (path + ".npy")
    size = p.stat().st_size
    expect_oserror(errno.EINVAL, os.truncate, p, size - 8)
    expect_oserror(errno.EINVAL, os.truncate, p, size + 8)
    fd = os.open(p, os.O_WRONLY)
    try:  # files do not grow (README: EFBIG), not even by a write that starts inside them
        expect_oserror(errno.EFBIG, os.pwrite, fd, b"\0" * 16, size - 8)
        expect_oserror(errno.EFBIG, os.pwrite, fd, b"\0" * 16, size)
    finally:
        os.close(fd)
    assert p.stat().st_size == size
    check_peers(root, path, fmt, model, "after refused resizes")


@FORMATS
def test_times_and_modes_are_accepted_and_change_nothing(wstore, fmt, tmp_path):
    root, mnt = wstore(fmt)
    path = "hdr/d"
    keys = {k: (root / path / k).read_bytes() for k in oracles.store_keys(root, path)}
    p = mnt / f"{path}.npy"
    for cmd in (["touch", p], ["touch", "-d", "2001-02-03", p], ["chmod", "600", p], ["chmod", "755", mnt / "hdr"]):
        r = subprocess.run([os.fspath(c) for c in cmd], capture_output=True, text=True)
        assert r.returncode == 0, f"{cmd}: {r.stderr}"
    assert {k: (root / path / k).read_bytes() for k in oracles.store_keys(root, path)} == keys
    x = np.arange(7, dtype="<i8")
    np.save(tmp_path / "x.npy", x)
    r = subprocess.run(
        ["cp", "-p", os.fspath(tmp_path / "x.npy"), os.fspath(mnt / "cp" / "preserved.npy")],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    check_peers(root, "cp/preserved", fmt, x, "cp -p")


# --------------------------------------------------------------------------- cp creates arrays


def _cp_cases() -> dict:
    rng = np.random.default_rng(77)
    return {
        "c_f8": lambda: rng.standard_normal((13, 7)),
        "f_i2_3d": lambda: np.asfortranarray(rng.integers(-999, 999, (13, 7, 3)).astype("i2")),
        "be_f8": lambda: rng.standard_normal((9, 5)).astype(">f8"),
        "be_i4_F": lambda: np.asfortranarray(rng.integers(-9999, 9999, (6, 4)).astype(">i4")),
        "zerod": lambda: np.array(3.25),
        "bool": lambda: rng.random((11, 3)) > 0.5,
        "c8": lambda: (rng.standard_normal(10) + 1j * rng.standard_normal(10)).astype("c8"),
        "c16_F": lambda: np.asfortranarray(rng.standard_normal((4, 5)) + 1j * rng.standard_normal((4, 5))),
        "struct": lambda: np.array([(1, 2.5), (-3, 4.5), (7, np.nan)], dtype=[("a", "<i4"), ("b", "<f8")]),
        "S5": lambda: np.array([b"ab", b"hello", b"", b"x\x00y"], dtype="S5"),
        "multi_chunk_f4": lambda: rng.standard_normal((300, 257)).astype("f4"),
        "multi_chunk_F_i2": lambda: np.asfortranarray(rng.integers(-9999, 9999, (64, 50, 30)).astype("i2")),
    }


CP_CASES = list(_cp_cases())


def _copy(tool: str, src: Path, dst: Path) -> None:
    if tool == "copyfile":
        shutil.copyfile(src, dst)
    else:
        r = subprocess.run(["cp", os.fspath(src), os.fspath(dst)], capture_output=True, text=True)
        assert r.returncode == 0, f"cp {src} {dst}: {r.stderr.strip()}"


def _stored_dtype_ok(fmt: int, root: Path, path: str, x: np.ndarray) -> None:
    """The metadata document a peer reads names X's shape and data type."""
    if fmt == 2:
        doc = json.loads((root / path / ".zarray").read_text())
        assert doc["shape"] == list(x.shape)
        assert doc["dtype"] == oracles.descr_json(x.dtype)
    else:
        doc = json.loads((root / path / "zarr.json").read_text())
        assert doc["node_type"] == "array" and doc["shape"] == list(x.shape)


@FORMATS
@pytest.mark.parametrize("case", CP_CASES)
@pytest.mark.parametrize("tool", ["copyfile", "cp"])
def test_cp_creates_an_array(wstore, fmt, case, tool, tmp_path):
    root, mnt = wstore(fmt)
    x = _cp_cases()[case]()
    src = tmp_path / f"{case}.npy"
    np.save(src, x)
    name = f"{case}_{tool}"
    _copy(tool, src, mnt / "cp" / f"{name}.npy")
    path = f"cp/{name}"
    # v3 has no byte order in its data types: the values are what must survive
    want = c_order(x)
    if fmt == 3 and x.dtype.byteorder == ">":
        want = want.astype(x.dtype.newbyteorder("<"))
    assert f"{name}.npy" in os.listdir(mnt / "cp")
    _stored_dtype_ok(fmt, root, path, x)
    check_peers(root, path, fmt, want, f"cp {case}", tensorstore=sane_ts(x.dtype, fmt))
    assert_same_array(read_npy(mnt / f"{path}.npy"), want, "the mount reads the copy")
    assert oracles.leftover_temp_files(root) == []


# README: "chunks=N[,N...]" and "every option can be given as -o name[=value]"; options.py
# also takes ":" between the numbers, the one spelling that survives -o's comma split.
@FORMATS
@pytest.mark.parametrize("chunks_option", ["chunks=8:5", "chunks=8,5"], ids=["colon", "comma_as_documented"])
def test_created_arrays_use_the_chunks_and_codec_options(mount, tmp_path, fmt, chunks_option):
    import zarr

    root = tmp_path / "opts.zarr"
    zarr.open_group(os.fspath(root), mode="w", zarr_format=fmt)
    mnt = mount(root, "writable", chunks_option, "codec=zstd:3")
    x = np.random.default_rng(1).standard_normal((40, 21)).astype("f4")
    np.save(tmp_path / "x.npy", x)
    _copy("cp", tmp_path / "x.npy", mnt / "x.npy")
    if fmt == 2:
        doc = json.loads((root / "x" / ".zarray").read_text())
        assert doc["chunks"] == [8, 5]
        assert doc["compressor"]["id"] == "zstd" and doc["compressor"]["level"] == 3
    else:
        doc = json.loads((root / "x" / "zarr.json").read_text())
        assert doc["chunk_grid"]["configuration"]["chunk_shape"] == [8, 5]
        zstd = [c for c in doc["codecs"] if c["name"] == "zstd"]
        assert zstd and zstd[0]["configuration"]["level"] == 3, doc["codecs"]
    assert len(oracles.chunk_keys(root, "x")) == 5 * 5
    assert oracles.zarr_chunk_shape(root, "x") == (8, 5)
    check_peers(root, "x", fmt, x, "copy with chunks=8,5 codec=zstd:3")


@FORMATS
@pytest.mark.parametrize("tool", ["copyfile", "cp"])
def test_cp_over_an_array_replaces_it(wstore, fmt, tool, tmp_path):
    root, mnt = wstore(fmt)
    path = f"replace/{tool}"
    old_chunks = set(oracles.chunk_keys(root, path))
    assert len(old_chunks) == 4 * 4
    x = np.asfortranarray(builders.sample_data(np.dtype("float64"), (6, 5, 4), np.random.default_rng(9)))
    np.save(tmp_path / "new.npy", x)
    _copy(tool, tmp_path / "new.npy", mnt / f"{path}.npy")
    check_peers(root, path, fmt, c_order(x), "the replacement")
    assert read_npy(mnt / f"{path}.npy").shape == (6, 5, 4)
    assert json.loads(os.getxattr(mnt / f"{path}.npy", "user.zarr.shape")) == [6, 5, 4]
    # no chunk of the old array is left: every chunk key is one of the new grid's
    chunks = oracles.zarr_chunk_shape(root, path)
    grid = [range(-(-s // c)) for s, c in zip(x.shape, chunks)]
    valid = {oracles.zarr_chunk_key(root, path, idx) for idx in itertools.product(*grid)}
    stored = set(oracles.chunk_keys(root, path))
    assert stored <= valid, f"keys left over from the old array: {sorted(stored - valid)}"
    assert stored, "the replacement stored no chunk"


@FORMATS
@pytest.mark.parametrize("how", ["cp_over", "rm_then_cp"])
def test_views_follow_a_replaced_array(wstore, fmt, how, tmp_path):
    root, mnt = wstore(fmt)
    path = f"views/{how}"
    old = oracles.zarr_value(root, path)
    # every view of the old array is looked up and read first
    for view in ("npy-f", "raw", "raw-f"):
        assert oracles.view_file(mnt, path, view).read_bytes() == oracles.view_bytes(old, view), view
    assert oracles.chunk_file(mnt, path, (0, 0)).read_bytes() == oracles.npy_bytes(old[0:10, 0:7])
    x = builders.sample_data(np.dtype("<f8"), (6, 11), np.random.default_rng(12))
    np.save(tmp_path / "x.npy", x)
    if how == "rm_then_cp":
        os.unlink(mnt / f"{path}.npy")
    shutil.copyfile(tmp_path / "x.npy", mnt / f"{path}.npy")
    check_peers(root, path, fmt, x, "the replacement")
    assert (mnt / f"{path}.npy").read_bytes() == oracles.npy_bytes(x)
    for view in ("npy-f", "raw", "raw-f"):
        got = oracles.view_file(mnt, path, view).read_bytes()
        assert got == oracles.view_bytes(x, view), f"{view} still shows the old array ({len(got)} bytes)"
    chunks = oracles.zarr_chunk_shape(root, path)
    assert oracles.chunk_file(mnt, path, (0, 0)).read_bytes() == oracles.npy_bytes(x[: chunks[0], : chunks[1]])
    info = json.loads((mnt / ".zarrfs" / "info" / f"{path}.json").read_text())
    assert info["shape"] == [6, 11] and info["chunk_shape"] == list(chunks)


NOT_NPY = {
    "text": b"this is not an NPY file\n" * 700,
    "bad_header": b"\x93NUMPY\x01\x00\x76\x00{'descr': 'zz9', 'fortran_order': False, 'shape': (3,), }".ljust(128, b" ")
    + b"\0" * 64,
    "object_dtype": None,  # np.save of an object array (pickled): no fixed-size type
}


def _not_npy_file(case: str, tmp_path: Path) -> Path:
    p = tmp_path / f"{case}.npy"
    if case == "object_dtype":
        np.save(p, np.array([{"a": 1}, None], dtype=object), allow_pickle=True)
    else:
        p.write_bytes(NOT_NPY[case])
    return p


def _empty_store(root: Path, fmt: int) -> Path:
    import zarr

    g = zarr.open_group(os.fspath(root), mode="w", zarr_format=fmt)
    g.create_group("cp")
    return root


@FORMATS
@pytest.mark.parametrize("tool", ["copyfile", "cp"])
def test_a_file_that_is_not_npy_is_refused_and_leaves_nothing(mount, fmt, tool, tmp_path):
    root = _empty_store(tmp_path / "refuse.zarr", fmt)
    mnt = mount(root, "writable")
    before = oracles.store_keys(root)
    for case in NOT_NPY:
        src = _not_npy_file(case, tmp_path)
        name = f"bad_{case}"
        dst = mnt / "cp" / f"{name}.npy"
        if tool == "copyfile":
            expect_oserror(errno.EINVAL, shutil.copyfile, src, dst)
        else:
            r = subprocess.run(["cp", os.fspath(src), os.fspath(dst)], capture_output=True, text=True)
            assert r.returncode != 0 and "Invalid argument" in r.stderr, f"{case}: {r.stderr}"
        assert f"{name}.npy" not in os.listdir(mnt / "cp"), case
        assert not dst.exists(), case  # stat: ENOENT, whatever the kernel still caches
        assert not (root / "cp" / name).exists(), (case, oracles.store_keys(root, f"cp/{name}"))
        assert oracles.store_keys(root) == before, case


@FORMATS
def test_a_file_being_created_can_be_stat_before_its_header_arrives(mount, fmt, tmp_path):
    root = _empty_store(tmp_path / "slow.zarr", fmt)
    mnt = mount(root, "writable")
    fd = os.open(mnt / "cp" / "slow.npy", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        time.sleep(1.2)  # past the attribute timeout of a writable mount: the kernel asks again
        st = os.fstat(fd)
        assert stat.S_ISREG(st.st_mode)
        assert os.stat(mnt / "cp" / "slow.npy").st_size == st.st_size
        assert "slow.npy" in os.listdir(mnt / "cp")
        x = np.arange(5.0)
        mounting.pwrite_all(fd, oracles.npy_bytes(x), 0)
    finally:
        os.close(fd)
    check_peers(root, "cp/slow", fmt, x, "slow copy")


@FORMATS
def test_a_file_that_is_not_npy_over_an_array_leaves_it_as_it_was(wstore, fmt, tmp_path):
    root, mnt = wstore(fmt)
    path = "replace/keep"
    model = oracles.zarr_value(root, path)
    keys = {k: (root / path / k).read_bytes() for k in oracles.store_keys(root, path)}
    expect_oserror(errno.EINVAL, shutil.copyfile, _not_npy_file("text", tmp_path), mnt / f"{path}.npy")
    assert {k: (root / path / k).read_bytes() for k in oracles.store_keys(root, path)} == keys
    check_peers(root, path, fmt, model, "after a refused replacement")
    assert (mnt / f"{path}.npy").read_bytes() == oracles.npy_bytes(model)


# --------------------------------------------------------------------------- fill chunks are erased


@FORMATS
def test_chunks_written_to_the_fill_value_are_erased(wstore, fmt):
    root, mnt = wstore(fmt)
    path = "fill/int7"
    model = oracles.zarr_value(root, path)
    assert not (model == 7).any()
    key = lambda idx: oracles.zarr_chunk_key(root, path, idx)  # noqa: E731
    assert {key((1, 1)), key((3, 3)), key((2, 0)), key((0, 2))} <= set(oracles.chunk_keys(root, path))
    m = np.load(mnt / f"{path}.npy", mmap_mode="r+")
    m[10:20, 7:14] = 7  # chunk (1, 1) exactly
    m[30:37, 21:23] = 7  # the corner edge chunk (3, 3)
    m[0:10, 14:20] = 7  # all of chunk (0, 2) but one column: stays
    model[10:20, 7:14] = 7
    model[30:37, 21:23] = 7
    model[0:10, 14:20] = 7
    m.flush()
    del m
    # and through a chunk file: chunk (2, 0) written whole with the fill value
    p = oracles.chunk_file(mnt, path, (2, 0))
    fd = os.open(p, os.O_WRONLY)
    try:
        hlen = oracles.view_header_len(model[20:30, 0:7], "npy")
        mounting.pwrite_all(fd, np.full((10, 7), 7, "<i4").tobytes(), hlen)
    finally:
        os.close(fd)
    model[20:30, 0:7] = 7
    stored = set(oracles.chunk_keys(root, path))
    for idx in [(1, 1), (3, 3), (2, 0)]:
        assert key(idx) not in stored, f"chunk {idx} equal to the fill value is still stored"
    assert key((0, 2)) in stored and key((0, 0)) in stored
    check_peers(root, path, fmt, model, "fill chunks")
    assert (mnt / f"{path}.npy").read_bytes() == oracles.npy_bytes(model)


@FORMATS
def test_nan_fill_chunks_are_erased_and_negative_zero_is_kept(wstore, fmt):
    root, mnt = wstore(fmt)
    nan_model = oracles.zarr_value(root, "fill/nan")
    m = np.load(mnt / "fill/nan.npy", mmap_mode="r+")
    m[0:10, 0:7] = np.nan
    m.flush()
    del m
    nan_model[0:10, 0:7] = np.nan
    assert oracles.zarr_chunk_key(root, "fill/nan", (0, 0)) not in oracles.chunk_keys(root, "fill/nan")
    check_peers(root, "fill/nan", fmt, nan_model, "NaN fill")

    zero_model = oracles.zarr_value(root, "fill/zero")
    m = np.load(mnt / "fill/zero.npy", mmap_mode="r+")
    m[10:20, 0:7] = -0.0  # not the fill value's bytes: must be kept
    m[20:30, 0:7] = 0.0
    m.flush()
    del m
    zero_model[10:20, 0:7] = -0.0
    zero_model[20:30, 0:7] = 0.0
    stored = oracles.chunk_keys(root, "fill/zero")
    assert oracles.zarr_chunk_key(root, "fill/zero", (1, 0)) in stored, "a chunk of -0.0 was erased"
    assert oracles.zarr_chunk_key(root, "fill/zero", (2, 0)) not in stored
    got = oracles.zarr_value(root, "fill/zero")
    assert np.signbit(got[10:20, 0:7]).all(), "-0.0 read back as +0.0"
    assert_same_array(got, zero_model, "zero fill")


def test_v3_shard_of_fill_values_is_erased(wstore):
    root, mnt = wstore(3)
    path = "fill/sharded"
    model = oracles.zarr_value(root, path)
    shard = lambda idx: oracles.zarr_chunk_key(root, path, idx)  # noqa: E731
    assert len(oracles.chunk_keys(root, path)) == 4
    m = np.load(mnt / f"{path}.npy", mmap_mode="r+")
    m[0:20, 0:14] = -1.5  # shard (0, 0) whole
    m[20:25, 14:21] = -1.5  # one inner chunk of shard (1, 1)
    m.flush()
    del m
    model[0:20, 0:14] = -1.5
    model[20:25, 14:21] = -1.5
    stored = oracles.chunk_keys(root, path)
    assert shard((0, 0)) not in stored and shard((1, 1)) in stored
    check_peers(root, path, 3, model, "sharded fill")


# --------------------------------------------------------------------------- mkdir, rmdir, rm, mv, attributes


def _group_doc(root: Path, path: str, fmt: int) -> dict:
    if fmt == 2:
        return json.loads((root / path / ".zgroup").read_text())
    return json.loads((root / path / "zarr.json").read_text())


def _zarr_group(root: Path, path: str):
    import zarr

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return zarr.open_group(os.fspath(root / path), mode="r")


@FORMATS
def test_mkdir_creates_a_group(wstore, fmt, tmp_path):
    root, mnt = wstore(fmt)
    os.mkdir(mnt / "ns" / "made")
    os.makedirs(mnt / "ns" / "made" / "deeper" / "deepest")
    doc = _group_doc(root, "ns/made", fmt)
    assert doc["zarr_format"] == fmt and (fmt == 2 or doc["node_type"] == "group")
    assert _zarr_group(root, "ns/made/deeper/deepest").attrs.asdict() == {}
    assert "made" in [k for k, _ in _zarr_group(root, "ns").groups()]
    x = np.arange(12, dtype="u2").reshape(3, 4)
    np.save(tmp_path / "x.npy", x)
    shutil.copyfile(tmp_path / "x.npy", mnt / "ns/made/deeper/x.npy")
    check_peers(root, "ns/made/deeper/x", fmt, x, "an array in a new group")
    assert sorted(os.listdir(mnt / "ns/made/deeper")) == ["deepest", "x.npy"]
    expect_oserror(errno.EEXIST, os.mkdir, mnt / "ns" / "made")


@FORMATS
def test_rmdir_erases_an_empty_group_only(wstore, fmt, tmp_path):
    root, mnt = wstore(fmt)
    os.mkdir(mnt / "ns" / "gone")
    assert (root / "ns" / "gone").exists()
    os.rmdir(mnt / "ns" / "gone")
    assert oracles.store_keys(root, "ns/gone") == []
    assert "gone" not in os.listdir(mnt / "ns")
    assert "gone" not in [k for k, _ in _zarr_group(root, "ns").groups()]

    os.mkdir(mnt / "ns" / "full")
    np.save(tmp_path / "x.npy", np.ones(3))
    shutil.copyfile(tmp_path / "x.npy", mnt / "ns/full/x.npy")
    keys = oracles.store_keys(root, "ns/full")
    expect_oserror(errno.ENOTEMPTY, os.rmdir, mnt / "ns" / "full")
    assert oracles.store_keys(root, "ns/full") == keys
    expect_oserror(errno.ENOTDIR, os.rmdir, mnt / "ns" / "full" / "x.npy")
    os.rmdir(mnt / "ns" / "empty")  # a group zarr-python made
    assert oracles.store_keys(root, "ns/empty") == []


@FORMATS
def test_rm_erases_an_array_and_all_its_chunks(wstore, fmt):
    root, mnt = wstore(fmt)
    assert len(oracles.chunk_keys(root, "ns/rm_me")) == 16
    r = subprocess.run(["rm", os.fspath(mnt / "ns/rm_me.npy")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert oracles.store_keys(root, "ns/rm_me") == []
    assert not (root / "ns/rm_me").exists()
    assert "rm_me.npy" not in os.listdir(mnt / "ns")
    assert "rm_me" not in [k for k, _ in _zarr_group(root, "ns").arrays()]
    expect_oserror(errno.ENOENT, os.stat, mnt / "ns/rm_me.npy")


@FORMATS
def test_mv_moves_an_array_with_every_key(wstore, fmt):
    root, mnt = wstore(fmt)
    model = oracles.zarr_value(root, "ns/mv_a")
    keys = {k: (root / "ns/mv_a" / k).read_bytes() for k in oracles.store_keys(root, "ns/mv_a")}
    os.rename(mnt / "ns/mv_a.npy", mnt / "ns/sub/mv_b.npy")
    assert {k: (root / "ns/sub/mv_b" / k).read_bytes() for k in oracles.store_keys(root, "ns/sub/mv_b")} == keys
    assert oracles.store_keys(root, "ns/mv_a") == []
    assert "mv_a.npy" not in os.listdir(mnt / "ns") and "mv_b.npy" in os.listdir(mnt / "ns/sub")
    check_peers(root, "ns/sub/mv_b", fmt, model, "moved array")
    assert oracles.open_zarr_array(root, "ns/sub/mv_b").attrs.asdict() == {"moved": "yes"}
    assert (mnt / "ns/sub/mv_b.npy").read_bytes() == oracles.npy_bytes(model)


@FORMATS
def test_mv_onto_an_array_replaces_it(wstore, fmt):
    root, mnt = wstore(fmt)
    model = oracles.zarr_value(root, "ns/mv_over_src")
    os.rename(mnt / "ns/mv_over_src.npy", mnt / "ns/mv_over_dst.npy")
    check_peers(root, "ns/mv_over_dst", fmt, model, "moved over another array")
    assert oracles.store_keys(root, "ns/mv_over_src") == []
    assert len(oracles.chunk_keys(root, "ns/mv_over_dst")) == 3, "chunks of the replaced array are left"
    assert (mnt / "ns/mv_over_dst.npy").read_bytes() == oracles.npy_bytes(model)


def _renameat2(src: Path, dst: Path, flags: int) -> int:
    """renameat2(2) through libc: 0, or the errno it failed with."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    at_fdcwd = -100
    if libc.renameat2(at_fdcwd, os.fsencode(src), at_fdcwd, os.fsencode(dst), flags) == 0:
        return 0
    return ctypes.get_errno()


def test_mv_and_renameat2_flags(mount, tmp_path):
    """mv (renameat2 with RENAME_NOREPLACE first) logs nothing; NOREPLACE refuses an existing
    target with EEXIST; RENAME_EXCHANGE is refused with EINVAL, quietly."""
    import zarr

    root = tmp_path / "mv.zarr"
    g = zarr.open_group(root, mode="w", zarr_format=3)
    values = {name: np.arange(12, dtype="i2").reshape(3, 4) * (i + 1) for i, name in enumerate("ab")}
    for name, value in values.items():
        g.create_array(name, shape=value.shape, dtype=value.dtype, chunks=(2, 2))[...] = value
    mnt = mount(root, "writable")
    r = subprocess.run(["mv", os.fspath(mnt / "a.npy"), os.fspath(mnt / "c.npy")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert sorted(os.listdir(mnt)) == ["b.npy", "c.npy"]
    assert _renameat2(mnt / "c.npy", mnt / "b.npy", 1) == errno.EEXIST  # RENAME_NOREPLACE
    assert np.load(mnt / "b.npy").tolist() == values["b"].tolist()
    assert np.load(mnt / "c.npy").tolist() == values["a"].tolist()
    assert _renameat2(mnt / "c.npy", mnt / "d.npy", 1) == 0
    assert _renameat2(mnt / "d.npy", mnt / "b.npy", 2) == errno.EINVAL  # RENAME_EXCHANGE
    assert sorted(os.listdir(mnt)) == ["b.npy", "d.npy"]
    assert zarr.open_array(root / "d")[...].tolist() == values["a"].tolist()
    assert [line for line in mount.log_text(mnt).splitlines() if "WARNING" in line] == []


@FORMATS
def test_mv_moves_a_group_with_everything_below(wstore, fmt):
    root, mnt = wstore(fmt)
    values = {p: oracles.zarr_value(root, f"ns/mvg/{p}") for p in ("x", "sub/y")}
    keys = {k: (root / "ns/mvg" / k).read_bytes() for k in oracles.store_keys(root, "ns/mvg")}
    os.rename(mnt / "ns/mvg", mnt / "ns/sub/moved_group")
    assert {
        k: (root / "ns/sub/moved_group" / k).read_bytes() for k in oracles.store_keys(root, "ns/sub/moved_group")
    } == keys
    assert oracles.store_keys(root, "ns/mvg") == []
    assert "mvg" not in os.listdir(mnt / "ns")
    for p, v in values.items():
        check_peers(root, f"ns/sub/moved_group/{p}", fmt, v, f"moved group's {p}")
        assert (mnt / "ns/sub/moved_group" / f"{p}.npy").read_bytes() == oracles.npy_bytes(v)


@FORMATS
def test_setxattr_writes_attributes(wstore, fmt):
    root, mnt = wstore(fmt)
    attrs = {"units": "K", "scale": [1, 2.5], "nested": {"é": None}}
    for target, path in [(mnt / "ns/attrs_arr.npy", "ns/attrs_arr"), (mnt / "ns/sub", "ns/sub")]:
        os.setxattr(target, "user.zarr.attributes", json.dumps(attrs).encode())
        node = oracles.open_zarr_array(root, path) if path.endswith("arr") else _zarr_group(root, path)
        assert node.attrs.asdict() == attrs
        assert json.loads(os.getxattr(target, "user.zarr.attributes")) == attrs
        for bad in [b"[1, 2]", b"{not json", b"\xff\xfe", b'"text"']:
            expect_oserror(errno.EINVAL, os.setxattr, target, "user.zarr.attributes", bad)
        node = oracles.open_zarr_array(root, path) if path.endswith("arr") else _zarr_group(root, path)
        assert node.attrs.asdict() == attrs, "a refused setxattr changed the attributes"
    # the root group too
    os.setxattr(mnt, "user.zarr.attributes", b'{"root": true}')
    assert _zarr_group(root, "").attrs.asdict() == {"root": True}


@FORMATS
def test_consolidated_metadata_is_kept_current(mount, tmp_path, fmt):
    import zarr

    root = tmp_path / "cons.zarr"
    rng = np.random.default_rng(2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        zarr.open_group(os.fspath(root), mode="w", zarr_format=fmt)
        for spec in [
            ArraySpec("g/a", "int32", (9, 4), (4, 4), "zstd"),
            ArraySpec("g/b", "float32", (5,), (2,), "none"),
            ArraySpec("h/c", "uint8", (3,), (3,), "none"),
        ]:
            builders.create_array(root, spec, fmt, rng)
        builders.consolidate(root, fmt)
    mnt = mount(root, "writable")
    x = np.arange(6.0).reshape(2, 3)
    np.save(tmp_path / "x.npy", x)
    os.mkdir(mnt / "new")
    shutil.copyfile(tmp_path / "x.npy", mnt / "new/x.npy")
    os.unlink(mnt / "g/b.npy")
    os.rename(mnt / "h", mnt / "new/h2")
    os.setxattr(mnt / "g/a.npy", "user.zarr.attributes", b'{"k": 1}')
    mounting.unmount_and_wait(mount, mnt)

    def tree(use_consolidated: bool) -> dict:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            g = zarr.open_group(os.fspath(root), mode="r", use_consolidated=use_consolidated)
            return {k: (type(v).__name__, dict(v.attrs)) for k, v in g.members(max_depth=None)}

    listed = tree(False)
    assert set(listed) == {"g", "g/a", "new", "new/x", "new/h2", "new/h2/c"}
    assert listed["g/a"][1] == {"k": 1}
    assert tree(True) == listed, "consolidated metadata differs from the documents"


# --------------------------------------------------------------------------- durability


@FORMATS
def test_fsync_stores_the_chunks_before_close(wstore, fmt):
    root, mnt = wstore(fmt)
    path = "dur/fsync"
    model = oracles.zarr_value(root, path)
    hlen = oracles.view_header_len(model, "npy")
    data = np.full(50, 1234.5).tobytes()
    fd = os.open(mnt / f"{path}.npy", os.O_WRONLY)
    try:
        mounting.pwrite_all(fd, data, hlen + 8 * 100)
        os.fsync(fd)
        model.reshape(-1)[100:150] = 1234.5
        assert_same_array(oracles.zarr_value(root, path), model, "after fsync, file still open")
        mounting.pwrite_all(fd, data[:16], hlen)
        os.fdatasync(fd)
        model.reshape(-1)[:2] = 1234.5
        assert_same_array(oracles.zarr_value(root, path), model, "after fdatasync, file still open")
    finally:
        os.close(fd)


def _small_store(root: Path, fmt: int) -> np.ndarray:
    spec = ArraySpec("g/a", "float64", (40, 30), (16, 8), "zstd")
    builders.create_array(root, spec, fmt, np.random.default_rng(11))
    return oracles.zarr_value(root, "g/a")


@FORMATS
def test_mmap_writes_without_flush_survive_unmount_and_remount(mount, tmp_path, fmt):
    root = tmp_path / "dur.zarr"
    model = _small_store(root, fmt)
    mnt = mount(root, "writable")
    m = np.load(mnt / "g/a.npy", mmap_mode="r+")
    m[5:37, 3:29] = 42.0  # no flush(): the kernel writes the pages back when it must
    del m
    model[5:37, 3:29] = 42.0
    x = np.asfortranarray(np.arange(60, dtype=">i4").reshape(6, 10))
    np.save(tmp_path / "x.npy", x)
    shutil.copyfile(tmp_path / "x.npy", mnt / "g/x.npy")
    mounting.unmount_and_wait(mount, mnt)
    check_peers(root, "g/a", fmt, model, "after unmount")
    want_x = x.astype(x.dtype.newbyteorder("<")) if fmt == 3 else c_order(x)
    check_peers(root, "g/x", fmt, want_x, "copy after unmount")
    assert oracles.leftover_temp_files(root) == []
    again = mount(root)
    assert (again / "g/a.npy").read_bytes() == oracles.npy_bytes(model)
    assert_same_array(read_npy(again / "g/x.npy"), want_x, "remount reads the copy")


@FORMATS
def test_sigterm_of_a_foreground_daemon_stores_what_was_written(mount, tmp_path, fmt):
    root = tmp_path / "term.zarr"
    model = _small_store(root, fmt)
    mnt = mount(root, "writable", foreground=True)
    proc = mount.records[-1].proc
    hlen = oracles.view_header_len(model, "npy")
    rng = np.random.default_rng(4)
    fd = os.open(mnt / "g/a.npy", os.O_WRONLY)
    for _ in range(20):  # written, never closed nor fsynced
        n = int(rng.integers(1, 600))
        off = hlen + int(rng.integers(0, model.nbytes - n))
        data = random_bytes(rng, n)
        mounting.pwrite_all(fd, data, off)
        model = oracles.patched(model, "npy", off, data)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(mounting.EXIT_TIMEOUT_S) == 0
    assert mounting.wait_until(lambda: not mounting.is_mounted(mnt), 5)
    try:
        os.close(fd)
    except OSError:
        pass  # the connection is gone
    check_peers(root, "g/a", fmt, model, "after SIGTERM")
    again = mount(root)
    assert (again / "g/a.npy").read_bytes() == oracles.npy_bytes(model)


# --------------------------------------------------------------------------- concurrent writers


# The decoded-chunk cache holds what a flush is storing; with a cache smaller than the
# chunks being written (a documented setting: such chunks are "not kept") every
# read-modify-write of a chunk whose flush is still running must still see its data.
CACHE_CASES = {"default_cache": (), "cache_smaller_than_the_chunks": ("cache_size=16K",)}


@FORMATS
@pytest.mark.parametrize("cache", list(CACHE_CASES))
def test_concurrent_writers_to_different_chunks_lose_nothing(mount, tmp_path, fmt, cache):
    root = tmp_path / "conc.zarr"
    path = "conc/diff"
    builders.create_array(root, ArraySpec(path, "int32", (96, 256), (32, 32), "zstd"), fmt, np.random.default_rng(3))
    model = oracles.zarr_value(root, path)
    mnt = mount(root, "writable", *CACHE_CASES[cache])
    hlen = oracles.view_header_len(model, "npy")
    n_threads, rounds = 4, 150 if cache == "default_cache" else 300
    band = model.shape[1] // n_threads  # thread t owns columns [t*band, (t+1)*band): two chunk columns
    errors: list[BaseException] = []
    barrier = threading.Barrier(n_threads)

    def writer(t: int) -> None:
        rng = np.random.default_rng(seed_of("diff", fmt, t))
        try:
            fd = os.open(mnt / f"{path}.npy", os.O_WRONLY)
            barrier.wait()
            for _ in range(rounds):
                row = int(rng.integers(0, model.shape[0]))
                c0 = t * band + int(rng.integers(0, band))
                c1 = int(rng.integers(c0 + 1, (t + 1) * band + 1))
                vals = rng.integers(-(2**31), 2**31, c1 - c0, dtype=np.int64).astype("<i4")
                mounting.pwrite_all(fd, vals.tobytes(), hlen + 4 * (row * model.shape[1] + c0))
                model[row, c0:c1] = vals  # disjoint columns: no lock needed
                what = rng.integers(0, 6)
                if what == 0:
                    os.fsync(fd)
                elif what == 1:
                    os.close(fd)
                    fd = os.open(mnt / f"{path}.npy", os.O_WRONLY)
            os.close(fd)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(t,)) for t in range(n_threads)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
    assert not errors, errors
    check_peers(root, path, fmt, model, "after concurrent writers to different chunks")
    assert (mnt / f"{path}.npy").read_bytes() == oracles.npy_bytes(model)


@FORMATS
def test_concurrent_writers_to_one_chunk_last_write_wins_whole_elements(wstore, fmt):
    root, mnt = wstore(fmt)
    path = "conc/same"
    shape = (16, 24)
    hlen = oracles.view_header_len(oracles.zarr_value(root, path), "npy")
    n_threads, rounds = 4, 60
    fd = os.open(mnt / f"{path}.npy", os.O_WRONLY)
    try:  # every element starts as a pattern (0), so every element must end as one
        mounting.pwrite_all(fd, bytes(8 * 16 * 24), hlen)
    finally:
        os.close(fd)
    patterns = [np.uint64(0x0101010101010101 * (t + 1)).astype("<u8").view("<i8") for t in range(n_threads)]
    errors: list[BaseException] = []
    barrier = threading.Barrier(n_threads)

    def writer(t: int) -> None:
        rng = np.random.default_rng(seed_of("same", fmt, t))
        try:
            fd = os.open(mnt / f"{path}.npy", os.O_WRONLY)
            barrier.wait()
            for _ in range(rounds):
                a = int(rng.integers(0, 16 * 24))
                b = int(rng.integers(a + 1, 16 * 24 + 1))
                mounting.pwrite_all(fd, np.full(b - a, patterns[t]).tobytes(), hlen + 8 * a)
                if rng.integers(0, 4) == 0:
                    os.fsync(fd)
            os.close(fd)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(t,)) for t in range(n_threads)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
    assert not errors, errors
    got = oracles.zarr_value(root, path)
    raw = got.reshape(-1).view(np.uint8).reshape(-1, 8)
    torn = np.flatnonzero((raw != raw[:, :1]).any(axis=1) | (raw[:, 0] > n_threads))
    assert torn.size == 0, f"{torn.size} torn elements, e.g. {raw[torn[0]]}"
    assert (mnt / f"{path}.npy").read_bytes() == oracles.npy_bytes(got)
    # after the race, one writer alone: its write is what everyone reads
    final = np.arange(16 * 24, dtype="<i8").reshape(shape)
    fd = os.open(mnt / f"{path}.npy", os.O_WRONLY)
    try:
        mounting.pwrite_all(fd, final.tobytes(), hlen)
    finally:
        os.close(fd)
    check_peers(root, path, fmt, final, "after the last write")


# --------------------------------------------------------------------------- v1


def _v1_copy(tmp_path: Path, name: str = "zlib_i4_C") -> Path:
    root = tmp_path / name
    shutil.copytree(V1_FIXTURES / name, root)
    return root


def _v1_decode(root: Path) -> np.ndarray:
    """A v1 store's array from its files, decoded here with numcodecs (C-order chunks, compressor by name)."""
    meta = json.loads((root / "meta").read_text())
    assert meta["zarr_format"] == 1 and meta["order"] == "C"
    dtype = np.dtype(meta["dtype"] if isinstance(meta["dtype"], str) else [tuple(f) for f in meta["dtype"]])
    shape, chunks = tuple(meta["shape"]), tuple(meta["chunks"])
    codec = {
        "zlib": lambda o: numcodecs.Zlib(level=o),
        "none": None,
        "bz2": lambda o: numcodecs.BZ2(level=o),
        "blosc": lambda o: numcodecs.Blosc(**o),
    }[meta["compression"] or "none"]
    out = np.full(shape, meta["fill_value"], dtype)
    grid = [range(-(-s // c)) for s, c in zip(shape, chunks)]
    for idx in itertools.product(*grid):
        p = root / ".".join(map(str, idx))
        if not p.exists():
            continue
        raw = p.read_bytes()
        if codec is not None:
            raw = codec(meta["compression_opts"]).decode(raw)
        chunk = np.frombuffer(raw, dtype).reshape(chunks)
        region = oracles.chunk_slices(idx, chunks, shape)
        out[region] = chunk[tuple(slice(0, r.stop - r.start) for r in region)]
    return out


def test_v1_in_place_writes_reach_the_chunk_files(mount, tmp_path):
    root = _v1_copy(tmp_path)
    meta = (root / "meta").read_bytes()
    model = np.load(V1_FIXTURES / "expected" / "zlib_i4_C.npy")
    assert_same_array(_v1_decode(root), model, "the fixture decodes to what zarr 1.1.0 read")
    mnt = mount(root, "writable")
    p = mnt / "zlib_i4_C.npy"
    assert sorted(os.listdir(mnt)) == ["zlib_i4_C.npy"]
    m = np.load(p, mmap_mode="r+")
    m[3:12, 4:16] = np.arange(9 * 12).reshape(9, 12)  # stored chunks and never-written ones (1.2, 2.0, 2.1)
    m.flush()
    del m
    model[3:12, 4:16] = np.arange(9 * 12).reshape(9, 12)
    rng = np.random.default_rng(1)
    hlen = oracles.view_header_len(model, "npy")
    fd = os.open(p, os.O_WRONLY)
    try:
        for off, n in _inplace_pwrites(rng, len(oracles.npy_bytes(model)), hlen, 4):
            data = random_bytes(rng, n)
            mounting.pwrite_all(fd, data, off)
            model = oracles.patched(model, "npy", off, data)
        # and a raw-f write
        raw_f = oracles.view_file(mnt, "zlib_i4_C", "raw-f")
        data = random_bytes(rng, 101)
        with open(raw_f, "r+b") as f:
            f.seek(333)
            f.write(data)
        model = oracles.patched(model, "raw-f", 333, data)
    finally:
        os.close(fd)
    assert_same_array(_v1_decode(root), model, "v1 chunk files after close")
    assert p.read_bytes() == oracles.npy_bytes(model)
    mounting.unmount_and_wait(mount, mnt)
    assert (root / "meta").read_bytes() == meta
    assert_same_array(_v1_decode(root), model, "v1 chunk files after unmount")
    again = mount(root)
    assert (again / "zlib_i4_C.npy").read_bytes() == oracles.npy_bytes(model)


@pytest.mark.parametrize("tool", ["copyfile", "cp"])
def test_v1_root_array_is_replaced_by_cp(mount, tmp_path, tool):
    root = _v1_copy(tmp_path)
    mnt = mount(root, "writable")
    x = np.asfortranarray(builders.sample_data(np.dtype("<f8"), (7, 9), np.random.default_rng(8)))
    np.save(tmp_path / "x.npy", x)
    _copy(tool, tmp_path / "x.npy", mnt / "zlib_i4_C.npy")
    assert sorted(os.listdir(mnt)) == ["zlib_i4_C.npy"]
    assert_same_array(read_npy(mnt / "zlib_i4_C.npy"), c_order(x), "the mount reads the replacement")
    mounting.unmount_and_wait(mount, mnt)
    meta = json.loads((root / "meta").read_text())
    assert meta["zarr_format"] == 1 and meta["shape"] == [7, 9] and np.dtype(meta["dtype"]) == np.dtype("<f8")
    chunks = tuple(meta["chunks"])
    valid = {".".join(map(str, i)) for i in itertools.product(*[range(-(-s // c)) for s, c in zip((7, 9), chunks)])}
    files = set(oracles.store_keys(root)) - {"meta", "attrs"}
    assert files <= valid, f"files left over from the old array: {sorted(files - valid)}"
    assert_same_array(_v1_decode(root), c_order(x), "v1 files of the replacement")
    again = mount(root)
    assert_same_array(read_npy(again / "zlib_i4_C.npy"), c_order(x), "remount")


def test_v1_store_takes_no_other_nodes(mount, tmp_path):
    root = _v1_copy(tmp_path)
    before = {k: (root / k).read_bytes() for k in oracles.store_keys(root)}
    mnt = mount(root, "writable")
    with pytest.raises(OSError):
        os.mkdir(mnt / "g")
    np.save(tmp_path / "x.npy", np.ones(3))
    with pytest.raises(OSError):
        shutil.copyfile(tmp_path / "x.npy", mnt / "other.npy")
    assert sorted(os.listdir(mnt)) == ["zlib_i4_C.npy"]
    assert {k: (root / k).read_bytes() for k in oracles.store_keys(root)} == before


def test_v1_rsync_replaces_the_root_array_and_plain_files_stay(mount, tmp_path):
    """rsync without --inplace (a temporary `.NAME.XXXXXX` at the root, renamed over the array)
    replaces a v1 root array; plain files are keys at the store's root that the replace leaves."""
    root = _v1_copy(tmp_path)
    src = tmp_path / "src"
    src.mkdir()
    x = builders.sample_data(np.dtype("<f8"), (9, 13), np.random.default_rng(18))
    np.save(src / "zlib_i4_C.npy", x)
    mnt = mount(root, "writable")
    with open(mnt / "kept.txt", "wb") as f:  # in the store before the replace
        f.write(b"kept\n")
        os.fsync(f.fileno())
    subprocess.run(["rsync", "-a", os.fspath(src / "zlib_i4_C.npy"), f"{mnt}/"], check=True, timeout=120)
    subprocess.run(["sh", "-c", 'echo hi > "$1/notes.txt"', "sh", os.fspath(mnt)], check=True)
    assert sorted(os.listdir(mnt)) == ["kept.txt", "notes.txt", "zlib_i4_C.npy"]
    for name in ["meta", "attrs", "0.0", "0", ".zarray", "zarr.json"]:  # the array's keys, other formats' documents
        expect_oserror(errno.EINVAL, open, mnt / name, "wb")
    assert mounting.log_lines_naming(mount.log_text(mnt), "0.0")
    mounting.unmount_and_wait(mount, mnt)
    assert (root / "notes.txt").read_bytes() == b"hi\n" and (root / "kept.txt").read_bytes() == b"kept\n"
    assert_same_array(_v1_decode(root), x, "v1 files of the replacement")
    assert not [k for k in oracles.store_keys(root) if k.startswith(".")], "a temporary key is left"
    again = mount(root)
    assert sorted(os.listdir(again)) == ["kept.txt", "notes.txt", "zlib_i4_C.npy"]
    assert (again / "zlib_i4_C.npy").read_bytes() == (src / "zlib_i4_C.npy").read_bytes()
    assert (again / "notes.txt").read_bytes() == b"hi\n"


# --------------------------------------------------------------------------- v2/v3 root arrays and plain files

# (format, chunk key encoding of the root array, a plain file name that is one of its chunk keys)
ROOT_ARRAY_ENCODINGS = [
    (2, {"name": "v2", "separator": "."}, "0.1"),
    (2, {"name": "v2", "separator": "/"}, "0"),
    (3, {"name": "default", "separator": "/"}, "c"),
    (3, {"name": "default", "separator": "."}, "c.0.1"),
]


@pytest.mark.parametrize(
    "fmt,encoding,chunk_name", ROOT_ARRAY_ENCODINGS, ids=["v2-dot", "v2-slash", "v3-slash", "v3-dot"]
)
def test_root_array_rsync_replace_keeps_plain_files(mount, tmp_path, fmt, encoding, chunk_name):
    """A v2/v3 store whose root is an array takes plain files at its root: one written in an
    earlier mount is listed and survives the array's replacement by rsync without --inplace
    (a temporary `.temps.npy.XXXXXX` renamed over it); names of the format's keys are refused."""
    root = tmp_path / "temps.zarr"
    spec = ArraySpec("", "float32", (19, 11), (8, 4), "zstd", kwargs={"chunk_key_encoding": encoding})
    builders.create_array(root, spec, fmt, np.random.default_rng(19))
    old_chunks = set(oracles.chunk_keys(root, ""))
    doc = ".zarray" if fmt == 2 else "zarr.json"
    mnt = mount(root, "writable")
    kept = b"kept\n" * 1000
    with open(mnt / "kept.txt", "wb") as f:
        f.write(kept)
    assert sorted(os.listdir(mnt)) == ["kept.txt", "temps.npy"]
    mounting.unmount_and_wait(mount, mnt)
    assert (root / "kept.txt").read_bytes() == kept

    src = tmp_path / "src"
    src.mkdir()
    x = builders.sample_data(np.dtype("<i2"), (7, 9), np.random.default_rng(20))
    np.save(src / "temps.npy", x)
    mnt = mount(root, "writable")
    assert sorted(os.listdir(mnt)) == ["kept.txt", "temps.npy"]
    subprocess.run(["rsync", "-a", os.fspath(src / "temps.npy"), f"{mnt}/"], check=True, timeout=120)
    subprocess.run(["sh", "-c", 'echo hi > "$1/notes.txt"', "sh", os.fspath(mnt)], check=True)
    for name in (doc, chunk_name):
        with pytest.raises(OSError) as exc:
            open(mnt / name, "wb").close()
        assert exc.value.errno == errno.EINVAL, f"{name}: {exc.value!r}"
        assert mounting.log_lines_naming(mount.log_text(mnt), f"{name}: "), f"no WARNING names {name}"
    assert sorted(os.listdir(mnt)) == ["kept.txt", "notes.txt", "temps.npy"]
    mounting.unmount_and_wait(mount, mnt)

    assert_same_array(oracles.zarr_value(root, ""), x, "zarr-python 3 reads the replacement")
    grid = itertools.product(*[range(-(-s // c)) for s, c in zip(x.shape, oracles.zarr_chunk_shape(root, ""))])
    new_chunks = {oracles.zarr_chunk_key(root, "", idx) for idx in grid}
    left = set(oracles.store_keys(root)) - {doc, ".zattrs", "kept.txt", "notes.txt"} - new_chunks
    assert not left, f"keys of the old array ({len(old_chunks)} chunks) or temporary keys left: {sorted(left)}"
    assert (root / "kept.txt").read_bytes() == kept and (root / "notes.txt").read_bytes() == b"hi\n"
    again = mount(root)
    assert sorted(os.listdir(again)) == ["kept.txt", "notes.txt", "temps.npy"]
    assert (again / "temps.npy").read_bytes() == (src / "temps.npy").read_bytes()
    assert (again / "notes.txt").read_bytes() == b"hi\n"
    stored = sum((root / k).stat().st_size for k in new_chunks if (root / k).exists())
    assert os.stat(again / "temps.npy").st_blocks == -(-stored // 512), "st_blocks count the plain files"
