"""v2 and v3 stores written by zarr-python 3 read back exactly (np.save bytes of zarr's values)."""

from __future__ import annotations

import json
import warnings

import numcodecs
import numpy as np
import pytest
import zarr
import zarr.codecs as zc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zarrfs.errors import UnknownCodec, Unsupported
from zarrfs.model import ArrayMeta, BrokenNode, GroupMeta

from support import ZARR218_PYTHON
from support.core import np_save_bytes, open_node, read_npy

warnings.filterwarnings("ignore", module="zarr")
pytestmark = pytest.mark.filterwarnings("ignore")

DTYPES_BOTH = [
    "bool",
    "int8",
    "uint8",
    "int16",
    "uint16",
    "int32",
    "uint32",
    "int64",
    "uint64",
    "float16",
    "float32",
    "float64",
    "complex64",
    "complex128",
    "S5",
    "<U3",
    "datetime64[ns]",
    "timedelta64[s]",
    [("a", "<i4"), ("b", "<f8")],
]


def sample(dtype: np.dtype, shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    n = int(np.prod(shape, dtype=int))
    if dtype.kind == "b":
        return rng.integers(0, 2, n).astype(bool).reshape(shape)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, n, dtype=dtype, endpoint=True).reshape(shape)
    if dtype.kind == "f":
        return (rng.normal(0, 1000, n)).astype(dtype).reshape(shape)
    if dtype.kind == "c":
        return (rng.normal(0, 1, n) + 1j * rng.normal(0, 1, n)).astype(dtype).reshape(shape)
    if dtype.kind == "S":
        return np.array([b"x%d" % i for i in range(n)], dtype=dtype).reshape(shape)
    if dtype.kind == "U":
        return np.array([f"é{i % 100}" for i in range(n)], dtype=dtype).reshape(shape)
    if dtype.kind in "mM":
        return rng.integers(0, 10**12, n).astype("<i8").view(dtype).reshape(shape)
    return rng.integers(0, 256, n * dtype.itemsize, dtype=np.uint8).view(dtype).reshape(shape)


def oracle(path: str) -> np.ndarray:
    """What zarr-python 3 reads, as an array of the array's dtype (0-d reads come back as
    numpy scalars, which are always native-endian)."""
    z = zarr.open_array(path, mode="r")
    return np.asarray(z[...], dtype=z.dtype)


def check(store_path: str, name: str) -> None:
    expected = oracle(f"{store_path}/{name}")
    # The .npy file holds elements in C order whatever the array's own order (README: The tree).
    assert read_npy(store_path, name) == np_save_bytes(np.asarray(expected, order="C"))


@pytest.mark.parametrize("fmt", [2, 3])
@pytest.mark.parametrize("dtype", DTYPES_BOTH, ids=str)
def test_dtypes(tmp_path, fmt, dtype):
    dtype = np.dtype([tuple(f) for f in dtype] if isinstance(dtype, list) else dtype)
    shape, chunks = (7, 5), (3, 2)
    arr = zarr.create_array(str(tmp_path / "s"), name="a", shape=shape, chunks=chunks, dtype=dtype, zarr_format=fmt)
    data = sample(dtype, shape)
    arr[:4] = data[:4]  # rows 6.. stay unwritten: fill value, edge chunks clipped
    check(str(tmp_path / "s"), "a")


def v2_compressors():
    return [
        None,
        numcodecs.Blosc("lz4", 5, numcodecs.Blosc.SHUFFLE),
        numcodecs.Blosc("zstd", 3, 2),
        numcodecs.Zstd(3),
        numcodecs.GZip(1),
        numcodecs.Zlib(4),
        numcodecs.BZ2(2),
        numcodecs.LZMA(),
        numcodecs.LZ4(),
    ]


@pytest.mark.parametrize("compressor", v2_compressors(), ids=repr)
@pytest.mark.parametrize("order", ["C", "F"])
@pytest.mark.parametrize("sep", [".", "/"])
def test_v2_codecs_order_separator(tmp_path, compressor, order, sep):
    path = str(tmp_path / "s")
    arr = zarr.create_array(
        path,
        name="g/a",
        shape=(9, 8, 3),
        chunks=(4, 3, 2),
        dtype=">f8",
        compressors=compressor,
        order=order,
        zarr_format=2,
        chunk_key_encoding={"name": "v2", "separator": sep},
        fill_value=np.nan,
    )
    arr[1:8, :5] = sample(np.dtype(">f8"), (7, 5, 3))
    check(path, "g/a")


