"""Reference sets as stores, in-process: which SOURCEs name one, listing and reading them, clear errors.

kerchunk makes the references of a netCDF4 file netCDF4 wrote (tests/support/reference_files.py).
"""

from __future__ import annotations

import functools
import http.server
import json
import threading

import pytest
from fsspec.implementations.local import LocalFileSystem

from zarrfs.errors import UserError
from zarrfs.storage.references import open_references_sync
from zarrfs.storage.remote import missing_backend
from zarrfs.storage.store import Store

from support import reference_files as rf


@pytest.fixture(scope="module")
def nc(tmp_path_factory):
    """(directory, netCDF4 file, its values, its kerchunk references)."""
    d = tmp_path_factory.mktemp("refs")
    path = d / "t.nc"
    values = rf.write_netcdf(path)
    refs = rf.kerchunk_refs(path)
    rf.write_json(refs, d / "refs.json")
    rf.write_parquet(refs, str(d / "refs.parq"))
    return d, path, values, refs


def _open(source, storage_options=None, remote_protocol=None, remote_options=None):
    fs = open_references_sync(str(source), storage_options or {}, remote_protocol, remote_options, 10.0, str(source))
    return fs if fs is None else Store(str(source), fs=fs)


@pytest.mark.parametrize("how", ["json", "parquet", "reference-url"])
def test_store_over_references_lists_and_reads(nc, how):
    """The root lists the variables (on main it listed nothing), and each key reads what kerchunk recorded."""
    d, path, values, refs = nc
    if how == "reference-url":
        store = _open("reference://", {"fo": str(d / "refs.json")})
    else:
        store = _open(d / ("refs.json" if how == "json" else "refs.parq"))
    files, dirs = store.list_dir_sync("")
    assert dirs == list(rf.VARIABLES)
    assert {".zgroup", ".zattrs"} <= set(files)
    chunked = {k.split("/", 1)[1] for k in refs["refs"] if k.startswith("chunked/")}
    assert set(store.list_dir_sync("chunked")[0]) == chunked
    below = store.sizes_below_sync("")
    assert set(refs["refs"]) <= set(below)
    assert json.loads(store.get_sync(".zattrs"))["title"] == "reference test"
    raw = path.read_bytes()
    for key, ref in refs["refs"].items():
        if isinstance(ref, list):
            url, offset, size = ref
            assert store.get_sync(key) == raw[offset : offset + size], key
    assert store.get_sync("small/0") == values["small"].astype("<f8").tobytes()
    assert store.get_sync("chunked/9.9") is None
    assert store.read_only and not store.is_local  # no local fast path reads the reference file as chunks


def test_chunk_reads_are_ranged_reads_of_the_data_file(nc, monkeypatch):
    """Every chunk read, alone or several at once, reads its byte range of the file and nothing more."""
    d, path, values, refs = nc
    calls = []
    cat_file = LocalFileSystem.cat_file

    def recording(self, p, start=None, end=None, **kw):
        calls.append((p, start, end))
        return cat_file(self, p, start=start, end=end, **kw)

    monkeypatch.setattr(LocalFileSystem, "cat_file", recording)
    store = _open(d / "refs.json")
    keys = [k for k, v in refs["refs"].items() if isinstance(v, list)]
    assert len(keys) > 2
    want = {(str(path), refs["refs"][k][1], refs["refs"][k][1] + refs["refs"][k][2]) for k in keys}
    calls.clear()
    store.get_sync(keys[0])
    assert calls == [(str(path), refs["refs"][keys[0]][1], refs["refs"][keys[0]][1] + refs["refs"][keys[0]][2])]
    calls.clear()
    got = store.get_many_sync(keys)
    assert sorted(calls) == sorted(want)
    assert all(got[k] is not None for k in keys)


def test_other_sources_are_not_references(nc, tmp_path):
    """A directory named like a reference file, and a Zarr store named .parq, stay stores."""
    d = tmp_path / "data.json"
    d.mkdir()
    assert _open(d) is None
    store = tmp_path / "x.parq"
    store.mkdir()
    (store / ".zmetadata").write_text(json.dumps({"zarr_consolidated_format": 1, "metadata": {}}))
    assert _open(store) is None
    assert _open(nc[0]) is None


@pytest.mark.parametrize(
    "doc, says",
    [
        ({"zarr_format": 3, "node_type": "group"}, "a Zarr metadata document, not references"),
        ({"hello": 1}, "not fsspec references"),
        ([1, 2], "not fsspec references"),
        ({"version": 2, "refs": {}}, "references of version 2"),
    ],
)
def test_json_that_is_not_references_is_one_line(tmp_path, doc, says):
    path = tmp_path / "zarr.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(UserError, match=says):
        _open(path)


def test_a_netcdf_file_as_source_points_to_references(nc):
    with pytest.raises(UserError, match="a netCDF4/HDF5 file, not a Zarr store: mount kerchunk's references"):
        _open(nc[1])


def test_relative_data_paths_are_refused(nc, tmp_path):
    """The daemon runs from `/`: a relative data path would fail every read, so it fails the mount."""
    refs = rf.kerchunk_refs(nc[1], url="t.nc")
    with pytest.raises(UserError, match=r"reference '.*': data file t.nc is a relative path"):
        _open(rf.write_json(refs, tmp_path / "rel.json"))


def test_missing_backend_names_the_extra():
    try:
        import aiohttp_absent  # noqa: F401
    except ModuleNotFoundError as e:
        assert missing_backend(e) is None
    for module, extra in (("s3fs", "s3"), ("aiohttp", "http"), ("gcsfs", "gcs"), ("pyarrow", "references")):
        try:
            raise ImportError("Install it") from ModuleNotFoundError(f"No module named '{module}'", name=module)
        except ImportError as e:
            said = missing_backend(e)
        assert f"pip install 'zarrfs[{extra}]'" in said, said
        assert extra in said.split("ZARRFS_EXTRAS=")[1].split()[0].split(","), said


class _Recording(http.server.SimpleHTTPRequestHandler):
    """Serves a directory and keeps the Authorization header of every request."""

    seen: list = []

    def do_GET(self):
        type(self).seen.append((self.server.server_port, self.path, self.headers.get("Authorization")))
        super().do_GET()

    def log_message(self, *args):
        pass


@pytest.fixture
def two_servers(tmp_path):
    servers = []
    for _ in range(2):
        handler = functools.partial(_Recording, directory=str(tmp_path))
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
    _Recording.seen = []
    yield [f"http://127.0.0.1:{s.server_port}" for s in servers]
    for server in servers:
        server.shutdown()
        server.server_close()


def test_a_web_servers_headers_go_to_that_server_only(tmp_path, two_servers):
    """storage_options of a reference file on HTTP (a token in its headers) reach the data files on its
    server, never one the references name elsewhere."""
    own, other = two_servers
    (tmp_path / "data.bin").write_bytes(bytes(range(100)))
    doc = {".zgroup": "{}", "a/0": [f"{own}/data.bin", 0, 10], "a/1": [f"{other}/data.bin", 10, 10]}
    (tmp_path / "refs.json").write_text(json.dumps(doc))
    token = "Bearer not-for-other-servers"
    store = _open(f"{own}/refs.json", {"headers": {"Authorization": token}})
    assert store.get_sync("a/0") == bytes(range(10)) and store.get_sync("a/1") == bytes(range(10, 20))
    ports = {url: int(url.rsplit(":", 1)[1]) for url in two_servers}
    assert {(p, path, auth) for p, path, auth in _Recording.seen if path == "/data.bin"} == {
        (ports[own], "/data.bin", token),
        (ports[other], "/data.bin", None),
    }
