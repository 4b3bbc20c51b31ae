"""netCDF classic files of groups (zarrfs.netcdf) read by scipy.io.netcdf_file and netCDF4-python."""

import io

import numpy as np

from zarrfs import netcdf
from zarrfs.codecs import CodecChain
from zarrfs.keys import ChunkKeys
from zarrfs.model import ArrayMeta
from test_layouts import make

import netCDF4  # noqa: E402
from scipy.io import netcdf_file  # noqa: E402


def array(name, value, chunks, attrs=None, dim_names=None, fill=True, order="C"):
    meta, chunk_arrays = make(value, chunks, order)
    meta = ArrayMeta(path=f"g/{name}", shape=value.shape, dtype=value.dtype, chunk_shape=chunks,
                     fill_value=np.array(-9, value.dtype) if value.dtype.kind in "if" else np.zeros((), value.dtype),
                     codec=CodecChain(), keys=ChunkKeys(name), attributes=attrs or {}, format="v2",
                     metadata_key=f"g/{name}/.zarray", dimension_names=dim_names, erase_fill_chunks=fill)
    return meta, chunk_arrays


def file_bytes(nc: netcdf.NetcdfFile, chunks_by_var: dict) -> bytes:
    """Every byte of the file, assembled part by part from the chunk arrays."""
    out = []
    for part in nc.parts(0, nc.size):
        if isinstance(part, bytes):
            out.append(part)
        else:
            i, stream, off, n = part
            var = nc.variables[i]
            plan = stream.plan(*var.source_range(off, n))
            raw = bytes(stream.assemble(plan, {c: chunks_by_var[i][c] for c in plan.chunks}))
            out.append(bytes(var.data_bytes(raw, off, n)))
    data = b"".join(out)
    assert len(data) == nc.size
    return data


def build(specs, attrs=None, groups=()):
    metas, chunks = [], []
    for spec in specs:
        m, c = array(*spec[:3], **spec[3] if len(spec) > 3 else {})
        metas.append(m)
        chunks.append(c)
    nc = netcdf.NetcdfFile(attrs or {}, metas, list(groups))
    return nc, file_bytes(nc, {i: c for i, c in enumerate(chunks)})


RNG = np.random.default_rng(3)
T = np.arange(5, dtype="<f8") * 1.5
LAT = np.linspace(-80, 80, 7).astype(">f4")
TEMP = RNG.standard_normal((5, 7, 3)).astype("<f4")
PR = RNG.integers(-300, 300, (5, 7)).astype(">i2")


def classic():
    return build([
        ("time", T, (2,), {"attrs": {"_ARRAY_DIMENSIONS": ["time"], "units": "days since 2000-01-01"}}),
        ("lat", LAT, (3,), {"attrs": {"_ARRAY_DIMENSIONS": ["lat"]}}),
        ("temp", TEMP, (2, 3, 2), {"attrs": {"_ARRAY_DIMENSIONS": ["time", "lat", "lev"], "scale": 0.5,
                                              "flags": [1, 2, 3], "nested": {"a": [1, None]}}, "order": "F"}),
        ("pr", PR, (4, 4), {"attrs": {"_ARRAY_DIMENSIONS": ["time", "lat"]}, "fill": False}),
        ("scalar", np.array(7.25, "<f8"), ()),
        ("label", np.array([b"ab", b"cd"]), (1,)),
    ], attrs={"title": "test", "version": 3}, groups=["child"])


def test_cdf2_read_by_scipy():
    nc, data = classic()
    assert data[:4] == b"CDF\x02"
    f = netcdf_file(io.BytesIO(data), mmap=False)
    assert f.dimensions == {"time": 5, "lat": 7, "lev": 3}
    np.testing.assert_array_equal(f.variables["time"][:], T)
    np.testing.assert_array_equal(f.variables["temp"][:], TEMP)
    np.testing.assert_array_equal(f.variables["pr"][:], PR)
    assert f.variables["temp"].dimensions == ("time", "lat", "lev")
    assert f.variables["scalar"].getValue() == 7.25
    assert f.variables["time"].units == b"days since 2000-01-01"
    assert f.variables["temp"].scale == 0.5
    assert list(f.variables["temp"].flags) == [1, 2, 3]
    assert f.variables["temp"]._FillValue == -9
    assert not hasattr(f.variables["pr"], "_FillValue")
    assert f.title == b"test" and f.version == 3
    assert b"label" in getattr(f, netcdf.LEFT_OUT_ATTR) and b"child" in getattr(f, netcdf.LEFT_OUT_ATTR)
    f.close()


def test_cdf2_read_by_netcdf4():
    nc, data = classic()
    with netCDF4.Dataset("mem.nc", memory=data) as f:
        assert f.data_model == "NETCDF3_64BIT_OFFSET"
        f.set_auto_mask(False)
        np.testing.assert_array_equal(f["temp"][:], TEMP)
        np.testing.assert_array_equal(f["lat"][:], LAT)
        assert f["temp"].getncattr("nested") == '{"a": [1, null]}'
        assert f["scalar"][...] == 7.25


def test_cdf5_for_unsigned_and_64_bit_and_generated_dimensions():
    u8 = RNG.integers(0, 2**63, (4, 3), dtype="<u8")
    i8 = RNG.integers(-2**40, 2**40, (3, 4)).astype(">i8")
    b = RNG.integers(0, 2, (2,)).astype(bool)
    nc, data = build([
        ("u", u8, (3, 2), {"dim_names": ("x", None)}),
        ("i", i8, (2, 2), {"dim_names": ("x", "y")}),  # x conflicts (4 then 3)
        ("b", b, (2,)),
    ], attrs={"big": 2**40})
    assert data[:4] == b"CDF\x05"
    with netCDF4.Dataset("mem.nc", memory=data) as f:
        assert f.data_model == "NETCDF3_64BIT_DATA"
        f.set_auto_mask(False)
        np.testing.assert_array_equal(f["u"][:], u8)
        np.testing.assert_array_equal(f["i"][:], i8)
        np.testing.assert_array_equal(f["b"][:], b.astype("i1"))
        assert f["u"].dimensions[0] == "x" and f["i"].dimensions == ("x_3", "y")
        assert len(f.dimensions) == 5
        assert f.getncattr("big") == 2**40


def test_parts_of_any_range_are_the_whole_files_bytes():
    nc, data = classic()
    chunks = {}
    for i, v in enumerate(nc.variables):
        chunks[i] = make(np.zeros(v.meta.shape, v.meta.dtype), v.meta.chunk_shape, "C")[1]
    for off, n in [(0, 10), (len(nc.header) - 3, 50), (nc.size - 7, 100), (37, 333), (nc.size, 4)]:
        got = [p if isinstance(p, bytes) else (p[2], p[3]) for p in nc.parts(off, n)]
        assert sum(len(p) if isinstance(p, bytes) else p[1] for p in got) == max(0, min(n, nc.size - off))