@pytest.mark.parametrize(
    "filters",
    [
        [numcodecs.Delta("<i4")],
        [numcodecs.Shuffle(4)],
        [numcodecs.FixedScaleOffset(0, 10, "<i4", "<i2")],
        [numcodecs.AsType("<i2", "<i4")],
        [numcodecs.Delta("<i4"), numcodecs.Shuffle(4)],
        [numcodecs.CRC32()],
        [numcodecs.Adler32()],
        [numcodecs.Fletcher32()],
        [numcodecs.JenkinsLookup3()],
    ],
    ids=repr,
)
def test_v2_filters(tmp_path, filters):
    path = str(tmp_path / "s")
    arr = zarr.create_array(
        path,
        name="a",
        shape=(50,),
        chunks=(16,),
        dtype="<i4",
        filters=filters,
        compressors=numcodecs.Zlib(1),
        zarr_format=2,
    )
    arr[:] = np.arange(50, dtype="<i4") % 300
    check(path, "a")


def test_v2_packbits_bool(tmp_path):
    path = str(tmp_path / "s")
    arr = zarr.create_array(
        path,
        name="a",
        shape=(37,),
        chunks=(10,),
        dtype=bool,
        filters=[numcodecs.PackBits()],
        compressors=None,
        zarr_format=2,
    )
    arr[:] = sample(np.dtype(bool), (37,))
    check(path, "a")


V3_COMPRESSORS = [
    None,
    zc.BloscCodec(cname="lz4", clevel=5, shuffle="shuffle"),
    zc.BloscCodec(cname="zstd", clevel=1, shuffle="bitshuffle"),
    zc.ZstdCodec(level=3, checksum=True),
    zc.GzipCodec(level=1),
    zc.Crc32cCodec(),
]


@pytest.mark.parametrize("compressor", V3_COMPRESSORS, ids=repr)
@pytest.mark.parametrize("endian", ["little", "big"])
@pytest.mark.parametrize("sep", ["/", "."])
def test_v3_codecs_endian_separator(tmp_path, compressor, endian, sep):
    path = str(tmp_path / "s")
    arr = zarr.create_array(
        path,
        name="g/a",
        shape=(9, 8),
        chunks=(4, 3),
        dtype="<f4",
        serializer=zc.BytesCodec(endian=endian),
        compressors=compressor,
        chunk_key_encoding={"name": "default", "separator": sep},
        fill_value=-1.5,
    )
    arr[1:8, :5] = sample(np.dtype("<f4"), (7, 5))
    check(path, "g/a")


@pytest.mark.parametrize("index_location", ["start", "end"])
@pytest.mark.parametrize("transpose", [False, True])
def test_v3_sharding_transpose_missing_inner(tmp_path, index_location, transpose):
    path = str(tmp_path / "s")
    inner = [zc.TransposeCodec(order=(1, 0))] if transpose else []
    inner += [zc.BytesCodec(), zc.ZstdCodec(level=1)]
    arr = zarr.create_array(
        path,
        name="a",
        shape=(13, 11),
        chunks=(4, 6),
        dtype="<i8",
        fill_value=42,
        serializer=zc.ShardingCodec(chunk_shape=(2, 3), codecs=inner, index_location=index_location),
    )
    data = sample(np.dtype("<i8"), (13, 11))
    arr[0:3, 0:5] = data[0:3, 0:5]  # inner chunks of the first shards only partly written
    arr[8:13, 6:11] = data[8:13, 6:11]
    check(path, "a")


def test_v3_transpose_outside(tmp_path):
    path = str(tmp_path / "s")
    arr = zarr.create_array(
        path,
        name="a",
        shape=(5, 7, 3),
        chunks=(2, 3, 2),
        dtype="<u2",
        filters=[zc.TransposeCodec(order=(2, 0, 1))],
        compressors=zc.GzipCodec(level=1),
    )
    arr[:] = sample(np.dtype("<u2"), (5, 7, 3))
    check(path, "a")


