"""Zarr v3 drafts through the core (no FUSE): zarr 2.18's stores, the May 2022 and protocol-draft
fixtures written from the spec text, the sharding transformer, refusals and detection.

Oracles: the .npy files saved beside the fixtures (by zarr 2.18 for v3draft-zarr218/, by
numpy in tests/fixtures/make_fixtures_v3draft_spec.py for v3draft-2022-05/), never zarrfs' output.
"""

from __future__ import annotations

import io
import json
import logging

import numpy as np
import pytest

from zarrfs import grid
from zarrfs.errors import MetadataError, UnknownCodec, Unsupported, UserError
from zarrfs.formats import open_hierarchy_sync
from zarrfs.formats.v3draft import (
    Layout,
    V3DraftHierarchy,
    draft_dtype,
    draft_fill_value,
    parse_array,
)
from zarrfs.model import ArrayMeta, BrokenNode, GroupMeta
from zarrfs.storage.chunksource import ShardedChunks, read_chunk_sync
from zarrfs.storage.keys import ChunkKeys
from zarrfs.storage.store import Store

from support import FIXTURES
from support.core import np_save_bytes, open_node, read_npy
from support.v3draft import shard_bytes

Z218 = FIXTURES / "v3draft-zarr218"
SPEC = FIXTURES / "v3draft-2022-05"
Z218_INDEX = json.loads((Z218 / "expected" / "index.json").read_text())
SPEC_INDEX = json.loads((SPEC / "expected" / "index.json").read_text())
SPEC_STORES = ["core", "core-root-array", "protocol", "refused-arrays"]
CORE = Layout("core", "meta", "data", ".json", "c")
PROTOCOL = Layout("protocol", "meta/root", "data/root", ".json", "c0")


def spec_arrays():
    return [(s, p) for s in SPEC_STORES for p in SPEC_INDEX[s]["arrays"]]


def written_regions(info: dict) -> list[tuple[slice, ...]]:
    """Regions of the chunks zarr 2.18 wrote (keys `c1/2`), clipped at the array's edge."""
    shape, chunks = tuple(info["shape"]), tuple(info["chunks"])
    out = []
    for key in info["chunks_written"]:
        idx = tuple(int(i) for i in key[1:].split("/")) if shape else ()
        out.append(grid.chunk_slices(idx, shape, chunks))
    return out


# --------------------------------------------------------------------------- zarr 2.18


@pytest.mark.parametrize("path", sorted(Z218_INDEX["arrays"]))
def test_zarr218_arrays(path):
    info = Z218_INDEX["arrays"][path]
    expected_bytes = (Z218 / "expected" / info["file"]).read_bytes()
    got = read_npy(str(Z218 / "store"), path)
    if info["defined"] == "all":
        assert got == expected_bytes
    else:  # fill_value null: only the written chunks are defined
        g, e = np.load(io.BytesIO(got)), np.load(io.BytesIO(expected_bytes))
        assert g.dtype == e.dtype and g.shape == e.shape
        for region in written_regions(info):
            assert g[region].tobytes() == e[region].tobytes()
    _, _, node = open_node(str(Z218 / "store"), path)
    assert isinstance(node, ArrayMeta) and node.format == "v3-draft"
    assert node.attributes == info["attrs"]  # filters included, as zarr 2.18 reports them


def test_zarr218_groups_and_listing():
    store = Store(str(Z218 / "store"))
    h = open_hierarchy_sync(store)
    assert isinstance(h, V3DraftHierarchy) and h.layout.family == "protocol"
    for path, attrs in Z218_INDEX["groups"].items():
        node = h.node_sync(path)
        assert isinstance(node, GroupMeta) and node.attributes == attrs, path
    for path in Z218_INDEX["implicit_groups"]:
        node = h.node_sync(path)
        assert isinstance(node, GroupMeta) and node.attributes == {} and node.metadata_key is None
    assert h.node_sync("no/such/node") is None
    names = [n.path for n in h.children_sync("")]
    assert names == ["dtypes", "filters", "group_a", "implicit", "order", "sharded", "zerod"]
    assert [n.path for n in h.children_sync("implicit")] == ["implicit/deeper"]
    assert [n.path for n in h.children_sync("group_a")] == ["group_a/float64_nan_zlib", "group_a/sub"]


