"""Writes to Zarr v3 draft hierarchies through the core (no FUSE): both families.

- zarr 2.18's `meta/root` layout: groups, arrays, chunks, attributes, erasures and moves
  made by zarrfs are read back by zarrfs and by zarr 2.18 itself (run as a subprocess from
  .venv-zarr218, the oracle); arrays under the sharding storage transformer that zarr
  2.18 wrote are modified in place and read back by zarr 2.18.
- The May 2022 core draft (`meta/P.array.json`, `data/P/c0/0`): no writer exists, so
  documents are checked against the spec text, chunk bytes against the fixture
  generator's own encoder (tests/fixtures/make_fixtures_v3draft_spec.py, which does not import
  zarrfs) and a small decoder written here from the spec, values against the fixture's
  expected .npy files.
"""

from __future__ import annotations

import gzip
import io
import json
import math
import shutil
from pathlib import Path

import numcodecs
import numpy as np
import pytest
import trio

from zarrfs import grid
from zarrfs.engine import Engine
from zarrfs.engine.cache import ChunkCache
from zarrfs.errors import CorruptChunk, Exists, InvalidArgument, Unsupported
from zarrfs.formats import open_hierarchy_sync
from zarrfs.formats.v3draft import ShardedChunks, V3DraftHierarchy
from zarrfs.model import ArrayMeta, GroupMeta, NewArray
from zarrfs.storage.chunksource import read_chunk_sync, write_chunk_sync
from zarrfs.storage.store import Store
from zarrfs.views.streams import ArrayStream

from support.core import read_npy
from support.v3draft import (
    SPEC,
    Z218,
    assert_same,
    core_decode,
    core_read,
    generator,
    keys_below,
    read_doc,
    skip_or_fail,
    zarr218_problem,
    zarr218_read,
    zarr218_run,
)

ABSENT = 2**64 - 1

# Names a May 2022 array document must have ("Array metadata": mandatory names, then the
# optional `codecs` and `storage_transformers`; "must not contain any other names").
CORE_MANDATORY = {"shape", "data_type", "chunk_grid", "chunk_memory_layout", "fill_value", "extensions", "attributes"}
CORE_OPTIONAL = {"codecs", "storage_transformers"}


# --------------------------------------------------------------------------- helpers


def copy_store(src: Path, tmp_path: Path, name: str = "store") -> str:
    dst = tmp_path / name
    shutil.copytree(src, dst)
    return str(dst)


def open_h(path: str) -> tuple[Store, V3DraftHierarchy]:
    store = Store(path)
    h = open_hierarchy_sync(store)
    assert isinstance(h, V3DraftHierarchy)
    return store, h


def load_npy(data: bytes) -> np.ndarray:
    return np.load(io.BytesIO(data))


def full_chunk(values: np.ndarray, fill, idx, chunks) -> np.ndarray:
    """Chunk `idx` of `values` at full chunk size (fill past the array's edge)."""
    reg = grid.chunk_slices(idx, values.shape, chunks)
    out = np.full(chunks, fill, dtype=values.dtype)
    out[tuple(slice(0, r.stop - r.start) for r in reg)] = values[reg]
    return out


def write_all(store: Store, meta: ArrayMeta, values: np.ndarray, erase_fill: bool = True) -> list[tuple]:
    """Write every grid chunk of `values`; chunks all equal to the fill value are erased (None)."""
    erased = []
    for idx in grid.all_chunks(meta.shape, meta.chunk_shape):
        chunk = full_chunk(values, meta.fill_value, idx, meta.chunk_shape)
        reg = grid.chunk_slices(idx, meta.shape, meta.chunk_shape)
        inside = values[reg]
        if erase_fill and np.array_equal(
            inside, np.broadcast_to(meta.fill_value, inside.shape), equal_nan=inside.dtype.kind in "fc"
        ):
            write_chunk_sync(meta, store, idx, None)
            erased.append(idx)
        else:
            write_chunk_sync(meta, store, idx, meta.codec.encode(chunk, meta.fill_value))
    return erased


