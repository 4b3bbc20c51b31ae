"""Bounded decoding: a chunk that inflates past what its array declares is refused before
the inflated bytes are allocated; legitimate chunks (filters that change the dtype, data
that does not compress) still decode."""

from __future__ import annotations

import gzip
import platform
import tracemalloc
import zlib

import numcodecs
import numpy as np
import pytest

from zarrfs.codecs import bounded
from zarrfs.codecs import chain as codecs
from zarrfs.errors import CorruptChunk
from zarrfs.formats.v2 import v2_chain
from zarrfs.formats.v3 import v3_chain

from support import bombs

SHAPE = (32, 32)  # float64: 8 KiB decoded
DTYPE = np.dtype("<f8")
FILL = np.zeros((), DTYPE)
# What a refused decode may allocate at its peak: far below the bomb's BOMB_BYTES (the
# bounded decoders hold at most the chunk's bound; the rest is the bomb's own bytes).
PEAK_MAX_BYTES = 8 << 20


def _decode_peak(chain, data):
    """The decode's outcome and the peak of memory traced (Python and numpy allocations) meanwhile."""
    tracemalloc.start()
    try:
        try:
            out = chain.decode(data, SHAPE, DTYPE, FILL)
        except CorruptChunk as e:
            out = e
        return out, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("codec_id", bombs.COMPRESSORS)
def test_bomb_refused_before_inflating(codec_id):
    chain = v2_chain({"id": codec_id}, None, "C", "test")
    out, peak = _decode_peak(chain, bombs.bomb(codec_id))
    assert isinstance(out, CorruptChunk), f"{codec_id}: decoded to {getattr(out, 'shape', out)}"
    assert "more than the 8192 expected" in str(out), str(out)
    assert peak < PEAK_MAX_BYTES, f"{codec_id}: {peak} bytes allocated to refuse the bomb"


def test_zstd_frame_without_declared_size_is_bounded():
    chain = v2_chain({"id": "zstd"}, None, "C", "test")
    out, peak = _decode_peak(chain, bombs.zstd_without_size(bombs.bomb("zstd")))
    assert isinstance(out, CorruptChunk) and "more than" in str(out), str(out)
    assert peak < PEAK_MAX_BYTES
    # A legitimate frame without a size still decodes, to exactly its bytes.
    value = np.random.default_rng(1).random(SHAPE)
    frame = bytes(numcodecs.Zstd(level=1).encode(np.zeros(4 << 20, np.uint8)))  # large: 4-byte size field
    small = bombs.zstd_without_size(frame)
    big_chain = v2_chain({"id": "zstd"}, None, "C", "test")
    got = big_chain.decode(small, (4 << 20,), np.dtype("u1"), np.zeros((), "u1"))
    assert got.shape == (4 << 20,) and not got.any()
    assert np.array_equal(chain.decode(numcodecs.Zstd().encode(value), SHAPE, DTYPE, FILL), value)


def test_v3_chain_bounds_each_step():
    """zstd then crc32c (v3): the checksum step passes, the compressor is bounded by the chunk."""
    chain = v3_chain(
        [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "zstd"}, {"name": "crc32c"}], 2, "test"
    )
    data = numcodecs.get_codec({"id": "crc32c"}).encode(np.frombuffer(bombs.bomb("zstd"), np.uint8))
    out, peak = _decode_peak(chain, bytes(data))
    assert isinstance(out, CorruptChunk) and "8192" in str(out), str(out)
    assert peak < PEAK_MAX_BYTES


@pytest.mark.parametrize("codec_id", bombs.COMPRESSORS)
def test_incompressible_chunks_decode_within_the_bounds(codec_id):
    value = np.random.default_rng(2).random(SHAPE)
    chain = v2_chain({"id": codec_id}, None, "C", "test")
    encoded = chain.encode(value, FILL)
    assert len(encoded) <= chain.max_encoded_nbytes(SHAPE, DTYPE)
    assert np.array_equal(chain.decode(encoded, SHAPE, DTYPE, FILL), value)


def test_filters_that_change_sizes_keep_their_bounds():
    """A filter that widens the dtype (float32 stored as float64) before zlib: its chunks are
    legitimately twice the decoded size, and a gzip member appended twice still decodes."""
    value = np.random.default_rng(3).random(SHAPE).astype("<f4")
    filters = [{"id": "astype", "encode_dtype": "<f8", "decode_dtype": "<f4"}, {"id": "delta", "dtype": "<f8"}]
    chain = v2_chain({"id": "zlib", "level": 1}, filters, "C", "test")
    encoded = chain.encode(value, np.zeros((), "<f4"))
    assert chain.max_encoded_nbytes(SHAPE, np.dtype("<f4")) >= len(encoded) > value.nbytes
    assert np.array_equal(chain.decode(encoded, SHAPE, np.dtype("<f4"), np.zeros((), "<f4")), value)
    gz = v2_chain({"id": "gzip"}, None, "C", "test")
    half = numcodecs.GZip().encode(np.ascontiguousarray(value[:16]))
    two_members = bytes(half) + bytes(numcodecs.GZip().encode(np.ascontiguousarray(value[16:])))
    assert np.array_equal(gz.decode(two_members, SHAPE, np.dtype("<f4"), np.zeros((), "<f4")), value)


