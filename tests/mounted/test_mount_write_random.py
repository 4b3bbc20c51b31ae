"""Randomized mounted writes: a seeded loop of writes, reads, fsyncs, closes and replacements
through every view of one array, checked against a numpy model (v2 and v3; C and F order,
edge chunks, fill values, v3 transpose and sharding).

The model is numpy's own reading of the patched bytes of ``np.save`` (``npy``), its
Fortran-order twin (``npy-f``), ``tobytes(order=...)`` (``raw``, ``raw-f``) and of one
chunk's region (chunk files). Reads go through fresh opens (a writable mount promises
coherence between views at open). Every few operations all files are closed and
zarr-python must read the model from the store; at the end the mount is unmounted,
zarr-python and tensorstore read the store, and a fresh read-only mount shows the model
through every view.
"""

from __future__ import annotations

import os
import shutil
import time
import zlib
from pathlib import Path

import numpy as np
import pytest

from support import builders, mounting, oracles
from support.builders import ArraySpec
from support.oracles import assert_same_array

PATH = "r/a"
# (zarr format, the array zarr-python writes first)
CASES = {
    "v2_C_blosc_edges": (2, ArraySpec(PATH, "int32", (37, 23), (10, 7), "blosc")),
    "v2_F_zstd": (2, ArraySpec(PATH, "float64", (29, 17), (8, 5), "zstd", kwargs={"order": "F"})),
    "v2_3d_fill_partial": (
        2,
        ArraySpec(
            PATH, "uint16", (9, 10, 11), (4, 3, 5), "gzip", fill_value=5, write=(slice(0, 4), slice(0, 3), slice(0, 5))
        ),
    ),
    "v3_C_zstd_edges": (3, ArraySpec(PATH, "int16", (37, 23), (10, 7), "zstd")),
    "v3_transpose_crc": (3, ArraySpec(PATH, "float32", (31, 19), (10, 7), "zstd_crc32c", kwargs={"transpose": (1, 0)})),
    "v3_sharded": (
        3,
        ArraySpec(
            PATH,
            "float32",
            (41, 30),
            (5, 7),
            "zstd",
            fill_value=-1.5,
            write=(slice(0, 22), slice(0, 15)),
            kwargs={"shards": (20, 14)},
        ),
    ),
}
VIEWS = ["npy", "npy-f", "raw", "raw-f", "chunk"]
MAX_OPS = 260
TIME_BUDGET_S = 4.5  # per case: six cases stay near half a minute
CHECK_EVERY = 40
# Arrays created through the mount by a replacement get this chunking (2-d only), so
# replacements have edge chunks too ("chunks=7:5": the spelling that survives -o's commas).
CREATE_CHUNKS = "chunks=7:5"


