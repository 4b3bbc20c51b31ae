"""Mounted reads of a local v2 and v3 hierarchy: the tree, every array byte for byte against np.save, xattrs, EROFS."""

from __future__ import annotations

import errno
import json
import os
import stat
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from support import builders, oracles

ARRAYS = [(fmt, spec.path) for fmt in (2, 3) for spec in builders.array_specs(fmt)]
ARRAY_IDS = [f"v{fmt}:{path}" for fmt, path in ARRAYS]
FORMATS = pytest.mark.parametrize("fmt", [2, 3], ids=["v2", "v3"])
XATTR_NAMES = ["user.zarr.attributes", "user.zarr.shape", "user.zarr.dtype", "user.zarr.chunks", "user.zarr.codecs"]


def npy_path(mnt, path):
    return mnt / (path + ".npy")


# --------------------------------------------------------------------------- the tree


@FORMATS
def test_root_listing(hierarchy_mount, fmt):
    h, mnt = hierarchy_mount(fmt)
    names = os.listdir(mnt)
    assert ".zarrfs" not in names
    assert sorted(names) == h.listing("")


@FORMATS
def test_every_group_listing(hierarchy_mount, fmt):
    h, mnt = hierarchy_mount(fmt)
    for group in h.all_groups():
        d = mnt / group if group else mnt
        assert sorted(os.listdir(d)) == h.listing(group), f"listing of group {group!r}"


@FORMATS
def test_walk_finds_exactly_the_hierarchy(hierarchy_mount, fmt):
    h, mnt = hierarchy_mount(fmt)
    dirs, files = set(), set()
    for top, _dirnames, filenames in os.walk(mnt):
        rel = os.path.relpath(top, mnt)
        rel = "" if rel == "." else rel
        dirs.add(rel)
        for f in filenames:
            files.add(os.path.join(rel, f) if rel else f)
    assert dirs == set(h.all_groups())
    assert files == {a + ".npy" for a in h.arrays}


@FORMATS
def test_directories_stat_as_directories(hierarchy_mount, fmt):
    h, mnt = hierarchy_mount(fmt)
    for group in h.all_groups():
        st = os.stat(mnt / group if group else mnt)
        assert stat.S_ISDIR(st.st_mode), group
        assert st.st_mode & stat.S_IRUSR and st.st_mode & stat.S_IXUSR, oct(st.st_mode)


@FORMATS
def test_missing_names_are_enoent(hierarchy_mount, fmt):
    h, mnt = hierarchy_mount(fmt)
    for name in ["nope.npy", "top", "dtypes/int8", "dtypes/nope/x.npy", "top.npy/x"]:
        with pytest.raises(OSError) as exc:
            os.stat(mnt / name)
        assert exc.value.errno in (errno.ENOENT, errno.ENOTDIR), (name, exc.value)


# --------------------------------------------------------------------------- array contents


@pytest.mark.parametrize("fmt,path", ARRAYS, ids=ARRAY_IDS)
def test_stat_size_is_npy_size(hierarchy_mount, fmt, path):
    h, mnt = hierarchy_mount(fmt)
    st = os.stat(npy_path(mnt, path))
    assert stat.S_ISREG(st.st_mode)
    assert st.st_mode & stat.S_IRUSR
    assert st.st_size == len(h.expected(path).npy)


@pytest.mark.parametrize("fmt,path", ARRAYS, ids=ARRAY_IDS)
def test_whole_file_is_np_save_bytes(hierarchy_mount, fmt, path):
    h, mnt = hierarchy_mount(fmt)
    with open(npy_path(mnt, path), "rb") as f:
        data = f.read()
    expected = h.expected(path).npy
    assert len(data) == len(expected)
    if data != expected:
        first = next(i for i, (a, b) in enumerate(zip(data, expected)) if a != b)
        pytest.fail(
            f"first differing byte at offset {first} of {len(expected)}: "
            f"got {data[first : first + 16]!r}, want {expected[first : first + 16]!r}"
        )


