"""Icechunk repositories built for tests with icechunk and zarr-python 3, and what icechunk reads from them."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import icechunk
import numpy as np
import zarr

# Its local storage warns on stderr that it is not safe for concurrent commits: the tests commit
# from one process at a time.
icechunk.set_logs_filter("error")

# Whether this icechunk lists chunk references (2.x): zarrfs then reads the native chunks of a
# local repository from their files (zarrfs/storage/icechunk/chunkfiles.py).
LISTS_CHUNKS = hasattr(icechunk.IcechunkStore, "array_chunk_iterator")


@dataclasses.dataclass
class Repo:
    """A repository on disk and the snapshot IDs of its versions (by tag or branch name)."""

    path: Path
    snapshots: dict[str, str]

    def open(self) -> icechunk.Repository:
        return icechunk.Repository.open(icechunk.local_filesystem_storage(str(self.path)))


def commit(repo: icechunk.Repository, branch: str, message: str, change: Callable[[zarr.Group], Any]) -> str:
    """One commit on BRANCH made by CHANGE(root group); returns its snapshot ID."""
    session = repo.writable_session(branch)
    change(zarr.open_group(session.store, mode="a", zarr_format=3))
    return session.commit(message)


def build(path: Path) -> Repo:
    """main: `first` (tagged v1), then `second`; branch dev from `second`, then `on dev`."""
    repo = icechunk.Repository.create(icechunk.local_filesystem_storage(str(path)))
    rng = np.random.default_rng(36)

    def first(root: zarr.Group) -> None:
        g = root.create_group("g", attributes={"title": "first"})
        t = g.create_array("t", shape=(50, 30), chunks=(16, 16), dtype="<i4", fill_value=-1)
        t[:40] = rng.integers(-1000, 1000, (40, 30))
        root.create_array("a", shape=(100,), chunks=(32,), dtype="<f8")[:] = rng.random(100)

    def second(root: zarr.Group) -> None:
        root["g/t"][5:10] = 7
        u = root["g"].create_array("u", shape=(3, 4, 5), chunks=(2, 2, 5), dtype="<u2")
        u[:] = np.arange(60, dtype="<u2").reshape(3, 4, 5)
        # A sharded array: its inner chunks are read as byte ranges of a shard.
        s = root.create_array("s", shape=(40, 24), chunks=(8, 8), shards=(16, 24), dtype="<f4")
        s[:] = rng.random((40, 24), dtype="<f4")

    def on_dev(root: zarr.Group) -> None:
        root["a"][:] = -root["a"][:]

    snapshots = {"v1": commit(repo, "main", "first", first)}
    repo.create_tag("v1", snapshot_id=snapshots["v1"])
    snapshots["main"] = commit(repo, "main", "second", second)
    repo.create_branch("dev", snapshot_id=snapshots["main"])
    snapshots["dev"] = commit(repo, "dev", "on dev", on_dev)
    return Repo(path, snapshots)


def arrays_of(repo: Repo, snapshot_id: str) -> dict[str, np.ndarray]:
    """Every array of a snapshot as icechunk's readonly_session and zarr-python read it (path -> value)."""
    session = repo.open().readonly_session(snapshot_id=snapshot_id)
    root = zarr.open_group(session.store, mode="r", zarr_format=3)
    return {name: member[...] for name, member in root.members(max_depth=None) if isinstance(member, zarr.Array)}


def groups_of(repo: Repo, snapshot_id: str) -> set[str]:
    session = repo.open().readonly_session(snapshot_id=snapshot_id)
    root = zarr.open_group(session.store, mode="r", zarr_format=3)
    return {name for name, member in root.members(max_depth=None) if isinstance(member, zarr.Group)}
