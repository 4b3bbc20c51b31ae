"""Mounted tests of the views under MOUNT/.zarrfs/ (npy-f, raw, raw-f, chunks, store, info, stats.json) and st_blocks.

Every expected value comes from outside zarrfs: zarr-python 3 reading the same store,
numpy (``np.save``, ``tobytes(order=...)``, slicing), the store's own files on disk, and,
for Zarr v1, the checked-in fixtures of tests/fixtures/v1 (what zarr 1.1.0 read back).
"""

from __future__ import annotations

import itertools
import json
import math
import os
import re
import shutil
import stat
import subprocess
import time
import warnings
import zlib
from pathlib import Path

import numpy as np
import pytest

from support import FIXTURES, builders, oracles

VIEWS_DIR = ".zarrfs"
VIEW_NAMES = {
    "npy-f",
    "raw",
    "raw-f",
    "chunks",
    "store",
    "info",
    "stats.json",
    "tiff",
    "gdal",
    "preview",
    "slice",
    "netcdf",
    "ome-tiff",
    "refresh",
}
INFO_KEYS = {
    "shape",
    "dtype",
    "chunk_shape",
    "order",
    "codecs",
    "fill_value",
    "attributes",
    "chunks_stored",
    "chunks_total",
    "logical_bytes",
    "stored_bytes",
}
STATS_KEYS = {
    "chunk_gets",
    "chunk_bytes",
    "store_gets",
    "store_bytes",
    "store_lists",
    "disk_hits",
    "cache_hits",
    "cache_misses",
    "cache_evictions",
    "bytes_decoded",
    "decode_seconds",
    "errors",
}
# Metadata documents of every format: everything else under an array's directory is a chunk.
METADATA_NAMES = {".zarray", ".zattrs", ".zgroup", ".zmetadata", "zarr.json", "meta", "attrs"}
BLOCK = 512  # st_blocks unit

FORMATS = pytest.mark.parametrize("fmt", [2, 3], ids=["v2", "v3"])
ARRAYS = [(fmt, spec.path) for fmt in (2, 3) for spec in builders.array_specs(fmt)]
ARRAY_IDS = [f"v{fmt}:{path}" for fmt, path in ARRAYS]
EACH_ARRAY = pytest.mark.parametrize("fmt,path", ARRAYS, ids=ARRAY_IDS)

V1_DIR = FIXTURES / "v1"


def _v1_cases() -> list[str]:
    names = []
    for p in sorted((V1_DIR / "expected").glob("*.json")):
        name = p.stem
        if name.startswith(("blosc_snappy", "blosc_zstd")):
            continue  # numcodecs' blosc cannot decode these (see fixtures/v1/README.md)
        if json.loads(p.read_text())["defined"] == "all":
            names.append(name)
    return names


V1_CASES = _v1_cases()


# --------------------------------------------------------------------------- oracles


npy_f_bytes = oracles.npy_f_bytes


def grid_shape(shape, chunks) -> tuple[int, ...]:
    return tuple(math.ceil(s / c) for s, c in zip(shape, chunks))


def grid_positions(shape, chunks) -> list[tuple[int, ...]]:
    return list(itertools.product(*(range(n) for n in grid_shape(shape, chunks))))


def chunk_file_name(idx: tuple[int, ...]) -> str:
    return (".".join(map(str, idx)) or "0") + ".npy"


def chunk_value(value: np.ndarray, idx, chunks) -> np.ndarray:
    """The chunk at grid position IDX clipped at the array's edge, C-contiguous."""
    sel = tuple(slice(i * c, (i + 1) * c) for i, c in zip(idx, chunks))
    return np.array(value[sel + (Ellipsis,)], order="C", copy=True)  # stays 0-d for a 0-d array


def stored_chunks(array_dir: Path) -> dict[str, int]:
    """Chunk keys (relative to the array's directory) -> size, from the store's files on disk."""
    out = {}
    for p in array_dir.rglob("*"):
        if p.is_file() and p.name not in METADATA_NAMES:
            out[p.relative_to(array_dir).as_posix()] = p.stat().st_size
    return out


