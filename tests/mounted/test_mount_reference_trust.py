"""Reference sets that name what the mount does not trust, mix protocols, and use every construct of fsspec's format.

A `python -m http.server` (which ignores Range) serves the netCDF4 file and the remote
reference files; moto serves S3. Oracles: netCDF4's values of the file, zarr-python reading the
same reference set through fsspec's ReferenceFileSystem, and np.save of the arrays written raw.
"""

from __future__ import annotations

import base64
import errno
import json
import os

import numpy as np
import pytest

from support import mounting, oracles
from support import reference_files as rf
from support.http_server import HttpServer
from support.s3 import BUCKET, CREDENTIALS

SECRET = b"-----BEGIN OPENSSH PRIVATE KEY----- not for the mount's readers -----END-----\n"
RANGES_IGNORED = "ignores Range requests"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """(server, served directory, netCDF4 file's values, its references, the secret file outside it)."""
    root = tmp_path_factory.mktemp("trust")
    docroot = root / "www"
    docroot.mkdir()
    values = rf.write_netcdf(docroot / "t.nc")
    refs = rf.kerchunk_refs(docroot / "t.nc")
    secret = root / "home" / ".ssh" / "id_rsa"
    secret.parent.mkdir(parents=True)
    secret.write_bytes(SECRET)
    server = HttpServer(docroot, root / "http.server.log")
    server.start()
    try:
        yield server, docroot, values, refs, secret
    finally:
        server.stop()


def _u1(name: str, size: int, chunk: int) -> dict:
    zarray = {"zarr_format": 2, "shape": [size], "chunks": [chunk], "dtype": "|u1"}
    zarray.update(compressor=None, filters=None, fill_value=0, order="C")
    return {f"{name}/.zarray": json.dumps(zarray), f"{name}/.zattrs": "{}"}


def _with_secret(refs: dict, url: str, secret) -> dict:
    """REFS with the data file at URL, plus two arrays naming SECRET: a byte range of it, and all of it."""
    out = json.loads(json.dumps(refs))
    out["refs"] = {k: [url, *v[1:]] if isinstance(v, list) else v for k, v in out["refs"].items()}
    out["refs"].update({**_u1("stolen", 40, 40), "stolen/0": [str(secret), 0, 40]})
    out["refs"].update({**_u1("whole", len(SECRET), len(SECRET)), "whole/0": [f"file://{secret}"]})
    return out


def _every_file(mnt):
    for top, _dirs, files in os.walk(mnt):
        for name in files:
            yield os.path.join(top, name)


@pytest.mark.parametrize("allow_other", [False, True])
def test_remote_references_never_read_a_local_file(served, mount, allow_other):
    """refs.json over HTTP naming a local secret: its arrays read EIO, one log line names the prefix and
    the option, and the secret is in no file of the mount; the listing and the other arrays are intact."""
    server, docroot, values, refs, secret = served
    (docroot / "evil.json").write_text(json.dumps(_with_secret(refs, server.url("t.nc"), secret)))
    mnt = mount(server.url("evil.json"), "show_views", *(["allow_other"] if allow_other else []))
    assert sorted(os.listdir(mnt)) == sorted([".zarrfs", *(f"{n}.npy" for n in (*rf.VARIABLES, "stolen", "whole"))])
    for name in ("stolen", "whole"):
        with pytest.raises(OSError) as e:
            (mnt / f"{name}.npy").read_bytes()
        assert e.value.errno == errno.EIO
        with pytest.raises(OSError):
            (mnt / ".zarrfs" / "store" / name / "0").read_bytes()
    for name in rf.VARIABLES:
        assert (mnt / f"{name}.npy").read_bytes() == oracles.npy_bytes(values[name]), name
    for path in _every_file(mnt):  # the views too (raw, tiff, netCDF of the group, store keys, info)
        try:
            with open(path, "rb") as f:
                assert SECRET[:20] not in f.read(), path
        except OSError as e:
            assert e.errno == errno.EIO, path
    prefix = f"file://{secret.parent}/"
    said = [ln for ln in mount.log_text(mnt).splitlines() if "authorize_virtual_chunk_access" in ln]
    assert len(said) == 1 and f"-o authorize_virtual_chunk_access={prefix}" in said[0], said
    assert SECRET[:20].decode() not in mount.log_text(mnt)


