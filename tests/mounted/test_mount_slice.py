"""Mounted tests of `.zarrfs/slice/PATH[SEL].npy|.raw`: any basic-indexing selection of an array as a file.

Oracles: zarr-python 3 reading the same store, numpy's own indexing of that value, `np.save`.
"""

from __future__ import annotations

import errno
import io
import json
import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from support import mounting

SLICE = Path(".zarrfs") / "slice"
# Arrays of the store: (path, shape, chunks, dtype, order, zarr format)
ARRAYS = [
    ("a2", (13, 7, 5), (4, 3, 2), "<i4", "C", 2),
    ("g/f2", (9, 11), (4, 5), ">f8", "F", 2),
    ("g/b1", (17,), (5,), ">u2", "C", 2),
    ("c3", (10, 12), (3, 5), "<f4", "C", 3),
]


def build(root: Path) -> dict[str, np.ndarray]:
    import zarr

    rng = np.random.default_rng(5)
    out = {}
    for path, shape, chunks, dtype, order, fmt in ARRAYS:
        base = root / f"v{fmt}"
        g = zarr.open_group(base, mode="a", zarr_format=fmt)
        kw = {"order": order} if fmt == 2 else {}
        a = g.create_array(path, shape=shape, chunks=chunks, dtype=dtype, fill_value=0, **kw)
        value = (rng.standard_normal(shape) * 1000).astype(dtype)
        a[...] = value
        out[f"v{fmt}/{path}"] = np.asarray(zarr.open_array(base / path, mode="r")[...])
    return out


@pytest.fixture(scope="module")
def slice_mounts(module_mount, tmp_path_factory):
    root = tmp_path_factory.mktemp("slice-store")
    values = build(root)
    mnts = {fmt: module_mount(root / f"v{fmt}") for fmt in (2, 3)}
    mnts["root"] = root
    return mnts, values


def npy_of(value) -> bytes:
    buf = io.BytesIO()
    np.save(buf, np.require(np.asarray(value), requirements="C"))  # the files are in C order
    return buf.getvalue()


@st.composite
def selections(draw, ndim: int) -> str:
    items = []
    ellipsis_at = draw(st.one_of(st.none(), st.integers(0, ndim)))
    n = draw(st.integers(0, ndim))
    for i in range(n):
        if i == ellipsis_at:
            items.append("...")
        if draw(st.integers(0, 3)) == 0:
            items.append(str(draw(st.integers(-18, 18))))
        else:
            lo, hi = (draw(st.one_of(st.none(), st.integers(-20, 20))) for _ in range(2))
            step = draw(st.one_of(st.none(), st.integers(-5, 5).filter(bool)))
            items.append(
                f"{'' if lo is None else lo}:{'' if hi is None else hi}" + ("" if step is None else f":{step}")
            )
    return ",".join(items)


@settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.data())
def test_slice_files_are_numpys_selection(slice_mounts, data):
    mnts, values = slice_mounts
    key = data.draw(st.sampled_from(sorted(values)))
    fmt, path = int(key[1]), key[3:]
    value = values[key]
    text = data.draw(selections(value.ndim))
    p = mnts[fmt] / SLICE / f"{path}[{text}].npy"
    try:
        want = value[eval(f"np.s_[{text}]")] if text else value[()]  # oracle: numpy's indexing
    except IndexError:
        with pytest.raises(FileNotFoundError):
            p.stat()
        return
    got = p.read_bytes()
    assert p.stat().st_size == len(got)
    assert got == npy_of(want), (key, text)
    np.testing.assert_array_equal(np.load(p), want)
    raw = (mnts[fmt] / SLICE / f"{path}[{text}].raw").read_bytes()
    assert raw == np.ascontiguousarray(want).tobytes()


def test_issue_examples_and_listing(slice_mounts):
    mnts, values = slice_mounts
    mnt, value = mnts[2], values["v2/a2"]
    for text in ("0:90,::2", "-1", "..., 3", "::-3, 1:, ::-2", "2, -1, 0"):
        got = np.load(mnt / SLICE / f"a2[{text}].npy")
        want = value[eval(f"np.s_[{text}]")]
        assert got.dtype == np.asarray(want).dtype and got.shape == np.shape(want)
        np.testing.assert_array_equal(got, want)
    # Directories only: the files are looked up, never listed.
    assert sorted(os.listdir(mnt / SLICE)) == ["g"]
    assert os.listdir(mnt / SLICE / "g") == []


def stats(mnt: Path) -> dict:
    return json.loads((mnt / ".zarrfs" / "stats.json").read_bytes())


def test_a_slice_loads_only_the_chunks_it_needs(slice_mounts, mount):
    mnts, values = slice_mounts
    mnt = mount(mnts["root"] / "v3")  # a fresh mount: nothing cached
    before = stats(mnt)
    got = np.load(mnt / SLICE / "c3[4, 6:9].npy")  # row 4 is in chunk row 1; columns 6..8 in chunk column 1
    np.testing.assert_array_equal(got, values["v3/c3"][4, 6:9])
    after = stats(mnt)
    assert after["chunk_gets"] - before["chunk_gets"] == 1, (before, after)


@pytest.mark.parametrize(
    "name,why",
    [
        ("a2[1:2:0].npy", "step cannot be zero"),
        ("a2[99].npy", "out of bounds"),
        ("a2[1,2,3,4].npy", "too many indices"),
        ("a2[__import__('os')].npy", "not an integer"),
        ("a2[1.5].npy", "not an integer"),
        ("nope[1].npy", "no array"),
        ("a2[1:(].npy", "not a selection"),
    ],
)
def test_bad_selections_are_enoent_with_a_reason(slice_mounts, module_mount, name, why):
    mnts, _ = slice_mounts
    with pytest.raises(OSError) as e:
        os.stat(mnts[2] / SLICE / name)
    assert e.value.errno == errno.ENOENT
    lines = mounting.log_lines_naming(module_mount.log_text(mnts[2]), name)
    assert any(why in line for line in lines), lines
