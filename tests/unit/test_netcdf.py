"""netCDF classic files of groups (zarrfs.views.netcdf) read by scipy.io.netcdf_file and netCDF4-python."""

import base64
import io
import struct

import netCDF4  # noqa: E402
import numpy as np
import pytest
from scipy.io import netcdf_file  # noqa: E402

from zarrfs.codecs.chain import CodecChain
from zarrfs.errors import ZarrfsError
from zarrfs.model import ArrayMeta
from zarrfs.storage.keys import ChunkKeys
from zarrfs.views import netcdf

from support.core import meta_and_chunks


def array(name, value, chunks, attrs=None, dim_names=None, fill=True, order="C", fmt="v2", fill_value=None):
    meta, chunk_arrays = meta_and_chunks(value, chunks, order)
    if fill_value is None:
        fill_value = -9 if value.dtype.kind in "if" else 0
    meta = ArrayMeta(
        path=f"g/{name}",
        shape=value.shape,
        dtype=value.dtype,
        chunk_shape=chunks,
        fill_value=np.array(fill_value, value.dtype),
        codec=CodecChain(),
        keys=ChunkKeys(name),
        attributes=attrs or {},
        format=fmt,
        metadata_key=f"g/{name}/.zarray",
        dimension_names=dim_names,
        erase_fill_chunks=fill,
    )
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


def build(specs, attrs=None, groups=(), fit_int32=()):
    metas, chunks = [], []
    for spec in specs:
        m, c = array(*spec[:3], **spec[3] if len(spec) > 3 else {})
        metas.append(m)
        chunks.append(c)
    nc = netcdf.NetcdfFile(attrs or {}, metas, list(groups), {f"g/{name}" for name in fit_int32})
    return nc, file_bytes(nc, {i: c for i, c in enumerate(chunks)})


RNG = np.random.default_rng(3)
T = np.arange(5, dtype="<f8") * 1.5
LAT = np.linspace(-80, 80, 7).astype(">f4")
TEMP = RNG.standard_normal((5, 7, 3)).astype("<f4")
PR = RNG.integers(-300, 300, (5, 7)).astype(">i2")


def classic():
    return build(
        [
            ("time", T, (2,), {"attrs": {"_ARRAY_DIMENSIONS": ["time"], "units": "days since 2000-01-01"}}),
            ("lat", LAT, (3,), {"attrs": {"_ARRAY_DIMENSIONS": ["lat"]}}),
            (
                "temp",
                TEMP,
                (2, 3, 2),
                {
                    "attrs": {
                        "_ARRAY_DIMENSIONS": ["time", "lat", "lev"],
                        "scale": 0.5,
                        "flags": [1, 2, 3],
                        "nested": {"a": [1, None]},
                    },
                    "order": "F",
                },
            ),
            ("pr", PR, (4, 4), {"attrs": {"_ARRAY_DIMENSIONS": ["time", "lat"]}, "fill": False}),
            ("scalar", np.array(7.25, "<f8"), ()),
            ("label", np.array([b"ab", b"cd"]), (1,)),
        ],
        attrs={"title": "test", "version": 3},
        groups=["child"],
    )


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
    i8 = RNG.integers(-(2**40), 2**40, (3, 4)).astype(">i8")
    b = RNG.integers(0, 2, (2,)).astype(bool)
    nc, data = build(
        [
            ("u", u8, (3, 2), {"dim_names": ("x", None)}),
            ("i", i8, (2, 2), {"dim_names": ("x", "y")}),  # x conflicts (4 then 3)
            ("b", b, (2,)),
        ],
        attrs={"big": 2**40},
    )
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
        chunks[i] = meta_and_chunks(np.zeros(v.meta.shape, v.meta.dtype), v.meta.chunk_shape, "C")[1]
    for off, n in [(0, 10), (len(nc.header) - 3, 50), (nc.size - 7, 100), (37, 333), (nc.size, 4)]:
        got = [p if isinstance(p, bytes) else (p[2], p[3]) for p in nc.parts(off, n)]
        assert sum(len(p) if isinstance(p, bytes) else p[1] for p in got) == max(0, min(n, nc.size - off))


# --- xarray's conventions -------------------------------------------------------------

NAN_B64 = base64.b64encode(struct.pack("<d", np.nan)).decode()  # as xarray writes a float _FillValue in v3


def test_fill_values_as_xarray_reads_them_per_format():
    ints = np.array([0, 1, 2], "<i8")
    floats = np.array([0.0, np.nan, 2.0], "<f4")
    nc, data = build(
        [
            ("v2", ints, (2,), {"fill_value": 0}),  # v2: the fill value is _FillValue
            ("v2null", ints, (2,), {"fill": False}),
            ("draft", ints, (2,), {"fill_value": 0, "fmt": "v3-draft"}),  # as xarray with zarr-python 2 read them
            ("v1", ints, (2,), {"fill_value": 0, "fmt": "v1"}),
            ("v3", ints, (2,), {"fill_value": 0, "fmt": "v3"}),  # v3: what unwritten chunks hold, not missing
            ("v3attr", ints, (2,), {"fill_value": 0, "fmt": "v3", "attrs": {"_FillValue": 2}}),
            ("v3nan", floats, (2,), {"fill_value": 0, "fmt": "v3", "attrs": {"_FillValue": NAN_B64}}),
            ("v3named", floats, (2,), {"fill_value": 0, "fmt": "v3", "attrs": {"_FillValue": "-Infinity"}}),
            ("v3bad", floats, (2,), {"fmt": "v3", "attrs": {"_FillValue": "not base64!"}}),
        ]
    )
    with netCDF4.Dataset("mem.nc", memory=data) as f:
        fills = {name: getattr(v, "_FillValue", None) for name, v in f.variables.items()}
        left_out = f.getncattr(netcdf.LEFT_OUT_ATTR)
    assert fills["v2"] == 0 and fills["draft"] == 0 and fills["v1"] == 0
    assert fills["v2null"] is None and fills["v3"] is None and fills["v3bad"] is None
    assert fills["v3attr"] == 2 and np.isnan(fills["v3nan"]) and fills["v3named"] == -np.inf
    assert "v3bad: _FillValue" in left_out
    nc, data = build([("v3big", np.array([1, 2], "u1"), (2,), {"fmt": "v3", "attrs": {"_FillValue": 256}})])
    assert "v3big: _FillValue 256 is no uint8 value" in nc.left_out