def test_v3_numcodecs_names(tmp_path):
    from zarr.codecs import numcodecs as znc

    path = str(tmp_path / "s")
    arr = zarr.create_array(
        path,
        name="a",
        shape=(30,),
        chunks=(7,),
        dtype="<i4",
        filters=[znc.Delta(dtype="<i4")],
        compressors=[znc.Zlib(level=2)],
    )
    arr[:] = np.arange(30, dtype="<i4") * 3
    check(path, "a")


def test_zero_d_and_fill_values(tmp_path):
    path = str(tmp_path / "s")
    for fmt in (2, 3):
        root = zarr.open_group(f"{path}{fmt}", mode="w", zarr_format=fmt)
        root.create_array("z", shape=(), dtype="<f8", fill_value=3.5)
        root.create_array("zw", shape=(), dtype="<i2")[()] = 9
        root.create_array("nan", shape=(5,), chunks=(2,), dtype="<f4", fill_value=np.nan)
        root.create_array("inf", shape=(5,), chunks=(2,), dtype="<f8", fill_value=-np.inf)
        root.create_array("c", shape=(3,), chunks=(2,), dtype="<c16", fill_value=1 - 2j)
        root.create_array("s", shape=(3,), chunks=(2,), dtype="S4", fill_value=b"ab")
        for name in ("z", "zw", "nan", "inf", "c", "s"):
            check(f"{path}{fmt}", name)


def test_v3_hex_fill_value(tmp_path):
    path = tmp_path / "s"
    zarr.create_array(str(path), name="a", shape=(4,), chunks=(2,), dtype="<f4", fill_value=0.0)
    doc = json.loads((path / "a" / "zarr.json").read_text())
    doc["fill_value"] = "0x7fc00001"  # a NaN with a payload: only the bits say which
    (path / "a" / "zarr.json").write_text(json.dumps(doc))
    got = np.load(__import__("io").BytesIO(read_npy(str(path), "a")))
    assert got.view("<u4").tolist() == [0x7FC00001] * 4


@pytest.mark.parametrize("partial", [True, False], ids=["inner-reads", "whole-shards"])
def test_unreadable_fill_value_fails_only_the_chunks_not_stored(tmp_path, partial):
    """A v3 fill value no reader can read: a whole shard stored reads, and so do stored inner
    chunks read alone; an inner chunk that is not stored fails (MetadataError naming the document)."""
    from zarrfs.errors import MetadataError

    path = tmp_path / "s"
    inner = [zc.BytesCodec()] if partial else [zc.BytesCodec(), zc.ZstdCodec(level=1)]
    arr = zarr.create_array(
        str(path),
        name="a",
        shape=(8,),
        chunks=(4,),
        dtype="<i2",
        fill_value=0,
        serializer=zc.ShardingCodec(chunk_shape=(2,), codecs=inner),
        compressors=None if partial else zc.ZstdCodec(level=1),
    )
    arr[0:4] = np.arange(4, dtype="<i2") + 10  # shard 0 whole
    arr[4:6] = [7, 8]  # shard 1: its inner chunk 1 is not stored
    doc = json.loads((path / "a" / "zarr.json").read_text())
    (path / "a" / "zarr.json").write_text(json.dumps({**doc, "fill_value": "forty-two"}))
    header = len(np_save_bytes(np.zeros(8, "<i2"))) - 16
    got = read_npy(str(path), "a", ranges=[(header, 8)])[0]
    assert np.frombuffer(got, "<i2").tolist() == [10, 11, 12, 13]
    if partial:  # an inner chunk is read alone; a shard decoded whole needs every inner chunk
        got = read_npy(str(path), "a", ranges=[(header + 8, 4)])[0]
        assert np.frombuffer(got, "<i2").tolist() == [7, 8]
    with pytest.raises(MetadataError, match="a/zarr.json.*forty-two"):
        read_npy(str(path), "a")


