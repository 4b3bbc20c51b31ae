"""Mounted tests of `.zarrfs/netcdf/PATH.nc`: groups as netCDF classic files.

Oracles: xarray's `open_zarr` of the same store against xarray / netCDF4-python /
scipy reading the mounted file; ncdump (netcdf-bin) printing its header.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from support import mounting

NETCDF = Path(".zarrfs") / "netcdf"


def classic_dataset():
    import xarray as xr

    rng = np.random.default_rng(11)
    temp = rng.standard_normal((4, 6, 8)).astype(">f4")  # a big-endian source
    temp[1] = np.nan  # with the fill value NaN: chunks not stored
    ds = xr.Dataset(
        {
            "temp": (("t", "lat", "lon"), temp, {"units": "K", "long_name": "air temperature", "valid": [1, 2]}),
            "pr": (("lat", "lon"), rng.integers(-99, 99, (6, 8)).astype("i2"), {"scale_factor": 0.5}),
            "p0": ((), 1013.25, {"units": "hPa"}),
        },
        coords={
            "lat": ("lat", np.linspace(-50, 50, 6)),
            "lon": ("lon", np.arange(8, dtype="f4")),
            "t": ("t", np.arange(4, dtype="i4")),
        },
        attrs={"title": "classic", "history": "made by a test", "n": 3},
    )
    return ds


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    import xarray as xr

    root = tmp_path_factory.mktemp("nc-stores")
    ds = classic_dataset()
    ds.to_zarr(
        root / "classic.zarr",
        zarr_format=2,
        consolidated=False,
        encoding={"temp": {"chunks": (1, 3, 4)}, "pr": {"chunks": (3, 8)}},
    )
    timed = xr.Dataset(
        {
            "v": (("time", "x"), np.arange(12, dtype="u2").reshape(3, 4)),
            "big": (("x",), np.array([2**40, -1, 0, 5], dtype="i8")),
        },
        coords={"time": np.array(["2000-01-01", "2000-01-02", "2000-01-05"], "datetime64[ns]")},
    )
    timed.to_zarr(root / "timed.zarr", zarr_format=3, consolidated=False)
    return root


def assert_same_dataset(got, want) -> None:
    import xarray as xr

    xr.testing.assert_identical(got.load(), want.load())


def test_xarray_v2_store_as_cdf2_read_by_scipy_and_netcdf4(mount, stores):
    import xarray as xr

    mnt = mount(stores / "classic.zarr")
    p = mnt / NETCDF / "classic.nc"
    data = p.read_bytes()
    assert data[:4] == b"CDF\x02" and p.stat().st_size == len(data)
    want = xr.open_zarr(stores / "classic.zarr", consolidated=False)
    for engine in ("scipy", "netcdf4"):
        with xr.open_dataset(p, engine=engine) as got:
            assert_same_dataset(got, want)
    with xr.open_dataset(p, engine="netcdf4", decode_cf=False) as raw:
        raw_want = xr.open_zarr(stores / "classic.zarr", consolidated=False, decode_cf=False)
        np.testing.assert_array_equal(raw["temp"].values, raw_want["temp"].values)
        assert raw["temp"].attrs["_FillValue"] != raw["temp"].attrs["_FillValue"]  # NaN


def test_reading_a_slab_loads_only_its_chunks(mount, tmp_path):
    import netCDF4
    import xarray as xr

    big = np.random.default_rng(2).standard_normal((6, 256, 512)).astype("f4")  # 512 KiB chunks
    xr.Dataset({"a": (("x",), np.arange(3.0)), "z": (("t", "y", "x2"), big)}).to_zarr(
        tmp_path / "big.zarr", zarr_format=2, consolidated=False, encoding={"z": {"chunks": (1, 256, 512)}}
    )
    mnt = mount(tmp_path / "big.zarr")
    p = mnt / NETCDF / "big.nc"
    with netCDF4.Dataset(p) as f:
        assert list(f.variables) == ["a", "z"]  # z last: its last time step ends the file
        np.testing.assert_array_equal(f["z"][-1], big[-1])
    mnt2 = mount(tmp_path / "big.zarr")  # nothing cached; the kernel's read-ahead off (FADV_RANDOM)
    p = mnt2 / NETCDF / "big.nc"
    slab_bytes = big[-1].nbytes
    fd = os.open(p, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        before = json.loads((mnt2 / ".zarrfs" / "stats.json").read_bytes())
        got = os.pread(fd, slab_bytes, p.stat().st_size - slab_bytes)
        after = json.loads((mnt2 / ".zarrfs" / "stats.json").read_bytes())
    finally:
        os.close(fd)
    assert got == big[-1].astype(">f4").tobytes()
    assert after["chunk_gets"] - before["chunk_gets"] == 1, (before, after)  # chunk (5, 0, 0) only


def test_v3_store_with_dimension_names_and_64_bit_types_is_cdf5(mount, stores):
    import netCDF4
    import xarray as xr

    mnt = mount(stores / "timed.zarr")
    p = mnt / NETCDF / "timed.nc"
    assert p.read_bytes()[:4] == b"CDF\x05"
    with netCDF4.Dataset(p) as f:
        assert f.data_model == "NETCDF3_64BIT_DATA"
        assert f["v"].dimensions == ("time", "x")
    want = xr.open_zarr(stores / "timed.zarr", consolidated=False, decode_cf=False)
    with xr.open_dataset(p, engine="netcdf4", decode_cf=False) as got:
        for name in want.variables:
            np.testing.assert_array_equal(got[name].values, want[name].values)
            for k, v in want[name].attrs.items():
                if k != "_FillValue":
                    assert got[name].attrs[k] == v, (name, k)


def test_groups_listing_left_out_and_ncdump(mount, tmp_path):
    import zarr

    root = tmp_path / "h.zarr"
    g = zarr.open_group(root, mode="w", zarr_format=2)
    g.create_array("c", shape=(3,), dtype="c16", fill_value=0)
    sub = g.create_group("sub")
    sub.create_array("a", shape=(2, 3), chunks=(1, 3), dtype="f8", fill_value=1.5)
    mnt = mount(root)
    assert sorted(p.name for p in (mnt / NETCDF).iterdir()) == ["h.nc", "sub", "sub.nc"]
    ncdump = shutil.which("ncdump")
    assert ncdump, "ncdump missing: scripts/test.sh installs apt netcdf-bin"
    out = subprocess.run([ncdump, "-h", str(mnt / NETCDF / "h.nc")], capture_output=True, text=True, check=True).stdout
    assert "zarrfs_left_out" in out and "c: data type complex128" in out and "sub: a child group" in out
    out = subprocess.run([ncdump, str(mnt / NETCDF / "sub.nc")], capture_output=True, text=True, check=True).stdout
    assert (
        "double a(a_dim0, a_dim1)" in out and "a:_FillValue = 1.5" in out and "_, _, _" in out
    )  # unwritten chunks: the fill value
    assert any("left out" in line for line in mounting.log_lines_naming(mount.log_text(mnt), "netcdf/"))


# --- xarray's conventions: fill values per format, netCDF3's coercions (CDF-2) -----------


def cf_dataset():
    """A dataset as xarray users write them: daily time (int64 days since, first value 0),
    lat/lon, a float32 variable with CF attributes and NaN rows, unsigned variables (one
    with a fill value and values over the signed range), a small int64 variable."""
    import pandas as pd
    import xarray as xr

    rng = np.random.default_rng(5)
    t2m = (280 + rng.standard_normal((5, 3, 4))).astype("f4")
    t2m[1] = t2m[3, 2] = np.nan
    flag = rng.integers(0, 2**16 - 1, (5, 3, 4)).astype("u2")
    flag[0, 0, 0] = 65535
    return xr.Dataset(
        {
            "t2m": (
                ("time", "lat", "lon"),
                t2m,
                {
                    "units": "K",
                    "standard_name": "air_temperature",
                    "long_name": "2 m temperature",
                    "cell_methods": "time: mean",
                },
            ),
            "count": (("time", "lat", "lon"), rng.integers(0, 256, (5, 3, 4)).astype("u1"), {"long_name": "count"}),
            "flag": (("time", "lat", "lon"), flag),
            "station": (("lat",), np.array([10, -7, 2**31 - 1], "i8")),
        },
        coords={
            "time": pd.date_range("2000-01-01", periods=5, freq="D"),
            "lat": ("lat", np.array([-30.0, 0.0, 30.0]), {"units": "degrees_north"}),
            "lon": ("lon", np.arange(0, 360, 90, dtype="f4"), {"units": "degrees_east"}),
        },
        attrs={"title": "cf", "Conventions": "CF-1.8"},
    )


def wide_dataset():
    """int64 values past int32: a variable netCDF3 cannot hold (CDF-5), beside a time coordinate."""
    import pandas as pd
    import xarray as xr

    return xr.Dataset(
        {"ticks": (("time",), np.array([0, 2**40, -(2**35)], "i8"), {"units": "ns"})},
        coords={"time": pd.date_range("2001-01-01", periods=3, freq="D")},
    )


@pytest.fixture(scope="module")
def cf_mounts(module_mount, tmp_path_factory):
    """{"v2": (store, mountpoint), "v3": ...}: group `cf` in each (and `wide` in v3), one mount per store."""
    root = tmp_path_factory.mktemp("nc-cf")
    out = {}
    for fmt in (2, 3):
        store = root / f"cf{fmt}.zarr"
        cf_dataset().to_zarr(
            store,
            group="cf",
            zarr_format=fmt,
            consolidated=False,
            encoding={"flag": {"_FillValue": 65535}, "t2m": {"chunks": (2, 3, 4)}},
        )
        if fmt == 3:
            wide_dataset().to_zarr(store, group="wide", zarr_format=fmt, consolidated=False, mode="a")
        out[f"v{fmt}"] = (store, module_mount(store))
    return out


@pytest.mark.parametrize("fmt", ["v2", "v3"])
def test_xarray_dataset_is_cdf2_read_alike_by_scipy_and_netcdf4(cf_mounts, fmt):
    import xarray as xr

    store, mnt = cf_mounts[fmt]
    p = mnt / NETCDF / "cf.nc"
    assert p.read_bytes()[:4] == b"CDF\x02"
    want = xr.open_zarr(store, group="cf", consolidated=False).load()
    assert want["time"].values[0] == np.datetime64("2000-01-01")
    for engine in ("scipy", "netcdf4"):
        with xr.open_dataset(p, engine=engine) as got:
            got.load()
            # values (NaN rows and the masked flag alike), decoded times, attributes
            xr.testing.assert_identical(got, want)
            assert got["time"].values[0] == np.datetime64("2000-01-01")
            assert np.isnan(got["flag"].values[0, 0, 0]) and not np.isnan(got["flag"].values).all()
            # dtypes too (assert_identical does not compare them), but for the int64 variable
            # stored as int, which a netCDF3 file gives back as int32, as xarray's own writer
            # makes it
            for name in want.variables:
                expected = np.dtype("i4") if name == "station" else want[name].dtype
                assert got[name].dtype == expected, (engine, name, got[name].dtype)
            assert got["flag"].encoding["_FillValue"] == -1 and got["count"].encoding["_Unsigned"] == "true"


@pytest.mark.parametrize("fmt", ["v2", "v3"])
def test_file_ncdump_and_netcdf4_see_cdf2_with_xarray_fill_values(cf_mounts, fmt):
    import netCDF4

    _, mnt = cf_mounts[fmt]
    p = mnt / NETCDF / "cf.nc"
    magic = subprocess.run(["file", "-b", str(p)], capture_output=True, text=True, check=True).stdout
    assert magic.startswith("NetCDF Data Format data") and "64-bit offset" in magic, magic
    header = subprocess.run(["ncdump", "-h", str(p)], capture_output=True, text=True, check=True).stdout
    assert "int time(time)" in header and "time:_FillValue" not in header
    assert "short flag(time, lat, lon)" in header and "flag:_FillValue = -1s" in header
    assert 'flag:_Unsigned = "true"' in header and 'count:_Unsigned = "true"' in header
    assert "t2m:_FillValue = NaNf" in header and "int station(lat)" in header
    with netCDF4.Dataset(p) as f:  # its own masking and _Unsigned decoding
        time = f["time"][:]
        assert not np.ma.is_masked(time) and list(time) == [0, 1, 2, 3, 4]
        flag = f["flag"][:]
        assert flag.dtype == np.dtype("u2") and flag.mask[0, 0, 0] and flag.mask.sum() == 1


def test_int64_past_int32_stays_cdf5_beside_an_unmasked_time(cf_mounts):
    import netCDF4
    import xarray as xr

    store, mnt = cf_mounts["v3"]
    p = mnt / NETCDF / "wide.nc"
    assert p.read_bytes()[:4] == b"CDF\x05"
    with netCDF4.Dataset(p) as f:
        assert f.data_model == "NETCDF3_64BIT_DATA"
        assert f["ticks"].dtype == np.dtype("i8") and list(f["ticks"][:]) == [0, 2**40, -(2**35)]
        assert not np.ma.is_masked(f["time"][:])
    want = xr.open_zarr(store, group="wide", consolidated=False).load()
    with xr.open_dataset(p, engine="netcdf4") as got:
        xr.testing.assert_identical(got.load(), want)
        assert got["ticks"].dtype == np.dtype("i8")


def test_a_value_written_past_int32_after_layout_reads_as_eio_never_wrapped(mount, tmp_path):
    import xarray as xr

    store = tmp_path / "w.zarr"
    xr.Dataset({"n": (("x",), np.array([1, 2, 3], "i8"))}).to_zarr(store, zarr_format=2, consolidated=False)
    mnt = mount(store, "writable")
    fd = os.open(mnt / NETCDF / "w.nc", os.O_RDONLY)  # laid out now: n stored as int
    try:
        with open(mnt / "n.npy", "r+b") as f:
            f.seek(-3 * 8, os.SEEK_END)  # the first of its 3 elements, after the NPY header
            f.write(np.array([2**40], "<i8").tobytes())
        assert np.load(mnt / "n.npy")[0] == 2**40
        with pytest.raises(OSError) as e:
            os.pread(fd, 12, 4096)  # n's data: the first variable's, on the first page after the header
        assert e.value.errno == errno.EIO
    finally:
        os.close(fd)
    assert mounting.log_lines_naming(mount.log_text(mnt), "no longer fit")
