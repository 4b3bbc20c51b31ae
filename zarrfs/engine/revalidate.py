"""Cached chunks checked against the store after `metadata_ttl` instead of read again: one listing per array read.

A chunk read from the store is noted with what identifies the
version read without another request: when the GET began and how many bytes it returned (fsspec
gives no ETag with a body). After the TTL, the next read of an array lists its prefix once (one
request per 1,000 keys on S3: cheaper than a HEAD per cached chunk) and keeps each cached chunk
whose key is still there with the same size and either the ETag seen at the previous check or a
modification time well before the GET; every other cached chunk of it is dropped and read again,
and the kernel's pages of the array are dropped (`on_array_changed`). Chunks evicted from the cache
are checked too (the kernel may still hold their pages), up to RECORDS_MAX records; an array whose
records were pruned past that counts as changed at its next check.

When another writer replaced an array with one of another chunk layout (the namespace finds its
new metadata after the TTL or a refresh: `see_layout`), every chunk decoded with the old one
goes, loads begun with it are neither shared nor cached, and reads with the old metadata fail
(ESTALE) instead of decoding new chunks on the old grid.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable

from ..errors import Stale, ZarrfsError
from ..grid import Index
from ..model import ArrayMeta
from ..storage.fsinfo import FETCH_MARGIN_S
from .cache import Key
from .pins import Pins
from .runtime import Runtime
from .tables import INDEX, ChunkTables

log = logging.getLogger(__name__)

# Records of fetched chunks kept (some 250 bytes each): past twice this, those of chunks no longer
# cached are pruned, and their arrays count as changed at their next check.
RECORDS_MAX = 1 << 16


class _Fetched:
    """What identifies the stored version of a cached chunk."""

    __slots__ = ("key", "began", "size", "etag")

    def __init__(self, key: str, began: float, size: int | None) -> None:
        self.key = key
        self.began = began  # wall-clock time the GET began
        self.size = size  # None: the key was not stored (the fill value)
        self.etag: str | None = None  # learnt at the first check


class Revalidation:
    """Per array: the versions of its cached chunks, checked once per TTL when it is next read,
    and the chunk layouts its chunks are read with."""

    def __init__(self, runtime: Runtime, tables: ChunkTables) -> None:
        self.runtime, self.tables = runtime, tables
        self.on_array_changed: Callable[[str], object] | None = None  # the kernel's pages of an array: dropped
        self.pins = Pins(runtime.timeout_s)  # what the TTL's last start dropped, for reads begun before it
        self._epoch = 0  # bumped when the TTL runs out
        self._checked: dict[str, int] = {}  # array path -> epoch of its last check
        self._fetched: dict[tuple[str, Index], _Fetched] = {}
        self._untracked: set[str] = set()  # arrays whose records of evicted chunks were pruned
        # array path -> hashes of the chunk layouts (ArrayMeta.chunk_layout: the array's, and its
        # inner chunks' where shards are read in part) its chunks are read with: arrays read only
        self._layouts: dict[str, frozenset[int]] = {}

    def layout_replaced(self, meta: ArrayMeta) -> bool:
        """Whether the namespace's new `meta` has another chunk layout than the one the array's
        chunks were read with (another writer replaced it with another grid, data type, fill
        value or codecs): then what was decoded or is being loaded with the old one must go
        (Engine.see_layout), and `adopt_layout` follows."""
        known = self._layouts.get(meta.path)
        return known is not None and meta.chunk_layout_hash not in known  # (None: nothing read, nothing to forget)

    def adopt_layout(self, meta: ArrayMeta) -> None:
        """The array's chunks are read with `meta`'s layout from now on, none checked or fetched yet."""
        path = meta.path
        self._layouts[path] = _layouts_of(meta)
        self._checked.pop(path, None)
        self._untracked.discard(path)
        for k in [k for k in self._fetched if k[0] == path]:
            del self._fetched[k]

    def forget(self, path: str) -> None:
        """Forget the layouts of an array, or of every array below a group, that this mount
        removed or replaced: its next metadata is the truth."""
        for key in [k for k in self._layouts if k == path or k.startswith(path + "/")]:
            del self._layouts[key]

    def is_current(self, path: str) -> bool:
        """Whether an array's cached chunks need no check before they are used (the TTL has not
        run out since they were checked; False while they are being checked)."""
        return self._checked.get(path, self._epoch) == self._epoch

    def check_layout(self, meta: ArrayMeta) -> None:
        """Before chunks of an array are read with `meta`: Stale unless it has the chunk layout the
        array's chunks are read with (the first read, by an array's own metadata, sets it)."""
        known = self._layouts.get(meta.path)
        if known is None:
            if meta.source is None or not meta.source.shard_is_chunk:  # (not the inner chunks of another)
                self._layouts[meta.path] = _layouts_of(meta)
            return
        if meta.chunk_layout_hash not in known:
            raise Stale(
                f"{meta.path or '/'}: read with metadata the store no longer holds (the array was "
                f"replaced with another shape, data type or chunking)"
            )

    def current_layout(self, meta: ArrayMeta) -> bool:
        """Whether what was loaded with `meta` may be cached (not if its layout was replaced meanwhile)."""
        known = self._layouts.get(meta.path)
        return known is None or meta.chunk_layout_hash in known

    def note_fetch(self, meta: ArrayMeta, idx: Index, key: str, began: float, size: int | None) -> None:
        """A chunk was read from the store: what identifies the version read."""
        # A disk cache may have answered with bytes checked against the store before the GET began.
        self._fetched[(meta.path, idx)] = _Fetched(key, self.runtime.store.version_time(key, began), size)
        self._checked.setdefault(meta.path, self._epoch)
        if len(self._fetched) > 2 * RECORDS_MAX:
            self._prune()

    def _prune(self) -> None:
        """Drop the records of chunks no longer cached; their arrays count as changed at their next
        check (what the kernel kept of them can no longer be checked)."""
        cache = self.tables.cache
        for k in [k for k in self._fetched if not cache.contains(k)]:
            del self._fetched[k]
            self._untracked.add(k[0])

    def chunks_stale(self, pins_until: float) -> None:
        """The TTL ran out: cached chunks of every array are checked before their next use; what
        cannot be checked (shard indexes and inner chunks, chunks not read from the store) is dropped.
        What this TTL drops is pinned until `pins_until` (pins.py)."""
        self._epoch += 1
        self.pins.start(pins_until)
        cache = self.tables.cache
        for key in cache.keys():
            if len(key) != 2 or key not in self._fetched:
                self._drop(key)

    def _drop(self, key: Key) -> None:
        """A cached chunk goes (pinned a while for the reads begun before the TTL's last start)."""
        if key[-1] != INDEX:
            self.pins.keep(key, self.tables.cache.get(key, count=False))
        self.tables.cache.discard(key)

    async def check_cached(self, meta: ArrayMeta) -> None:
        """Before reading an array: if the TTL ran out since its chunks were checked, check them.
        One check per array and epoch, which every reader of the array waits for: until it
        ends, none of the array's cached chunks is used (`is_current` is False)."""
        self.runtime.store.note_array(meta.keys)
        path = meta.path
        while self._checked.get(path, self._epoch) != self._epoch:
            epoch = self._epoch
            await self.runtime.once(("check", path, epoch), functools.partial(self._check, meta, epoch))

    async def _check(self, meta: ArrayMeta, epoch: int) -> None:
        """Check the array's cached chunks by one listing of its prefix, begun in EPOCH; the array
        counts as checked in EPOCH only once the chunks it found changed are dropped."""
        path = meta.path
        # Evicted chunks too: the kernel may hold pages read from them.
        held = [(k, f) for k, f in self._fetched.items() if k[0] == path]
        changed = 0
        if path in self._untracked:
            self._untracked.discard(path)
            changed += 1
        if held:
            prefix = meta.keys.prefix
            try:
                versions = await self.runtime.run_io(
                    self.runtime.store.versions_below_sync, prefix, key=("versions", path)
                )
            except ZarrfsError as e:
                log.info("%s: cached chunks dropped, their versions could not be checked: %s", path or "/", e)
                versions = None
            for k, f in held:
                # Read again meanwhile, the record may not be the cached copy's: dropped too.
                if (
                    self._fetched.get(k) is not f
                    or versions is None
                    or not self._unchanged(f, versions.get(f.key[len(prefix) + 1 :] if prefix else f.key))
                ):
                    self._drop(k)
                    self._fetched.pop(k, None)
                    changed += 1
            self.runtime.counters["revalidations"] += 1
            self.runtime.counters["chunks_changed"] += changed
            log.debug("%s: %d cached chunks checked, %d changed in the store", path or "/", len(held), changed)
        if epoch == self._epoch:  # (else the TTL ran out again meanwhile: checked again)
            self._checked[path] = epoch
        if changed and self.on_array_changed is not None:
            self.on_array_changed(path)

    @staticmethod
    def _unchanged(f: _Fetched, stored: tuple[int | None, int | None, str | None] | None) -> bool:
        """Whether the stored key (size, mtime_ns, etag) is the version read, as far as the store tells."""
        if stored is None:
            return f.size is None
        size, mtime_ns, etag = stored
        if f.size is None or size != f.size:
            return False
        if f.etag is not None:
            return etag == f.etag
        if mtime_ns is None or mtime_ns / 1e9 + FETCH_MARGIN_S > f.began:
            return False
        f.etag = etag  # from now on the tag decides (it changes with every write)
        return True


def _layouts_of(meta: ArrayMeta) -> frozenset[int]:
    """The chunk layouts an array's chunks are read with: its own, and its inner chunks'."""
    return frozenset(m.chunk_layout_hash for m in (meta, meta.inner) if m is not None)


def now() -> float:
    """Wall-clock time, comparable with a store's modification times."""
    return time.time()
