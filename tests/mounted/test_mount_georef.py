"""Mounted tests of georeferenced image views: gdal/PATH.vrt, tiff/PATH.tif and raw/PATH.hdr of CF rasters.

Stores written by rioxarray and xarray (EPSG:32633 and EPSG:4326, Zarr v2 and v3). Oracles:
gdalinfo on each view against gdalinfo on the netCDF view of the same group (`NETCDF:`, which
Debian's GDAL georeferences from the same CF attributes: EPSG code, origin, pixel size, NoData,
checksums), rioxarray's transform and xarray's fill values read from the store, pyproj reading
the EPSG code from GDAL's WKT, tifffile's `geotiff_metadata`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from xml.etree import ElementTree

import numpy as np
import pyproj
import pytest
import tifffile

from support import mounting
from support.georasters import UTM_NODATA, UTM_ORIGIN, UTM_PIXEL_M, latlon_store, utm_store

VIEWS = ".zarrfs"
# GDAL as a user runs it (it saves the statistics it computes into the views: the mount keeps them).
GDAL_ENV = {k: v for k, v in os.environ.items() if not k.startswith(("GDAL_", "CPL_"))}
# rasterio and rioxarray multiply affine transforms with `*`, which affine now deprecates.
pytestmark = pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")


@pytest.fixture(scope="module", params=[2, 3], ids=["v2", "v3"])
def mnts(request, module_mount, tmp_path_factory):
    if shutil.which("gdalinfo") is None:
        pytest.fail("gdalinfo is not installed (scripts/test.sh installs it with apt)")
    base = tmp_path_factory.mktemp(f"georasters-v{request.param}")
    stores = {"utm": utm_store(base, request.param), "ll": latlon_store(base, request.param)}
    return {name: (module_mount(root), root) for name, root in stores.items()}


def gdalinfo(target: str, *args: str) -> dict:
    r = subprocess.run(
        ["gdalinfo", "-json", "-checksum", *args, target], capture_output=True, text=True, timeout=120, env=GDAL_ENV
    )
    assert r.returncode == 0 and "ERROR" not in r.stderr, r.stderr
    return json.loads(r.stdout)


def epsg(info: dict) -> int | None:
    wkt = info.get("coordinateSystem", {}).get("wkt")
    return pyproj.CRS.from_wkt(wkt).to_epsg() if wkt else None


def checksums(info: dict) -> list[int]:
    return [b["checksum"] for b in info["bands"]]


def nodata(info: dict) -> list[float | None]:
    """Each band's NoData value (gdalinfo -json writes NaN as a string)."""
    return [float(b["noDataValue"]) if "noDataValue" in b else None for b in info["bands"]]


def views(mnt, path: str) -> dict[str, str]:
    return {
        "vrt": os.fspath(mnt / VIEWS / "gdal" / f"{path}.vrt"),
        "tiff": os.fspath(mnt / VIEWS / "tiff" / f"{path}.tif"),
        "envi": os.fspath(mnt / VIEWS / "raw" / f"{path}.raw"),
    }


def rioxarray_reads(root, name) -> tuple[list[float], int | None]:
    """(GDAL geotransform, EPSG code) of the array NAME, as rioxarray reads them from the store."""
    import xarray as xr

    da = xr.open_zarr(root, consolidated=False, decode_coords="all")[name]
    da = da.rio.set_spatial_dims(x_dim=da.dims[-1], y_dim=da.dims[-2])
    return list(da.rio.transform(recalc=True).to_gdal()), da.rio.crs.to_epsg() if da.rio.crs else None


