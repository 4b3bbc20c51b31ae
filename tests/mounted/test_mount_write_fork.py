"""Mounted: a `.npy` being written is ended by the last close of its open file only. A forked
child's close, or the exit of a program that inherited the descriptor, is a FUSE flush of the
same open file; the writer goes on writing and its array is stored. A writer that dies short
leaves nothing: its last close drops the file with one log line.

Oracles: numpy's own NPY bytes (np.save), zarr-python 3 reading the store, the store's files
on disk; the daemon's log for what it promises to say. zarrfs is reached only through its
command line and the file system.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from support import builders, mounting, oracles
from support.builders import ArraySpec
from support.oracles import assert_same_array

# Arrays that the replacing cases write over, one each (the module shares one mount).
OLD_SHAPE, OLD_CHUNKS = (37, 23), (10, 7)
REPLACED = tuple(f"g/old_{i}" for i in range(8))
# What the writers write: several chunks of the default chunking, so a half copy stages some.
NEW_DTYPE, NEW_SHAPE = np.dtype("<f8"), (40, 30)
HOW = pytest.mark.parametrize("how", ["fork_close", "exec_true"])
TARGET = pytest.mark.parametrize("target", ["new_name", "over_an_array"])


@pytest.fixture(scope="module")
def wstore(module_mount, tmp_path_factory) -> tuple[Path, Path]:
    """(store root, mountpoint): a v3 store with group g and the arrays to replace, mounted writable."""
    root = tmp_path_factory.mktemp("fork") / "s.zarr"
    rng = np.random.default_rng(11)
    for path in REPLACED:
        builders.create_array(root, ArraySpec(path, "int32", OLD_SHAPE, OLD_CHUNKS, "zstd"), 3, rng)
    return root, module_mount(root, "writable")


_fresh, _unused_old = itertools.count(), iter(REPLACED)


def target_name(target: str) -> str:
    """A hierarchy path no other test of the module writes: new, or an array to replace."""
    return f"g/new_{next(_fresh)}" if target == "new_name" else next(_unused_old)


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file of a store, byte for byte (read from the disk, not through a mount)."""
    return {k: (root / k).read_bytes() for k in oracles.store_keys(root)}


def group_members(root: Path, path: str) -> list[str]:
    """Names of a group's members as zarr-python 3 lists them."""
    import zarr

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return sorted(name for name, _ in zarr.open_group(os.fspath(root), path=path, mode="r").members())


def warnings_naming(module_mount, mnt: Path, name: str) -> list[str]:
    return mounting.log_lines_naming(module_mount.log_text(mnt), name)


def close_in_a_child(fd: int, how: str) -> None:
    """A child process gives up its copy of FD: by close(2), or as `true` (exec'd with FD) exits.
    Its close must succeed: nothing failed."""
    if how == "exec_true":
        subprocess.run(["true"], pass_fds=(fd,), check=True)
        return
    pid = os.fork()
    if pid == 0:  # the child: nothing but the close and the exit status
        code = 0
        try:
            os.close(fd)
        except OSError:
            code = 1
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the child's close(2) failed"


@HOW
@TARGET
@pytest.mark.parametrize("split", ["in_header", "in_data"])
def test_a_childs_close_does_not_end_the_file_its_parent_writes(wstore, module_mount, how, target, split):
    root, mnt = wstore
    path = target_name(target)
    old = oracles.zarr_value(root, path) if target == "over_an_array" else None
    x = builders.sample_data(NEW_DTYPE, NEW_SHAPE, np.random.default_rng(5))
    data = oracles.npy_bytes(x)
    hlen = len(data) - x.nbytes
    first = hlen // 2 if split == "in_header" else hlen + x.nbytes // 2
    p = mnt / f"{path}.npy"
    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        mounting.pwrite_all(fd, data[:first], 0)
        close_in_a_child(fd, how)
        assert p.name in os.listdir(p.parent), "the file went away at the child's close"
        if old is not None:
            assert_same_array(oracles.zarr_value(root, path), old, "zarr-python before the parent's close")
        mounting.pwrite_all(fd, data[first:], first)
    finally:
        os.close(fd)
    assert p.read_bytes() == data
    assert_same_array(np.load(p), x, "np.load of the mount's file")
    assert_same_array(oracles.zarr_value(root, path), x, "zarr-python after the parent's close")
    assert not [k for k in oracles.store_keys(root) if ".zarrfs" in k], "staging keys left after the commit"
    assert not warnings_naming(module_mount, mnt, f"{path}.npy")


# The writer of the next test: a process of its own, so that the test can kill it mid-copy.
WRITER = """
import os, subprocess, sys
path, first = sys.argv[1], int(sys.argv[2])
data = sys.stdin.buffer.read(int(sys.argv[3]))
fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
view, off = memoryview(data[:first]), 0
while view:
    n = os.pwrite(fd, view, off)
    view, off = view[n:], off + n
subprocess.run(["true"], pass_fds=(fd,), check=True)
print("ready", flush=True)
sys.stdin.read()  # until killed
"""


@TARGET
def test_a_writer_that_dies_short_leaves_nothing_after_its_last_close(wstore, module_mount, target):
    root, mnt = wstore
    path = target_name(target)
    group = path.rpartition("/")[0]
    members = group_members(root, group)
    old = oracles.zarr_value(root, path) if target == "over_an_array" else None
    before = snapshot(root)
    x = builders.sample_data(NEW_DTYPE, NEW_SHAPE, np.random.default_rng(6))
    data = oracles.npy_bytes(x)
    hlen = len(data) - x.nbytes
    first = hlen + x.nbytes // 2
    p = mnt / f"{path}.npy"
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, os.fspath(p), str(first), str(len(data))],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        writer.stdin.write(data)
        writer.stdin.flush()
        assert writer.stdout.readline() == b"ready\n", "the writer did not get through its first half"
        # Mid-copy, with the child gone: the file is there, the store shows nothing of it.
        assert p.name in os.listdir(p.parent), "the file went away at the child's close"
        assert os.stat(p).st_size == len(data), "the file being written is no longer shown"
        assert group_members(root, group) == members
        if old is not None:
            assert_same_array(oracles.zarr_value(root, path), old, "zarr-python mid-copy")
    finally:
        writer.kill()
        writer.wait()
    needle = f"received {first - hlen} of {x.nbytes} data bytes"
    # The kernel sends the release after the killed writer's close returned: wait for its line.
    assert mounting.wait_until(
        lambda: any(needle in ln for ln in warnings_naming(module_mount, mnt, f"{path}.npy")), 10
    ), module_mount.log_text(mnt)[-3000:]
    lines = warnings_naming(module_mount, mnt, f"{path}.npy")
    assert len(lines) == 1 and needle in lines[0], lines
    assert ("the old array is kept" if old is not None else "not stored") in lines[0]
    assert snapshot(root) == before, "the short copy changed the store"
    assert group_members(root, group) == members
    if old is not None:
        assert_same_array(oracles.zarr_value(root, path), old, "zarr-python after the writer died")
        assert_same_array(np.load(p), old, "the mount after the writer died")
    else:
        assert p.name not in os.listdir(p.parent)
