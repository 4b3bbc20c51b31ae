"""Mounted tests of `.zarrfs/ome-tiff/IMAGE.ome.tif`: OME-Zarr images as pyramidal OME-TIFF.

Stores are written by ome-zarr-py and ngff-zarr (NGFF 0.4 on Zarr v2, 0.5 on v3). Oracles:
tifffile (OME series, levels, tiles, SubIFDs) against zarr-python reading each level;
bioio-ome-tiff reading the file against bioio-ome-zarr reading the store (through the
mount's `.zarrfs/store/`); ome-types validating the OME-XML.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tifffile
import zarr

from support import ome_stores

OME = Path(".zarrfs") / "ome-tiff"


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    root = tmp_path_factory.mktemp("ome-stores")
    labels = {}
    for version in ("0.4", "0.5"):
        labels[version] = ome_stores.ome_zarr_image(root / f"ozp{version[-1]}.zarr", version)
        (root / f"nz{version[-1]}").mkdir()
        ome_stores.ngff_zarr_images(root / f"nz{version[-1]}", version)
    fields = ome_stores.ome_zarr_plate(root / "plate.zarr")
    return root, labels, fields


def stats(mnt: Path) -> dict:
    return json.loads((mnt / ".zarrfs" / "stats.json").read_text())


def check_pyramid(path: Path, group, axes: str, level_paths: list[str]) -> str:
    """tifffile's reading of an OME-TIFF against zarr-python's of the image's levels; its OME-XML."""
    with tifffile.TiffFile(path) as tf:
        assert tf.is_ome and tf.is_bigtiff
        series = tf.series[0]
        assert series.axes == axes
        assert len(series.levels) == len(level_paths)
        for level, sub in zip(series.levels, level_paths):
            np.testing.assert_array_equal(level.asarray(), group[sub][...])
        page = tf.pages[0]
        assert page.is_tiled and len(page.subifds or ()) == len(level_paths) - 1
        return page.description


def dataset_paths(group) -> list[str]:
    """The levels an image group's NGFF metadata lists (0.5: under `ome`)."""
    attrs = group.attrs.asdict()
    ms = attrs.get("ome", attrs)["multiscales"][0]
    return [d["path"] for d in ms["datasets"]]


def validate(xml: str):
    import ome_types

    return ome_types.from_xml(xml, validate=True)


@pytest.mark.parametrize("version", ["0.4", "0.5"])
def test_ome_zarr_py_image_and_labels_as_ome_tiff(mount, stores, version):
    root, labels, _ = stores
    store = root / f"ozp{version[-1]}.zarr"
    mnt = mount(store)
    group = zarr.open_group(str(store), mode="r")
    xml = check_pyramid(mnt / OME / f"ozp{version[-1]}.ome.tif", group, "TCZYX", ["s0", "s1", "s2"])
    px = validate(xml).images[0].pixels
    assert (px.size_t, px.size_c, px.size_z, px.size_y, px.size_x) == ome_stores.SHAPE_5D
    assert (px.physical_size_x, px.physical_size_x_unit.value) == (0.25, "µm")
    assert (px.physical_size_z, px.time_increment, px.time_increment_unit.value) == (0.5, 2.0, "s")
    assert [c.name for c in px.channels] == [n for n, _ in ome_stores.CHANNELS]
    # The labels image, and the uint64 one left out with its reason in the log.
    cells = group["labels/cells"]
    assert len(dataset_paths(cells)) >= 3
    check_pyramid(mnt / OME / "labels" / "cells.ome.tif", cells, "ZYX", dataset_paths(cells))
    assert sorted(os.listdir(mnt / OME / "labels")) == ["cells", "cells.ome.tif", "ids", "nuclei", "nuclei.ome.tif"]
    log = mount.log_text(mnt)
    assert "ome-tiff/labels/ids.ome.tif: not shown: OME-TIFF has no pixel type for uint64" in log
    # int64 labels whose values fit: uint32, the 32-bit type that holds them all
    nuclei = group["labels/nuclei"]
    xml = check_pyramid(mnt / OME / "labels" / "nuclei.ome.tif", nuclei, "ZYX", dataset_paths(nuclei))
    assert validate(xml).images[0].pixels.type.value == "uint32"
    np.testing.assert_array_equal(tifffile.imread(mnt / OME / "labels" / "nuclei.ome.tif"), labels[version]["nuclei"])


