"""Reads of a reference set's targets: whole objects sent for a range are cut to it, and the server named once."""

from __future__ import annotations

import logging

import pytest

from zarrfs.errors import StoreError
from zarrfs.storage.reffs import TargetFileSystems
from zarrfs.storage.reftrust import Target

WHOLE = bytes(range(256))


def test_a_whole_object_for_a_range_is_cut_to_it_and_said_once_per_host(caplog):
    targets = TargetFileSystems(lambda protocol, origin: ("", {}), 10.0)
    caplog.set_level(logging.WARNING)
    a = Target("http", "http://a.example:8000/x.nc")
    assert targets.asked(a, WHOLE, 10, 20) == WHOLE[10:20]
    assert targets.asked(a, WHOLE, 100, 164) == WHOLE[100:164]
    assert targets.asked(Target("http", "http://b.example/y.nc"), WHOLE, 0, 1) == WHOLE[:1]
    assert targets.asked(a, WHOLE[10:20], 10, 20) == WHOLE[10:20]  # a server that honours Range
    lines = [r.getMessage() for r in caplog.records if "ignores Range requests" in r.getMessage()]
    assert len(lines) == 2 and "http://a.example:8000 " in lines[0] and "http://b.example " in lines[1]


def test_an_answer_that_is_neither_the_range_nor_the_whole_object_fails():
    targets = TargetFileSystems(lambda protocol, origin: ("", {}), 10.0)
    with pytest.raises(StoreError, match="bytes 100:110 were answered with 50 bytes"):
        targets.asked(Target("http", "http://a.example/x.nc"), WHOLE[:50], 100, 110)


def test_local_targets_must_be_regular_files(tmp_path):
    """A pipe would block a read for good, a device read whole would never end: both refused."""
    import os

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    targets = TargetFileSystems(lambda protocol, origin: ("", {}), 10.0)
    for path, start, end in ((str(fifo), 0, 10), ("/dev/zero", None, None), (str(tmp_path), 0, 1)):
        with pytest.raises(StoreError, match="is not a regular file"):
            targets.read_sync("a/0", Target("file", path), start, end)