@pytest.mark.parametrize("kind", ["json", "parquet"])
def test_references_on_s3_never_read_a_local_file(served, s3, mount, kind):
    """The same from a bucket (moto): the arrays naming the secret read EIO, the others read."""
    server, docroot, values, refs, secret = served
    endpoint, fs = s3
    fs.put(str(docroot / "t.nc"), f"{BUCKET}/trust/t.nc")
    doc = _with_secret(refs, f"s3://{BUCKET}/trust/t.nc", secret)
    options = {"client_kwargs": {"endpoint_url": endpoint}, **CREDENTIALS}
    if kind == "json":
        fs.pipe(f"{BUCKET}/trust/evil.json", json.dumps(doc).encode())
        source = f"s3://{BUCKET}/trust/evil.json"
    else:
        source = rf.write_parquet(doc, f"s3://{BUCKET}/trust/evil.parq", **options)
    mnt = mount(source, "storage_options=" + json.dumps(options))
    for name in ("stolen", "whole"):
        with pytest.raises(OSError) as e:
            (mnt / f"{name}.npy").read_bytes()
        assert e.value.errno == errno.EIO
    for name in rf.VARIABLES:
        assert (mnt / f"{name}.npy").read_bytes() == oracles.npy_bytes(values[name]), name
    said = [ln for ln in mount.log_text(mnt).splitlines() if "authorize_virtual_chunk_access" in ln]
    assert len(said) == 1 and f"=file://{secret.parent}/" in said[0], said


def test_authorized_prefix_reads_local_files(served, mount):
    """The same references, with the secret's directory authorised: they read (the option's one meaning)."""
    server, docroot, values, refs, secret = served
    (docroot / "trusted.json").write_text(json.dumps(_with_secret(refs, server.url("t.nc"), secret)))
    mnt = mount(server.url("trusted.json"), f"authorize_virtual_chunk_access=file://{secret.parent}/")
    want = np.frombuffer(SECRET, "u1")
    assert (mnt / "stolen.npy").read_bytes() == oracles.npy_bytes(want[:40])
    assert (mnt / "whole.npy").read_bytes() == oracles.npy_bytes(want)
    assert "authorize_virtual_chunk_access" not in mount.log_text(mnt)


def test_a_link_out_of_an_authorized_directory_is_refused(served, mount, tmp_path):
    server, docroot, values, refs, secret = served
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    (allowed / "innocent.nc").symlink_to(secret)
    doc = _with_secret(refs, server.url("t.nc"), allowed / "innocent.nc")
    doc["refs"]["whole/0"] = [f"file://{allowed}/../../{secret.relative_to(secret.parents[2])}"]
    (docroot / "link.json").write_text(json.dumps(doc))
    mnt = mount(server.url("link.json"), f"authorize_virtual_chunk_access=file://{allowed}/")
    for name in ("stolen", "whole"):
        with pytest.raises(OSError) as e:
            (mnt / f"{name}.npy").read_bytes()
        assert e.value.errno == errno.EIO
    assert (mnt / "small.npy").read_bytes() == oracles.npy_bytes(values["small"])


def test_mixed_protocols_read_every_chunk(served, s3, mount, tmp_path):
    """One local reference file whose chunks lie on S3 (moto), a local path and http.server, in turn:
    every chunk reads, and the server that ignores Range is named once."""
    server, docroot, values, refs, _ = served
    endpoint, fs = s3
    fs.put(str(docroot / "t.nc"), f"{BUCKET}/mixed/t.nc")
    urls = [str(docroot / "t.nc"), f"s3://{BUCKET}/mixed/t.nc", server.url("t.nc")]  # remote_options: S3's
    doc = json.loads(json.dumps(refs))
    targets = [k for k, v in doc["refs"].items() if isinstance(v, list)]
    for i, key in enumerate(targets):
        doc["refs"][key] = [urls[i % 3], *doc["refs"][key][1:]]
    assert len(targets) >= 6
    source = rf.write_json(doc, tmp_path / "mixed.json")
    s3_options = {"client_kwargs": {"endpoint_url": endpoint}, **CREDENTIALS}
    mnt = mount(source, "remote_options=" + json.dumps(s3_options))
    for name in rf.VARIABLES:
        assert (mnt / f"{name}.npy").read_bytes() == oracles.npy_bytes(values[name]), name
    said = [ln for ln in mount.log_text(mnt).splitlines() if RANGES_IGNORED in ln]
    assert len(said) == 1 and f"http://127.0.0.1:{server.port}" in said[0], said


def test_remote_protocol_names_the_protocol_of_bare_paths(served, s3, mount, tmp_path):
    """`remote_protocol=s3` with `remote_options`: data files named `bucket/key` read from S3 (moto)."""
    _server, docroot, values, refs, _ = served
    endpoint, fs = s3
    fs.put(str(docroot / "t.nc"), f"{BUCKET}/bare/t.nc")
    doc = json.loads(json.dumps(refs))
    doc["refs"] = {k: [f"{BUCKET}/bare/t.nc", *v[1:]] if isinstance(v, list) else v for k, v in doc["refs"].items()}
    options = {"client_kwargs": {"endpoint_url": endpoint}, **CREDENTIALS}
    mnt = mount(
        rf.write_json(doc, tmp_path / "bare.json"), "remote_protocol=s3", "remote_options=" + json.dumps(options)
    )
    for name in rf.VARIABLES:
        assert (mnt / f"{name}.npy").read_bytes() == oracles.npy_bytes(values[name]), name


