"""Mounted writes as everyday tools make them: `cp` into a dataset xarray wrote, plain files
that must not vanish, and `rsync -a` / `cp -p` keeping the times they set.

Oracles: xarray and zarr-python reading the store directly, the store's files on disk, rsync's
own statistics. zarrfs is reached only through its command line and the file system.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import warnings
from pathlib import Path

import numpy as np
import pytest

import mounted

FORMATS = pytest.mark.parametrize("fmt", [2, 3], ids=["v2", "v3"])


def open_dataset(root: Path, fmt: int):
    import xarray as xr

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return xr.open_zarr(root, zarr_format=fmt, consolidated=None).load()


def write_dataset(root: Path, fmt: int) -> None:
    import xarray as xr

    ds = xr.Dataset({"t": (("time", "y", "x"), np.arange(60, dtype="f4").reshape(3, 4, 5))},
                    coords={"x": np.arange(5), "y": np.arange(4.0), "time": np.arange(3)})
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