@pytest.mark.parametrize("view", ["vrt", "tiff", "envi"])
def test_utm_bands_are_placed_as_the_netcdf_view_is(mnts, view):
    mnt, root = mnts["utm"]
    nc = gdalinfo(f"NETCDF:{mnt / VIEWS / 'netcdf' / root.stem}.nc:band_data")
    info = gdalinfo(views(mnt, "band_data")[view])
    x0, y0 = UTM_ORIGIN
    want_gt = [x0, UTM_PIXEL_M, 0, y0, 0, -UTM_PIXEL_M]
    assert nc["geoTransform"] == pytest.approx(want_gt) and epsg(nc) == 32633  # the oracle holds
    assert info["geoTransform"] == pytest.approx(want_gt)
    assert rioxarray_reads(root, "band_data") == (pytest.approx(want_gt), 32633)
    assert epsg(info) == 32633
    # the TIFF's bands are its pages: GDAL shows the first, and each one as a subdataset
    bands = 1 if view == "tiff" else 3
    assert checksums(info) == checksums(nc)[:bands]
    assert nodata(info) == nodata(nc)[:bands] == [UTM_NODATA] * bands
    if view == "tiff":
        page3 = gdalinfo(f"GTIFF_DIR:3:{views(mnt, 'band_data')['tiff']}")
        assert page3["geoTransform"] == pytest.approx(want_gt) and epsg(page3) == 32633
        assert checksums(page3) == checksums(nc)[2:]


@pytest.mark.parametrize("view", ["vrt", "tiff", "envi"])
def test_latitude_longitude_north_up(mnts, view):
    mnt, root = mnts["ll"]
    nc = gdalinfo(f"NETCDF:{mnt / VIEWS / 'netcdf' / root.stem}.nc:north")
    info = gdalinfo(views(mnt, "north")[view])
    assert epsg(info) == epsg(nc) == 4326
    assert info["geoTransform"] == pytest.approx(nc["geoTransform"]) == rioxarray_reads(root, "north")[0]
    assert info["geoTransform"][:2] == pytest.approx([4.5, 1.0]) and info["geoTransform"][3:] == [60.5, 0, -1]
    assert checksums(info) == checksums(nc)
    assert np.isnan(nodata(info)).all() and np.isnan(nodata(nc)).all()  # xarray's _FillValue of floats


@pytest.mark.parametrize("view", ["vrt", "tiff", "envi"])
def test_latitude_ascending_is_south_up(mnts, view):
    """GDAL's netCDF driver turns a south-up grid north-up (its rows read bottom up); read as
    stored (GDAL_NETCDF_BOTTOMUP=NO) its checksum is the view's, whose rows are the array's."""
    import xarray as xr

    mnt, root = mnts["ll"]
    nc_path = f"NETCDF:{mnt / VIEWS / 'netcdf' / root.stem}.nc:south"
    flipped, as_stored = gdalinfo(nc_path), gdalinfo(nc_path, "--config", "GDAL_NETCDF_BOTTOMUP", "NO")
    info = gdalinfo(views(mnt, "south")[view])
    gt, rows = info["geoTransform"], info["size"][1]
    rio_gt, rio_epsg = rioxarray_reads(root, "south")
    assert gt == pytest.approx(rio_gt) and gt[5] > 0
    assert gt[3] + rows * gt[5] == pytest.approx(flipped["geoTransform"][3])  # the north edge
    assert gt[5] == pytest.approx(-flipped["geoTransform"][5]) and gt[:2] == pytest.approx(flipped["geoTransform"][:2])
    assert epsg(info) == rio_epsg == 4326  # named by its `coordinates` only: GDAL's netCDF driver finds none
    assert checksums(info) == checksums(as_stored) != checksums(flipped)
    assert nodata(info) == [xr.open_zarr(root, consolidated=False).south.encoding["missing_value"]]


def test_tiff_geokeys_read_by_tifffile(mnts):
    mnt, _ = mnts["utm"]
    with tifffile.TiffFile(views(mnt, "band_data")["tiff"]) as tf:
        geo = tf.geotiff_metadata
        nodata_tags = [p.tags[42113].value for p in tf.pages]
    assert int(geo["ProjectedCSTypeGeoKey"]) == 32633 and int(geo["GTModelTypeGeoKey"]) == 1
    assert int(geo["GTRasterTypeGeoKey"]) == 1  # PixelIsArea
    assert geo["ModelPixelScale"] == [UTM_PIXEL_M, UTM_PIXEL_M, 0]
    assert geo["ModelTiepoint"] == [0, 0, 0, *UTM_ORIGIN, 0]
    assert [float(t) for t in nodata_tags] == [UTM_NODATA] * 3
    mnt, _ = mnts["ll"]
    with tifffile.TiffFile(views(mnt, "south")["tiff"]) as tf:
        geo = tf.geotiff_metadata
    assert int(geo["GeographicTypeGeoKey"]) == 4326 and "ModelTiepoint" not in geo
    assert np.asarray(geo["ModelTransformation"]).reshape(4, 4)[1, 1] == pytest.approx(1.0)  # rows go north


