"""Band statistics and histograms GDAL saved into gdal/PATH.vrt or raw/PATH.raw.aux.xml, kept for the mount's life."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from ..model import Node
from ..views import images
from .entries import Kind

if TYPE_CHECKING:
    from ..engine import Engine
    from .entries import Entry
    from .georefs import Georefs
    from .inodes import Inodes

Statistics = list[dict[str, str]]


class SavedStatistics:
    """Statistics by array path, with the node they are of; kept until the array changes or a
    refresh (never stored: GDAL computes them again)."""

    def __init__(
        self,
        engine: Engine,
        inodes: Inodes,
        georefs: Georefs,
        npy_name: Callable[[Node], str],
        forget_pages: Callable[[list[int]], None],
    ) -> None:
        self.engine = engine
        self.inodes = inodes
        self.georefs = georefs
        self.npy_name = npy_name  # an array's file name in the main tree
        self.forget_pages = forget_pages  # the kernel drops these files' pages
        self._kept: dict[str, tuple[Node, Statistics]] = {}
        self._epoch = 0  # counts `forget`: a rewrite parsed meanwhile is stale

    def of(self, meta: Node) -> Statistics | None:
        """The statistics kept for this node (None: none, or kept for an older node of another
        layout). A node of the same layout read again in the same epoch (a listing after a
        document, as the georeference's) holds the same values: a change of chunks forgets them."""
        kept = self._kept.get(meta.path)
        if kept is None:
            return None
        same = kept[0] is meta or getattr(kept[0], "file_layout", None) == getattr(meta, "file_layout", ())
        return kept[1] if same else None

    async def keep(self, entry: Entry, written: bytes) -> bool:
        """A rewrite of a file that saves statistics: keep the ones it adds (False, and nothing
        kept, when it changes anything else)."""
        meta, epoch = entry.array, self._epoch
        geo = await self.georefs.of(meta)  # (the text GDAL rewrote was made with it)
        # Parsed in a worker thread: a text of thousands of bands takes a while.
        if entry.kind is Kind.PAM:
            statistics = await self.engine.run_cpu(images.pam_statistics, written, meta, geo)
        else:
            statistics = await self.engine.run_cpu(images.vrt_statistics, written, meta, self.npy_name(meta), geo)
        if statistics is None:
            return False
        if epoch != self._epoch:
            return True  # the array changed (or a refresh came) while it was parsed: they are stale
        self._kept[meta.path] = (meta, statistics)
        self._changed(meta.path)
        return True

    def forget(self, path: str | None = None) -> None:
        """The array at `path` (every array when None) changed: its saved statistics are gone."""
        self._epoch += 1
        if path is None:
            if not self._kept:
                return
            self._kept.clear()
        elif self._kept.pop(path, None) is None:
            return
        self._changed(path)

    def _changed(self, path: str | None) -> None:
        """The files that show the statistics of `path` (every array when None) are made again,
        and the kernel drops what it keeps of them."""
        files = [e for e in self.inodes.all() if e.saves_statistics and (path is None or e.shown.path == path)]
        for entry in files:
            entry.stored_bytes = None
        self.forget_pages([e.inode for e in files])
