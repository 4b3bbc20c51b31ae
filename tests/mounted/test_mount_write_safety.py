"""Mounted writes that must not lose data (issue 8): a replace is all-or-nothing, a copy that
stops short (no whole NPY header, or fewer data bytes than the header declares) stores
nothing after its last close, big NPY headers go back in, names are checked per format before
anything is written, and files under temporary names are held aside until renamed to
NAME.npy (rsync, numpy users, editors).

Oracles: zarr-python 3 reading the store, the store's files on disk (byte for byte), the
fixtures' expected arrays, numpy's own NPY files; the daemon's log for what it promises
to say. zarrfs is reached only through its command line and the file system.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np
import pytest

from support import FIXTURES, builders, mounting, oracles
from support.builders import ArraySpec
from support.oracles import assert_same_array

FORMATS = pytest.mark.parametrize("fmt", [2, 3], ids=["v2", "v3"])
DRAFT = FIXTURES / "v3draft-2022-05"
V1 = FIXTURES / "v1"
# The array every replace test starts from: several chunks, so a half copy touches some.
OLD = ArraySpec("g/a", "int32", (37, 23), (10, 7), "zstd", attributes={"old": True})


def expect_oserror(code: int, fn, *args, **kw) -> OSError:
    with pytest.raises(OSError) as exc:
        fn(*args, **kw)
    assert exc.value.errno == code, f"{fn.__name__}{args}: expected {errno.errorcode[code]}, got {exc.value!r}"
    return exc.value


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file of a store, byte for byte (read from the disk, not through a mount)."""
    return {k: (root / k).read_bytes() for k in oracles.store_keys(root)}


def write_synced(path: Path, data: bytes) -> None:
    """Write a file and fsync it (a plain file is in the store when fsync returns)."""
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def warnings_naming(mount, mnt: Path, *needles: str) -> list[str]:
    return [
        ln for ln in mounting.log_lines_naming(mount.log_text(mnt), needles[0]) if all(n in ln for n in needles[1:])
    ]


def store_with_old(tmp_path: Path, fmt: int) -> tuple[Path, np.ndarray]:
    root = tmp_path / "s.zarr"
    builders.create_array(root, OLD, fmt, np.random.default_rng(8))
    return root, oracles.zarr_value(root, OLD.path)


def group_members(root: Path, path: str) -> list[str]:
    """Names of a group's members as zarr-python 3 lists them."""
    import zarr

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return sorted(name for name, _ in zarr.open_group(os.fspath(root), path=path, mode="r").members())


# --------------------------------------------------------------------------- validate first


def test_v1_replace_with_a_codec_v1_lacks_keeps_the_array(mount, tmp_path):
    root = tmp_path / "zlib_i4_C"  # the mount names a root array after its store
    shutil.copytree(V1 / "zlib_i4_C", root)
    model = np.load(V1 / "expected" / "zlib_i4_C.npy")
    before = snapshot(root)
    mnt = mount(root, "writable", "codec=zstd")
    np.save(tmp_path / "x.npy", np.arange(12.0).reshape(3, 4))
    e = expect_oserror(errno.EOPNOTSUPP, shutil.copyfile, tmp_path / "x.npy", mnt / "zlib_i4_C.npy")
    assert snapshot(root) == before, "the v1 store changed although the copy was refused"
    assert_same_array(np.load(mnt / "zlib_i4_C.npy"), model, f"the mount after {e}")
    assert warnings_naming(mount, mnt, "zstd")


def test_draft_replace_with_a_type_the_draft_lacks_keeps_the_array(mount, tmp_path):
    root = tmp_path / "core"
    shutil.copytree(DRAFT / "core", root)
    index = json.loads((DRAFT / "expected" / "index.json").read_text())["core"]["arrays"]
    model = np.load(DRAFT / "expected" / index["grp/sub/blosc_i4"]["file"])
    before = snapshot(root)
    mnt = mount(root, "writable")
    target = mnt / "grp" / "sub" / "blosc_i4.npy"
    np.save(tmp_path / "s.npy", np.array([b"a", b"b"], "|S1"))
    expect_oserror(errno.EOPNOTSUPP, shutil.copyfile, tmp_path / "s.npy", target)
    assert snapshot(root) == before, "the draft store changed although the copy was refused"
    assert_same_array(np.load(target), model, "the mount after the refused copy")
    assert "blosc_i4.npy" in os.listdir(mnt / "grp" / "sub")


