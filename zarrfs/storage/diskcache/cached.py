"""The disk cache in front of a remote store: reads answered from entries still valid, kept ranges reused, writes dropping what they touch."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import threading
import time
from typing import Any

from ..base import METADATA_MAX_BYTES, BaseStore, Upload, Version
from ..fsinfo import FETCH_MARGIN_S
from ..store import Store
from ..uploads import AfterCommit
from .entries import Corrupt, DiskCache, Entry

log = logging.getLogger(__package__)  # one logger for the disk cache, named as before its split

# Values answered from disk whose check time a chunk load has not asked for yet (version_time):
# a load asks at once, so only the most recent matter; older ones are forgotten past this many.
AS_OF_KEPT = 65536
# A prefix's listing: key -> (size, mtime_ns, etag), as the store gives them.
Versions = dict[str, tuple[int | None, int | None, str | None]]
_RANGE_PART = re.compile(r"r(\d+)-(\d+)")


def store_identity(source: str, storage_options: dict[str, Any]) -> str:
    """What names a remote store's contents, never its credentials: the URL without user
    information or query, and the endpoint it is reached at."""
    import urllib.parse

    parts = []
    for part in source.split("::"):
        u = urllib.parse.urlsplit(part)
        netloc = u.netloc.rsplit("@", 1)[-1]
        parts.append(urllib.parse.urlunsplit((u.scheme, netloc, u.path.rstrip("/"), "", "")))
    client = storage_options.get("client_kwargs") or {}
    endpoint = storage_options.get("endpoint_url") or (client.get("endpoint_url") if isinstance(client, dict) else None)
    # Azure names a container within an account that the URL does not carry.
    account = storage_options.get("account_name")
    return json.dumps({"source": "::".join(parts), "endpoint": endpoint, "account": account}, sort_keys=True)


def is_chunk_key(keys: Any, key: str) -> bool:
    """Whether KEY is one of the chunk keys ChunkKeys KEYS builds (not a metadata document beside them)."""
    head = keys.prefix + "/" if keys.prefix else ""
    if not key.startswith(head):
        return False
    name = key[len(head) :]
    if name == keys.zero_d:
        return True
    if not name.startswith(keys.head):
        return False
    return all(p.isdigit() for p in name[len(keys.head) :].split(keys.sep))


class DiskCachedStore(BaseStore):
    """A remote Store whose reads go through a DiskCache; writes drop what they touch.

    Freshness: an entry validated less than `ttl_s` ago is used without asking the store. An
    older one is checked against one listing of its array's prefix (the listing the engine's
    revalidation makes, or one made here, each at most once per `ttl_s`) when it is a chunk key
    of an array the engine named (`note_array`); else (metadata documents) it is read again.
    """

    def __init__(self, store: Store, cache: DiskCache, identity: str, ttl_s: float, own_prefix: str = "") -> None:
        self.store = store
        self.source, self.root, self.read_only = store.source, store.root, store.read_only
        self.is_local, self.on_local_disk, self.is_references = store.is_local, store.on_local_disk, store.is_references
        self.requests = store.requests
        # Keys with a part starting with this are zarrfs' own (writers' leases, staging areas): others
        # change them and their readers need the store's value now, so they are never kept.
        self.own_prefix = own_prefix
        self.cache = cache
        self._salt = hashlib.sha256(identity.encode()).digest()
        self.ttl_s = ttl_s
        self._arrays: dict[str, Any] = {}  # array prefix -> its ChunkKeys
        self._listings: dict[str, tuple[float, Versions]] = {}
        self._listing_locks: dict[str, threading.Lock] = {}
        self._changed: dict[str, float] = {}  # key or prefix -> when this process last wrote below it
        self._stale_before = 0.0  # `refresh`: everything validated before this is checked again
        self._counts = threading.Lock()
        # Whole values answered from disk: key -> when they were last known to match the store.
        self._as_of: dict[str, float] = {}

    @property
    def ranges_ignored(self) -> bool:
        """The store's, which learns it as it reads."""
        return self.store.ranges_ignored

    @ranges_ignored.setter
    def ranges_ignored(self, value: bool) -> None:
        self.store.ranges_ignored = value

    def __repr__(self) -> str:
        return f"DiskCachedStore({self.store!r}, {self.cache.directory!r})"

    # --- naming and freshness -------------------------------------------------------------

    def _name(self, key: str) -> str:
        return hashlib.sha256(self._salt + key.encode()).hexdigest()

    def note_array(self, keys: Any) -> None:
        """An array is about to be read: its chunk keys may be checked by one listing of its prefix."""
        if keys.prefix not in self._arrays:
            self._arrays[keys.prefix] = keys

    def version_time(self, key: str, began: float) -> float:
        """When the value last read of KEY matched the store: its entry's check when it came from disk."""
        return min(began, self._as_of.pop(key, began))

    def refresh(self) -> None:
        """Everything kept is checked against the store before its next use (a refresh, or the
        mount's TTL ran out: the engine's check of cached chunks and this cache's agree)."""
        self._stale_before = time.time()
        self._listings.clear()

    def _array_of(self, key: str) -> str | None:
        parts = key.split("/")
        for n in range(len(parts) - 1, -1, -1):
            prefix = "/".join(parts[:n])
            keys = self._arrays.get(prefix)
            if keys is not None and is_chunk_key(keys, key):
                return prefix
        return None

    def _changed_since(self, key: str, t: float) -> bool:
        if not self._changed:
            return False
        parts = key.split("/")
        return any(self._changed.get("/".join(parts[:n]), -1.0) >= t for n in range(len(parts) + 1))

    def _fresh(self, memo: tuple[float, Versions] | None) -> bool:
        """Whether a listing may decide: begun within the TTL, and since the last `refresh` (one
        begun before, still under way when it was called, may show what the mount no longer trusts)."""
        return memo is not None and memo[0] + self.ttl_s > time.time() and memo[0] > self._stale_before

    def _listing_sync(self, prefix: str) -> tuple[float, Versions] | None:
        """This prefix's versions, listed at most once per TTL (threads share one listing)."""
        memo = self._listings.get(prefix)
        if self._fresh(memo):
            return memo
        lock = self._listing_locks.setdefault(prefix, threading.Lock())
        with lock:
            memo = self._listings.get(prefix)
            if self._fresh(memo):
                return memo
            try:
                self.versions_below_sync(prefix)
            except Exception as e:  # the entry is read again; the read reports a store that is down
                log.info("disk cache: %s could not be listed to check its entries: %s", prefix or "/", e)
                return None
            memo = self._listings.get(prefix)
            return memo if self._fresh(memo) else None  # (a refresh came while it was listed: read again)

    def versions_below_sync(self, prefix: str) -> dict[str, Version]:
        began = time.time()
        versions = self.store.versions_below_sync(prefix)
        for other, (listed_at, _) in list(self._listings.items()):
            if listed_at + self.ttl_s <= began:  # too old to decide anything: its memory goes
                self._listings.pop(other, None)
        self._listings[prefix] = (began, versions)
        return versions

    def _usable(self, key: str, entry: Entry, path: str) -> bool:
        """Whether an entry still holds what the store holds (as far as the TTL lets us trust it)."""
        if self._changed_since(key, entry.validated):
            return False
        now = time.time()
        if entry.validated + self.ttl_s > now and entry.validated > self._stale_before:
            return True
        prefix = self._array_of(key)
        if prefix is None:
            return False
        memo = self._listing_sync(prefix)
        if memo is None:
            return False
        listed_at, versions = memo
        stored = versions.get(key[len(prefix) + 1 :] if prefix else key)
        if not _unchanged(entry, stored):
            return False
        try:
            os.utime(path, ns=(time.time_ns(), int(listed_at * 1e9)))
        except OSError:
            pass
        return True

    def _kept(self, key: str) -> bool:
        """Whether a key's values may be kept at all."""
        return self.cache.usable and not (
            self.own_prefix and any(p.startswith(self.own_prefix) for p in key.split("/"))
        )

    def _lookup_sync(self, key: str, part: str | None = None) -> Entry | None:
        """A usable entry of a key (or part of it), else None (a broken one is dropped)."""
        if not self._kept(key):
            return None
        path = self.cache.path(self._name(key), part)
        try:
            entry = self.cache.read_sync(path)
        except Corrupt as e:
            log.warning(
                "disk cache: the entry of %r%s is damaged (%s): dropped, read again from the store",
                key,
                f" ({part})" if part else "",
                e,
            )
            self._count_error()
            self.cache.drop_sync(path)
            return None
        except OSError as e:
            self.cache.failed("read entries", e)
            return None
        if entry is None:
            self._count(miss=True)
            return None
        if not self._usable(key, entry, path):
            if part is not None:  # a whole value is replaced by the one read again; a range may not be
                self.cache.drop_sync(path)
            self._count(miss=True)
            return None
        self._count(miss=False)
        return entry

    def _keep_sync(self, key: str, part: str | None, body: bytes | None, began: float, size: int | None) -> bool:
        if not self._kept(key) or self._changed_since(key, began):
            return False
        return self.cache.write_sync(
            self.cache.path(self._name(key), part), None if body is None else bytes(body), began, size
        )

    def _count(self, miss: bool) -> None:
        with self._counts:
            if miss:
                self.cache.misses += 1
            else:
                self.cache.hits += 1

    def _count_error(self) -> None:
        with self._counts:
            self.cache.errors += 1

    # --- reads ----------------------------------------------------------------------------

    def get_sync(self, key: str, max_nbytes: int | None = METADATA_MAX_BYTES, into: Any = None) -> Any:
        entry = self._lookup_sync(key)
        if entry is not None:
            self._as_of[key] = entry.validated
            if len(self._as_of) > AS_OF_KEPT:  # values no load asked about (metadata, whole shards)
                for stale in list(self._as_of)[: AS_OF_KEPT // 2]:
                    self._as_of.pop(stale, None)
            return None if entry.body is None else Store.bounded(key, entry.body, max_nbytes)
        self._as_of.pop(key, None)
        data = self._from_parts_sync(key, max_nbytes)
        if data is None:
            began = time.time()
            data = self.store.get_sync(key, max_nbytes)
            self._keep_sync(key, None, data, began, None if data is None else len(data))
        return data

    def _from_parts_sync(self, key: str, max_nbytes: int | None) -> bytes | None:
        """A shard read whole of which ranges are kept: only the rest is fetched. Its size comes
        from its array's listing (one per TTL); None when there are no parts or no size."""
        prefix = self._array_of(key)
        if prefix is None or not self.cache.parts_sync(self._name(key)):
            return None
        memo = self._listing_sync(prefix)
        stored = None if memo is None else memo[1].get(key[len(prefix) + 1 :] if prefix else key)
        if stored is None or stored[0] is None or (max_nbytes is not None and stored[0] > max_nbytes):
            return None
        began = time.time()
        data = self.get_ranges_sync(key, [(0, stored[0])])[0]
        if len(data) != stored[0]:
            return None
        if self._keep_sync(key, None, data, began, len(data)):
            name = self._name(key)
            for part in self.cache.parts_sync(name):  # the whole value holds them all
                self.cache.drop_sync(self.cache.path(name, part))
        return data

    def get_many_sync(self, keys: list[str], max_nbytes: int | None = METADATA_MAX_BYTES) -> dict[str, bytes | None]:
        out: dict[str, bytes | None] = {}
        missing = []
        for key in keys:
            entry = self._lookup_sync(key)
            if entry is None:
                missing.append(key)
            else:
                out[key] = None if entry.body is None else Store.bounded(key, entry.body, max_nbytes)
        if missing:
            began = time.time()
            got = self.store.get_many_sync(missing, max_nbytes)
            for key, data in got.items():
                self._keep_sync(key, None, data, began, None if data is None else len(data))
            out.update(got)
        return {k: out[k] for k in keys}

    def get_prefix_sync(self, key: str, nbytes: int) -> bytes | None:
        return self._edge_sync(key, f"p{nbytes}", self.store.get_prefix_sync, nbytes)

    def get_suffix_sync(self, key: str, nbytes: int) -> bytes | None:
        return self._edge_sync(key, f"s{nbytes}", self.store.get_suffix_sync, nbytes)

    def _whole_sync(self, key: str) -> Entry | None:
        """The whole value kept of a key (a shard read whole), when there is one: parts of it are cut from it."""
        if not os.path.exists(self.cache.path(self._name(key))):
            return None  # not looked up: no miss counted for a part
        entry = self._lookup_sync(key)
        return entry if entry is not None and entry.body is not None else None

    def _edge_sync(self, key: str, part: str, fetch: Any, nbytes: int) -> bytes | None:
        entry = self._lookup_sync(key, part)
        if entry is not None:
            return entry.body
        whole = self._whole_sync(key)
        if whole is not None and whole.body is not None:
            return whole.body[-nbytes:] if part.startswith("s") else whole.body[:nbytes]
        began = time.time()
        data = fetch(key, nbytes)
        self._keep_sync(key, part, data, began, None)
        return data

    def get_range_sync(self, key: str, start: int, end: int) -> bytes:
        return self.get_ranges_sync(key, [(start, end)])[0]

    def get_ranges_sync(self, key: str, ranges: list[tuple[int, int]]) -> list[bytes]:
        """Byte ranges of one key from the ranges kept of it; only what no kept range covers is fetched."""
        if not self._kept(key):
            return self.store.get_ranges_sync(key, ranges)
        whole = self._whole_sync(key)
        if whole is not None and whole.body is not None:
            return [whole.body[a:b] for a, b in ranges]
        name = self._name(key)
        pieces = sorted(
            (int(m.group(1)), int(m.group(2)), p)
            for p in self.cache.parts_sync(name)
            if (m := _RANGE_PART.fullmatch(p))
        )
        bodies: dict[str, bytes | None] = {}

        def body(part: str) -> bytes | None:
            if part not in bodies:
                entry = self._lookup_sync(key, part)
                bodies[part] = None if entry is None or entry.body is None else entry.body
            return bodies[part]

        plans: list[list[Any]] = []  # per range: bytes kept, or the index of a gap to fetch
        gaps: list[tuple[int, int]] = []
        for start, end in ranges:
            plan: list[Any] = []
            at = start
            while at < end:
                best: tuple[int, int, bytes] | None = None
                for a, b, part in pieces:
                    if (
                        a <= at < b
                        and (best is None or b > best[1])
                        and (kept := body(part)) is not None
                        and len(kept) == b - a
                    ):
                        best = (a, b, kept)
                if best is not None:
                    a, b, kept = best
                    stop = min(b, end)
                    plan.append(kept[at - a : stop - a])
                    at = stop
                    continue
                following = [a for a, b, part in pieces if a > at and bodies.get(part, b"") is not None]
                stop = min([end, *following])
                plan.append(len(gaps))
                gaps.append((at, stop))
                at = stop
            plans.append(plan)
        fetched: list[bytes] = []
        if gaps:
            with self._counts:
                self.cache.misses += len(gaps)
            began = time.time()
            fetched = self.store.get_ranges_sync(key, gaps)
            for (a, b), data in zip(gaps, fetched):
                if len(data) == b - a:  # a range past the object's end is not kept
                    self._keep_sync(key, f"r{a}-{b}", data, began, None)
        return [b"".join(fetched[p] if isinstance(p, int) else p for p in plan) for plan in plans]

    # --- writes: what they touch is dropped ------------------------------------------------

    def _touched(self, *keys: str) -> None:
        now = time.time()
        for key in keys:
            self._changed[key] = now
            self.cache.drop_key_sync(self._name(key))

    def set_sync(self, key: str, value: bytes) -> None:
        try:
            self.store.set_sync(key, value)
        finally:
            self._touched(key)

    def put_stream_sync(self, key: str, source: Any, block_bytes: int = 1 << 20) -> None:
        try:
            self.store.put_stream_sync(key, source, block_bytes)
        finally:
            self._touched(key)

    @property
    def upload_parts(self) -> int | None:
        return self.store.upload_parts

    def open_upload_sync(self, key: str) -> Upload | None:
        upload = self.store.open_upload_sync(key)
        return None if upload is None else AfterCommit(upload, lambda: self._touched(key))

    def erase_sync(self, key: str) -> None:
        try:
            self.store.erase_sync(key)
        finally:
            self._touched(key)

    def erase_below_sync(self, prefix: str) -> None:
        try:
            self.store.erase_below_sync(prefix)
        finally:
            self._changed[prefix] = time.time()  # its entries are refused when next looked up

    def move_sync(self, src: str, dst: str) -> None:
        try:
            self.store.move_sync(src, dst)
        finally:
            self._touched(src, dst)

    # --- what the cache does not keep: the store's own --------------------------------------

    def size_sync(self, key: str) -> int | None:
        return self.store.size_sync(key)

    def list_dir_sync(self, prefix: str) -> tuple[dict[str, int | None], list[str]]:
        return self.store.list_dir_sync(prefix)

    def sizes_below_sync(self, prefix: str) -> dict[str, int | None]:
        return self.store.sizes_below_sync(prefix)

    def probe_sync(self, shown: str) -> None:
        self.store.probe_sync(shown)

    def exists_sync(self) -> bool:
        return self.store.exists_sync()

    def mtime_ns_sync(self, key: str) -> int | None:
        return self.store.mtime_ns_sync(key)

    def request_stats(self) -> dict[str, int]:
        """Requests the store behind the cache was sent: what the cache did not answer."""
        return self.store.request_stats()

    def move_many_sync(self, moves: dict[str, str], sizes: dict[str, int | None] | None = None) -> None:
        try:
            self.store.move_many_sync(moves, sizes)
        finally:
            self._touched(*moves, *moves.values())

    def erase_many_sync(self, keys: list[str]) -> None:
        try:
            self.store.erase_many_sync(keys)
        finally:
            self._touched(*keys)

    def disk_stats(self) -> dict[str, Any]:
        return {
            "disk_hits": self.cache.hits,
            "disk_misses": self.cache.misses,
            "disk_bytes": self.cache.used_bytes,
            "disk_max_bytes": self.cache.max_bytes,
            "disk_evictions": self.cache.evictions,
            "disk_errors": self.cache.errors,
            "disk_cache_dir": self.cache.directory,
        }


def _unchanged(entry: Entry, stored: tuple[int | None, int | None, str | None] | None) -> bool:
    """Whether the stored key (size, mtime_ns, etag from a listing) is the version an entry holds."""
    if stored is None:
        return entry.body is None
    if entry.body is None:
        return False
    size, mtime_ns, _ = stored
    if entry.size is not None and size != entry.size:
        return False
    # Written well before the GET began: a write since would carry a later time.
    return mtime_ns is not None and mtime_ns / 1e9 + FETCH_MARGIN_S <= entry.began
