"""Shards uploaded while they are written: each inner chunk encoded and sent as soon as it and
every one before it (C order, the order of a shard's bytes) is complete, in parts of the store's
upload size; the index and the rest go when the whole shard is stored.

A part of the write-back (writeback.py), for v3 shards with their index at the end on a store
with multipart uploads (S3), of at least twice the part size. The shard stays written in
memory (readers take it from there); only its encoding and its upload move forward. A write
into an inner chunk already sent breaks the stream: the upload is aborted and the shard is
stored whole, as any other. Nothing is visible before the upload completes.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections import deque
from typing import Any

import numpy as np
import trio

from .. import grid
from ..codecs.sharding import ShardingIndexed
from ..errors import StoreError, ZarrfsError
from ..grid import Index
from ..model import ArrayMeta
from ..storage.base import Upload
from ..storage.uploads import PART_BYTES_IN_FLIGHT
from ..views.streams import ArrayStream
from .runtime import Runtime

log = logging.getLogger(__name__)

# Shards streamed at once, at most: each holds a part being filled and the parts in flight
# (storage/uploads.py) beside the shard itself, and together at most STREAM_BYTES_MAX of them
# (one stream at the default part size of 50 MiB, two at 5 MiB), so that the daemon stays
# within cache_size + 150 MiB.
STREAMS_MAX = 2
STREAM_BYTES_MAX = 128 << 20


@dataclasses.dataclass(eq=False)
class ShardStream:
    """One shard on its way: inner chunks queued (copies) in C order, and where each went."""

    meta: ArrayMeta
    shard: Index
    positions: list[Index]  # every inner chunk position, C order
    full: list[int]  # elements of each inside the array
    filled: list[int]  # elements of each written since the shard became dirty
    index: np.ndarray  # (offset, nbytes) of the inner chunks appended
    queued: int = 0  # positions[:queued] were complete in turn and taken
    offset: int = 0  # bytes appended
    queue: deque[tuple[int, np.ndarray]] = dataclasses.field(default_factory=deque)
    upload: Upload | None = None
    draining: bool = False
    idle: trio.Event = dataclasses.field(default_factory=trio.Event)
    broken: bool = False  # an inner chunk already taken was written again
    error: ZarrfsError | None = None

    @property
    def sharding(self) -> ShardingIndexed:
        return self.meta.codec.array_bytes


class ShardStreams:
    """The shards being streamed, by (array path, shard index)."""

    def __init__(self, runtime: Runtime, on_progress: Any) -> None:
        self.runtime = runtime
        self._on_progress = on_progress  # called when queued bytes leave (the writer may go on)
        self.streams: dict[tuple[str, Index], ShardStream] = {}
        self.queued_bytes = 0  # inner chunks copied and not yet sent

    def streamable(self, meta: ArrayMeta) -> bool:
        """Whether shards of this array go as they are written."""
        part_bytes = self.runtime.store.upload_parts
        sharding = meta.codec.array_bytes
        return (
            part_bytes is not None
            and meta.inner is not None
            and meta.source is None
            and isinstance(sharding, ShardingIndexed)
            and sharding.index_at_end
            and meta.chunk_nbytes >= 2 * part_bytes
        )

    @staticmethod
    def most_streams(part_bytes: int) -> int:
        """Shards streamed at once with parts of PART_BYTES."""
        return max(1, min(STREAMS_MAX, STREAM_BYTES_MAX // (part_bytes + max(part_bytes, PART_BYTES_IN_FLIGHT))))

    def _start(self, meta: ArrayMeta, shard: Index) -> ShardStream | None:
        filling = sum(1 for s in self.streams.values() if s.queued < len(s.positions) and not s.broken)
        if filling >= self.most_streams(self.runtime.store.upload_parts or 0):  # (complete ones only wait to end)
            return None
        inner = meta.inner
        assert inner is not None and inner.source is not None
        per_shard = inner.source.per_shard
        positions = [tuple(int(i) for i in p) for p in np.ndindex(*per_shard)]
        full = [
            math.prod(max(0, n) for n in grid.data_shape(g, meta.shape, inner.chunk_shape))
            for g in inner.source.inner_of(shard)
        ]
        s = ShardStream(meta, shard, positions, full, [0] * len(positions), inner.source.layout.empty_index(per_shard))
        s.idle.set()
        self.streams[(meta.path, shard)] = s
        return s

    def written(
        self, stream: ArrayStream, offset: int, size: int, new_shards: set[Index], targets: dict[Index, np.ndarray]
    ) -> None:
        """After a write of bytes [offset, offset+size) patched the shards TARGETS (NEW_SHARDS
        became dirty with it): count the inner chunks written, queue those complete in turn.
        No await: called within the write's atomic patch."""
        meta = stream.meta
        inner = meta.inner
        assert inner is not None and inner.source is not None
        fine = stream.for_reads()
        plan = fine.plan(offset, size)
        covered = fine.coverage(plan)
        per_shard = inner.source.per_shard
        touched: set[ShardStream] = set()
        for idx in plan.chunks:
            shard = inner.source.shard_of(idx)
            s = self.streams.get((meta.path, shard))
            if s is None:
                if shard not in new_shards:
                    continue  # a shard written before it could stream: stored whole
                s = self._start(meta, shard)
                if s is None:
                    continue
            at = int(np.ravel_multi_index(inner.source.position(idx), per_shard))
            if at < s.queued:
                s.broken = True
            s.filled[at] += covered[idx]
            touched.add(s)
        for s in touched:
            if s.broken:
                continue
            arr = targets[s.shard]
            while s.queued < len(s.positions) and s.filled[s.queued] >= s.full[s.queued]:
                region = grid.chunk_slices(s.positions[s.queued], arr.shape, inner.chunk_shape)
                block = np.array(arr[region], order="C", copy=True)
                s.queue.append((s.queued, block))
                self.queued_bytes += block.nbytes
                s.queued += 1
            if s.queue and not s.draining:
                s.draining = True
                s.idle = trio.Event()
                self.runtime.start_soon(self._drain, s)

    async def _drain(self, s: ShardStream) -> None:
        """Encode and append the queued inner chunks of a shard, in order."""
        try:
            while s.queue:
                at, block = s.queue[0]
                if not s.broken and s.error is None:
                    data = await self.runtime.run_cpu(s.sharding.encode_inner, block, s.meta.fill_value)
                    if data is not None:
                        if s.upload is None:
                            s.upload = await self._open(s)
                        await self.runtime.run_io(s.upload.write_sync, data)
                        s.index[s.positions[at]] = (s.offset, len(data))
                        s.offset += len(data)
                s.queue.popleft()
                self.queued_bytes -= block.nbytes
                self._on_progress()
        except ZarrfsError as e:
            s.error = e
        except Exception as e:  # background work must not end the daemon
            log.exception("unexpected error uploading shard %s of %s", s.shard, s.meta.path or "/")
            s.error = StoreError(f"shard {s.shard}: unexpected {type(e).__name__}: {e}")
        finally:
            while s.queue:  # (after a failure: nothing more goes)
                self.queued_bytes -= s.queue.popleft()[1].nbytes
            self._on_progress()
            s.draining = False
            s.idle.set()

    async def _open(self, s: ShardStream) -> Upload:
        upload = await self.runtime.run_io(self.runtime.store.open_upload_sync, s.meta.chunk_key(s.shard))
        if upload is None:  # (upload_parts said it would)
            raise StoreError(f"{s.meta.chunk_key(s.shard)!r}: the store takes no uploads in parts")
        return upload

    def intact(self, key: tuple[str, Index]) -> bool:
        """Whether a shard (array path, index) is being streamed and can still complete so."""
        s = self.streams.get(key)
        return s is not None and not s.broken and s.error is None

    def take(self, meta: ArrayMeta, shard: Index) -> ShardStream | None:
        """The stream of a shard about to be stored, no longer fed by writes."""
        return self.streams.pop((meta.path, shard), None)

    async def finish(self, s: ShardStream, arr: np.ndarray) -> bool:
        """Store a shard whose stream was taken, ARR being its final values: the inner chunks not
        sent yet and the index go, and the upload completes. False (the upload, if any,
        aborted) when the shard must be stored whole instead: its stream broke, or nothing
        was sent. A failure of the upload is raised (StoreError), the upload aborted."""
        await s.idle.wait()
        if s.broken or s.upload is None:
            await self.abort(s)
            return False
        try:
            if s.error is not None:
                raise s.error
            tail = await self.runtime.run_cpu(self._tail, s, arr)
            await self.runtime.run_io(s.upload.write_sync, tail)
            await self.runtime.run_io(s.upload.commit_sync)
        except ZarrfsError:
            await self.abort(s)
            raise
        return True

    @staticmethod
    def _tail(s: ShardStream, arr: np.ndarray) -> bytes:
        """The inner chunks after those sent, then the index."""
        sharding = s.sharding
        body = []
        offset = s.offset
        for pos in s.positions[s.queued :]:
            data = sharding.encode_inner(
                arr[grid.chunk_slices(pos, arr.shape, sharding.inner_chunks)], s.meta.fill_value
            )
            if data is not None:
                s.index[pos] = (offset, len(data))
                offset += len(data)
                body.append(data)
        body.append(sharding.layout.encode_index(s.index))
        return b"".join(body)

    async def abort(self, s: ShardStream) -> None:
        """Drop what a stream sent (no part stays in the store), once its appends are done; a
        failure to is logged, once."""
        s.broken = True
        await s.idle.wait()
        upload, s.upload = s.upload, None
        if upload is None:
            return
        try:
            await self.runtime.run_io(upload.abort_sync)
        except ZarrfsError as e:
            log.warning("%s (the parts sent stay until the bucket's lifecycle rule removes them)", e)

    def forget(self, path: str) -> None:
        """Abort the streams of an array, or of every array below a group (removed or replaced),
        in the background."""
        for key in [k for k in self.streams if k[0] == path or k[0].startswith(path + "/")]:
            s = self.streams.pop(key)
            s.broken = True
            if self.runtime.running:
                self.runtime.start_soon(self.abort, s)
