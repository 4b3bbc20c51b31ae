"""Zarr v3 draft stores mounted for real: zarr 2.18's layout and the May 2022 spec fixtures.

Oracles are the .npy files saved beside the fixtures (zarr 2.18's reads, or numpy in
tests/fixtures/make_fixtures_v3draft_spec.py); zarrfs is reached only through its command line.
"""

from __future__ import annotations

import errno
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from support import FIXTURES, mounting

Z218 = FIXTURES / "v3draft-zarr218"
SPEC = FIXTURES / "v3draft-2022-05"


def _load(path: Path) -> dict:
    return json.loads(path.read_text())


def _written_regions(info: dict) -> list[tuple[slice, ...]]:
    shape, chunks = info["shape"], info["chunks"]
    out = []
    for key in info["chunks_written"]:
        idx = [int(i) for i in key[1:].split("/")] if shape else []
        out.append(tuple(slice(i * c, min((i + 1) * c, s)) for i, c, s in zip(idx, chunks, shape)))
    return out


def test_mount_zarr218(mount):
    index = _load(Z218 / "expected" / "index.json")
    mnt = mount(Z218 / "store")
    assert sorted(os.listdir(mnt)) == ["dtypes", "filters", "group_a", "implicit", "order", "sharded", "zerod"]
    for group in [g for g in index["groups"] if g] + index["implicit_groups"]:
        assert (mnt / group).is_dir(), group
    for path, info in index["arrays"].items():
        got = (mnt / f"{path}.npy").read_bytes()
        expected = (Z218 / "expected" / info["file"]).read_bytes()
        if info["defined"] == "all":
            assert got == expected, path
        else:
            g, e = np.load(io.BytesIO(got)), np.load(io.BytesIO(expected))
            assert g.dtype == e.dtype and g.shape == e.shape, path
            for region in _written_regions(info):
                assert g[region].tobytes() == e[region].tobytes(), path
    attrs = json.loads(os.getxattr(mnt / "filters" / "delta_zlib.npy", "user.zarr.attributes"))
    assert attrs == index["arrays"]["filters/delta_zlib"]["attrs"]


def test_mount_may_2022(mount):
    index = _load(SPEC / "expected" / "index.json")["core"]
    mnt = mount(SPEC / "core")
    assert sorted(os.listdir(mnt)) == ["codecs", "grp", "implicit", "sharded", "types", "zerod"]
    for path, info in index["arrays"].items():
        assert (mnt / f"{path}.npy").read_bytes() == (SPEC / "expected" / info["file"]).read_bytes(), path
    attrs = json.loads(os.getxattr(mnt / "grp", "user.zarr.attributes"))
    assert attrs == {"spam": "ham", "eggs": 42}
    log = mount.log_text()
    assert "ignoring extension http://example.org/zarr/extension/foo" in log
    assert "reading it as its fallback 'int16'" in log


def test_mount_refused_arrays_keep_the_rest_readable(mount):
    index = _load(SPEC / "expected" / "index.json")["refused-arrays"]
    mnt = mount(SPEC / "refused-arrays")
    assert (mnt / "ok.npy").read_bytes() == (SPEC / "expected" / index["arrays"]["ok"]["file"]).read_bytes()
    for path in index["refused"]:
        with pytest.raises(OSError) as e:
            (mnt / f"{path}.npy").read_bytes()
        assert e.value.errno in (errno.EIO, errno.EOPNOTSUPP), path
    log = mount.log_text()
    for path, text in index["refused"].items():
        assert text in log, path


def test_required_extension_refuses_to_mount(tmp_path):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    r = subprocess.run(
        [sys.executable, "-m", "zarrfs", str(SPEC / "refuse-extension"), str(mnt)],
        capture_output=True,
        text=True,
        timeout=mounting.MOUNT_TIMEOUT_S,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    if mounting.is_mounted(mnt):
        mounting.unmount(mnt)
        pytest.fail("zarrfs mounted a store whose entry point requires an unknown extension")
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("zarrfs: "), r.stderr
    assert "https://example.org/zarr/extension/needs-understanding" in lines[0]


def test_chunk_files_under_the_sharding_transformer_count_their_own_bytes(mount):
    """st_blocks of an inner chunk's file follows its bytes in the shard (its index entry,
    read here from the shard files as the spec lays them out), not the whole shard."""
    mnt = mount(Z218 / "store")
    shards = Z218 / "store" / "data" / "root" / "sharded" / "uint16_blosc"
    per_shard, grid_shape = (2, 2), (5, 4)  # chunks_per_shard; ceil((36, 36) / (8, 10))
    chunk_dir = mnt / ".zarrfs" / "chunks" / "sharded" / "uint16_blosc"
    total = 0
    for i in range(grid_shape[0]):
        for j in range(grid_shape[1]):
            shard = shards / f"c{i // per_shard[0]}" / str(j // per_shard[1])
            nbytes = 0
            if shard.exists():
                raw = shard.read_bytes()
                index = np.frombuffer(raw[-16 * 4 :], "<u8").reshape(per_shard + (2,))
                offset, n = (int(x) for x in index[i % per_shard[0], j % per_shard[1]])
                nbytes = 0 if offset == 2**64 - 1 else n
            st = os.stat(chunk_dir / f"{i}.{j}.npy")
            assert st.st_blocks == -(-nbytes // 512), (i, j, nbytes, st.st_blocks)
            total += nbytes
    assert total > 0
