"""Freshness of what the namespace holds: listings, metadata and cached chunks are trusted for `metadata_ttl`, then asked again.

A mixin of Namespace (runs in the trio thread, like it). zarrfs adds no coordination of
its own between clients of one store: after the TTL (or `cat MOUNT/.zarrfs/refresh`) the
listings, consolidated metadata and stored sizes are dropped and read again when next
needed, and cached chunks that no write of this mount holds are dropped and read again.
"""

from __future__ import annotations

import logging
import math
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .namespace import Namespace

log = logging.getLogger(__name__)

REFRESH_FILE = "refresh"


class NamespaceFreshness:
    """Drops listings and metadata older than `metadata_ttl_s` (inf: never, unless refreshed)."""

    metadata_ttl_s: float = math.inf
    _fresh_since: float = 0.0

    def start_fresh(self: "Namespace", metadata_ttl_s: float) -> None:
        self.metadata_ttl_s = metadata_ttl_s
        self._fresh_since = time.monotonic()

    def _array_changed(self: "Namespace", path: str) -> None:
        """Chunks of the array at `path` changed in the store: the kernel drops its files' pages (in
        the background: a read of that array may hold one of them locked until it is answered)."""
        self.forget_statistics(path)
        files = [e.inode for e in self._entries.values()
                 if not e.is_dir and e.node is not None and getattr(e.node, "path", None) == path]
        if files and self.on_data_stale_sync is not None:
            self.engine.start_soon_thread(self.on_data_stale_sync, files)

    async def revalidate(self: "Namespace", force: bool = False) -> None:
        """Drop what is older than the TTL (everything when `force`), before a listing or lookup uses it."""
        now = time.monotonic()
        if not force and now - self._fresh_since <= self.metadata_ttl_s:
            return
        self._fresh_since = now
        reread = getattr(self.hierarchy, "reread_consolidated_sync", None)
        if reread is not None:
            await self.engine.run_io(reread)
        self._invalidate()
        self._sizes.clear()
        self.forget_statistics()
        for entry in self._entries.values():
            if entry.kind in ("array", "chunk") and entry.writing is None and entry.held is None:
                entry.stored_bytes = None  # settled again from what the store holds now
        if force:
            self.engine.drop_clean_chunks()
        else:  # checked against the store when next read (engine/revalidate.py)
            self.engine.chunks_stale()
        if force and self.on_data_stale_sync is not None:  # the kernel may keep pages (metadata_ttl=inf)
            files = [e.inode for e in self._entries.values() if not e.is_dir and e.kind != "stats"]
            if files:
                await self.engine.run_io(self.on_data_stale_sync, files)
        log.debug("listings, metadata and cached chunks dropped (%s)", "refresh" if force else "metadata_ttl")
