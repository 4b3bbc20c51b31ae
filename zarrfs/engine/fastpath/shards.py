"""Shard reads: whole shards, one request each, for a remote sequential reader; plans over shards decoded whole.

Both are optional: off, a read plans over inner chunks and loads each through its shard's
index and ranges, the same bytes with more requests and more copies.
"""

from __future__ import annotations

import logging

from ...views.streams import ByteStream, ReadPlan
from ..readahead import ReadAhead, WholeShards
from ..runtime import Runtime
from ..tables import ChunkTables
from .gates import SEQUENTIAL_START_BYTES

log = logging.getLogger(__name__)


class ShardReads(WholeShards):
    """Which plan a read of a sharded array takes, and whether its reader loads shards whole."""

    def __init__(self, runtime: Runtime, tables: ChunkTables, window_bytes: int) -> None:
        self.runtime, self.tables = runtime, tables
        self.window_bytes = window_bytes  # read-ahead's bound: a whole shard must fit in it

    def whole(self, stream: ByteStream) -> bool:
        """Whether a sequential reader of this array loads shards whole, it and its read-ahead:
        a remote array of shards that fit in the read-ahead budget.

        On a remote store a request costs a round trip, as much as megabytes of transfer: one
        GET of a whole shard (its index inside) replaces an index request and a range request
        per read and per window step. Random readers still fetch only the index and the inner
        chunks they need; local stores read inner chunks as before.
        """
        meta, store = stream.meta, self.runtime.store
        return (
            meta.inner is not None
            and self.runtime.running
            and not store.is_local
            and not store.ranges_ignored
            and 0 < meta.chunk_nbytes <= self.window_bytes
        )

    def sequential_start(self, stream: ByteStream, offset: int, size: int, state: ReadAhead) -> bool:
        """Whether a reader's first read starts a sequential read of whole shards: at offset 0,
        as large as only a reader of the body asks (SEQUENTIAL_START_BYTES).

        Otherwise it pays an index request, then ranges, before its second read makes it
        sequential and the shard is fetched whole anyway; a peek at the header of the file
        stays a random read (the index and the inner chunks it needs).
        """
        if state.next_offset != -1 or offset != 0 or not self.whole(stream):
            return False
        start = size >= SEQUENTIAL_START_BYTES
        log.debug(
            "%s: first read, %d bytes at 0: %s",
            stream.meta.path or "/",
            size,
            "a sequential start" if start else "not yet sequential",
        )
        return start

    def planner(self, stream: ByteStream, plan: ReadPlan, offset: int, size: int) -> tuple[ByteStream, ReadPlan]:
        """The stream to read bytes [offset, offset+size) over, and its plan of them (PLAN is the
        stream's own): the one over inner chunks of shards that can be read in part, unless every
        shard the plan needs is already decoded whole (then over the shards: fewer, larger copies)."""
        fine = stream.for_reads()
        if (
            fine is not stream
            and not self.runtime.store.ranges_ignored
            and not all(self.tables.known(stream.meta, idx) for idx in plan.chunks)
        ):
            return fine, fine.plan(offset, size)
        return stream, plan
