"""Georeferences of CF rasters (zarrfs.views.georef) from stores rioxarray and xarray wrote, with pyproj and
rioxarray as oracles; GeoTIFF tags (zarrfs.views.tiff.geo_tags) read back by tifffile."""

from __future__ import annotations

import io
import math

import numpy as np
import pyproj
import pytest
import tifffile
import xarray as xr
import zarr

from zarrfs.views import georef, tiff
from zarrfs.views.georef import Crs, CrsKind, GeoReference

from support.core import open_node
from support.georasters import latlon_store, utm_store

# rasterio and rioxarray multiply affine transforms with `*`, which affine now deprecates.
pytestmark = pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")

EPSG_CODES = [32633, 4326, 3857, 2056, 4258, 27700, 32718]


@pytest.mark.parametrize("version", ["WKT1_GDAL", "WKT2_2015", "WKT2_2019"])
@pytest.mark.parametrize("code", EPSG_CODES)
def test_epsg_kind_and_name_from_wkt_match_pyproj(code, version):
    crs = pyproj.CRS.from_epsg(code)
    for text in (crs.to_wkt(version), crs.to_wkt(version, pretty=True)):
        got = georef.crs_of_wkt(text)
        assert got.epsg == crs.to_epsg(min_confidence=100)
        assert got.kind == (CrsKind.PROJECTED if crs.is_projected else CrsKind.GEOGRAPHIC)
        assert got.name == crs.name


def test_wkt_without_an_authority_or_of_another_kind():
    esri = georef.crs_of_wkt(pyproj.CRS.from_epsg(32633).to_wkt("WKT1_ESRI"))
    assert esri.epsg is None and esri.kind is CrsKind.PROJECTED
    geocentric = georef.crs_of_wkt(pyproj.CRS.from_epsg(4978).to_wkt("WKT2_2019"))
    assert geocentric.kind is None and geocentric.epsg == 4978
    bound = pyproj.CRS.from_proj4("+proj=utm +zone=33 +ellps=intl +towgs84=-87,-98,-121 +units=m")
    assert bound.to_wkt("WKT2_2019").startswith("BOUNDCRS")
    assert georef.crs_of_wkt(bound.to_wkt("WKT2_2019")).kind is CrsKind.PROJECTED
    for junk in ("", "PROJCS[", 'PROJCS["a"]]', "not wkt", 'GEOGCS["a",AUTHORITY["EPSG","x1"]]', "[" * 100):
        assert georef.crs_of_wkt(junk).epsg is None


# --- stores rioxarray and xarray write --------------------------------------------------------


def georeference(root, path):
    """What zarrfs makes of the array at PATH (coordinates read by zarr-python): (GeoReference, why)."""
    _, hierarchy, meta = open_node(str(root), path)
    p = georef.plan(meta, hierarchy.children_sync(""))
    if p is None:
        return None, None
    group = zarr.open_group(root, mode="r")
    ys = group[p.y.path][...] if p.y is not None else None
    xs = group[p.x.path][...] if p.x is not None else None
    return p.resolve(ys, xs) if (ys is not None or p.geotransform is not None) else (None, p.why)


def rio_oracle(root, name):
    """(GDAL geotransform, EPSG code) rioxarray reads from the same store."""
    da = xr.open_zarr(root, consolidated=False, decode_coords="all")[name]
    da = da.rio.set_spatial_dims(x_dim=da.dims[-1], y_dim=da.dims[-2])
    return da.rio.transform(recalc=True).to_gdal(), da.rio.crs.to_epsg() if da.rio.crs else None


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_utm_bands_from_rioxarray(tmp_path, zarr_format):
    root = utm_store(tmp_path, zarr_format)
    geo, why = georeference(root, "band_data")
    gt, epsg = rio_oracle(root, "band_data")
    assert why is None
    assert geo.geotransform == pytest.approx(gt) and geo.north_up
    assert geo.crs.epsg == epsg == 32633 and geo.crs.kind is CrsKind.PROJECTED
    assert geo.nodata == xr.open_zarr(root, consolidated=False).band_data.encoding["_FillValue"] == -9999


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_latitude_longitude_north_and_south_up(tmp_path, zarr_format):
    root = latlon_store(tmp_path, zarr_format)
    north, _ = georeference(root, "north")
    gt, epsg = rio_oracle(root, "north")
    assert north.geotransform == pytest.approx(gt) and north.north_up
    assert north.crs.epsg == epsg == 4326 and north.crs.kind is CrsKind.GEOGRAPHIC
    assert math.isnan(north.nodata)  # xarray's _FillValue of floats
    south, _ = georeference(root, "south")
    gt, _ = rio_oracle(root, "south")
    assert south.geotransform == pytest.approx(gt) and south.geotransform[5] > 0 and not south.north_up
    assert south.crs.epsg == rio_oracle(root, "south")[1] == 4326  # its `coordinates` name spatial_ref
    assert south.nodata == -1  # missing_value, there being no _FillValue
    swapped, why = georeference(root, "swapped")
    assert swapped is None and "transposed" in why