def test_zarr218_keys_and_shards():
    store = Store(str(Z218 / "store"))
    h = open_hierarchy_sync(store)
    zerod = h.node_sync("zerod/float64_written")
    assert zerod.chunk_key(()) == "data/root/zerod/float64_written/c0"
    sharded = h.node_sync("sharded/uint16_blosc")
    assert isinstance(sharded.source, ShardedChunks) and sharded.source.chunks_per_shard == (2, 2)
    assert sharded.chunk_shape == (8, 10)  # the grid chunk stays the inner chunk
    assert sharded.chunk_key((3, 2)) == "data/root/sharded/uint16_blosc/c1/1"
    assert read_chunk_sync(sharded, store, (0, 2)) is None  # shard c0/1 was never written
    assert read_chunk_sync(sharded, store, (0, 1)) is None  # absent inner chunk of shard c0/0
    assert read_chunk_sync(sharded, store, (2, 2)) is not None


# --------------------------------------------------------------------------- spec fixtures


@pytest.mark.parametrize("store,path", spec_arrays(), ids=[f"{s}:{p}" for s, p in spec_arrays()])
def test_spec_arrays(store, path):
    info = SPEC_INDEX[store]["arrays"][path]
    expected_bytes = (SPEC / "expected" / info["file"]).read_bytes()
    assert read_npy(str(SPEC / store), path) == expected_bytes
    _, _, node = open_node(str(SPEC / store), path)
    assert node.attributes == info["attrs"]
    assert node.dtype.str == info["dtype"] and list(node.shape) == info["shape"]


def test_spec_stored_keys_are_the_chunk_keys():
    """Every key the fixture wrote is what the array's chunk keys (or shard keys) name."""
    for store in ("core", "core-root-array", "protocol"):
        h = open_hierarchy_sync(Store(str(SPEC / store)))
        for path, info in SPEC_INDEX[store]["arrays"].items():
            meta = h.node_sync(path)
            named = {meta.chunk_key(idx) for idx in grid.all_chunks(meta.shape, meta.chunk_shape)}
            assert set(info["keys"]) <= named, (store, path)
            assert set(h.chunk_sizes_sync(meta)) == set(info["keys"]), (store, path)


@pytest.mark.parametrize("store", ["core", "protocol"])
def test_spec_groups(store):
    h = open_hierarchy_sync(Store(str(SPEC / store)))
    for path, attrs in SPEC_INDEX[store]["groups"].items():
        node = h.node_sync(path)
        assert isinstance(node, GroupMeta) and node.attributes == attrs, path
    for path in SPEC_INDEX[store]["implicit_groups"]:
        node = h.node_sync(path)
        assert isinstance(node, GroupMeta) and node.metadata_key is None, path


def test_core_listing_and_keys():
    h = open_hierarchy_sync(Store(str(SPEC / "core")))
    assert h.layout == Layout("core", "meta", "data", ".json", "c")
    assert [n.path for n in h.children_sync("")] == ["codecs", "grp", "implicit", "sharded", "types", "zerod"]
    assert [(n.path, n.kind) for n in h.children_sync("grp")] == [("grp/gzip_f8", "array"), ("grp/sub", "group")]
    assert h.node_sync("grp").metadata_key == "meta/grp.group.json"
    assert h.node_sync("").metadata_key == "meta/group.json"
    assert h.node_sync("zerod/written").chunk_key(()) == "data/zerod/written/c"
    assert h.node_sync("codecs/zstd_u2_F_dot").chunk_key((1, 2)) == "data/codecs/zstd_u2_F_dot/c1.2"
    assert h.node_sync("grp/gzip_f8").chunk_key((1, 2)) == "data/grp/gzip_f8/c1/2"
    assert h.node_sync("codecs/zstd_u2_F_dot").codec.order == "F"
    assert h.node_sync("sharded/zerod").chunk_key(()) == "data/sharded/zerod/c"
    root = open_hierarchy_sync(Store(str(SPEC / "core-root-array"))).node_sync("")
    assert isinstance(root, ArrayMeta) and root.chunk_key((2, 1)) == "data/c2/1"


def test_protocol_documents():
    h = open_hierarchy_sync(Store(str(SPEC / "protocol")))
    assert h.layout.family == "protocol"
    example = h.node_sync("example")
    assert example.chunk_key((1, 2)) == "data/root/example/1.2"  # no `c`, `.` by default
    assert example.codec.describe()[-1]["name"] == "gzip"
    assert h.node_sync("be_i4_F").dtype == np.dtype(">i4")
    assert h.node_sync("").attributes == {"spam": "ham", "eggs": 42}


