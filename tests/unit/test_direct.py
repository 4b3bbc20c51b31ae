"""Direct reads (zarrfs.engine.fastpath.direct): bytes copied from uncompressed chunk files equal numpy's np.save
bytes, on tmpfs and on a disk."""

import io
import os
import tempfile
from concurrent.futures import ThreadPoolExecutor
from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zarrfs import grid
from zarrfs.codecs.chain import BytesLayout, CodecChain
from zarrfs.engine.fastpath import direct
from zarrfs.model import ArrayMeta
from zarrfs.storage.keys import ChunkKeys
from zarrfs.storage.store import Store
from zarrfs.views.streams import ArrayStream

DTYPES = ["|u1", "<i2", "<f8", "|S3", [("a", "<i2"), ("b", "|u1")]]
# tmpfs (read in the trio thread) and the disk the repo is on (RWF_NOWAIT, else a worker thread)
ROOTS = ["/dev/shm", None]


def write_store(
    root: str, arr: np.ndarray, chunks: tuple, missing: frozenset = frozenset(), order: str = "C"
) -> ArrayMeta:
    """Chunk files of ARR as a v2 writer lays them out (ORDER, edge chunks padded with junk)."""
    meta = ArrayMeta(
        path="a",
        shape=arr.shape,
        dtype=arr.dtype,
        chunk_shape=chunks,
        fill_value=np.zeros((), arr.dtype),
        codec=CodecChain(array_bytes=BytesLayout(endian=None, order=order)),
        keys=ChunkKeys("a"),
        attributes={},
        format="v2",
        metadata_key="a/.zarray",
    )
    os.makedirs(os.path.join(root, "a"), exist_ok=True)
    rng = np.random.default_rng(1)
    for idx in grid.all_chunks(arr.shape, chunks):
        if idx in missing:
            continue
        junk = rng.integers(0, 256, int(np.prod(chunks)) * arr.dtype.itemsize, dtype=np.uint8)
        full = junk.view(arr.dtype).reshape(chunks).copy()
        sl = grid.chunk_slices(idx, arr.shape, chunks)
        full[tuple(slice(0, s.stop - s.start) for s in sl)] = arr[sl]
        with open(os.path.join(root, meta.chunk_key(idx)), "wb") as f:
            f.write(full.tobytes(order=order))
    return meta


def np_save(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, arr)
    return buf.getvalue()


def read(reads: direct.DirectReads, stream: ArrayStream, off: int, n: int, out: np.ndarray | None = None) -> bytes:
    """Bytes [off, off+n) of STREAM read directly, into OUT (the engine reuses one buffer for
    every read of the trio thread: the reads' recipes are kept for it) or a fresh buffer."""
    plan = stream.plan(off, n)
    if out is None:
        out = np.empty(stream.element_bytes(plan), np.uint8)
    try:
        got = reads.read_sync(stream, plan, out, nowait=True)
    except direct.WouldBlock:
        got = reads.read_sync(stream, plan, out, nowait=False)
    return bytes(got)


@st.composite
def cases(draw):
    ndim = draw(st.integers(1, 4))
    shape = tuple(draw(st.lists(st.integers(1, 9), min_size=ndim, max_size=ndim)))
    chunks = tuple(draw(st.integers(1, 5)) for _ in shape)
    d = draw(st.sampled_from(DTYPES))
    dtype = np.dtype([tuple(f) for f in d] if isinstance(d, list) else d)
    seed = draw(st.integers(0, 2**32 - 1))
    raw = np.random.default_rng(seed).integers(0, 256, int(np.prod(shape)) * dtype.itemsize, dtype=np.uint8)
    return raw.view(dtype).reshape(shape), chunks, draw(st.sampled_from(ROOTS))


# Rows read into place (every row at least 0 bytes) or whole into scratch (none 4096), and
# preadv calls of at most 3 buffers, so that these small arrays take every way there is.
WAYS = [{"ROW_MIN_BYTES": 0}, {"ROW_MIN_BYTES": 4096}, {"ROW_MIN_BYTES": 0, "IOV_MAX": 3}]


@pytest.mark.parametrize("way", WAYS, ids=["in-place", "scratch", "short-iov"])
@settings(max_examples=100, deadline=None)
@given(case=cases(), data=st.data())
def test_npy_and_raw_bytes_equal_np_save(way, case, data):
    arr, chunks, root = case
    with tempfile.TemporaryDirectory(dir=root) as tmp, mock.patch.multiple(direct, **way):
        meta = write_store(tmp, arr, chunks)
        reads = direct.DirectReads(Store(tmp))
        try:
            for stream, want in (
                (ArrayStream(meta), np_save(arr)),
                (ArrayStream(meta, with_header=False), arr.tobytes()),
            ):
                assert direct.eligible(stream)
                assert read(reads, stream, 0, stream.size) == want
                reused = np.empty(stream.size + 2 * arr.dtype.itemsize, np.uint8)
                row = arr.shape[-1] * arr.dtype.itemsize
                for _ in range(4):
                    off = data.draw(st.integers(0, stream.size))
                    n = data.draw(st.integers(0, stream.size + 3))
                    assert read(reads, stream, off, n) == want[off : off + n]
                    # into one buffer, as the engine reads: the same read and reads whole rows
                    # further, alike but in other rows of chunk files or other rows of chunks
                    for at in (off, off, off + row, off + 2 * row, off + 7 * row):
                        assert read(reads, stream, at, n, reused) == want[at : at + n]
        finally:
            reads.close()


