"""The disk cache without a mount: entries checked on read, LRU bound, kept ranges reused,
writes dropping entries, revalidation by a listing after the TTL."""

from __future__ import annotations

import os
import stat
import time

import pytest

from zarrfs.storage.diskcache import (
    BLOCK_BYTES,
    DiskCache,
    DiskCachedStore,
    default_cache_dir,
    store_identity,
)
from zarrfs.storage.keys import ChunkKeys
from zarrfs.storage.requests import RequestCounts


class CountingStore:
    """A store of a dict: counts the requests the cache lets through; lists with given times."""

    source, root, read_only, ranges_ignored = "dict://", "", False, False
    is_local = on_local_disk = is_references = False

    def __init__(self, values: dict[str, bytes]) -> None:
        self.requests = RequestCounts()
        self.values = dict(values)
        self.times: dict[str, float] = {k: time.time() - 3600 for k in values}
        self.gets: list[str] = []
        self.ranges: list[tuple[str, int, int]] = []
        self.listings = 0

    def get_sync(self, key, max_nbytes=None, into=None):
        self.gets.append(key)
        return self.values.get(key)

    def get_many_sync(self, keys, max_nbytes=None):
        return {k: self.get_sync(k) for k in keys}

    def get_ranges_sync(self, key, ranges):
        self.ranges += [(key, a, b) for a, b in ranges]
        return [self.values[key][a:b] for a, b in ranges]

    def get_suffix_sync(self, key, nbytes):
        self.gets.append(key)
        return self.values[key][-nbytes:]

    def set_sync(self, key, value):
        self.values[key] = value
        self.times[key] = time.time()

    def put_stream_sync(self, key, source, block_bytes=1 << 20):
        self.set_sync(key, source.read())

    def versions_below_sync(self, prefix):
        self.listings += 1
        return {
            k[len(prefix) + 1 :]: (len(v), int(self.times[k] * 1e9), None)
            for k, v in self.values.items()
            if k.startswith(prefix + "/")
        }


def _cached(tmp_path, values, max_bytes=1 << 20, ttl_s=10.0):
    inner = CountingStore(values)
    return inner, DiskCachedStore(inner, DiskCache(str(tmp_path / "c"), max_bytes), "identity", ttl_s)


def _entries(tmp_path):
    return sorted(p for p in (tmp_path / "c" / "entries").rglob("*") if p.is_file())


def test_a_value_is_read_once_and_the_directory_is_private(tmp_path):
    inner, store = _cached(tmp_path, {"a/0": b"x" * 5000})
    assert store.get_sync("a/0") == b"x" * 5000
    assert store.get_sync("a/0") == b"x" * 5000
    assert store.get_sync("a/missing") is None and store.get_sync("a/missing") is None
    assert inner.gets == ["a/0", "a/missing"]
    assert stat.S_IMODE(os.stat(tmp_path / "c").st_mode) == 0o700
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in _entries(tmp_path))


