"""The encode side of codec chains: chunks zarrfs encodes read back by zarr-python 3; round trips.

Oracles: zarr-python 3 reading a v2 or v3 store whose chunk files zarrfs wrote (values
compared byte for byte with what was encoded, so NaNs and their payloads count), numpy's
own byte layouts, and the shard layout of the v3 spec. For zarr 2.18's v3 drafts and v1
there is no writer in this venv: their chains are checked by round trips on the fixtures.
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import numcodecs
import numpy as np
import pytest
import zarr
import zarr.codecs as zc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from numcodecs.abc import Codec
from numcodecs.compat import ensure_bytes
from zarr.codecs import numcodecs as znc

from zarrfs import grid
from zarrfs.codecs.adapters import BytesBytes, NumcodecsArray, NumcodecsArrayBytes, numcodecs_codec
from zarrfs.codecs.chain import BytesLayout, CodecChain, Transpose, is_fill
from zarrfs.codecs.sharding import ABSENT, ShardingIndexed
from zarrfs.formats import open_hierarchy_sync
from zarrfs.options import Options
from zarrfs.storage.chunksource import read_chunk_sync
from zarrfs.storage.store import Store

from support import FIXTURES

warnings.filterwarnings("ignore", module="zarr")
pytestmark = pytest.mark.filterwarnings("ignore")

STRUCT = np.dtype([("a", "<i4"), ("b", "<f8"), ("s", "S3")])
DTYPES = [
    "bool",
    "int8",
    "uint8",
    "<i2",
    "<u2",
    "<i4",
    "<u4",
    "<i8",
    "<u8",
    "<f2",
    "<f4",
    "<f8",
    "<c8",
    "<c16",
    "S5",
    "<U3",
    "<M8[ns]",
    "<m8[s]",
    STRUCT,
]
NAN_FILL = {"f": np.nan, "c": complex(np.nan, 0)}
RAPID = settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))


def sample(dtype: np.dtype, shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    """Random elements of `dtype`; every bit pattern for numbers (NaNs with payloads included)."""
    rng = np.random.default_rng(seed)
    n = math.prod(shape)
    if dtype.kind == "b":
        return rng.integers(0, 2, n).astype(bool).reshape(shape)
    if dtype.kind == "U":  # valid code points only (no surrogates)
        return (
            rng.integers(0x20, 0xD7FF, n * dtype.itemsize // 4)
            .astype("<u4")
            .view(dtype.newbyteorder("<"))
            .astype(dtype)
            .reshape(shape)
        )
    return rng.integers(0, 256, n * dtype.itemsize, dtype=np.uint8).view(dtype).reshape(shape)


def raw(arr: np.ndarray, dtype: np.dtype | None = None) -> bytes:
    """The C-order bytes of `arr` (as `dtype`): equality here is exact, NaN payloads included."""
    arr = np.asarray(arr)
    return np.ascontiguousarray(arr if dtype is None else arr.astype(dtype)).tobytes()


def same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and raw(a) == raw(b)


def store_values(path: str, name: str, values: np.ndarray):
    """Write every chunk of `values` with zarrfs' encoder (chunks of fill left out); the ArrayMeta."""
    meta = open_hierarchy_sync(Store(path)).node_sync(name)
    assert values.shape == meta.shape
    for idx in grid.all_chunks(meta.shape, meta.chunk_shape):
        region = grid.chunk_slices(idx, meta.shape, meta.chunk_shape)
        chunk = np.full(meta.chunk_shape, meta.fill_value, dtype=meta.dtype)
        chunk[tuple(slice(0, r.stop - r.start) for r in region)] = values[region]
        target = Path(path) / meta.chunk_key(idx)
        data = b"" if is_fill(chunk, meta.fill_value) else meta.codec.encode(chunk, meta.fill_value)
        if data:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        else:
            target.unlink(missing_ok=True)
    return meta


