"""Byte ranges of a chunk decoded without decoding all of it (rangedecode.py), and reads of
chunks larger than the cache through the engine (engine/streamed.py).

Chunks are encoded by numcodecs and zarr-python; the values expected are numpy's."""

from __future__ import annotations

import bz2
import gc
import gzip
import io
import logging
import lzma
import threading
import zlib

import numcodecs
import numpy as np
import pytest
import trio
import trio.testing
import zarr

from zarrfs.codecs import rangedecode
from zarrfs.codecs.adapters import BytesBytes
from zarrfs.codecs.chain import BytesLayout, CodecChain
from zarrfs.engine import Engine, EngineConfig
from zarrfs.engine.cache import ChunkCache
from zarrfs.errors import CorruptChunk, StoreError
from zarrfs.formats import open_hierarchy_sync
from zarrfs.storage.store import Store
from zarrfs.views.streams import ArrayStream

from support.core import np_save_bytes

CODECS = {
    "zstd": {"id": "zstd", "level": 1},
    "zlib": {"id": "zlib", "level": 1},
    "gzip": {"id": "gzip", "level": 1},
    "bz2": {"id": "bz2", "level": 1},
    "lzma": {"id": "lzma", "preset": 1},
    "blosc-lz4": {"id": "blosc", "cname": "lz4", "clevel": 5, "shuffle": 1, "blocksize": 0},
    "blosc-zstd-bitshuffle": {"id": "blosc", "cname": "zstd", "clevel": 1, "shuffle": 2, "blocksize": 4096},
    "blosc-stored": {"id": "blosc", "cname": "lz4", "clevel": 0, "shuffle": 0},
}


def chain_of(config: dict, order: str = "C") -> CodecChain:
    codec = numcodecs.get_codec(config)
    return CodecChain(array_bytes=BytesLayout(None, order), bytes_bytes=(BytesBytes(codec, config["id"]),))


class Fetches:
    """A chunk's encoded bytes, counting what was read of them."""

    def __init__(self, raw: bytes) -> None:
        self.raw, self.nbytes = raw, 0

    def __call__(self, a: int, b: int) -> bytes:
        data = self.raw[a:b]
        self.nbytes += len(data)
        return data


def copy_box(dec, shape, dtype, order, box) -> np.ndarray:
    target = np.zeros(tuple(b.stop - b.start for b in box), dtype)
    pieces = rangedecode.chunk_pieces(shape, dtype, order, [box])
    k = 0
    while k < len(pieces):
        k = rangedecode.fill_sync(dec, pieces, [target], dtype, k, 1 << 16)
    return target


@pytest.mark.parametrize("name", CODECS)
@pytest.mark.parametrize("dtype,order", [("<u2", "C"), (">f8", "F"), ("u1", "C")])
def test_boxes_of_a_chunk_equal_numpy_s(name, dtype, order):
    """Random boxes of a 3-d chunk, in any order (decoders started again, or continued), C or F
    layout, any byte order: the values numpy holds."""
    rng = np.random.default_rng(1)
    shape = (300, 70, 9)
    values = ((np.arange(np.prod(shape)) % 251) + rng.integers(0, 3, np.prod(shape))).astype(dtype).reshape(shape)
    chain = chain_of(CODECS[name])
    raw = bytes(chain.bytes_bytes[0].codec.encode(np.ravel(values, order=order)))
    assert rangedecode.supported(chain)
    dec = rangedecode.decoder(chain, values.nbytes, Fetches(raw), "k")
    for _ in range(12):
        box = tuple(
            slice(int(a), int(a) + int(rng.integers(1, n - a + 1))) for n in shape for a in [rng.integers(0, n)]
        )
        assert (copy_box(dec, shape, values.dtype, order, box) == values[box]).all(), box


def test_pieces_cover_a_box_once_within_the_span():
    """`regions` cuts a large box into pieces of at most SPAN_BYTES that cover it exactly."""
    shape, box = (64, 3000, 40), (slice(3, 61), slice(10, 2990), slice(1, 39))
    for order in "CF":
        seen = np.zeros(tuple(b.stop - b.start for b in box), np.int64)
        pieces = rangedecode.regions(shape, 8, order, box)
        assert len(pieces) > 1 and [p[0] for p in pieces] == sorted(p[0] for p in pieces)
        for lo, hi, _pshape, _, part in pieces:
            assert hi - lo <= rangedecode.SPAN_BYTES
            seen[part] += 1
        assert (seen == 1).all()


