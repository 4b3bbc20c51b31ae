"""Optional read strategies: each one off gives the same bytes, slower; tried in the order written here.

A FUSE read (Engine.read_now, then Engine.read) tries them in this order; the first that
serves the read answers it, and a read none serves takes the usual path (a plan over its
chunks, loaded through the cache, assembled):

1. small (rows.py, no await): a read under SMALL_READ_BYTES within a row or two of an array
   whose chunks are at hand. First: random readers send many, and it costs least.
2. rows (rows.py, no await): many rows in one row of chunks at hand, copied a chunk at a time.
   Before any awaiting strategy: it replies at once from what is cached.
3. bands (bands.py): a sequential reader's read inside bytes assembled ahead in worker threads.
   Before direct reads: a band already holds the bytes, whose assembly read the chunk files once.
4. direct (direct.py): uncompressed chunks of a local store copied from their files straight
   into the reply. Last: it still makes a system call per chunk piece.

Around the usual path, the sequential reader's hooks run: shard reads (shards.py: whole shards
for a remote sequential reader, plans over decoded shards), bands started ahead after a read,
and decode buffers given back by spares.py once the reader has passed their chunks.
The thresholds that gate each strategy are in gates.py.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...grid import Index
from ...views.streams import ByteStream, ReadPlan
from ..loads import Loads
from ..readahead import Prefetch, ReadAhead
from ..revalidate import Revalidation
from ..runtime import Runtime
from ..tables import ChunkTables
from . import direct
from .bands import BandReads
from .direct import DirectReads
from .gates import DIRECT_MIN_BYTES, SMALL_READ_BYTES
from .reply import ReplyBuffer
from .rows import RowReads
from .shards import ShardReads
from .spares import Spares

# The strategies in the order a read tries them (see above).
ORDER = ("small", "rows", "bands", "direct")


class FastPaths:
    """The optional read strategies of one engine, each tried by the method of its step."""

    def __init__(
        self,
        runtime: Runtime,
        tables: ChunkTables,
        loads: Loads,
        revalidation: Revalidation,
        prefetch: Prefetch,
        shards: ShardReads,
        spares: Spares,
        direct_reads: DirectReads | None,
        bands: bool,
    ) -> None:
        self.runtime = runtime
        self.reply = ReplyBuffer()
        self.rows = RowReads(tables, revalidation, self.reply)
        self.direct = direct_reads
        self.shards, self.spares = shards, spares
        self.bands = BandReads(runtime, tables, loads, prefetch, shards, spares, self.reply, direct_reads, bands)

    def read_now(
        self, stream: Any, offset: int, size: int, readahead: ReadAhead | None
    ) -> tuple[memoryview | None, str, list[Index] | None]:
        """Steps 1 and 2, with no await: (the bytes, the step's name, the chunks used (rows)),
        or (None, "", None) when neither serves the read."""
        if size < SMALL_READ_BYTES:
            data = self.rows.small_read(stream, offset, size)
            return (data, "small", None) if data is not None else (None, "", None)
        data, used = self.rows.rows_read(stream, offset, size, readahead)
        return (data, "rows", used) if data is not None else (None, "", None)

    async def from_bands(self, stream: Any, offset: int, size: int, readahead: ReadAhead) -> memoryview | None:
        """Step 3: a sequential reader's bytes from its bands (starting them first where they
        are rows of chunks read straight from their files), or None."""
        self.bands.first(stream, offset, size, readahead)
        return await self.bands.read(stream, offset, size, readahead) if readahead.bands else None

    async def from_files(self, stream: ByteStream, plan: ReadPlan, size: int) -> bytes | memoryview | None:
        """Step 4: a read of an eligible stream straight from its chunk files, or None.

        From the OS's page cache in this thread into the reused reply buffer (no await
        between filling it and returning); what would wait for a disk, in a worker thread
        into a buffer of its own."""
        reads = self.direct
        if reads is None or size < DIRECT_MIN_BYTES or not direct.worth(stream, plan, size):
            return None
        need = stream.element_bytes(plan)
        self.reply.room(need)
        try:
            data = reads.read_sync(stream, plan, self.reply.buf, nowait=True)
        except direct.WouldBlock:
            try:
                data = await self.runtime.run_io(reads.read_sync, stream, plan, np.empty(need, np.uint8), False)
            except direct.Fallback:
                return None
        except direct.Fallback:
            return None
        self.runtime.counters["direct_reads"] += 1
        self.runtime.counters["direct_bytes"] += plan.take_bytes
        return data

    def after_read(self, stream: Any, offset: int, size: int, readahead: ReadAhead, pieces: int) -> None:
        """After a sequential reply (from the cache or the chunk files) cut into PIECES chunks:
        start its bands ahead, if its pieces are small or its copies transpose."""
        self.bands.ahead(stream, offset, size, readahead, pieces)

    def drop(self) -> None:
        """Cached chunks were dropped: close the kept chunk files (bands and decoders of the
        old generation are not used again: ChunkTables.generation)."""
        if self.direct is not None:
            self.direct.close()
