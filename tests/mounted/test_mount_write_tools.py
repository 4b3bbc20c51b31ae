"""Mounted writes as everyday tools make them: `cp` into a dataset xarray wrote, plain files
that must not vanish, and `rsync -a` / `cp -p` keeping the times they set.

Oracles: xarray and zarr-python reading the store directly, the store's files on disk, rsync's
own statistics. zarrfs is reached only through its command line and the file system.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from support import SUPPORT, mounting, oracles

FORMATS = pytest.mark.parametrize("fmt", [2, 3], ids=["v2", "v3"])


def open_dataset(root: Path, fmt: int):
    import xarray as xr

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return xr.open_zarr(root, zarr_format=fmt, consolidated=None).load()


def write_dataset(root: Path, fmt: int) -> None:
    import xarray as xr

    ds = xr.Dataset(
        {"t": (("time", "y", "x"), np.arange(60, dtype="f4").reshape(3, 4, 5))},
        coords={"x": np.arange(5), "y": np.arange(4.0), "time": np.arange(3)},
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ds.to_zarr(root, zarr_format=fmt)


# --------------------------------------------------------------------------- xarray datasets


@FORMATS
def test_cp_into_an_xarray_dataset_keeps_it_a_dataset(mount, tmp_path, fmt):
    import zarr

    root = tmp_path / "ds.zarr"
    write_dataset(root, fmt)
    mnt = mount(root, "writable")
    # Zeros that a `fill_value: 0.0` would turn into NaN; axis lengths 4 and 5 name y and x,
    # 7 matches no dimension, and a second axis of length 5 cannot reuse x.
    new_f = np.zeros((4, 5), "f8")
    new_f[0, 0] = 1.5
    new_i = np.zeros((7, 5, 5), "i2")
    new_i[1, 2, 3] = -4
    np.save(tmp_path / "f.npy", new_f)
    np.save(tmp_path / "i.npy", new_i)
    subprocess.run(["cp", tmp_path / "f.npy", tmp_path / "i.npy", mnt], check=True)
    ds = open_dataset(root, fmt)
    assert ds["f"].dims == ("y", "x")
    np.testing.assert_array_equal(ds["f"].values, new_f)  # zeros read as zeros, not NaN
    assert ds["i"].dims == ("dim_0_7", "x", "dim_2_5")
    np.testing.assert_array_equal(ds["i"].values, new_i)
    assert ds["i"].dtype == np.dtype("i2")
    np.testing.assert_array_equal(ds["t"].values, np.arange(60, dtype="f4").reshape(3, 4, 5))
    # The netCDF view maps fill values as xarray does: the zeros stay zeros there too.
    import xarray as xr

    with xr.open_dataset(mnt / ".zarrfs" / "netcdf" / "ds.nc", engine="scipy") as nc:
        assert nc["f"].dims == ("y", "x")
        np.testing.assert_array_equal(nc["f"].values, new_f)
        np.testing.assert_array_equal(nc["i"].values, new_i)
    # A second array of a generated length takes the name the first one made.
    np.save(tmp_path / "j.npy", np.ones(7, "u1"))
    shutil.copyfile(tmp_path / "j.npy", mnt / "j.npy")
    assert open_dataset(root, fmt)["j"].dims == ("dim_0_7",)
    # A group that is no dataset (its arrays carry no names) gets arrays as before.
    os.mkdir(mnt / "other")
    shutil.copyfile(tmp_path / "f.npy", mnt / "other" / "f.npy")
    f = zarr.open_array(root / "other" / "f", mode="r")
    assert f.fill_value == 0
    assert "_ARRAY_DIMENSIONS" not in f.attrs and getattr(f.metadata, "dimension_names", None) is None


# --------------------------------------------------------------------------- plain files


def expect_oserror(code: int, fn, *args) -> None:
    with pytest.raises(OSError) as exc:
        fn(*args)
    assert exc.value.errno == code, f"{fn.__name__}{args}: expected {errno.errorcode[code]}, got {exc.value!r}"


@FORMATS
def test_plain_files_are_kept_beside_the_hierarchy(mount, tmp_path, fmt):
    import zarr

    root = tmp_path / "ds.zarr"
    write_dataset(root, fmt)
    mnt = mount(root, "writable")
    os.mkdir(mnt / "g")
    subprocess.run(f"echo hi > '{mnt}/g/notes.txt'", shell=True, check=True)
    big = np.random.default_rng(3).bytes(9 << 20)  # more than a plain file keeps in memory
    (tmp_path / "big.bin").write_bytes(big)
    shutil.copyfile(tmp_path / "big.bin", mnt / "big.bin")
    (mnt / "draft.txt").write_bytes(b"first")
    os.rename(mnt / "draft.txt", mnt / "g" / "moved.txt")
    (mnt / "gone.txt").write_bytes(b"removed")
    os.unlink(mnt / "gone.txt")
    assert sorted(os.listdir(mnt / "g")) == ["moved.txt", "notes.txt"]
    assert (mnt / "g" / "notes.txt").read_bytes() == b"hi\n"
    assert (mnt / "big.bin").read_bytes() == big
    # Names a reader could take for the format's own keys are refused at create.
    for name in [".zarray", ".zmetadata", "zarr.json", "0.0"] if fmt == 2 else ["zarr.json", ".zgroup", "c", "0"]:
        expect_oserror(errno.EINVAL, open, mnt / "g" / name, "wb")
    assert mounting.log_lines_naming(mount.log_text(mnt), "g/0")
    mounting.unmount_and_wait(mount, mnt)

    # In the store as keys of their own, beside nodes the readers still open.
    assert (root / "g" / "notes.txt").read_bytes() == b"hi\n"
    assert (root / "g" / "moved.txt").read_bytes() == b"first"
    assert (root / "big.bin").read_bytes() == big
    assert not (root / "gone.txt").exists() and not (root / "draft.txt").exists()
    ds = open_dataset(root, fmt)
    np.testing.assert_array_equal(ds["t"].values, np.arange(60, dtype="f4").reshape(3, 4, 5))
    group = zarr.open_group(root, mode="r", zarr_format=fmt, use_consolidated=False)
    assert sorted(k for k, _ in group.members()) == ["g", "t", "time", "x", "y"]

    # After a remount: listed, readable, writable, renamable, removable.
    mnt = mount(root, "writable")
    assert sorted(os.listdir(mnt / "g")) == ["moved.txt", "notes.txt"]
    assert os.stat(mnt / "big.bin").st_size == len(big)
    assert (mnt / "big.bin").read_bytes() == big
    with open(mnt / "g" / "notes.txt", "r+b") as f:
        f.seek(1)
        f.write(b"ey")
    assert (mnt / "g" / "notes.txt").read_bytes() == b"hey"
    os.rename(mnt / "g" / "moved.txt", mnt / "g" / "renamed.txt")
    os.unlink(mnt / "big.bin")
    expect_oserror(errno.ENOTEMPTY, os.rmdir, mnt / "g")
    # A plain file that holds an NPY file becomes an array when renamed to NAME.npy.
    x = np.arange(6, dtype="<i4").reshape(2, 3)
    (mnt / "g" / "x.tmp").write_bytes(oracles.npy_bytes(x))
    os.rename(mnt / "g" / "x.tmp", mnt / "g" / "x.npy")
    # Plain files move with their group, even one open for writing.
    with open(mnt / "g" / "open.txt", "wb") as f:
        f.write(b"written ")
        os.rename(mnt / "g", mnt / "h")
        f.write(b"across a move")
    assert (mnt / "h" / "notes.txt").read_bytes() == b"hey"
    mounting.unmount_and_wait(mount, mnt)
    assert (root / "h" / "notes.txt").read_bytes() == b"hey"
    assert (root / "h" / "renamed.txt").read_bytes() == b"first"
    assert (root / "h" / "open.txt").read_bytes() == b"written across a move"
    assert not (root / "g").exists() and not (root / "big.bin").exists()
    assert not (root / "h" / "x.tmp").exists()
    np.testing.assert_array_equal(zarr.open_array(root / "h" / "x", mode="r")[...], x)


# --------------------------------------------------------------------------- write-back


def watch_store(directory: Path):
    """An inotify watch of a store directory: every name created or renamed into it."""
    from inotify_simple import INotify, flags

    watch = INotify()
    watch.add_watch(os.fspath(directory), flags.CREATE | flags.MOVED_TO)
    return watch


def names_seen(watch) -> list[str]:
    return [event.name for event in watch.read(timeout=0)]


def mount_stats(mnt: Path) -> dict:
    return json.loads((mnt / ".zarrfs" / "stats.json").read_bytes())


def test_rsync_of_an_array_writes_its_bytes_once(mount, tmp_path):
    """rsync's temporary file, renamed to x.npy right after its close, is never stored under
    its own name: the bytes reach the store once, as the array's chunks."""
    import zarr

    root = tmp_path / "s.zarr"
    zarr.open_group(root, mode="w", zarr_format=3).create_group("g")
    src = tmp_path / "src"
    src.mkdir()
    x = np.random.default_rng(5).random((200, 300))
    np.save(src / "x.npy", x)
    mnt = mount(root, "writable")
    watch = watch_store(root / "g")
    assert rsync_stats(src / "x.npy", mnt / "g")["Number of regular files transferred"] == "1"
    stats = mount_stats(mnt)
    mounting.unmount_and_wait(mount, mnt)  # nothing left to store at unmount either
    seen = names_seen(watch)
    assert "x" in seen
    assert not [n for n in seen if "x.npy" in n], f"rsync's temporary file reached the store: {seen}"
    np.testing.assert_array_equal(zarr.open_array(root / "g" / "x", mode="r")[...], x)
    assert stats["plain_files_stored"] == 0 and stats["plain_files_pending"] == 0