def test_the_recipes_kept_are_bounded_and_each_reads_its_own_bytes(tmp_path):
    """Reads of every shape into one buffer, two streams in turn: at most RECIPES kept, and
    a recipe dropped and made again reads the same bytes."""
    arr = np.random.default_rng(2).integers(0, 1 << 16, (40, 24), dtype="<u2")
    meta = write_store(str(tmp_path), arr, (7, 5))
    reads = direct.DirectReads(Store(str(tmp_path)))
    streams = [(ArrayStream(meta), np_save(arr)), (ArrayStream(meta, with_header=False), arr.tobytes())]
    reused = np.empty(len(streams[0][1]) + 4, np.uint8)
    rng = np.random.default_rng(3)
    with mock.patch.object(direct, "ROW_MIN_BYTES", 0), mock.patch.object(direct, "RECIPES", 8):
        for _ in range(300):
            stream, want = streams[rng.integers(2)]
            off, n = (int(x) for x in rng.integers(0, stream.size, 2))
            assert read(reads, stream, off, n, reused) == want[off : off + n]
            assert len(reads._recipes) <= 8
    reads.close()


def test_chunk_file_views_equal_the_chunks_np_save(tmp_path):
    arr = np.arange(7 * 5, dtype="<i2").reshape(7, 5)
    meta = write_store(str(tmp_path), arr, (3, 2))
    reads = direct.DirectReads(Store(str(tmp_path)))
    for idx in grid.all_chunks(arr.shape, (3, 2)):
        stream = ArrayStream(meta, chunk=idx)
        assert read(reads, stream, 0, stream.size) == np_save(arr[grid.chunk_slices(idx, arr.shape, (3, 2))])
    reads.close()


def test_absent_short_and_special_chunks_fall_back(tmp_path):
    arr = np.arange(16, dtype="|u1").reshape(4, 4)
    meta = write_store(str(tmp_path), arr, (2, 2), missing=frozenset({(1, 1)}))
    reads = direct.DirectReads(Store(str(tmp_path)))
    stream = ArrayStream(meta, with_header=False)
    assert read(reads, stream, 0, 8) == arr.tobytes()[:8]  # rows 0-1: chunks (0, 0), (0, 1)
    with pytest.raises(direct.Fallback):
        read(reads, stream, 8, 8)  # chunk (1, 1) is not stored: the engine's path gives the fill value
    with open(tmp_path / "a" / "0.1", "wb") as f:
        f.write(b"\0\0\0")  # short: corrupt, the engine's path says so
    with pytest.raises(direct.Fallback):
        read(direct.DirectReads(Store(str(tmp_path))), stream, 0, 8)
    os.unlink(tmp_path / "a" / "0.1")
    os.mkfifo(tmp_path / "a" / "0.1")  # never opened for reading as a file of data
    with pytest.raises(direct.Fallback):
        read(direct.DirectReads(Store(str(tmp_path))), stream, 0, 8)
    reads.close()


@pytest.mark.parametrize(
    "chain,order,why",
    [
        (CodecChain(array_bytes=BytesLayout(endian="big")), "C", "bytes stored big-endian"),
        (CodecChain(array_bytes=BytesLayout(endian=None, order="F")), "C", "F-ordered chunks"),
        (CodecChain(array_bytes=BytesLayout(endian=None)), "F", "an F-order view"),
    ],
)
def test_streams_that_are_not_a_copy_of_the_file_are_not_eligible(chain, order, why):
    meta = ArrayMeta(
        path="a",
        shape=(4, 4),
        dtype=np.dtype("<i4"),
        chunk_shape=(2, 2),
        fill_value=np.zeros((), "<i4"),
        codec=chain,
        keys=ChunkKeys("a"),
        attributes={},
        format="v2",
        metadata_key="a/.zarray",
    )
    assert not direct.eligible(ArrayStream(meta, order=order)), why


@st.composite
def transposed_cases(draw):
    shape = tuple(draw(st.lists(st.integers(1, 30), min_size=2, max_size=2)))
    chunks = tuple(draw(st.lists(st.integers(1, 9), min_size=2, max_size=2)))
    d = draw(st.sampled_from(DTYPES))
    dtype = np.dtype([tuple(f) for f in d] if isinstance(d, list) else d)
    seed = draw(st.integers(0, 2**32 - 1))
    raw = np.random.default_rng(seed).integers(0, 256, int(np.prod(shape)) * dtype.itemsize, dtype=np.uint8)
    return raw.view(dtype).reshape(shape), chunks, draw(st.sampled_from(["C", "F"]))


