"""The write-side helpers of the namespace that need no mount: which data bytes of a new
array arrived (Coverage), which names are held aside, and the formats' name rules."""

from __future__ import annotations

import random

import pytest

from zarrfs.errors import InvalidArgument, NameTooLong
from zarrfs.formats.v2 import V2Hierarchy
from zarrfs.formats.v3 import V3Hierarchy
from zarrfs.store import Store
from zarrfs.incoming import Coverage, is_held_name


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


@pytest.mark.parametrize("name, held", [("x.npy", False), (".x.npy.AbC123", True), ("tmp123", True),
                                        (".npy", True), (".hidden.npy", True), ("x.npy.part", True)])
def test_held_names(name, held):
    assert is_held_name(name) is held


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