def blocks_for(nbytes: int) -> int:
    return -(-nbytes // BLOCK)


def same_values(got: np.ndarray, want: np.ndarray, what: str = "") -> None:
    """Same dtype, shape and element bytes (NaN-safe, works for strings and records)."""
    assert got.dtype == want.dtype, what
    assert got.shape == want.shape, what
    assert np.ascontiguousarray(got).tobytes() == np.ascontiguousarray(want).tobytes(), what


def assert_bytes(got: bytes, want: bytes, what: str) -> None:
    assert len(got) == len(want), f"{what}: {len(got)} bytes, want {len(want)}"
    if got != want:
        first = next(i for i, (a, b) in enumerate(zip(got, want)) if a != b)
        pytest.fail(
            f"{what}: first differing byte at {first} of {len(want)}: "
            f"got {got[first : first + 16]!r}, want {want[first : first + 16]!r}"
        )


def pread_cases(size: int, rng: np.random.Generator, n: int = 25) -> list[tuple[int, int]]:
    cases = [(0, 1), (0, size), (size, 10), (size + 100, 10)]
    if size:
        cases += [(size - 1, 1), (size - 1, 50), (size // 2, 4097)]
    for _ in range(n):
        cases.append((int(rng.integers(0, size + 16)), int(rng.choice([1, 3, 8, 4095, 4096, 4097, 70001]))))
    return cases


def check_preads(p: Path, want: bytes, seed_text: str) -> None:
    rng = np.random.default_rng(zlib.crc32(seed_text.encode()))
    fd = os.open(p, os.O_RDONLY)
    try:
        for off, n in pread_cases(len(want), rng):
            assert os.pread(fd, n, off) == want[off : off + n], f"{p}: pread(size={n}, offset={off})"
    finally:
        os.close(fd)


def fill_matches(info_fill, want_fill, dtype: np.dtype) -> bool:
    """An info.json fill value against the metadata's (NaN/Infinity may be JSON strings)."""
    if isinstance(info_fill, str) and info_fill in ("NaN", "Infinity", "-Infinity"):
        info_fill = float(info_fill.replace("Infinity", "inf"))
    if dtype.kind == "f":
        a, b = float(info_fill), float(want_fill)
        return (math.isnan(a) and math.isnan(b)) or a == b
    return info_fill == want_fill.item() if isinstance(want_fill, np.generic) else info_fill == want_fill


def read_json(p: Path):
    with open(p, "rb") as f:
        return json.loads(f.read().decode("utf-8"))


def open_random(p: Path) -> int:
    """A descriptor with kernel readahead off, so a small pread asks the daemon for its own pages only."""
    fd = os.open(p, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
    return fd


def run(args: list[str], cwd: Path | None = None) -> subprocess.CompletedProcess:
    """A shell tool's result (exit code, stdout, stderr as text); the caller checks the exit code."""
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=120, check=False)


def stats(mnt: Path) -> dict:
    return read_json(mnt / VIEWS_DIR / "stats.json")


def zarr_meta(store_root: Path, path: str):
    return oracles.open_zarr_array(store_root, path).metadata


def zarr_chunk_key(meta, idx) -> str:
    return meta.encode_chunk_key(tuple(idx))


def view(mnt: Path, name: str, path: str, suffix: str) -> Path:
    return mnt / VIEWS_DIR / name / (path + suffix)


# --------------------------------------------------------------------------- the hidden .zarrfs directory


@FORMATS
def test_views_dir_is_hidden_but_reachable(hierarchy_mount, fmt):
    h, mnt = hierarchy_mount(fmt)
    assert VIEWS_DIR not in os.listdir(mnt)
    assert sorted(os.listdir(mnt)) == h.listing("")
    views = mnt / VIEWS_DIR
    assert stat.S_ISDIR(os.stat(views).st_mode)
    assert set(os.listdir(views)) == VIEW_NAMES
    for name in VIEW_NAMES - {"stats.json", "refresh"}:
        assert stat.S_ISDIR(os.stat(views / name).st_mode), name
    assert stat.S_ISREG(os.stat(views / "stats.json").st_mode)
    # The shell tools: cd, ls, stat, cat.
    r = run(["sh", "-c", "cd .zarrfs && ls && cd raw && ls && cat ../stats.json"], cwd=mnt)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert set(lines[: len(VIEW_NAMES)]) == VIEW_NAMES
    assert "top.raw" in lines
    r = run(["stat", "-c", "%F", VIEWS_DIR, f"{VIEWS_DIR}/chunks/top", f"{VIEWS_DIR}/raw/top.raw"], cwd=mnt)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["directory", "directory", "regular file"]
    r = run(["stat", "-c", "%s", f"{VIEWS_DIR}/raw/top.raw"], cwd=mnt)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(h.expected("top").value.nbytes)
    # Only the mount's root holds the views.
    for p in [mnt / "dtypes" / VIEWS_DIR, mnt / VIEWS_DIR / "raw" / VIEWS_DIR]:
        with pytest.raises(FileNotFoundError):
            os.stat(p)


@FORMATS
def test_cp_r_of_the_mount_copies_only_the_npy_tree(hierarchy_mount, fmt, tmp_path):
    h, mnt = hierarchy_mount(fmt)
    dest = tmp_path / "copy"
    r = run(["cp", "-r", str(mnt), str(dest)])
    assert r.returncode == 0, r.stderr
    assert not (dest / VIEWS_DIR).exists()
    dirs, files = set(), set()
    for top, _dirnames, filenames in os.walk(dest):
        rel = os.path.relpath(top, dest)
        dirs.add("" if rel == "." else rel)
        files.update(os.path.normpath(os.path.join(rel, f)) for f in filenames)
    assert dirs == set(h.all_groups())
    assert files == {a + ".npy" for a in h.arrays}
    for a in ["top", "codecs/blosc", "edge/nd4", "fill/scalar_0d"]:
        assert_bytes((dest / (a + ".npy")).read_bytes(), h.expected(a).npy, a)


@FORMATS
def test_show_views_lists_the_views_dir(module_mount, hierarchy_factory, fmt):
    h = hierarchy_factory(fmt)
    mnt = module_mount(h.root, "show_views")
    assert sorted(os.listdir(mnt)) == sorted(h.listing("") + [VIEWS_DIR])
    assert stat.S_ISDIR(os.stat(mnt / VIEWS_DIR).st_mode)
    assert set(os.listdir(mnt / VIEWS_DIR)) == VIEW_NAMES


@FORMATS
def test_view_directories_mirror_the_groups(hierarchy_mount, fmt):
    h, mnt = hierarchy_mount(fmt)
    for group in h.all_groups():
        prefix = group + "/" if group else ""
        sub_groups = sorted(n for n in h.listing(group) if not n.endswith(".npy"))
        arrays = sorted(n[:-4] for n in h.listing(group) if n.endswith(".npy"))
        want = {
            "npy-f": sub_groups + [a + ".npy" for a in arrays],
            "raw": sub_groups + [a + ".raw" for a in arrays],
            "raw-f": sub_groups + [a + ".raw" for a in arrays],
            "chunks": sub_groups + arrays,
            "info": sub_groups
            + [g + ".json" for g in sub_groups]
            + [a + ".json" for a in arrays]
            + ([".json"] if not group else []),
        }
        for name, names in want.items():
            d = mnt / VIEWS_DIR / name / prefix
            listed = [n for n in os.listdir(d) if not n.endswith((".hdr", ".aux.xml"))]  # test_mount_images
            assert sorted(listed) == sorted(names), f"{name}/{prefix}"
        for a in arrays:
            assert stat.S_ISDIR(os.stat(mnt / VIEWS_DIR / "chunks" / (prefix + a)).st_mode)


# --------------------------------------------------------------------------- npy-f, raw, raw-f


@EACH_ARRAY
def test_npy_f_is_the_fortran_order_npy(hierarchy_mount, fmt, path):
    h, mnt = hierarchy_mount(fmt)
    value = h.expected(path).value
    p = view(mnt, "npy-f", path, ".npy")
    want = npy_f_bytes(value)
    assert os.stat(p).st_size == len(want)
    assert_bytes(p.read_bytes(), want, str(p))
    check_preads(p, want, f"{fmt}:{path}:npy-f")
    loaded = np.load(p, allow_pickle=False)
    assert loaded.flags.f_contiguous
    same_values(loaded, value, path)
    with open(p, "rb") as f:
        version = np.lib.format.read_magic(f)
        read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        _, fortran_order, _ = read_header(f)
    assert fortran_order is True


@EACH_ARRAY
def test_raw_views_are_c_and_f_element_bytes(hierarchy_mount, fmt, path):
    h, mnt = hierarchy_mount(fmt)
    value = h.expected(path).value
    for name, order in (("raw", "C"), ("raw-f", "F")):
        p = view(mnt, name, path, ".raw")
        want = value.tobytes(order=order)
        assert os.stat(p).st_size == len(want), name
        assert_bytes(p.read_bytes(), want, str(p))
        check_preads(p, want, f"{fmt}:{path}:{name}")


# --------------------------------------------------------------------------- chunks


def check_chunk_dir(d: Path, value: np.ndarray, chunks, key_size) -> None:
    """D lists one file per grid position; each is np.save of the clipped chunk; st_blocks follow the stored key."""
    positions = grid_positions(value.shape, chunks)
    assert sorted(os.listdir(d)) == sorted(chunk_file_name(i) for i in positions)
    for idx in positions:
        p = d / chunk_file_name(idx)
        want_value = chunk_value(value, idx, chunks)
        want = oracles.npy_bytes(want_value)
        st = os.stat(p)
        assert st.st_size == len(want), p
        assert_bytes(p.read_bytes(), want, str(p))
        same_values(np.load(p, allow_pickle=False), want_value, str(p))
        assert st.st_blocks == blocks_for(key_size(idx)), f"{p}: st_blocks {st.st_blocks}, stored {key_size(idx)}"
    if positions:  # partial reads of the edge chunk, header included
        check_preads(
            d / chunk_file_name(positions[-1]), oracles.npy_bytes(chunk_value(value, positions[-1], chunks)), str(d)
        )


@EACH_ARRAY
def test_chunk_files_are_the_decoded_chunks(hierarchy_mount, fmt, path):
    h, mnt = hierarchy_mount(fmt)
    e = h.expected(path)
    meta = zarr_meta(h.root, path)
    array_dir = h.root / path

    def key_size(idx):
        p = array_dir / zarr_chunk_key(meta, idx)
        return p.stat().st_size if p.is_file() else 0

    check_chunk_dir(mnt / VIEWS_DIR / "chunks" / path, e.value, e.chunks, key_size)


@FORMATS
def test_chunk_names_outside_the_grid_are_enoent(hierarchy_mount, fmt):
    _, mnt = hierarchy_mount(fmt)
    d = mnt / VIEWS_DIR / "chunks"
    # top: shape (17, 5), chunks (4, 4), so a grid of 5 x 2
    for name in [
        "top/5.0.npy",
        "top/0.2.npy",
        "top/00.0.npy",
        "top/0.0.raw",
        "top/0.npy",
        "top/0.0.0.npy",
        "top/0.0",
        "top/x.npy",
        "fill/scalar_0d/1.npy",
        "fill/scalar_0d/0.0.npy",
    ]:
        with pytest.raises(FileNotFoundError):
            os.stat(d / name)


# --------------------------------------------------------------------------- info


def check_array_info(
    info: dict, *, value: np.ndarray, shape, chunks, attributes, array_dir: Path, order=None, fill=None, what=""
) -> None:
    assert INFO_KEYS <= set(info), f"{what}: missing {INFO_KEYS - set(info)}"
    assert info["shape"] == list(shape), what
    assert info["chunk_shape"] == list(chunks), what
    assert info["dtype"] == oracles.descr_json(value.dtype), what
    assert json.dumps(info["attributes"], sort_keys=True) == json.dumps(attributes, sort_keys=True), what
    on_disk = stored_chunks(array_dir)
    assert info["chunks_stored"] == len(on_disk), (what, sorted(on_disk))
    assert info["stored_bytes"] == sum(on_disk.values()), what
    assert info["chunks_total"] == math.prod(grid_shape(shape, chunks)), what
    assert info["logical_bytes"] == value.nbytes, what
    assert isinstance(info["codecs"], list), what
    if order is not None:
        assert info["order"] == order, what
    if fill is not None and value.dtype.kind in "biuf":
        assert fill_matches(info["fill_value"], fill, value.dtype), (what, info["fill_value"], fill)


@EACH_ARRAY
def test_array_info(hierarchy_mount, fmt, path):
    h, mnt = hierarchy_mount(fmt)
    e = h.expected(path)
    meta = zarr_meta(h.root, path)
    info = read_json(view(mnt, "info", path, ".json"))
    check_array_info(
        info,
        value=e.value,
        shape=e.shape,
        chunks=e.chunks,
        attributes=e.attributes,
        array_dir=h.root / path,
        order=meta.order if fmt == 2 else None,
        fill=meta.fill_value,
        what=path,
    )
    spec = next(s for s in builders.array_specs(fmt) if s.path == path)
    for codec in spec.codec.split("_"):
        if codec != "none":
            assert codec in json.dumps(info["codecs"]).lower(), (codec, info["codecs"])
    if "shards" in spec.kwargs:
        assert "sharding_indexed" in json.dumps(info["codecs"]), info["codecs"]


@FORMATS
def test_group_info(hierarchy_mount, fmt):
    import zarr

    h, mnt = hierarchy_mount(fmt)
    for group in h.all_groups():
        p = mnt / VIEWS_DIR / "info" / (group + ".json")  # the root group: info/.json
        info = read_json(p)
        assert isinstance(info, dict) and "attributes" in info, group
        if group in h.groups:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                want = zarr.open_group(os.fspath(h.root / group), mode="r").attrs.asdict()
            assert info["attributes"] == want, group


# --------------------------------------------------------------------------- store


def check_store_view(store_dir: Path, root: Path) -> None:
    """Every directory lists the store's names and every key reads as the file on disk."""
    for top, dirnames, filenames in os.walk(root):
        rel = Path(top).relative_to(root)
        if not any(p.is_file() for p in Path(top).rglob("*")):
            continue  # an empty directory holds no key
        keep_dirs = [d for d in dirnames if any(p.is_file() for p in (Path(top) / d).rglob("*"))]
        assert sorted(os.listdir(store_dir / rel)) == sorted(keep_dirs + filenames), str(rel)
        for f in filenames:
            want = (Path(top) / f).read_bytes()
            p = store_dir / rel / f
            st = os.stat(p)
            assert st.st_size == len(want), str(rel / f)
            assert st.st_blocks == blocks_for(len(want)), str(rel / f)
            assert_bytes(p.read_bytes(), want, str(rel / f))


@FORMATS
def test_store_view_is_the_store_byte_for_byte(hierarchy_mount, fmt):
    h, mnt = hierarchy_mount(fmt)
    check_store_view(mnt / VIEWS_DIR / "store", h.root)
    # a ranged read of an encoded chunk
    key = "codecs/zstd/" + zarr_chunk_key(zarr_meta(h.root, "codecs/zstd"), (1, 2))
    want = (h.root / key).read_bytes()
    check_preads(mnt / VIEWS_DIR / "store" / key, want, key)


@FORMATS
def test_cp_r_of_the_store_view_opens_in_zarr(hierarchy_mount, fmt, tmp_path):
    h, mnt = hierarchy_mount(fmt)
    copy = tmp_path / "copy.zarr"
    r = run(["cp", "-r", str(mnt / VIEWS_DIR / "store"), str(copy)])
    assert r.returncode == 0, r.stderr
    for path in h.arrays:
        got = oracles.open_zarr_array(copy, path)[...]
        same_values(np.asarray(got), h.expected(path).value, path)


# --------------------------------------------------------------------------- st_blocks


@EACH_ARRAY
def test_st_blocks_follow_the_stored_bytes(hierarchy_mount, fmt, path):
    h, mnt = hierarchy_mount(fmt)
    stored = sum(stored_chunks(h.root / path).values())
    for p in [
        mnt / (path + ".npy"),
        view(mnt, "npy-f", path, ".npy"),
        view(mnt, "raw", path, ".raw"),
        view(mnt, "raw-f", path, ".raw"),
    ]:
        st = os.stat(p)
        assert st.st_blocks == blocks_for(stored), f"{p}: st_blocks {st.st_blocks}, {stored} bytes stored"


@FORMATS
def test_du_shows_stored_and_apparent_sizes(hierarchy_mount, fmt):
    h, mnt = hierarchy_mount(fmt)
    files = [mnt / (a + ".npy") for a in h.arrays]

    def du(*flags):
        r = run(["du", *flags, "-B1", *map(str, files)])
        assert r.returncode == 0, r.stderr
        return {line.split("\t", 1)[1]: int(line.split("\t", 1)[0]) for line in r.stdout.splitlines()}

    used, apparent = du(), du("--apparent-size")
    for a, p in zip(h.arrays, files):
        stored = sum(stored_chunks(h.root / a).values())
        assert used[str(p)] == blocks_for(stored) * BLOCK, a
        assert apparent[str(p)] == len(h.expected(a).npy), a


# --------------------------------------------------------------------------- Zarr v1 fixtures


@pytest.fixture(scope="module")
def v1_mount(module_mount):
    cache: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in cache:
            cache[name] = module_mount(V1_DIR / name, "v1_order=writer")
        return cache[name]

    return get


def v1_expected(name: str) -> np.ndarray:
    return np.load(V1_DIR / "expected" / f"{name}.npy", allow_pickle=False)


def v1_meta(name: str) -> dict:
    return json.loads((V1_DIR / name / "meta").read_text())  # bare NaN/Infinity tokens are accepted


@pytest.mark.parametrize("name", V1_CASES)
def test_v1_views(v1_mount, name):
    mnt = v1_mount(name)
    value = v1_expected(name)
    meta = v1_meta(name)
    assert os.listdir(mnt) == [name + ".npy"]
    views = mnt / VIEWS_DIR
    assert os.listdir(views / "npy-f") == [name + ".npy"]
    raw = [n for n in os.listdir(views / "raw") if not n.endswith((".hdr", ".aux.xml"))]  # test_mount_images
    assert raw == os.listdir(views / "raw-f") == [name + ".raw"]
    assert os.listdir(views / "chunks") == [name]
    assert name + ".json" in os.listdir(views / "info")
    assert_bytes((mnt / (name + ".npy")).read_bytes(), oracles.npy_bytes(value), name)
    # npy-f
    p = view(mnt, "npy-f", name, ".npy")
    assert_bytes(p.read_bytes(), npy_f_bytes(value), str(p))
    check_preads(p, npy_f_bytes(value), f"v1:{name}:npy-f")
    loaded = np.load(p, allow_pickle=False)
    assert loaded.flags.f_contiguous
    same_values(loaded, value, name)
    # raw, raw-f
    for vname, order in (("raw", "C"), ("raw-f", "F")):
        p = view(mnt, vname, name, ".raw")
        want = value.tobytes(order=order)
        assert_bytes(p.read_bytes(), want, str(p))
        check_preads(p, want, f"v1:{name}:{vname}")
    # chunks: v1 chunk keys are the grid indices joined with '.'
    chunks = tuple(meta["chunks"])

    def key_size(idx):
        k = V1_DIR / name / ".".join(map(str, idx))
        return k.stat().st_size if idx and k.is_file() else 0

    check_chunk_dir(mnt / VIEWS_DIR / "chunks" / name, value, chunks, key_size)
    # info
    info = read_json(view(mnt, "info", name, ".json"))
    attrs = json.loads((V1_DIR / name / "attrs").read_text())
    # zarr 1.1.0 wrote the chunks of an order F array in C order unless blosc compressed them
    # (fixtures/v1/README.md): "order" is unambiguous only for C arrays and blosc.
    unambiguous = meta["order"] == "C" or meta["compression"] == "blosc"
    check_array_info(
        info,
        value=value,
        shape=meta["shape"],
        chunks=chunks,
        attributes=attrs,
        array_dir=V1_DIR / name,
        order=meta["order"] if unambiguous else None,
        fill=meta["fill_value"],
        what=name,
    )
    # store
    check_store_view(mnt / VIEWS_DIR / "store", V1_DIR / name)
    # st_blocks
    stored = sum(stored_chunks(V1_DIR / name).values())
    for p in [
        mnt / (name + ".npy"),
        view(mnt, "npy-f", name, ".npy"),
        view(mnt, "raw", name, ".raw"),
        view(mnt, "raw-f", name, ".raw"),
    ]:
        assert os.stat(p).st_blocks == blocks_for(stored), str(p)


def test_v1_cases_cover_what_they_claim():
    """Guard the oracle side: F order, 0-d, 1-d, big-endian and edge chunks are among the cases."""
    metas = {n: v1_meta(n) for n in V1_CASES}
    assert any(m["order"] == "F" for m in metas.values())
    assert any(m["shape"] == [] for m in metas.values())
    assert any(len(m["shape"]) == 1 for m in metas.values())
    assert any(m["dtype"].startswith(">") for m in metas.values())
    assert any(any(s % c for s, c in zip(m["shape"], m["chunks"])) for m in metas.values())


# --------------------------------------------------------------------------- stats.json and a huge chunk grid

# A 1-d array of 512 KiB chunks: kernel readahead (128 KiB by default) inside a chunk stays in it.
BIG_CHUNK = 65536
BIG_N_CHUNKS = 4
# The huge grid: 100,000 positions of 1x1 chunks, three of them stored.
SPARSE_SHAPE = (1000, 100)
SPARSE_WRITES = [(0, 0), (517, 42), (999, 99)]


@pytest.fixture(scope="module")
def side_stores(tmp_path_factory) -> dict[int, Path]:
    """Per format, a store with the huge sparse grid `sparse`; the v3 one also holds `big1d`."""
    import zarr
    from zarr.codecs import ZstdCodec

    base = tmp_path_factory.mktemp("views-side")
    roots = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for fmt in (2, 3):
            root = roots[fmt] = base / f"side_v{fmt}.zarr"
            zarr.open_group(os.fspath(root), mode="w", zarr_format=fmt)
            s = zarr.create_array(
                store=os.fspath(root),
                name="sparse",
                shape=SPARSE_SHAPE,
                chunks=(1, 1),
                dtype="int16",
                fill_value=-3,
                zarr_format=fmt,
            )
            for k, idx in enumerate(SPARSE_WRITES):
                s[idx] = k + 1
        a = zarr.create_array(
            store=os.fspath(roots[3]),
            name="big1d",
            shape=(BIG_CHUNK * BIG_N_CHUNKS,),
            chunks=(BIG_CHUNK,),
            dtype="float64",
            compressors=[ZstdCodec(level=1)],
        )
        a[...] = np.random.default_rng(5).standard_normal(a.shape)
    return roots


@pytest.fixture(scope="module")
def side_store(side_stores) -> Path:
    return side_stores[3]


def test_every_stats_json_field_is_documented(mount, side_store):
    """docs/CONFIGURATION.md's stats.json table names every field the file has, and no other."""
    mnt = mount(side_store)
    (mnt / "big1d.npy").read_bytes()  # counters of reads, whatever their values
    fields = set(stats(mnt))
    doc = (Path(__file__).resolve().parents[2] / "docs" / "CONFIGURATION.md").read_text()
    section = doc.split("\n## stats.json\n", 1)[1].split("\n## ", 1)[0]
    rows = [ln.split("|")[1] for ln in section.splitlines() if ln.startswith("| `")]
    documented = {name for row in rows for name in re.findall(r"`([a-z_0-9]+)`", row)}
    assert fields - documented == set(), "stats.json fields missing from docs/CONFIGURATION.md"
    assert documented - fields == set(), "docs/CONFIGURATION.md documents fields stats.json lacks"


def test_stats_json_counts_chunk_gets_and_cache_hits(mount, side_store):
    mnt = mount(side_store)
    before = stats(mnt)
    assert STATS_KEYS <= set(before), STATS_KEYS - set(before)
    value = np.asarray(oracles.open_zarr_array(side_store, "big1d")[...])
    meta = zarr_meta(side_store, "big1d")
    key_bytes = (side_store / "big1d" / zarr_chunk_key(meta, (1,))).stat().st_size
    chunk = value[BIG_CHUNK : 2 * BIG_CHUNK]

    # One chunk, through its chunk file: exactly one store get.
    got = np.load(mnt / VIEWS_DIR / "chunks" / "big1d" / "1.npy")
    same_values(got, chunk)
    after_chunk = stats(mnt)
    assert after_chunk["chunk_gets"] - before["chunk_gets"] == 1, (before, after_chunk)
    assert after_chunk["chunk_bytes"] - before["chunk_bytes"] == key_bytes, (before, after_chunk)
    # ... which the store answered (no disk cache on a local store), beside the documents looked up.
    assert after_chunk["store_bytes"] - before["store_bytes"] >= key_bytes, (before, after_chunk)
    assert after_chunk["bytes_decoded"] - before["bytes_decoded"] == chunk.nbytes, (before, after_chunk)
    assert after_chunk["cache_misses"] > before["cache_misses"]

    # The same chunk through raw/ (a small pread inside it): a cache hit, no store get.
    item = value.itemsize
    fd = open_random(view(mnt, "raw", "big1d", ".raw"))
    try:
        off = (BIG_CHUNK + 3000) * item
        assert os.pread(fd, 16, off) == value.tobytes()[off : off + 16]
    finally:
        os.close(fd)
    after_raw = stats(mnt)
    assert after_raw["chunk_gets"] == after_chunk["chunk_gets"], (after_chunk, after_raw)
    assert after_raw["cache_hits"] > after_chunk["cache_hits"], (after_chunk, after_raw)

    # And through npy-f: another hit.
    want = npy_f_bytes(value)
    hlen = len(want) - value.nbytes
    fd = open_random(view(mnt, "npy-f", "big1d", ".npy"))
    try:
        off = hlen + (BIG_CHUNK + 40000) * item
        assert os.pread(fd, 100, off) == want[off : off + 100]
    finally:
        os.close(fd)
    after_npyf = stats(mnt)
    assert after_npyf["chunk_gets"] == after_chunk["chunk_gets"], (after_raw, after_npyf)
    assert after_npyf["cache_hits"] > after_raw["cache_hits"], (after_raw, after_npyf)
    assert not after_npyf["errors"], after_npyf


def test_small_read_of_a_shard_fetches_its_index_and_one_inner_chunk(mount, tmp_path):
    import zarr
    from zarr.codecs import ZstdCodec

    root = tmp_path / "sharded.zarr"
    zarr.open_group(str(root), mode="w", zarr_format=3)
    inner, per_shard = 1024, 32
    arr = zarr.create_array(
        str(root),
        name="s",
        shape=(70000,),
        dtype="<f8",
        shards=(inner * per_shard,),
        chunks=(inner,),
        compressors=[ZstdCodec(level=1)],
        zarr_format=3,
    )
    value = np.random.default_rng(3).normal(size=70000)
    arr[:] = value
    shard = (root / "s" / "c" / "0").read_bytes()
    index_nbytes = 16 * per_shard + 4  # zarr's index codecs: bytes + crc32c, at the end
    index = np.frombuffer(shard[-index_nbytes:-4], "<u8").reshape(per_shard, 2)
    mnt = mount(root)
    before = stats(mnt)
    fd = open_random(mnt / "s.npy")  # no read-ahead: the kernel asks for the 4 KiB page read
    try:
        hlen = os.fstat(fd).st_size - value.nbytes
        page = 11 * 4096
        first, last = (page - hlen) // 8, (page + 4096 - hlen) // 8
        assert first // inner == last // inner == 5  # the page lies inside inner chunk 5 of shard 0
        assert hlen % 8 == 0
        assert os.pread(fd, 8, page + 32) == value[(page + 32 - hlen) // 8].tobytes()
        after = stats(mnt)
        assert after["chunk_gets"] - before["chunk_gets"] == 2, (before, after)  # the index, one inner chunk
        assert after["chunk_bytes"] - before["chunk_bytes"] == index_nbytes + int(index[5, 1]), (before, after)
        assert after["chunk_bytes"] - before["chunk_bytes"] < len(shard) / 10
        # Another element of that inner chunk, through raw/: a cache hit, no store get.
        raw = open_random(view(mnt, "raw", "s", ".raw"))
        try:
            assert os.pread(raw, 8, 5200 * 8) == value[5200].tobytes()
        finally:
            os.close(raw)
        again = stats(mnt)
        assert again["chunk_gets"] == after["chunk_gets"] and again["cache_hits"] > after["cache_hits"]
    finally:
        os.close(fd)
    # The chunk file of a shard is the whole shard, clipped at the array's edge.
    same_values(np.load(mnt / VIEWS_DIR / "chunks" / "s" / "2.npy"), value[2 * inner * per_shard :])
    assert not stats(mnt)["errors"]


def test_stats_json_is_fresh_at_every_open(mount, side_store):
    mnt = mount(side_store)
    p = mnt / VIEWS_DIR / "stats.json"
    first = read_json(p)
    with open(mnt / VIEWS_DIR / "chunks" / "big1d" / "2.npy", "rb") as f:
        f.read()
    second = read_json(p)
    assert second["chunk_gets"] == first["chunk_gets"] + 1
    # A handle keeps the snapshot of its open while later opens see newer counters.
    with open(p, "rb") as held:
        head = held.read(10)
        with open(mnt / VIEWS_DIR / "chunks" / "big1d" / "3.npy", "rb") as f:
            f.read()
        third = read_json(p)
        held_stats = json.loads(head + held.read())
    assert held_stats["chunk_gets"] == second["chunk_gets"]
    assert third["chunk_gets"] == second["chunk_gets"] + 1


@FORMATS
def test_huge_chunk_grid_lists_every_position_without_reading(module_mount, side_stores, fmt):
    side_store = side_stores[fmt]
    mnt = module_mount(side_store)
    name = "sparse"
    before = stats(mnt)
    t0 = time.monotonic()
    names = os.listdir(mnt / VIEWS_DIR / "chunks" / name)
    elapsed = time.monotonic() - t0
    assert len(names) == SPARSE_SHAPE[0] * SPARSE_SHAPE[1]
    assert sorted(names) == sorted(f"{i}.{j}.npy" for i in range(SPARSE_SHAPE[0]) for j in range(SPARSE_SHAPE[1]))
    assert elapsed < 30, f"listing took {elapsed:.1f}s"
    after = stats(mnt)
    assert after["chunk_gets"] == before["chunk_gets"], (before, after)
    # The stored chunks and an unstored one, with their st_blocks.
    d = mnt / VIEWS_DIR / "chunks" / name
    meta = zarr_meta(side_store, name)
    for k, idx in enumerate(SPARSE_WRITES):
        p = d / chunk_file_name(idx)
        same_values(np.load(p), np.array([[k + 1]], dtype="int16"), str(p))
        size = (side_store / name / zarr_chunk_key(meta, idx)).stat().st_size
        assert os.stat(p).st_blocks == blocks_for(size)
    p = d / "3.4.npy"
    same_values(np.load(p), np.array([[-3]], dtype="int16"), str(p))
    assert os.stat(p).st_blocks == 0
    info = read_json(view(mnt, "info", name, ".json"))
    assert info["chunks_total"] == SPARSE_SHAPE[0] * SPARSE_SHAPE[1]
    assert info["chunks_stored"] == len(stored_chunks(side_store / name)) == len(SPARSE_WRITES)


def test_stats_json_counts_evictions(mount, side_store):
    mnt = mount(side_store, "cache_size=1M")  # room for two of big1d's 512 KiB chunks
    value = np.asarray(oracles.open_zarr_array(side_store, "big1d")[...])
    before = stats(mnt)
    for i in range(BIG_N_CHUNKS):
        with open(mnt / VIEWS_DIR / "chunks" / "big1d" / f"{i}.npy", "rb") as f:
            f.read()
    after = stats(mnt)
    assert after["chunk_gets"] - before["chunk_gets"] == BIG_N_CHUNKS, (before, after)
    assert after["cache_evictions"] > before["cache_evictions"], (before, after)
    # chunk 0 was evicted: reading it through another view loads it again
    fd = open_random(view(mnt, "raw", "big1d", ".raw"))
    try:
        assert os.pread(fd, 8, 800) == value.tobytes()[800:808]
    finally:
        os.close(fd)
    again = stats(mnt)
    assert again["chunk_gets"] - after["chunk_gets"] == 1, (after, again)


def test_stats_json_counts_errors(mount, side_store, tmp_path):
    import errno

    store = tmp_path / "corrupt.zarr"
    shutil.copytree(side_store, store)
    meta = zarr_meta(store, "big1d")
    (store / "big1d" / zarr_chunk_key(meta, (2,))).write_bytes(b"this is not a zstd frame")
    mnt = mount(store)
    mount.expect_errors()
    before = stats(mnt)
    assert not before["errors"], before
    with pytest.raises(OSError) as exc:
        (mnt / VIEWS_DIR / "chunks" / "big1d" / "2.npy").read_bytes()
    assert exc.value.errno == errno.EIO
    after = stats(mnt)
    errors = after["errors"]
    assert (sum(errors.values()) if isinstance(errors, dict) else errors) >= 1, after
    # the other chunks still read
    value = np.asarray(oracles.open_zarr_array(side_store, "big1d")[...])
    same_values(np.load(mnt / VIEWS_DIR / "chunks" / "big1d" / "1.npy"), value[BIG_CHUNK : 2 * BIG_CHUNK])