@pytest.mark.parametrize("name", ["zstd", "zlib", "gzip", "bz2", "lzma"])
def test_a_small_read_decodes_only_the_stream_up_to_it(name):
    """4 KiB at 3 MiB of an 8 MiB chunk decodes its stream up to there (and a step), not the
    rest; a sequential reader after it continues the stream, each byte decoded once."""
    nbytes = 8 << 20
    values = np.resize(np.arange(251, dtype=np.uint8), nbytes)
    chain = chain_of(CODECS[name])
    dec = rangedecode.decoder(chain, nbytes, Fetches(bytes(chain.bytes_bytes[0].codec.encode(values))), "k")
    at = 3 << 20
    got = copy_box(dec, (nbytes,), np.dtype("u1"), "C", (slice(at, at + 4096),))
    assert (got == values[at : at + 4096]).all()
    assert at + 4096 <= dec.decoded <= at + 4096 + rangedecode.OUT_STEP_BYTES
    for a in range(at + 4096, at + (4 << 20), 1 << 20):
        got = copy_box(dec, (nbytes,), np.dtype("u1"), "C", (slice(a, a + (1 << 20)),))
        assert (got == values[a : a + (1 << 20)]).all()
    assert dec.decoded <= at + (4 << 20) + rangedecode.OUT_STEP_BYTES


def test_a_small_read_of_blosc_decodes_only_its_blocks():
    """4 KiB at 40 MiB of a 64 MiB blosc chunk reads and decodes only the block holding it (and
    reads the table of block starts), not the chunk."""
    nbytes = 64 << 20
    rng = np.random.default_rng(2)
    values = rng.integers(0, 4, nbytes, dtype=np.uint8)  # (blocks of real size when compressed)
    codec = numcodecs.Blosc(cname="lz4", clevel=5, shuffle=0, blocksize=1 << 20)
    raw = bytes(codec.encode(values))
    fetch = Fetches(raw)
    dec = rangedecode.decoder(chain_of(codec.get_config()), nbytes, fetch, "k")
    at = 40 << 20
    got = copy_box(dec, (nbytes,), np.dtype("u1"), "C", (slice(at + 100, at + 100 + 4096),))
    assert (got == values[at + 100 : at + 100 + 4096]).all()
    assert dec.nblocks >= 64 and dec.decoded == dec.blocksize
    table = 16 + 4 * dec.nblocks
    assert fetch.nbytes <= table + 2 * len(raw) // dec.nblocks