class Model:
    """The array as numpy says it must be, plus the open files of the run."""

    def __init__(self, root: Path, mnt: Path, value: np.ndarray, rng: np.random.Generator, tmp: Path):
        self.root, self.mnt, self.value, self.rng, self.tmp = root, mnt, value, rng, tmp
        self.fds: dict[str, int] = {}  # file path -> fd opened for writing
        self.log: list[str] = []
        self.chunks = oracles.zarr_chunk_shape(root, PATH)

    # --- files -------------------------------------------------------------------------

    def target(self, view: str) -> tuple[Path, bytes, tuple | None]:
        """(file, its expected bytes, chunk region or None) of a view; a chunk view picks a chunk."""
        if view != "chunk":
            return oracles.view_file(self.mnt, PATH, view), oracles.view_bytes(self.value, view), None
        grid = [-(-s // c) for s, c in zip(self.value.shape, self.chunks)]
        if not grid or 0 in grid:
            return oracles.view_file(self.mnt, PATH, "npy"), oracles.view_bytes(self.value, "npy"), None
        idx = tuple(int(self.rng.integers(0, n)) for n in grid)
        region = oracles.chunk_slices(idx, self.chunks, self.value.shape)
        part = self.value[region]
        return oracles.chunk_file(self.mnt, PATH, idx), oracles.npy_bytes(part), region

    def fd(self, p: Path) -> int:
        key = os.fspath(p)
        if key not in self.fds:
            self.fds[key] = os.open(p, os.O_WRONLY)
        return self.fds[key]

    def close_all(self) -> None:
        while self.fds:
            _, fd = self.fds.popitem()
            os.close(fd)

    # --- operations --------------------------------------------------------------------

    def write(self) -> None:
        view = VIEWS[int(self.rng.integers(0, len(VIEWS)))]
        p, want, region = self.target(view)
        npy_view = "npy" if region is not None else view
        like = self.value[region] if region is not None else self.value
        hlen = len(want) - like.nbytes
        if like.nbytes == 0:
            return
        scale = [4, 64, 2000, 20000][int(self.rng.integers(0, 4))]
        n = int(self.rng.integers(1, min(scale, like.nbytes) + 1))
        off = hlen + int(self.rng.integers(0, like.nbytes - n + 1))
        data = self.rng.integers(0, 256, n, dtype=np.uint8).tobytes()
        if hlen and self.rng.random() < 0.1:  # start inside the header with its own bytes
            back = int(self.rng.integers(1, hlen + 1))
            off, data = off - (off - hlen) - back, want[hlen - back : hlen] + data
        self.log.append(f"write {view} {p.name} [{off}, {off + len(data)})")
        mounting.pwrite_all(self.fd(p), data, off)
        new = oracles.patched(like, npy_view, off, data)
        if region is not None:
            self.value[region] = new
        else:
            self.value = new

    def mmap_write(self) -> None:
        if self.value.size == 0:
            return
        box = tuple(
            slice(a, int(self.rng.integers(a + 1, n + 1)))
            for a, n in ((int(self.rng.integers(0, n)), n) for n in self.value.shape)
        )
        self.log.append(f"mmap {box}")
        m = np.load(self.mnt / f"{PATH}.npy", mmap_mode="r+")
        new = builders.sample_data(self.value.dtype, m[box].shape, self.rng)
        m[box] = new
        m.flush()
        del m
        self.value[box] = new

    def read(self) -> None:
        view = VIEWS[int(self.rng.integers(0, len(VIEWS)))]
        p, want, _ = self.target(view)
        off = int(self.rng.integers(0, len(want) + 1))
        n = int(self.rng.integers(0, 70000))
        self.log.append(f"read {view} {p.name} [{off}, {off + n})")
        fd = os.open(p, os.O_RDONLY)
        try:
            got = os.pread(fd, n, off)
        finally:
            os.close(fd)
        assert got == want[off : off + n], f"read of {p} [{off}, {off + n}) differs from the model"

    def replace(self) -> None:
        """Truncate and write a new NPY file: a new array (maybe another shape, dtype or order)."""
        self.close_all()
        how = ["copyfile", "truncate"][int(self.rng.integers(0, 2))]
        if self.rng.random() < 0.5:
            shape, dtype = self.value.shape, self.value.dtype
        else:
            shape = tuple(int(x) for x in self.rng.integers(1, 30, int(self.rng.integers(1, 4))))
            dtype = np.dtype(["<i4", "<f8", "<u2", "<f4"][int(self.rng.integers(0, 4))])
        x = builders.sample_data(dtype, shape, self.rng)
        if self.rng.random() < 0.5:
            x = np.asfortranarray(x)
        self.log.append(f"replace by {how}: {x.shape} {x.dtype} {'F' if x.flags.f_contiguous else 'C'}")
        dst = self.mnt / f"{PATH}.npy"
        if how == "copyfile":
            src = self.tmp / "replacement.npy"
            np.save(src, x)
            shutil.copyfile(src, dst)
        else:
            os.truncate(dst, 0)
            body = oracles.npy_f_bytes(x) if x.flags.f_contiguous and x.ndim > 1 else oracles.npy_bytes(x)
            fd = os.open(dst, os.O_WRONLY)
            try:
                cut = int(self.rng.integers(1, len(body)))
                mounting.pwrite_all(fd, body[:cut], 0)
                mounting.pwrite_all(fd, body[cut:], cut)
            finally:
                os.close(fd)
        self.value = np.array(x, order="C", copy=True)
        self.chunks = oracles.zarr_chunk_shape(self.root, PATH)

    def sync_some(self) -> None:
        if not self.fds:
            return
        key = list(self.fds)[int(self.rng.integers(0, len(self.fds)))]
        if self.rng.random() < 0.5:
            self.log.append(f"fsync {Path(key).name}")
            os.fsync(self.fds[key])
        else:
            self.log.append(f"close {Path(key).name}")
            os.close(self.fds.pop(key))

    def check_store(self, what: str) -> None:
        """Everything closed: zarr-python reads the model from the store."""
        self.close_all()
        assert_same_array(oracles.zarr_value(self.root, PATH), self.value, f"{what}; last ops: {self.log[-12:]}")


@pytest.mark.parametrize("case", list(CASES))
def test_random_writes_match_the_model(mount, tmp_path, case):
    fmt, spec = CASES[case]
    root = tmp_path / "rand.zarr"
    seed = zlib.crc32(case.encode())
    rng = np.random.default_rng(seed)
    builders.create_array(root, spec, fmt, rng)
    mnt = mount(root, "writable", CREATE_CHUNKS)
    model = Model(root, mnt, oracles.zarr_value(root, PATH), rng, tmp_path)
    ops = [
        (model.write, 0.45),
        (model.read, 0.25),
        (model.mmap_write, 0.08),
        (model.sync_some, 0.18),
        (model.replace, 0.04),
    ]
    fns, weights = [f for f, _ in ops], np.array([w for _, w in ops])
    deadline = time.monotonic() + TIME_BUDGET_S
    done = 0
    try:
        for done in range(1, MAX_OPS + 1):
            fns[rng.choice(len(fns), p=weights / weights.sum())]()
            if done % CHECK_EVERY == 0:
                model.check_store(f"seed {seed}, after {done} operations")
            if time.monotonic() > deadline:
                break
    finally:
        model.close_all()
    assert done >= 60, f"only {done} operations in {TIME_BUDGET_S}s"
    model.check_store(f"seed {seed}, after all {done} operations")

    mounting.unmount_and_wait(mount, mnt)
    want = model.value
    assert_same_array(oracles.zarr_value(root, PATH), want, "zarr-python after unmount")
    assert_same_array(oracles.tensorstore_value(root, PATH, fmt), want, "tensorstore after unmount")
    assert oracles.leftover_temp_files(root) == []
    again = mount(root)
    assert (again / f"{PATH}.npy").read_bytes() == oracles.npy_bytes(want)
    for view in ("npy-f", "raw", "raw-f"):
        assert oracles.view_file(again, PATH, view).read_bytes() == oracles.view_bytes(want, view), view
