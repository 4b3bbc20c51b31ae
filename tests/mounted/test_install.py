"""A plain `pip install zarrfs` (its own dependencies, no extras) reads v3 arrays whose codecs or shards carry crc32c.

The test extra once brought the checksum library along, so green tests hid that a plain
install failed every such read with EIO. Here zarrfs runs from a venv of its own
(tests/support/plain_venv.py); zarr-python 3 in the test venv writes the store and is the oracle.
"""

from __future__ import annotations

import io
import json
import os
import subprocess

import numpy as np
import pytest

from support import builders, mounting, oracles
from support.builders import ArraySpec

# A sharded array as zarr-python 3 writes it with `shards=` (index codecs: bytes + crc32c),
# with a shard and inner chunks cut at the edge; and an array whose own codecs end in crc32c.
ARRAYS = [
    ArraySpec("sharded", "float32", (37, 23), (5, 7), "zstd", kwargs={"shards": (20, 14)}),
    ArraySpec("g/crc32c", "float64", (30, 20), (8, 8), "crc32c"),
]


class PlainMounter(mounting.Mounter):
    """A Mounter whose command is the plain venv's own ``zarrfs`` script."""

    def __init__(self, workdir, venv):
        super().__init__(workdir)
        self.venv = venv

    def command(self, source, mountpoint, log_file, opts=(), foreground=False):
        cmd = super().command(source, mountpoint, log_file, opts, foreground)
        assert cmd[: len(mounting.ZARRFS)] == mounting.ZARRFS
        return self.venv.command(cmd[len(mounting.ZARRFS) :])


@pytest.fixture(scope="module")
def crc_store(tmp_path_factory):
    import zarr

    root = tmp_path_factory.mktemp("install") / "crc.zarr"
    zarr.open_group(os.fspath(root), mode="w", zarr_format=3)
    rng = np.random.default_rng(8)
    for spec in ARRAYS:
        builders.create_array(root, spec, 3, rng)
    return root


def test_store_uses_crc32c(crc_store):
    """The oracle's store has what this module is about: a crc32c shard index and a crc32c codec."""
    sharded = json.loads((crc_store / "sharded" / "zarr.json").read_text())["codecs"]
    assert [c["name"] for c in sharded] == ["sharding_indexed"]
    assert [c["name"] for c in sharded[0]["configuration"]["index_codecs"]] == ["bytes", "crc32c"]
    plain = json.loads((crc_store / "g" / "crc32c" / "zarr.json").read_text())["codecs"]
    assert plain[-1]["name"] == "crc32c"


def test_plain_venv_runs_its_own_copy(plain_venv, tmp_path):
    """The venv's python imports the installed zarrfs (not the work tree) and has no extras' packages."""
    probe = (
        "import importlib.util as u, zarrfs; print(zarrfs.__file__); "
        "print(*[m for m in ('zarr', 'pytest', 'crc32c') if u.find_spec(m)])"
    )
    r = subprocess.run(
        plain_venv.python_command(["-c", probe]), capture_output=True, text=True, timeout=60, cwd=tmp_path
    )  # not the work tree: `-c` puts the current directory first
    assert r.returncode == 0, r.stderr
    where, extras = r.stdout.splitlines()
    assert where.startswith(os.fspath(plain_venv.path)), where
    assert extras == "", f"the plain venv holds packages of an extra: {extras}"


def test_plain_install_reads_crc32c_arrays(plain_venv, crc_store, tmp_path):
    """Mounted with the plain venv's zarrfs, both arrays read as np.save of zarr-python's values, previews
    are there; no warning logged."""
    problem = mounting.check_fuse_available()
    if problem:
        pytest.fail(f"mounted tests need FUSE: {problem}", pytrace=False)
    mounter = PlainMounter(tmp_path / "mounts", plain_venv)
    try:
        mnt = mounter(crc_store)
        for spec in ARRAYS:
            want = oracles.expected_for(crc_store, spec.path)
            try:
                got = (mnt / f"{spec.path}.npy").read_bytes()
            except OSError as e:
                pytest.fail(f"reading {spec.path}.npy: {e}\nlog:\n{mounter.log_text(mnt)}")
            oracles.assert_same_array(np.load(io.BytesIO(got)), oracles.zarr_value(crc_store, spec.path), spec.path)
            assert got == want.npy, f"{spec.path}.npy differs from np.save of zarr-python's value"
        # previews come with a plain install (Pillow is a dependency, not an extra)
        from PIL import Image

        assert os.listdir(mnt / ".zarrfs" / "preview" / "g") == ["crc32c.png"]
        with Image.open(mnt / ".zarrfs" / "preview" / "g" / "crc32c.png") as im:
            assert (im.format, im.size) == ("PNG", (20, 30))
        mounting.unmount_and_wait(mounter, mnt)
        log = mounter.log_text(mnt)
        bad = [ln for ln in log.splitlines() if any(f" {lv} " in ln for lv in ("WARNING", "ERROR", "CRITICAL"))]
        assert not bad, "the daemon logged:\n" + "\n".join(bad)
    finally:
        problems = mounter.close()
    assert not problems, "\n\n".join(problems)


def _references_on_s3() -> dict:
    """JSON references whose data file is on S3 (made by hand: only the start-up is tested)."""
    zarray = {
        "zarr_format": 2,
        "shape": [2],
        "chunks": [2],
        "dtype": "<f4",
        "compressor": None,
        "filters": None,
        "fill_value": 0,
        "order": "C",
    }
    return {
        "version": 1,
        "refs": {
            ".zgroup": json.dumps({"zarr_format": 2}),
            "a/.zarray": json.dumps(zarray),
            "a/0": ["s3://no-bucket/t.nc", 0, 8],
        },
    }


@pytest.mark.parametrize(
    "source, extra",
    [
        ("http://127.0.0.1:9/x.zarr", "http"),
        ("s3://no-bucket/x.zarr", "s3"),
        ("gs://no-bucket/x.zarr", "gcs"),
        ("refs.json", "s3"),
        ("refs.parq", "references"),
    ],
)
def test_missing_backend_is_one_line_naming_the_extra(plain_venv, tmp_path, source, extra):
    """A plain install meeting a protocol whose backend it lacks (for the store, or for the data files
    references point to) prints one line naming the extra to install, not an import error."""
    from support import reference_files as rf

    refs = _references_on_s3()
    if source == "refs.json":
        source = rf.write_json(refs, tmp_path / "refs.json")
    elif source == "refs.parq":
        source = rf.write_parquet(refs, str(tmp_path / "refs.parq"))
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    code, stdout, stderr, was_mounted = mounting.run_expecting_failure(plain_venv.command([source, mnt]), mnt, tmp_path)
    assert not was_mounted and code == 1, stderr
    lines = stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"zarrfs: {source}: "), stderr
    assert f"pip install 'zarrfs[{extra}]'" in lines[0], lines[0]
    assert extra in lines[0].split("ZARRFS_EXTRAS=")[1].split()[0].split(","), lines[0]
