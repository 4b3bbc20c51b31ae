"""EngineConfig: what an engine is told when it is built (its optional strategies and bounds)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from ..storage.base import BaseStore

if TYPE_CHECKING:
    from ..options import Options

# The `timeout` option's default (options.Options.timeout_s) for engines built without it (tests).
DEFAULT_TIMEOUT_S = 30.0
# Dirty (written, not yet stored) chunks are flushed oldest first beyond this budget, so a
# streaming copy of any size holds at most this much: a few chunk rows of a large array.
# Past a quarter of it the oldest are stored in the background while the writer goes on.
DIRTY_MAX_BYTES = 256 << 20


@dataclasses.dataclass(frozen=True)
class EngineConfig:
    """An engine's settings, fixed for its life. The defaults are a writable mount's (no fast
    path that needs the store to stay unchanged under it): what tests build without options."""

    timeout_s: float = DEFAULT_TIMEOUT_S  # the longest wait of one store call (the `timeout` option)
    # Uncompressed chunks copied straight from the files that hold them (fastpath/direct.py: a
    # local store's, a local Icechunk repository's): read-only mounts only, where no written chunk
    # can be newer than its file.
    direct_reads: bool = False
    bands: bool = False  # sequential readers served from bands assembled ahead (fastpath/bands.py)
    recycle: bool = False  # decode buffers given back by sequential readers (fastpath/spares.py)
    # Chunks a sequential reader has passed leave the cache, so that the allocator gives their
    # memory to the next loads (fastpath/spares.py): read-only mounts of stores on local disk
    # whose chunks come in buffers of the store's own (an Icechunk repository read by icechunk 1.x).
    drop_behind: bool = False
    dirty_max_bytes: int = DIRTY_MAX_BYTES
    # Read-ahead's bound; None: by the store's kind and the cache's size (readahead.window_bound).
    prefetch_max_bytes: int | None = None
    decoder_thread_name: str = "zarrfs-decode"  # the decoding threads' name (workers.py)

    @classmethod
    def for_mount(cls, options: Options, store: BaseStore) -> EngineConfig:
        """The configuration of a mount of STORE with OPTIONS (options.Options): the fast paths
        that need a store nothing else writes through this mount run on read-only mounts, those
        that read chunk files where the store has them; stores on local disk with no files to read
        drop what a reader has passed."""
        read_only = not options.writable
        return cls(
            timeout_s=options.timeout_s,
            direct_reads=store.chunk_files and read_only,
            bands=read_only,
            recycle=store.chunk_files and read_only,
            drop_behind=read_only and store.on_local_disk and not store.chunk_files,
        )