def test_plain_files_are_stored_at_fsync_write_back_and_unmount(mount, tmp_path):
    import zarr

    root = tmp_path / "s.zarr"
    zarr.open_group(root, mode="w", zarr_format=2).create_group("g")
    mnt = mount(root, "writable")
    watch = watch_store(root / "g")
    # Closed without fsync: readable and listed at once, from the daemon's copy.
    (mnt / "g" / "closed.txt").write_bytes(b"closed")
    assert (mnt / "g" / "closed.txt").read_bytes() == b"closed"
    # fsync stores at once: the key is on disk before the file is even closed.
    with open(mnt / "g" / "synced.txt", "wb") as f:
        f.write(b"synced")
        f.flush()
        os.fsync(f.fileno())
        assert (root / "g" / "synced.txt").read_bytes() == b"synced"
    # Renamed to another plain name, or removed, before its write-back: its first name is
    # never stored; a removed file never is.
    (mnt / "g" / "draft.tmp").write_bytes(b"draft")
    os.rename(mnt / "g" / "draft.tmp", mnt / "g" / "final.txt")
    assert (mnt / "g" / "final.txt").read_bytes() == b"draft"
    (mnt / "g" / "scratch.txt").write_bytes(b"scratch")
    os.unlink(mnt / "g" / "scratch.txt")
    assert sorted(os.listdir(mnt / "g")) == ["closed.txt", "final.txt", "synced.txt"]
    # The write-back comes by itself a few seconds after the close.
    assert mounting.wait_until(lambda: (root / "g" / "closed.txt").exists(), 60), "no write-back"
    assert (root / "g" / "closed.txt").read_bytes() == b"closed"
    # A clean unmount stores what is still waiting.
    (mnt / "g" / "late.txt").write_bytes(b"late")
    mounting.unmount_and_wait(mount, mnt)
    assert (root / "g" / "final.txt").read_bytes() == b"draft"
    assert (root / "g" / "late.txt").read_bytes() == b"late"
    seen = names_seen(watch)
    assert not [n for n in seen if "draft.tmp" in n or "scratch" in n], seen
    # SIGTERM stores what is waiting too; the next mount lists it.
    mnt = mount(root, "writable", foreground=True)
    proc = mount.records[-1].proc
    (mnt / "g" / "term.txt").write_bytes(b"before SIGTERM")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(mounting.EXIT_TIMEOUT_S) == 0
    assert (root / "g" / "term.txt").read_bytes() == b"before SIGTERM"
    mnt = mount(root)
    assert sorted(os.listdir(mnt / "g")) == ["closed.txt", "final.txt", "late.txt", "synced.txt", "term.txt"]


