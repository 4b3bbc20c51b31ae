"""The georeference each image view of an array carries: planned from its group's nodes, its coordinates read through the engine, kept per node.

Part of the Namespace (runs in the trio thread). What cannot be georeferenced is said once
in the log (INFO: the views are the same as without georeferencing); a refresh forgets
everything (coordinates may have been written since).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import numpy as np

from ..errors import ZarrfsError
from ..model import ArrayMeta
from ..repeats import LogOnce
from ..views import georef
from ..views.georef import GeoReference
from ..views.streams import ArrayStream

if TYPE_CHECKING:
    from ..engine import Engine
    from .freshness import Freshness
    from .listings import Listings

log = logging.getLogger(__name__)

# Georeferences kept (each a few hundred bytes and its WKT, shared with the store's node): the
# oldest is dropped first, and made again when next needed.
MAX_KEPT = 4096


class Georefs:
    """GeoReference of arrays by path, with the node it was made for (None: not georeferenced)."""

    def __init__(self, engine: Engine, freshness: Freshness, listings: Listings) -> None:
        self.engine = engine
        self.freshness = freshness  # (its epoch: a refresh came)
        self.listings = listings
        self._kept: dict[str, tuple[ArrayMeta, GeoReference | None]] = {}
        self._said = LogOnce()

    async def of(self, meta: ArrayMeta) -> GeoReference | None:
        """The georeference of `meta` (None: it has none), made once per node."""
        kept = self._kept.get(meta.path)
        if kept is not None and kept[0] is meta:
            return kept[1]
        epoch = self.freshness.epoch

        async def make() -> GeoReference | None:
            geo = await self._make(meta)
            if epoch == self.freshness.epoch:  # (else made before a refresh: its callers' alone)
                self._kept.pop(meta.path, None)
                if len(self._kept) >= MAX_KEPT:
                    self._kept.pop(next(iter(self._kept)))
                self._kept[meta.path] = (meta, geo)
            return geo

        return await self.engine.once(("georef", meta.path, id(meta), epoch), make)

    def forget(self) -> None:
        """A refresh: every georeference is made again when next needed."""
        self._kept.clear()
        self._said.forget()

    async def _make(self, meta: ArrayMeta) -> GeoReference | None:
        if not meta.path or not georef.may_be_raster(meta):
            return None  # (a root array has no group to hold coordinates)
        parent = meta.path.rsplit("/", 1)[0] if "/" in meta.path else ""
        try:
            siblings = await self.listings.nodes_below(parent)
        except ZarrfsError:  # (the listing logged why)
            return None
        plan = georef.plan(meta, siblings)
        if plan is None:
            return None
        geo, why = None, plan.why
        if plan.y is not None and plan.x is not None:
            try:
                geo, why = plan.resolve(await self._values(plan.y), await self._values(plan.x))
            except ZarrfsError as e:  # (the engine logged the key)
                geo, _ = plan.resolve(None, None)
                why = "; ".join(w for w in (f"its coordinates could not be read: {e}", plan.why) if w)
        elif plan.geotransform is not None:
            geo, why = plan.resolve(None, None)
        if why is not None and self._said.first(meta.path):
            where = "not georeferenced" if geo is None else "placed without a CRS" if geo.crs is None else "placed"
            log.info("%s: %s: its image views are %s", meta.path, why, where)
        return geo

    async def _values(self, meta: ArrayMeta) -> np.ndarray:
        """Every value of a 1-D coordinate array."""
        stream = ArrayStream(meta, "C", with_header=False)
        data = await self.engine.read(stream, 0, stream.size)
        return np.frombuffer(data, meta.dtype)
