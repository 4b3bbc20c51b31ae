"""One bad node fails alone, without FUSE (issue 8): the formats turn every failure of one
node's documents into that node's BrokenNode, refuse absurd shapes at parse time, check
consolidated keys like listed ones; the tree leaves out names no file can have."""

from __future__ import annotations

import json
import logging
import os
import re

import numpy as np
import pytest
import zarr

from zarrfs.errors import MetadataError, StoreError
from zarrfs.formats import open_hierarchy_sync
from zarrfs.formats.base import parse_json
from zarrfs.formats.v2 import parse_array as v2_parse_array
from zarrfs.model import ArrayMeta, BrokenNode, GroupMeta
from zarrfs.storage.store import Store
from zarrfs.tree.namespace import name_problem

from support.core import np_save_bytes, read_npy

pytestmark = pytest.mark.filterwarnings("ignore")


def test_deep_json_is_a_metadata_error():
    with pytest.raises(MetadataError, match="a/.zarray: JSON nested too deeply"):
        parse_json("a/.zarray", b"[" * 200_000 + b"]" * 200_000)


@pytest.mark.parametrize(
    "shape,chunks,what",
    [
        ([2**62, 2**62], [1, 1], "too large"),  # 2^126 bytes: over st_size
        ([2**63 - 100], [2**20], "too large"),  # fits 2^63-1 as elements, not with 4-byte elements and a header
        ([0, 2**64], [1, 1], "over 2^63-1"),  # empty, but numpy cannot index the second dimension
        ([10], [2**62], "chunks"),  # one chunk of 2^64 bytes
    ],
)
def test_absurd_shape_is_refused_at_parse_time(shape, chunks, what):
    doc = {
        "zarr_format": 2,
        "shape": shape,
        "chunks": chunks,
        "dtype": "<i4",
        "compressor": None,
        "fill_value": 0,
        "order": "C",
        "filters": None,
    }
    with pytest.raises(MetadataError, match=r"huge/\.zarray: .*" + re.escape(what)):
        v2_parse_array("huge", doc, {})


def test_file_size_bound_is_exact():
    """An array as large as a file may be (with its NPY header) is ordinary; one byte more is refused."""
    n = 2**63 - 1 - 128  # the NPY header of a 1-d u1 array is 128 bytes
    doc = {
        "zarr_format": 2,
        "shape": [n],
        "chunks": [2**30],
        "dtype": "|u1",
        "compressor": None,
        "fill_value": 0,
        "order": "C",
        "filters": None,
    }
    assert v2_parse_array("big", doc, {}).nbytes == n
    with pytest.raises(MetadataError, match="too large"):
        v2_parse_array("big", {**doc, "shape": [n + 1]}, {})


def _store_with_bad_siblings(path, fmt, outside):
    root = zarr.open_group(str(path), mode="w", zarr_format=fmt)
    root.create_array("ok", shape=(3,), dtype="<i4")[:] = [1, 2, 3]
    doc = ".zarray" if fmt == 2 else "zarr.json"
    os.mkdir(path / "deep")
    (path / "deep" / doc).write_text("[" * 100_000 + "]" * 100_000)
    os.mkdir(path / "link")
    outside.write_text((path / "ok" / doc).read_text())
    os.symlink(outside, path / "link" / doc)
    return doc


@pytest.mark.parametrize("fmt", [2, 3])
def test_children_survive_bad_documents(tmp_path, fmt):
    doc = _store_with_bad_siblings(tmp_path / "s", fmt, tmp_path / "outside.json")
    h = open_hierarchy_sync(Store(str(tmp_path / "s")))
    nodes = {n.path: n for n in h.children_sync("")}
    assert isinstance(nodes["ok"], ArrayMeta)
    assert isinstance(nodes["deep"], BrokenNode) and nodes["deep"].key == f"deep/{doc}"
    assert "nested too deeply" in str(nodes["deep"].error)
    assert isinstance(nodes["link"], BrokenNode) and nodes["link"].key == f"link/{doc}"
    assert isinstance(nodes["link"].error, StoreError) and "outside the store" in str(nodes["link"].error)
    assert read_npy(str(tmp_path / "s"), "ok") == np_save_bytes(np.array([1, 2, 3], "<i4"))


def test_v3_draft_children_survive_a_symlinked_document(tmp_path):
    core = "https://purl.org/zarr/spec/core/3.0"
    (tmp_path / "s" / "meta").mkdir(parents=True)
    (tmp_path / "s" / "zarr.json").write_text(json.dumps({"zarr_format": core}))
    (tmp_path / "s" / "meta" / "g.group.json").write_text(json.dumps({"attributes": {}}))
    (tmp_path / "outside.json").write_text(json.dumps({"attributes": {}}))
    os.symlink(tmp_path / "outside.json", tmp_path / "s" / "meta" / "bad.group.json")
    h = open_hierarchy_sync(Store(str(tmp_path / "s")))
    nodes = {n.path: n for n in h.children_sync("")}
    assert isinstance(nodes["g"], GroupMeta)
    assert isinstance(nodes["bad"], BrokenNode) and nodes["bad"].key == "meta/bad.group.json"
    assert isinstance(h.node_sync("bad"), BrokenNode)


def test_v2_consolidated_keys_are_checked(tmp_path, caplog):
    path = tmp_path / "s"
    root = zarr.open_group(str(path), mode="w", zarr_format=2)
    root.create_array("g/a", shape=(3,), dtype="<i4")
    zarr.consolidate_metadata(str(path))
    doc = json.loads((path / ".zmetadata").read_text())
    array = doc["metadata"]["g/a/.zarray"]
    for key in ("/evil/.zarray", "../.zarray", "g/../x/.zarray", "g//y/.zarray"):
        doc["metadata"][key] = array
    (path / ".zmetadata").write_text(json.dumps(doc))
    with caplog.at_level(logging.WARNING):
        h = open_hierarchy_sync(Store(str(path)))
    assert sorted(h.consolidated) == ["", "g", "g/a"]
    assert [n.path for n in h.children_sync("")] == ["g"]
    assert sum("hostile key" in r.message for r in caplog.records) == 4


def test_v3_consolidated_keys_are_checked(tmp_path, caplog):
    path = tmp_path / "s"
    root = zarr.open_group(str(path), mode="w", zarr_format=3)
    root.create_array("g/a", shape=(3,), dtype="<i4")
    zarr.consolidate_metadata(str(path))
    doc = json.loads((path / "zarr.json").read_text())
    meta = doc["consolidated_metadata"]["metadata"]
    for key in ("/evil", "..", "g/..", ""):
        meta[key] = meta["g/a"]
    (path / "zarr.json").write_text(json.dumps(doc))
    with caplog.at_level(logging.WARNING):
        h = open_hierarchy_sync(Store(str(path)))
    assert sorted(h.consolidated) == ["", "g", "g/a"]
    assert isinstance(h.node_sync(""), GroupMeta)
    assert [n.path for n in h.children_sync("")] == ["g"]
    assert sum("consolidated metadata" in r.message for r in caplog.records) == 4


@pytest.mark.parametrize(
    "name,ok",
    [
        ("a.npy", True),
        ("é" * 127, True),
        ("x" * 255, True),
        ("x" * 256, False),
        ("é" * 128, False),
        ("", False),
        (".", False),
        ("..", False),
        ("a/b", False),
        ("a\0b", False),
        ("\ud800", False),
    ],
)
def test_name_problem(name, ok):
    assert (name_problem(name) is None) == ok