@settings(max_examples=100, deadline=None)
@given(case=transposed_cases(), data=st.data())
def test_rows_of_chunks_read_transposed_equal_numpy_s_bytes(case, data):
    """The F view of C-ordered chunks, and the .npy of F-ordered ones: any rows of the stream's
    chunks, read from the files through a stage of a few file rows (2 here, so that the stage
    is refilled and cut short at edge chunks), equal numpy's bytes of those rows."""
    arr, chunks, chunk_order = case
    view = "F" if chunk_order == "C" else "C"
    with (
        tempfile.TemporaryDirectory(dir="/dev/shm") as tmp,
        mock.patch.multiple(direct, TRANSPOSE_MIN_ROWS=2, TRANSPOSE_STAGE_BYTES=0, TRANSPOSE_BLOCK_BYTES=24),
    ):
        meta = write_store(tmp, arr, chunks, order=chunk_order)
        reads = direct.DirectReads(Store(tmp))
        stream = ArrayStream(meta, order=view)
        assert direct.transposed(stream) and not direct.eligible(stream)
        want = arr.tobytes(order=view)  # the stream's elements
        (s0, s1), a = stream._shape, stream._chunks[0]
        row = a * s1 * arr.dtype.itemsize  # bytes of a whole row of the stream's chunks
        k = data.draw(st.integers(0, -(-s0 // a) - 1))
        count = data.draw(st.integers(1, 3))
        out = np.full(count * row + 5, 7, np.uint8)
        got = reads.transposed_rows_sync(stream, k, count, out)
        assert bytes(got) == want[k * row : (k + count) * row]
        assert bytes(out[len(got) :]) == b"\7" * (len(out) - len(got))  # nothing written past them
        reads.close()


@pytest.mark.parametrize(
    "shape,chain,order,why",
    [
        ((4, 4), CodecChain(array_bytes=BytesLayout(endian=None)), "C", "the file's own order"),
        ((4, 4), CodecChain(array_bytes=BytesLayout(endian=None, order="F")), "F", "the file's own order"),
        ((4, 4), CodecChain(array_bytes=BytesLayout(endian="big")), "F", "bytes stored big-endian"),
        ((4, 4, 4), CodecChain(array_bytes=BytesLayout(endian=None)), "F", "three dimensions"),
    ],
)
def test_streams_that_are_not_a_transposed_copy_of_the_files(shape, chain, order, why):
    meta = ArrayMeta(
        path="a",
        shape=shape,
        dtype=np.dtype("<i4"),
        chunk_shape=(2,) * len(shape),
        fill_value=np.zeros((), "<i4"),
        codec=chain,
        keys=ChunkKeys("a"),
        attributes={},
        format="v2",
        metadata_key="a/.zarray",
    )
    assert not direct.transposed(ArrayStream(meta, order=order)), why


def test_rows_of_chunks_read_transposed_fall_back_without_a_chunk_file(tmp_path):
    arr = np.arange(6 * 6, dtype="<i4").reshape(6, 6)
    meta = write_store(str(tmp_path), arr, (3, 3), missing=frozenset({(1, 0)}))
    reads = direct.DirectReads(Store(str(tmp_path)))
    stream = ArrayStream(meta, order="F")
    out = np.empty(6 * 6 * 4, np.uint8)
    assert bytes(reads.transposed_rows_sync(stream, 1, 1, out)) == arr.tobytes(order="F")[3 * 6 * 4 :]
    with pytest.raises(direct.Fallback):
        reads.transposed_rows_sync(stream, 0, 1, out)  # its columns 0-2: chunk (1, 0) is not stored
    reads.close()


def test_worker_threads_keep_their_files_until_a_refresh_or_their_end(tmp_path):
    """A worker thread (nowait=False) keeps the chunk files it read open in a table of its
    own: a file replaced since is read again only after close() (a refresh), and the files
    are closed when the thread ends."""
    arr = np.arange(8 * 8, dtype="<i4").reshape(8, 8)
    meta = write_store(str(tmp_path), arr, (4, 4))
    reads = direct.DirectReads(Store(str(tmp_path)))
    stream = ArrayStream(meta, with_header=False)
    open_fds = lambda: len(os.listdir("/proc/self/fd"))  # noqa: E731

    def read_all():
        plan = stream.plan(0, stream.size)
        return bytes(reads.read_sync(stream, plan, np.empty(stream.size, np.uint8), nowait=False))

    before = open_fds()
    with ThreadPoolExecutor(1) as worker:
        assert worker.submit(read_all).result() == arr.tobytes()
        assert open_fds() == before + 4  # the four chunks' files, kept
        new = arr + 100
        write_store(str(tmp_path / "new"), new, (4, 4))
        for name in os.listdir(tmp_path / "a"):  # each chunk file replaced by a new one, as zarr-python does
            os.rename(tmp_path / "new" / "a" / name, tmp_path / "a" / name)
        assert worker.submit(read_all).result() == arr.tobytes()  # the kept files: the old bytes
        reads.close()
        assert worker.submit(read_all).result() == new.tobytes()
        assert open_fds() == before + 4
    assert open_fds() == before  # the thread ended: its files are closed
