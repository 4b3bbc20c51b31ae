"""A numpy basic-indexing selection of an array (`a[0:90, ::2]`) as a byte stream: parsing and layout.

The selection text is parsed with `ast` (never evaluated) and normalized per dimension to
an integer or (start, step, count); `SliceStream` maps a byte range of the selection's
C-order NPY (or raw) file to element regions of the source chunks it touches.
Pure: no I/O, no trio.
"""

from __future__ import annotations

import ast
import itertools
import math
from collections.abc import Iterator
from types import EllipsisType

import numpy as np

from .. import grid
from ..grid import Index
from ..model import ArrayMeta
from .streams import ByteStream, ReadPlan, assemble_elements, element_span, npy_header

# One dimension of a normalized selection: an integer position, or (start, step, count).
Dim = int | tuple[int, int, int]
# File suffixes of a selection: with an NPY header, or the raw elements only.
SUFFIXES = {".npy": True, ".raw": False}


class BadSelection(ValueError):
    """A selection that is malformed or out of range (the message says why)."""


def split_name(name: str) -> tuple[str, str, bool] | None:
    """`BASE[SEL].npy` -> (BASE, SEL, with NPY header); None when the name has no selection."""
    for suffix, header in SUFFIXES.items():
        if name.endswith("]" + suffix) and "[" in name:
            i = name.index("[")
            if i > 0:
                return name[:i], name[i + 1 : -len(suffix) - 1], header
    return None


