"""Making previews through the engine: the chunks a preview plans, loaded in batches within its time bound, the PNG cached per array.

Runs in the trio thread (awaits engine calls, imports no trio); encoding runs in a worker.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from . import preview
from .errors import ZarrfsError
from .model import ArrayMeta

log = logging.getLogger(__name__)

# PNGs kept (each at most 256x256 grey and alpha, about 130 KB uncompressed): oldest dropped first.
MAX_CACHED = 4096


class Previews:
    """PNG bytes of previews, made once per array (per metadata seen) and kept."""

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
        chunks: dict = {}
        wanted = list(p.chunks)
        for start in range(0, len(wanted), preview.BATCH):
            if time.monotonic() > deadline:
                log.warning("preview of %s: %d of %d chunks loaded in %.0f s; the rest is drawn transparent",
                            meta.path or "/", len(chunks), len(wanted), preview.MAX_SECONDS)
                break
            try:
                got = await self.engine.chunks(meta, wanted[start:start + preview.BATCH])
            except ZarrfsError as e:  # the engine logged the key; the picture goes on without them
                log.warning("preview of %s: chunks %s drawn transparent: %s", meta.path or "/",
                            wanted[start:start + preview.BATCH], e)
                continue
            chunks.update(got)
            self.engine.counters["preview_chunks"] += len(got)
            self.engine.counters["preview_decoded_bytes"] += sum(c.nbytes for c in got.values())
        self.engine.counters["previews"] += 1
        values = preview.render(meta, p, chunks)
        return await self.engine.run_io(preview.png, values)