def zarr_reads(path: str, name: str, dtype: np.dtype) -> bytes:
    z = zarr.open_array(f"{path}/{name}", mode="r")
    return raw(np.asarray(z[...]), dtype)


def roundtrip_via_zarr(tmp_path, values: np.ndarray, fill_regions=(), **create) -> None:
    """Create the array with zarr-python, encode `values` into it, check zarr reads them back."""
    path = str(tmp_path / "s")
    zarr.create_array(path, name="a", shape=values.shape, **create)
    meta = open_hierarchy_sync(Store(path)).node_sync("a")
    values = values.astype(meta.dtype)
    for region in fill_regions:
        values[region] = meta.fill_value
    store_values(path, "a", values)
    assert zarr_reads(path, "a", meta.dtype) == raw(values)


# ---------------------------------------------------------------------------------------
# zarr-python 3 reads what zarrfs encodes: v2

V2_COMPRESSORS = [
    None,
    numcodecs.Blosc("lz4", 5, numcodecs.Blosc.SHUFFLE),
    numcodecs.Blosc("zstd", 3, numcodecs.Blosc.BITSHUFFLE),
    numcodecs.Zstd(3),
    numcodecs.GZip(1),
    numcodecs.Zlib(4),
    numcodecs.BZ2(2),
    numcodecs.LZMA(preset=1),
    numcodecs.LZ4(),
]
V2_DTYPES = DTYPES + [">i4", ">f8", ">c16", ">u2"]


def fill_for(dtype: np.dtype) -> dict:
    """A NaN fill for floats; zarr's default otherwise (not `None`: a v2 `null` fill is undefined,
    and zarr-python reads it as NaT for datetimes where zarrfs reads zeros)."""
    return {"fill_value": NAN_FILL[dtype.kind]} if dtype.kind in NAN_FILL else {}


@pytest.mark.parametrize("order", ["C", "F"])
@pytest.mark.parametrize("dtype", V2_DTYPES, ids=str)
def test_v2_dtypes(tmp_path, dtype, order):
    compressor = V2_COMPRESSORS[V2_DTYPES.index(dtype) % len(V2_COMPRESSORS)]  # each dtype meets one
    dtype = np.dtype(dtype)
    roundtrip_via_zarr(
        tmp_path,
        sample(dtype, (7, 5), seed=3),
        [np.s_[0:3, 0:2], np.s_[4, 1]],
        chunks=(3, 2),
        dtype=dtype,
        order=order,
        compressors=compressor,
        zarr_format=2,
        **fill_for(dtype),
    )


@pytest.mark.parametrize("order", ["C", "F"])
@pytest.mark.parametrize("compressor", V2_COMPRESSORS, ids=repr)
def test_v2_compressors(tmp_path, compressor, order):
    roundtrip_via_zarr(
        tmp_path,
        sample(np.dtype(">f8"), (9, 8, 3)),
        [np.s_[4:8, 3:6, 0:2]],
        chunks=(4, 3, 2),
        dtype=">f8",
        fill_value=np.nan,
        order=order,
        compressors=compressor,
        zarr_format=2,
        chunk_key_encoding={"name": "v2", "separator": "/"},
    )


def ints(shape, lo, hi, dtype="<i4", seed=0):
    return np.random.default_rng(seed).integers(lo, hi, math.prod(shape)).astype(dtype).reshape(shape)


@pytest.mark.parametrize("order", ["C", "F"])
@pytest.mark.parametrize(
    "filters",
    [
        [numcodecs.Delta("<i4")],
        [numcodecs.Delta("<i4", astype="<i8")],
        [numcodecs.Shuffle(4)],
        [numcodecs.AsType("<i2", "<i4")],
        [numcodecs.Delta("<i4"), numcodecs.Shuffle(4)],
        [numcodecs.CRC32()],
        [numcodecs.Adler32()],
        [numcodecs.FixedScaleOffset(5, 1, "<i4", "<i2")],
    ],
    ids=repr,
)
def test_v2_filters(tmp_path, filters, order):
    roundtrip_via_zarr(
        tmp_path,
        ints((11, 6), -3000, 3000),
        [np.s_[0:4, 0:3]],
        chunks=(4, 3),
        dtype="<i4",
        filters=filters,
        compressors=numcodecs.Zlib(1),
        order=order,
        zarr_format=2,
    )