def test_a_transposed_raster_is_not_placed_and_the_log_says_why(mnts, module_mount):
    mnt, _ = mnts["ll"]
    info = gdalinfo(views(mnt, "swapped")["vrt"])
    assert "geoTransform" not in info and "coordinateSystem" not in info
    assert "swapped: its last two dimensions 'lon', 'lat' are x then y" in module_mount.log_text(mnt)
    assert "map info" not in (mnt / VIEWS / "raw" / "swapped.hdr").read_text()


def test_gdal_saves_statistics_into_georeferenced_views(mnts):
    """gdalinfo -stats rewrites the VRT (its SRS again as WKT 1, with its axis mapping) and the
    raw view's .aux.xml (with the NoData value): both are accepted on a read-only mount, hold
    numpy's statistics, and keep them whichever is written first after a refresh."""
    import zarr

    mnt, root = mnts["utm"]
    want = zarr.open_array(root / "band_data", mode="r")[...].astype("f8")
    valid = np.ma.masked_equal(want, UTM_NODATA)
    files = views(mnt, "band_data")
    for first, second in (("vrt", "envi"), ("envi", "vrt")):
        (mnt / VIEWS / "refresh").read_bytes()
        for view in (first, second):
            r = subprocess.run(
                ["gdalinfo", "-stats", files[view]], capture_output=True, text=True, timeout=120, env=GDAL_ENV
            )
            assert r.returncode == 0 and not re.search(r"\b(ERROR|Warning)\b", r.stdout + r.stderr), r.stderr
        for saved in (files["vrt"], files["envi"] + ".aux.xml"):
            root_element = ElementTree.parse(saved).getroot()
            bands = [*root_element.iter("VRTRasterBand"), *root_element.iter("PAMRasterBand")]
            means = [float(b.find("Metadata/MDI[@key='STATISTICS_MEAN']").text) for b in bands]
            assert means == pytest.approx(valid.mean(axis=(1, 2)).filled(), rel=1e-9), saved
    assert gdalinfo(files["vrt"])["geoTransform"] == pytest.approx([*UTM_ORIGIN[:1], 10, 0, UTM_ORIGIN[1], 0, -10])


def test_bad_coordinates_or_wkt_leave_the_views_readable(mount, tmp_path):
    """A coordinate chunk that cannot be decoded: the raster is placed by the GeoTransform
    rioxarray wrote beside its WKT, and the log names the chunk's key once. A WKT that is no WKT:
    placed without a CRS, the log says why. The pixels read as ever."""
    import zarr

    root = utm_store(tmp_path, 3)
    (root / "x" / "c" / "0").write_bytes(b"not a zstd frame")
    mnt = mount(root)
    files = views(mnt, "band_data")
    for view in ("vrt", "tiff", "envi"):
        info = gdalinfo(files[view])
        assert info["geoTransform"] == pytest.approx([*UTM_ORIGIN[:1], 10, 0, UTM_ORIGIN[1], 0, -10])
        assert epsg(info) == 32633
    assert len(mounting.log_lines_naming(mount.log_text(mnt), "x/c/0")) == 1
    want = zarr.open_array(root / "band_data", mode="r")[...]
    np.testing.assert_array_equal(tifffile.imread(files["tiff"]), want)

    attrs = json.loads((root / "spatial_ref" / "zarr.json").read_text())
    attrs["attributes"].update(crs_wkt="not a WKT", spatial_ref="PROJCS[nothing")
    (root / "spatial_ref" / "zarr.json").write_text(json.dumps(attrs))
    (mnt / VIEWS / "refresh").read_bytes()
    info = gdalinfo(files["vrt"])
    assert "coordinateSystem" not in info and info["geoTransform"][0] == UTM_ORIGIN[0]
    assert "grid_mapping 'spatial_ref' is no WKT" in mount.log_text(mnt)
    assert "coordinate system string" not in (mnt / VIEWS / "raw" / "band_data.hdr").read_text()


