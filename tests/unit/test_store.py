"""The store: absent keys, listing, and keys that would leave the store."""

import logging
import os
import uuid

import pytest

from zarrfs.errors import MetadataError, StoreError
from zarrfs.storage.keys import ChunkKeys, check_key
from zarrfs.storage.store import Store


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


# How long a refused read may take at most before we call it blocked (it takes microseconds;
# a FIFO opened for reading without O_NONBLOCK waits forever for a writer).
BLOCKED_AFTER_S = 10


def _without_blocking(fn, *args):
    """fn(*args) in a daemon thread: its result or exception, or a failure when it blocks."""
    import threading

    out: list = []

    def run():
        try:
            out.append(("ok", fn(*args)))
        except BaseException as e:  # noqa: BLE001 - handed to the test
            out.append(("error", e))

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(BLOCKED_AFTER_S)
    if t.is_alive():
        pytest.fail(f"{fn.__name__}{args} blocked")
    return out[0]


@pytest.mark.parametrize("read", ["get", "many", "range", "prefix", "suffix"])
@pytest.mark.parametrize("kind", ["fifo", "chardev"])
def test_only_regular_files_are_values(tmp_path, read, kind):
    """A FIFO or a device node inside the store is refused by every read, without blocking."""
    import stat

    if kind == "fifo":
        os.mkfifo(tmp_path / "k")
        name = "FIFO"
    else:  # the same device as /dev/zero: read without limit it never ends
        os.mknod(tmp_path / "k", stat.S_IFCHR | 0o600, os.makedev(1, 5))
        name = "character device"
    s = Store(str(tmp_path))
    fn, args = {
        "get": (s.get_sync, ("k",)),
        "many": (s.get_many_sync, (["k", "x"],)),
        "range": (s.get_range_sync, ("k", 0, 100)),
        "prefix": (s.get_prefix_sync, ("k", 100)),
        "suffix": (s.get_suffix_sync, ("k", 100)),
    }[read]
    status, value = _without_blocking(fn, *args)
    assert status == "error" and isinstance(value, StoreError), value
    assert f"'k' is not a regular file: {name}" in str(value)


def test_symlink_to_dev_zero_refused(tmp_path):
    os.symlink("/dev/zero", tmp_path / "k")
    status, value = _without_blocking(Store(str(tmp_path)).get_sync, "k", None)
    assert status == "error" and isinstance(value, StoreError) and "outside" in str(value)


def test_values_larger_than_their_bound_are_refused(tmp_path):
    (tmp_path / "k").write_bytes(b"x" * 100)
    s = Store(str(tmp_path))
    assert s.get_sync("k", 100) == b"x" * 100
    with pytest.raises(StoreError, match="'k' holds 100 bytes, more than the 99"):
        s.get_sync("k", 99)
    assert s.get_range_sync("k", 90, 200) == b"x" * 10 and s.get_suffix_sync("k", 5) == b"x" * 5
    assert s.get_prefix_sync("k", 3) == b"xxx" and s.get_range_sync("k", 200, 300) == b""
    with pytest.raises(StoreError):
        s.get_range_sync("absent", 0, 10)
    m = Store("memory://bounded-test")
    m.set_sync("k", b"y" * 10)
    assert m.get_sync("k", 10) == b"y" * 10
    with pytest.raises(StoreError, match="more than the 9"):
        m.get_sync("k", 9)


def test_a_value_that_fits_a_buffer_is_read_into_it(tmp_path):
    """Store.get_sync(into=): the bytes of a local key of exactly the buffer's size land in it
    (engine/spares.py reuses such buffers); a shorter value lands in its first bytes and comes
    back as a view of them (a worker's scratch buffer, engine/loads.py); a longer one, absence
    and non-files as without."""
    import numpy as np

    payload = os.urandom(300_000)
    (tmp_path / "k").write_bytes(payload)
    store = Store(str(tmp_path))
    buf = np.zeros(len(payload), np.uint8)
    assert store.get_sync("k", None, buf) is buf and buf.tobytes() == payload
    larger = np.zeros(len(payload) + 5, np.uint8)
    got = store.get_sync("k", None, larger)
    assert isinstance(got, memoryview) and got.obj is larger and len(got) == len(payload)
    assert bytes(got) == payload and not larger[len(payload) :].any()
    smaller = np.zeros(len(payload) - 1, np.uint8)
    got = store.get_sync("k", None, smaller)
    assert got == payload and not smaller.any()
    assert store.get_sync("absent", None, buf) is None
    with pytest.raises(StoreError, match="more than"):
        store.get_sync("k", 1000, buf)


@pytest.mark.parametrize("where", ["local", "memory"])
def test_a_value_streamed_in_and_a_time_set_where_the_store_can(tmp_path, where):
    import io
    import uuid

    s = Store(str(tmp_path) if where == "local" else f"memory://{uuid.uuid4().hex}")
    data = os.urandom(3 << 20)
    s.put_stream_sync("g/notes.bin", io.BytesIO(data), block_bytes=1 << 20)
    assert s.get_sync("g/notes.bin", None) == data
    if where == "local":
        assert s.set_mtime_sync("g/notes.bin", 1_234_567_890_123_456_789)
        assert os.stat(tmp_path / "g" / "notes.bin").st_mtime_ns == 1_234_567_890_123_456_789
        assert not [n for n in os.listdir(tmp_path / "g") if n != "notes.bin"]  # no temporary left
    else:
        assert not s.set_mtime_sync("g/notes.bin", 1_234_567_890_123_456_789)


def test_a_whole_object_sent_for_a_range_is_cut_and_the_server_named_once(monkeypatch, caplog):
    """A server that ignores Range (fault injected: cat_file sends the whole object): each ranged
    read is cut to its range (the oracle: slices of the bytes stored), reads are whole from then
    on (`ranges_ignored`), and one WARNING names the server, as for a reference set's targets."""
    s = Store(f"memory://{uuid.uuid4().hex}")
    whole = bytes(range(256)) * 4
    s.set_sync("k", whole)
    assert s.get_range_sync("k", 10, 20) == whole[10:20] and not s.ranges_ignored  # it honours Range
    monkeypatch.setattr(s.fs, "cat_file", lambda path, start=None, end=None: whole)
    caplog.set_level(logging.INFO)
    assert s.get_range_sync("k", 10, 20) == whole[10:20]
    assert s.get_prefix_sync("k", 100) == whole[:100]
    assert s.get_suffix_sync("k", 30) == whole[-30:]
    assert s.ranges_ignored
    said = [r for r in caplog.records if "ignores Range requests" in r.getMessage()]
    assert [r.levelno for r in said] == [logging.WARNING] and "memory://" in said[0].getMessage()