# --------------------------------------------------------------------------- all-or-nothing replace


@FORMATS
def test_a_replace_is_invisible_to_peers_until_complete(mount, tmp_path, fmt):
    root, old = store_with_old(tmp_path, fmt)
    old_files = snapshot(root / "g" / "a")
    mnt = mount(root, "writable")
    x = builders.sample_data(np.dtype("<f8"), (20, 30), np.random.default_rng(3))
    data = oracles.npy_bytes(x)
    half = len(data) // 2
    fd = os.open(mnt / "g" / "a.npy", os.O_WRONLY | os.O_TRUNC)
    try:
        mounting.pwrite_all(fd, data[:half], 0)
        os.fsync(fd)  # the written chunks are stored, where peers do not look
        assert snapshot(root / "g" / "a") == old_files, "the old array's keys changed mid-copy"
        assert_same_array(oracles.zarr_value(root, "g/a"), old, "zarr-python reads mid-copy")
        assert group_members(root, "g") == ["a"], "peers see a node besides the array mid-copy"
        assert sorted(os.listdir(mnt / "g")) == ["a.npy"]
        mounting.pwrite_all(fd, data[half:], half)
    finally:
        os.close(fd)
    assert_same_array(oracles.zarr_value(root, "g/a"), x, "zarr-python after close")
    assert group_members(root, "g") == ["a"]
    assert not [k for k in oracles.store_keys(root) if ".zarrfs" in k], "staging keys left after the commit"
    assert (mnt / "g" / "a.npy").read_bytes() == data


def wait_for_warning(mount, mnt: Path, *needles: str) -> None:
    """The last close's verdict is logged at the release, which the kernel sends after close(2)
    returned: wait for its line."""
    assert mounting.wait_until(lambda: warnings_naming(mount, mnt, *needles), 10), mount.log_text(mnt)[-2000:]