def test_the_georeference_loads_only_the_coordinates_once(mount, tmp_path):
    """Placing the three views of a raster loads the chunks of its x and y coordinates (one each,
    as xarray writes them) once, and no chunk of the raster itself."""
    root = utm_store(tmp_path, 3)
    mnt = mount(root)
    before = json.loads((mnt / VIEWS / "stats.json").read_text())
    for path in views(mnt, "band_data").values():
        os.stat(path)
    os.stat(mnt / VIEWS / "raw" / "band_data.hdr")
    (mnt / VIEWS / "gdal" / "band_data.vrt").read_bytes()
    after = json.loads((mnt / VIEWS / "stats.json").read_text())
    assert after["cache_misses"] - before["cache_misses"] == 2, (before, after)


def test_gdal_saves_histograms_into_the_views(mnts):
    """gdalinfo -hist (what QGIS asks for when it draws a layer) saves each band's histogram into
    the VRT and the raw view's .aux.xml: both keep it, with the counts GDAL printed, and the next
    gdalinfo -hist prints it without an error or a warning."""
    mnt, _ = mnts["utm"]
    files = views(mnt, "band_data")
    (mnt / VIEWS / "refresh").read_bytes()
    printed = {}
    for view in ("vrt", "envi", "vrt"):
        r = subprocess.run(
            ["gdalinfo", "-hist", files[view]], capture_output=True, text=True, timeout=120, env=GDAL_ENV
        )
        assert r.returncode == 0 and not re.search(r"\b(ERROR|Warning)\b", r.stdout + r.stderr), r.stderr
        found = re.findall(r"(\d+) buckets from (\S+) to (\S+):\n\s*([\d ]+)\n", r.stdout)
        assert len(found) == 3, r.stdout
        printed.setdefault(view, [[int(c) for c in counts.split()] for _, _, _, counts in found])
    for view, saved in (("vrt", files["vrt"]), ("envi", files["envi"] + ".aux.xml")):
        root_element = ElementTree.parse(saved).getroot()
        bands = [*root_element.iter("VRTRasterBand"), *root_element.iter("PAMRasterBand")]
        kept = [[int(c) for c in b.find("Histograms/HistItem/HistCounts").text.split("|")] for b in bands]
        assert kept == printed[view] and sum(kept[0]) == 6 * 8 - 3, saved  # (3 NoData pixels in band 1)


def test_a_rotated_geotransform_places_the_vrt_and_the_tiff(mount, tmp_path):
    """A GDAL GeoTransform attribute with rotation and no coordinates (as GDAL's netCDF writer
    leaves one): the VRT and the TIFF (ModelTransformation) are placed as it says; ENVI's map
    info has no shear, so the ENVI view keeps only its NoData value."""
    import zarr

    root = tmp_path / "rotated.zarr"
    g = zarr.open_group(root, mode="w", zarr_format=2)
    a = g.create_array(
        "a",
        shape=(4, 5),
        dtype="f4",
        fill_value=-1,
        attributes={"grid_mapping": "crs", "_ARRAY_DIMENSIONS": ["r", "c"]},
    )
    a[...] = np.arange(20, dtype="f4").reshape(4, 5)
    wkt = pyproj.CRS.from_epsg(3857).to_wkt()
    g.create_array(
        "crs", shape=(), dtype="i4", attributes={"spatial_ref": wkt, "GeoTransform": "100 2 0.5 900 0.25 -2"}
    )
    mnt = mount(root)
    files = views(mnt, "a")
    for view in ("vrt", "tiff"):
        info = gdalinfo(files[view])
        assert info["geoTransform"] == [100, 2, 0.5, 900, 0.25, -2] and epsg(info) == 3857
        assert nodata(info) == [-1]  # v2's fill_value, as xarray reads it
    info = gdalinfo(files["envi"])
    assert "geoTransform" not in info and nodata(info) == [-1]