def test_concatenated_gzip_members_and_a_truncated_stream():
    """gzip and bz2 streams one after another decode as the one-shot functions do; a stream cut
    short is a CorruptChunk naming the chunk."""
    values = np.arange(1 << 16, dtype="<u4")
    data = values.tobytes()
    half = len(data) // 2
    for config, raw in [
        (CODECS["gzip"], gzip.compress(data[:half]) + gzip.compress(data[half:])),
        (CODECS["bz2"], bz2.compress(data[:half]) + bz2.compress(data[half:])),
    ]:
        dec = rangedecode.decoder(chain_of(config), len(data), Fetches(raw), "chunk a/0")
        assert (copy_box(dec, values.shape, values.dtype, "C", (slice(0, len(values)),)) == values).all()
        cut = rangedecode.decoder(chain_of(config), len(data), Fetches(raw[: len(raw) // 4]), "chunk a/0")
        with pytest.raises(CorruptChunk, match="chunk a/0"):
            copy_box(cut, values.shape, values.dtype, "C", (slice(0, len(values)),))


def test_gzip_chunks_that_are_zlib_streams_read_a_range_at_a_time(caplog):
    """A `gzip` chunk that an early writer stored as a zlib stream reads as zlib, a range at a
    time as whole, and the array's document is named in one log line saying so."""
    values = np.arange(1 << 18, dtype="<u4")
    raw = zlib.compress(values.tobytes())
    codec = numcodecs.get_codec(CODECS["gzip"])
    chain = CodecChain(array_bytes=BytesLayout(None, "C"), bytes_bytes=(BytesBytes(codec, "gzip", "r/.zarray"),))
    with caplog.at_level(logging.WARNING):
        for _ in range(2):
            dec = rangedecode.decoder(chain, values.nbytes, Fetches(raw), "chunk a/0")
            assert (copy_box(dec, values.shape, values.dtype, "C", (slice(1000, 5000),)) == values[1000:5000]).all()
    assert [r.getMessage() for r in caplog.records if "zlib" in r.getMessage()] == [
        "r/.zarray: its gzip chunks are zlib streams (as an early writer stored them): read as zlib; "
        "chunks written here are gzip"
    ]


def test_chains_that_cannot_be_decoded_a_range_at_a_time():
    assert not rangedecode.supported(chain_of({"id": "lz4"}))
    two = CodecChain(bytes_bytes=(BytesBytes(numcodecs.Shuffle(4), "shuffle"), BytesBytes(numcodecs.Zstd(), "zstd")))
    assert not rangedecode.supported(two)


@pytest.mark.parametrize("compressor", [numcodecs.Zstd(level=1), numcodecs.Blosc(cname="lz4", clevel=5, shuffle=1)])
@pytest.mark.parametrize("order", ["C", "F"])
async def test_reads_of_chunks_larger_than_the_cache_decode_ranges(tmp_path, compressor, order):
    """Through the engine, an array of chunks larger than the cache (narrower than the array,
    so each read touches several): reads of the .npy and of the F view equal np.save's bytes, a
    4 KiB read decodes at most its stream prefix (zstd) or its blocks (blosc), no chunk is
    decoded whole, and nothing enters the cache."""
    path = str(tmp_path / "s")
    values = (np.arange(512 * 8192, dtype="<i4") % 1009).reshape(512, 8192)
    arr = zarr.create_array(
        store=path,
        zarr_format=2,
        shape=values.shape,
        chunks=(256, 2048),
        dtype="<i4",
        compressors=compressor,
        order=order,
        fill_value=0,
    )
    arr[:] = values
    arr[:, 6144:] = 0  # (the last column of chunks: not stored)
    values[:, 6144:] = 0
    meta = open_hierarchy_sync(Store(path)).node_sync("")
    engine = Engine(Store(path), ChunkCache(64 << 10))
    chunk_nbytes = 256 * 2048 * 4
    for view in ("C", "F"):
        stream = ArrayStream(meta, order=view)
        assert engine.streamed(stream)
        want = np_save_bytes(np.asfortranarray(values) if view == "F" else values)
        got = bytearray()
        for at in range(0, stream.size, 1 << 20):
            got += await engine.read(stream, at, 1 << 20)
        assert bytes(got) == want
    engine = Engine(Store(path), ChunkCache(64 << 10))  # (no decoder left by the reads above)
    stream = ArrayStream(meta)
    at = len(stream.header) + (256 + 20) * 8192 * 4 + 4 * 10  # row 276, column 10: chunk (1, 0), its row 20
    assert bytes(await engine.read(stream, at, 4096)) == values.tobytes()[at - len(stream.header) :][:4096]
    decoded = engine.counters["bytes_decoded"]
    if order == "C":
        assert 0 < decoded <= (20 * 2048 + 10) * 4 + 4096 + rangedecode.OUT_STEP_BYTES
        assert decoded < chunk_nbytes // 2
    else:
        assert 0 < decoded <= chunk_nbytes
    assert engine.counters["oversize_loads"] == 0 and engine.cache.used_bytes == 0
    assert engine.cache.oversize_held == 0


def one_zstd_chunk(tmp_path, rows: int, cols: int):
    """(store path, values, ArrayMeta) of a v2 uint8 array of ROWS x COLS in one zstd chunk,
    written by zarr-python."""
    path = str(tmp_path / "s")
    values = np.resize(np.arange(251, dtype=np.uint8), rows * cols).reshape(rows, cols)
    zarr.create_array(
        store=path,
        zarr_format=2,
        shape=values.shape,
        chunks=values.shape,
        dtype="u1",
        compressors=numcodecs.Zstd(level=1),
    )[:] = values
    return path, values, open_hierarchy_sync(Store(path)).node_sync("")


async def test_a_discarded_array_gives_back_its_decoders_memory(tmp_path):
    """After an array is discarded (replaced or removed), its idle decoders no longer count against
    the decoders' memory budget, so later streamed reads are not refused room."""
    path, values, meta = one_zstd_chunk(tmp_path, 1024, 4096)
    engine = Engine(Store(path), ChunkCache(64 << 10))
    stream = ArrayStream(meta)
    assert engine.streamed(stream)
    assert bytes(await engine.read(stream, len(stream.header), 4096)) == values.tobytes()[:4096]
    assert engine.streams.held_bytes > 0  # an idle decoder, kept for the next read
    engine.discard(meta.path)
    assert engine.streams.held_bytes == 0


async def test_readers_of_one_chunk_at_once_share_its_stream(tmp_path):
    """Four readers of a chunk larger than the cache reading it sequentially at once get its
    bytes, and its stream is decoded about once, not once per reader (a reader following
    another continues its stream)."""
    path, values, meta = one_zstd_chunk(tmp_path, 1024, 16384)
    engine = Engine(Store(path), ChunkCache(1 << 20))
    stream = ArrayStream(meta)
    want = np_save_bytes(values)
    got = [bytearray() for _ in range(4)]
    step = 1 << 20

    async def reader(i: int) -> None:
        for at in range(0, stream.size, step):
            got[i] += await engine.read(stream, at, step)

    async with trio.open_nursery() as nursery:
        for i in range(4):
            nursery.start_soon(reader, i)
    assert all(bytes(g) == want for g in got)
    assert engine.counters["bytes_decoded"] <= 2 * values.nbytes


@pytest.mark.parametrize("compressor", ["gzip", "blosc"])
async def test_v3_chunks_larger_than_the_cache_big_endian(tmp_path, compressor):
    """A v3 array (big-endian `bytes`, then gzip or blosc, as zarr-python writes them) of chunks
    larger than the cache reads equal to np.save's bytes, a range at a time."""
    from zarr.codecs import BloscCodec, BytesCodec, GzipCodec

    path = str(tmp_path / "s")
    values = (np.arange(300 * 500, dtype=">i8") % 977).reshape(300, 500)
    codec = GzipCodec(level=1) if compressor == "gzip" else BloscCodec(cname="lz4", clevel=0, shuffle="shuffle")
    arr = zarr.create_array(
        store=path,
        zarr_format=3,
        shape=values.shape,
        chunks=(200, 200),
        dtype=">i8",
        serializer=BytesCodec(endian="big"),
        compressors=codec,
    )
    arr[:] = values
    meta = open_hierarchy_sync(Store(path)).node_sync("")
    engine = Engine(Store(path), ChunkCache(64 << 10))
    stream = ArrayStream(meta)
    assert engine.streamed(stream)
    got = bytearray()
    for at in range(0, stream.size, 65536):
        got += await engine.read(stream, at, 65536)
    assert bytes(got) == np_save_bytes(values.astype(meta.dtype))
    assert engine.cache.oversize_held == 0


@pytest.mark.parametrize("compressor", [numcodecs.Zstd(level=1), numcodecs.GZip(level=1), numcodecs.Blosc()])
async def test_a_damaged_chunk_larger_than_the_cache_fails_only_its_reads(tmp_path, compressor):
    """A chunk cut short, or of bytes that are no stream, fails the reads that need it with a
    CorruptChunk naming its key; the other chunk stays readable."""
    path = tmp_path / "s"
    values = (np.arange(256 * 512, dtype="<i4") % 1013).reshape(256, 512)
    arr = zarr.create_array(
        store=str(path), zarr_format=2, shape=values.shape, chunks=(128, 512), dtype="<i4", compressors=compressor
    )
    arr[:] = values
    raw = (path / "0.0").read_bytes()
    meta = open_hierarchy_sync(Store(str(path))).node_sync("")
    stream = ArrayStream(meta)
    row = 128 * 512 * 4
    for damaged in (raw[: len(raw) // 2], raw[:16] + bytes(range(256)) * 4):
        (path / "0.0").write_bytes(damaged)
        engine = Engine(Store(str(path)), ChunkCache(64 << 10))
        assert engine.streamed(stream)
        with pytest.raises(CorruptChunk, match="0.0"):
            await engine.read(stream, len(stream.header) + row - 8192, 4096)
        got = await engine.read(stream, len(stream.header) + row, 4096)
        assert bytes(got) == values.tobytes()[row : row + 4096]


async def test_a_reader_of_a_wide_row_of_chunks_continues_every_stream(tmp_path):
    """An array whose row of chunks holds 12 chunks larger than the cache, read sequentially in
    reads that touch every one of them: each chunk's stream is continued, not started again at
    every read (the array decoded about once, not once per read)."""
    path = str(tmp_path / "s")
    values = (np.arange(512 * 12 * 1024, dtype=np.int64) % 253).astype(np.uint8).reshape(512, 12 * 1024)
    arr = zarr.create_array(
        store=path,
        zarr_format=2,
        shape=values.shape,
        chunks=(512, 1024),
        dtype="u1",
        compressors=numcodecs.Zstd(level=1),
    )
    arr[:] = values
    meta = open_hierarchy_sync(Store(path)).node_sync("")
    engine = Engine(Store(path), ChunkCache(64 << 10))
    stream = ArrayStream(meta)
    got = bytearray()
    for at in range(0, stream.size, 65536):
        got += await engine.read(stream, at, 65536)
    assert bytes(got) == np_save_bytes(values)
    assert engine.counters["bytes_decoded"] <= values.nbytes * 1.25


def _rss_bytes(field: str = "VmRSS") -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) << 10 for line in f if line.startswith(field + ":"))


async def test_decoders_of_frames_with_the_largest_window_stay_within_the_memory_bound(tmp_path):
    """Six chunks, each one zstd frame of the largest window allowed (128 MiB, no content size
    stated: its decoder allocates the whole window), read at their end one after the other,
    then four of them by four readers at once: the daemon's decoders together keep, and take
    at their peak, less than the budget the README states, not one window per decoder (768
    MiB), and every read equals the chunk's bytes."""
    import zstandard

    path = tmp_path / "s"
    nbytes = 128 << 20
    data = np.resize(np.arange(251, dtype=np.uint8), nbytes)
    params = zstandard.ZstdCompressionParameters.from_level(1, window_log=27, write_content_size=False)
    frame = zstandard.ZstdCompressor(compression_params=params).compress(data.tobytes())
    assert zstandard.get_frame_parameters(frame).window_size == nbytes
    tail = data[-4096:].tobytes()
    del data
    zarr.create_array(
        store=str(path),
        zarr_format=2,
        shape=(6 * nbytes,),
        chunks=(nbytes,),
        dtype="u1",
        compressors=numcodecs.Zstd(level=1),
        fill_value=0,
    )
    for i in range(6):
        (path / str(i)).write_bytes(frame)
    meta = open_hierarchy_sync(Store(str(path))).node_sync("")
    engine = Engine(Store(str(path)), ChunkCache(64 << 10))
    stream = ArrayStream(meta)
    assert engine.streamed(stream)
    before = _rss_bytes()
    for i in range(6):
        got = await engine.read(stream, len(stream.header) + (i + 1) * nbytes - 4096, 4096)
        assert bytes(got) == tail
    assert _rss_bytes() - before < 200 << 20
    # Four readers at once of four such chunks: the peak, not only what is kept, stays bounded.
    engine.drop_streams()
    gc.collect()
    before = _rss_bytes()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # (the peak starts again from now)
    got = {}

    async def reader(i: int) -> None:
        got[i] = bytes(await engine.read(stream, len(stream.header) + (i + 1) * nbytes - 4096, 4096))

    async with trio.open_nursery() as nursery:
        for i in range(4):
            nursery.start_soon(reader, i)
    assert got == {i: tail for i in range(4)}
    assert _rss_bytes("VmHWM") - before < 200 << 20


@pytest.mark.parametrize("fmt", ["xz", "alone"])
@pytest.mark.parametrize("preset, dict_bytes", [(1, 1 << 20), (6, 8 << 20), (9, 64 << 20)])
def test_an_lzma_decoder_counts_the_dictionary_its_header_states(fmt, preset, dict_bytes):
    """The dictionary an lzma chunk's decoder holds is read from its header (xz: the first
    block's LZMA2 filter; .lzma: its header), as xz's presets define it."""
    config = {"id": "lzma", "preset": preset, "format": lzma.FORMAT_XZ if fmt == "xz" else lzma.FORMAT_ALONE}
    raw = numcodecs.get_codec(config).encode(np.arange(1 << 16, dtype="<u4"))
    assert rangedecode.decoder_limit(chain_of(config), raw[: rangedecode.HEAD_BYTES], "chunk a/0") == dict_bytes


class HeldRangeStore(Store):
    """A store whose ranged reads past a chunk's first 64 bytes (its header) wait while `hold` is clear."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.hold = threading.Event()
        self.hold.set()

    def get_range_sync(self, key: str, start: int, end: int) -> bytes:
        if end > 64:
            self.hold.wait()
        return super().get_range_sync(key, start, end)


def _chunked_array(path: str, nchunks: int) -> np.ndarray:
    values = np.arange(nchunks * 65536, dtype="<u4")
    arr = zarr.create_array(
        store=path,
        zarr_format=2,
        shape=values.shape,
        chunks=(65536,),
        dtype="<u4",
        compressors=numcodecs.Zstd(level=1),
        fill_value=0,
    )
    arr[:] = values
    return values


async def test_a_chunk_written_while_its_read_waits_for_a_decoder_reads_as_written(tmp_path):
    """Six reads hold every decoder (their store reads wait); a seventh read waits for one,
    and meanwhile its chunk is written whole: once a decoder is free, it reads the bytes written,
    not the store's older ones."""
    path = str(tmp_path / "s")
    values = _chunked_array(path, 7)
    store = HeldRangeStore(path)
    meta = open_hierarchy_sync(store).node_sync("")
    engine = Engine(store, ChunkCache(64 << 10))
    stream = ArrayStream(meta)
    assert engine.streamed(stream)
    row = 65536 * 4
    at = len(stream.header)
    new = np.full(65536, 7, "<u4")
    got: dict[int, bytes] = {}

    async def read(i: int) -> None:
        got[i] = bytes(await engine.read(stream, at + i * row, 4096))

    store.hold.clear()
    async with trio.open_nursery() as nursery:
        for i in range(6):
            nursery.start_soon(read, i)
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(read, 6)
        await trio.testing.wait_all_tasks_blocked()
        await engine.write(stream, at + 6 * row, new.tobytes())
        store.hold.set()
    assert got[6] == new.tobytes()[:4096]
    assert all(got[i] == values[i * 65536 :].tobytes()[:4096] for i in range(6))


async def test_a_decoder_whose_read_timed_out_counts_until_its_worker_ends(tmp_path):
    """A read that timed out while its worker thread decodes (held in the store) gives its
    decoder back only once that thread ended: until then it counts against the pool and the
    decoders' memory."""
    path = str(tmp_path / "s")
    values = _chunked_array(path, 2)
    store = HeldRangeStore(path)
    meta = open_hierarchy_sync(store).node_sync("")
    engine = Engine(store, ChunkCache(64 << 10), EngineConfig(timeout_s=0.5))
    stream = ArrayStream(meta)
    store.hold.clear()
    with pytest.raises(StoreError, match="timeout"):
        await engine.read(stream, len(stream.header), 4096)
    assert engine.streams.in_use == 1 and engine.streams.held_bytes > 0
    store.hold.set()
    with trio.fail_after(30):  # (the worker ends once the store answers)
        while engine.streams.in_use:
            await trio.sleep(0.01)
    assert engine.streams.held_bytes == 0
    row = 65536 * 4
    assert bytes(await engine.read(stream, len(stream.header) + row, 4096)) == values[65536:].tobytes()[:4096]


@pytest.mark.parametrize("by", ["rows", "pixels"])
async def test_a_preview_of_a_chunk_larger_than_the_cache_reads_only_its_pixels(tmp_path, monkeypatch, by):
    """A preview of an array of one 128 MiB chunk (more than the cache and than a preview's
    budget) equals numpy's picture of the picked pixels, read by rows or pixel by pixel, and no
    chunk is decoded whole: the process does not grow by the chunk."""
    from PIL import Image

    from zarrfs.views import preview, preview_cache
    from zarrfs.views.preview_cache import PreviewCache

    from support.oracles import numpy_grey

    if by == "pixels":
        monkeypatch.setattr(preview_cache, "ROWS_MAX_BYTES", 0)

    path = str(tmp_path / "s")
    h, w = 4096, 8192

    def formula(r, c):
        return ((r * 7 + c * 3) % 1001).astype("<f4")

    arr = zarr.create_array(
        store=path,
        zarr_format=2,
        shape=(h, w),
        chunks=(h, w),
        dtype="<f4",
        compressors=numcodecs.Zstd(level=1),
        fill_value=0,
    )
    arr[:] = formula(np.arange(h)[:, None], np.arange(w)[None, :])
    meta = open_hierarchy_sync(Store(path)).node_sync("")
    engine = Engine(Store(path), ChunkCache(1 << 20))
    p = preview.plan(meta)
    assert p.rows is not None and len(p.chunks) == 1
    before = _rss_bytes()
    data = await PreviewCache(engine).get(meta)
    assert _rss_bytes() - before < 64 << 20
    assert engine.counters["oversize_loads"] == 0 and engine.counters["previews"] == 1
    want = numpy_grey(formula(p.rows[:, None], p.cols[None, :]).astype("f8"))
    got = np.asarray(Image.open(io.BytesIO(data)))
    np.testing.assert_array_equal(got, want)
