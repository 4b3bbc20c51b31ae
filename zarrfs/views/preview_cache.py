"""Making previews through the engine: the chunks a preview plans, loaded in batches within its time bound, the PNG cached per array.

Runs in the trio thread (awaits engine calls, imports no trio); encoding runs in a worker.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np

from ..errors import ZarrfsError
from ..grid import Index
from ..model import ArrayMeta
from . import preview
from .streams import ArrayStream

log = logging.getLogger(__name__)

# PNGs kept (each at most 256x256 grey and alpha, about 130 KB uncompressed): oldest dropped first.
MAX_CACHED = 4096
# A strided preview of chunks read a range at a time reads its picked rows of a chunk whole
# (between their first and last picked column) while they take at most this; else pixel by pixel.
ROWS_MAX_BYTES = 16 << 20


class PreviewCache:
    """PNG bytes of previews (preview.py), made through the engine once per array (per metadata seen) and kept."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self._cache: dict[str, tuple[ArrayMeta, bytes]] = {}

    async def get(self, meta: ArrayMeta) -> bytes:
        hit = self._cache.get(meta.path)
        if hit is not None and hit[0] is meta:
            return hit[1]

        async def make() -> bytes:
            data = await self._make(meta)
            if len(self._cache) >= MAX_CACHED:
                self._cache.pop(next(iter(self._cache)))
            self._cache[meta.path] = (meta, data)
            return data

        return await self.engine.once(("preview", meta.path, id(meta)), make)

    async def _make(self, meta: ArrayMeta) -> bytes:
        p = preview.plan(meta)
        deadline = time.monotonic() + preview.MAX_SECONDS
        if p.rows is not None and self.engine.streamed(ArrayStream(meta)):
            # (chunks larger than the cache: their picked pixels alone, never a whole chunk)
            values = preview.render(meta, p, {}, await self._picked(meta, p, deadline))
            return await self.engine.run_io(preview.png, values)
        chunks: dict[Index, np.ndarray] = {}
        wanted = list(p.chunks)
        for start in range(0, len(wanted), preview.BATCH):
            if time.monotonic() > deadline:
                log.warning(
                    "preview of %s: %d of %d chunks loaded in %.0f s; the rest is drawn transparent",
                    meta.path or "/",
                    len(chunks),
                    len(wanted),
                    preview.MAX_SECONDS,
                )
                break
            try:
                got = await self.engine.chunks(meta, wanted[start : start + preview.BATCH])
            except ZarrfsError as e:  # the engine logged the key; the picture goes on without them
                log.warning(
                    "preview of %s: chunks %s drawn transparent: %s",
                    meta.path or "/",
                    wanted[start : start + preview.BATCH],
                    e,
                )
                continue
            chunks.update(got)
            self.engine.counters["preview_chunks"] += len(got)
            self.engine.counters["preview_decoded_bytes"] += sum(c.nbytes for c in got.values())
        self.engine.counters["previews"] += 1
        values = preview.render(meta, p, chunks)
        return await self.engine.run_io(preview.png, values)

    async def _picked(self, meta: ArrayMeta, p: preview.Plan, deadline: float) -> dict[Index, np.ndarray]:
        """A strided preview's values of each of its chunks at their `picks` (the plan's
        chunks in turn, within the time bound), read through the engine's ranged decoding."""
        picked: dict[Index, np.ndarray] = {}
        ch, cw = meta.chunk_shape[-2:]
        assert p.rows is not None and p.cols is not None  # (a strided plan)
        ones = (1,) * (len(meta.shape) - 2)
        for n, idx in enumerate(p.chunks):
            if time.monotonic() > deadline:
                log.warning(
                    "preview of %s: %d of %d chunks read in %.0f s; the rest is drawn transparent",
                    meta.path or "/",
                    n,
                    len(p.chunks),
                    preview.MAX_SECONDS,
                )
                break
            ri, ci = preview.picks(meta, p, idx)
            if not len(ri) or not len(ci):
                continue
            lead = tuple(slice(i, i + 1) for i in preview.page_in_chunk(meta, p, idx))
            rows = p.rows[ri] - idx[-2] * ch
            cols = p.cols[ci] - idx[-1] * cw
            c0, c1 = int(cols[0]), int(cols[-1]) + 1
            values = np.empty((len(ri), len(ci)), meta.dtype)
            if len(ri) * (c1 - c0) * meta.dtype.itemsize <= ROWS_MAX_BYTES:
                lines = np.empty((len(ri), c1 - c0), meta.dtype)
                parts = [
                    (lead + (slice(int(r), int(r) + 1), slice(c0, c1)), lines[a : a + 1].reshape(ones + (1, -1)))
                    for a, r in enumerate(rows)
                ]
            else:
                lines = None
                parts = [
                    (
                        lead + (slice(int(r), int(r) + 1), slice(int(c), int(c) + 1)),
                        values[a : a + 1, b : b + 1].reshape(ones + (1, 1)),
                    )
                    for a, r in enumerate(rows)
                    for b, c in enumerate(cols)
                ]
            try:
                decoded = await self.engine.read_boxes(meta, idx, parts)
            except ZarrfsError as e:  # the engine logged the key; the picture goes on without it
                log.warning("preview of %s: chunk %s drawn transparent: %s", meta.path or "/", idx, e)
                continue
            if lines is not None:
                values[...] = lines[:, cols - c0]
            picked[idx] = values
            self.engine.counters["preview_chunks"] += 1
            self.engine.counters["preview_decoded_bytes"] += decoded
        self.engine.counters["previews"] += 1
        return picked
