"""The write-side helpers of the namespace that need no mount: which data bytes of a new
array arrived (Coverage), which names are held aside, and the formats' name rules."""

from __future__ import annotations

import random

import numpy as np
import pytest

from zarrfs.errors import InvalidArgument, MetadataError, NameTooLong
from zarrfs.formats.v2 import V2Hierarchy
from zarrfs.formats.v3 import V3Hierarchy
from zarrfs.model import BrokenNode
from zarrfs.storage.store import Store
from zarrfs.tree.incoming import Coverage
from zarrfs.tree.plain import is_plain_name

from support import builders, oracles
from support.builders import ArraySpec


def test_coverage_counts_each_byte_once_whatever_the_order():
    rng = random.Random(8)
    for _ in range(500):
        cov, seen = Coverage(), set()
        for _ in range(rng.randint(0, 10)):
            a = rng.randint(0, 80)
            b = rng.randint(a, 80)
            cov.add(a, b)
            seen |= set(range(a, b))
        assert cov.covered == len(seen)


@pytest.mark.parametrize(
    "name, held",
    [
        ("x.npy", False),
        (".x.npy.AbC123", True),
        ("tmp123", True),
        (".npy", True),
        (".hidden.npy", True),
        ("x.npy.part", True),
    ],
)
def test_held_names(name, held):
    assert is_plain_name(name) is held


def test_v3_and_v2_name_rules(tmp_path):
    v3, v2 = V3Hierarchy(Store(str(tmp_path))), V2Hierarchy(Store(str(tmp_path)))
    for bad in ("__x", "...", "zarr.json", ".zarrfs-new-1"):
        with pytest.raises(InvalidArgument):
            v3.check_name(bad)
    for bad in ("a\\b", ".zarray", ".zmetadata"):
        with pytest.raises(InvalidArgument):
            v2.check_name(bad)
    with pytest.raises(NameTooLong):
        v3.check_name("é" * 128)  # 256 bytes in UTF-8
    v3.check_name("café FOO")  # v3 allows any other name (its character set is a SHOULD)
    v2.check_name("foo", ["FOO"])  # case matters only in the protocol draft


@pytest.mark.parametrize(
    "fmt,encoding",
    [
        (2, {"name": "v2", "separator": "."}),
        (2, {"name": "v2", "separator": "/"}),
        (3, {"name": "default", "separator": "/"}),
        (3, {"name": "default", "separator": "."}),
    ],
    ids=["v2-dot", "v2-slash", "v3-slash", "v3-dot"],
)
def test_root_array_keys_are_the_files_zarr_wrote(tmp_path, fmt, encoding):
    """The keys a root array's replacement erases are those zarr-python wrote for it, not the
    plain files beside them; the same when its metadata can no longer be used."""
    root = tmp_path / "a.zarr"
    spec = ArraySpec("", "float32", (19, 11), (8, 4), "zstd", kwargs={"chunk_key_encoding": encoding})
    builders.create_array(root, spec, fmt, np.random.default_rng(4))
    written = set(oracles.store_keys(root))
    for name in ("notes.txt", ".x.npy.AbC123", "c0", "1a", "sub/1"):
        (root / name).parent.mkdir(exist_ok=True)
        (root / name).write_bytes(b"plain")
    hierarchy = (V2Hierarchy if fmt == 2 else V3Hierarchy).open_sync(Store(str(root)))
    node = hierarchy.node_sync("")
    assert node.kind == "array"
    assert set(hierarchy.node_keys_sync(node)) == written
    doc = ".zarray" if fmt == 2 else "zarr.json"
    assert set(hierarchy.node_keys_sync(BrokenNode("", "array", doc, MetadataError("unusable")))) == written
