"""The documentation's snippets, run as written: the README's session on the sample demo.sh writes
(its output compared with what the README shows), and REMOTE.md's kerchunk recipe with the packages
it names, on a netCDF4 file (values compared with netCDF4's)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np

from support import REPO, mounting


def _block(doc: Path, heading: str, lang: str) -> str:
    """The first fenced block of language LANG below HEADING in DOC."""
    text = doc.read_text()
    after = text.split(f"\n{heading}\n", 1)[1]
    match = re.search(rf"^```{lang}\n(.*?)^```$", after, re.S | re.M)
    assert match is not None, f"{doc.name}: no {lang} block under {heading!r}"
    return match.group(1)


def _session(block: str) -> list[tuple[str, str]]:
    """(command, the output shown after it) for each `$ ` line of a console block."""
    steps: list[tuple[str, list[str]]] = []
    for line in block.splitlines():
        if line.startswith("$ "):
            steps.append((line[2:], []))
        else:
            steps[-1][1].append(line)
    return [(cmd, "\n".join(out)) for cmd, out in steps]


def test_readme_session_prints_what_it_shows(tmp_path):
    """Every command of the README's session, in one shell from the repository's root (as a reader
    who ran demo.sh there), prints what the README shows (ls's columns aside: words compared)."""
    steps = _session(_block(REPO / "README.md", "## A session", "console"))
    sample, mnt = tmp_path / "sample.zarr", tmp_path / "sample"
    subprocess.run([sys.executable, REPO / "scripts" / "make_sample.py", sample], check=True, timeout=120)
    places = {"/tmp/zarrfs-demo/sample.zarr": os.fspath(sample), "/tmp/sample": os.fspath(mnt)}
    script = ["set -e"]
    for i, (cmd, _) in enumerate(steps):
        for shown, here in places.items():
            cmd = cmd.replace(shown, here)
        script += [f"echo '@@step {i}'", cmd]
    try:
        r = subprocess.run(["bash", "-c", "\n".join(script)], cwd=REPO, capture_output=True, text=True, timeout=300)
    finally:
        mounting.unmount(mnt)
    assert r.returncode == 0, (r.stdout, r.stderr)
    printed = re.split(r"^@@step \d+\n", r.stdout, flags=re.M)[1:]
    assert len(printed) == len(steps), r.stdout
    for (cmd, shown), got in zip(steps, printed):
        assert got.split() == shown.split(), f"$ {cmd}\nREADME shows:\n{shown}\nprinted:\n{got}"


def test_remote_kerchunk_recipe_runs_and_mounts(mount, tmp_path):
    """REMOTE.md's recipe (kerchunk, h5py, fastparquet: what it says to install, in the test extra)
    makes JSON and Parquet references of a netCDF4 file; both mount and read as netCDF4 reads it."""
    import netCDF4

    nc = tmp_path / "era5.nc"
    t2m = np.random.default_rng(3).standard_normal((4, 30, 40)).astype("f4")
    with netCDF4.Dataset(nc, "w") as ds:
        for name, n in zip(("time", "lat", "lon"), t2m.shape):
            ds.createDimension(name, n)
        var = ds.createVariable("t2m", "f4", ("time", "lat", "lon"), zlib=True, chunksizes=(1, 15, 20))
        var[:] = t2m
    code = _block(REPO / "docs" / "REMOTE.md", "## References", "python")
    assert '"/data/era5.nc"' in code
    code = code.replace('"/data/era5.nc"', repr(os.fspath(nc)))
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    for refs in ("era5.json", "era5.parq"):
        mnt = mount(tmp_path / refs)
        np.testing.assert_array_equal(np.load(mnt / "t2m.npy"), t2m)
        mounting.unmount(mnt)