def test_hierarchy_nodes(tmp_path):
    for fmt in (2, 3):
        path = str(tmp_path / f"h{fmt}")
        root = zarr.open_group(path, mode="w", zarr_format=fmt, attributes={"top": 1})
        root.create_group("g", attributes={"x": [1, 2]})
        root.create_array("g/a", shape=(2,), dtype="<i4", attributes={"units": "m"})
        root.create_array("deep/er/b", shape=(2,), dtype="<i4")
        import shutil

        shutil.rmtree(f"{path}/deep/er") if False else None
        for doc in ("zarr.json", ".zgroup"):
            for p in (tmp_path / f"h{fmt}" / "deep" / doc, tmp_path / f"h{fmt}" / "deep" / "er" / doc):
                p.unlink(missing_ok=True)
        store, h, node = open_node(path, "")
        assert isinstance(node, GroupMeta) and node.attributes == {"top": 1}
        assert [n.path for n in h.children_sync("")] == ["deep", "g"]
        assert [type(n) for n in h.children_sync("deep")] == [GroupMeta]  # implicit
        a = h.node_sync("g/a")
        assert isinstance(a, ArrayMeta) and a.attributes == {"units": "m"}
        assert h.node_sync("nope") is None


def test_consolidated_used_without_listing(tmp_path):
    for fmt in (2, 3):
        path = str(tmp_path / f"h{fmt}")
        root = zarr.open_group(path, mode="w", zarr_format=fmt)
        root.create_array("g/a", shape=(3,), dtype="<i4")[:] = [1, 2, 3]
        zarr.consolidate_metadata(path)
        store, h, _ = open_node(path, "")
        assert h.consolidated is not None
        store.list_dir_sync = None  # any listing would now fail
        assert [n.path for n in h.children_sync("g")] == ["g/a"]
        check(path, "g/a")


def test_unsupported_and_broken_nodes(tmp_path):
    path = tmp_path / "s"
    root = zarr.open_group(str(path), mode="w", zarr_format=3)
    root.create_array("text", shape=(3,), dtype="<i4")
    doc = json.loads((path / "text" / "zarr.json").read_text())
    (path / "text" / "zarr.json").write_text(json.dumps({**doc, "data_type": "no_such_type"}))
    root.create_array("bad", shape=(3,), dtype="<i4")
    (path / "bad" / "zarr.json").write_text("{not json")
    root.create_array("codec", shape=(3,), dtype="<i4")
    doc = json.loads((path / "codec" / "zarr.json").read_text())
    doc["codecs"].append({"name": "no-such-codec"})
    (path / "codec" / "zarr.json").write_text(json.dumps(doc))
    _, h, _ = open_node(str(path), "")
    nodes = {n.path: n for n in h.children_sync("")}
    assert isinstance(nodes["text"], BrokenNode) and isinstance(nodes["text"].error, Unsupported)
    assert nodes["text"].kind == "array"
    assert isinstance(nodes["bad"], BrokenNode) and nodes["bad"].key == "bad/zarr.json"
    assert "malformed JSON" in str(nodes["bad"].error)
    # An unknown codec keeps the array's metadata (issue 8); only its decoding fails.
    codec = nodes["codec"]
    assert isinstance(codec, ArrayMeta) and codec.shape == (3,) and codec.dtype == np.dtype("<i4")
    assert codec.codec.describe()[-1] == {"name": "no-such-codec"}
    with pytest.raises(UnknownCodec, match="no-such-codec.*codec/zarr.json"):
        codec.codec.decode(b"", (3,), codec.dtype, codec.fill_value)


@st.composite
def array_cases(draw):
    ndim = draw(st.integers(0, 3))
    shape = tuple(draw(st.integers(0, 12)) for _ in range(ndim))
    chunks = tuple(draw(st.integers(1, 6)) for _ in range(ndim))
    return shape, chunks, draw(st.sampled_from([2, 3])), draw(st.sampled_from(["<i2", ">f8", "|u1"]))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(array_cases(), st.data())
