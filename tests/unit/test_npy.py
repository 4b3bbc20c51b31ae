"""NPY headers must be byte-identical to what numpy.save writes."""

import io

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zarrfs import npy

DTYPES = [
    "|b1",
    "|i1",
    "<u2",
    ">i4",
    "<i8",
    "<f2",
    ">f8",
    "<c16",
    "|S7",
    "<U3",
    "<M8[ns]",
    "<m8[s]",
    "|V5",
    [("a", "<i4"), ("b", ">f8", (2,))],
    [("x", [("y", "|u1"), ("z", "<f4")])],
]


def saved_header(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, arr)
    return buf.getvalue()[: len(buf.getvalue()) - arr.nbytes]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(), (0,), (5,), (3, 4), (2, 1, 7), (10**12, 3)][:5])
@pytest.mark.parametrize("fortran", [False, True])
def test_header_matches_np_save(dtype, shape, fortran):
    arr = np.zeros(shape, dtype=np.dtype(dtype), order="F" if fortran else "C")
    fortran_order = fortran and arr.ndim > 1 and not arr.flags.c_contiguous
    assert npy.header(arr.dtype, shape, fortran_order) == saved_header(arr)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 2**40), max_size=6))
def test_header_large_and_many_dims(shape):
    # np.save of a broadcast view writes the header for the full shape without the data.
    # numpy's public header writers are the oracle for shapes too big to allocate.
    buf = io.BytesIO()
    d = {"descr": "<f4", "fortran_order": False, "shape": tuple(shape)}
    try:
        np.lib.format.write_array_header_1_0(buf, d)
    except ValueError:
        buf = io.BytesIO()
        np.lib.format.write_array_header_2_0(buf, d)
    assert npy.header(np.dtype("<f4"), tuple(shape)) == buf.getvalue()


def test_header_version_2_for_huge_structured():
    dtype = np.dtype([(f"field_{i:05d}", "<f8") for i in range(3000)])
    arr = np.zeros(2, dtype)
    h = npy.header(dtype, (2,))
    assert h == saved_header(arr)
    assert h[6:8] == b"\x02\x00"


def test_header_version_3_for_unicode_field_names():
    dtype = np.dtype([("温度", "<f4")])
    arr = np.zeros(3, dtype)
    with pytest.warns(UserWarning):
        expected = saved_header(arr)
    assert npy.header(dtype, (3,)) == expected


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(), (5,), (3, 4)])
@pytest.mark.parametrize("fortran", [False, True])
def test_parse_header_of_np_save(dtype, shape, fortran):
    arr = np.zeros(
        shape,
        dtype=np.dtype([tuple(f) for f in dtype] if isinstance(dtype, list) else dtype),
        order="F" if fortran else "C",
    )
    raw = saved_header(arr)
    for cut in (0, 3, 9, len(raw) - 1):
        assert npy.parse_header(raw[:cut]) is None
    got = npy.parse_header(raw + b"extra")
    assert got == (shape, arr.flags.f_contiguous and not arr.flags.c_contiguous, arr.dtype, len(raw))


@pytest.mark.parametrize(
    "bad",
    [b"PK\x03\x04", b"\x93NUMPX", b"\x93NUMPY\x09\x00" + b"x" * 20, b"\x93NUMPY\x01\x00\x10\x00{'descr': 12}    \n"],
)
def test_parse_header_refuses(bad):
    with pytest.raises(npy.NotNpy):
        npy.parse_header(bad)
