"""Georeferenced rasters as rioxarray and xarray users write them to Zarr (v2 or v3), for the image views' tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np

# The UTM raster: 3 bands of 6 x 8 pixels of 10 m, its outer corner at (500000, 5000000).
UTM_ORIGIN = (500000.0, 5000000.0)
UTM_PIXEL_M = 10.0
UTM_NODATA = -9999.0


def utm_store(base: Path, zarr_format: int) -> Path:
    """A 3-band float32 GeoTIFF (EPSG:32633, NoData -9999) written by rasterio, opened by
    rioxarray and written to Zarr as `band_data` (band, y, x), beside `spatial_ref`, `x`, `y`."""
    import rasterio
    import rioxarray
    from rasterio.transform import from_origin

    data = np.arange(3 * 6 * 8, dtype="f4").reshape(3, 6, 8) * 1.5
    data[0, 0, :3] = UTM_NODATA
    tif = base / f"utm{zarr_format}.tif"
    with rasterio.open(
        tif, "w", driver="GTiff", width=8, height=6, count=3, dtype="float32", crs="EPSG:32633",
        transform=from_origin(*UTM_ORIGIN, UTM_PIXEL_M, UTM_PIXEL_M), nodata=UTM_NODATA,
    ) as f:  # fmt: skip
        f.write(data)
    root = base / f"utm{zarr_format}.zarr"
    with rioxarray.open_rasterio(tif) as da:
        da.to_dataset(name="band_data").to_zarr(root, zarr_format=zarr_format, consolidated=False)
    return root


def latlon_store(base: Path, zarr_format: int) -> Path:
    """Lat/lon rasters as xarray users write them: `north` (latitude descending) with EPSG:4326
    written by rioxarray (a grid_mapping), `south` (latitude ascending, int16 with a
    missing_value) whose CRS xarray names among its `coordinates` only, `swapped` (lon, lat:
    transposed)."""
    import rioxarray  # noqa: F401  (the .rio accessor)
    import xarray as xr

    lat, lon = np.linspace(60, 50, 11), np.linspace(5, 25, 21)
    rng = np.random.default_rng(1)
    ds = xr.Dataset(
        {"north": (("lat", "lon"), rng.random((11, 21)))},
        coords={
            "lat": ("lat", lat, {"units": "degrees_north", "standard_name": "latitude"}),
            "lon": ("lon", lon, {"units": "degrees_east", "standard_name": "longitude"}),
        },
    ).rio.write_crs("EPSG:4326")
    ds["south"] = (("lats", "lon"), rng.integers(0, 99, (11, 21)).astype("i2"), {"missing_value": -1})
    ds["swapped"] = (("lon", "lat"), rng.random((21, 11)).astype("f4"))
    ds = ds.assign_coords(lats=("lats", lat[::-1], {"standard_name": "latitude", "units": "degrees_north"}))
    root = base / f"ll{zarr_format}.zarr"
    ds.to_zarr(root, zarr_format=zarr_format, consolidated=False)
    return root
