"""Icechunk repositories whose chunks are virtual: references into a netCDF4 file, as VirtualiZarr writes them."""

from __future__ import annotations

import errno
import json

import netCDF4
import numpy as np
import pytest

from support import mounting, oracles
from support.s3 import BUCKET, CREDENTIALS

icechunk = pytest.importorskip("icechunk")
zarr = pytest.importorskip("zarr")
SingleHdf5ToZarr = pytest.importorskip("kerchunk.hdf").SingleHdf5ToZarr
zarr_numcodecs = pytest.importorskip("zarr.codecs.numcodecs")

icechunk.set_logs_filter("error")  # local storage warns that it is not for concurrent commits

VARIABLES = ("plain", "packed", "whole")


def write_netcdf(path) -> dict[str, np.ndarray]:
    """A netCDF4 file with a chunked uncompressed variable, a shuffled zlib one and a contiguous
    one; returns what netCDF4 reads back (no masking or scaling)."""
    rng = np.random.default_rng(22)
    with netCDF4.Dataset(path, "w") as ds:
        ds.createDimension("y", 20)
        ds.createDimension("x", 30)
        ds.createVariable("plain", "<f4", ("y", "x"), chunksizes=(8, 16))[:] = rng.random((20, 30))
        ds.createVariable("packed", "<i2", ("y", "x"), zlib=True, complevel=4, shuffle=True, chunksizes=(10, 10))[:] = (
            rng.integers(-3000, 3000, (20, 30))
        )
        ds.createVariable("whole", "<f8", ("y", "x"), contiguous=True)[:] = rng.random((20, 30))
    with netCDF4.Dataset(path) as ds:
        ds.set_auto_maskandscale(False)
        return {name: ds[name][...] for name in VARIABLES}


def _codecs(zarray: dict) -> list:
    """The v3 bytes-to-bytes codecs of a kerchunk .zarray's filters and compressor."""
    steps = list(zarray.get("filters") or []) + ([zarray["compressor"]] if zarray.get("compressor") else [])
    classes = {"zlib": zarr_numcodecs.Zlib, "shuffle": zarr_numcodecs.Shuffle}
    return [classes[step.pop("id")](**step) for step in (dict(s) for s in steps)]


def add_virtual_arrays(store, nc_path: str, location: str) -> None:
    """Arrays in STORE whose chunks are references to NC_PATH's chunks (offsets from kerchunk),
    at LOCATION (the URL the repository's container prefixes)."""
    refs = SingleHdf5ToZarr(nc_path, inline_threshold=0).translate()["refs"]
    root = zarr.open_group(store, mode="w", zarr_format=3)
    for name in VARIABLES:
        meta = json.loads(refs[f"{name}/.zarray"])
        root.create_array(
            name,
            shape=meta["shape"],
            chunks=meta["chunks"],
            dtype=meta["dtype"],
            compressors=_codecs(meta) or None,
            filters=None,
            fill_value=0,
        )
    for key, ref in refs.items():
        if isinstance(ref, list) and len(ref) == 3:
            name, index = key.split("/")
            store.set_virtual_ref(f"{name}/c/{index.replace('.', '/')}", location, offset=ref[1], length=ref[2])


@pytest.fixture(scope="module")
def local_repo(tmp_path_factory):
    """A local repository of virtual arrays into a netCDF4 file beside it: (path, container, values)."""
    base = tmp_path_factory.mktemp("icechunk-virtual")
    (base / "nc").mkdir()
    values = write_netcdf(base / "nc" / "f.nc")
    container = f"file://{base / 'nc'}/"
    config = icechunk.RepositoryConfig.default()
    config.set_virtual_chunk_container(
        icechunk.VirtualChunkContainer(container, icechunk.local_filesystem_store(str(base / "nc")))
    )
    repo = icechunk.Repository.create(icechunk.local_filesystem_storage(str(base / "repo")), config=config)
    session = repo.writable_session("main")
    add_virtual_arrays(session.store, str(base / "nc" / "f.nc"), container + "f.nc")
    session.commit("virtual arrays")
    return base / "repo", container, values


def test_virtual_chunks_into_a_local_netcdf_file(local_repo, mount):
    path, container, values = local_repo
    mnt = mount(path, f"authorize_virtual_chunk_access={container}")
    assert sorted(p.name for p in mnt.iterdir()) == [f"{n}.npy" for n in sorted(VARIABLES)]
    for name in VARIABLES:
        assert (mnt / f"{name}.npy").read_bytes() == oracles.npy_bytes(values[name]), name
    # Chunks read in part (a slice) and through a view come from the same references.
    got = (mnt / ".zarrfs" / "slice" / "packed[3:17,5:25].npy").read_bytes()
    assert got == oracles.npy_bytes(values["packed"][3:17, 5:25])


def test_an_unauthorised_container_is_eio_and_one_line(local_repo, mount):
    path, container, values = local_repo
    mount.expect_errors()
    mnt = mount(path)
    for name in VARIABLES:
        with pytest.raises(OSError) as e:
            (mnt / f"{name}.npy").read_bytes()
        assert e.value.errno == errno.EIO
    lines = mounting.log_lines_naming(mount.log_text(), container)
    assert len(lines) == 1, lines
    assert f"-o authorize_virtual_chunk_access={container}" in lines[0]
    # Everything but those chunks still answers.
    assert json.loads((mnt / ".zarrfs" / "info" / "plain.json").read_bytes())["shape"] == [20, 30]


def test_virtual_chunks_into_a_netcdf_file_on_s3(s3, tmp_path, mount):
    endpoint, fs = s3
    values = write_netcdf(tmp_path / "f.nc")
    fs.put(str(tmp_path / "f.nc"), f"{BUCKET}/nc/f.nc")
    container = f"s3://{BUCKET}/nc/"
    config = icechunk.RepositoryConfig.default()
    config.set_virtual_chunk_container(
        icechunk.VirtualChunkContainer(
            container,
            icechunk.s3_store(
                region="us-east-1", endpoint_url=endpoint, allow_http=True, s3_compatible=True, force_path_style=True
            ),
        )
    )
    storage = icechunk.s3_storage(
        bucket=BUCKET,
        prefix="ice/virtual",
        endpoint_url=endpoint,
        allow_http=True,
        access_key_id=CREDENTIALS["key"],
        secret_access_key=CREDENTIALS["secret"],
        region="us-east-1",
        force_path_style=True,
    )
    session = icechunk.Repository.create(storage, config=config).writable_session("main")
    add_virtual_arrays(session.store, str(tmp_path / "f.nc"), container + "f.nc")
    session.commit("virtual arrays on S3")
    so = {"client_kwargs": {"endpoint_url": endpoint}, **CREDENTIALS}
    mnt = mount(
        f"s3://{BUCKET}/ice/virtual", "storage_options=" + json.dumps(so), f"authorize_virtual_chunk_access={container}"
    )
    for name in VARIABLES:
        assert (mnt / f"{name}.npy").read_bytes() == oracles.npy_bytes(values[name]), name
