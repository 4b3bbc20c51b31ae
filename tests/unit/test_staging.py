"""Staging areas of writers that died (zarrfs/storage/staging.py), without a mount: when a lease names a
writer that is gone, which prefixes a sweep lists in each format, what it removes and keeps,
and the steps of a daemon's own lease.

Oracles: processes this test starts and ends itself (their pids and /proc), stores built on
disk here, and the disk itself after a sweep.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from zarrfs import formats
from zarrfs.errors import StoreError
from zarrfs.storage.staging import (
    LEASE_STALE_S,
    Lease,
    LeaseKeeper,
    staging_writer,
    sweep_sync,
    this_machine,
)
from zarrfs.storage.store import Store

from support import FIXTURES

NOW = time.time()


def _start_ticks(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[19])


def _lease(pid: int, start: int | None, machine=None, refreshed_s: float = NOW, writer: str = "0a0b0c0d0e0f") -> Lease:
    return Lease(writer, machine or this_machine(), pid, start, NOW - 60, refreshed_s)


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_a_lease_of_this_machine_is_gone_when_its_process_is():
    me = os.getpid()
    assert _lease(me, _start_ticks(me)).gone_because(this_machine(), NOW) is None
    assert _lease(_dead_pid(), 1).gone_because(this_machine(), NOW) == "no longer running"
    # the pid runs, but it started at another time: another process took the pid over
    assert "another process" in _lease(me, _start_ticks(me) + 1).gone_because(this_machine(), NOW)


def test_a_lease_of_another_machine_is_gone_only_when_old():
    here = this_machine()
    for other in (
        dataclasses.replace(here, host="elsewhere"),
        dataclasses.replace(here, boot_id="other-boot"),
        dataclasses.replace(here, pid_namespace="pid:[1]"),
    ):
        dead = _dead_pid()  # a pid that means nothing on another machine
        assert _lease(dead, 1, other, refreshed_s=NOW - 60).gone_because(here, NOW) is None
        assert _lease(dead, 1, other, refreshed_s=NOW - LEASE_STALE_S - 1).gone_because(here, NOW)


def test_a_lease_reads_back_and_garbage_is_no_lease():
    lease = _lease(12, 34)
    assert Lease.from_bytes(lease.to_bytes()) == lease
    doc = json.loads(lease.to_bytes())
    changed = [
        json.dumps({**doc, "pid": "twelve"}).encode(),
        json.dumps({**doc, "refreshed": float("nan")}).encode(),
        json.dumps({k: v for k, v in doc.items() if k != "host"}).encode(),
    ]
    for raw in (None, b"", b"[]", b"{", b"\xff", *changed):
        assert Lease.from_bytes(raw) is None, raw


@pytest.mark.parametrize(
    "name, writer",
    [
        (".zarrfs-new-0a0b0c0d0e0f-0011223344556677", "0a0b0c0d0e0f"),
        (".zarrfs-new-0a0b0c0d0e0f-0011223344556677.old", "0a0b0c0d0e0f"),
        (".zarrfs-new-0011223344556677", None),
    ],
)
def test_the_writer_in_a_staging_name(name, writer):
    assert staging_writer(name) == writer


def test_the_keeper_writes_before_staging_refreshes_while_and_erases_after(tmp_path):
    clock = [100.0]
    keeper = LeaseKeeper(Store(os.fspath(tmp_path)), clock=lambda: clock[0])
    assert keeper.due() is None
    keeper.claim("g/.zarrfs-new-a")
    keeper.due()()
    lease = Lease.from_bytes((tmp_path / keeper.key).read_bytes())
    assert (lease.writer, lease.pid, lease.refreshed_s) == (keeper.writer, os.getpid(), 100.0)
    assert lease.pid_start == _start_ticks(os.getpid())
    keeper.claim("h/.zarrfs-new-b")
    assert keeper.due() is None  # written already: no write per staging area
    clock[0] = 400.0
    keeper.due(refresh=True)()
    assert Lease.from_bytes((tmp_path / keeper.key).read_bytes()).refreshed_s == 400.0
    keeper.release("g/.zarrfs-new-a")
    assert keeper.due() is None  # another area is still in use
    keeper.release("h/.zarrfs-new-b")
    keeper.due()()
    assert not (tmp_path / keeper.key).exists()
    assert keeper.due() is None and keeper.due(refresh=True) is None


def _area(root: Path, prefix: str, age_s: float = 0.0) -> None:
    (root / prefix).mkdir(parents=True)
    (root / prefix / "0.0").write_bytes(b"x" * 10)
    when = NOW - age_s
    os.utime(root / prefix / "0.0", (when, when))


def _hierarchy(root: Path):
    return formats.open_hierarchy_sync(Store(os.fspath(root)))


@pytest.mark.parametrize(
    "fixture, group, where",
    [
        ("v3draft-2022-05/core", "grp/sub", "data/grp/sub"),  # the drafts stage under data/
        ("v1/zlib_i4_C", "", ""),  # one array per store: staged at the root
    ],
)
def test_a_sweep_finds_staging_where_each_format_puts_it(tmp_path, fixture, group, where):
    root = tmp_path / "s"
    shutil.copytree(FIXTURES / fixture, root)
    h = _hierarchy(root)
    assert where in list(h.staging_dirs())
    assert h.staging_prefix(f"{group}/x".lstrip("/"), "w-t") == f"{where}/.zarrfs-new-w-t".lstrip("/")
    dead = _lease(_dead_pid(), 1, writer="deaddeaddead")
    (root / ".zarrfs-lease-deaddeaddead").write_bytes(dead.to_bytes())
    _area(root, f"{where}/.zarrfs-new-deaddeaddead-0011223344556677".lstrip("/"))
    before = sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if ".zarrfs" not in str(p))
    out = sweep_sync(h, "0a0b0c0d0e0f", NOW)
    assert (out["removed"], out["kept"], out["leases_removed"], out["stopped"]) == (1, 0, 1, None)
    assert sorted(p.relative_to(root).as_posix() for p in root.rglob("*")) == before


def test_a_sweep_keeps_live_and_recent_staging_and_its_own(tmp_path, caplog):
    root = tmp_path / "s"
    (root / "g" / "h").mkdir(parents=True)
    (root / ".zgroup").write_text('{"zarr_format": 2}')
    (root / "g" / ".zgroup").write_text('{"zarr_format": 2}')
    (root / "g" / "h" / ".zgroup").write_text('{"zarr_format": 2}')
    me = os.getpid()
    (root / ".zarrfs-lease-11111111aaaa").write_bytes(_lease(me, _start_ticks(me), writer="11111111aaaa").to_bytes())
    _area(root, "g/h/.zarrfs-new-11111111aaaa-01")  # a live writer of this machine
    _area(root, "g/.zarrfs-new-0a0b0c0d0e0f-02", age_s=2 * LEASE_STALE_S)  # our own, however old
    _area(root, "g/.zarrfs-new-0000000000000003", age_s=60)  # no lease, recent
    _area(root, "g/h/.zarrfs-new-0000000000000004", age_s=2 * LEASE_STALE_S)  # no lease, old
    _area(root, ".zarrfs-new-22222222bbbb-05", age_s=60)  # its writer's lease is gone: recent keys decide
    (root / ".zarrfs-lease-33333333cccc").write_bytes(b"not json")  # unreadable: removed
    caplog.set_level("INFO", "zarrfs.storage.staging")
    out = sweep_sync(_hierarchy(root), "0a0b0c0d0e0f", NOW)
    assert (out["removed"], out["kept"], out["leases_removed"]) == (1, 3, 1)
    left = sorted(p.name for p in root.rglob(".zarrfs*"))
    assert left == [
        ".zarrfs-lease-11111111aaaa",
        ".zarrfs-new-0000000000000003",
        ".zarrfs-new-0a0b0c0d0e0f-02",
        ".zarrfs-new-11111111aaaa-01",
        ".zarrfs-new-22222222bbbb-05",
    ]
    said = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(said) == 1 and "g/h/.zarrfs-new-0000000000000004" in said[0] and "1 keys, 10 bytes" in said[0]


def test_a_sweep_of_a_failing_store_stops_with_one_line(tmp_path, caplog):
    root = tmp_path / "s"
    (root / "g").mkdir(parents=True)
    (root / ".zgroup").write_text('{"zarr_format": 2}')
    h = _hierarchy(root)

    def refuse(prefix):
        raise StoreError(f"listing {prefix!r} failed: access denied")

    h.store.list_dir_sync = refuse
    out = sweep_sync(h, "0a0b0c0d0e0f", NOW)
    assert out["stopped"] and "access denied" in out["stopped"]
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warned) == 1 and "access denied" in warned[0]


def test_a_sweep_of_an_object_store_removes_every_key_of_a_dead_writers_area():
    store = Store("memory://staging-sweep")
    store.set_sync(".zgroup", b'{"zarr_format": 2}')
    store.set_sync("g/.zgroup", b'{"zarr_format": 2}')
    dead = _lease(_dead_pid(), 1, writer="deaddeaddead")
    store.set_sync(".zarrfs-lease-deaddeaddead", dead.to_bytes())
    area = "g/.zarrfs-new-deaddeaddead-0011223344556677"
    for key in ("0.0", "0.1", "1.0"):
        store.set_sync(f"{area}/{key}", b"y" * 7)
    out = sweep_sync(formats.open_hierarchy_sync(store), "0a0b0c0d0e0f", NOW)
    assert (out["removed"], out["leases_removed"], out["stopped"]) == (1, 1, None)
    assert sorted(store.sizes_below_sync("")) == [".zgroup", "g/.zgroup"]


def test_a_root_array_is_not_walked_for_groups(tmp_path):
    import numpy as np
    import zarr

    root = tmp_path / "rootarray.zarr"
    zarr.create_array(
        os.fspath(root),
        shape=(40, 4),
        chunks=(1, 4),
        dtype="i4",
        zarr_format=2,
        chunk_key_encoding={"name": "v2", "separator": "/"},
    )[:] = np.arange(160).reshape(40, 4)
    assert len([p for p in root.iterdir() if p.is_dir()]) == 40  # one directory per chunk row
    h = _hierarchy(root)
    listed = []
    real = h.store.list_dir_sync
    h.store.list_dir_sync = lambda prefix: listed.append(prefix) or real(prefix)
    assert list(h.staging_dirs()) == [""]
    assert listed == [], "the chunk directories of a root array were searched for groups"