FAILING_STORE = SUPPORT / "failing_store.py"


def test_a_failed_write_back_is_said_once_and_the_file_kept(mount, tmp_path):
    """The store refuses the first write of a plain file: one WARNING, the file stays readable
    in the mount, and unmount stores it."""
    import zarr

    root = tmp_path / "s.zarr"
    zarr.open_group(root, mode="w", zarr_format=2).create_group("g")
    calls = tmp_path / "calls.txt"
    mnt, log = mount.new_mountpoint()
    env = {**os.environ, "FAILFILE_MATCH": "g/notes.txt", "FAILFILE_FAIL_AT": "1", "FAILFILE_CALLS": os.fspath(calls)}
    proc = subprocess.Popen(
        [
            sys.executable,
            os.fspath(FAILING_STORE),
            os.fspath(root),
            os.fspath(mnt),
            "-f",
            "-o",
            f"writable,log_file={log},log_level=info",
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    mount.adopt(mnt, log, proc)
    assert mounting.wait_until(lambda: mounting.is_mounted(mnt) or proc.poll() is not None, mounting.MOUNT_TIMEOUT_S)
    (mnt / "g" / "notes.txt").write_bytes(b"not lost")
    assert mounting.wait_until(lambda: mounting.log_lines_naming(mount.log_text(mnt), "g/notes.txt"), 60)
    assert (mnt / "g" / "notes.txt").read_bytes() == b"not lost"
    assert mount_stats(mnt)["plain_files_pending"] == 1  # tried again later
    assert not (root / "g" / "notes.txt").exists()
    mounting.unmount_and_wait(mount, mnt)
    assert (root / "g" / "notes.txt").read_bytes() == b"not lost"
    warnings_logged = mounting.log_lines_naming(mount.log_text(mnt), "g/notes.txt")
    assert len(warnings_logged) == 1 and "storing this plain file failed" in warnings_logged[0], warnings_logged
    assert [ln.split()[-1] for ln in calls.read_text().splitlines() if "notes.txt" in ln] == ["FAILED", "ok"]


# --------------------------------------------------------------------------- times


def rsync_stats(src: Path, dst: Path) -> dict[str, str]:
    out = subprocess.run(
        ["rsync", "-a", "--stats", os.fspath(src), os.fspath(dst)], check=True, capture_output=True, text=True
    ).stdout
    return dict(line.split(": ", 1) for line in out.splitlines() if ": " in line)


@FORMATS
def test_rsync_twice_transfers_nothing_the_second_time(mount, tmp_path, fmt):
    import zarr

    root = tmp_path / "s.zarr"
    zarr.open_group(root, mode="w", zarr_format=fmt).create_group("g")
    src = tmp_path / "src"
    src.mkdir()
    x = np.arange(3000, dtype="<f8").reshape(60, 50)
    np.save(src / "x.npy", x)
    (src / "notes.txt").write_bytes(b"plain\n")
    os.utime(src / "x.npy", ns=(1_500_000_000_123_456_789, 1_500_000_000_123_456_789))
    mnt = mount(root, "writable")
    first = rsync_stats(src / "x.npy", mnt / "g")
    assert first["Number of regular files transferred"] == "1"
    second = rsync_stats(src / "x.npy", mnt / "g")
    assert second["Number of regular files transferred"] == "0"
    assert second["Total transferred file size"] == "0 bytes"
    assert os.stat(mnt / "g" / "x.npy").st_mtime_ns == os.stat(src / "x.npy").st_mtime_ns
    # cp -p keeps times too, of arrays and of plain files; they are there after a remount.
    np.save(src / "y.npy", x[:3])
    os.utime(src / "y.npy", ns=(1_400_000_000_000_000_000, 1_400_000_000_000_000_000))
    os.utime(src / "notes.txt", ns=(1_300_000_000_000_000_000, 1_300_000_000_000_000_000))
    subprocess.run(["cp", "-p", src / "y.npy", src / "notes.txt", mnt / "g"], check=True)
    mounting.unmount_and_wait(mount, mnt)
    mnt = mount(root, "writable")
    for name in ("x.npy", "y.npy", "notes.txt"):
        assert os.stat(mnt / "g" / name).st_mtime_ns == os.stat(src / name).st_mtime_ns, name
    np.testing.assert_array_equal(zarr.open_array(root / "g" / "x", mode="r")[...], x)
    third = rsync_stats(src / "x.npy", mnt / "g")
    assert third["Number of regular files transferred"] == "0"


def rsync_changes(src: Path, dst: Path) -> list[str]:
    """What `rsync -a -i SRC/ DST/` lists: one line per file or directory it changed."""
    out = subprocess.run(
        ["rsync", "-a", "-i", f"{src}/", f"{dst}/"], check=True, capture_output=True, text=True, timeout=120
    ).stdout
    return out.splitlines()


def _dated_tree(src: Path) -> None:
    """src/{a/x.npy, a/deep/, b/}, every directory with a time of its own (set last, as a copy's are)."""
    (src / "a" / "deep").mkdir(parents=True)
    (src / "b").mkdir()
    np.save(src / "a" / "x.npy", np.arange(12, dtype="<i4").reshape(3, 4))
    for i, d in enumerate(["a/deep", "a", "b", ""]):
        t = 1_577_836_800_000_000_000 + i * 86_400_000_000_000  # 2020-01-01 onwards, a day apart
        os.utime(src / d, ns=(t, t))


@FORMATS
def test_rsync_of_a_tree_keeps_directory_times(mount, tmp_path, fmt):
    """Group directories keep the times rsync sets on them (in the store: a remount has them), so a
    second `rsync -a -i` lists nothing; `touch -d` on a group is kept too."""
    import zarr

    root = tmp_path / "s.zarr"
    zarr.open_group(root, mode="w", zarr_format=fmt).create_group("obs/sub")
    src = tmp_path / "src"
    _dated_tree(src)
    mnt = mount(root, "writable")
    target = mnt / "obs" / "sub"
    assert rsync_changes(src, target), "the first rsync copies the tree"
    assert rsync_changes(src, target) == []
    for d in ("", "a", "a/deep", "b"):
        assert os.stat(target / d).st_mtime_ns == os.stat(src / d).st_mtime_ns, d
    subprocess.run(["touch", "-d", "2020-06-01 12:00:00", mnt / "obs"], check=True)
    touched = os.stat(mnt / "obs").st_mtime_ns
    mounting.unmount_and_wait(mount, mnt)
    mnt = mount(root, "writable")
    assert rsync_changes(src, mnt / "obs" / "sub") == []
    assert os.stat(mnt / "obs").st_mtime_ns == touched
    np.testing.assert_array_equal(
        zarr.open_array(root / "obs" / "sub" / "a" / "x", mode="r")[...], np.load(src / "a" / "x.npy")
    )


def test_rsync_of_a_tree_into_a_bucket_keeps_directory_times_while_mounted(s3, mount, tmp_path):
    """An object store keeps no time of a prefix: the times set are kept for the mount's life."""
    import zarr

    from support.s3 import BUCKET, CREDENTIALS

    endpoint, fs = s3
    local = tmp_path / "t.zarr"
    zarr.open_group(local, mode="w", zarr_format=3).create_group("obs")
    fs.put(os.fspath(local), f"{BUCKET}/dirtimes.zarr", recursive=True)
    src = tmp_path / "src"
    _dated_tree(src)
    so = {"client_kwargs": {"endpoint_url": endpoint}, **CREDENTIALS}
    mnt = mount(f"s3://{BUCKET}/dirtimes.zarr", "writable", "storage_options=" + json.dumps(so))
    assert rsync_changes(src, mnt / "obs"), "the first rsync copies the tree"
    assert rsync_changes(src, mnt / "obs") == []
    for d in ("a", "a/deep", "b"):
        assert os.stat(mnt / "obs" / d).st_mtime_ns == os.stat(src / d).st_mtime_ns, d


@FORMATS
def test_setfattr_on_a_dataset_array_keeps_what_xarray_needs(mount, tmp_path, fmt):
    """Attributes set with setfattr replace the user's attributes, not xarray's own (the v2
    dimension names, the v3 missing-value mark); a null removes one of those on purpose."""
    root = tmp_path / "ds.zarr"
    write_dataset(root, fmt)
    mnt = mount(root, "writable")
    subprocess.run(["setfattr", "-n", "user.zarr.attributes", "-v", '{"units": "degC"}', mnt / "t.npy"], check=True)
    ds = open_dataset(root, fmt)
    assert ds["t"].dims == ("time", "y", "x")
    assert ds["t"].attrs["units"] == "degC"
    np.testing.assert_array_equal(ds["t"].values, np.arange(60, dtype="f4").reshape(3, 4, 5))
    assert ds["t"].encoding.get("_FillValue") is not None and np.isnan(ds["t"].encoding["_FillValue"])
    if fmt == 2:
        subprocess.run(
            ["setfattr", "-n", "user.zarr.attributes", "-v", '{"_ARRAY_DIMENSIONS": null}', mnt / "x.npy"], check=True
        )
        import zarr

        assert "_ARRAY_DIMENSIONS" not in zarr.open_array(root / "x", mode="r").attrs


def test_a_write_after_a_time_was_set_gives_the_array_a_new_time(mount, tmp_path):
    """As on any file system, a write that follows utimensat makes the file's time new again,
    also while a new .npy is still arriving (its time is given to the array at the commit)."""
    import zarr

    root = tmp_path / "s.zarr"
    zarr.open_group(root, mode="w", zarr_format=3)
    mnt = mount(root, "writable")
    x = np.arange(400, dtype="<f8")
    data = oracles.npy_bytes(x)
    old_ns = 1_300_000_000_000_000_000
    with open(mnt / "x.npy", "wb") as f:
        f.write(data[:1000])
        f.flush()
        os.utime(f.fileno(), ns=(old_ns, old_ns))
        f.write(data[1000:])
    assert os.stat(mnt / "x.npy").st_mtime_ns != old_ns
    np.testing.assert_array_equal(zarr.open_array(root / "x", mode="r")[...], x)
