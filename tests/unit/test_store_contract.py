"""Every kind of store keeps one contract (tests/support/store_contract.py): a local directory,
fsspec's memory file system, a web server (python -m http.server, read-only), S3 (moto's server
on loopback), a disk cache in front of a remote store, a reference set, an Icechunk repository.
Each oracle reaches the keys without the store: the file system, fsspec, s3fs, icechunk."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path

import fsspec
import pytest

from zarrfs.storage.base import BaseStore
from zarrfs.storage.diskcache import DiskCache, DiskCachedStore
from zarrfs.storage.icechunk import IcechunkStore
from zarrfs.storage.references import open_references_sync
from zarrfs.storage.store import Store

from support.http_server import HttpServer
from support.s3 import BUCKET, CREDENTIALS, moto_server
from support.store_contract import HIERARCHY, Oracle, StoreContract


class FileOracle(Oracle):
    """Keys as files below a directory."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def put(self, key: str, value: bytes) -> None:
        path = self.root / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(value)

    def get(self, key: str) -> bytes | None:
        path = self.root / key
        return path.read_bytes() if path.is_file() else None


class FsspecOracle(Oracle):
    """Keys as objects below a prefix of an fsspec file system (its own instance)."""

    def __init__(self, fs: fsspec.AbstractFileSystem, prefix: str) -> None:
        self.fs, self.prefix = fs, prefix

    def put(self, key: str, value: bytes) -> None:
        self.fs.pipe_file(f"{self.prefix}/{key}", value)

    def get(self, key: str) -> bytes | None:
        try:
            return self.fs.cat_file(f"{self.prefix}/{key}")
        except FileNotFoundError:
            return None


class TestLocal(StoreContract):
    def oracle(self, tmp_path):
        return FileOracle(tmp_path / "store")

    def open(self, tmp_path, oracle):
        return Store(str(tmp_path / "store"))


class TestMemory(StoreContract):
    def oracle(self, tmp_path):
        self.name = f"memory://contract-{uuid.uuid4().hex}"
        return FsspecOracle(fsspec.filesystem("memory"), self.name.removeprefix("memory://"))

    def open(self, tmp_path, oracle):
        return Store(self.name)


class TestHttp(StoreContract):
    writable = False
    sizes_listed = False  # a directory listing of http.server gives names only

    @pytest.fixture(autouse=True)
    def server(self, tmp_path):
        self.served = HttpServer(tmp_path / "served", tmp_path / "http.log")
        (tmp_path / "served").mkdir()
        self.served.start()
        yield
        self.served.stop()

    def oracle(self, tmp_path):
        return FileOracle(tmp_path / "served")

    def open(self, tmp_path, oracle):
        return Store(self.served.url("").rstrip("/"))


@pytest.fixture(scope="module")
def s3_endpoint(tmp_path_factory):
    with moto_server(tmp_path_factory.mktemp("moto") / "moto.log") as (endpoint, _fs):
        yield endpoint


def _s3_options(endpoint: str) -> dict:
    return {"client_kwargs": {"endpoint_url": endpoint}, **CREDENTIALS}


class TestS3(StoreContract):
    @pytest.fixture(autouse=True)
    def endpoint(self, s3_endpoint):
        self.options = _s3_options(s3_endpoint)

    def oracle(self, tmp_path):
        import s3fs

        self.prefix = f"{BUCKET}/{uuid.uuid4().hex}"
        return FsspecOracle(s3fs.S3FileSystem(skip_instance_cache=True, **self.options), self.prefix)

    def open(self, tmp_path, oracle):
        return Store(f"s3://{self.prefix}", self.options)


class TestDiskCached(TestS3):
    """The disk cache in front of S3, with a TTL long enough that only `refresh` checks again."""

    def open(self, tmp_path, oracle):
        remote = super().open(tmp_path, oracle)
        cache = DiskCache(str(tmp_path / "disk-cache"), 64 << 20)
        return DiskCachedStore(remote, cache, f"s3://{self.prefix}", ttl_s=3600.0)

    def test_a_value_read_twice_is_fetched_once(self, pair):
        store, _ = pair
        first = bytes(store.get_sync("a/c/1", None))
        gets = store.request_stats()["store_gets"]
        assert bytes(store.get_sync("a/c/1", None)) == first
        assert store.request_stats()["store_gets"] == gets


class TestReferences(StoreContract):
    """A kerchunk reference set (version 1 JSON): documents inline, chunks as ranges of one data file."""

    writable = False
    refreshes = False  # references name fixed byte ranges

    def oracle(self, tmp_path):
        return FileOracle(tmp_path / "values")

    def open(self, tmp_path, oracle):
        data, refs = bytearray(), {}
        for key in HIERARCHY:
            value = oracle.get(key)
            if key.endswith("zarr.json"):
                refs[key] = value.decode()
            else:
                refs[key] = [str(tmp_path / "data.bin"), len(data), len(value)]
                data += value
        (tmp_path / "data.bin").write_bytes(bytes(data))
        (tmp_path / "refs.json").write_text(json.dumps({"version": 1, "refs": refs}))
        source = str(tmp_path / "refs.json")
        fs = open_references_sync(source, {}, None, None, 10.0, source)
        return Store(source, fs=fs)


class IcechunkOracle(Oracle):
    """The keys of branch main of a repository, through icechunk's own session store."""

    def __init__(self, path: Path) -> None:
        import icechunk

        self.icechunk = icechunk
        self.repo = icechunk.Repository.create(icechunk.local_filesystem_storage(str(path)))

    def put(self, key: str, value: bytes) -> None:
        from zarr.core.buffer import cpu

        session = self.repo.writable_session("main")
        asyncio.run(session.store.set(key, cpu.Buffer.from_bytes(value)))
        session.commit(f"put {key}")

    def get(self, key: str) -> bytes | None:
        from zarr.core.buffer import default_buffer_prototype

        store = self.icechunk.Repository.open(self.repo.storage).readonly_session(branch="main").store
        value = asyncio.run(store.get(key, default_buffer_prototype()))
        return None if value is None else value.to_bytes()


class TestIcechunk(StoreContract):
    """A branch of a local repository, writable: each write lands in the session, `settle` commits."""

    refreshes = False  # a snapshot never changes; a branch is followed by follow_tip_sync
    sizes_listed = False

    def oracle(self, tmp_path):
        return IcechunkOracle(tmp_path / "repo")

    def open(self, tmp_path, oracle):
        return IcechunkStore(str(tmp_path / "repo"), writable=True)

    def settle(self, store):
        assert isinstance(store, IcechunkStore)
        store.commit_sync("contract")


def test_every_kind_of_store_is_under_contract():
    """Each implementation of BaseStore in zarrfs has its contract test class here."""
    import zarrfs.storage.diskcache
    import zarrfs.storage.icechunk
    import zarrfs.storage.store  # noqa: F401

    tested = {Store, DiskCachedStore, IcechunkStore}
    assert set(BaseStore.__subclasses__()) == tested
