"""Previews (`.zarrfs/preview/PATH.png`): which chunks a small picture of an array needs, the picture from them, its PNG.

A preview shows a 2-D array, or the middle page (C order) of one with more dimensions,
its longest side at most MAX_SIDE pixels: block means when the page's chunks fit in
MAX_DECODED_BYTES, else pixels picked at strides from as few chunks as that bound allows
(or, for chunks that can be read a range at a time, only those pixels of them: `picks`).
Values are scaled between the LOW_PCT and HIGH_PCT percentiles to 8-bit grey; NaN is
transparent. Pure: no I/O (Pillow encodes the PNG).
"""

from __future__ import annotations

import dataclasses
import io
import math
import warnings

import numpy as np

from ..grid import Index
from ..model import ArrayMeta

# A thumbnail's size: file managers show 128-256 pixels.
MAX_SIDE = 256
# Decoded chunk bytes one preview may load (or one chunk, when a chunk is larger): a listing
# of previews stays in seconds on a local store, a few requests on a remote one.
MAX_DECODED_BYTES = 64 << 20
# A preview still loading chunks after this long is drawn from those it has (the rest transparent).
MAX_SECONDS = 10.0
# Robust scaling: a few hot pixels or a fill value do not flatten the picture.
LOW_PCT, HIGH_PCT = 1.0, 99.0
# Chunks loaded at a time (the time bound is checked between batches).
BATCH = 8


def supported(meta: ArrayMeta) -> bool:
    """2+ dimensions, none empty, a numeric or bool type."""
    return (
        len(meta.shape) >= 2
        and all(n > 0 for n in meta.shape)
        and meta.dtype.fields is None
        and meta.dtype.subdtype is None
        and meta.dtype.kind in "biufc"
    )


@dataclasses.dataclass(frozen=True)
class Plan:
    page: Index  # the index of the page over the leading dimensions
    out_shape: tuple[int, int]
    factor: int  # block size of block means
    rows: np.ndarray | None  # strided picks: source row of each output row (None: block means)
    cols: np.ndarray | None
    chunks: tuple[Index, ...]  # to load, in the array's grid


def _even_picks(items: np.ndarray, n: int) -> np.ndarray:
    """`n` of `items`, evenly spread (the middle one when n is 1)."""
    if n >= len(items):
        return items
    return items[((np.arange(n) + 0.5) * len(items) / n).astype(int)]


