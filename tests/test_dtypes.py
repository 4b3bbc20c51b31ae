"""Data types and fill values of each format to numpy."""

import math

import numpy as np
import pytest

from zarrfs import dtypes
from zarrfs.errors import MetadataError, Unsupported


@pytest.mark.parametrize("spec,expected", [
    ("bool", "|b1"), ("int16", "<i2"), ("uint64", "<u8"), ("float16", "<f2"), ("complex128", "<c16"),
    ("r16", "|V2"), ({"name": "null_terminated_bytes", "configuration": {"length_bytes": 5}}, "|S5"),
    ({"name": "fixed_length_utf32", "configuration": {"length_bytes": 12}}, "<U3"),
    ({"name": "numpy.datetime64", "configuration": {"unit": "ns", "scale_factor": 1}}, "<M8[ns]"),
    ({"name": "numpy.timedelta64", "configuration": {"unit": "s", "scale_factor": 10}}, "<m8[10s]"),
    ({"name": "structured", "configuration": {"fields": [["a", "int32"], ["b", "float64"]]}},
     [("a", "<i4"), ("b", "<f8")]),
])
def test_v3_names(spec, expected):
    want = np.dtype([tuple(f) for f in expected] if isinstance(expected, list) else expected)
    assert dtypes.v3_dtype(spec) == want


@pytest.mark.parametrize("spec", ["string", "bytes", {"name": "variable_length_bytes"}, "bfloat16", "wat"])
def test_v3_unsupported(spec):
    with pytest.raises(Unsupported):
        dtypes.v3_dtype(spec)


def test_v2_types():
    assert dtypes.v2_dtype(">f8") == np.dtype(">f8")
    assert dtypes.v2_dtype([["a", "<i4"], ["b", "<f8", [2, 3]]]) == np.dtype([("a", "<i4"), ("b", "<f8", (2, 3))])
    with pytest.raises(Unsupported):
        dtypes.v2_dtype("|O")
    with pytest.raises(MetadataError):
        dtypes.v2_dtype("<q99")


@pytest.mark.parametrize("value,dtype,check", [
    ("NaN", "<f4", lambda v: math.isnan(v)), ("Infinity", "<f8", lambda v: v == math.inf),
    ("-Infinity", "<f8", lambda v: v == -math.inf), ("+Infinity", "<f2", lambda v: v == math.inf),
    ("0x3ff0000000000000", "<f8", lambda v: v == 1.0), ("0x3c00", "<f2", lambda v: v == 1.0),
    ("0b00111111100000000000000000000000", "<f4", lambda v: v == 1.0),
    ([1.5, "NaN"], "<c16", lambda v: v.real == 1.5 and math.isnan(v.imag)),
    (None, "<i4", lambda v: v == 0), (True, "|b1", lambda v: bool(v)), (-5, "<i8", lambda v: v == -5),
    ("YWI", "|S4", lambda v: v == b"ab"), ("YWI=", "|S4", lambda v: v == b"ab"),
    ("xy", "<U3", lambda v: v == "xy"), (-9223372036854775808, "<M8[ns]", lambda v: np.isnat(v)),
    ([1, 2, 3], "|V3", lambda v: bytes(v) == b"\x01\x02\x03"),
])
def test_fill_values(value, dtype, check):
    got = dtypes.fill_value(value, np.dtype(dtype))
    assert got.dtype == np.dtype(dtype) and got.shape == ()
    assert check(got[()])


def test_structured_fill_base64():
    dt = np.dtype([("a", "<i2"), ("b", "|u1")])
    got = dtypes.fill_value("AQAC", dt)  # bytes 01 00 02
    assert got["a"] == 1 and got["b"] == 2


@pytest.mark.parametrize("value,dtype", [("NaN", "<i4"), ("zzz", "<f8"), ("!!", "|V2"), ({"a": 1}, "<f8")])
def test_bad_fill_values(value, dtype):
    with pytest.raises(MetadataError):
        dtypes.fill_value(value, np.dtype(dtype))


@pytest.mark.parametrize("value,dtype,why", [
    ("false", "|b1", "expected true or false"),  # used to read as True (a non-empty string)
    ("true", "|b1", "expected true or false"), (2, "|b1", "expected true or false"),
    (0.5, "|b1", "expected true or false"),
    (1.5, "<i4", "not an integer"),  # used to become 1
    (-0.25, "|u1", "not an integer"), (True, "<i8", "a boolean"), ("1.5", "<i2", "not an integer"),
    (300, "|i1", "out of the range"), (-1, "<u8", "out of the range"), (2**64, "<u8", "out of the range"),
    (1.5, "<M8[ns]", "not an integer"), (True, "<c8", "bad complex"),
])
def test_fill_values_a_type_cannot_hold(value, dtype, why):
    """A fill value the spec does not allow for the type is refused, never coerced."""
    with pytest.raises(MetadataError, match=why):
        dtypes.fill_value(value, np.dtype(dtype))


@pytest.mark.parametrize("value,dtype,want", [
    (False, "|b1", False), (0, "|b1", False), (1, "|b1", True), (3.0, "<i4", 3), ("0x10", "<i2", 16),
    (2**64 - 1, "<u8", 2**64 - 1), (-128, "|i1", -128), ("NaT", "<M8[s]", np.datetime64("NaT")),
    (86400, ">M8[s]", np.datetime64("1970-01-02")),
])
def test_fill_values_real_writers_use(value, dtype, want):
    got = dtypes.fill_value(value, np.dtype(dtype))
    assert got.dtype == np.dtype(dtype)
    assert (np.isnat(got[()]) and np.isnat(want)) if dtype.endswith("[s]") and value == "NaT" else got[()] == want


@pytest.mark.parametrize("dtype", ["|b1", "<i2", ">u4", "<f8", ">f4", "<c8", "|S4", "<U2", "<M8[ns]", "<m8[10s]",
                                   "|V3", [("a", "<i2"), ("b", "|S2")]], ids=str)
@pytest.mark.parametrize("fmt", ["v2", "v3"])
def test_dtype_and_fill_round_trip(dtype, fmt):
    dt = np.dtype([tuple(f) for f in dtype] if isinstance(dtype, list) else dtype)
    raw = np.random.default_rng(1).integers(1, 255, dt.itemsize, dtype=np.uint8).tobytes()
    fill = np.frombuffer(raw, dtype=dt).reshape(())
    if dt.kind == "f":
        fill = np.array(np.nan, dt)
    if dt.kind == "U":
        fill = np.array("x", dt)
    if dt.kind == "b":
        fill = np.array(True, dt)
    if fmt == "v2":
        back_dt = dtypes.v2_dtype(dtypes.v2_dtype_json(dt))
    else:
        name, endian = dtypes.v3_dtype_json(dt)
        back_dt = dtypes.v3_dtype(name).newbyteorder(">" if endian == "big" else "=") if dt.byteorder == ">" else \
            dtypes.v3_dtype(name)
    assert back_dt == dt
    back = dtypes.fill_value(dtypes.fill_to_json(fill, dt), dt)
    assert back.tobytes() == np.asarray(fill, dt).tobytes()