@pytest.mark.parametrize("order", ["C", "F"])
def test_v2_fixedscaleoffset_lossy(tmp_path, order):
    path = str(tmp_path / "s")
    values = np.random.default_rng(1).uniform(-50, 50, (10, 7))
    zarr.create_array(
        path,
        name="a",
        shape=values.shape,
        chunks=(4, 3),
        dtype="<f8",
        order=order,
        zarr_format=2,
        filters=[numcodecs.FixedScaleOffset(offset=2.5, scale=10, dtype="<f8", astype="<i2")],
    )
    store_values(path, "a", values)
    expected = np.round((values - 2.5) * 10).astype("<i2") / 10 + 2.5  # what the stored integers mean
    assert zarr_reads(path, "a", np.dtype("<f8")) == raw(expected)


def test_v2_packbits(tmp_path):
    roundtrip_via_zarr(
        tmp_path,
        sample(np.dtype(bool), (37,)),
        [np.s_[10:20]],
        chunks=(10,),
        dtype=bool,
        filters=[numcodecs.PackBits()],
        compressors=None,
        zarr_format=2,
    )


@pytest.mark.parametrize("fmt", [2, 3])
def test_zero_d(tmp_path, fmt):
    roundtrip_via_zarr(tmp_path, np.array(-7.25), dtype="<f8", fill_value=1.0, zarr_format=fmt)


# ---------------------------------------------------------------------------------------
# v3


