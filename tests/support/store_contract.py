"""The store contract (zarrfs/storage/base.py), tested once for every kind of store.

As zarr-python's `testing/store.py` StoreTests: a subclass per store kind says how to make the
store and gives an oracle that reads and writes the same keys *without* the store under test (the
file system, s3fs, fsspec's memory file system, icechunk's own session); every test here then
holds for that kind. A small Zarr v3 hierarchy is put through the oracle first (keys an Icechunk
repository accepts too): documents, chunks of two arrays.
"""

from __future__ import annotations

import io
import json
import os
from typing import Any

import pytest

from zarrfs.errors import MetadataError, StoreError, ZarrfsError
from zarrfs.storage.base import BaseStore


def _doc(**fields: Any) -> bytes:
    return json.dumps({"zarr_format": 3, **fields}).encode()


def _array(shape: list[int], chunks: list[int]) -> bytes:
    return _doc(
        node_type="array",
        shape=shape,
        data_type="uint8",
        chunk_grid={"name": "regular", "configuration": {"chunk_shape": chunks}},
        chunk_key_encoding={"name": "default", "configuration": {"separator": "/"}},
        fill_value=0,
        codecs=[{"name": "bytes"}],
        attributes={},
    )


# The hierarchy every store starts with, in the order it is put (documents before their chunks).
HIERARCHY: dict[str, bytes] = {
    "zarr.json": _doc(node_type="group", attributes={"title": "contract"}),
    "a/zarr.json": _array([384], [128]),
    "a/c/0": bytes(range(128)),
    "a/c/1": bytes(range(255, 127, -1)),
    "g/zarr.json": _doc(node_type="group", attributes={}),
    "g/b/zarr.json": _array([4, 4], [2, 4]),
    "g/b/c/0/0": b"\x01" * 8,
    "g/b/c/1/0": b"\x02" * 8,
}
CHUNK = "a/c/0"  # a value to read in ranges: 128 bytes 0..127
ABSENT = "a/c/2"  # a chunk of the hierarchy's arrays that is not stored


class Oracle:
    """Reads and writes keys beside the store under test (never through it)."""

    def put(self, key: str, value: bytes) -> None:
        raise NotImplementedError

    def get(self, key: str) -> bytes | None:
        raise NotImplementedError


