"""A tile-ordered byte layout of an array (TIFF tiles): file offset <-> the chunk regions under each tile.

The last two dimensions are a plane's rows and columns; every other index is a plane, in C
order. Each plane is cut into tiles of TILE_H x TILE_W elements, row of tiles by row of
tiles, each tile's elements in C order and padded with zeros past the array's edge. A read
of bytes [offset, offset+size) becomes a plan (the tiles' boxes, the chunks under them)
and, once those chunks are decoded, an assembly of the bytes. Pure: no I/O, no trio.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from .. import grid
from ..errors import ZarrfsError
from ..grid import Index
from ..model import ArrayMeta
from .streams import assemble_elements, element_span


@dataclasses.dataclass(frozen=True)
class TileBox:
    """Elements [pos, pos + rows*cols) of a read: a box of one tile, rows x cols, whose first
    `valid_rows` x `valid_cols` lie in the array at (plane index `lead`, y, x); the rest is padding."""

    pos: int
    lead: Index
    y: int
    x: int
    rows: int
    cols: int
    valid_rows: int
    valid_cols: int


@dataclasses.dataclass(frozen=True)
class TilePlan:
    header_part: bytes
    first_elem: int
    stop_elem: int
    skip_bytes: int
    take_bytes: int
    boxes: tuple[TileBox, ...]
    chunks: tuple[Index, ...]  # grid positions to load


class TileStream:
    """An array's planes as TIFF tiles, tile after tile, in a dtype of the writer's (converted
    while assembled: byte order, float16 as float32)."""

    # The stream protocol (streams.ArrayStream): not an array's own elements in C or F order.
    is_array_stream = False
    row_reads = False
    header = b""
    chunk = None  # (the whole array's tiles, not one chunk's)

    def __init__(self, meta: ArrayMeta, tile_h: int, tile_w: int, dtype: np.dtype, narrowed: bool = False) -> None:
        if len(meta.shape) < 2 or tile_h < 1 or tile_w < 1:
            raise ValueError(f"no tiles of an array of shape {meta.shape}")
        self.meta = meta
        self.dtype = dtype
        # 64-bit integers shown in a narrower type their values were found to fit (labels): a
        # value written since that does not fit is an error, never a wrapped value.
        self.narrowed = narrowed
        self.tile_h, self.tile_w = tile_h, tile_w
        self.lead_shape = meta.shape[:-2]
        self.planes = math.prod(self.lead_shape)
        height, width = meta.shape[-2:]
        self.tiles_down, self.tiles_across = -(-height // tile_h), -(-width // tile_w)
        self.tiles_per_plane = self.tiles_down * self.tiles_across
        self.tile_elems = tile_h * tile_w
        self.tile_bytes = self.tile_elems * dtype.itemsize
        self.size = self.planes * self.tiles_per_plane * self.tile_bytes
        self._reads: TileStream | None = None

    def last_chunk_row(self, offset: int, stop: int) -> None:
        """No row of chunks of the array holds a tile stream's bytes in order (streams.ArrayStream)."""
        return None

    def chunk_row_bytes(self) -> int:
        """Bytes of one row of tiles of one plane (what a row of chunks covers, roughly)."""
        return min(self.size, self.tiles_across * self.tile_bytes)

    def for_reads(self) -> TileStream:
        """Over the inner chunks of shards that can be read in part (same bytes, finer pieces)."""
        if self.meta.inner is None:
            return self
        if self._reads is None:
            self._reads = TileStream(self.meta.inner, self.tile_h, self.tile_w, self.dtype, self.narrowed)
        return self._reads

    def chunk_end(self, idx: Index) -> int:
        """The stream offset past the last tile holding elements of chunk IDX (its grid position):
        a sequential reader past it is done with the chunk."""
        lead_chunks = self.meta.chunk_shape[:-2]
        ch, cw = self.meta.chunk_shape[-2:]
        height, width = self.meta.shape[-2:]
        last = tuple(min((i + 1) * c, n) - 1 for i, c, n in zip(idx[:-2], lead_chunks, self.lead_shape))
        plane = int(np.ravel_multi_index(last, self.lead_shape)) if self.lead_shape else 0
        row = (min((idx[-2] + 1) * ch, height) - 1) // self.tile_h
        col = (min((idx[-1] + 1) * cw, width) - 1) // self.tile_w
        return self.tile_offset(plane, row, col) + self.tile_bytes

    def tile_offset(self, plane: int, row: int, col: int) -> int:
        """Where a tile's bytes start in the stream."""
        return ((plane * self.tiles_down + row) * self.tiles_across + col) * self.tile_bytes

    def _boxes(self, e0: int, e1: int) -> list[TileBox]:
        """The boxes of elements [e0, e1): each tile's part cut into at most three row boxes."""
        th, tw, te = self.tile_h, self.tile_w, self.tile_elems
        height, width = self.meta.shape[-2:]
        out = []
        for g in range(e0 // te, -(-e1 // te)):
            plane, k = divmod(g, self.tiles_per_plane)
            r, c = divmod(k, self.tiles_across)
            lead = tuple(np.unravel_index(plane, self.lead_shape)) if self.lead_shape else ()
            base = g * te
            for (i, j), (bi, bj) in grid.flat_boxes((th, tw), max(e0 - base, 0), min(e1 - base, te)):
                y, x = r * th + i, c * tw + j
                out.append(
                    TileBox(
                        base + i * tw + j - e0,
                        tuple(int(v) for v in lead),
                        y,
                        x,
                        bi,
                        bj,
                        max(0, min(bi, height - y)),
                        max(0, min(bj, width - x)),
                    )
                )
        return out

    def plan(self, offset: int, size: int) -> TilePlan:
        header_part, e0, e1, skip, take = element_span(b"", self.dtype.itemsize, self.size, offset, size)
        if take == 0:
            return TilePlan(header_part, 0, 0, 0, 0, (), ())
        boxes = tuple(self._boxes(e0, e1))
        lead_chunks = self.meta.chunk_shape[:-2]
        ch, cw = self.meta.chunk_shape[-2:]
        needed: dict[Index, None] = {}
        for b in boxes:
            if b.valid_rows and b.valid_cols:
                lead = tuple(i // c for i, c in zip(b.lead, lead_chunks))
                for cy in range(b.y // ch, (b.y + b.valid_rows - 1) // ch + 1):
                    for cx in range(b.x // cw, (b.x + b.valid_cols - 1) // cw + 1):
                        needed[(*lead, cy, cx)] = None
        return TilePlan(header_part, e0, e1, skip, take, boxes, tuple(needed))

    def assemble(
        self, plan: TilePlan, chunks: dict[Index, np.ndarray], out: np.ndarray | None = None
    ) -> bytes | memoryview:
        """The bytes of `plan`, given every chunk it names (full chunk shape, any layout), in
        OUT (uint8, large enough) or a fresh buffer."""
        return assemble_elements(plan, self.dtype, out, lambda buf: self._fill(plan, chunks, buf))

    def _fill(self, plan: TilePlan, chunks: dict[Index, np.ndarray], buf: np.ndarray) -> None:
        """BUF (the plan's whole elements) gets each tile box's values, zero past the image's edge."""
        lead_chunks = self.meta.chunk_shape[:-2]
        ch, cw = self.meta.chunk_shape[-2:]
        for b in plan.boxes:
            box = buf[b.pos : b.pos + b.rows * b.cols].reshape(b.rows, b.cols)
            box[b.valid_rows :] = 0
            box[: b.valid_rows, b.valid_cols :] = 0
            if not (b.valid_rows and b.valid_cols):
                continue
            lead_idx = tuple(i // c for i, c in zip(b.lead, lead_chunks))
            within = tuple(i % c for i, c in zip(b.lead, lead_chunks))
            y1, x1 = b.y + b.valid_rows, b.x + b.valid_cols
            for cy in range(b.y // ch, (y1 - 1) // ch + 1):
                lo_y, hi_y = max(b.y, cy * ch), min(y1, (cy + 1) * ch)
                for cx in range(b.x // cw, (x1 - 1) // cw + 1):
                    lo_x, hi_x = max(b.x, cx * cw), min(x1, (cx + 1) * cw)
                    chunk = chunks[(*lead_idx, cy, cx)]
                    region: tuple[Any, ...] = (
                        *within,
                        slice(lo_y - cy * ch, hi_y - cy * ch),
                        slice(lo_x - cx * cw, hi_x - cx * cw),
                    )
                    src = chunk[region]
                    if self.narrowed:
                        self._check_fits(src)
                    box[lo_y - b.y : hi_y - b.y, lo_x - b.x : hi_x - b.x] = src

    def _check_fits(self, values: np.ndarray) -> None:
        info = np.iinfo(self.dtype)
        if values.size and (values.min() < info.min or values.max() > info.max):
            raise ZarrfsError(
                f"{self.meta.path}: values written after its OME-TIFF was laid out no longer fit "
                f"its {self.dtype.name} pixels"
            )
