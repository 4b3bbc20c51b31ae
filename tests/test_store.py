"""The store: absent keys, listing, and keys that would leave the store."""

import os

import pytest

from zarrfs.errors import MetadataError, StoreError
from zarrfs.model import ChunkKeys, check_key
from zarrfs.store import Store


def test_get_list_absent(tmp_path):
    (tmp_path / "g").mkdir()
    (tmp_path / "g" / "k").write_bytes(b"v")
    (tmp_path / ".zgroup").write_text("{}")
    s = Store(str(tmp_path))
    assert s.get_sync("g/k") == b"v"
    assert s.get_sync("g/missing") is None
    assert s.get_sync("g") is None  # a directory is not a key
    assert s.list_dir_sync("") == ({".zgroup": 2}, ["g"])
    assert s.list_dir_sync("nope") == ({}, [])
    assert s.sizes_below_sync("") == {".zgroup": 2, "g/k": 1}
    assert s.get_range_sync("g/k", 0, 10) == b"v" and s.size_sync("g/k") == 1
    assert s.get_many_sync(["g/k", "x"]) == {"g/k": b"v", "x": None}


@pytest.mark.parametrize("key", ["../x", "a/../../x", "/etc/passwd", "a//b", "a/./b", "a\\b", "a\0b"])
def test_hostile_keys_refused(tmp_path, key):
    with pytest.raises(MetadataError):
        check_key(key)
    with pytest.raises(MetadataError):
        Store(str(tmp_path)).get_sync(key)


def test_symlink_out_of_store_refused(tmp_path):
    outside = tmp_path / "secret"
    outside.write_bytes(b"secret")
    store = tmp_path / "s"
    store.mkdir()
    os.symlink(outside, store / "link")
    with pytest.raises(StoreError, match="outside"):
        Store(str(store)).get_sync("link")


def test_chunk_keys_from_hostile_prefix():
    with pytest.raises(MetadataError):
        ChunkKeys("../up", "/", "c/", "c").key((0, 1))
    assert ChunkKeys("g/a", "/", "c/", "c").key((0, 1)) == "g/a/c/0/1"
    assert ChunkKeys("g/a", "/", "c/", "c").key(()) == "g/a/c"
    assert ChunkKeys("", ".", "", "0").key((3, 4)) == "3.4"


def test_symlinked_directory_out_of_store_refused(tmp_path):
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "k").write_bytes(b"secret")
    store = tmp_path / "s"
    store.mkdir()
    os.symlink(outside, store / "d")
    s = Store(str(store))
    with pytest.raises(StoreError, match="outside"):
        s.get_sync("d/k")
    os.symlink(store / "real", store / "inside")  # a link that stays inside is fine
    (store / "real").mkdir()
    (store / "real" / "k").write_bytes(b"ok")
    assert s.get_sync("inside/k") == b"ok"