def test_random_shapes_and_ranges(tmp_path_factory, case, data):
    shape, chunks, fmt, dtype = case
    if fmt == 3 and dtype.startswith(">"):
        dtype = "<f8"
    path = str(tmp_path_factory.mktemp("h"))
    arr = zarr.create_array(path, name="a", shape=shape, chunks=chunks, dtype=dtype, zarr_format=fmt, fill_value=7)
    values = sample(np.dtype(dtype), shape, seed=data.draw(st.integers(0, 1000)))
    if shape and all(shape):
        cut = tuple(slice(0, data.draw(st.integers(0, s))) for s in shape)
        arr[cut] = values[cut]
    expected = np_save_bytes(np.asarray(oracle(f"{path}/a"), order="C"))
    ranges = [
        (data.draw(st.integers(0, len(expected) + 4)), data.draw(st.integers(0, len(expected) + 4))) for _ in range(5)
    ]
    got = read_npy(path, "a", ranges=ranges)
    assert got == [expected[o : o + n] for o, n in ranges]


def _v3_group_doc(**extra):
    return json.dumps({"zarr_format": 3, "node_type": "group", "attributes": {}, **extra})


def _zarr_opens_group(path) -> bool:
    try:
        zarr.open_group(str(path), mode="r")
        return True
    except Exception:
        return False


def test_v3_group_with_required_unknown_field_fails_alone(tmp_path):
    """v3: a node with an unknown field that does not say `must_understand: false` must not be
    opened (zarr-python 3 refuses it too); its siblings and parent stay readable."""
    path = tmp_path / "s"
    root = zarr.open_group(str(path), mode="w", zarr_format=3)
    root.create_group("strict")
    root.create_group("lenient")
    root.create_array("a", shape=(2,), dtype="<i4")
    (path / "strict" / "zarr.json").write_text(_v3_group_doc(ext={"must_understand": True}))
    (path / "lenient" / "zarr.json").write_text(_v3_group_doc(ext={"must_understand": False, "x": 1}))
    assert not _zarr_opens_group(path / "strict")
    _, h, node = open_node(str(path), "")
    assert isinstance(node, GroupMeta)
    nodes = {n.path: n for n in h.children_sync("")}
    assert isinstance(nodes["strict"], BrokenNode) and nodes["strict"].key == "strict/zarr.json"
    assert "'ext' that must be understood" in str(nodes["strict"].error)
    assert isinstance(nodes["lenient"], GroupMeta) and isinstance(nodes["a"], ArrayMeta)


@pytest.mark.parametrize("extra", [{"ext": {"must_understand": True}}, {"ext": 1}])
def test_v3_root_group_with_required_unknown_field_refuses_the_mount(tmp_path, extra):
    from zarrfs.errors import UserError

    path = tmp_path / "s"
    zarr.open_group(str(path), mode="w", zarr_format=3).create_array("a", shape=(2,), dtype="<i4")
    (path / "zarr.json").write_text(_v3_group_doc(**extra))
    assert not _zarr_opens_group(path)
    with pytest.raises(UserError, match=r"zarr.json: unknown field 'ext' that must be understood"):
        open_node(str(path), "")


def _write_vlen(path, fmt):
    """zarr-python 3 string and bytes arrays with missing chunks and elements of several lengths."""
    from zarr.core.dtype import VariableLengthBytes

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        s = zarr.create_array(str(path), name="s", shape=(5, 7), chunks=(2, 3), dtype=str, zarr_format=fmt)
        s[:2, :4] = np.array([["a", "bé", "日本語", ""], ["xyzwv", "", "ü", "q"]], dtype=object)
        b = zarr.create_array(
            str(path), name="b", shape=(5,), chunks=(2,), dtype=VariableLengthBytes(), zarr_format=fmt
        )
        b[:3] = np.array([b"a", b"bb\x00c", b""], dtype=object)


@pytest.mark.parametrize("fmt", [2, 3])
def test_vlen_arrays_read_as_fixed_width(tmp_path, fmt):
    """Variable-length strings as `<U{longest}`, bytes as `|S{longest}`, missing chunks the fill."""
    path = tmp_path / "s"
    _write_vlen(path, fmt)
    for name, kind in (("s", "U"), ("b", "S")):
        z = np.asarray(zarr.open_array(str(path / name), mode="r")[...], dtype=object)
        width = max(len(v) for v in z.reshape(-1))
        want = np.asarray(z, dtype=f"{kind}{width}")
        got = np.load(__import__("io").BytesIO(read_npy(str(path), name)))
        assert got.dtype == want.dtype and got.tobytes() == want.tobytes(), name
        _, _, meta = open_node(str(path), name)
        assert meta.read_only and "cannot be written" in meta.read_only