@pytest.mark.parametrize("fmt,path", ARRAYS, ids=ARRAY_IDS)
def test_np_load_and_mmap_give_zarr_values(hierarchy_mount, fmt, path):
    h, mnt = hierarchy_mount(fmt)
    e = h.expected(path)
    want = np.array(e.value, order="C", copy=True)
    loaded = np.load(npy_path(mnt, path), allow_pickle=False)
    assert loaded.dtype == want.dtype
    assert loaded.shape == want.shape
    np.testing.assert_array_equal(loaded, want)
    mm = np.load(npy_path(mnt, path), mmap_mode="r", allow_pickle=False)
    try:
        assert mm.dtype == want.dtype and mm.shape == want.shape
        np.testing.assert_array_equal(np.array(mm), want)
    finally:
        del mm


def _pread_cases(size: int, rng: np.random.Generator) -> list[tuple[int, int]]:
    cases = [(0, 0), (0, 1), (0, 10), (0, size), (0, size + 100), (size, 0), (size, 10), (size + 5000, 10)]
    if size:
        cases += [(size - 1, 1), (size - 1, 100), (size // 2, 0), (127, 3), (128, size)]
    sizes = [0, 1, 3, 7, 4095, 4096, 4097, 65536 + 13, 131072 + 1, 1 << 20]
    for _ in range(60):
        off = int(rng.integers(0, size + 64))
        n = int(rng.choice(sizes)) if rng.random() < 0.6 else int(rng.integers(0, size + 2))
        cases.append((off, n))
    return cases


@pytest.mark.parametrize("fmt,path", ARRAYS, ids=ARRAY_IDS)
def test_pread_at_random_offsets(hierarchy_mount, fmt, path):
    h, mnt = hierarchy_mount(fmt)
    expected = h.expected(path).npy
    rng = np.random.default_rng(zlib.crc32(f"{fmt}:{path}".encode()))
    fd = os.open(npy_path(mnt, path), os.O_RDONLY)
    try:
        for off, n in _pread_cases(len(expected), rng):
            got = os.pread(fd, n, off)
            assert got == expected[off : off + n], f"pread(size={n}, offset={off}) of a {len(expected)}-byte file"
    finally:
        os.close(fd)


def test_concurrent_readers_get_the_same_bytes(hierarchy_mount):
    """Many threads reading overlapping ranges of the same files (shared chunk loads)."""
    jobs = []
    for fmt in (2, 3):
        h, mnt = hierarchy_mount(fmt)
        for path in ["codecs/blosc", "codecs/zstd", "codecs/gzip", "edge/vector", "fill/nan"]:
            jobs.append((npy_path(mnt, path), h.expected(path).npy))

    def work(seed: int) -> list[str]:
        rng = np.random.default_rng(seed)
        bad = []
        for _ in range(40):
            p, expected = jobs[int(rng.integers(len(jobs)))]
            off = int(rng.integers(0, len(expected)))
            n = int(rng.integers(1, 300_000))
            with open(p, "rb", buffering=0) as f:
                f.seek(off)
                got = f.read(n)
            if got != expected[off : off + n]:
                bad.append(f"{p} [{off}:{off + n}]")
        return bad

    with ThreadPoolExecutor(8) as pool:
        failures = [b for result in pool.map(work, range(16)) for b in result]
    assert not failures


# --------------------------------------------------------------------------- extended attributes


def _xattr_json(p, name):
    return json.loads(os.getxattr(p, name).decode("utf-8"))


@pytest.mark.parametrize("fmt,path", ARRAYS, ids=ARRAY_IDS)
def test_array_xattrs(hierarchy_mount, fmt, path):
    h, mnt = hierarchy_mount(fmt)
    e = h.expected(path)
    p = npy_path(mnt, path)
    assert set(XATTR_NAMES) <= set(os.listxattr(p))
    assert _xattr_json(p, "user.zarr.attributes") == e.attributes
    assert _xattr_json(p, "user.zarr.shape") == e.shape
    assert _xattr_json(p, "user.zarr.dtype") == e.descr
    assert _xattr_json(p, "user.zarr.chunks") == e.chunks
    assert isinstance(_xattr_json(p, "user.zarr.codecs"), list)
    for other in ("security.selinux", "system.posix_acl_access", "user.zarr.nothing", "user.other"):
        with pytest.raises(OSError) as exc:  # what `ls -l` asks of every file: none
            os.getxattr(p, other)
        assert exc.value.errno == errno.ENODATA, other


@FORMATS
def test_group_xattrs(hierarchy_mount, fmt):
    h, mnt = hierarchy_mount(fmt)
    for group, attrs in h.groups.items():
        d = mnt / group if group else mnt
        assert "user.zarr.attributes" in os.listxattr(d), group
        assert _xattr_json(d, "user.zarr.attributes") == attrs, group


@FORMATS
def test_implied_group_xattrs_are_empty_or_absent(hierarchy_mount, fmt):
    h, mnt = hierarchy_mount(fmt)
    for group in h.implied_groups:
        try:
            value = _xattr_json(mnt / group, "user.zarr.attributes")
        except OSError as exc:
            assert exc.errno == errno.ENODATA, (group, exc)
        else:
            assert value == {}, group


@FORMATS
def test_unknown_xattr_is_enodata(hierarchy_mount, fmt):
    h, mnt = hierarchy_mount(fmt)
    for p in [mnt / "top.npy", mnt / "dtypes"]:
        with pytest.raises(OSError) as exc:
            os.getxattr(p, "user.no.such.attribute")
        assert exc.value.errno == errno.ENODATA


# --------------------------------------------------------------------------- read-only


def _rewrite(path, text):
    with open(path, "wb") as f:
        f.write(text)


def _write_ops(mnt):
    arr = mnt / "top.npy"
    # The files a read-only mount lets be rewritten, and only to save GDAL's statistics.
    vrt = mnt / ".zarrfs" / "gdal" / "top.vrt"
    aux = mnt / ".zarrfs" / "raw" / "top.raw.aux.xml"
    return {
        "open_r+": lambda: open(arr, "r+b"),
        "open_w_trunc": lambda: open(arr, "wb"),
        "open_append": lambda: open(arr, "ab"),
        "create_file": lambda: os.open(mnt / "dtypes" / "new.npy", os.O_CREAT | os.O_WRONLY, 0o644),
        "mkdir": lambda: os.mkdir(mnt / "newgroup"),
        "rmdir": lambda: os.rmdir(mnt / "empty_group"),
        "unlink": lambda: os.unlink(arr),
        "rename": lambda: os.rename(arr, mnt / "renamed.npy"),
        "rename_dir": lambda: os.rename(mnt / "edge", mnt / "edge2"),
        "truncate": lambda: os.truncate(arr, 0),
        "setxattr": lambda: os.setxattr(arr, "user.zarr.attributes", b"{}"),
        "setxattr_group": lambda: os.setxattr(mnt / "dtypes", "user.zarr.attributes", b"{}"),
        "removexattr": lambda: os.removexattr(arr, "user.zarr.attributes"),
        "chmod": lambda: os.chmod(arr, 0o600),
        "utime": lambda: os.utime(arr, (0, 0)),
        "symlink": lambda: os.symlink("top.npy", mnt / "link.npy"),
        "link": lambda: os.link(arr, mnt / "hard.npy"),
        "utime_now": lambda: os.utime(arr),
        "vrt_open_w": lambda: os.open(vrt, os.O_WRONLY),
        "vrt_open_append": lambda: open(vrt, "ab"),
        "vrt_truncate": lambda: os.truncate(vrt, 0),
        "vrt_chmod": lambda: os.chmod(vrt, 0o600),
        "vrt_rewrite_not_statistics": lambda: _rewrite(vrt, b"<VRTDataset/>\n"),
        "aux_open_append": lambda: open(aux, "ab"),
        "aux_rewrite_not_statistics": lambda: _rewrite(
            aux, b'<PAMDataset><Metadata><MDI key="A">1</MDI></Metadata></PAMDataset>'
        ),
        "aux_unlink": lambda: os.unlink(aux),
    }


WRITE_OPS = list(_write_ops(Path("/")))


@FORMATS
@pytest.mark.parametrize("op", WRITE_OPS)
def test_writes_fail_with_erofs(hierarchy_mount, fmt, op):
    h, mnt = hierarchy_mount(fmt)
    before = sorted(os.listdir(mnt))
    with pytest.raises(OSError) as exc:
        result = _write_ops(mnt)[op]()
        if hasattr(result, "close"):
            result.close()
        elif isinstance(result, int):
            os.close(result)
    assert exc.value.errno == errno.EROFS, f"{op}: {exc.value!r}"
    assert sorted(os.listdir(mnt)) == before
    assert open(mnt / "top.npy", "rb").read() == h.expected("top").npy
    assert b"<SourceFilename" in (mnt / ".zarrfs" / "gdal" / "top.vrt").read_bytes()
    assert (mnt / ".zarrfs" / "raw" / "top.raw.aux.xml").read_bytes() == b"<PAMDataset>\n</PAMDataset>\n"


# --------------------------------------------------------------------------- a store whose root is an array


ROOT_ARRAY_CASES = [
    (2, "temps.zarr", "", "temps.npy"),
    (3, "temps.zarr", "", "temps.npy"),
    (3, "plain", "", "plain.npy"),
    (3, "my.data.zarr", "", "my.data.npy"),
    (3, ".zarr", "", "array.npy"),
    (2, "slash.zarr", "/", "slash.npy"),
]


@pytest.mark.parametrize(
    "fmt,dirname,suffix,name", ROOT_ARRAY_CASES, ids=[f"v{c[0]}:{c[1]}{c[2]}" for c in ROOT_ARRAY_CASES]
)
def test_root_array_store(mount, tmp_path, fmt, dirname, suffix, name):
    store = tmp_path / "stores" / dirname
    store.parent.mkdir()
    builders.build_root_array(store, fmt)
    e = oracles.expected_for(store, "")
    mnt = mount(str(store) + suffix)
    assert os.listdir(mnt) == [name]
    p = mnt / name
    assert os.stat(p).st_size == len(e.npy)
    assert p.read_bytes() == e.npy
    assert _xattr_json(p, "user.zarr.shape") == e.shape
    assert _xattr_json(p, "user.zarr.attributes") == {"root": "array"}
    np.testing.assert_array_equal(np.load(p), e.value)


# --------------------------------------------------------------------------- the fixture itself


def test_fixture_hierarchy_is_as_described(hierarchy):
    """Guard the oracle side: the store really holds the cases the tests above claim to cover."""
    root, fmt = hierarchy.root, hierarchy.zarr_format
    for group in hierarchy.implied_groups:
        assert (root / group).is_dir()
        assert not any((root / group / doc).exists() for doc in ("zarr.json", ".zgroup", ".zattrs")), group
    assert not (root / "fill" / ("never_written/c" if fmt == 3 else "never_written/0.0")).exists()
    if fmt == 2:
        assert json.loads((root / "codecs/order_f_blosc/.zarray").read_text())["order"] == "F"
        assert (root / "codecs/sep_slash/0/0").is_file()
        assert (root / "codecs/sep_dot/0.0").is_file()
        assert json.loads((root / "dtypes/int32_be/.zarray").read_text())["dtype"] == ">i4"
    else:
        # codecs/sharded: 2x2 shards of 20x14, only shard (0, 0) written, and inside it only
        # the 5x7 inner chunks covering [0:10, 0:7]: 2 of its 8 index entries are filled.
        assert sorted(
            p.relative_to(root / "codecs/sharded/c").as_posix()
            for p in (root / "codecs/sharded/c").rglob("*")
            if p.is_file()
        ) == ["0/0"]
        shard = (root / "codecs/sharded/c/0/0").read_bytes()
        index = np.frombuffer(shard[-(8 * 16 + 4) : -4], dtype="<u8").reshape(8, 2)
        missing = int((index[:, 0] == np.iinfo(np.uint64).max).sum())
        assert missing == 6, index
        codecs = json.loads((root / "codecs/zstd_crc32c/zarr.json").read_text())["codecs"]
        assert [c["name"] for c in codecs] == ["bytes", "zstd", "crc32c"]


def test_ro_makes_the_mount_read_only_for_the_kernel(mount, tmp_path):
    """`-o ro` (as an fstab line gives it): the mount table and statvfs say read-only, and the
    kernel refuses writes before they reach the daemon."""
    import zarr

    store = tmp_path / "s.zarr"
    zarr.create_array(store, name="g/x", shape=(3, 4), chunks=(2, 2), dtype="i4", zarr_format=3)[...] = np.arange(
        12, dtype="i4"
    ).reshape(3, 4)
    mnt = mount(store, "ro")
    assert "ro" in [row for row in open("/proc/mounts") if f" {mnt} " in row][0].split()[3].split(",")
    assert os.statvfs(mnt).f_flag & os.ST_RDONLY
    with pytest.raises(OSError) as e:
        os.utime(mnt / "g" / "x.npy")
    assert e.value.errno == errno.EROFS
    assert (mnt / "g" / "x.npy").read_bytes() == oracles.npy_bytes(np.arange(12, dtype="i4").reshape(3, 4))