@pytest.mark.parametrize("damage", ["truncate", "flip", "empty"])
def test_a_damaged_entry_is_dropped_and_read_again(tmp_path, damage, caplog):
    inner, store = _cached(tmp_path, {"a/0": bytes(range(256)) * 20})
    store.get_sync("a/0")
    (entry,) = _entries(tmp_path)
    data = bytearray(entry.read_bytes())
    if damage == "truncate":
        data = data[:-10]
    elif damage == "flip":
        data[len(data) // 2] ^= 1
    else:
        data = bytearray()
    entry.write_bytes(bytes(data))
    assert store.get_sync("a/0") == bytes(range(256)) * 20
    assert inner.gets == ["a/0", "a/0"]
    assert store.cache.errors == 1
    assert [r.levelname for r in caplog.records if "damaged" in r.getMessage()] == ["WARNING"]
    assert store.get_sync("a/0") == bytes(range(256)) * 20 and len(inner.gets) == 2  # kept again


def test_least_recently_used_entries_go_first_within_the_bound(tmp_path):
    values = {f"a/{i}": bytes([i]) * 3000 for i in range(6)}
    inner, store = _cached(tmp_path, values, max_bytes=4 * BLOCK_BYTES)
    for i in range(4):
        store.get_sync(f"a/{i}")
        time.sleep(0.01)  # distinct use times, in order
    store.get_sync("a/0")  # used again: now the most recent
    time.sleep(0.01)
    store.get_sync("a/4")  # past the bound: the least recently used go, a/1 first
    assert store.cache.used_bytes <= 4 * BLOCK_BYTES
    assert sum(p.stat().st_blocks * 512 for p in _entries(tmp_path)) <= 4 * BLOCK_BYTES
    inner.gets.clear()
    store.get_sync("a/0")
    store.get_sync("a/4")
    store.get_sync("a/1")
    assert inner.gets == ["a/1"]
    assert store.cache.evictions >= 1


def test_kept_ranges_are_reused_and_only_gaps_fetched(tmp_path):
    shard = bytes(range(256)) * 40
    inner, store = _cached(tmp_path, {"s/c/0": shard})
    assert store.get_ranges_sync("s/c/0", [(100, 200), (1000, 1100)]) == [shard[100:200], shard[1000:1100]]
    inner.ranges.clear()
    assert store.get_ranges_sync("s/c/0", [(150, 1050)]) == [shard[150:1050]]
    assert inner.ranges == [("s/c/0", 200, 1000)]
    inner.ranges.clear()
    assert store.get_range_sync("s/c/0", 120, 1080) == shard[120:1080]
    assert inner.ranges == []
    assert store.get_suffix_sync("s/c/0", 16) == shard[-16:] == store.get_suffix_sync("s/c/0", 16)
    assert inner.gets == ["s/c/0"]


def test_a_write_through_the_mount_drops_what_it_touches(tmp_path):
    import io

    inner, store = _cached(tmp_path, {"a/0": b"old" * 100})
    store.get_sync("a/0")
    store.set_sync("a/0", b"new" * 100)
    assert store.get_sync("a/0") == b"new" * 100
    assert inner.gets == ["a/0", "a/0"]
    store.put_stream_sync("a/0", io.BytesIO(b"streamed"))
    assert store.get_sync("a/0") == b"streamed"
    assert inner.gets == ["a/0", "a/0", "a/0"]


def test_after_the_ttl_one_listing_decides(tmp_path):
    keys = ChunkKeys("a", "/", "c/", "c")
    values = {f"a/c/{i}": bytes([i]) * 1000 for i in range(4)}
    values["a/zarr.json"] = b"{}"
    inner, store = _cached(tmp_path, values, ttl_s=0.2)
    for k in values:
        store.get_sync(k)
    inner.gets.clear()
    store.note_array(keys)
    time.sleep(0.3)
    inner.set_sync("a/c/2", b"\x09" * 1000)  # another client rewrites one chunk
    got = {k: store.get_sync(k) for k in values}
    assert got["a/c/2"] == b"\x09" * 1000 and got["a/c/1"] == b"\x01" * 1000
    assert inner.listings == 1
    assert inner.gets == ["a/c/2", "a/zarr.json"]  # a metadata document is read again, not listed


def test_parts_of_a_shard_kept_whole_come_from_it(tmp_path):
    shard = bytes(range(256)) * 40
    inner, store = _cached(tmp_path, {"s/c/0": shard})
    assert store.get_sync("s/c/0", None) == shard
    assert store.get_suffix_sync("s/c/0", 16) == shard[-16:]
    assert store.get_ranges_sync("s/c/0", [(5, 50), (900, 1000)]) == [shard[5:50], shard[900:1000]]
    assert inner.gets == ["s/c/0"] and inner.ranges == []


def test_a_shard_read_whole_fetches_only_what_no_kept_range_covers(tmp_path):
    shard = bytes(range(256)) * 40
    inner, store = _cached(tmp_path, {"s/c/0": shard})
    store.note_array(ChunkKeys("s", "/", "c/", "c"))
    store.get_ranges_sync("s/c/0", [(0, 1000), (2000, 3000)])
    inner.ranges.clear()
    assert store.get_sync("s/c/0", None) == shard
    assert inner.ranges == [("s/c/0", 1000, 2000), ("s/c/0", 3000, len(shard))] and inner.gets == []
    assert inner.listings == 1  # its size


def test_a_value_from_disk_is_as_old_as_its_last_check(tmp_path):
    inner, store = _cached(tmp_path, {"a/0": b"x" * 100})
    t0 = time.time()
    store.get_sync("a/0")
    now = time.time()
    assert store.version_time("a/0", now) == now  # read from the store just now
    time.sleep(0.05)
    store.get_sync("a/0")
    later = time.time()
    assert t0 <= store.version_time("a/0", later) < now  # from disk: checked when first read


def test_an_unusable_directory_leaves_every_read_to_the_store(tmp_path, caplog):
    (tmp_path / "file").write_bytes(b"")
    cache = DiskCache(str(tmp_path / "file" / "cache"), 1 << 20)  # its parent is not a directory
    assert not cache.usable and cache.errors == 1
    foreign = tmp_path / "foreign"
    foreign.mkdir(mode=0o700)
    os.chown(foreign, 12345, 12345)
    assert not DiskCache(str(foreign), 1 << 20).usable  # someone else's: never written into
    assert len([r for r in caplog.records if r.levelname == "WARNING"]) == 2
    store = DiskCachedStore(CountingStore({"a/0": b"x"}), cache, "identity", 10.0)
    assert store.get_sync("a/0") == b"x" and store.get_sync("a/0") == b"x"
    assert store.store.gets == ["a/0", "a/0"]


def test_defaults_and_identity(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert default_cache_dir() == str(tmp_path / "zarrfs")
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert default_cache_dir() == ("/var/cache/zarrfs" if os.geteuid() == 0 else os.path.expanduser("~/.cache/zarrfs"))
    a = store_identity(
        "s3://user:secret@bucket/x.zarr/?token=t0ken",
        {"key": "K", "secret": "S", "client_kwargs": {"endpoint_url": "http://e"}},
    )
    assert "secret" not in a and "t0ken" not in a and "http://e" in a
    assert a == store_identity("s3://bucket/x.zarr", {"client_kwargs": {"endpoint_url": "http://e"}})
    assert a != store_identity("s3://bucket/x.zarr", {"client_kwargs": {"endpoint_url": "http://other"}})
    assert store_identity("abfs://c/x", {"account_name": "one"}) != store_identity(
        "abfs://c/x", {"account_name": "two"}
    )


def test_zarrfs_own_keys_are_never_kept(tmp_path):
    inner = CountingStore({".zarrfs-lease-w1": b"lease", "g/.zarrfs-staging-1/c/0": b"x"})
    store = DiskCachedStore(inner, DiskCache(str(tmp_path / "c"), 1 << 20), "id", 10.0, own_prefix=".zarrfs")
    for _ in range(2):
        assert store.get_sync(".zarrfs-lease-w1") == b"lease"
        assert store.get_sync("g/.zarrfs-staging-1/c/0") == b"x"
    assert len(inner.gets) == 4 and _entries(tmp_path) == []