def _int(node: ast.AST) -> int:
    """An integer literal, optionally negated."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _int(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    raise BadSelection(f"{ast.unparse(node)!r} is not an integer")


def parse(text: str) -> list[int | slice | EllipsisType]:
    """The items of a basic-indexing selection: integers, slices of integers, at most one `...`
    (none: the whole array, as `a[()]`)."""
    if not text.strip():
        return []
    try:
        tree = ast.parse(f"_[{text}]", mode="eval").body
    except SyntaxError as e:
        raise BadSelection(f"not a selection: {e.msg}") from None
    if not isinstance(tree, ast.Subscript) or not isinstance(tree.value, ast.Name):
        raise BadSelection("not a selection")
    nodes = tree.slice.elts if isinstance(tree.slice, ast.Tuple) else [tree.slice]
    items: list[int | slice | EllipsisType] = []
    for node in nodes:
        if isinstance(node, ast.Slice):
            parts = [None if p is None else _int(p) for p in (node.lower, node.upper, node.step)]
            if parts[2] == 0:
                raise BadSelection("slice step cannot be zero")
            items.append(slice(*parts))
        elif isinstance(node, ast.Constant) and node.value is Ellipsis:
            items.append(Ellipsis)
        else:
            items.append(_int(node))
    if items.count(Ellipsis) > 1:
        raise BadSelection("an index can only have a single ellipsis ('...')")
    return items


def normalize(items: list[int | slice | EllipsisType], shape: Index) -> tuple[Dim, ...]:
    """Per array dimension: a non-negative position, or (start, step, count), as numpy reads them."""
    n_index = len(items) - items.count(Ellipsis)
    if n_index > len(shape):
        raise BadSelection(f"too many indices: {n_index} for an array of {len(shape)} dimensions")
    if Ellipsis in items:
        i = items.index(Ellipsis)
        items = items[:i] + [slice(None)] * (len(shape) - n_index) + items[i + 1 :]
    whole: list[int | slice] = [i for i in items if not isinstance(i, EllipsisType)]  # (its ellipsis expanded)
    whole += [slice(None)] * (len(shape) - len(whole))
    out: list[Dim] = []
    for d, (item, n) in enumerate(zip(whole, shape)):
        if isinstance(item, slice):
            start, stop, step = item.indices(n)
            out.append((start, step, len(range(start, stop, step))))
        else:
            if not -n <= item < n:
                raise BadSelection(f"index {item} is out of bounds for axis {d} with size {n}")
            out.append(item % n)
    return tuple(out)


def selection(text: str, shape: Index) -> tuple[tuple[Dim, ...], bool]:
    """Parse and normalize `text` for an array of `shape` (BadSelection says why not); and whether
    numpy gives a scalar (integers only, no `...`), whose NPY file is in native byte order."""
    items = parse(text)
    dims = normalize(items, shape)
    return dims, Ellipsis not in items and all(isinstance(d, int) for d in dims)


def _groups(dim: Dim, lo: int, hi: int, chunk: int) -> Iterator[tuple[int, int | slice, slice | None]]:
    """(chunk position, index into the chunk, output slice in the box) for output positions [lo, hi)
    of one dimension; an integer dimension gives one group and no output slice."""
    if isinstance(dim, int):
        yield dim // chunk, dim % chunk, None
        return
    start, step, _ = dim
    j = lo
    while j < hi:
        p = start + step * j
        c = p // chunk
        room = ((c + 1) * chunk - 1 - p) // step if step > 0 else (p - c * chunk) // -step
        last = min(hi - 1, j + room)
        first_local, last_local = p - c * chunk, start + step * last - c * chunk
        stop = last_local + (1 if step > 0 else -1)
        yield c, slice(first_local, None if stop < 0 else stop, step), slice(j - lo, last + 1 - lo)
        j = last + 1


class SliceStream(ByteStream):
    """The elements `numpy.asarray(array)[selection]` gives, in C order, after an optional NPY header."""

    # Not an array's own elements, never read from its chunks' rows.
    is_array_stream = False
    row_reads = False

    def last_chunk_row(self, offset: int, stop: int) -> None:
        """No row of chunks of the array holds a slice's bytes in order (streams.ArrayStream)."""
        return None

    def __init__(self, meta: ArrayMeta, dims: tuple[Dim, ...], with_header: bool = True, scalar: bool = False) -> None:
        self.meta = meta
        self.dims = dims
        self.scalar = scalar
        # numpy's number scalars are in native byte order (np.asarray of one keeps it); its
        # string scalars drop trailing NULs, a width that depends on the value: those keep the array's.
        native = scalar and meta.dtype.kind in "biufcmM"
        self.dtype = meta.dtype.newbyteorder("=") if native else meta.dtype
        self.shape: Index = tuple(d[2] for d in dims if not isinstance(d, int))
        self.header = npy_header(self.dtype, self.shape, False) if with_header else b""
        self.size = len(self.header) + math.prod(self.shape) * self.dtype.itemsize
        self._reads: SliceStream | None = None

    def for_reads(self) -> SliceStream:
        """Over the inner chunks of shards that can be read in part (same bytes, finer pieces)."""
        if self.meta.inner is None:
            return self
        if self._reads is None:
            self._reads = SliceStream(self.meta.inner, self.dims, bool(self.header), self.scalar)
            self._reads.header = self.header
        return self._reads

    def _pieces(
        self, boxes: tuple[tuple[Index, Index], ...]
    ) -> Iterator[tuple[Index, tuple[int | slice, ...], int, Index, tuple[int | slice, ...]]]:
        """(chunk position, index into the chunk, box start in the buffer, box shape, slices into the box)."""
        pos = 0
        for start, box in boxes:
            per_dim, k = [], 0
            for dim, c in zip(self.dims, self.meta.chunk_shape):
                if isinstance(dim, int):
                    per_dim.append(list(_groups(dim, 0, 0, c)))
                else:
                    per_dim.append(list(_groups(dim, start[k], start[k] + box[k], c)))
                    k += 1
            for combo in itertools.product(*per_dim):
                idx = tuple(g[0] for g in combo)
                src = tuple(g[1] for g in combo)
                dst = tuple(g[2] for g in combo if g[2] is not None)
                yield idx, src, pos, box, dst
            pos += math.prod(box)

    def plan(self, offset: int, size: int) -> ReadPlan:
        header_part, e0, e1, skip, take = element_span(self.header, self.dtype.itemsize, self.size, offset, size)
        if take == 0:
            return ReadPlan(header_part, 0, 0, 0, 0, (), ())
        boxes = tuple(grid.flat_boxes(self.shape, e0, e1))
        needed = dict.fromkeys(idx for idx, *_ in self._pieces(boxes))
        return ReadPlan(header_part, e0, e1, skip, take, boxes, tuple(needed))

    def assemble(
        self, plan: ReadPlan, chunks: dict[Index, np.ndarray], out: np.ndarray | None = None
    ) -> bytes | memoryview:
        """The bytes of `plan`, given every chunk it names (full chunk shape, any layout), in
        OUT (uint8, large enough) or a fresh buffer."""

        def fill(buf: np.ndarray) -> None:
            for idx, src, pos, box, dst in self._pieces(plan.boxes):
                buf[pos : pos + math.prod(box)].reshape(box)[dst] = chunks[idx][src]

        return assemble_elements(plan, self.dtype, out, fill)
