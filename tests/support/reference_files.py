"""A netCDF4 file written by netCDF4, and kerchunk's references of it (JSON and Parquet), for the reference tests.

The file holds what references meet in practice: a chunked zlib+shuffle variable, a contiguous
one, a small one whose only chunk kerchunk inlines, and attributes. Its values as netCDF4 reads
them (masks and scales off) are the tests' oracle.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

# Chunks of at most this many bytes are inlined into the references (the small variable's one).
INLINE_THRESHOLD = 100
VARIABLES = ("chunked", "contig", "small")
# Parquet references of this many chunks a file: the chunked variable spans several files.
RECORD_SIZE = 4


def write_netcdf(path: Path, seed: int = 11) -> dict[str, np.ndarray]:
    """Write the netCDF4 file; return its variables as netCDF4 reads them back."""
    import netCDF4

    rng = np.random.default_rng(seed)
    with netCDF4.Dataset(path, "w") as ds:
        ds.createDimension("y", 40)
        ds.createDimension("x", 30)
        ds.createDimension("n", 3)
        ds.title = "reference test"
        chunked = ds.createVariable("chunked", "f4", ("y", "x"), zlib=True, shuffle=True, chunksizes=(16, 16))
        chunked.units = "K"
        chunked[:] = rng.normal(280, 10, size=(40, 30)).astype("f4")
        contig = ds.createVariable("contig", "i2", ("y", "x"), contiguous=True)
        contig[:] = rng.integers(-3000, 3000, size=(40, 30), dtype="i2")
        small = ds.createVariable("small", "f8", ("n",))
        small[:] = [1.5, -2.25, 1e10]
    return read_netcdf(path)


def read_netcdf(path: Path) -> dict[str, np.ndarray]:
    import netCDF4

    with netCDF4.Dataset(path) as ds:
        ds.set_auto_maskandscale(False)
        return {name: np.asarray(ds[name][:]) for name in VARIABLES}


def kerchunk_refs(path: Path, url: str | None = None) -> dict:
    """kerchunk's references of the file at PATH, naming it by URL (its absolute path by default)."""
    from kerchunk.hdf import SingleHdf5ToZarr

    refs = SingleHdf5ToZarr(str(path), inline_threshold=INLINE_THRESHOLD).translate()
    if url is not None:
        refs["refs"] = {k: [url, *v[1:]] if isinstance(v, list) else v for k, v in refs["refs"].items()}
    return refs


def write_json(refs: dict, path: Path) -> Path:
    path.write_text(json.dumps(refs))
    return path


def write_parquet(refs: dict, url: str, **storage_options) -> str:
    """kerchunk's Parquet references (a directory of .zmetadata and parquet files) at URL."""
    import warnings

    from kerchunk.df import refs_to_dataframe

    with warnings.catch_warnings():  # pandas deprecates the fastparquet engine kerchunk writes with
        warnings.simplefilter("ignore", FutureWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        refs_to_dataframe(refs, url, record_size=RECORD_SIZE, storage_options=storage_options or None)
    return url


def zarr_arrays(doc: dict, names) -> dict[str, np.ndarray]:
    """The arrays NAMES of a reference set as zarr-python reads them through fsspec's ReferenceFileSystem
    (jinja2 templates, so `gen` entries count; local targets only)."""
    import fsspec
    import zarr
    from fsspec.implementations.asyn_wrapper import AsyncFileSystemWrapper
    from fsspec.implementations.reference import ReferenceFileSystem

    local = AsyncFileSystemWrapper(fsspec.filesystem("file"), asynchronous=True)
    fs = ReferenceFileSystem(doc, simple_templates=False, fs={None: local, "file": local}, asynchronous=True)
    group = zarr.open_group(zarr.storage.FsspecStore(fs, read_only=True, path=""), mode="r", zarr_format=2)
    return {name: group[name][...] for name in names}
