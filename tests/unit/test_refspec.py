"""fsspec's reference format 0 and 1 as zarrfs reads it: every construct against fsspec's own reader, and what is refused at mount.

The oracle is fsspec's ReferenceFileSystem with jinja2 templates (`simple_templates=False`, the
only way it expands `gen` entries) reading the same document.
"""

from __future__ import annotations

import base64
import json

import pytest
from fsspec.implementations.reference import ReferenceFileSystem, ReferenceNotReachable

from zarrfs.errors import UserError
from zarrfs.storage.references import open_references_sync

DATA = bytes(range(256)) * 4


@pytest.fixture
def data(tmp_path):
    path = tmp_path / "data.bin"
    path.write_bytes(DATA)
    return path


def _open(tmp_path, doc, **kw):
    path = tmp_path / "refs.json"
    path.write_text(json.dumps(doc))
    return open_references_sync(str(path), {}, kw.get("remote_protocol"), None, 10.0, "refs.json")


def _same_as_fsspec(fs, doc):
    # One file system per protocol, as fsspec's `fs` option gives them (its default keeps the first one's).
    oracle = ReferenceFileSystem(doc, simple_templates=False, fs={"file": {}, "memory": {}})
    assert set(fs.references) == set(oracle.references)
    for key in oracle.references:
        want = oracle.cat_file(key)
        got = fs.cat_file(key)
        if key.endswith(".zgroup"):
            assert json.loads(got) == json.loads(want), key
        else:
            assert got == want, key
        assert fs.cat_file(key, start=1, end=3) == want[1:3], key


def test_version_0_every_kind_of_value(tmp_path, data):
    doc = {
        ".zgroup": {"zarr_format": 2},
        "text": "plain text",
        "b64": "base64:" + base64.b64encode(b"\x00\xffbinary").decode(),
        "range": [str(data), 100, 50],
        "file": [f"file://{data}"],
        "empty": [str(data), 7, 0],
    }
    _same_as_fsspec(_open(tmp_path, doc), doc)


def test_version_1_templates_and_gen(tmp_path, data):
    """Plain templates, templates that take arguments, and `gen` with ranges and lists, with and without offsets."""
    doc = {
        "version": 1,
        "templates": {"u": str(data), "d": str(data.parent), "f": "{{c}}.bin"},
        "gen": [
            {
                "key": "g/{{i}}.{{j}}",
                "url": "{{u}}",
                "offset": "{{(i * 4 + j) * 16}}",
                "length": "16",
                "dimensions": {"i": {"stop": 3}, "j": {"start": 1, "stop": 5, "step": 2}},
            },
            {"key": "w/{{n}}", "url": "file://{{u}}", "dimensions": {"n": [0, 7]}},
        ],
        "refs": {
            ".zgroup": {"zarr_format": 2},
            "plain": ["{{u}}", 10, 20],
            "called": ["{{d}}/{{f(c='data')}}", 3, 5],
            "inline": "x",
            "b64": "base64:AAEC",
        },
    }
    fs = _open(tmp_path, doc)
    assert len([k for k in fs.references if k.startswith("g/")]) == 6
    _same_as_fsspec(fs, doc)


def test_gen_reads_what_fsspec_reads_not_fill(tmp_path, data):
    """The issue's example: fsspec's default reader drops `gen` (its keys read as absent, fill)."""
    doc = {
        "version": 1,
        "refs": {".zgroup": {"zarr_format": 2}},
        "gen": [
            {"key": "g/{{i}}", "url": str(data), "offset": "{{i*10}}", "length": "10", "dimensions": {"i": {"stop": 5}}}
        ],
    }
    fs = _open(tmp_path, doc)
    assert [fs.cat_file(f"g/{i}") for i in range(5)] == [DATA[i * 10 : i * 10 + 10] for i in range(5)]
    assert "g/0" not in ReferenceFileSystem(doc).references  # fsspec's default: dropped


def test_mixed_protocols_each_read_by_its_own_file_system(tmp_path, data):
    """A local path and a memory:// target in one set (fsspec keeps one file system: the first protocol's)."""
    import fsspec

    memory = fsspec.filesystem("memory")
    memory.pipe("/refs-test/other.bin", DATA[::-1])
    doc = {".zgroup": {"zarr_format": 2}, "a/0": [str(data), 0, 8], "a/1": ["memory:///refs-test/other.bin", 0, 8]}
    fs = _open(tmp_path, doc)
    _same_as_fsspec(fs, doc)
    with pytest.raises(ReferenceNotReachable):
        ReferenceFileSystem(doc).cat_file("a/1")  # fsspec's default: the first protocol's file system only


@pytest.mark.parametrize(
    "doc, says",
    [
        ({"version": 2, "refs": {}}, "references of version 2"),
        ({"version": 1, "refs": {}, "extra": 1}, "fields zarrfs does not understand: extra"),
        ({".zgroup": "{}", "a/0": 42}, "reference 'a/0' is not understood"),
        ({".zgroup": "{}", "a/0": ["/x", 1]}, "reference 'a/0' is not understood"),
        ({".zgroup": "{}", "a/0": ["/x", -1, 4]}, "reference 'a/0' is not understood"),
        ({".zgroup": "{}", "a/0": [None, 0, 4]}, "reference 'a/0' is not understood"),
        ({".zgroup": "{}", "a/0": "base64:!!"}, "base64: data does not decode"),
        ({".zgroup": "{}", "a/0": ["nosuch://x", 0, 4]}, "protocol 'nosuch' is not one fsspec knows"),
        ({".zgroup": "{}", "a/0": ["zip://a::file:///x.zip", 0, 4]}, "a chained URL"),
        ({".zgroup": "{}", "a/0": ["data.nc", 0, 4]}, "a relative path"),
        ({".zgroup": "{}", "a/0": ["~/.ssh/id_rsa", 0, 4]}, "a relative path"),
        ({"version": 1, "refs": {"a/0": ["{{nope}}", 0, 4]}}, "does not render"),
        ({"version": 1, "refs": {}, "gen": [{"key": "k{{i}}", "url": "/x"}]}, "gen entry 0: expected the fields"),
        (
            {
                "version": 1,
                "refs": {},
                "gen": [{"key": "k{{i}}", "url": "/x", "offset": "1", "dimensions": {"i": [1]}}],
            },
            "offset and length go together",
        ),
        (
            {"version": 1, "refs": {}, "gen": [{"key": "k{{i}}", "url": "/x", "dimensions": {"i": {"stop": 10**9}}}]},
            "more than the",
        ),
        *(
            ({"version": 1, "refs": {}, "gen": [{"key": key, "url": "/x", "dimensions": {"i": [1]}}]}, "template")
            for key in (
                "{{ 'a' * 10**9 }}",  # what a reference file may do to the daemon's memory
                "{{ 2**100000 }}",
                "{{ ((2**64)**64)**64 }}",
                "{{ 'a'.center(10**9) }}",
                "{{ 'a'|center(10**9) }}",
                "{{ lipsum(10**6) }}",
                "{% for j in range(10**5) %}{{ j }}{% endfor %}",
                "{% set s = 'a' * 4096 %}{{ s }}",
            )
        ),
    ],
)
def test_what_is_not_understood_is_refused_at_mount(tmp_path, doc, says):
    with pytest.raises(UserError, match=says) as e:
        _open(tmp_path, doc)
    assert "\n" not in str(e.value)