def sample(dtype: np.dtype, shape: tuple, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    n = math.prod(shape)
    if dtype.fields is not None:
        out = np.zeros(n, dtype)
        for name in dtype.names:
            out[name] = sample(dtype.fields[name][0], (n,), seed + 1)
        return out.reshape(shape)
    if dtype.kind == "b":
        return (rng.integers(0, 2, n) == 1).reshape(shape)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(max(info.min, -1000), min(info.max, 1000), n).astype(dtype).reshape(shape)
    if dtype.kind == "f":
        return (rng.standard_normal(n) * 100).astype(dtype).reshape(shape)
    if dtype.kind == "c":
        return (rng.standard_normal(n) + 1j * rng.standard_normal(n)).astype(dtype).reshape(shape)
    if dtype.kind in "SV":
        return rng.integers(1, 256, n * dtype.itemsize, dtype=np.uint8).view(dtype).reshape(shape)
    if dtype.kind == "U":
        return np.array(
            ["".join(chr(97 + (i + k) % 26) for k in range(i % (dtype.itemsize // 4 + 1))) for i in range(n)],
            dtype=dtype,
        ).reshape(shape)
    if dtype.kind in "mM":
        return rng.integers(0, 10**9, n).astype("<i8").view(dtype.newbyteorder("<")).astype(dtype).reshape(shape)
    raise ValueError(dtype)


@pytest.fixture
def zarr218():
    problem = zarr218_problem()
    if problem:
        skip_or_fail(f"zarr 2.18 oracle unavailable: {problem}")
    return zarr218_read


def parse_shard(blob: bytes, n_inner: int, rewritten: bool = True) -> list[bytes | None]:
    """Inner chunks of a shard; for a shard zarrfs rewrote, checks its layout: chunks back to
    back from offset 0 in index order, then the index and nothing else."""
    body = len(blob) - 16 * n_inner
    index = np.frombuffer(blob[body:], "<u8").reshape(n_inner, 2)
    out, expect = [], 0
    for offset, nbytes in index.tolist():
        if offset == ABSENT and nbytes == ABSENT:
            out.append(None)
            continue
        assert not rewritten or offset == expect, (offset, expect)
        assert offset + nbytes <= body
        out.append(blob[offset : offset + nbytes])
        expect += nbytes
    assert not rewritten or expect == body
    return out


# --------------------------------------------------------------------------- zarr 2.18 layout

PROTOCOL_CASES = [
    # name, dtype, shape, chunks, codec option, fill value
    ("f8_nan_blosc", "<f8", (13, 17), (5, 6), None, np.nan),
    ("i4_zlib_guess", "<i4", (9, 11), None, "zlib:3", 7),
    ("be_i2_none", ">i2", (10, 7), (4, 3), "none", -1),
    ("c16_zstd", "<c16", (6, 5), (4, 4), "zstd:1", 1.5 - 2j),
    ("bool_gzip", "|b1", (5, 6), (2, 4), "gzip", True),
    ("u1_lz4", "|u1", (40,), (16,), "lz4", 255),
    ("S4_bz2", "|S4", (11,), (4,), "bz2", b"ab"),
    ("U3_lzma", "<U3", (7,), (3,), "lzma", "x"),
    ("struct", [("x", "<i4"), ("y", "<f8")], (9,), (4,), None, None),
    ("datetime", "<M8[ns]", (6,), (4,), None, None),
    ("f2_neginf", "<f2", (5, 5), (3, 3), None, -np.inf),
    ("raw_V3", "|V3", (7,), (3,), "none", b"\x01\x02\x03"),
    ("zerod", "<f8", (), None, None, np.nan),
]


def _new(dtype, shape, chunks, codec, fill) -> NewArray:
    dtype = np.dtype(dtype)
    return NewArray(shape, dtype, chunks, codec, None if fill is None else np.array(fill, dtype=dtype))


def test_zarr218_layout_create_write_read(tmp_path, zarr218):
    root = copy_store(Z218 / "store", tmp_path)
    store, h = open_h(root)
    made = h.create_group_sync("made")
    assert isinstance(made, GroupMeta) and made.metadata_key == "meta/root/made.group.json"
    assert read_doc(root, "meta/root/made.group.json") == {"attributes": {}}
    expected = {}
    for i, (name, dtype, shape, chunks, codec, fill) in enumerate(PROTOCOL_CASES):
        path = f"implicit_new/deep/{name}" if i % 3 == 1 else f"made/{name}"  # some below implicit groups
        meta = h.create_array_sync(path, _new(dtype, shape, chunks, codec, fill))
        values = sample(meta.dtype, meta.shape, i)
        if meta.shape and meta.chunk_shape[0] < meta.shape[0]:  # the first chunk row is fill: erased
            values[: meta.chunk_shape[0]] = meta.fill_value
        erased = write_all(store, meta, values)
        assert (len(erased) > 0) == (bool(meta.shape) and meta.chunk_shape[0] < meta.shape[0]), name
        expected[path] = values
        for idx in erased:
            assert not (Path(root) / meta.chunk_key(idx)).exists()

    # keys and documents as zarr 2.18 writes them
    doc = read_doc(root, "meta/root/made/f8_nan_blosc.array.json")
    assert doc == {
        "attributes": {},
        "chunk_grid": {"chunk_shape": [5, 6], "separator": "/", "type": "regular"},
        "chunk_memory_layout": "C",
        "compressor": {
            "codec": "https://purl.org/zarr/spec/codec/blosc/1.0",
            "configuration": {"blocksize": 0, "clevel": 5, "cname": "lz4", "shuffle": 1},
        },
        "data_type": "<f8",
        "extensions": [],
        "fill_value": "NaN",
        "shape": [13, 17],
    }
    assert (Path(root) / "data/root/made/f8_nan_blosc/c2/1").is_file()
    assert read_doc(root, "meta/root/made/be_i2_none.array.json")["data_type"] == ">i2"
    assert "compressor" not in read_doc(root, "meta/root/made/be_i2_none.array.json")
    assert read_doc(root, "meta/root/implicit_new/deep/bool_gzip.array.json")["data_type"] == "bool"
    assert read_doc(root, "meta/root/made/u1_lz4.array.json")["data_type"] == "u1"
    assert read_doc(root, "meta/root/made/c16_zstd.array.json")["fill_value"] == [1.5, -2.0]
    assert read_doc(root, "meta/root/made/S4_bz2.array.json")["data_type"]["type"] == "|S4"
    zerod = read_doc(root, "meta/root/made/zerod.array.json")
    assert "compressor" not in zerod and zerod["chunk_grid"]["chunk_shape"] == []  # zarr 2.18's 0-d quirks
    assert (Path(root) / "data/root/made/zerod/c0").is_file()
    assert not (Path(root) / "meta/root/implicit_new.group.json").exists()  # parents stay implicit

    # attributes: an explicit group, an implicit one (gets a document), an array
    h.set_attributes_sync(h.node_sync("made"), {"a": 1, "nested": {"b": [1, 2]}})
    h.set_attributes_sync(h.node_sync("implicit_new"), {"implicit": False})
    arr = h.set_attributes_sync(h.node_sync("made/f8_nan_blosc"), {"units": "m"})
    assert arr.attributes == {"units": "m"} and read_doc(root, "meta/root/made/f8_nan_blosc.array.json")["shape"]
    assert read_doc(root, "meta/root/implicit_new.group.json") == {"attributes": {"implicit": False}}

    # zarrfs reads it back
    _, h2 = open_h(root)
    for path, values in expected.items():
        assert_same(load_npy(read_npy(root, path)), values, path)
    assert h2.node_sync("made").attributes == {"a": 1, "nested": {"b": [1, 2]}}

    # zarr 2.18 reads it back
    got = zarr218(root, arrays=list(expected), groups=["made", "implicit_new", "implicit_new/deep"])
    for path, values in expected.items():
        info = got["arrays"][path]
        assert "error" not in info, (path, info)
        assert_same(info["value"], values, path)
    assert got["arrays"]["made/f8_nan_blosc"]["attrs"] == {"units": "m"}
    assert got["groups"]["made"]["attrs"] == {"a": 1, "nested": {"b": [1, 2]}}
    assert "f8_nan_blosc" in got["groups"]["made"]["arrays"]
    assert got["groups"]["implicit_new"]["attrs"] == {"implicit": False}


def test_zarr218_layout_refuses_conflicts_and_unknown_types(tmp_path):
    root = copy_store(Z218 / "store", tmp_path)
    _, h = open_h(root)
    with pytest.raises(Exists):
        h.create_group_sync("group_a/float64_nan_zlib")  # an array has this path
    with pytest.raises(Exists):
        h.create_array_sync("group_a/sub", NewArray((3,), np.dtype("<i4")))  # an explicit group
    with pytest.raises(Exists):
        h.create_array_sync("implicit", NewArray((3,), np.dtype("<i4")))  # an implicit group
    with pytest.raises(Unsupported):
        h.create_array_sync("x", NewArray((3,), np.dtype("<M8[10s]")))  # zarr 2.18 cannot encode it
    assert not (Path(root) / "meta/root/x.array.json").exists()
    with pytest.raises(Unsupported):
        V3DraftHierarchy(Store(root), None).create_group_sync("g")  # no entry point


SHARD_EDITS = {
    # path: [(grid chunk, new value or None to drop it)]; the fixture's chunks are in index.json
    "sharded/uint16_blosc": [((2, 2), 1000), ((0, 2), 2000), ((1, 0), None), ((4, 3), 3000), ((4, 0), None)],
    "sharded/float32_zlib_F": [((1, 1), 1.25), ((3, 2), -7.5), ((0, 0), None), ((1, 0), None)],
    "sharded/int32_1d_none": [((3,), 11), ((9,), 12), ((4,), None)],
    "sharded/int32_0d": [((), 77)],
}


def apply_shard_edits(store: Store, meta: ArrayMeta, model: np.ndarray, edits) -> None:
    for idx, value in edits:
        reg = grid.chunk_slices(idx, meta.shape, meta.chunk_shape)
        if value is None:
            write_chunk_sync(meta, store, idx, None)
            model[reg] = meta.fill_value
        else:
            chunk = (np.arange(math.prod(meta.chunk_shape)) + value).astype(meta.dtype).reshape(meta.chunk_shape)
            write_chunk_sync(meta, store, idx, meta.codec.encode(chunk, meta.fill_value))
            model[reg] = chunk[tuple(slice(0, r.stop - r.start) for r in reg)]


def test_zarr218_sharded_in_place(tmp_path, zarr218):
    index = json.loads((Z218 / "expected" / "index.json").read_text())
    root = copy_store(Z218 / "store", tmp_path)
    store, h = open_h(root)
    models = {}
    for path, edits in SHARD_EDITS.items():
        meta = h.node_sync(path)
        assert isinstance(meta.source, ShardedChunks)
        model = np.load(Z218 / "expected" / index["arrays"][path]["file"])
        apply_shard_edits(store, meta, model, edits)
        models[path] = model

    # uint16_blosc: shard c0/1 did not exist (now does); shard c2/0 held only (4, 0): gone
    u16 = Path(root) / "data/root/sharded/uint16_blosc"
    assert (u16 / "c0/1").is_file() and not (u16 / "c2/0").exists()
    meta = h.node_sync("sharded/uint16_blosc")
    inner = parse_shard((u16 / "c0/0").read_bytes(), 4)  # rewritten: chunks, then a fresh index
    assert inner[2] is None  # (1, 0) dropped
    assert read_chunk_sync(meta, store, (1, 0)) is None and read_chunk_sync(meta, store, (2, 2)) is not None

    for path, model in models.items():
        assert_same(load_npy(read_npy(root, path)), model, path)
    got = zarr218(root, arrays=list(models))
    for path, model in models.items():
        assert "error" not in got["arrays"][path], got["arrays"][path]
        assert_same(got["arrays"][path]["value"], model, path)


def test_shard_writers_of_one_shard_take_turns(tmp_path):
    """Concurrent writers of different inner chunks of the same shards lose nothing: the
    engine flushes them at once and makes the rewrites of one shard take turns."""
    root = copy_store(Z218 / "store", tmp_path)
    store, h = open_h(root)
    meta = h.node_sync("sharded/int32_1d_none")  # 10 grid chunks of 5, shards of 4
    stream = ArrayStream(meta, "C", with_header=False)
    for round_ in range(3):
        values = np.arange(50, dtype="<i4") + 100 * (round_ + 1)

        async def write_all(values=values) -> None:
            engine = Engine(store, ChunkCache(1 << 24))
            for i in range(10):  # ten dirty chunks, flushed concurrently below
                await engine.write(stream, i * 20, values[i * 5 : (i + 1) * 5].tobytes())
            await engine.flush()

        trio.run(write_all)
        assert_same(load_npy(read_npy(root, "sharded/int32_1d_none")), values)


async def test_engine_flushes_many_inner_chunks_of_a_shard(tmp_path, zarr218):
    """The engine's write-back (concurrent flushes of inner chunks) into a zarr-2.18 sharded array."""
    root = copy_store(Z218 / "store", tmp_path)
    store, h = open_h(root)
    meta = h.node_sync("sharded/uint16_blosc")
    engine = Engine(store, ChunkCache(1 << 24))
    stream = ArrayStream(meta, "C", with_header=False)
    values = sample(np.dtype("<u2"), (36, 36), 5)
    values[20:, :] = 0  # the last shard row holds only fill: its shards vanish
    await engine.write(stream, 0, values.tobytes())
    await engine.flush()
    assert sorted(p.name for p in (Path(root) / "data/root/sharded/uint16_blosc").iterdir()) == ["c0", "c1"]
    got = zarr218(root, arrays=["sharded/uint16_blosc"])
    assert_same(got["arrays"]["sharded/uint16_blosc"]["value"], values)


def test_corrupt_shard_is_left_alone(tmp_path):
    root = copy_store(Z218 / "store", tmp_path)
    store, h = open_h(root)
    meta = h.node_sync("sharded/int32_1d_none")
    key = Path(root) / meta.chunk_key((0,))
    key.write_bytes(b"short")
    chunk = meta.codec.encode(np.arange(5, dtype="<i4"), meta.fill_value)
    with pytest.raises(CorruptChunk, match="not rewriting"):
        write_chunk_sync(meta, store, (1,), chunk)
    assert key.read_bytes() == b"short"
    blob = (Path(root) / meta.chunk_key((4,))).read_bytes()
    bad = bytearray(blob)
    bad[-16:] = np.array([10**6, 5], "<u8").tobytes()  # the last entry points past the shard
    (Path(root) / meta.chunk_key((4,))).write_bytes(bytes(bad))
    with pytest.raises(CorruptChunk):
        write_chunk_sync(meta, store, (4,), chunk)
    assert (Path(root) / meta.chunk_key((4,))).read_bytes() == bytes(bad)


def test_zarr218_erase_move_and_attributes(tmp_path, zarr218):
    index = json.loads((Z218 / "expected" / "index.json").read_text())
    root = copy_store(Z218 / "store", tmp_path)
    _, h = open_h(root)

    def expect(path):
        return np.load(Z218 / "expected" / index["arrays"][path]["file"])

    # rm: an array with all its chunks; a sharded array with all its shards
    h.erase_node_sync(h.node_sync("dtypes/int16_bz2"))
    h.erase_node_sync(h.node_sync("sharded/uint16_blosc"))
    for gone in ("dtypes/int16_bz2", "sharded/uint16_blosc"):
        assert not (Path(root) / f"meta/root/{gone}.array.json").exists()
        assert not (Path(root) / f"data/root/{gone}").exists()
        assert h.node_sync(gone) is None
    # rmdir: an explicit group emptied first; an implicit group holding only a stray key
    for path in ("zerod/int32_unwritten", "zerod/float64_written"):
        h.erase_node_sync(h.node_sync(path))
    assert h.children_sync("zerod") == []
    h.erase_node_sync(h.node_sync("zerod"))
    assert not (Path(root) / "meta/root/zerod.group.json").exists() and h.node_sync("zerod") is None
    (Path(root) / "meta/root/stray").mkdir()
    (Path(root) / "meta/root/stray/notes.txt").write_text("not a node")
    stray = h.node_sync("stray")
    assert isinstance(stray, GroupMeta) and stray.metadata_key is None and h.children_sync("stray") == []
    h.erase_node_sync(stray)
    assert h.node_sync("stray") is None and not (Path(root) / "meta/root/stray").exists()

    # mv: an array into an implicit group, a group with everything below, a sharded array
    h.move_node_sync(h.node_sync("group_a/float64_nan_zlib"), "moved/f64")
    h.move_node_sync(h.node_sync("group_a"), "renamed_a")
    h.move_node_sync(h.node_sync("sharded/float32_zlib_F"), "sharded/f32_moved")
    for old in ("group_a", "group_a/sub/int32_blosc", "sharded/float32_zlib_F"):
        assert h.node_sync(old) is None, old
    assert not (Path(root) / "data/root/group_a").exists() and not (Path(root) / "meta/root/group_a").exists()
    assert not (Path(root) / "meta/root/group_a.group.json").exists()
    assert keys_below(root, "data/root/renamed_a/sub/int32_blosc") == {
        f"data/root/renamed_a/sub/int32_blosc/{k}" for k in index["arrays"]["group_a/sub/int32_blosc"]["chunks_written"]
    }
    assert (Path(root) / "meta/root/renamed_a/sub.group.json").is_file()
    assert (Path(root) / "data/root/sharded/f32_moved/c1/1").is_file()

    h.set_attributes_sync(h.node_sync(""), {"root": "attrs"})
    assert read_doc(root, "meta/root.group.json") == {"attributes": {"root": "attrs"}}

    # attributes of a zarr 2.18 array with filters: the filters stay, as zarr 2.18 keeps them
    delta = h.node_sync("filters/delta_zlib")
    filters = delta.attributes["filters"]
    h.set_attributes_sync(delta, {"note": "new"})
    assert read_doc(root, "meta/root/filters/delta_zlib.array.json")["attributes"] == {
        "note": "new",
        "filters": filters,
    }
    with pytest.raises(InvalidArgument):
        h.set_attributes_sync(h.node_sync("filters/delta_zlib"), {"filters": [{"id": "delta", "dtype": "<i8"}]})
    with pytest.raises(InvalidArgument):  # no filters yet: adding some would change the decoding
        h.set_attributes_sync(h.node_sync("dtypes/bool_zstd"), {"filters": [{"id": "delta", "dtype": "|b1"}]})

    arrays = {
        "moved/f64": expect("group_a/float64_nan_zlib"),
        "renamed_a/sub/int32_blosc": expect("group_a/sub/int32_blosc"),
        "sharded/f32_moved": expect("sharded/float32_zlib_F"),
        "filters/delta_zlib": expect("filters/delta_zlib"),
    }
    for path, values in arrays.items():
        assert_same(load_npy(read_npy(root, path)), values, path)
    got = zarr218(
        root,
        arrays=[*arrays, "dtypes/int16_bz2", "group_a/float64_nan_zlib"],
        groups=["", "renamed_a", "sharded", "dtypes"],
    )
    for path, values in arrays.items():
        assert "error" not in got["arrays"][path], got["arrays"][path]
        assert_same(got["arrays"][path]["value"], values, path)
    assert got["arrays"]["filters/delta_zlib"]["attrs"] == {"note": "new", "filters": filters}
    assert "error" in got["arrays"]["dtypes/int16_bz2"] and "error" in got["arrays"]["group_a/float64_nan_zlib"]
    assert got["groups"]["renamed_a"]["attrs"] == index["groups"]["group_a"]
    assert got["groups"]["renamed_a"]["groups"] == ["sub"]
    assert got["groups"]["sharded"]["arrays"] == ["f32_moved", "int32_0d", "int32_1d_none"]
    assert "int16_bz2" not in got["groups"]["dtypes"]["arrays"]
    assert "zerod" not in got["groups"][""]["groups"] and "renamed_a" in got["groups"][""]["groups"]
    assert got["groups"][""]["attrs"] == {"root": "attrs"}


def test_reads_what_zarr218_writes_with_dimension_separator_and_datetimes(tmp_path, zarr218):
    """Two zarr 2.18 documents the reader once refused: `dimension_separator` (written when
    given at creation) and the datetime data type extension."""
    root = tmp_path / "z"
    zarr218_run(
        [
            "-W",
            "ignore",
            "-c",
            f"""
import numpy as np, zarr
from zarr._storage.v3 import DirectoryStoreV3
s = DirectoryStoreV3({str(root)!r})
zarr.group(store=s, zarr_version=3)
a = zarr.create(store=s, path='dotted', shape=(5, 4), chunks=(2, 3), dtype='<i4', zarr_version=3,
                dimension_separator='.', fill_value=-3)
a[:3] = np.arange(12).reshape(3, 4)
t = zarr.create(store=s, path='when', shape=(4,), chunks=(3,), dtype='<M8[s]', zarr_version=3)
t[:] = np.array([1, 2, 3, 4], dtype='<M8[s]')
""",
        ]
    )
    assert read_doc(str(root), "meta/root/dotted.array.json")["dimension_separator"] == "."
    dotted = np.full((5, 4), -3, "<i4")
    dotted[:3] = np.arange(12).reshape(3, 4)
    assert_same(load_npy(read_npy(str(root), "dotted")), dotted)
    assert_same(load_npy(read_npy(str(root), "when")), np.array([1, 2, 3, 4], dtype="<M8[s]"))


# --------------------------------------------------------------------------- May 2022 layout

CORE_CASES = [
    # name, dtype, shape, chunks, codec option, fill value
    ("f8_nan_blosc", "<f8", (13, 9), (5, 4), None, np.nan),
    ("be_i4_gzip", ">i4", (9, 11), (4, 4), "gzip:1", -1),
    ("r24_none", "|V3", (7,), (3,), "none", b"\x01\x02\x03"),
    ("c8_zstd", "<c8", (4, 5), (3, 3), "zstd:3", 1 - 1j),
    ("bool_none", "|b1", (5, 6), (2, 2), "none", False),
    ("f2_inf_zlib", "<f2", (6,), (4,), "zlib:1", np.inf),
    ("u8_guess", "<u8", (300, 200), None, None, 2**64 - 1),
    ("zerod", "<i4", (), None, "none", 0),
]


def test_may2022_create_write_read(tmp_path):
    gen = generator()
    root = copy_store(SPEC / "core", tmp_path)
    store, h = open_h(root)
    assert h.layout.family == "core"
    h.create_group_sync("made")
    assert read_doc(root, "meta/made.group.json") == {"attributes": {}}  # "Group metadata"
    expected = {}
    for i, (name, dtype, shape, chunks, codec, fill) in enumerate(CORE_CASES):
        path = f"made/{name}" if i % 2 else f"implicit_new/{name}"
        meta = h.create_array_sync(path, _new(dtype, shape, chunks, codec, fill))
        values = sample(meta.dtype, meta.shape, i)
        if meta.shape and meta.chunk_shape[0] < meta.shape[0]:
            values[: meta.chunk_shape[0]] = meta.fill_value
        write_all(store, meta, values)
        expected[path] = values

        doc = read_doc(root, f"meta/{path}.array.json")
        assert CORE_MANDATORY <= set(doc) <= CORE_MANDATORY | CORE_OPTIONAL, name
        assert doc["chunk_grid"]["type"] == "regular" and doc["chunk_grid"]["separator"] == "/"
        assert doc["chunk_memory_layout"] == "C" and doc["extensions"] == [] and doc["attributes"] == {}
        for entry in doc["codecs"]:
            assert set(entry) <= {"type", "configuration"}
            assert entry["type"].startswith("https://purl.org/zarr/spec/codecs/") and entry["type"].endswith("/1.0")
        # every stored chunk: the generator's own encoding of the same chunk, byte for byte
        # (gzip and blosc: the same bytes once decompressed; gzip's header holds a time stamp,
        # blosc's the element size it was given)
        for idx in grid.all_chunks(meta.shape, meta.chunk_shape):
            key = Path(root) / meta.chunk_key(idx)
            if not key.exists():
                continue
            chunk = full_chunk(values, meta.fill_value, idx, meta.chunk_shape)
            want = gen.encode_core_chunk(chunk.astype(meta.dtype), doc)
            got = key.read_bytes()
            if any("/gzip/" in c["type"] or "/blosc/" in c["type"] for c in doc["codecs"]):
                assert_same(core_decode(got, doc, meta.dtype), core_decode(want, doc, meta.dtype), f"{name} {idx}")
            else:
                assert got == want, (name, idx)

    docs = {
        name: read_doc(root, f"meta/{'made' if i % 2 else 'implicit_new'}/{name}.array.json")
        for i, (name, *_rest) in enumerate(CORE_CASES)
    }
    assert docs["f8_nan_blosc"]["data_type"] == "float64" and docs["f8_nan_blosc"]["fill_value"] == "NaN"
    assert docs["f8_nan_blosc"]["codecs"] == [
        {
            "type": "https://purl.org/zarr/spec/codecs/blosc/1.0",
            "configuration": {"blocksize": 0, "clevel": 5, "cname": "lz4", "shuffle": 1},
        }
    ]
    assert docs["be_i4_gzip"]["data_type"] == "int32"
    assert docs["be_i4_gzip"]["codecs"] == [
        {"type": "https://purl.org/zarr/spec/codecs/endian/1.0", "configuration": {"endian": "big"}},
        {"type": "https://purl.org/zarr/spec/codecs/gzip/1.0", "configuration": {"level": 1}},
    ]
    assert docs["r24_none"]["data_type"] == "r24" and docs["r24_none"]["fill_value"] == "0x010203"
    assert docs["r24_none"]["codecs"] == []
    assert docs["c8_zstd"]["data_type"] == "complex64" and docs["c8_zstd"]["fill_value"] == [1.0, -1.0]
    assert docs["bool_none"]["data_type"] == "bool" and docs["bool_none"]["fill_value"] is False
    assert docs["f2_inf_zlib"]["data_type"] == "float16" and docs["f2_inf_zlib"]["fill_value"] == "+Infinity"
    assert docs["u8_guess"]["fill_value"] == 2**64 - 1 and docs["u8_guess"]["chunk_grid"]["chunk_shape"] != [300, 200]
    assert (Path(root) / "data/made/zerod/c").is_file()  # "the chunk key will consist of the string c"
    assert (Path(root) / "data/implicit_new/f8_nan_blosc/c2/1").is_file()
    assert not (Path(root) / "meta/implicit_new.group.json").exists()

    h.set_attributes_sync(h.node_sync("made"), {"spam": "eggs"})
    h.set_attributes_sync(h.node_sync("made/be_i4_gzip"), {"units": "K"})
    h.set_attributes_sync(h.node_sync("implicit_new"), {"now": "explicit"})
    assert read_doc(root, "meta/made.group.json") == {"attributes": {"spam": "eggs"}}
    assert read_doc(root, "meta/implicit_new.group.json") == {"attributes": {"now": "explicit"}}
    assert read_doc(root, "meta/made/be_i4_gzip.array.json")["attributes"] == {"units": "K"}

    _, h2 = open_h(root)
    for path, values in expected.items():
        want = values.astype(values.dtype.newbyteorder("<")) if values.dtype.str[0] == ">" else values
        assert_same(load_npy(read_npy(root, path)), want, path)  # core names are little-endian
        assert_same(core_read(root, path, want.dtype), want, path)  # the spec's decoding
    assert h2.node_sync("made/be_i4_gzip").attributes == {"units": "K"}


def test_may2022_refuses_types_without_a_core_name(tmp_path):
    root = copy_store(SPEC / "core", tmp_path)
    _, h = open_h(root)
    for dtype in ("|S4", "<U2", "<M8[ns]", [("a", "<i4")]):
        with pytest.raises(Unsupported, match="May 2022"):
            h.create_array_sync("bad", NewArray((3,), np.dtype(dtype)))
    assert not (Path(root) / "meta/bad.array.json").exists()


CORE_SHARD_EDITS = {
    # sharded/u2_blosc: 17x18, chunks 4x5, 2x2 per shard, fill 9; shard (0, 1) absent
    "sharded/u2_blosc": [((0, 2), 500), ((1, 1), 600), ((0, 0), None), ((4, 3), 700)],
    # sharded/f4_F_dot: 10x12, chunks 3x4, 2x3 per shard, separator ".", F layout, gzip, NaN
    "sharded/f4_F_dot": [((0, 0), 0.5), ((3, 2), -1.5), ((1, 1), None)],
    "sharded/zerod": [((), 5)],
}


def test_may2022_sharded_in_place(tmp_path):
    index = json.loads((SPEC / "expected" / "index.json").read_text())["core"]
    root = copy_store(SPEC / "core", tmp_path)
    store, h = open_h(root)
    for path, edits in CORE_SHARD_EDITS.items():
        meta = h.node_sync(path)
        rewritten = {meta.chunk_key(idx) for idx, _ in edits}
        model = np.load(SPEC / "expected" / index["arrays"][path]["file"])
        apply_shard_edits(store, meta, model, edits)
        assert_same(load_npy(read_npy(root, path)), model, path)
        # every shard by hand: chunks back to back, index at the end, inner chunks decoded per spec
        doc = read_doc(root, f"meta/{path}.array.json")
        cps = tuple(doc["storage_transformers"][0]["configuration"]["chunks_per_shard"])
        sep = doc["chunk_grid"]["separator"]
        for sidx in grid.all_chunks(grid.grid_shape(meta.shape, meta.chunk_shape), cps or ()) if cps else [()]:
            key = Path(root) / f"data/{path}" / ("c" + sep.join(map(str, sidx)))
            if not key.exists():
                continue
            rel = str(key.relative_to(root))
            for pos, blob in enumerate(parse_shard(key.read_bytes(), math.prod(cps), rel in rewritten)):
                local = np.unravel_index(pos, cps) if cps else ()
                idx = tuple(int(s * n + i) for s, n, i in zip(sidx, cps, local))
                if blob is None or any(i >= g for i, g in zip(idx, grid.grid_shape(meta.shape, meta.chunk_shape))):
                    continue
                reg = grid.chunk_slices(idx, meta.shape, meta.chunk_shape)
                chunk = core_decode(blob, doc, meta.dtype)[tuple(slice(0, r.stop - r.start) for r in reg)]
                assert_same(chunk, model[reg], f"{path} {idx}")
    assert (Path(root) / "data/sharded/u2_blosc/c0/1").is_file()  # a shard that did not exist


def test_may2022_move_erase_rmdir_and_root_array(tmp_path):
    index = json.loads((SPEC / "expected" / "index.json").read_text())
    root = copy_store(SPEC / "core", tmp_path)
    _, h = open_h(root)

    def expect(path):
        return np.load(SPEC / "expected" / index["core"]["arrays"][path]["file"])

    before = keys_below(root, "data/grp") | keys_below(root, "meta/grp")
    h.move_node_sync(h.node_sync("grp"), "moved/grp2")
    after = keys_below(root, "data/moved/grp2") | keys_below(root, "meta/moved/grp2")
    assert after == {k.replace("/grp/", "/moved/grp2/", 1) for k in before}
    assert (Path(root) / "meta/moved/grp2.group.json").is_file() and not (Path(root) / "meta/grp.group.json").exists()
    assert not (Path(root) / "data/grp").exists() and not (Path(root) / "meta/grp").exists()
    _, h = open_h(root)
    assert h.node_sync("moved/grp2").attributes == {"spam": "ham", "eggs": 42}
    assert h.node_sync("moved/grp2/sub").attributes == {"depth": 2}
    assert_same(load_npy(read_npy(root, "moved/grp2/gzip_f8")), expect("grp/gzip_f8"))
    assert_same(load_npy(read_npy(root, "moved/grp2/sub/blosc_i4")), expect("grp/sub/blosc_i4"))
    h.move_node_sync(h.node_sync("sharded/f4_F_dot"), "f4_top")
    assert_same(load_npy(read_npy(root, "f4_top")), expect("sharded/f4_F_dot"))
    assert (Path(root) / "data/f4_top/c0.0").is_file()

    h.move_node_sync(h.node_sync("types"), "types2")  # an implicit group: everything below moves
    assert h.node_sync("types") is None and h.node_sync("types2").metadata_key is None
    assert not (Path(root) / "data/types").exists() and not (Path(root) / "meta/types").exists()
    assert_same(load_npy(read_npy(root, "types2/complex64")), expect("types/complex64"))

    h.erase_node_sync(h.node_sync("sharded/u2_blosc"))
    assert not (Path(root) / "meta/sharded/u2_blosc.array.json").exists()
    assert not (Path(root) / "data/sharded/u2_blosc").exists()
    h.erase_node_sync(h.node_sync("implicit"))  # "Erase an implicit group": everything below
    assert h.node_sync("implicit") is None and not (Path(root) / "data/implicit").exists()
    h.create_group_sync("empty")
    h.erase_node_sync(h.node_sync("empty"))
    assert h.node_sync("empty") is None and not (Path(root) / "meta/empty.group.json").exists()

    # the root array of a store whose root is an array: replaced (erased, then created)
    root2 = copy_store(SPEC / "core-root-array", tmp_path, "rootarray")
    store2, h2 = open_h(root2)
    h2.erase_node_sync(h2.node_sync(""))
    assert keys_below(root2, "data") == set() and not (Path(root2) / "meta/array.json").exists()
    meta = h2.create_array_sync("", NewArray((4, 3), np.dtype("<f4"), (2, 2), "none"))
    values = np.arange(12, dtype="<f4").reshape(4, 3)
    write_all(store2, meta, values)
    assert (Path(root2) / "meta/array.json").is_file() and (Path(root2) / "data/c1/1").is_file()
    assert_same(load_npy(read_npy(root2, "")), values)
    assert_same(core_read(root2, "", np.dtype("<f4")), values)


def bytes_codecs_of(doc: dict) -> list[tuple[str, dict]]:
    """(name, configuration) of the bytes->bytes codecs of a draft document, in encode order."""
    out = []
    for entry in doc.get("codecs", doc.get("chunk_codecs", [])):
        uri = entry.get("type", entry.get("codec")).rstrip("/")
        name = uri.split("/")[-2] if uri.endswith("/1.0") else uri.split("/")[-1]
        config = entry.get("configuration", {k: v for k, v in entry.items() if k not in ("type", "codec")})
        if name not in ("transpose", "endian"):
            out.append((name, config))
    return out


def unwrap(blob: bytes, doc: dict) -> bytes:
    """The bytes before the first bytes->bytes codec (each codec undone; crc32c checked)."""
    for name, config in reversed(bytes_codecs_of(doc)):
        blob = (
            gzip.decompress(blob) if name == "gzip" else bytes(numcodecs.get_codec({"id": name, **config}).decode(blob))
        )
    return blob


def spec_plain_arrays():
    index = json.loads((SPEC / "expected" / "index.json").read_text())
    out = []
    for store in ("core", "core-root-array", "protocol"):
        for path in index[store]["arrays"]:
            doc = read_doc(
                str(SPEC / store),
                ("meta/root/" if store == "protocol" else "meta/") + (f"{path}.array.json" if path else "array.json"),
            )
            if not doc.get("storage_transformers") and "datetime" not in path:
                out.append((store, path))
    return out


@pytest.mark.parametrize("store_name,path", spec_plain_arrays(), ids=[f"{s}:{p}" for s, p in spec_plain_arrays()])
def test_spec_fixtures_in_place_every_codec(tmp_path, store_name, path):
    """A chunk rewritten in place is what the fixture generator encodes for the same chunk
    (F layout, transpose, endian, gzip, zstd, crc32c, blosc; the protocol draft's
    `chunk_codecs` and keys without `c`): byte for byte, or once decompressed."""
    gen = generator()
    index = json.loads((SPEC / "expected" / "index.json").read_text())[store_name]["arrays"][path]
    root = copy_store(SPEC / store_name, tmp_path)
    store, h = open_h(root)
    meta = h.node_sync(path)
    assert isinstance(meta, ArrayMeta), meta
    doc_key = meta.metadata_key
    doc = read_doc(root, doc_key)
    model = np.load(SPEC / "expected" / index["file"])
    edits = list(grid.all_chunks(meta.shape, meta.chunk_shape))[::2]
    for k, idx in enumerate(edits):
        chunk = sample(meta.dtype, meta.chunk_shape, k)
        write_chunk_sync(meta, store, idx, meta.codec.encode(chunk, meta.fill_value))
        reg = grid.chunk_slices(idx, meta.shape, meta.chunk_shape)
        model[reg] = chunk[tuple(slice(0, r.stop - r.start) for r in reg)]
        got = (Path(root) / meta.chunk_key(idx)).read_bytes()
        encode = gen.encode_protocol_chunk if "zarr_format" in doc else gen.encode_core_chunk
        want = encode(
            chunk.astype(
                meta.dtype.newbyteorder("<") if "zarr_format" not in doc and meta.dtype.str[0] == ">" else meta.dtype
            ),
            doc,
        )
        if any(name in ("gzip", "blosc") for name, _ in bytes_codecs_of(doc)):
            # gzip's header (time stamp, OS byte) and blosc's (element size) vary between
            # writers: every codec undone in turn (checksums verified), the bytes must agree
            assert unwrap(got, doc) == unwrap(want, doc), (path, idx)
        else:
            assert got == want, (path, idx)
    assert_same(load_npy(read_npy(root, path)), model, path)
    h.set_attributes_sync(meta, {"rewritten": True})
    after = read_doc(root, doc_key)
    assert after == {**doc, "attributes": {"rewritten": True}}  # only the attributes change