def test_truncated_streams_are_corrupt():
    value = np.random.default_rng(4).random(SHAPE)
    for codec_id in ("zlib", "gzip", "bz2", "lzma"):
        chain = v2_chain({"id": codec_id}, None, "C", "test")
        encoded = chain.encode(value, FILL)
        with pytest.raises(Exception):  # noqa: B017 (whichever error the codec raises)
            chain.decode(encoded[: len(encoded) // 2], SHAPE, DTYPE, FILL)


@pytest.mark.skipif(platform.machine() not in ("x86_64", "aarch64", "AMD64"), reason="isal has wheels there only")
def test_gzip_and_zlib_chunks_inflate_with_isal_as_the_stdlib_does():
    """The package's own dependencies bring ISA-L's inflate (2.2x zlib's) where it has wheels;
    its output equals the standard library's for one member, members with zero padding after
    them, and trailing bytes that are not a member (numcodecs' GZip decodes those so)."""
    assert bounded.inflate_lib.__name__ == "isal.isal_zlib"
    value = np.random.default_rng(5).integers(0, 50, SHAPE).astype(DTYPE)
    raw = value.tobytes()
    gz = v2_chain({"id": "gzip"}, None, "C", "test")
    zl = v2_chain({"id": "zlib", "level": 1}, None, "C", "test")
    half = len(raw) // 2
    cases = [
        (gz, gzip.compress(raw, 1)),
        (zl, zlib.compress(raw, 1)),
        (gz, gzip.compress(raw[:half], 1) + gzip.compress(raw[half:], 9) + bytes(64)),
        (gz, gzip.compress(raw, 1) + b"not a member"),
    ]
    for chain, data in cases:
        expected = gzip.decompress(data.removesuffix(b"not a member")) if chain is gz else zlib.decompress(data)
        assert expected == raw
        assert chain.decode(data, SHAPE, DTYPE, FILL).tobytes() == expected


@pytest.mark.parametrize(
    "compressor",
    [
        {"id": "blosc", "cname": "lz4", "clevel": 5, "shuffle": 1},
        {"id": "blosc", "cname": "zstd", "clevel": 3, "shuffle": 2},
        {"id": "zstd", "level": 1},
    ],
)
@pytest.mark.parametrize("order", ["C", "F"])
def test_chunks_decode_into_a_given_buffer_as_numcodecs_decodes_them(compressor, order):
    """A lone blosc or zstd compressor decodes into a buffer of the chunk's size (engine/spares.py
    reuses them); the values equal what numcodecs itself encoded. A buffer of another size is
    not used, and a bomb is still refused before its bytes are produced."""
    value = np.random.default_rng(4).standard_normal(SHAPE).astype(DTYPE)
    codec = numcodecs.get_codec(dict(compressor))
    stored = codec.encode(np.ascontiguousarray(value) if order == "C" else np.asfortranarray(value).T.copy())
    chain = v2_chain(dict(compressor), None, order, "test")
    assert codecs.decodes_into(chain)
    out = np.zeros(value.nbytes, np.uint8)
    got = chain.decode(stored, SHAPE, DTYPE, FILL, out=out)
    assert np.array_equal(got, value) and got.base is out
    other = np.zeros(value.nbytes + 8, np.uint8)
    got = chain.decode(stored, SHAPE, DTYPE, FILL, out=other)
    assert np.array_equal(got, value) and not np.shares_memory(got, other)
    with pytest.raises(CorruptChunk):
        chain.decode(bombs.bomb(compressor["id"]), SHAPE, DTYPE, FILL, out=out)


def test_only_a_lone_blosc_or_zstd_compressor_decodes_into_a_buffer():
    assert not codecs.decodes_into(v2_chain({"id": "gzip", "level": 1}, None, "C", "test"))
    assert not codecs.decodes_into(v2_chain({"id": "zstd", "level": 1}, [{"id": "delta", "dtype": "<f8"}], "C", "test"))
    assert not codecs.decodes_into(v2_chain(None, None, "C", "test"))
    assert not codecs.decodes_into(
        v3_chain(
            [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "zstd"}, {"name": "crc32c"}], 2, "test"
        )
    )


def test_gzip_chunks_that_are_zlib_streams_decode_bounded_and_are_said_once(caplog):
    """An early writer stored zlib streams under the id `gzip`: each such chunk reads as zlib
    (zlib's own header detection agrees), its bomb is refused as a zlib bomb is, the array's
    document is named once in the log, and what is written is real gzip again."""
    value = np.random.default_rng(6).integers(0, 50, SHAPE).astype(DTYPE)
    raw = value.tobytes()
    chain = v2_chain({"id": "gzip", "level": 1}, None, "C", "a/.zarray")
    with caplog.at_level("WARNING", logger="zarrfs.codecs.adapters"):
        for level in (1, 6, 9, 0):  # headers 78 01, 78 9c, 78 da, 78 01
            data = zlib.compress(raw, level)
            assert zlib.decompressobj(32 + zlib.MAX_WBITS).decompress(data) == raw
            assert chain.decode(data, SHAPE, DTYPE, FILL).tobytes() == raw
    said = [r.getMessage() for r in caplog.records if "zlib" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith("a/.zarray: "), said
    with caplog.at_level("WARNING", logger="zarrfs.codecs.adapters"):  # its document parsed again (a refresh)
        again = v2_chain({"id": "gzip", "level": 1}, None, "C", "a/.zarray")
        assert again.decode(zlib.compress(raw), SHAPE, DTYPE, FILL).tobytes() == raw
    assert [r.getMessage() for r in caplog.records if "zlib" in r.getMessage()] == said
    assert chain.bytes_bytes[0].decode(zlib.compress(raw)) == raw  # the unbounded path (vlen scans)
    assert gzip.decompress(chain.encode(value, FILL)) == raw
    out, peak = _decode_peak(chain, bombs.bomb("zlib"))
    assert isinstance(out, CorruptChunk) and "more than the 8192 expected" in str(out), out
    assert peak < PEAK_MAX_BYTES