def test_vlen_width_scan_is_bounded(tmp_path, monkeypatch):
    from zarrfs.formats import vlen

    path = tmp_path / "s"
    _write_vlen(path, 3)
    monkeypatch.setattr(vlen, "VLEN_SCAN_MAX_STORED_BYTES", 10)
    _, _, node = open_node(str(path), "s")
    assert isinstance(node, BrokenNode) and isinstance(node.error, Unsupported)
    assert node.key == "s/zarr.json" and "at most" in str(node.error)


def test_vlen_arrays_of_zarr_2_18(tmp_path):
    """zarr 2.18 writes `fill_value: 0` for object arrays (and F-ordered objects with order F):
    strings read as zarr-python 3 reads them (missing chunks "0"); bytes as zarr 2.18 reads
    the stored chunks, missing chunks empty (zarr-python 3 refuses that fill value)."""
    import subprocess

    z218 = ZARR218_PYTHON
    script = f"""
import numcodecs, numpy as np, zarr
s = zarr.open_array({str(tmp_path / "s")!r}, mode='w', shape=(5,), chunks=(2,), dtype=object,
                    object_codec=numcodecs.VLenUTF8())
s[:3] = np.array(['a', 'ßé', ''], dtype=object)
b = zarr.open_array({str(tmp_path / "b")!r}, mode='w', shape=(2, 3), chunks=(2, 2), dtype=object,
                    object_codec=numcodecs.VLenBytes(), order='F')
b[:, :2] = np.array([[b'a', b'xyz'], [b'', b'q']], dtype=object)
print(repr(b[:, :2].tolist()))
"""
    r = subprocess.run([str(z218), "-c", script], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "s" / ".zarray").read_text())["fill_value"] == 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want_s = np.asarray(zarr.open_array(str(tmp_path / "s"), mode="r")[...], dtype=object)
    got_s = np.load(__import__("io").BytesIO(read_npy(str(tmp_path / "s"), "")))
    assert got_s.dtype == np.dtype("<U2") and got_s.tolist() == want_s.tolist()
    got_b = np.load(__import__("io").BytesIO(read_npy(str(tmp_path / "b"), "")))
    assert got_b.dtype == np.dtype("|S3") and got_b[:, :2].tolist() == __import__("ast").literal_eval(r.stdout)
    assert got_b[:, 2].tolist() == [b"", b""]


def test_dimension_names_of_a_new_array_in_a_dataset():
    from zarrfs.formats.datasets import dimension_names

    dims = {"time": {3}, "y": {4}, "x": {5}, "a": {6}, "b": {6}, "dim_0_9": {2}}
    # A length matching exactly one dimension takes its name, once per array; other
    # lengths (none, or several matches) get generated names that clash with nothing.
    assert dimension_names((4, 5, 5), dims) == ("y", "x", "dim_2_5")
    assert dimension_names((6, 7), dims) == ("dim_0_6", "dim_1_7")
    assert dimension_names((9,), dims) == ("dim_0_9_1",)
    assert dimension_names((), dims) == ()


@pytest.mark.parametrize("fmt", [2, 3])
def test_plain_file_names_a_reader_could_take_for_its_own_keys_are_refused(tmp_path, fmt):
    from zarrfs.formats import open_hierarchy_sync
    from zarrfs.storage.store import Store

    zarr.open_group(tmp_path / "s.zarr", mode="w", zarr_format=fmt)
    h = open_hierarchy_sync(Store(str(tmp_path / "s.zarr")))
    for name in [
        ".zarray",
        ".zgroup",
        ".zattrs",
        ".zmetadata",
        "zarr.json",
        "0",
        "0.1.2",
        "c",
        ".zarrfs-new-00",
        ".notes.txt.zarrfs-12-7f3a.tmp",
    ]:
        assert h.plain_name_problem(name) is not None, name
    for name in ["notes.txt", ".x.npy.AbC123", "c0", "1a", "README", ".zattrs.bak"]:
        assert h.plain_name_problem(name) is None, name