def test_ignored_extension_and_fallback_are_logged(caplog):
    caplog.set_level(logging.INFO, logger="zarrfs")
    h = open_hierarchy_sync(Store(str(SPEC / "core")))
    assert any(
        "ignoring extension http://example.org/zarr/extension/foo" in r.message and r.levelno == logging.INFO
        for r in caplog.records
    )
    for _ in range(2):
        node = h.node_sync("types/ext_fallback_list")
    assert node.dtype == np.dtype("<i2")
    fallback = [r for r in caplog.records if "fallback 'int16'" in r.message]
    assert len(fallback) == 1 and fallback[0].levelno == logging.WARNING  # once per hierarchy


# --------------------------------------------------------------------------- refusals


def test_required_extension_refuses_the_mount():
    with pytest.raises(UserError, match="needs-understanding") as e:
        open_hierarchy_sync(Store(str(SPEC / "refuse-extension")))
    assert "must_understand" in str(e.value)
    with pytest.raises(UserError, match="needs-understanding"):
        open_hierarchy_sync(Store(str(SPEC / "refuse-extension")), "v3-draft")


@pytest.mark.parametrize("path", sorted(SPEC_INDEX["refused-arrays"]["refused"]))
def test_refused_arrays(path):
    store = str(SPEC / "refused-arrays")
    _, h, node = open_node(store, path)
    assert isinstance(node, BrokenNode) and node.kind == "array"
    assert node.key == f"meta/{path}.array.json"
    assert isinstance(node.error, (Unsupported, MetadataError, UnknownCodec))
    assert SPEC_INDEX["refused-arrays"]["refused"][path] in str(node.error)
    listed = {n.path: n for n in h.children_sync("")}
    assert isinstance(listed[path], BrokenNode) and isinstance(listed["ok"], ArrayMeta)


def test_entry_point_refusals(tmp_path):
    def entry(doc):
        root = tmp_path / f"s{len(list(tmp_path.iterdir()))}"
        root.mkdir()
        (root / "zarr.json").write_text(json.dumps(doc))
        return Store(str(root))

    core = "https://purl.org/zarr/spec/core/3.0"
    with pytest.raises(UserError, match="example.org/enc"):
        open_hierarchy_sync(
            entry(
                {
                    "zarr_format": core,
                    "metadata_encoding": {
                        "extension": "https://example.org/enc",
                        "type": "cbor",
                        "metadata_key_suffix": ".cbor",
                    },
                }
            )
        )
    with pytest.raises(UserError, match="core/4.0"):
        open_hierarchy_sync(entry({"zarr_format": "https://purl.org/zarr/spec/core/4.0"}))
    with pytest.raises(UserError, match="example.org/x"):  # must_understand missing: taken as required
        open_hierarchy_sync(entry({"zarr_format": core, "extensions": [{"extension": "https://example.org/x"}]}))
    h = open_hierarchy_sync(
        entry(
            {
                "zarr_format": core,
                "metadata_encoding": {"type": "json", "metadata_key_suffix": ".jsn"},
                "extensions": [],
            }
        )
    )
    assert h.layout.suffix == ".jsn" and h.layout.meta_key("a/b", "array") == "meta/a/b.array.jsn"


def test_group_with_unknown_field_is_refused(tmp_path):
    (tmp_path / "meta").mkdir()
    (tmp_path / "zarr.json").write_text(json.dumps({"zarr_format": "https://purl.org/zarr/spec/core/3.0"}))
    (tmp_path / "meta" / "g.group.json").write_text(json.dumps({"attributes": {}, "colour": "red"}))
    node = open_hierarchy_sync(Store(str(tmp_path))).node_sync("g")
    assert isinstance(node, BrokenNode) and node.kind == "group" and "colour" in str(node.error)


# --------------------------------------------------------------------------- detection


@pytest.mark.parametrize("store", [str(Z218 / "store")] + [str(SPEC / s) for s in SPEC_STORES])
def test_detected_without_flag(store):
    assert isinstance(open_hierarchy_sync(Store(store)), V3DraftHierarchy)
    assert isinstance(open_hierarchy_sync(Store(store), "v3-draft"), V3DraftHierarchy)


def test_other_formats_are_not_drafts(tmp_path):
    import zarr

    for fmt in (2, 3):
        path = str(tmp_path / f"v{fmt}")
        zarr.create_array(path, name="a", shape=(3,), chunks=(2,), dtype="i4", zarr_format=fmt)
        assert not V3DraftHierarchy.detect_sync(Store(path))
        assert open_hierarchy_sync(Store(path)).name == f"v{fmt}"
        with pytest.raises(UserError, match="not a v3-draft hierarchy"):
            open_hierarchy_sync(Store(path), "v3-draft")