U1 = np.array([0, 127, 128, 255], "u1")
U2 = np.array([1, 40000, 65535, 7], "<u2")
U4 = np.array([2**32 - 1, 0, 2**31, 5], ">u4")
I8 = np.array([-(2**31), 0, 2**31 - 1, 9], "<i8")
U8 = np.array([0, 2**31 - 1, 3, 4], ">u8")


def unsigned_and_fitting():
    return build(
        [
            ("u1", U1, (3,), {"dim_names": ("x",)}),
            ("u2", U2, (3,), {"dim_names": ("x",), "fill_value": 65535}),
            ("u4", U4, (3,), {"dim_names": ("x",)}),
            ("i8", I8, (3,), {"dim_names": ("x",), "fill_value": 9}),
            ("u8", U8, (3,), {"dim_names": ("x",), "fill": False}),
        ],
        fit_int32=("i8", "u8"),
    )


def test_unsigned_as_signed_and_fitting_64_bit_as_int_make_cdf2():
    nc, data = unsigned_and_fitting()
    assert data[:4] == b"CDF\x02"
    f = netcdf_file(io.BytesIO(data), mmap=False)  # the raw file: signed types, the same bytes
    assert {k: v.typecode() for k, v in f.variables.items()} == {"u1": "b", "u2": "h", "u4": "i", "i8": "i", "u8": "i"}
    np.testing.assert_array_equal(f.variables["u1"][:], U1.view("i1"))
    np.testing.assert_array_equal(f.variables["u4"][:], U4.view(">i4"))
    np.testing.assert_array_equal(f.variables["i8"][:], I8)
    assert f.variables["u2"]._FillValue == -1 and f.variables["i8"]._FillValue == 9
    assert all(f.variables[k]._Unsigned == b"true" for k in ("u1", "u2", "u4"))
    assert not hasattr(f.variables["i8"], "_Unsigned")
    f.close()
    with netCDF4.Dataset("mem.nc", memory=data) as f:  # decodes _Unsigned itself
        f.set_auto_mask(False)
        np.testing.assert_array_equal(f["u1"][:], U1)
        np.testing.assert_array_equal(f["u2"][:], U2)
        np.testing.assert_array_equal(f["u4"][:], U4)
        np.testing.assert_array_equal(f["u8"][:], U8)


def test_a_signed_array_s_own_unsigned_attribute_is_kept():
    """A signed Zarr array marked `_Unsigned = "true"` (as xarray decodes it in Zarr stores too:
    the values are unsigned) keeps the mark, so netCDF readers get the values xarray gets."""
    signed = np.array([-1, 0, 1, -128], "i1")
    nc, data = build(
        [("b", signed, (3,), {"dim_names": ("x",), "fill": False, "attrs": {"_Unsigned": "true", "units": "1"}})]
    )
    with netCDF4.Dataset("mem.nc", memory=data) as f:
        assert f["b"]._Unsigned == "true"
        np.testing.assert_array_equal(f["b"][:], signed.view("u1"))


def test_a_fill_value_past_int32_keeps_the_variable_64_bit():
    nc, data = build([("i8", I8, (3,), {"fill_value": 2**40})], fit_int32=("i8",))
    assert data[:4] == b"CDF\x05"
    with netCDF4.Dataset("mem.nc", memory=data) as f:
        assert f["i8"].dtype == np.dtype("i8") and f["i8"]._FillValue == 2**40
        np.testing.assert_array_equal(f["i8"][:], I8)


def test_only_small_64_bit_integer_arrays_are_scanned():
    small, _ = array("t", np.zeros(netcdf.SCAN_MAX_BYTES // 8, "i8"), (2**16,))
    large, _ = array("t", np.zeros(netcdf.SCAN_MAX_BYTES // 8 + 1, "i8"), (2**16,))
    many, _ = array("t", np.zeros(netcdf.SCAN_MAX_CHUNKS + 1, "i8"), (1,))
    floats, _ = array("t", np.zeros(4, "f8"), (2,))
    assert netcdf.scan_wanted(small)
    assert not netcdf.scan_wanted(large) and not netcdf.scan_wanted(many) and not netcdf.scan_wanted(floats)


def test_a_narrowed_value_that_no_longer_fits_is_an_error():
    nc, _ = unsigned_and_fitting()
    var = next(v for v in nc.variables if v.name == "i8")
    off, n = var.source_range(5, 6)  # bytes 5..10 of the int data: elements 1..2
    assert (off, n) == (8, 16)
    fitting = np.array([0, 2**31 - 1], "<i8")
    assert var.data_bytes(fitting.tobytes(), 5, 6) == fitting.astype(">i4").tobytes()[1:7]
    with pytest.raises(ZarrfsError, match="g/i8"):
        var.data_bytes(np.array([0, 2**31], "<i8").tobytes(), 5, 6)