def test_latitude_longitude_without_a_crs_are_taken_as_wgs84(tmp_path):
    ds = xr.Dataset(
        {"t": (("latitude", "longitude"), np.zeros((3, 4), "f4"))},
        coords={"latitude": [10.0, 9.0, 8.0], "longitude": [1.0, 1.5, 2.0, 2.5]},
    )
    ds.to_zarr(tmp_path / "bare.zarr", zarr_format=3, consolidated=False)
    geo, why = georeference(tmp_path / "bare.zarr", "t")
    assert why is None and geo.geotransform == (0.75, 0.5, 0, 10.5, 0, -1)
    assert geo.crs.epsg == pyproj.CRS.from_wkt(geo.crs.wkt).to_epsg() == 4326


def test_what_is_no_map_is_not_placed(tmp_path):
    ds = xr.Dataset(
        {
            "profile": (("time", "depth"), np.zeros((4, 5))),
            "wavy": (("y", "x"), np.zeros((4, 5)), {"grid_mapping": "crs"}),
            "lost": (("y2", "x"), np.zeros((4, 5)), {"grid_mapping": "nowhere"}),
            "crs": ((), 0, {"crs_wkt": pyproj.CRS.from_epsg(32633).to_wkt()}),
        },
        coords={
            "time": np.arange(4),
            "depth": np.arange(5.0),
            "y": [0.0, 1.0, 3.0, 4.0],
            "x": np.arange(5.0),
            "y2": np.arange(4.0),
        },
    )
    ds.to_zarr(tmp_path / "s.zarr", zarr_format=3, consolidated=False)
    assert georeference(tmp_path / "s.zarr", "profile") == (None, None)
    geo, why = georeference(tmp_path / "s.zarr", "wavy")
    assert geo is None and "not evenly spaced" in why
    geo, why = georeference(tmp_path / "s.zarr", "lost")  # placed, with no CRS
    assert geo.crs is None and geo.geotransform == (-0.5, 1, 0, -0.5, 0, 1) and "'nowhere' is no array" in why


def test_a_geotransform_attribute_places_a_raster_without_coordinates(tmp_path):
    g = zarr.open_group(tmp_path / "r.zarr", mode="w", zarr_format=2)
    g.create_array("a", shape=(4, 5), dtype="u1", attributes={"grid_mapping": "crs"})
    wkt = pyproj.CRS.from_epsg(3857).to_wkt()
    g.create_array(
        "crs", shape=(), dtype="i4", attributes={"spatial_ref": wkt, "GeoTransform": "100 2 0.5 900 0.25 -2"}
    )
    geo, why = georeference(tmp_path / "r.zarr", "a")
    assert why is None and geo.geotransform == (100, 2, 0.5, 900, 0.25, -2) and geo.rotated
    assert geo.crs.epsg == 3857
    assert geo.nodata == 0  # v2's fill_value, as xarray reads it


# --- GeoTIFF tags -----------------------------------------------------------------------------


def geotiff(geo: GeoReference, shape=(2, 6, 8)):
    arr = np.arange(math.prod(shape), dtype="<f4").reshape(shape)
    data = tiff.header(arr.dtype, arr.shape, "", tiff.geo_tags(geo)) + arr.tobytes()
    with tifffile.TiffFile(io.BytesIO(data)) as tf:
        np.testing.assert_array_equal(tf.asarray(), arr)
        return [p.tags for p in tf.pages], tf.geotiff_metadata


def test_north_up_tags_read_back_by_tifffile():
    crs = georef.crs_of_wkt(pyproj.CRS.from_epsg(32633).to_wkt())
    pages, meta = geotiff(GeoReference((500000.0, 10.0, 0.0, 5000000.0, 0.0, -10.0), crs, -9999.0))
    assert meta["ModelPixelScale"] == [10.0, 10.0, 0.0]
    assert meta["ModelTiepoint"] == [0.0, 0.0, 0.0, 500000.0, 5000000.0, 0.0]
    assert int(meta["ProjectedCSTypeGeoKey"]) == 32633 and int(meta["GTModelTypeGeoKey"]) == 1
    assert int(meta["GTRasterTypeGeoKey"]) == 1  # PixelIsArea
    assert meta["GTCitationGeoKey"] == "WGS 84 / UTM zone 33N"
    for tags in pages:  # every page is placed
        assert float(tags[tiff.GDAL_NODATA].value) == -9999 and tiff.GEO_KEY_DIRECTORY in tags


