"""Regular chunk grid arithmetic: grid shape, chunk regions clipped at the array's edge."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator

# A position in a grid or an array, or a shape: one int per dimension (the one Index type).
Index = tuple[int, ...]


def grid_shape(shape: Index, chunks: Index) -> Index:
    """Number of chunks along each dimension."""
    return tuple(-(-s // c) for s, c in zip(shape, chunks))


def n_chunks(shape: Index, chunks: Index) -> int:
    return math.prod(grid_shape(shape, chunks))


def chunk_slices(idx: Index, shape: Index, chunks: Index) -> tuple[slice, ...]:
    """The region of the array that chunk `idx` covers, clipped at the array's edge."""
    return tuple(slice(i * c, min((i + 1) * c, s)) for i, c, s in zip(idx, chunks, shape))


def data_shape(idx: Index, shape: Index, chunks: Index) -> Index:
    """Shape of chunk `idx` once clipped at the edge (its chunk shape is always `chunks`)."""
    return tuple(min((i + 1) * c, s) - i * c for i, c, s in zip(idx, chunks, shape))


def all_chunks(shape: Index, chunks: Index) -> Iterator[Index]:
    """Every grid position in C order."""
    return itertools.product(*(range(n) for n in grid_shape(shape, chunks)))


def chunks_in_box(start: Index, box: Index, chunks: Index) -> Iterator[Index]:
    """Grid positions of every chunk that intersects the box [start, start + box)."""
    ranges = [range(a // c, (a + n - 1) // c + 1) for a, n, c in zip(start, box, chunks)]
    return itertools.product(*ranges)


def flat_boxes(shape: Index, first: int, stop: int) -> Iterator[tuple[Index, Index]]:
    """Split the C-order element range [first, stop) into boxes, each contiguous in C order.

    Yields (start, box_shape) in order; at most 2*ndim-1 boxes.
    """
    if first >= stop:
        return
    if not shape:
        yield (), ()
        return
    strides = [math.prod(shape[d + 1 :]) for d in range(len(shape))]

    def ones(base: Index) -> Index:
        return (1,) * len(base)

    def split(d: int, base: Index, lo: int, hi: int) -> Iterator[tuple[Index, Index]]:
        st, rest = strides[d], shape[d + 1 :]
        if not rest:
            yield base + (lo,), ones(base) + (hi - lo,)
            return
        if lo % st == 0 and hi % st == 0:
            yield base + (lo // st,) + (0,) * len(rest), ones(base) + ((hi - lo) // st,) + rest
            return
        i0, i_last = lo // st, (hi - 1) // st
        if i0 == i_last:
            yield from split(d + 1, base + (i0,), lo - i0 * st, hi - i0 * st)
            return
        if lo % st:
            yield from split(d + 1, base + (i0,), lo % st, st)
            i0 += 1
        i1 = hi // st
        if i1 > i0:
            yield base + (i0,) + (0,) * len(rest), ones(base) + (i1 - i0,) + rest
        if hi % st:
            yield from split(d + 1, base + (i1,), 0, hi % st)

    yield from split(0, (), first, stop)


def row_run(row: int, shape: Index, chunks: Index) -> tuple[Index, Index, int]:
    """For the row of SHAPE's last dimension numbered ROW (C order of the other dimensions):
    its chunk's grid position and its position in that chunk in those dimensions, and how many
    rows from it on lie in the same chunks, at consecutive rows of them (C order)."""
    if len(shape) == 2:  # (most arrays, and every random read of one asks: the loop below, written out)
        height = chunks[0]
        p, i = divmod(row, height)
        return (p,), (i,), min(shape[0] - row, height - i)
    idx = []
    for n in reversed(shape[:-1]):
        row, i = divmod(row, n)
        idx.append(i)
    if not idx:
        return (), (), 1
    idx.reverse()
    last, height = idx[-1], chunks[-2]
    return (
        tuple(i // c for i, c in zip(idx, chunks)),
        tuple(i % c for i, c in zip(idx, chunks)),
        min(shape[-2] - last, height - last % height),
    )


def flat_row(within: Index, chunks: Index) -> int:
    """The row (of the last dimension) of a C-ordered chunk of shape CHUNKS at position WITHIN
    in its other dimensions, counted from the chunk's first."""
    if len(within) == 1:
        return within[0]
    q = 0
    for i, c in zip(within, chunks):
        q = q * c + i
    return q