@pytest.mark.parametrize("version", ["0.4", "0.5"])
def test_bioio_reads_the_ome_tiff_as_bioio_ome_zarr_reads_the_store(mount, stores, version):
    import bioio_ome_tiff
    import bioio_ome_zarr
    from bioio import BioImage

    root, _, _ = stores
    mnt = mount(root / f"ozp{version[-1]}.zarr")
    tiff = BioImage(mnt / OME / f"ozp{version[-1]}.ome.tif", reader=bioio_ome_tiff.Reader)
    store = BioImage(str(mnt / ".zarrfs" / "store"), reader=bioio_ome_zarr.Reader)  # the store's keys, served
    assert tiff.dims.order == store.dims.order == "TCZYX"
    assert tiff.dims.shape == store.dims.shape
    assert tiff.physical_pixel_sizes == store.physical_pixel_sizes
    assert list(tiff.channel_names) == list(store.channel_names)
    np.testing.assert_array_equal(tiff.get_image_data("ZYX", T=1, C=2), store.get_image_data("ZYX", T=1, C=2))
    # ome-zarr-py's own command on the store view
    cli = Path(sys.executable).parent / "ome_zarr"
    out = subprocess.run([cli, "info", mnt / ".zarrfs" / "store"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert (
        f"version: {version}" in out.stdout
        and "(2, 3, 4, 100, 120)" in out.stdout
        and "(2, 3, 4, 25, 30)" in out.stdout
    )


@pytest.mark.parametrize("version", ["0.4", "0.5"])
def test_ngff_zarr_images_and_a_pyramid_that_reduces_z(mount, stores, version):
    root, _, _ = stores
    store = root / f"nz{version[-1]}"
    mnt = mount(store)
    xml = check_pyramid(
        mnt / OME / "yx.zarr.ome.tif",
        zarr.open_group(str(store / "yx.zarr"), mode="r"),
        "YX",
        ["scale0/flat", "scale1/flat", "scale2/flat"],
    )
    px = validate(xml).images[0].pixels
    assert (px.physical_size_y, px.physical_size_x, px.physical_size_x_unit.value) == (0.5, 0.5, "µm")
    # ngff-zarr's level 1 halves z too: level 0 alone, and the log says so once.
    check_pyramid(
        mnt / OME / "zyx.zarr.ome.tif", zarr.open_group(str(store / "zyx.zarr"), mode="r"), "ZYX", ["scale0/image"]
    )
    (mnt / OME / "zyx.zarr.ome.tif").read_bytes()
    check_pyramid(
        mnt / OME / "zyx2.zarr.ome.tif",
        zarr.open_group(str(store / "zyx2.zarr"), mode="r"),
        "ZYX",
        ["scale0/image", "scale1/image", "scale2/image"],
    )
    log = mount.log_text(mnt)
    assert log.count("zyx.zarr.ome.tif: level scale1/image is not level 0 reduced in y and x alone") == 1
    if version == "0.5":  # sharded levels: tiles of the inner chunks' y and x
        sharded = zarr.open_group(str(store / "sharded.zarr"), mode="r")
        assert sharded["scale0/image"].shards is not None
        check_pyramid(
            mnt / OME / "sharded.zarr.ome.tif", sharded, "ZYX", ["scale0/image", "scale1/image", "scale2/image"]
        )
        with tifffile.TiffFile(mnt / OME / "sharded.zarr.ome.tif") as tf:
            assert (tf.pages[0].tilelength, tf.pages[0].tilewidth) == (16, 16)


def test_each_field_of_a_plate(mount, stores):
    root, _, fields = stores
    mnt = mount(root / "plate.zarr")
    assert sorted(os.listdir(mnt / OME / "A" / "1")) == ["0", "0.ome.tif", "1", "1.ome.tif"]
    for field, data in fields.items():
        group = zarr.open_group(str(root / "plate.zarr" / field), mode="r")
        check_pyramid(mnt / OME / (field + ".ome.tif"), group, "CYX", ["s0", "s1"])
        np.testing.assert_array_equal(tifffile.imread(mnt / OME / (field + ".ome.tif")), data)


class PreadFile(io.RawIOBase):
    """A file object reading an open descriptor with pread (no read-ahead of its own)."""

    def __init__(self, fd: int) -> None:
        self.fd, self.pos = fd, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = 0) -> int:
        self.pos = offset if whence == 0 else self.pos + offset if whence == 1 else os.fstat(self.fd).st_size + offset
        return self.pos

    def tell(self) -> int:
        return self.pos

    def readinto(self, buf) -> int:
        data = os.pread(self.fd, len(buf), self.pos)
        buf[: len(data)] = data
        self.pos += len(data)
        return len(data)


def test_reading_one_tile_of_level_0_loads_only_the_chunks_under_it(mount, stores):
    root, _, _ = stores
    mnt = mount(root / "ozp4.zarr")
    level0 = zarr.open_array(str(root / "ozp4.zarr" / "s0"), mode="r")
    fd = os.open(mnt / OME / "ozp4.ome.tif", os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)  # no kernel read-ahead into other tiles
        with tifffile.TiffFile(io.BufferedReader(PreadFile(fd), 512)) as tf:  # reads only what it parses
            page = tf.pages[17]  # plane t=1, c=1, z=1 (XYZCT)
            offsets, counts = page.dataoffsets, page.databytecounts
            tile_h, tile_w = page.tilelength, page.tilewidth
        before = stats(mnt)
        k = 1  # row 0, column 1 of tiles
        tile = os.pread(fd, counts[k], offsets[k])
        after = stats(mnt)
    finally:
        os.close(fd)
    assert (tile_h, tile_w) == (64, 64)  # the chunks' y and x
    want = np.zeros((64, 64), "u2")
    part = level0[1, 1, 1, 0:64, 64:120]
    want[:, : part.shape[1]] = part
    np.testing.assert_array_equal(np.frombuffer(tile, "<u2").reshape(64, 64), want)
    assert after["chunk_gets"] - before["chunk_gets"] == 1  # chunk (1, 1, 1, 0, 1) alone
    assert after["prefetched"] == before["prefetched"]


def test_header_reads_whole_through_the_mount(mount, stores):
    """A read of the whole file in pieces of odd sizes gives the bytes a whole read gives."""
    root, _, _ = stores
    mnt = mount(root / "ozp5.zarr")
    path = mnt / OME / "ozp5.ome.tif"
    whole = path.read_bytes()
    assert len(whole) == path.stat().st_size
    got = bytearray()
    with open(path, "rb", buffering=0) as f:
        while chunk := f.read(12345):
            got += chunk
    assert bytes(got) == whole
    with tifffile.TiffFile(io.BytesIO(whole)) as tf:
        assert tf.series[0].shape == ome_stores.SHAPE_5D


@pytest.mark.parametrize("version", ["0.4", "0.5"])
def test_tiff_view_of_a_level_says_its_axes_and_resolution(mount, stores, version):
    root, _, _ = stores
    mnt = mount(root / f"ozp{version[-1]}.zarr")
    for level, pixel_um in (("s0", 0.25), ("s1", 0.5)):  # x and y in micrometres at each level
        with tifffile.TiffFile(mnt / ".zarrfs" / "tiff" / f"{level}.tif") as tf:
            assert tf.series[0].axes == "TCZYX"
            assert json.loads(tf.pages[0].description)["axes"] == "TCZYX"
            page = tf.pages[0]
            assert page.resolutionunit == tifffile.RESUNIT.CENTIMETER
            assert page.resolution == pytest.approx((1e4 / pixel_um, 1e4 / pixel_um))
    # A v3 array's dimension names, where no image group says more (ngff-zarr's nested levels).
    if version == "0.5":
        mnt = mount(root / "nz5")
        with tifffile.TiffFile(mnt / ".zarrfs" / "tiff" / "yx.zarr" / "scale0" / "flat.tif") as tf:
            assert tf.series[0].axes == "YX" and json.loads(tf.pages[0].description)["axes"] == "YX"


def test_the_file_follows_the_store_after_a_refresh(mount, tmp_path):
    import errno

    from ome_zarr.format import FormatV04
    from ome_zarr.writer import write_image

    store = tmp_path / "moving.zarr"
    group = zarr.open_group(str(store), mode="w", zarr_format=2)
    first = np.arange(64 * 80, dtype="u2").reshape(64, 80)
    write_image(first, group, scale_factors=(2, 4), fmt=FormatV04(), axes="yx", storage_options={"chunks": (32, 32)})
    mnt = mount(store)
    path = mnt / OME / "moving.ome.tif"
    check_pyramid(path, group, "YX", ["s0", "s1", "s2"])
    fd = os.open(path, os.O_RDONLY)
    inode = os.fstat(fd).st_ino
    try:
        # New pixels in level 0, the same layout: the same file shows them.
        group["s0"][...] = first[::-1]
        (mnt / ".zarrfs" / "refresh").read_bytes()
        np.testing.assert_array_equal(tifffile.imread(path), first[::-1])
        assert path.stat().st_ino == os.fstat(fd).st_ino  # the same file
        # Level 2 replaced by an array that reduces nothing: a new file of two levels; the one
        # opened before reads ESTALE.
        zarr.create_array(
            str(store), name="s2", shape=(30, 30), chunks=(16, 16), dtype="u2", overwrite=True, zarr_format=2
        )
        (mnt / ".zarrfs" / "refresh").read_bytes()
        with pytest.raises(OSError) as e:
            os.pread(fd, 4096, 0)
        assert e.value.errno == errno.ESTALE
    finally:
        os.close(fd)
    check_pyramid(path, zarr.open_group(str(store), mode="r"), "YX", ["s0", "s1"])
    assert path.stat().st_ino != inode
    assert "moving.ome.tif: level s2 is not level 0 reduced" in mount.log_text(mnt)


def test_gdal_reads_planes_and_their_reductions_as_overviews(mount, stores):
    """libtiff (through GDAL) against the plain tiff/ view of each level: the same checksums."""
    if shutil.which("gdalinfo") is None:
        pytest.fail("gdalinfo is not installed (scripts/test.sh installs gdal-bin with apt)")
    root, _, _ = stores
    mnt = mount(root / "ozp4.zarr")

    def gdalinfo(path: str) -> str:
        env = {**os.environ, "GDAL_PAM_ENABLED": "NO"}  # nothing written beside the files
        r = subprocess.run(["gdalinfo", "-checksum", path], capture_output=True, text=True, timeout=120, env=env)
        assert r.returncode == 0, r.stderr
        return r.stdout

    for plane in (1, 19):  # GDAL numbers pages from 1
        got = gdalinfo(f"GTIFF_DIR:{plane}:{mnt / OME / 'ozp4.ome.tif'}")
        want = [
            re.search(r"Checksum=(\d+)", gdalinfo(f"GTIFF_DIR:{plane}:{mnt / '.zarrfs' / 'tiff' / f's{i}.tif'}"))[1]
            for i in range(3)
        ]
        assert "Block=64x64" in got and re.search(r"Checksum=(\d+)", got)[1] == want[0]
        assert "Overviews: 60x50, 30x25" in got
        assert re.search(r"Overviews checksum: (\d+), (\d+)", got).groups() == tuple(want[1:])


def test_decode_buffers_of_passed_tiles_are_reused_and_bytes_stay_the_same(mount, tmp_path):
    """A sequential reader gives back the chunks of the tiles it passed (read-only mounts,
    fastpath/spares.py); a writable mount, which keeps them, reads the same bytes."""
    from ome_zarr.format import FormatV04
    from ome_zarr.writer import write_image

    store = tmp_path / "big.zarr"
    group = zarr.open_group(str(store), mode="w", zarr_format=2)
    data = np.random.default_rng(2).integers(0, 1000, (3, 1024, 1024)).astype("u2")  # 512 KiB chunks
    write_image(data, group, scale_factors=(2,), fmt=FormatV04(), axes="zyx", storage_options={"chunks": (1, 512, 512)})
    ro = mount(store)
    whole = (ro / OME / "big.ome.tif").read_bytes()
    assert stats(ro)["buffers_reused"] > 0
    rw = mount(store, "writable")
    assert (rw / OME / "big.ome.tif").read_bytes() == whole
    with tifffile.TiffFile(io.BytesIO(whole)) as tf:
        np.testing.assert_array_equal(tf.series[0].levels[0].asarray(), data)
        np.testing.assert_array_equal(tf.series[0].levels[1].asarray(), group["s1"][...])