def test_south_up_and_rotated_rasters_get_a_transformation_matrix():
    crs = georef.crs_of_wkt(pyproj.CRS.from_epsg(4326).to_wkt())
    for gt in ((4.5, 1.0, 0.0, 49.5, 0.0, 1.0), (100.0, 2.0, 0.5, 900.0, 0.25, -2.0)):
        _, meta = geotiff(GeoReference(gt, crs, math.nan))
        assert "ModelPixelScale" not in meta and "ModelTiepoint" not in meta
        m = np.asarray(meta["ModelTransformation"]).reshape(4, 4)
        col, row = 3, 5  # a pixel corner maps as GDAL's geotransform says
        assert m @ [col, row, 0, 1] == pytest.approx(
            [gt[0] + col * gt[1] + row * gt[2], gt[3] + col * gt[4] + row * gt[5], 0, 1]
        )
        assert int(meta["GeographicTypeGeoKey"]) == 4326 and int(meta["GTModelTypeGeoKey"]) == 2


def test_a_crs_without_an_epsg_code_gets_no_geokeys_of_a_crs():
    crs = Crs('LOCAL_CS["x"]')
    _, meta = geotiff(GeoReference((0.0, 1.0, 0.0, 0.0, 0.0, -1.0), crs, None), shape=(4, 4))
    assert "ProjectedCSTypeGeoKey" not in meta and "GeographicTypeGeoKey" not in meta
    assert int(meta["GTRasterTypeGeoKey"]) == 1


def test_geotiff_tags_go_on_every_page_while_the_header_allows():
    """header_fits decides whether an array has a TIFF view before its georeference is known: an
    array with as many pages as it allows still gets its TIFF, the tags on its first page alone.
    (Pages of 1 GiB, in 1024 strips: few pages fill the header.)"""
    crs = Crs("x", CrsKind.PROJECTED, 32633, "n" * 1000)
    geo = GeoReference((1e300, -1e-300, 1.5, -1e300, 2.5, 1e-300), crs, -1.2345678901234567e-300)
    dtype, page = np.dtype("<f4"), (65536, 4096)
    lo, hi = 1, 1 << 20  # the most pages header_fits accepts
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if tiff.header_fits(dtype, (mid, *page)) else (lo, mid - 1)
    for pages, every in ((lo, False), (lo // 10, True)):
        head = tiff.header(dtype, (pages, *page), "", tiff.geo_tags(geo))
        with tifffile.TiffFile(io.BytesIO(head)) as tf:  # (its pixels left out: tags alone are read)
            tagged = [tiff.GEO_KEY_DIRECTORY in tf.pages[i].tags for i in (0, 1, pages - 1)]
            assert tf.pages[0].geotiff_tags["ProjectedCSTypeGeoKey"] == 32633
        assert tagged == [True, every, every]


# --- GDAL's statistics rewrites -----------------------------------------------------------------


def test_a_gdal_style_rewrite_of_a_georeferenced_vrt_keeps_its_statistics(tmp_path):
    """GDAL writes the VRT back with the SRS as WKT 1 of its own and its axis mapping, the
    GeoTransform and NoData in its own number formats, and the statistics: only they are new.
    Another CRS, origin or NoData value is a change (refused)."""
    from zarrfs.views import images

    root = utm_store(tmp_path, 3)
    geo, _ = georeference(root, "band_data")
    _, _, meta = open_node(str(root), "band_data")
    ours = images.vrt(meta, "band_data.npy", geo=geo).decode()
    srs_text = ours[ours.index("<SRS>") : ours.index("</SRS>") + 6]

    def rewrite(epsg=32633, x0="5.0000000000000000e+05", nodata="-9.99900000000000E+03"):
        wkt = pyproj.CRS.from_epsg(epsg).to_wkt("WKT1_GDAL").replace('"', "&quot;")
        text = ours.replace(srs_text, f'<SRS dataAxisToSRSAxisMapping="1,2">{wkt}</SRS>')
        text = text.replace("5.0000000000000000e+05", x0).replace(">-9999<", f">{nodata}<")
        stats = '<Metadata><MDI key="STATISTICS_MEAN">1.5</MDI></Metadata>'
        return text.replace('subClass="VRTRawRasterBand">', 'subClass="VRTRawRasterBand">' + stats).encode()

    assert images.vrt_statistics(rewrite(), meta, "band_data.npy", geo) == [{"STATISTICS_MEAN": "1.5"}] * 3
    assert images.vrt_statistics(rewrite(x0="500000.0"), meta, "band_data.npy", geo) is not None
    assert images.vrt_statistics(rewrite(epsg=32634), meta, "band_data.npy", geo) is None
    assert images.vrt_statistics(rewrite(x0="5.0000000000000010e+05"), meta, "band_data.npy", geo) is None
    assert images.vrt_statistics(rewrite(nodata="0"), meta, "band_data.npy", geo) is None
