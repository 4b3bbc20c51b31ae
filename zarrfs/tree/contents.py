"""What a file's attributes need: its stored bytes, and the bytes or layout of a generated file.

Generated files (info JSON, ENVI/VRT/PAM texts, previews, a group's netCDF file, log.json,
stats.json) are made when their attributes are first asked for, and again after they
were dropped (a change, a refresh, saved statistics).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from .. import grid
from ..errors import Stale, ZarrfsError
from ..model import ArrayMeta, GroupMeta, Node
from ..repeats import LogOnce
from ..views import images, netcdf, ngff, ometiff, registry
from ..views.kinds import Kind
from ..views.preview_cache import PreviewCache

if TYPE_CHECKING:
    from ..engine import Engine
    from ..formats.base import Hierarchy
    from .entries import Entry
    from .freshness import Freshness
    from .georefs import Georefs
    from .listings import Listings
    from .statistics import SavedStatistics
    from .versions import Versions

log = logging.getLogger(__name__)


class Contents:
    """Settles entries: fills in stored bytes and the contents of generated files."""

    def __init__(
        self,
        engine: Engine,
        hierarchy: Hierarchy,
        *,
        freshness: Freshness,
        listings: Listings,
        versions: Versions,
        georefs: Georefs,
        statistics: SavedStatistics,
        root_stem: str,
        npy_name: Callable[[Node], str],
        stats_bytes: Callable[[], bytes],
    ) -> None:
        self.engine = engine
        self.hierarchy = hierarchy
        self.freshness, self.listings, self.versions = freshness, listings, versions
        self.georefs, self.statistics = georefs, statistics
        self.root_stem = root_stem  # the name of a root array (its store's)
        self.npy_name = npy_name  # an array's file name in the main tree
        self.stats_bytes = stats_bytes  # stats.json now
        # Remote stores: an array's stored bytes cost a listing of its chunks, so stat reports the
        # logical size until info/ asked for them (docs/REMOTE.md).
        self.stored_sizes_lazy = not hierarchy.store.is_local
        self.previews = PreviewCache(engine)
        self._ome_said = LogOnce()  # (image, reason) pairs logged

    async def settle(self, entry: Entry) -> None:
        """Fill in what an entry's attributes need (after following what the store holds now):
        stored bytes, sizes of generated files."""
        listings = self.listings
        await self.freshness.follow(entry)
        if isinstance(entry.error, Stale):  # (the kernel looks its name up again: errors.Stale)
            raise entry.error
        repository = self.versions.repository
        if entry.kind is Kind.VERSIONLOG and repository is not None and entry.key != repository.snapshot_id:
            entry.stored_bytes = None  # the mount shows another snapshot: its log is another
        if entry.stored_bytes is not None or entry.error is not None:
            return
        if entry.kind is Kind.ARRAY and entry.node is None:  # created, no header yet
            entry.stored_bytes = 0
        elif entry.kind is Kind.ARRAY or entry.kind is Kind.CHUNK:
            lazy = self.stored_sizes_lazy and not listings.has_sizes(entry.array.path)
            sizes = None if lazy else await listings.stored_sizes(entry.array)
            if sizes is None:
                entry.stored_bytes = entry.size
            elif entry.kind is Kind.ARRAY:
                entry.stored_bytes = sum(s or 0 for s in sizes.values())
            else:
                entry.stored_bytes = await self._chunk_stored_bytes(entry, sizes)
        elif entry.kind is Kind.INFO:
            entry.content = registry.info_json(
                entry.shown, await listings.stored_sizes(entry.node) if isinstance(entry.node, ArrayMeta) else None
            )
            entry.size = entry.stored_bytes = len(entry.content)
        elif entry.kind in (Kind.TEXT, Kind.PAM):
            meta = entry.array
            geo = await self.georefs.of(meta)
            statistics = self.statistics.of(meta)
            entry.content = (
                images.pam(meta, statistics)
                if entry.kind is Kind.PAM
                else images.text(entry.view, meta, self.npy_name(meta), statistics, geo)
            )
            entry.size = entry.stored_bytes = len(entry.content)
        elif entry.kind is Kind.TIFF:
            await self._lay_out_tiff(entry)
        elif entry.kind is Kind.PREVIEW:
            entry.content = await self.previews.get(entry.array)
            entry.size = entry.stored_bytes = len(entry.content)
        elif entry.kind is Kind.STOREKEY:
            if entry.size < 0:
                size = await self.engine.run_io(self.hierarchy.store.size_sync, entry.known_key)
                entry.size = size or 0
            entry.stored_bytes = entry.size
        elif entry.kind is Kind.STATS:
            entry.size = 0 if entry.view == "refresh" else len(self.stats_bytes())
            entry.stored_bytes = 0
        elif entry.kind is Kind.NETCDF:
            await self._settle_netcdf(entry)
        elif entry.kind is Kind.OMETIFF:
            layout = entry.laid_out or await self.ome_tiff(entry.group)
            if layout is None:
                raise ZarrfsError(f"ome-tiff/{entry.group.path or self.root_stem}: the image cannot be shown")
            entry.lay_out(layout)
            entry.size = entry.stored_bytes = layout.size
        elif entry.kind is Kind.VERSIONLOG:
            await self.versions.settle_log(entry)
        else:
            entry.stored_bytes = entry.size

    async def _lay_out_tiff(self, entry: Entry) -> None:
        """A TIFF's header holds the array's georeference (GeoTIFF tags): made before its size is known."""
        node = entry.array
        if entry.laid_out is None:
            geo = await self.georefs.of(node)
            if entry.node is node and entry.laid_out is None:  # (else shown another node meanwhile)
                entry.lay_out(images.tiff_stream(node, geo, entry.hints))
        entry.stored_bytes = entry.size

    async def _settle_netcdf(self, entry: Entry) -> None:
        """Lay out a group's netCDF file from its arrays (what it leaves out is logged, and said in the file)."""
        group = entry.shown
        children = await self.listings.nodes_below(group.path)
        fit = {
            meta.path
            for meta in netcdf.group_arrays(children)
            if netcdf.scan_wanted(meta) and await self._fits_int32(meta)
        }
        nc = netcdf.group_file(group.attributes, children, fit)
        if nc.left_out:
            log.warning("netcdf/%s: left out: %s", group.path or self.root_stem, "; ".join(nc.left_out))
        entry.lay_out(nc)
        entry.size = entry.stored_bytes = nc.size

    async def ome_tiff(self, group: GroupMeta) -> ometiff.OmeTiff | None:
        """The OME-TIFF of an NGFF image group, or None when it cannot be one (said once in the
        log, as are levels left out of its pyramid)."""
        name = group.path or self.root_stem
        try:
            img = ngff.image(group.attributes)
            levels = [await self._level(group.path, path) for path in img.paths]
            kept, notes = ngff.pyramid(img, levels)
        except (ngff.NotShown, ZarrfsError) as e:
            if self._ome_said.first((group.path, str(e))):
                log.warning("ome-tiff/%s.ome.tif: not shown: %s", name, e)
            return None
        for note in notes:
            if self._ome_said.first((group.path, note)):
                log.warning("ome-tiff/%s.ome.tif: %s: left out of the pyramid", name, note)
        low, high = await self._value_range(kept) if ngff.scan_wanted(kept) else (None, None)
        try:
            ome_type = ngff.pixel_type(kept[0].dtype, low, high)
        except ngff.NotShown as e:
            if self._ome_said.first((group.path, str(e))):
                log.warning("ome-tiff/%s.ome.tif: not shown: %s", name, e)
            return None
        xml = ngff.ome_xml(img, img.name or name.rsplit("/", 1)[-1], kept[0].shape, ome_type)
        return ometiff.OmeTiff(kept, np.dtype(ngff.PIXEL_DTYPES[ome_type]), xml)

    async def _value_range(self, levels: list[ArrayMeta]) -> tuple[int | None, int | None]:
        """The least and greatest value of (small) integer levels; (None, None) when their
        chunks cannot be read (the image is then not shown)."""
        low, high = None, None
        for meta in levels:
            wanted = list(grid.all_chunks(meta.shape, meta.chunk_shape))
            try:
                chunks = await self.engine.chunks(meta, wanted)
            except ZarrfsError as e:  # the engine logged the key
                log.warning("ome-tiff: the values of %s could not be read: %s", meta.path, e)
                return None, None
            for idx in wanted:
                valid = chunks[idx][tuple(slice(0, n) for n in grid.data_shape(idx, meta.shape, meta.chunk_shape))]
                if valid.size:
                    lo, hi = int(valid.min()), int(valid.max())
                    low, high = lo if low is None else min(low, lo), hi if high is None else max(high, hi)
        return low, high

    async def _level(self, group: str, path: str) -> ArrayMeta | None:
        """The array at PATH below GROUP (a child from the group's listing), or None."""
        full = f"{group}/{path}" if group else path
        if "/" in path:
            node = await self.freshness.node_now(full)
        else:
            node = next((n for n in await self.listings.nodes_below(group) if n.path == full), None)
        return node if isinstance(node, ArrayMeta) else None

    async def _fits_int32(self, meta: ArrayMeta) -> bool:
        """Whether every value of a (small) 64-bit integer array fits netCDF's int; when its
        chunks cannot be read, no (the variable stays 64-bit)."""
        wanted = list(grid.all_chunks(meta.shape, meta.chunk_shape))
        try:
            chunks = await self.engine.chunks(meta, wanted)
        except ZarrfsError as e:  # the engine logged the key
            log.warning("netcdf: %s kept 64-bit (CDF-5): its values could not be read: %s", meta.path, e)
            return False
        return all(
            netcdf.fits_int32(
                chunks[idx][tuple(slice(0, n) for n in grid.data_shape(idx, meta.shape, meta.chunk_shape))]
            )
            for idx in wanted
        )

    async def _chunk_stored_bytes(self, entry: Entry, sizes: dict[str, int | None]) -> int:
        meta = entry.array
        stored = sizes.get(meta.chunk_key(entry.position)) or 0
        inner_size = getattr(meta.source, "stored_nbytes_sync", None)
        if inner_size is not None and stored:  # an inner chunk: its part of the shard
            try:
                stored = await self.engine.run_io(inner_size, self.hierarchy.store, entry.origin)
            except ZarrfsError as e:
                log.info("stored size of chunk %s of %s unknown: %s", entry.origin, meta.path or "/", e)
        return stored
