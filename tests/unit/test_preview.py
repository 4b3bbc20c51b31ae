"""Previews (zarrfs.views.preview): plans, values and scaling against numpy; PNGs read back with Pillow."""

import io
import math

import numpy as np
import pytest
from PIL import Image

from zarrfs.views import preview

from support.core import meta_and_chunks
from support.oracles import numpy_grey


def picture(arr, chunks, budget=preview.MAX_DECODED_BYTES):
    meta, chunk_arrays = meta_and_chunks(arr, chunks, "C")
    p = preview.plan(meta, budget)
    return p, preview.render(meta, p, {idx: chunk_arrays[idx] for idx in p.chunks})


def test_2d_block_means_and_scaling():
    arr = np.random.default_rng(0).random((600, 300)).astype("f4")
    p, values = picture(arr, (100, 64))
    assert values.shape == (200, 100) and p.rows is None
    want = arr.astype("f8").reshape(200, 3, 100, 3).mean(axis=(1, 3))
    np.testing.assert_allclose(values, want, rtol=1e-12)
    grey, alpha = preview.scale(values)
    assert alpha is None
    assert np.abs(grey.astype(int) - numpy_grey(want)).max() <= 1  # rounding at .5


def test_middle_page_of_a_stack_and_small_arrays_keep_their_size():
    arr = np.arange(5 * 4 * 6, dtype="i2").reshape(5, 4, 6)
    p, values = picture(arr, (2, 3, 3))
    assert p.page == (2,)
    np.testing.assert_array_equal(values, arr[2])
    arr4 = np.arange(2 * 3 * 4 * 5, dtype="u1").reshape(2, 3, 4, 5)
    p, values = picture(arr4, (1, 1, 4, 5))
    assert p.page == (1, 0)  # page 3 of 6 in C order
    np.testing.assert_array_equal(values, arr4[1, 0])


def test_nan_is_transparent_in_the_png():
    arr = np.random.default_rng(1).random((50, 40))
    arr[10:20, 5:15] = np.nan
    _, values = picture(arr, (16, 16))
    with Image.open(io.BytesIO(preview.png(values))) as im:
        assert im.mode == "LA" and im.size == (40, 50)
        la = np.asarray(im)
    np.testing.assert_array_equal(la[..., 1] == 0, np.isnan(arr))
    np.testing.assert_array_equal(la[..., 0], numpy_grey(arr))


def test_constant_array_is_black_and_complex_shows_magnitude():
    _, values = picture(np.full((8, 8), 3.0), (4, 4))
    assert (preview.scale(values)[0] == 0).all()
    z = (np.arange(16) * (1 + 1j)).reshape(4, 4).astype("c8")
    _, values = picture(z, (2, 2))
    np.testing.assert_allclose(values, np.abs(z))


def test_large_page_reads_at_most_the_budget_by_strided_picks():
    arr = np.random.default_rng(2).random((2000, 3000)).astype("f4")
    chunks = (100, 100)
    chunk_bytes = 100 * 100 * 4
    budget = 30 * chunk_bytes
    p, values = picture(arr, chunks, budget)
    assert p.rows is not None and len(p.chunks) * chunk_bytes <= budget
    assert values.shape == (math.ceil(2000 / 12), 250)
    np.testing.assert_array_equal(values, arr[np.ix_(p.rows, p.cols)].astype("f8"))
    assert len(set(p.rows)) == len(p.rows)  # distinct rows: a strided subset, not repeats


def test_one_chunk_larger_than_the_budget_is_still_a_preview():
    arr = np.random.default_rng(3).random((600, 600))
    p, values = picture(arr, (600, 600), budget=1000)
    assert len(p.chunks) == 1 and values.shape == (200, 200)
    np.testing.assert_array_equal(values, arr[np.ix_(p.rows, p.cols)])


@pytest.mark.parametrize("shape,dtype", [((5,), "f4"), ((0, 3), "f4"), ((3, 3), "S2"), ((3, 3), "M8[s]")])
def test_no_preview_of_arrays_that_are_no_picture(shape, dtype):
    meta, _ = meta_and_chunks(np.zeros(shape, dtype), tuple(max(n, 1) for n in shape), "C")
    assert not preview.supported(meta)