def test_range_ignoring_server_is_sliced(served, mount):
    """References and data both on http.server: each ranged read comes back whole and is cut to its range."""
    server, docroot, values, refs, _ = served
    doc = json.loads(json.dumps(refs))
    doc["refs"] = {k: [server.url("t.nc"), *v[1:]] if isinstance(v, list) else v for k, v in doc["refs"].items()}
    (docroot / "ranged.json").write_text(json.dumps(doc))
    mnt = mount(server.url("ranged.json"))
    for name in rf.VARIABLES:
        assert (mnt / f"{name}.npy").read_bytes() == oracles.npy_bytes(values[name]), name
    assert len([ln for ln in mount.log_text(mnt).splitlines() if RANGES_IGNORED in ln]) == 1


def test_gen_templates_inline_and_base64_read_as_zarr_python_reads_them(tmp_path, mount):
    """A version-1 set: an array of `gen` chunks, one of templated ones, one inline (text and base64),
    and one whole-file chunk; each reads as zarr-python over fsspec's ReferenceFileSystem reads it."""
    rng = np.random.default_rng(5)
    values = rng.integers(0, 2**31, size=(6, 8), dtype="<i4")
    values.tofile(tmp_path / "data.bin")
    extra = rng.integers(0, 256, size=16, dtype="u1")
    (tmp_path / "whole.bin").write_bytes(extra.tobytes())
    zarray = {"zarr_format": 2, "shape": [6, 8], "chunks": [2, 8], "dtype": "<i4"}
    zarray.update(compressor=None, filters=None, fill_value=7, order="C")
    doc = {
        "version": 1,
        "templates": {"u": str(tmp_path / "data.bin"), "d": str(tmp_path), "f": "{{c}}.bin"},
        "gen": [
            {
                "key": "g/{{i}}.0",
                "url": "{{u}}",
                "offset": "{{i * 64}}",
                "length": "64",
                "dimensions": {"i": {"stop": 3}},
            }
        ],
        "refs": {
            ".zgroup": {"zarr_format": 2},
            "g/.zarray": zarray,
            "t/.zarray": zarray,
            "t/0.0": ["{{u}}", 0, 64],
            "t/2.0": ["{{d}}/{{f(c='data')}}", 128, 64],
            **_u1("i", 32, 16),
            "i/0": "text, 16 bytes..",
            "i/1": "base64:" + base64.b64encode(bytes(range(200, 216))).decode(),
            **_u1("w", 16, 16),
            "w/0": ["{{d}}/whole.bin"],
        },
    }
    source = rf.write_json(doc, tmp_path / "v1.json")
    want = rf.zarr_arrays(doc, ["g", "t", "i", "w"])
    assert (want["g"] == values).all() and (want["t"][2:4] == 7).all()  # `gen` is data, not fill
    mnt = mount(source)
    for name, array in want.items():
        assert (mnt / f"{name}.npy").read_bytes() == oracles.npy_bytes(array), name


def test_parquet_references_in_several_record_files(served, tmp_path, mount):
    """fsspec's LazyReferenceMapper layout: the chunked variable's references span several record files."""
    _server, docroot, values, refs, _ = served
    source = rf.write_parquet(refs, str(tmp_path / "refs.parq"))
    assert len(list((tmp_path / "refs.parq" / "chunked").glob("refs.*.parq"))) > 1
    mnt = mount(source)
    for name in rf.VARIABLES:
        assert (mnt / f"{name}.npy").read_bytes() == oracles.npy_bytes(values[name]), name


@pytest.mark.parametrize(
    "entry, says",
    [
        ({"gen": [{"key": "a/{{i}}", "url": "/x"}]}, "gen entry 0: expected the fields"),
        ({"refs": {".zgroup": {"zarr_format": 2}, "a/0": ["/x", 1]}}, "reference 'a/0' is not understood"),
        ({"refs": {".zgroup": {"zarr_format": 2}}, "extensions": {}}, "fields zarrfs does not understand"),
    ],
)
def test_what_is_not_understood_fails_the_mount_in_one_line(tmp_path, entry, says):
    doc = {"version": 1, "refs": {".zgroup": {"zarr_format": 2}}, **entry}
    source = rf.write_json(doc, tmp_path / "bad.json")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    code, _out, stderr, was_mounted = mounting.run_expecting_failure(
        [*mounting.ZARRFS, str(source), str(mnt)], mnt, tmp_path
    )
    assert not was_mounted and code == 1
    assert len(stderr.splitlines()) == 1 and says in stderr, stderr