@pytest.mark.parametrize("endian", ["little", "big"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_v3_dtypes_endian(tmp_path, dtype, endian):
    dtype = np.dtype(dtype)
    roundtrip_via_zarr(
        tmp_path,
        sample(dtype, (7, 5), seed=4),
        [np.s_[0:3, 2:4], np.s_[6, 4]],
        chunks=(3, 2),
        dtype=dtype,
        serializer=zc.BytesCodec(endian=endian),
        compressors=zc.BloscCodec(cname="lz4", shuffle="shuffle"),
        **fill_for(dtype),
    )


V3_COMPRESSORS = [
    None,
    zc.BloscCodec(cname="lz4", clevel=5, shuffle="shuffle"),
    zc.BloscCodec(cname="zstd", clevel=1, shuffle="bitshuffle"),
    zc.ZstdCodec(level=3, checksum=True),
    zc.GzipCodec(level=1),
    zc.Crc32cCodec(),
    [zc.GzipCodec(level=1), zc.Crc32cCodec()],
    [znc.Zlib(level=2)],
    [znc.BZ2(level=1)],
    [znc.LZMA(preset=1)],
    [znc.LZ4()],
    [znc.CRC32()],
]


@pytest.mark.parametrize("compressors", V3_COMPRESSORS, ids=repr)
def test_v3_compressors(tmp_path, compressors):
    roundtrip_via_zarr(
        tmp_path,
        sample(np.dtype("<f4"), (9, 8)),
        [np.s_[0:4, 3:6]],
        chunks=(4, 3),
        dtype="<f4",
        fill_value=-1.5,
        compressors=compressors,
        chunk_key_encoding={"name": "default", "separator": "."},
    )


@pytest.mark.parametrize("order", [(1, 0), (0, 1)])
def test_v3_transpose(tmp_path, order):
    roundtrip_via_zarr(
        tmp_path,
        sample(np.dtype("<u2"), (9, 7)),
        [np.s_[2:4, 0:3]],
        chunks=(2, 3),
        dtype="<u2",
        filters=[zc.TransposeCodec(order=order)],
        compressors=zc.GzipCodec(level=1),
    )


def test_v3_transpose_3d_big_endian(tmp_path):
    roundtrip_via_zarr(
        tmp_path,
        sample(np.dtype("<i8"), (5, 7, 3)),
        chunks=(2, 3, 2),
        dtype="<i8",
        filters=[zc.TransposeCodec(order=(2, 0, 1))],
        serializer=zc.BytesCodec(endian="big"),
    )


@pytest.mark.parametrize(
    "case",
    [
        ("<i4", [znc.Delta(dtype="<i4")]),
        ("<i4", [znc.Delta(dtype="<i4", astype="<i8")]),
        ("<i4", [znc.AsType(encode_dtype="<i2", decode_dtype="<i4")]),
        ("<i4", [znc.FixedScaleOffset(offset=5, scale=1, dtype="<i4", astype="<i2")]),
        ("<i4", [zc.TransposeCodec(order=(1, 0)), znc.Delta(dtype="<i4")]),
        ("bool", [znc.PackBits()]),
    ],
    ids=repr,
)
def test_v3_numcodecs_filters(tmp_path, case):
    dtype, filters = case
    values = sample(np.dtype(bool), (11, 6)) if dtype == "bool" else ints((11, 6), -3000, 3000)
    roundtrip_via_zarr(tmp_path, values, [np.s_[0:4, 0:3]], chunks=(4, 3), dtype=dtype, filters=filters)


def test_v3_fixedscaleoffset_lossy(tmp_path):
    path = str(tmp_path / "s")
    values = np.random.default_rng(2).uniform(-50, 50, (10, 7)).astype("<f4")
    zarr.create_array(
        path,
        name="a",
        shape=values.shape,
        chunks=(4, 3),
        dtype="<f4",
        compressors=None,
        filters=[znc.FixedScaleOffset(offset=-1, scale=4, dtype="<f4", astype="<i2")],
    )
    store_values(path, "a", values)
    expected = (np.round((values.astype("<f8") + 1) * 4).astype("<i2") / 4 - 1).astype("<f4")
    assert zarr_reads(path, "a", np.dtype("<f4")) == raw(expected)


SHARD_FILL_REGIONS = [np.s_[0:2, 0:3], np.s_[2:4, 3:6], np.s_[8:12, 0:6], np.s_[12, 7]]  # 2 inner chunks, 1 shard


@pytest.mark.parametrize("outer", [None, zc.ZstdCodec(level=1)], ids=["bare", "zstd-outside"])
@pytest.mark.parametrize("transpose", [False, True], ids=["plain", "transpose"])
@pytest.mark.parametrize("index_location", ["start", "end"])
def test_v3_sharding(tmp_path, index_location, transpose, outer):
    inner = [zc.TransposeCodec(order=(1, 0))] if transpose else []
    inner += [zc.BytesCodec(endian="big" if transpose else "little"), zc.ZstdCodec(level=1)]
    roundtrip_via_zarr(
        tmp_path,
        sample(np.dtype("<f8"), (13, 11)),
        SHARD_FILL_REGIONS,
        chunks=(4, 6),
        dtype="<f8",
        fill_value=np.nan,
        compressors=outer,
        serializer=zc.ShardingCodec(chunk_shape=(2, 3), codecs=inner, index_location=index_location),
    )


def test_v3_sharding_plain_index_and_nested(tmp_path):
    inner = zc.ShardingCodec(
        chunk_shape=(1, 3), codecs=[zc.BytesCodec(), zc.Crc32cCodec()], index_codecs=[zc.BytesCodec()]
    )
    roundtrip_via_zarr(
        tmp_path,
        sample(np.dtype("<i2"), (13, 11)),
        SHARD_FILL_REGIONS + [np.s_[5, 0:3]],
        chunks=(4, 6),
        dtype="<i2",
        fill_value=3,
        compressors=None,
        serializer=zc.ShardingCodec(
            chunk_shape=(2, 3), codecs=[inner], index_codecs=[zc.BytesCodec(endian="big")], index_location="start"
        ),
    )


def test_v3_sharding_whole_array_of_fill_stores_nothing(tmp_path):
    path = str(tmp_path / "s")
    zarr.create_array(
        path,
        name="a",
        shape=(8, 6),
        chunks=(4, 6),
        dtype="<i4",
        fill_value=9,
        serializer=zc.ShardingCodec(chunk_shape=(2, 3)),
    )
    meta = open_hierarchy_sync(Store(path)).node_sync("a")
    shard = np.full(meta.chunk_shape, 9, dtype="<i4")
    assert meta.codec.encode(shard, meta.fill_value) == b""  # and not a checksum of nothing
    store_values(path, "a", np.full((8, 6), 9, "<i4"))
    assert sorted(p.name for p in (Path(path) / "a").rglob("*") if p.is_file()) == ["zarr.json"]


# ---------------------------------------------------------------------------------------
# Round trips of each stage (hypothesis) and the shard layout

shapes = st.lists(st.integers(1, 5), min_size=0, max_size=3).map(tuple)


def layouts(arr: np.ndarray, which: int) -> np.ndarray:
    """The same values in another memory layout: C, F, or a strided view (0-d stays as it is)."""
    if which == 1 and arr.ndim:
        return np.asfortranarray(arr)
    if which == 2 and arr.ndim:
        return np.repeat(arr[..., None], 2, axis=-1)[..., 0]
    return arr


@RAPID
@given(
    st.sampled_from(DTYPES + [">i4", ">f8", "V3"]),
    shapes,
    st.sampled_from([None, "little", "big"]),
    st.sampled_from("CF"),
    st.integers(0, 2),
    st.integers(0, 99),
)
def test_bytes_layout(dtype, shape, endian, order, layout, seed):
    dtype = np.dtype(dtype)
    x = layouts(sample(dtype, shape, seed), layout)
    stage = BytesLayout(endian, order)
    enc = stage.encode(x, np.zeros((), dtype))
    stored = (
        dtype
        if endian is None or dtype.fields is not None or dtype.kind in "SVb" or dtype.itemsize == 1
        else dtype.newbyteorder("<" if endian == "little" else ">")
    )
    assert raw(enc) == x.astype(stored).tobytes(order=order)  # numpy's own layout of the elements
    assert same(stage.decode(enc, shape, dtype, np.zeros((), dtype)), x)


@RAPID
@given(shapes, st.data())
def test_transpose(shape, data):
    order = tuple(data.draw(st.permutations(range(len(shape)))))
    x = sample(np.dtype("<i4"), shape)
    stage = Transpose(order)
    enc = stage.encode(x)
    assert same(enc, np.transpose(x, order))
    assert stage.encoded_shape(shape, x.dtype) == (enc.shape, x.dtype)
    assert same(stage.decode(enc, shape, x.dtype), x)


ARRAY_FILTERS = [
    ("<i4", {"id": "delta", "dtype": "<i4"}),
    ("<i2", {"id": "delta", "dtype": "<i2", "astype": "<i8"}),
    ("<i4", {"id": "astype", "encode_dtype": "<i8", "decode_dtype": "<i4"}),
    ("<i4", {"id": "fixedscaleoffset", "offset": 7, "scale": 1, "dtype": "<i4", "astype": "<i8"}),
    ("bool", {"id": "packbits"}),
    ("<f4", {"id": "bitround", "keepbits": 23}),
]


@RAPID
@given(st.sampled_from(ARRAY_FILTERS), shapes, st.integers(0, 2), st.integers(0, 99))
def test_numcodecs_array(case, shape, layout, seed):
    dtype, config = np.dtype(case[0]), case[1]
    x = sample(dtype, shape, seed)
    if dtype.kind == "f":
        x = np.random.default_rng(seed).normal(0, 100, shape).astype(dtype)
    if dtype.kind in "iu":
        x = ints(shape, -1000, 1000, dtype, seed)
    x = layouts(x, layout)
    for chain in (
        CodecChain((NumcodecsArray(numcodecs_codec(config, "test"), config["id"]),)),
        CodecChain(
            (Transpose(tuple(range(len(shape)))[::-1]), NumcodecsArray(numcodecs_codec(config, "test"), config["id"]))
        ),
    ):
        stage = chain.array_array[-1]
        mid = chain.array_array[0].encode(x) if len(chain.array_array) == 2 else x
        enc = stage.encode(mid)
        assert stage.encoded_shape(mid.shape, dtype) == (enc.shape, enc.dtype)
        fill = np.zeros((), dtype)
        assert same(chain.decode(chain.encode(x, fill), shape, dtype, fill), x)


@RAPID
@given(
    st.sampled_from(
        [
            {"id": "zlib", "level": 1},
            {"id": "gzip", "level": 1},
            {"id": "bz2", "level": 1},
            {"id": "lzma", "preset": 1},
            {"id": "lz4"},
            {"id": "zstd", "level": 1},
            {"id": "blosc", "cname": "zstd", "shuffle": 2},
            {"id": "crc32"},
            {"id": "crc32c"},
            {"id": "adler32"},
            {"id": "fletcher32"},
            {"id": "shuffle", "elementsize": 1},
        ]
    ),
    st.binary(min_size=1, max_size=300),
)  # a chunk is never empty (numcodecs' blosc, zstd, lz4 fail on b"")
def test_bytes_bytes(config, data):
    stage = BytesBytes(numcodecs_codec(config, "test"), config["id"])
    enc = stage.encode(data)
    assert ensure_bytes(stage.decode(enc)) == data


class Cube(Codec):
    """A made-up array->bytes codec: the elements as float64 plus a 4-byte count (no shape kept)."""

    codec_id = "test-cube"

    def encode(self, buf):
        arr = np.asarray(buf)
        assert arr.flags.c_contiguous
        return np.uint32(arr.size).tobytes() + arr.astype("<f8").tobytes()

    def decode(self, buf, out=None):
        data = bytes(buf)
        return np.frombuffer(data[4:], "<f8")


@RAPID
@given(shapes, st.integers(0, 2), st.integers(0, 99))
def test_numcodecs_array_bytes(shape, layout, seed):
    x = layouts(ints(shape, -1000, 1000, "<i4", seed), layout)
    chain = CodecChain((), NumcodecsArrayBytes(Cube(), "test-cube"), (BytesBytes(numcodecs.Zlib(1), "zlib"),))
    fill = np.zeros((), "<i4")
    enc = chain.encode(x, fill)
    assert isinstance(enc, bytes) and numcodecs.Zlib().decode(enc)[4:] == x.astype("<f8").tobytes()
    assert same(chain.decode(enc, shape, np.dtype("<i4"), fill), x)


def parse_index(shard: bytes, n_inner: int, at_end: bool) -> np.ndarray:
    """The (n, 2) u64 index of a shard whose index codecs are `bytes` + `crc32c`, as the spec lays it out."""
    size = 16 * n_inner + 4
    raw_index = shard[-size:] if at_end else shard[:size]
    numcodecs.CRC32C().decode(raw_index)  # raises unless the checksum holds
    return np.frombuffer(raw_index[:-4], "<u8").reshape(n_inner, 2)


@RAPID
@given(
    st.lists(st.tuples(st.integers(1, 3), st.integers(1, 3)), min_size=1, max_size=3),
    st.booleans(),
    st.booleans(),
    st.sampled_from(["<f8", "<i2", STRUCT]),
    st.data(),
)
def test_sharding_layout(dims, at_end, transpose, dtype, data):
    inner_chunks = tuple(c for c, _ in dims)
    shape = tuple(c * n for c, n in dims)
    per_shard = tuple(n for _, n in dims)
    dtype = np.dtype(dtype)
    fill = np.array(np.nan if dtype.kind == "f" else 0, dtype) if dtype.fields is None else np.zeros((), dtype)
    x = sample(dtype, shape, data.draw(st.integers(0, 99)))
    absent = set()
    for pos in grid.all_chunks(per_shard, (1,) * len(per_shard)):
        if data.draw(st.booleans()):
            x[grid.chunk_slices(pos, shape, inner_chunks)] = fill
            absent.add(pos)
    inner = CodecChain(
        (Transpose(tuple(range(len(shape)))[::-1]),) if transpose else (),
        BytesLayout("big"),
        (BytesBytes(numcodecs.Zstd(1), "zstd"),),
    )
    index = CodecChain((), BytesLayout("little"), (BytesBytes(numcodecs.CRC32C(), "crc32c"),))
    stage = ShardingIndexed(inner_chunks, inner, index, at_end)
    chain = CodecChain((), stage)
    shard = chain.encode(x, fill)
    n_inner = math.prod(per_shard)
    if len(absent) == n_inner:
        assert shard == b""
        return
    table = parse_index(shard, n_inner, at_end)
    expected_offset = 0 if at_end else 16 * n_inner + 4
    for k, pos in enumerate(grid.all_chunks(per_shard, (1,) * len(per_shard))):
        offset, nbytes = (int(v) for v in table[k])
        if pos in absent:
            assert (offset, nbytes) == (ABSENT, ABSENT)
            continue
        assert offset == expected_offset  # back to back, C order over the inner grid
        part = x[grid.chunk_slices(pos, shape, inner_chunks)]
        assert same(inner.decode(shard[offset : offset + nbytes], inner_chunks, dtype, fill), part)
        expected_offset += nbytes
    assert expected_offset == len(shard) - (16 * n_inner + 4 if at_end else 0)
    assert same(chain.decode(shard, shape, dtype, fill), x)


# ---------------------------------------------------------------------------------------
# is_fill


def test_is_fill_nan_and_bits():
    nan = np.array(np.nan, "<f8")
    assert is_fill(np.full((3, 2), np.nan), nan)
    assert is_fill(np.full((3, 2), np.nan, ">f8"), nan)  # compared in the chunk's own byte order
    other_nan = np.full(4, np.nan)
    other_nan.view("<u8")[2] |= 1  # a NaN with another payload is data, not fill
    assert not is_fill(other_nan, nan)
    assert not is_fill(np.array([0.0, -0.0]), np.array(0.0))
    assert is_fill(np.array([0.0, 0.0]), np.array(0.0))
    assert not is_fill(np.array([np.nan, 1.0]), nan)
    assert is_fill(np.full(3, complex(np.nan, 0), "<c8"), np.array(complex(np.nan, 0), "<c8"))
    assert is_fill(np.zeros((0, 3), "<f8"), nan)


def test_is_fill_layouts_and_types():
    base = np.full((4, 6), 5, "<i2")
    assert is_fill(np.asfortranarray(base), np.array(5, "<i2"))
    assert is_fill(base[::2, 1::3], np.array(5, "<i2"))
    base[3, 5] = 4
    assert not is_fill(base.T, np.array(5, "<i2"))
    rec = np.zeros(5, STRUCT)
    fill = np.zeros((), STRUCT)
    fill["b"] = np.nan
    fill["s"] = b"ab"
    rec[:] = fill
    assert is_fill(rec, fill)
    rec["s"][2] = b"ac"
    assert not is_fill(rec, fill)
    assert is_fill(np.array([b"xy", b"xy"], "S4"), np.array(b"xy", "S4"))
    assert not is_fill(np.array([b"xy", b"xy\0z"], "S4"), np.array(b"xy", "S4"))
    assert is_fill(np.array(["é", "é"], "<U2"), np.array("é", "<U2"))
    nat = np.array("NaT", "<M8[ns]")
    assert is_fill(np.full(3, nat), nat) and not is_fill(np.array([0, 0], "<M8[ns]"), nat)
    assert is_fill(np.array([True, True]), np.array(True)) and not is_fill(np.array([True, False]), np.array(True))
    assert is_fill(np.array(3.0), np.array(3))  # a 0-d chunk; the fill cast to the chunk's dtype
    for at in (0, 1, 4, 5, 6, 9):  # one element of data anywhere: first, middle, last or between
        one = np.zeros(10, "<f4")
        one[at] = 1
        assert not is_fill(one, np.array(0, "<f4"))


# ---------------------------------------------------------------------------------------
# Formats with no writer here: round trips over the fixtures' own chains and chunks

# numcodecs' blosc lacks snappy and zstd 0.7 (legacy) that zarr 1.1.0's bundled c-blosc had.
V1_UNDECODABLE = {"blosc_snappy_u2_C", "blosc_zstd_bitshuffle_i4_F"}


DRAFT_STORES = [
    "v3draft-zarr218/store",
    "v3draft-2022-05/core",
    "v3draft-2022-05/core-root-array",
    "v3draft-2022-05/protocol",
]


def arrays_below(hierarchy, path: str = ""):
    node = hierarchy.node_sync(path)
    if node.kind == "array":
        yield node
    for child in hierarchy.children_sync(path) if node.kind == "group" else ():
        yield from arrays_below(hierarchy, child.path)


def fixture_arrays(fmt: str):
    """(name, store, ArrayMeta) of every array in the fixtures of a format zarr-python cannot write."""
    if fmt == "v1":
        for meta in sorted((FIXTURES / "v1").glob("*/meta")):
            if meta.parent.name in V1_UNDECODABLE:
                continue
            store = Store(str(meta.parent))
            yield meta.parent.name, store, open_hierarchy_sync(store, options=Options(v1_order="writer")).node_sync("")
        return
    from zarrfs.formats import v3draft

    for root in DRAFT_STORES:
        store = Store(str(FIXTURES / root))
        for node in arrays_below(v3draft.V3DraftHierarchy.open_sync(store)):
            yield f"{root}:{node.path}", store, node


@pytest.mark.parametrize("fmt", ["v1", "v3draft"])
def test_fixture_chains_round_trip(fmt):
    checked = 0
    for name, store, meta in fixture_arrays(fmt):
        assert hasattr(meta, "codec"), (name, meta)
        fill = meta.fill_value
        x = sample(meta.dtype, meta.chunk_shape, seed=checked)
        if any(
            getattr(s, "codec", None) is not None and s.codec.codec_id in ("delta", "fixedscaleoffset")
            for s in meta.codec.bytes_bytes
        ):
            x = ints(meta.chunk_shape, -100, 100, meta.dtype, seed=checked)  # in range of the filters' types
        assert same(meta.codec.decode(meta.codec.encode(x, fill), meta.chunk_shape, meta.dtype, fill), x), name
        for idx in grid.all_chunks(meta.shape, meta.chunk_shape):
            stored = read_chunk_sync(meta, store, idx)
            if stored is None:
                continue
            chunk = meta.codec.decode(stored, meta.chunk_shape, meta.dtype, fill)
            again = meta.codec.decode(meta.codec.encode(chunk, fill), meta.chunk_shape, meta.dtype, fill)
            assert same(np.asarray(again), np.asarray(chunk)), (name, idx)
            checked += 1
    assert checked > 20


def test_a_chain_refuses_a_step_outside_its_role_when_built():
    """Each step is checked against its role's protocol once, when the chain is built: a
    compressor given as the array->bytes step, or a layout given as a compressor, is refused
    then (a format's mistake), not at the first chunk decoded."""
    zstd = BytesBytes(numcodecs.Zstd(), "zstd")
    with pytest.raises(TypeError, match="BytesBytes cannot stand in the ArrayBytesCodec role"):
        CodecChain((), zstd, ())
    with pytest.raises(TypeError, match="BytesLayout cannot stand in the BytesBytesCodec role"):
        CodecChain((), BytesLayout(), (BytesLayout(),))
    with pytest.raises(TypeError, match="ArrayArrayCodec"):
        CodecChain((zstd,), BytesLayout(), ())
    assert CodecChain((Transpose((1, 0)),), BytesLayout(), (zstd,)).order == "F"