@FORMATS
@pytest.mark.parametrize("target", ["over_an_array", "new_name"])
def test_a_copy_that_stops_short_stores_nothing_after_its_last_close(mount, tmp_path, fmt, target):
    root, old = store_with_old(tmp_path, fmt)
    before = snapshot(root)
    mnt = mount(root, "writable")
    name = "a" if target == "over_an_array" else "b"
    x = builders.sample_data(np.dtype("<i2"), (40, 30), np.random.default_rng(4))
    data = oracles.npy_bytes(x)
    hlen = len(data) - x.nbytes
    first = hlen + x.nbytes // 2
    fd = os.open(mnt / "g" / f"{name}.npy", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    mounting.pwrite_all(fd, data[:first], 0)
    os.close(fd)  # a flush cannot tell the last close from a forked child's: no error here
    wait_for_warning(mount, mnt, f"g/{name}.npy", f"received {first - hlen} of {x.nbytes} data bytes")
    assert snapshot(root) == before, "a short copy changed the store"
    assert_same_array(oracles.zarr_value(root, "g/a"), old, "zarr-python after the short copy")
    assert sorted(os.listdir(mnt / "g")) == ["a.npy"]
    assert_same_array(np.load(mnt / "g" / "a.npy"), old, "the mount after the short copy")
    assert len(warnings_naming(mount, mnt, f"g/{name}.npy")) == 1, "one line says it"


@pytest.mark.parametrize("case", ["5_bytes", "50_bytes", "length_claims_2GiB"])
def test_a_header_that_never_completes_fails_at_fsync_and_is_dropped(mount, tmp_path, case):
    root, _ = store_with_old(tmp_path, 3)
    before = snapshot(root)
    mnt = mount(root, "writable")
    data = oracles.npy_bytes(np.arange(10.0))
    content, reason = {
        "5_bytes": (data[:5], "NPY header incomplete after 5 bytes"),
        "50_bytes": (data[:50], "NPY header incomplete after 50 bytes"),
        "length_claims_2GiB": (
            b"\x93NUMPY\x02\x00" + struct.pack("<I", 2**31 - 1) + b"{'descr'",
            "header length field claims 2147483647 bytes",
        ),
    }[case]
    p = mnt / "g" / "h.npy"
    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        try:
            os.write(fd, content)
        except OSError as e:  # a length field past the bound is refused at once
            assert case == "length_claims_2GiB" and e.errno == errno.EINVAL, e
        else:
            expect_oserror(errno.EINVAL, os.fsync, fd)
    finally:
        os.close(fd)
    wait_for_warning(mount, mnt, "g/h.npy", reason)
    assert not warnings_naming(mount, mnt, "Traceback")
    assert "h.npy" not in os.listdir(mnt / "g")
    assert snapshot(root) == before


# --------------------------------------------------------------------------- big NPY headers


def test_an_npy_with_a_57k_header_served_by_the_mount_goes_back_in(mount, tmp_path):
    import zarr

    root = tmp_path / "rec.zarr"
    dt = np.dtype([(f"field_{i:04d}", "<i2") for i in range(3000)])
    x = np.zeros(3, dt)
    x["field_0007"], x["field_2999"] = [1, 2, 3], [7, 8, 9]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        zarr.open_group(os.fspath(root), mode="w", zarr_format=2)
        zarr.create_array(
            os.fspath(root), name="rec", shape=(3,), chunks=(2,), dtype=dt, zarr_format=2, fill_value=None
        )[...] = x
    mnt = mount(root, "writable")
    served = (mnt / "rec.npy").read_bytes()
    assert served == oracles.npy_bytes(x)
    assert len(served) - x.nbytes > 57_000
    shutil.copyfile(mnt / "rec.npy", mnt / "back.npy")
    assert_same_array(oracles.zarr_value(root, "back"), x, "zarr-python reads the copy")


# --------------------------------------------------------------------------- names


def _bad_names(fmt: str) -> dict[str, int]:
    long_name = "n" * 300
    common = {long_name: errno.ENAMETOOLONG, ".zarrfs-new-x": errno.EINVAL}
    return {
        "v2": {**common, "back\\slash": errno.EINVAL, ".zarray": errno.EINVAL},
        "v3": {**common, "__reserved": errno.EINVAL, "zarr.json": errno.EINVAL},
        "core": {
            **common,
            "with space": errno.EINVAL,
            "...": errno.EINVAL,
            "caf\u00e9": errno.EINVAL,
            "x" * 250: errno.ENAMETOOLONG,
        },
        "protocol": {**common, "with space": errno.EINVAL, "caf\u00e9": errno.EINVAL, "FOO": errno.EINVAL},
    }[fmt]


def _names_store(tmp_path: Path, fmt: str) -> Path:
    import zarr

    root = tmp_path / fmt
    if fmt in ("core", "protocol"):
        shutil.copytree(DRAFT / fmt, root)
    else:
        zarr.open_group(os.fspath(root), mode="w", zarr_format=int(fmt[1]))
    return root


@pytest.mark.parametrize("fmt", ["v2", "v3", "core", "protocol"])
def test_names_the_format_forbids_are_refused_before_anything_is_written(mount, tmp_path, fmt):
    root = _names_store(tmp_path, fmt)
    mnt = mount(root, "writable")
    os.mkdir(mnt / "foo")
    np.save(tmp_path / "x.npy", np.arange(6))
    shutil.copyfile(tmp_path / "x.npy", mnt / "ok.npy")
    before = snapshot(root)
    for name, code in _bad_names(fmt).items():
        what = f"{fmt}: {name[:20]!r}"
        expect_oserror(code, os.mkdir, mnt / name)
        if not name.startswith("."):  # hidden names are temporary files, held aside (tested below)
            expect_oserror(code, shutil.copyfile, tmp_path / "x.npy", mnt / f"{name}.npy")
        expect_oserror(code, os.rename, mnt / "ok.npy", mnt / f"{name}.npy")
        assert snapshot(root) == before, f"{what}: the store changed"
        assert f"{name}.npy" not in os.listdir(mnt) and name not in os.listdir(mnt), what
    assert_same_array(np.load(mnt / "ok.npy"), np.arange(6), "the array that was not renamed")


# --------------------------------------------------------------------------- files held aside


def _rsync_like(src: Path, target: Path) -> None:
    """What rsync -a does: mkstemp `.NAME.XXXXXX` beside the target, write, fchmod, close,
    set times, rename over the target."""
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with open(src, "rb") as f:
            while block := f.read(100_000):
                os.write(fd, block)
        os.fchmod(fd, 0o644)
    finally:
        os.close(fd)
    os.utime(tmp, (1_000_000_000, 1_000_000_000))
    os.rename(tmp, target)


@FORMATS
@pytest.mark.parametrize("target", ["absent", "existing"])
def test_write_to_a_temporary_name_then_rename_makes_the_array(mount, tmp_path, fmt, target):
    root, old = store_with_old(tmp_path, fmt)
    mnt = mount(root, "writable")
    name = "a" if target == "existing" else "new"
    x = builders.sample_data(np.dtype("<f4"), (300, 200), np.random.default_rng(6))  # 240 kB: many writes
    np.save(tmp_path / "x.npy", x)
    _rsync_like(tmp_path / "x.npy", mnt / "g" / f"{name}.npy")
    assert_same_array(oracles.zarr_value(root, f"g/{name}"), x, "zarr-python after the rename")
    assert (mnt / "g" / f"{name}.npy").read_bytes() == oracles.npy_bytes(x)
    assert sorted(os.listdir(mnt / "g")) == sorted({"a.npy", f"{name}.npy"})
    assert not [k for k in oracles.store_keys(root) if ".zarrfs" in k or k.rsplit("/", 1)[-1].startswith(".new")]


@FORMATS
def test_touch_makes_an_empty_file_that_cp_can_fill(mount, tmp_path, fmt):
    root, _ = store_with_old(tmp_path, fmt)
    before = snapshot(root)
    mnt = mount(root, "writable")
    subprocess.run(["touch", os.fspath(mnt / "g" / "new.npy")], check=True)
    assert sorted(os.listdir(mnt / "g")) == ["a.npy", "new.npy"]
    assert os.stat(mnt / "g" / "new.npy").st_size == 0
    assert snapshot(root) == before
    x = np.arange(12, dtype="<u2").reshape(3, 4)
    np.save(tmp_path / "x.npy", x)
    subprocess.run(["cp", os.fspath(tmp_path / "x.npy"), os.fspath(mnt / "g" / "new.npy")], check=True)
    assert_same_array(oracles.zarr_value(root, "g/new"), x, "zarr-python after cp onto the touched file")


@FORMATS
def test_numpy_save_to_a_temporary_file_then_os_replace(mount, tmp_path, fmt):
    root, _ = store_with_old(tmp_path, fmt)
    mnt = mount(root, "writable")
    x = builders.sample_data(np.dtype("<i8"), (50, 7), np.random.default_rng(2))
    script = (
        "import numpy as np, os, sys; x = np.load(sys.argv[1]); tmp = os.path.join(sys.argv[2], 'x.npy.part');"
        "f = open(tmp, 'wb'); np.save(f, x); f.close(); os.replace(tmp, os.path.join(sys.argv[2], 'x.npy'))"
    )
    np.save(tmp_path / "src.npy", x)
    subprocess.run([sys.executable, "-c", script, os.fspath(tmp_path / "src.npy"), os.fspath(mnt / "g")], check=True)
    assert_same_array(oracles.zarr_value(root, "g/x"), x, "zarr-python after os.replace")
    assert sorted(os.listdir(mnt / "g")) == ["a.npy", "x.npy"]


@FORMATS
def test_a_held_file_that_is_no_npy_cannot_become_an_array(mount, tmp_path, fmt):
    root, old = store_with_old(tmp_path, fmt)
    before = snapshot(root)
    mnt = mount(root, "writable")
    write_synced(mnt / "g" / "junk.tmp", b"not an NPY file at all")  # in the store at once
    expect_oserror(errno.EINVAL, os.rename, mnt / "g" / "junk.tmp", mnt / "g" / "a.npy")
    x = np.arange(100.0)
    write_synced(mnt / "g" / "short.tmp", oracles.npy_bytes(x)[:-8])
    expect_oserror(errno.EIO, os.rename, mnt / "g" / "short.tmp", mnt / "g" / "a.npy")
    assert sorted(os.listdir(mnt / "g")) == ["a.npy", "junk.tmp", "short.tmp"]  # the plain files stay
    assert snapshot(root) == {
        **before,
        "g/junk.tmp": b"not an NPY file at all",
        "g/short.tmp": oracles.npy_bytes(x)[:-8],
    }
    assert_same_array(oracles.zarr_value(root, "g/a"), old, "zarr-python after the refused renames")
    os.unlink(mnt / "g" / "junk.tmp")
    os.unlink(mnt / "g" / "short.tmp")
    assert snapshot(root) == before


@FORMATS
def test_a_staging_area_left_by_a_killed_daemon_is_never_a_node(mount, tmp_path, fmt):
    root, _ = store_with_old(tmp_path, fmt)
    shutil.copytree(root / "g" / "a", root / "g" / ".zarrfs-new-0123456789abcdef")  # with its metadata, even
    mnt = mount(root, "writable")
    assert sorted(os.listdir(mnt / "g")) == ["a.npy"]
    expect_oserror(errno.ENOENT, os.stat, mnt / "g" / ".zarrfs-new-0123456789abcdef")


# --------------------------------------------------------------------------- each commit path


def test_a_draft_replace_swaps_the_chunks_and_rewrites_the_document(mount, tmp_path):
    from support.v3draft import core_read

    root = tmp_path / "core"
    shutil.copytree(DRAFT / "core", root)
    mnt = mount(root, "writable")
    x = builders.sample_data(np.dtype("<f8"), (9, 13), np.random.default_rng(13))
    np.save(tmp_path / "x.npy", x)
    shutil.copyfile(tmp_path / "x.npy", mnt / "grp" / "sub" / "blosc_i4.npy")
    mounting.unmount_and_wait(mount, mnt)
    doc = json.loads((root / "meta" / "grp" / "sub" / "blosc_i4.array.json").read_text())
    assert doc["shape"] == [9, 13] and doc["data_type"] == "float64"
    assert_same_array(core_read(os.fspath(root), "grp/sub/blosc_i4", np.dtype("<f8")), x, "the spec decoder")
    assert not [k for k in oracles.store_keys(root) if ".zarrfs" in k]


@FORMATS
def test_a_replace_on_a_store_that_is_not_local_moves_keys(mount, tmp_path, fmt):
    root, _ = store_with_old(tmp_path, fmt)
    mnt, proc, log = mounting.mount_failing(mount, root, {"FAILFILE_FAIL_AT": ""})
    x = builders.sample_data(np.dtype("<u1"), (5, 40), np.random.default_rng(14))
    np.save(tmp_path / "x.npy", x)
    shutil.copyfile(tmp_path / "x.npy", mnt / "g" / "a.npy")
    assert_same_array(oracles.zarr_value(root, "g/a"), x, "zarr-python after the key moves")
    chunks = oracles.zarr_chunk_shape(root, "g/a")
    grid = [range(-(-s // c)) for s, c in zip(x.shape, chunks)]
    valid = {oracles.zarr_chunk_key(root, "g/a", (i, j)) for i in grid[0] for j in grid[1]}
    assert set(oracles.chunk_keys(root, "g/a")) <= valid, "chunks of the old array left"
    assert not [k for k in oracles.store_keys(root) if ".zarrfs" in k]
    assert (mnt / "g" / "a.npy").read_bytes() == oracles.npy_bytes(x)
