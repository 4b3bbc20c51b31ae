"""Byte layouts (zarrfs.views.streams) against numpy's own bytes (np.save, tobytes), chunk by chunk."""

import io
from unittest import mock

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from zarrfs import grid
from zarrfs.views import streams
from zarrfs.views.streams import ArrayStream

from support.core import LAYOUT_DTYPES, meta_and_chunks


@st.composite
def cases(draw):
    ndim = draw(st.integers(0, 4))
    shape = tuple(draw(st.lists(st.integers(0, 9), min_size=ndim, max_size=ndim)))
    chunks = tuple(draw(st.integers(1, 5)) for _ in shape)
    dtype = np.dtype([tuple(f) for f in d] if isinstance(d := draw(st.sampled_from(LAYOUT_DTYPES)), list) else d)
    seed = draw(st.integers(0, 2**32 - 1))
    raw = np.random.default_rng(seed).integers(0, 256, int(np.prod(shape, dtype=int)) * dtype.itemsize, dtype=np.uint8)
    arr = raw.view(dtype).reshape(shape)
    return arr, chunks, draw(st.sampled_from("CF"))


def read_all_ranges(stream, chunk_arrays, expected, data):
    size = stream.size
    assert size == len(expected)
    for _ in range(4):
        off = data.draw(st.integers(0, size + 3))
        n = data.draw(st.integers(0, size + 5))
        plan = stream.plan(off, n)
        for rows_min in (streams.ROWS_MIN, 0):  # as it is, and whole rows for every read
            # transposing copies staged as they are (whole, at these sizes), and 48 bytes at a time (several blocks)
            for stage in (streams.STAGE_BYTES, 48):
                with mock.patch.object(streams, "ROWS_MIN", rows_min), mock.patch.object(streams, "STAGE_BYTES", stage):
                    got = stream.assemble(plan, {i: chunk_arrays[i] for i in plan.chunks})
                assert got == expected[off : off + n]


@settings(max_examples=300, deadline=None)
@given(cases(), st.data())
def test_npy_c_matches_np_save(case, data):
    arr, chunks, chunk_order = case
    meta, chunk_arrays = meta_and_chunks(arr, chunks, chunk_order)
    buf = io.BytesIO()
    np.save(buf, arr)
    read_all_ranges(ArrayStream(meta, "C"), chunk_arrays, buf.getvalue(), data)


@settings(max_examples=300, deadline=None)
@given(cases(), st.data(), st.sampled_from("CF"))
def test_raw_matches_tobytes(case, data, order):
    arr, chunks, chunk_order = case
    meta, chunk_arrays = meta_and_chunks(arr, chunks, chunk_order)
    read_all_ranges(ArrayStream(meta, order, with_header=False), chunk_arrays, arr.tobytes(order=order), data)


def test_plan_touches_only_needed_chunks():
    arr = np.arange(100 * 100, dtype="<i4").reshape(100, 100)
    meta, chunk_arrays = meta_and_chunks(arr, (10, 10), "C")
    stream = ArrayStream(meta, "C", with_header=False)
    # Row 0, columns 0..19: two chunks of the first chunk row.
    assert set(stream.plan(0, 20 * 4).chunks) == {(0, 0), (0, 1)}
    # Rows 10..19 whole: the ten chunks of the second chunk row.
    assert set(stream.plan(10 * 100 * 4, 10 * 100 * 4).chunks) == {(1, j) for j in range(10)}
    f_stream = ArrayStream(meta, "F", with_header=False)
    # F order: the first 10 bytes' elements are column 0, rows 0..2: one chunk.
    assert set(f_stream.plan(0, 10).chunks) == {(0, 0)}


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 6), max_size=4), st.data())
def test_flat_boxes_cover_range_in_order(shape, data):
    shape = tuple(shape)
    total = int(np.prod(shape, dtype=int))
    lo = data.draw(st.integers(0, total))
    hi = data.draw(st.integers(lo, total))
    flat = np.arange(total).reshape(shape)
    got = []
    boxes = list(grid.flat_boxes(shape, lo, hi))
    assert len(boxes) <= max(1, 2 * len(shape) - 1)
    for start, box in boxes:
        got.extend(flat[tuple(slice(a, a + b) for a, b in zip(start, box))].ravel().tolist())
    assert got == list(range(lo, hi))


@settings(max_examples=200, deadline=None)
@given(
    st.integers(1, 9),
    st.integers(1, 9),
    st.integers(1, 5),
    st.integers(1, 5),
    st.sampled_from("CF"),
    st.sampled_from(["|u1", "<i2", "<f8"]),
    st.data(),
)
def test_last_chunk_row_names_the_row_of_chunks_a_window_covers(rows, cols, crows, ccols, order, dtype, data):
    """What read-ahead relies on to skip a plan: bytes inside one row of chunks touch only chunks
    of that row, and a whole row of the array touches all of them. Oracle: numpy's unravelling of
    each byte's element, and the stream's own plan (tested above against numpy.save)."""
    arr = np.zeros((rows, cols), dtype)
    meta, _ = meta_and_chunks(arr, (crows, ccols), "C")
    stream = ArrayStream(meta, order)
    h, item = len(stream.header), arr.dtype.itemsize
    axis, per = (0, crows) if order == "C" else (1, ccols)  # the stream's rows: array rows (C), columns (F)

    def band(b: int) -> int:  # the row of chunks of byte B (past the header)
        return int(np.unravel_index((b - h) // item, arr.shape, order=order)[axis]) // per

    row_bytes = arr.size // arr.shape[axis] * item
    offset = data.draw(st.integers(h, stream.size - 1))
    stop = data.draw(st.integers(offset + 1, stream.size))
    k, starts_in, whole_row = stream.last_chunk_row(offset, stop)
    assert k == band(stop - 1)
    assert starts_in == (band(offset) == k)
    assert whole_row == any(
        band(h + r * row_bytes) == k and offset <= h + r * row_bytes and h + (r + 1) * row_bytes <= stop
        for r in range(arr.shape[axis])
    )
    every = set(stream.plan(h + k * per * row_bytes, row_bytes).chunks)  # the row of chunks' first row
    assert len(every) == -(-arr.shape[1 - axis] // (ccols if axis == 0 else crows))
    if starts_in:
        assert set(stream.plan(offset, stop - offset).chunks) <= every
    assert stream.last_chunk_row(h - 1, stop) is None if h > 0 else True


def test_last_chunk_row_is_only_for_whole_2d_streams():
    meta3, _ = meta_and_chunks(np.zeros((4, 4, 4), "<i2"), (2, 2, 2), "C")
    assert ArrayStream(meta3).last_chunk_row(200, 210) is None
    meta2, _ = meta_and_chunks(np.zeros((4, 4), "<i2"), (2, 2), "C")
    assert ArrayStream(meta2, chunk=(0, 0)).last_chunk_row(200, 201) is None
    assert ArrayStream(meta2, with_header=False).last_chunk_row(0, 32) == (1, False, True)