def plan(meta: ArrayMeta, budget: int = MAX_DECODED_BYTES) -> Plan:
    """What a preview of `meta` reads."""
    lead, (h, w) = meta.shape[:-2], meta.shape[-2:]
    page = tuple(int(i) for i in np.unravel_index(math.prod(lead) // 2, lead)) if lead else ()
    ch, cw = meta.chunk_shape[-2:]
    lead_idx = tuple(p // c for p, c in zip(page, meta.chunk_shape))
    factor = max(1, -(-max(h, w) // MAX_SIDE))
    out = (-(-h // factor), -(-w // factor))
    chunk_bytes = math.prod(meta.chunk_shape) * meta.dtype.itemsize
    grid_r, grid_c = -(-h // ch), -(-w // cw)
    if grid_r * grid_c * chunk_bytes <= budget and h * w * 8 <= budget:
        chunks = tuple(lead_idx + (i, j) for i in range(grid_r) for j in range(grid_c))
        return Plan(page, out, factor, None, None, chunks)
    rows = np.minimum(np.arange(out[0]) * factor + factor // 2, h - 1)
    cols = np.minimum(np.arange(out[1]) * factor + factor // 2, w - 1)
    crows, ccols = np.unique(rows // ch), np.unique(cols // cw)
    allowed = max(1, budget // chunk_bytes)
    if len(crows) * len(ccols) > allowed:
        n_r = max(1, min(len(crows), int(math.sqrt(allowed * len(crows) / len(ccols)))))
        n_c = max(1, min(len(ccols), allowed // n_r))
        crows, ccols = _even_picks(crows, n_r), _even_picks(ccols, n_c)
        rows = _snap(rows, crows, ch, h)
        cols = _snap(cols, ccols, cw, w)
    chunks = tuple(lead_idx + (int(i), int(j)) for i in crows for j in ccols)
    return Plan(page, out, factor, rows, cols, chunks)


def _snap(picks: np.ndarray, blocks: np.ndarray, size: int, n: int) -> np.ndarray:
    """`len(picks)` positions spread evenly over the rows (or columns) of the chosen chunk rows."""
    within = np.concatenate([np.arange(b * size, min((b + 1) * size, n)) for b in blocks])
    return within[np.linspace(0, len(within) - 1, len(picks)).round().astype(int)]


def _page_of(meta: ArrayMeta, p: Plan, idx: Index, chunk: np.ndarray) -> np.ndarray:
    """The 2-D part of a decoded chunk on the preview's page, clipped at the array's edge, as floats."""
    sub = np.asarray(chunk)[page_in_chunk(meta, p, idx)]
    h, w = meta.shape[-2:]
    ch, cw = meta.chunk_shape[-2:]
    return _floats(sub[: min(ch, h - idx[-2] * ch), : min(cw, w - idx[-1] * cw)])


def _floats(sub: np.ndarray) -> np.ndarray:
    return np.abs(sub).astype(np.float64) if sub.dtype.kind == "c" else sub.astype(np.float64)


def page_in_chunk(meta: ArrayMeta, p: Plan, idx: Index) -> Index:
    """The preview's page in chunk IDX: its index over the chunk's leading dimensions."""
    return tuple(pg - i * c for pg, i, c in zip(p.page, idx, meta.chunk_shape))


def picks(meta: ArrayMeta, p: Plan, idx: Index) -> tuple[np.ndarray, np.ndarray]:
    """The rows and columns of a strided preview (`p.rows` not None) that chunk IDX holds: their
    indices in the picture; `p.rows`/`p.cols` at them are the array's rows and columns."""
    ch, cw = meta.chunk_shape[-2:]
    assert p.rows is not None and p.cols is not None  # (callers ask only of a strided plan)
    return np.nonzero(p.rows // ch == idx[-2])[0], np.nonzero(p.cols // cw == idx[-1])[0]


def render(
    meta: ArrayMeta, p: Plan, chunks: dict[Index, np.ndarray], picked: dict[Index, np.ndarray] | None = None
) -> np.ndarray:
    """The preview's values (float64, NaN where nothing is known) from the chunks loaded, or for
    a strided preview from PICKED: a chunk's values at its `picks` alone, read without it."""
    h, w = meta.shape[-2:]
    ch, cw = meta.chunk_shape[-2:]
    if p.rows is None:
        f = p.factor
        plane = np.full((p.out_shape[0] * f, p.out_shape[1] * f), np.nan)
        for idx, chunk in chunks.items():
            sub = _page_of(meta, p, idx, chunk)
            plane[idx[-2] * ch : idx[-2] * ch + sub.shape[0], idx[-1] * cw : idx[-1] * cw + sub.shape[1]] = sub
        blocks = plane.reshape(p.out_shape[0], f, p.out_shape[1], f)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN blocks stay NaN
            return np.nanmean(blocks, axis=(1, 3))
    assert p.cols is not None  # (set with p.rows)
    out = np.full(p.out_shape, np.nan)
    for idx, values in (picked or {}).items():
        out[np.ix_(*picks(meta, p, idx))] = _floats(values)
    for idx, chunk in chunks.items():
        ri, ci = picks(meta, p, idx)
        if len(ri) and len(ci):
            sub = _page_of(meta, p, idx, chunk)
            out[np.ix_(ri, ci)] = sub[np.ix_(p.rows[ri] - idx[-2] * ch, p.cols[ci] - idx[-1] * cw)]
    return out


def scale(values: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """8-bit grey between the robust low and high percentiles of the finite values (all 0 when
    they are equal), and an alpha channel (0 at NaN) when there is a NaN."""
    finite = values[np.isfinite(values)]
    grey = np.zeros(values.shape, np.uint8)
    if finite.size:
        lo, hi = np.percentile(finite, [LOW_PCT, HIGH_PCT])
        if hi > lo:
            with np.errstate(invalid="ignore"):
                scaled = np.clip((values - lo) / (hi - lo) * 255 + 0.5, 0, 255)
            grey = np.where(np.isnan(scaled), 0, scaled).astype(np.uint8)
    nan = np.isnan(values)
    return grey, (np.where(nan, 0, 255).astype(np.uint8) if nan.any() else None)


def png(values: np.ndarray) -> bytes:
    """The PNG of a preview's values (grey, or grey and alpha)."""
    from PIL import Image  # a dependency; imported when the first preview is drawn, not at start-up

    grey, alpha = scale(values)
    image = Image.fromarray(grey, "L") if alpha is None else Image.fromarray(np.dstack([grey, alpha]), "LA")
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return buf.getvalue()
