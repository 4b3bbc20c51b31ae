"""Mounted tests of the image views: .zarrfs/tiff/PATH.tif, raw/PATH.hdr (ENVI), gdal/PATH.vrt.

Oracles: zarr-python 3 reading the same store, tifffile and Pillow reading the TIFFs,
GDAL (`gdalinfo -stats`) and ImageMagick (`identify`) opening the files in the mount,
numpy's statistics of the zarr-python read.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
from xml.etree import ElementTree

import numpy as np
import pytest
import tifffile
import zarr
from PIL import Image

from support import REPO

VIEWS = ".zarrfs"
# GDAL as a user runs it: no GDAL_PAM_ENABLED=NO (it saves the statistics it computes into
# the VRT, or NAME.aux.xml beside a raw view: the mount keeps them).
GDAL_ENV = {k: v for k, v in os.environ.items() if not k.startswith(("GDAL_", "CPL_"))}


def build(root, zarr_format=3):
    """A store with the cases the issue names; returns {path: value written}."""
    rng = np.random.default_rng(5)
    g = zarr.open_group(root, mode="w", zarr_format=zarr_format)
    values = {}

    def add(path, value, chunks, **kw):
        a = g.create_array(path, shape=value.shape, dtype=value.dtype, chunks=chunks, **kw)
        a[...] = value
        values[path] = value

    add("img_u1", rng.integers(0, 256, (37, 53), dtype="u1"), (16, 16))
    add("grp/img_u2", rng.integers(0, 60000, (40, 30), dtype="u2"), (16, 16), attributes={"units": "counts"})
    add("grp/stack_f4", rng.random((5, 64, 48), dtype="f4"), (1, 32, 32))
    add("be_i4", rng.integers(-(1 << 30), 1 << 30, (3, 20, 20)).astype(">i4"), (2, 8, 8))
    add("cube_f8", rng.random((2, 3, 9, 11)), (1, 2, 4, 4))
    add("flags", rng.random((12, 10)) > 0.5, (5, 5))
    if zarr_format == 3:
        add("sharded_u2", rng.integers(0, 1000, (32, 48), dtype="u2"), (8, 8), shards=(16, 24))
    sparse = g.create_array("sparse_f4", shape=(4, 30, 30), dtype="f4", chunks=(1, 15, 15), fill_value=-2.5)
    sparse[1, :15, :15] = 7.0
    values["sparse_f4"] = sparse[...]
    return values


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("images") / "images.zarr"
    return root, build(root)


@pytest.fixture(scope="module")
def mnt(module_mount, store):
    return module_mount(store[0])


def stats(mnt):
    return json.loads((mnt / VIEWS / "stats.json").read_text())


def test_views_list_arrays_they_can_show(mnt):
    assert {"tiff", "gdal"} <= set(os.listdir(mnt / VIEWS))
    assert sorted(os.listdir(mnt / VIEWS / "tiff")) == sorted(
        ["img_u1.tif", "grp", "be_i4.tif", "cube_f8.tif", "flags.tif", "sharded_u2.tif", "sparse_f4.tif"]
    )
    raw = set(os.listdir(mnt / VIEWS / "raw"))
    assert {"img_u1.hdr", "be_i4.hdr", "flags.hdr", "sparse_f4.hdr"} <= raw
    assert "cube_f8.hdr" not in raw  # 4-D: no ENVI cube
    assert "cube_f8.vrt" not in os.listdir(mnt / VIEWS / "gdal")


@pytest.mark.parametrize(
    "path", ["img_u1", "grp/img_u2", "grp/stack_f4", "be_i4", "cube_f8", "flags", "sharded_u2", "sparse_f4"]
)
def test_tifffile_reads_the_array(mnt, store, path):
    want = zarr.open_array(store[0] / path)[...]
    f = mnt / VIEWS / "tiff" / (path + ".tif")
    data = f.read_bytes()
    assert os.stat(f).st_size == len(data)
    with tifffile.TiffFile(f) as tf:
        got = tf.asarray()
        desc = json.loads(tf.pages[0].description)
    assert desc["path"] == "/" + path and desc["shape"] == list(want.shape)
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want.astype(np.uint8) if want.dtype == bool else want)


def test_tiff_of_an_f_order_v2_source(mount, tmp_path):
    root = tmp_path / "f.zarr"
    value = np.random.default_rng(2).integers(0, 1000, (4, 9, 13)).astype("<u4")
    a = zarr.open_array(root, mode="w", zarr_format=2, shape=value.shape, chunks=(3, 4, 5), dtype="u4", order="F")
    a[...] = value
    m = mount(root)
    np.testing.assert_array_equal(tifffile.imread(m / VIEWS / "tiff" / "f.tif"), value)


@pytest.mark.parametrize("path", ["img_u1", "grp/img_u2", "flags"])
def test_pillow_reads_2d_tiffs(mnt, store, path):
    want = zarr.open_array(store[0] / path)[...]
    with Image.open(mnt / VIEWS / "tiff" / (path + ".tif")) as im:
        got = np.asarray(im)
    np.testing.assert_array_equal(got, want.astype(np.uint8) if want.dtype == bool else want)


def test_pillow_reads_every_page_of_a_stack(mnt, store):
    want = zarr.open_array(store[0] / "grp/stack_f4")[...]
    with Image.open(mnt / VIEWS / "tiff" / "grp" / "stack_f4.tif") as im:
        assert im.n_frames == 5
        for k in range(5):
            im.seek(k)
            np.testing.assert_array_equal(np.asarray(im), want[k])


def test_reading_one_page_loads_only_its_chunks(mount, tmp_path):
    root = tmp_path / "pages.zarr"
    value = np.random.default_rng(3).random((6, 64, 64))  # 32 KiB pages, 4 chunks a page
    a = zarr.open_array(root, mode="w", shape=value.shape, chunks=(1, 32, 32), dtype="f8")
    a[...] = value
    m = mount(root)
    fd = os.open(m / VIEWS / "tiff" / "pages.tif", os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)  # no kernel read-ahead into other pages
        head = os.pread(fd, 4096, 0)  # the IFDs of 6 small pages: within the first page of the file
        with tifffile.TiffFile(io.BytesIO(head)) as tf:
            offsets, counts = tf.pages[3].dataoffsets, tf.pages[3].databytecounts
        before = stats(m)
        page = os.pread(fd, sum(counts), offsets[0])
        after = stats(m)
    finally:
        os.close(fd)
    np.testing.assert_array_equal(np.frombuffer(page, "<f8").reshape(64, 64), value[3])
    assert after["chunk_gets"] - before["chunk_gets"] == 4
    assert after["prefetched"] == before["prefetched"]


def test_bigtiff_of_a_sparse_array_past_4_gib(mount, tmp_path):
    root = tmp_path / "huge.zarr"
    shape = (5, 32768, 32768)  # 5 GiB of uint8; one chunk stored, the rest is fill
    a = zarr.open_array(root, mode="w", shape=shape, chunks=(1, 4096, 4096), dtype="u1", fill_value=9)
    patch = np.random.default_rng(4).integers(0, 256, (4096, 4096), dtype="u1")
    a[4, 4096:8192, :4096] = patch
    m = mount(root)
    f = m / VIEWS / "tiff" / "huge.tif"
    with tifffile.TiffFile(f) as tf:
        assert tf.is_bigtiff and len(tf.pages) == 5
        last = tf.pages[4]
        assert os.stat(f).st_size == last.dataoffsets[-1] + last.databytecounts[-1]
        # rows 4096..4100 of the last page: stored chunk, then fill
        row0 = last.dataoffsets[0] + 4096 * 32768
        with open(f, "rb") as fh:
            fh.seek(row0)
            rows = np.frombuffer(fh.read(4 * 32768), "u1").reshape(4, 32768)
    np.testing.assert_array_equal(rows[:, :4096], patch[:4])
    assert (rows[:, 4096:] == 9).all()


def run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=GDAL_ENV, **kw)


def need(tool):
    if shutil.which(tool) is None:
        pytest.fail(f"{tool} is not installed (scripts/test.sh installs it with apt)")


def gdal_stats(path, env=GDAL_ENV) -> tuple[tuple[int, int], list[tuple[str, dict[str, float]]]]:
    r = subprocess.run(["gdalinfo", "-stats", os.fspath(path)], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    # A VRT is rewritten with its statistics: an ERROR when that fails
    assert not re.search(r"\b(ERROR|Warning)\b", r.stdout + r.stderr), r.stderr
    return parse_stats(r.stdout)


def parse_stats(stdout: str) -> tuple[tuple[int, int], list[tuple[str, dict[str, float]]]]:
    """Size and, per band, type and statistics, from what `gdalinfo -stats` prints."""
    size = tuple(int(x) for x in re.search(r"Size is (\d+), (\d+)", stdout).groups())
    bands = []
    for m in re.finditer(r"Type=(\w+).*?Minimum=(\S+), Maximum=(\S+), Mean=(\S+), StdDev=(\S+)", stdout, re.S):
        bands.append(
            (m.group(1), dict(zip(("min", "max", "mean", "std"), (float(x.rstrip(",")) for x in m.groups()[1:]))))
        )
    return size, bands


@pytest.mark.parametrize(
    "path,gdal_type",
    [
        ("img_u1", "Byte"),
        ("grp/img_u2", "UInt16"),
        ("be_i4", "Int32"),
        ("grp/stack_f4", "Float32"),
        ("sparse_f4", "Float32"),
    ],
)
@pytest.mark.parametrize("how", ["hdr", "vrt"])
def test_gdalinfo_stats_match_numpy(mnt, store, path, gdal_type, how):
    need("gdalinfo")
    want = zarr.open_array(store[0] / path)[...].astype("f8")
    f = mnt / VIEWS / ("raw" if how == "hdr" else "gdal") / (path + (".raw" if how == "hdr" else ".vrt"))
    size, bands = gdal_stats(f)
    cube = want if want.ndim == 3 else want[None]
    assert size == (cube.shape[2], cube.shape[1])
    assert len(bands) == cube.shape[0]
    for (typ, st), band in zip(bands, cube):
        assert typ == gdal_type
        # gdalinfo prints 3 decimals
        for key, value in (("min", band.min()), ("max", band.max()), ("mean", band.mean()), ("std", band.std())):
            assert st[key] == pytest.approx(value, abs=5e-4 + 5e-7 * abs(value)), (key, band.shape)


def assert_numpy_statistics(bands, cube):
    assert len(bands) == cube.shape[0]
    for (_, st), band in zip(bands, cube):
        for key, value in (("min", band.min()), ("max", band.max()), ("mean", band.mean()), ("std", band.std())):
            assert st[key] == pytest.approx(value, abs=5e-4 + 5e-7 * abs(value)), (key, band.shape)


def vrt_statistics(path) -> list[dict[str, float]]:
    """The STATISTICS_* band metadata of a VRT or an .aux.xml, one dict a band it names."""
    root = ElementTree.fromstring(path.read_bytes())
    bands = [*root.iter("VRTRasterBand"), *root.iter("PAMRasterBand")]
    return [{mdi.get("key"): float(mdi.text) for mdi in band.iter("MDI")} for band in bands]


def test_views_keep_the_statistics_gdal_saves_until_a_refresh(mnt, store):
    """gdalinfo -stats saves its statistics into raw/PATH.raw.aux.xml or the VRT view of a
    read-only mount: both views then hold them (numpy's), gdalinfo prints them without an
    error or a warning, a refresh drops them."""
    need("gdalinfo")
    (mnt / VIEWS / "refresh").read_bytes()  # none kept by the tests before
    vrt = mnt / VIEWS / "gdal" / "grp" / "stack_f4.vrt"
    aux = mnt / VIEWS / "raw" / "grp" / "stack_f4.raw.aux.xml"
    assert vrt_statistics(vrt) == [{}] * 5 and vrt_statistics(aux) == []
    want = zarr.open_array(store[0] / "grp/stack_f4")[...].astype("f8")
    mtime = os.stat(mnt / "grp" / "stack_f4.npy").st_mtime_ns
    for f in (mnt / VIEWS / "raw" / "grp" / "stack_f4.raw", vrt, vrt):
        _, bands = gdal_stats(f)
        assert_numpy_statistics(bands, want)
        for kept in (vrt_statistics(vrt), vrt_statistics(aux)):
            assert [s["STATISTICS_MEAN"] for s in kept] == pytest.approx(want.mean(axis=(1, 2)), rel=1e-6)
        assert os.stat(vrt).st_size == len(vrt.read_bytes()) and os.stat(aux).st_size == len(aux.read_bytes())
    # the array is unchanged: so is its time (asked of a file the kernel has no attributes of)
    assert os.stat(mnt / VIEWS / "npy-f" / "grp" / "stack_f4.npy").st_mtime_ns == mtime
    (mnt / VIEWS / "refresh").read_bytes()
    assert vrt_statistics(vrt) == [{}] * 5 and vrt_statistics(aux) == []


def test_vrt_statistics_go_when_the_array_is_written(mount, tmp_path):
    """On a writable mount too; a write into the array drops them (GDAL computes the new ones)."""
    need("gdalinfo")
    root = tmp_path / "w.zarr"
    value = np.arange(600, dtype="<f4").reshape(20, 30)
    zarr.open_array(root, mode="w", shape=value.shape, chunks=(8, 8), dtype="f4")[...] = value
    m = mount(root, "writable")
    f = m / VIEWS / "gdal" / "w.vrt"
    _, bands = gdal_stats(f)
    assert_numpy_statistics(bands, value[None].astype("f8"))
    assert vrt_statistics(f)[0]["STATISTICS_MAXIMUM"] == 599
    with open(m / "w.npy", "rb") as fh:
        np.lib.format.read_magic(fh)
        np.lib.format.read_array_header_1_0(fh)
        start = fh.tell()
    with open(m / "w.npy", "r+b") as fh:  # row 0
        fh.seek(start)
        fh.write(np.full(30, 1000, "<f4").tobytes())
    assert vrt_statistics(f) == [{}]
    value[0] = 1000
    _, bands = gdal_stats(f)
    assert_numpy_statistics(bands, value[None].astype("f8"))
    np.testing.assert_array_equal(zarr.open_array(root)[...], value)


@pytest.mark.parametrize("path", ["img_u1", "grp/stack_f4", "be_i4"])
def test_gdal_and_imagemagick_accept_the_tiffs(mnt, path):
    need("gdalinfo")
    need("identify")
    f = mnt / VIEWS / "tiff" / (path + ".tif")
    r = run(["gdalinfo", os.fspath(f)])
    assert r.returncode == 0 and "Driver: GTiff" in r.stdout, r.stderr
    r = run(["identify", os.fspath(f)])
    assert r.returncode == 0, r.stderr
    pages = r.stdout.strip().splitlines()
    assert len(pages) == {"img_u1": 1, "grp/stack_f4": 5, "be_i4": 3}[path]
    assert all("TIFF" in line for line in pages)


# --------------------------------------------------------------------------- previews


def test_previews_are_pngs_of_the_middle_page(mnt, store):
    names = os.listdir(mnt / VIEWS / "preview")
    assert {"img_u1.png", "be_i4.png", "cube_f8.png", "grp"} <= set(names)
    want = zarr.open_array(store[0] / "grp/stack_f4")[2].astype("f8")  # middle of 5 pages
    f = mnt / VIEWS / "preview" / "grp" / "stack_f4.png"
    data = f.read_bytes()
    assert os.stat(f).st_size == len(data)
    with Image.open(io.BytesIO(data)) as im:
        assert im.mode == "L" and im.size == (48, 64)
        grey = np.asarray(im).astype(int)
    lo, hi = np.percentile(want, [1, 99])
    expect = np.clip(np.round((want - lo) / (hi - lo) * 255), 0, 255)
    assert np.abs(grey - expect).max() <= 1


def test_preview_nan_is_transparent(mount, tmp_path):
    root = tmp_path / "nan.zarr"
    value = np.random.default_rng(6).random((30, 20)).astype("f4")
    value[5:9, 3:7] = np.nan
    a = zarr.open_array(root, mode="w", shape=value.shape, chunks=(8, 8), dtype="f4")
    a[...] = value
    m = mount(root)
    with Image.open(m / VIEWS / "preview" / "nan.png") as im:
        assert im.mode == "LA" and im.size == (20, 30)
        alpha = np.asarray(im)[..., 1]
    np.testing.assert_array_equal(alpha == 0, np.isnan(value))


def test_preview_of_a_large_array_reads_a_bounded_strided_subset(mount, tmp_path):
    root = tmp_path / "large.zarr"
    shape, chunks = (3, 20000, 20000), (1, 1000, 1000)  # 4.8 GB logical, 4 MB chunks
    a = zarr.open_array(root, mode="w", shape=shape, chunks=chunks, dtype="f4", fill_value=0)
    a[1, 9000:11000, 9000:11000] = 1.0
    m = mount(root)
    before = stats(m)
    with Image.open(m / VIEWS / "preview" / "large.png") as im:
        assert im.size == (254, 254)  # 20000 / ceil(20000 / 256): longest side at most 256
    after = stats(m)
    budget = 64 << 20  # zarrfs.views.preview.MAX_DECODED_BYTES, the bound docs/VIEWS.md states
    assert 0 < after["preview_decoded_bytes"] - before.get("preview_decoded_bytes", 0) <= budget
    assert after["chunk_gets"] - before["chunk_gets"] <= budget // (1000 * 1000 * 4)


# --------------------------------------------------------------------------- the commands of docs/VIEWS.md

VIEWS_DOC = REPO / "docs" / "VIEWS.md"


def readme_commands() -> list[str]:
    """The GDAL and ImageMagick commands of the table in docs/VIEWS.md (`display` needs a screen)."""
    rows = re.findall(r"^\| (?:GDAL|ImageMagick) \| (.*?) \| .* \|$", VIEWS_DOC.read_text(), re.M)
    return [c for row in rows for c in re.findall(r"`([^`]+)`", row) if not c.startswith("display ")]


@pytest.fixture(scope="module")
def readme_store(tmp_path_factory):
    """The example of docs/VIEWS.md: g/img (2-D) and g/stack (3-D float32, values up to 100)."""
    root = tmp_path_factory.mktemp("readme") / "readme.zarr"
    rng = np.random.default_rng(9)
    g = zarr.open_group(root, mode="w", zarr_format=3)
    stack = (rng.random((4, 64, 48)) * 100).astype("f4")
    g.create_array("g/stack", shape=stack.shape, dtype=stack.dtype, chunks=(1, 32, 32))[...] = stack
    img = rng.integers(0, 60000, (40, 30), dtype="u2")
    g.create_array("g/img", shape=img.shape, dtype=img.dtype, chunks=(16, 16))[...] = img
    return root


def test_readme_commands_run_cleanly_and_stretch_pages(module_mount, readme_store, tmp_path):
    """Every GDAL and ImageMagick command docs/VIEWS.md shows runs on a read-only mount without an
    ERROR or Warning line, in the user's environment; its statistics are numpy's; its page
    pictures map min..max to 0..255."""
    need("gdalinfo")
    need("convert")
    mnt = module_mount(readme_store)
    stack = zarr.open_array(readme_store / "g" / "stack")[...].astype("f8")
    page = stack[2]
    commands = readme_commands()
    assert any(c.startswith("gdalinfo -stats") and c.endswith(".vrt") for c in commands), commands
    assert len(commands) >= 6, commands
    env = GDAL_ENV
    for command in commands:
        command = (
            command.replace("MNT", os.fspath(mnt))
            .replace("LO", repr(float(page.min())))
            .replace("HI", repr(float(page.max())))
        )
        r = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env)
        noise = [ln for ln in (r.stdout + r.stderr).splitlines() if re.search(r"\b(ERROR|Warning)\b", ln)]
        assert r.returncode == 0 and not noise, f"{command}: exit {r.returncode}\n{r.stderr}\n{noise}"
        if "gdalinfo -stats" in command:
            assert "g/stack." in command, command
            assert_numpy_statistics(parse_stats(r.stdout)[1], stack)
    want = (page - page.min()) / (page.max() - page.min()) * 255
    for name in ("page2.png", "page3.png"):
        with Image.open(tmp_path / name) as im:
            got = np.asarray(im).astype("f8")
        got = got / 257 if got.max() > 255 else got  # a 16-bit PNG
        assert got.shape == page.shape, name
        assert np.abs(got - want).max() <= 2, f"{name} is not the page stretched from its min to its max"
        assert (got >= 255).mean() < 0.01, f"{name} clips {(got >= 255).mean():.0%} of its pixels to white"