# --------------------------------------------------------------------------- units


def doc_2022(**extra):
    doc = {
        "shape": [10, 6],
        "data_type": "int16",
        "chunk_grid": {"type": "regular", "chunk_shape": [3, 2], "separator": "/"},
        "chunk_memory_layout": "C",
        "fill_value": 0,
        "extensions": [],
        "attributes": {},
    }
    doc.update(extra)
    return doc


@pytest.mark.parametrize(
    "uri",
    [
        "https://purl.org/zarr/spec/storage_transformers/sharding/1.0",
        "https://purl.org/zarr/spec/storage-transformers/sharding/1.0",
        "https://purl.org/zarr/spec/storage_transformer/sharding/1.0",
        "https://zarr-specs.readthedocs.io/en/core-protocol-v3.0-dev/extensions/storage-transformers/sharding/v1.0.html",
    ],
)
def test_sharding_uri_spellings(uri):
    st = [{"extension": uri, "type": "indexed", "configuration": {"chunks_per_shard": [2, 3]}}]
    meta = parse_array("a", doc_2022(storage_transformers=st), "meta/a.array.json", CORE)
    assert meta.source == ShardedChunks(ChunkKeys("data/a", "/", "c", "c"), (2, 3))
    assert meta.chunk_key((3, 5)) == "data/a/c1/1"


def test_sharding_other_type_and_stack_refused():
    st = {
        "extension": "https://purl.org/zarr/spec/storage_transformers/sharding/1.0",
        "configuration": {"chunks_per_shard": [2, 3]},
    }
    with pytest.raises(Unsupported, match="hashed"):
        parse_array("a", doc_2022(storage_transformers=[{**st, "type": "hashed"}]), "k", CORE)
    with pytest.raises(Unsupported, match="stack"):
        parse_array("a", doc_2022(storage_transformers=[{**st, "type": "indexed"}] * 2), "k", CORE)


def test_sharded_read_through_the_engine(tmp_path):
    """A real local store: the shard's index is read with a suffix read, missing chunks are fill."""
    (tmp_path / "meta").mkdir()
    (tmp_path / "zarr.json").write_text(json.dumps({"zarr_format": "https://purl.org/zarr/spec/core/3.0"}))
    st = [
        {
            "extension": "https://purl.org/zarr/spec/storage_transformers/sharding/1.0",
            "type": "indexed",
            "configuration": {"chunks_per_shard": [2]},
        }
    ]
    doc = {
        "shape": [7],
        "data_type": "uint8",
        "chunk_grid": {"type": "regular", "chunk_shape": [2]},
        "chunk_memory_layout": "C",
        "fill_value": 9,
        "storage_transformers": st,
    }
    (tmp_path / "meta" / "a.array.json").write_text(json.dumps(doc))
    (tmp_path / "data" / "a").mkdir(parents=True)
    (tmp_path / "data" / "a" / "c1").write_bytes(shard_bytes({1: bytes([5, 6])}, 2))  # inner chunk 3
    expected = np.array([9, 9, 9, 9, 9, 9, 5], dtype="u1")
    assert read_npy(str(tmp_path), "a") == np_save_bytes(expected)


@pytest.mark.parametrize(
    "value,dtype,expected",
    [
        ("0xfffe", "<i2", -2),
        ("0b1111111111111110", "<i2", -2),
        ("0xffff", "<u2", 65535),
        ("0x0000002a", "<i4", 42),
        ("0x01", "|b1", True),
        ("+Infinity", "<f4", np.inf),
        ("-Infinity", "<f8", -np.inf),
        ("0x3ff0000000000000", "<f8", 1.0),
        (None, "<i8", 0),
        (7, ">i4", 7),
    ],
)
def test_fill_values(value, dtype, expected):
    out = draft_fill_value(value, np.dtype(dtype), "k")
    assert out.dtype == np.dtype(dtype) and out.shape == () and out[()] == expected


def test_fill_value_nan_and_raw():
    assert np.isnan(draft_fill_value("NaN", np.dtype("<f4"), "k"))
    raw = draft_fill_value("0x0a0b", np.dtype("V2"), "k")
    assert raw.tobytes() == b"\x0a\x0b"
    with pytest.raises(MetadataError, match="does not fit"):
        draft_fill_value("0x10000", np.dtype("<u2"), "k")


