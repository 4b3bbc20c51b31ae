"""Zarr v1 stores written by zarr 1.1.0 (tests/fixtures/v1) read back as that writer reads them."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
import trio

from zarrfs import grid
from zarrfs.engine import Engine
from zarrfs.engine.cache import ChunkCache
from zarrfs.errors import CorruptChunk
from zarrfs.formats import open_hierarchy_sync
from zarrfs.formats.v1 import V1Hierarchy
from zarrfs.options import Options
from zarrfs.storage.store import Store
from zarrfs.views.streams import ArrayStream

from support import FIXTURES

FIXTURES = FIXTURES / "v1"
NAMES = sorted(p.parent.name for p in FIXTURES.glob("*/meta"))
# numcodecs' blosc lacks snappy and zstd 0.7 (legacy) that zarr 1.1.0's bundled c-blosc had.
UNDECODABLE = {"blosc_snappy_u2_C", "blosc_zstd_bitshuffle_i4_F"}


def read(name: str, v1_order: str = "writer") -> np.ndarray:
    store = Store(str(FIXTURES / name))
    hierarchy = open_hierarchy_sync(store, options=Options(v1_order=v1_order))
    assert isinstance(hierarchy, V1Hierarchy)
    meta = hierarchy.node_sync("")
    stream = ArrayStream(meta)
    data = trio.run(Engine(store, ChunkCache(1 << 24)).read, stream, 0, stream.size)
    return np.load(io.BytesIO(data))


def expected(name: str) -> tuple[np.ndarray, dict]:
    return np.load(FIXTURES / "expected" / f"{name}.npy"), json.loads(
        (FIXTURES / "expected" / f"{name}.json").read_text()
    )


def written_regions(info: dict, shape) -> list[tuple[slice, ...]]:
    chunks = tuple(info["chunks"])
    return [
        grid.chunk_slices(tuple(int(i) for i in key.split(".")), tuple(shape), chunks) for key in info["chunks_written"]
    ]


@pytest.mark.parametrize("name", [n for n in NAMES if n not in UNDECODABLE])
def test_reads_what_zarr_1_1_0_reads(name):
    want, info = expected(name)
    got = read(name, "writer")
    assert got.dtype == want.dtype and got.shape == want.shape
    if info["defined"] == "all":
        assert got.tobytes() == np.ascontiguousarray(want).tobytes()
    else:  # fill_value null: only the chunks written are defined
        for region in written_regions(info, want.shape):
            assert got[region].tobytes() == np.ascontiguousarray(want[region]).tobytes()


def test_spec_order_differs_only_where_the_writer_broke_the_spec():
    """By the spec, `order: F` chunks are F-ordered; zarr 1.1.0 did that only with blosc."""
    for name in NAMES:
        if name in UNDECODABLE:
            continue
        want, info = expected(name)
        if info["defined"] != "all":
            continue
        same = read(name, "spec").tobytes() == np.ascontiguousarray(want).tobytes()
        writer_broke_spec = info["order"] == "F" and info["compression"] != "blosc" and want.ndim > 1
        assert same != writer_broke_spec, name


def test_default_is_spec_order():
    assert Options().v1_order == "spec"


@pytest.mark.parametrize("name", sorted(UNDECODABLE))
def test_unavailable_blosc_codec_is_an_error_naming_the_chunk(name):
    with pytest.raises(CorruptChunk, match=r"chunk \d+\.\d+: cannot decode"):
        read(name)


def test_metadata_quirks():
    store = Store(str(FIXTURES / "blosc_f8_C"))
    meta = open_hierarchy_sync(store).node_sync("")
    assert np.isnan(meta.fill_value)  # a bare NaN token in JSON
    s_meta = open_hierarchy_sync(Store(str(FIXTURES / "zlib_S5_C"))).node_sync("")
    want_fill = json.loads((FIXTURES / "zlib_S5_C" / "meta").read_text())["fill_value"]
    assert s_meta.fill_value[()] == want_fill.encode()  # plain text, not base64
    zerod = read("zerod_i4")
    assert zerod.shape == () and zerod == expected("zerod_i4")[0]


def _zerod_copy(tmp_path: Path) -> Path:
    import shutil

    root = tmp_path / "zerod_i4"
    shutil.copytree(FIXTURES / "zerod_i4", root)
    return root


def test_zero_d_chunk_is_read_from_key_0(tmp_path):
    """zarr 1.1.0 derives the key '' (the store's root) for a 0-d array's chunk and cannot store
    it; zarrfs keeps it at `0`, as zarr 2 does with the same key rule. The chunk is made here
    from the v1 spec: the element's bytes, compressed with the `meta` compressor (zlib)."""
    import zlib

    root = _zerod_copy(tmp_path)
    assert json.loads((root / "meta").read_text())["compression"] == "zlib"
    (root / "0").write_bytes(zlib.compress(np.array(-7, "<i4").tobytes(), 1))
    got = _read_root(root)
    assert got.shape == () and got.dtype == np.dtype("<i4") and got[()] == -7


def _read_root(root: Path) -> np.ndarray:
    store = Store(str(root))
    meta = open_hierarchy_sync(store).node_sync("")
    assert meta.chunk_key(()) == "0"
    stream = ArrayStream(meta)
    return np.load(io.BytesIO(trio.run(Engine(store, ChunkCache(1 << 20)).read, stream, 0, stream.size)))


def test_malformed_meta_is_named(tmp_path):
    from zarrfs.errors import UserError

    (tmp_path / "meta").write_text('{"zarr_format": 1, "shape": [3]')
    (tmp_path / "attrs").write_text("{}")
    for fmt in ("auto", "v1"):
        with pytest.raises(UserError, match=r"meta: malformed JSON: "):
            open_hierarchy_sync(Store(str(tmp_path)), fmt)
