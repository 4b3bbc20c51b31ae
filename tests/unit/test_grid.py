"""Regular chunk grid arithmetic against brute force over numpy indices."""

import itertools

import numpy as np
import pytest

from zarrfs import grid


def test_shapes_and_edges():
    assert grid.grid_shape((10, 7), (4, 7)) == (3, 1) and grid.n_chunks((10, 7), (4, 7)) == 3
    assert grid.chunk_slices((2, 0), (10, 7), (4, 7)) == (slice(8, 10), slice(0, 7))
    assert grid.data_shape((2, 0), (10, 7), (4, 7)) == (2, 7)
    assert list(grid.all_chunks((3, 4), (2, 2))) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert list(grid.all_chunks((), ())) == [()]
    assert list(grid.all_chunks((0, 4), (2, 2))) == []


def test_chunks_in_box():
    assert list(grid.chunks_in_box((3, 0), (2, 5), (2, 4))) == [(1, 0), (1, 1), (2, 0), (2, 1)]


@pytest.mark.parametrize("shape", [(7,), (3, 5), (2, 3, 4)])
def test_flat_boxes_cover_exactly_the_range(shape):
    total = int(np.prod(shape))
    for first, stop in itertools.combinations(range(total + 1), 2):
        seen = np.zeros(shape, bool)
        boxes = list(grid.flat_boxes(shape, first, stop))
        assert len(boxes) <= 2 * len(shape) - 1
        for start, box in boxes:
            region = tuple(slice(a, a + n) for a, n in zip(start, box))
            assert not seen[region].any()
            seen[region] = True
        want = np.zeros(total, bool)
        want[first:stop] = True
        assert np.array_equal(seen.reshape(-1), want)