@pytest.mark.parametrize(
    "spec,expected",
    [
        ("float64", "<f8"),
        ("int8", "|i1"),
        ("bool", "|b1"),
        ("r24", "|V3"),
        ("<f8", "<f8"),
        (">i4", ">i4"),
        ("u1", "|u1"),
        ("i1", "|i1"),
        ("<c16", "<c16"),
        ("|b1", "|b1"),
        ({"extension": "https://example.org/dt", "type": "q", "fallback": ["nope", "r16", "int16"]}, "|V2"),
        ({"extension": "https://example.org/dt", "type": "q", "fallback": "<i8"}, "<i8"),
        ({"extension": "TODO: bytestring array protocol URL", "type": "|S5", "fallback": None}, "|S5"),
    ],
)
def test_data_types(spec, expected):
    assert draft_dtype(spec, "k", lambda message: None) == np.dtype(expected)


@pytest.mark.parametrize(
    "spec",
    [
        "<M8[ns]",
        "string",
        {"extension": "https://example.org/dt", "type": "q"},
        {"extension": "https://example.org/dt", "type": "q", "fallback": ["nope"]},
    ],
)
def test_unknown_data_types(spec):
    with pytest.raises(Unsupported):
        draft_dtype(spec, "k", lambda message: None)


def test_core_codecs_chain_roles():
    codecs = [
        {"type": "https://purl.org/zarr/spec/codecs/transpose/1.0", "configuration": {"order": "F"}},
        {"type": "https://purl.org/zarr/spec/codecs/endian/1.0", "configuration": {"endian": "big"}},
        {"type": "https://purl.org/zarr/spec/codecs/gzip/1.0", "configuration": {"level": 1}},
    ]
    meta = parse_array("a", doc_2022(codecs=codecs, chunk_memory_layout="F"), "k", CORE)
    assert meta.codec.array_array == ()  # F layout then transpose F: back to C
    assert meta.codec.describe()[0] == {"name": "bytes", "configuration": {"endian": "big"}}
    with pytest.raises(MetadataError, match="transpose after"):
        parse_array("a", doc_2022(codecs=codecs[2:] + codecs[:1]), "k", CORE)
    with pytest.raises(MetadataError, match="both"):
        parse_array(
            "a", doc_2022(codecs=[], compressor={"codec": "https://purl.org/zarr/spec/codec/gzip/1.0"}), "k", PROTOCOL
        )


def test_unknown_codec_reads_fail_with_eio():
    """The contract: an unknown codec makes the array's reads fail with EIO (not EOPNOTSUPP)."""
    import errno

    _, _, node = open_node(str(SPEC / "refused-arrays"), "unknown_codec")
    assert isinstance(node.error, UnknownCodec) and node.error.errno == errno.EIO


def test_core_draft_refuses_null_fill_for_core_types():
    """May 2022 "fill_value": "The literal null is not permitted"; the protocol draft (and zarr
    2.18) allow it, and an extension data type interprets its own fill value."""
    with pytest.raises(MetadataError, match="fill_value null is not permitted"):
        parse_array("a", doc_2022(fill_value=None), "meta/a.array.json", CORE)
    protocol = parse_array(
        "a",
        {**doc_2022(fill_value=None), "chunk_grid": {"type": "regular", "chunk_shape": [3, 2], "separator": "/"}},
        "meta/root/a.array.json",
        PROTOCOL,
    )
    assert protocol.fill_value[()] == 0
    ext = {
        "extension": "https://purl.org/zarr/spec/extensions/data-types/datetime/1.0",
        "type": "<M8[ns]",
        "fallback": "<i8",
    }
    assert parse_array("a", doc_2022(fill_value=None, data_type=ext), "k", CORE).fill_value[()] == 0


@pytest.mark.parametrize("value", [1.5, 40000])
def test_core_draft_fill_values_the_type_cannot_hold(value):
    """int16: 1.5 has a fraction, 40000 is out of range. The array stays (listed, its stored
    chunks read); chunks not stored and writes fail, naming the document."""
    meta = parse_array("a", doc_2022(fill_value=value, data_type="int16"), "meta/a.array.json", CORE)
    assert "meta/a.array.json" in meta.fill_error and str(value) in meta.fill_error
    assert meta.read_only == meta.fill_error and not meta.erase_fill_chunks


def test_core_draft_bool_fill_value_text_reads_as_zarr_python_reads_it():
    """ "false" is not a boolean; zarr-python (2.18, which wrote these drafts, and 3) reads any
    non-empty string as True."""
    meta = parse_array("a", doc_2022(fill_value="false", data_type="bool"), "meta/a.array.json", CORE)
    assert meta.fill_value[()] == True and meta.fill_error is None  # noqa: E712