class StoreContract:
    """The contract; subclasses (`Test...`) give `oracle` and `open`, and say what their kind does."""

    writable = True  # writes through the store are part of its contract
    refreshes = True  # a value changed beside the store is read anew after `refresh`
    sizes_listed = True  # listings give sizes

    def oracle(self, tmp_path: Any) -> Oracle:
        """Where a store of this kind keeps its keys, reached without the store."""
        raise NotImplementedError

    def open(self, tmp_path: Any, oracle: Oracle) -> BaseStore:
        """The store under test, over what ORACLE holds."""
        raise NotImplementedError

    def settle(self, store: BaseStore) -> None:
        """Make what was written through the store visible to the oracle (a commit, for some)."""

    @pytest.fixture
    def pair(self, tmp_path: Any) -> tuple[BaseStore, Oracle]:
        oracle = self.oracle(tmp_path)
        for key, value in HIERARCHY.items():
            oracle.put(key, value)
        return self.open(tmp_path, oracle), oracle

    # --- the interface itself ---------------------------------------------------------

    def test_is_a_declared_store(self, pair):
        store, _ = pair
        assert isinstance(store, BaseStore)
        assert store.read_only is not self.writable
        assert isinstance(store.source, str) and isinstance(store.is_local, bool)

    # --- get ------------------------------------------------------------------------------

    def test_get_reads_what_the_oracle_holds(self, pair):
        store, oracle = pair
        for key in HIERARCHY:
            assert bytes(store.get_sync(key, None)) == oracle.get(key), key
        assert store.get_sync(ABSENT) is None

    def test_get_many_reads_each_key(self, pair):
        store, oracle = pair
        keys = [*HIERARCHY, ABSENT]
        got = store.get_many_sync(keys, None)
        assert set(got) == set(keys)
        assert {k: (None if v is None else bytes(v)) for k, v in got.items()} == {k: oracle.get(k) for k in keys}

    def test_size_is_the_values_length(self, pair):
        store, oracle = pair
        for key in (CHUNK, "g/b/c/1/0", "zarr.json"):
            assert store.size_sync(key) == len(oracle.get(key)), key
        assert store.size_sync(ABSENT) is None

    # --- ranges ---------------------------------------------------------------------------

    def test_ranges_are_slices_of_the_value(self, pair):
        store, oracle = pair
        value = oracle.get(CHUNK)
        assert bytes(store.get_range_sync(CHUNK, 3, 50)) == value[3:50]
        ranges = [(0, 4), (100, 128), (120, 200)]
        assert [bytes(b) for b in store.get_ranges_sync(CHUNK, ranges)] == [value[a:b] for a, b in ranges]
        assert bytes(store.get_prefix_sync(CHUNK, 10)) == value[:10]
        assert bytes(store.get_suffix_sync(CHUNK, 10)) == value[-10:]

    def test_prefix_and_suffix_of_an_absent_key_are_none(self, pair):
        store, _ = pair
        assert store.get_prefix_sync(ABSENT, 4) is None
        assert store.get_suffix_sync(ABSENT, 4) is None

    # --- listings -------------------------------------------------------------------------

    def test_list_dir_gives_names_and_sub_prefixes(self, pair):
        store, oracle = pair
        files, dirs = store.list_dir_sync("")
        assert "zarr.json" in files and {"a", "g"} <= set(dirs)
        files, dirs = store.list_dir_sync("a/c")
        assert sorted(files) == ["0", "1"] and dirs == []
        if self.sizes_listed:
            assert files == {"0": len(oracle.get("a/c/0")), "1": len(oracle.get("a/c/1"))}
        assert store.list_dir_sync("nothing/here") == ({}, [])

    def test_keys_below_a_prefix_with_sizes_and_versions(self, pair):
        store, oracle = pair
        below = {"zarr.json", "b/zarr.json", "b/c/0/0", "b/c/1/0"}
        sizes = store.sizes_below_sync("g")
        assert set(sizes) == below
        assert all(size is None or size == len(oracle.get("g/" + key)) for key, size in sizes.items())
        versions = store.versions_below_sync("g")
        assert set(versions) == below
        assert all(v[0] is None or v[0] == len(oracle.get("g/" + key)) for key, v in versions.items())

    # --- writes and erase -----------------------------------------------------------------

    def _writable(self) -> None:
        if not self.writable:
            pytest.skip("a read-only kind of store")

    def test_set_replaces_a_value(self, pair):
        self._writable()
        store, oracle = pair
        store.set_sync("a/c/1", b"new value")
        assert bytes(store.get_sync("a/c/1")) == b"new value"
        self.settle(store)
        assert oracle.get("a/c/1") == b"new value"

    def test_put_stream_stores_a_file_objects_bytes(self, pair):
        self._writable()
        store, oracle = pair
        store.put_stream_sync("g/b/c/0/0", io.BytesIO(b"streamed" * 100), block_bytes=64)
        self.settle(store)
        assert oracle.get("g/b/c/0/0") == b"streamed" * 100

    def test_an_upload_in_parts_shows_only_once_committed(self, pair):
        self._writable()
        store, oracle = pair
        if store.upload_parts is None:
            assert store.open_upload_sync(CHUNK) is None  # stored whole with set_sync instead
            return
        getattr(store, "store", store).upload_part_bytes = 5 << 20  # (S3's smallest part)
        old = oracle.get(CHUNK)
        value = os.urandom(11 << 20)  # two parts of 5 MiB and one of 1 MiB
        upload = store.open_upload_sync(CHUNK)
        for at in range(0, len(value), 1 << 20):
            upload.write_sync(value[at : at + (1 << 20)])
        assert oracle.get(CHUNK) == old
        upload.commit_sync()
        self.settle(store)
        assert oracle.get(CHUNK) == value and bytes(store.get_sync(CHUNK, None)) == value
        kept = oracle.get("a/c/1")
        dropped = store.open_upload_sync("a/c/1")
        dropped.write_sync(os.urandom(6 << 20))
        dropped.abort_sync()
        self.settle(store)
        assert kept is not None and oracle.get("a/c/1") == kept

    def test_erase_removes_a_key_and_an_absent_one_is_no_error(self, pair):
        self._writable()
        store, oracle = pair
        store.erase_sync(CHUNK)
        store.erase_sync(ABSENT)
        assert store.get_sync(CHUNK) is None
        self.settle(store)
        assert oracle.get(CHUNK) is None

    def test_erase_below_removes_every_key_below(self, pair):
        self._writable()
        store, oracle = pair
        store.erase_below_sync("g/b/c")
        assert store.sizes_below_sync("g/b/c") == {}
        self.settle(store)
        assert oracle.get("g/b/c/0/0") is None and oracle.get("g/b/zarr.json") is not None

    def test_move_gives_the_value_to_another_key(self, pair):
        self._writable()
        store, oracle = pair
        value = oracle.get("a/c/0")
        store.move_sync("a/c/0", "a/c/1")
        assert store.get_sync("a/c/0") is None and bytes(store.get_sync("a/c/1")) == value
        self.settle(store)
        assert oracle.get("a/c/0") is None and oracle.get("a/c/1") == value

    # --- refresh --------------------------------------------------------------------------

    def test_refresh_reads_a_value_changed_beside_it(self, pair):
        if not self.refreshes:
            pytest.skip("this kind of store shows one version: nothing changes beside it")
        store, oracle = pair
        assert bytes(store.get_sync(CHUNK, None)) == oracle.get(CHUNK)
        oracle.put(CHUNK, b"changed beside the store, of another size")
        store.refresh()
        assert bytes(store.get_sync(CHUNK, None)) == b"changed beside the store, of another size"

    # --- errors ---------------------------------------------------------------------------

    def test_a_value_larger_than_its_bound_is_refused(self, pair):
        store, _ = pair
        with pytest.raises(StoreError, match="a/c/0"):
            store.get_sync(CHUNK, max_nbytes=10)

    @pytest.mark.parametrize("key", ["../outside", "/absolute", "a/../../x", "a//b"])
    def test_a_hostile_key_is_refused(self, pair, key):
        store, _ = pair
        with pytest.raises(ZarrfsError) as failure:
            store.get_sync(key)
        assert isinstance(failure.value, (MetadataError, StoreError))
