"""The engine: one load per chunk however many readers, cache bounds, errors confined to a chunk."""

from __future__ import annotations

import os
import threading
import time
import warnings

import numpy as np
import pytest
import trio
import trio.testing
import zarr

from zarrfs.engine import DECODE_THREADS, Engine, EngineConfig, ReadAhead
from zarrfs.engine.cache import ChunkCache
from zarrfs.errors import CorruptChunk, Stale, StoreError
from zarrfs.formats import open_hierarchy_sync
from zarrfs.storage.store import Store
from zarrfs.views.slices import SliceStream, selection
from zarrfs.views.streams import ArrayStream

from support.core import np_save_bytes

warnings.filterwarnings("ignore", module="zarr")


class CountingStore(Store):
    """A real local store that counts gets, and can delay or fail chosen keys (fault injection)."""

    def __init__(self, source, slow=(), fail=()):
        super().__init__(source)
        self.gets: list[str] = []
        self.slow, self.fail = set(slow), set(fail)
        self.release = threading.Event()

    def get_sync(self, key, *bound):
        self.gets.append(key)
        if key in self.slow:
            self.release.wait(10)
        if key in self.fail:
            raise StoreError(f"reading {key!r} failed: injected")
        return super().get_sync(key, *bound)


@pytest.fixture
def two_arrays(tmp_path):
    path = str(tmp_path / "s")
    root = zarr.open_group(path, mode="w", zarr_format=2)
    a = root.create_array("a", shape=(40, 40), chunks=(10, 10), dtype="<f8")
    a[:] = np.arange(1600).reshape(40, 40)
    b = root.create_array("b", shape=(8,), chunks=(4,), dtype="<i4")
    b[:] = np.arange(8)
    return path


def setup(path, store_cls=CountingStore, cache_bytes=1 << 24, config=None, **kw):
    store = store_cls(path, **kw)
    h = open_hierarchy_sync(store)
    engine = Engine(store, ChunkCache(cache_bytes), config)
    return store, engine, {p: ArrayStream(h.node_sync(p)) for p in ("a", "b")}


async def test_concurrent_readers_share_one_load(two_arrays):
    store, engine, streams = setup(two_arrays)
    s = streams["a"]
    out = []

    async def reader():
        out.append(await engine.read(s, len(s.header), 80))

    async with trio.open_nursery() as n:
        for _ in range(8):
            n.start_soon(reader)
    assert len({bytes(o) for o in out}) == 1
    assert store.gets.count("a/0.0") == 1
    await engine.read(s, len(s.header), 80)  # now a cache hit
    assert store.gets.count("a/0.0") == 1
    assert engine.cache.hits >= 1


async def test_slow_chunk_does_not_block_other_files(two_arrays):
    store, engine, streams = setup(two_arrays, slow={"a/0.0"})
    done = []

    async def slow_read():
        done.append(("a", await engine.read(streams["a"], 0, 200)))

    async with trio.open_nursery() as n:
        n.start_soon(slow_read)
        await trio.sleep(0.05)
        with trio.fail_after(5):
            data = await engine.read(streams["b"], 0, streams["b"].size)
        done.append(("b", data))
        store.release.set()
    assert [name for name, _ in done] == ["b", "a"]
    assert done[0][1] == np_save_bytes(np.arange(8, dtype="<i4"))


async def test_corrupt_chunk_fails_only_its_reads(two_arrays, tmp_path):
    with open(f"{two_arrays}/a/1.1", "wb") as f:
        f.write(b"this is not blosc")
    store, engine, streams = setup(two_arrays)
    s = streams["a"]
    hdr = len(s.header)
    with pytest.raises(CorruptChunk, match=r"a/1\.1"):
        await engine.read(s, hdr + (10 * 40 + 10) * 8, 8)  # element (10, 10)
    ok = await engine.read(s, hdr, 40 * 8)  # row 0 lives in chunks (0, *)
    assert np.frombuffer(ok, "<f8").tolist() == list(range(40))
    assert engine.errors["CorruptChunk"] == 1


@pytest.mark.parametrize("codec", ["zstd", "blosc"])
async def test_local_chunks_read_and_decoded_in_one_call(tmp_path, monkeypatch, codec):
    """With buffers of the engine's to decode into (read-only mounts of local stores), a chunk is
    read into its worker thread's scratch buffer and decoded in the same call: chunks of every
    compressed size read back as zarr-python reads them, one not stored as its fill value, and a
    damaged one fails only its reads, naming its key."""
    from zarrfs.engine import loads

    path = str(tmp_path / "s")
    compressor = {"zstd": zarr.codecs.ZstdCodec(level=1), "blosc": zarr.codecs.BloscCodec(cname="lz4")}[codec]
    a = zarr.create_array(
        path, name="a", shape=(1024, 1024), chunks=(256, 256), dtype="<f4", compressors=[compressor], fill_value=-1.5
    )
    rng = np.random.default_rng(5)
    # rows of rounded noise whose spread grows down the array: each chunk compresses differently
    a[:] = (rng.standard_normal((1024, 1024)) * np.logspace(0, 6, 1024)[:, None]).round()
    os.remove(f"{path}/a/c/0/3")
    want = zarr.open_array(path + "/a", mode="r")[:]  # (fill where the chunk is gone)
    with open(f"{path}/a/c/3/1", "r+b") as f:
        f.seek(40)
        f.write(b"\xff" * 4000)
    calls = []
    real = loads.read_decode_sync
    monkeypatch.setattr(loads, "read_decode_sync", lambda *a: calls.append(a[3]) or real(*a))
    store = Store(path)
    engine = Engine(store, ChunkCache(1 << 26), EngineConfig(recycle=True))
    s = ArrayStream(open_hierarchy_sync(store).node_sync("a"))
    row = 1024 * 4
    hdr = len(s.header)
    got = np.frombuffer(await engine.read(s, hdr, 768 * row), "<f4").reshape(768, 1024)
    assert np.array_equal(got, want[:768])
    assert (got[:256, 768:] == -1.5).all()
    with pytest.raises(CorruptChunk, match="a/c/3/1"):
        await engine.read(s, hdr + 768 * row, 256 * row)
    ok = await engine.read(s, hdr + 768 * row, 256 * 4)  # chunk (3, 0) of the damaged row
    assert np.array_equal(np.frombuffer(ok, "<f4"), want[768, :256])
    assert len(set(calls)) == 16  # every chunk, the one not stored too


class ReadThenWaitStore(Store):
    """A local store whose reads of chosen keys hand back what they read only once released."""

    def __init__(self, source, slow=()):
        super().__init__(source)
        self.gets: list[str] = []
        self.slow = set(slow)
        self.release = threading.Event()

    def get_sync(self, key, *bound):
        data = super().get_sync(key, *bound)
        self.gets.append(key)
        if key in self.slow:
            self.release.wait(10)
        return data


async def test_a_chunk_loaded_while_its_array_is_replaced_is_neither_shared_nor_cached(two_arrays):
    store = ReadThenWaitStore(two_arrays, slow={"a/0.0"})
    old_meta = open_hierarchy_sync(store).node_sync("a")
    engine = Engine(store, ChunkCache(1 << 24))
    old_values = np.arange(1600, dtype="<f8").reshape(40, 40)
    new_values = -old_values - 0.5
    got = {}

    async def read(name, meta, n):
        stream = ArrayStream(meta)
        got[name] = bytes(await engine.read(stream, len(stream.header), n * 8))  # row 0's first n elements

    async with trio.open_nursery() as n:
        n.start_soon(read, "old", old_meta, 10)  # chunk (0, 0) alone
        with trio.fail_after(5):
            while "a/0.0" not in store.gets:  # its load read the old chunk and waits
                await trio.sleep(0.01)
        # Another writer replaces the array: other chunks, other values.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            root = zarr.open_group(two_arrays, mode="a", zarr_format=2)
            root.create_array("a", shape=(40, 40), chunks=(20, 20), dtype="<f8", overwrite=True)[:] = new_values
        new_meta = open_hierarchy_sync(store).node_sync("a")
        assert new_meta.chunk_shape == (20, 20)
        engine.see_layout(new_meta)  # as the namespace does with each node it reads
        store.release.set()
        n.start_soon(read, "new", new_meta, 40)
    assert got["old"] == old_values[0, :10].tobytes()  # the version its metadata described
    assert got["new"] == new_values[0].tobytes()
    assert store.gets.count("a/0.0") == 2  # the new reader did not wait for the old load
    assert engine.cache.get(("a", (0, 0))).shape == (20, 20)  # what the old load decoded was not kept
    with pytest.raises(Stale):
        await engine.read(ArrayStream(old_meta), len(ArrayStream(old_meta).header), 8)


async def test_store_failure_is_eio_for_that_read(two_arrays):
    store, engine, streams = setup(two_arrays, fail={"b/1"})
    s = streams["b"]
    with pytest.raises(StoreError, match="injected"):
        await engine.read(s, 0, s.size)
    assert await engine.read(s, len(s.header), 16) == np.arange(4, dtype="<i4").tobytes()


async def test_cache_stays_within_budget(two_arrays):
    chunk_bytes = 10 * 10 * 8
    store, engine, streams = setup(two_arrays, cache_bytes=3 * chunk_bytes)
    s = streams["a"]
    await engine.read(s, 0, s.size)
    assert engine.cache.used_bytes <= 3 * chunk_bytes
    assert engine.cache.evictions >= 13


def test_decode_runs_in_threads_off_the_loop(two_arrays):
    # A decode that blocks must not stop the trio loop from running other tasks.
    store, engine, streams = setup(two_arrays)
    ticks = []

    async def main():
        async def ticker():
            for _ in range(5):
                ticks.append(time.perf_counter())
                await trio.sleep(0.01)

        async with trio.open_nursery() as n:
            n.start_soon(ticker)
            await engine.read(streams["a"], 0, streams["a"].size)

    trio.run(main)
    assert len(ticks) == 5


async def test_decoding_threads_take_their_next_call_while_the_trio_thread_is_busy(two_arrays):
    """Calls queued for the decoding threads run one after another without the trio thread: with
    it busy (blocked, as when it replies to the kernel), every queued call still ends; under a
    limiter of trio.to_thread calls only the first call of each thread would."""
    store, engine, streams = setup(two_arrays)
    calls = 3 * DECODE_THREADS
    ran = {}

    def work(i):
        ran[i] = (time.perf_counter(), threading.get_ident())
        time.sleep(0.05)
        return i * i

    results, asked = [], []

    async def call(i):
        asked.append(i)
        results.append(await engine.run_cpu(work, i))

    async with trio.open_nursery() as n:
        for i in range(calls):
            n.start_soon(call, i)
        await trio.testing.wait_all_tasks_blocked()
        time.sleep(calls * 0.05 / DECODE_THREADS + 0.5)  # the trio thread, busy
        blocked_until = time.perf_counter()
    assert sorted(results) == [i * i for i in range(calls)]
    assert all(t < blocked_until for t, _ in ran.values())
    assert len({ident for _, ident in ran.values()}) == DECODE_THREADS
    assert sorted(sorted(ran, key=lambda i: ran[i][0])[:DECODE_THREADS]) == sorted(asked[:DECODE_THREADS])


async def test_a_cancelled_call_not_started_is_dropped_and_a_running_one_waited_for(two_arrays):
    store, engine, streams = setup(two_arrays)
    release = threading.Event()
    ran = []

    def work(i):
        ran.append(i)
        release.wait(10)
        return i

    got, asked = [], []

    async def call(i):
        asked.append(i)
        got.append(await engine.run_cpu(work, i))
        await trio.sleep(0)  # the cancellation reaches a call waited for here

    with trio.move_on_after(0.3):
        async with trio.open_nursery() as n:
            for i in range(DECODE_THREADS + 1):  # the last one waits for a thread
                n.start_soon(call, i)
            await trio.sleep(0.2)
            threading.Timer(0.5, release.set).start()
    first = sorted(asked[:DECODE_THREADS])
    assert sorted(ran) == first
    assert sorted(got) == first  # waited for: their threads ran to the end
    await trio.sleep(0.1)
    assert sorted(ran) == first  # the dropped call never ran
    assert await engine.run_cpu(work, 7) == 7  # the threads are free again


async def test_local_reads_stuck_past_the_timeout_hold_no_decoding_thread(tmp_path):
    """A local chunk read and decoded in one call runs in a decoding thread: reads stuck in the
    store fail with a timeout naming it (EIO) and their threads are replaced, so that other
    chunks, more than there are decoding threads stuck, still decode."""
    path = str(tmp_path / "s")
    a = zarr.create_array(
        path,
        name="a",
        shape=(256, 512 * (DECODE_THREADS + 1)),
        chunks=(256, 512),
        dtype="<f4",
        compressors=[zarr.codecs.ZstdCodec(level=1)],
    )  # 512 KiB chunks
    a[:] = np.arange(a.size, dtype="<f4").reshape(a.shape)
    stuck = [f"a/c/0/{j}" for j in range(DECODE_THREADS)]
    store = CountingStore(path, slow=stuck)
    # (recycle: a read-only mount of a local store)
    engine = Engine(store, ChunkCache(1 << 26), EngineConfig(timeout_s=0.5, recycle=True))
    s = ArrayStream(open_hierarchy_sync(store).node_sync("a"))
    row = a.shape[1] * 4
    try:
        for j in range(DECODE_THREADS):
            with trio.fail_after(5), pytest.raises(StoreError, match="timeout"):
                await engine.read(s, len(s.header) + j * 2048, 4)
        last = DECODE_THREADS * 2048  # the first element of the last chunk
        with trio.fail_after(5):
            got = await engine.read(s, len(s.header) + 5 * row + last, 2048)
        assert np.array_equal(np.frombuffer(got, "<f4"), a[5, DECODE_THREADS * 512 :])
        assert f"a/c/0/{DECODE_THREADS}" in store.gets
    finally:
        store.release.set()


async def test_read_ahead_asks_for_a_row_of_chunks_again_after_cached_chunks_are_dropped(two_arrays):
    """Read-ahead skips planning a window's new part inside a row of chunks it already asked for
    whole, but not once cached chunks were dropped (a refresh): then it asks for them again."""
    row = 40 * 8
    # the window: the 5 rows after the read
    store, engine, streams = setup(two_arrays, config=EngineConfig(prefetch_max_bytes=5 * row))
    s = streams["a"]  # 40 x 40, chunks 10 x 10: a row of chunks is 10 rows
    reader = ReadAhead()
    async with trio.open_nursery() as n:
        await n.start(engine.run)
        for i in range(17):  # rows 0..16: the window has asked for rows of chunks 0, 1 and 2
            assert (
                await engine.read(s, len(s.header) + i * row, row, readahead=reader)
                == np.arange(i * 40, i * 40 + 40, dtype="<f8").tobytes()
            )
            await trio.sleep(0.02)
        assert {f"a/2.{j}" for j in range(4)} <= set(store.gets)  # before the reader is there
        before = engine.counters["prefetched"]
        engine.drop_clean_chunks()
        await engine.read(s, len(s.header) + 17 * row, row, readahead=reader)  # its window's new part: row 22
        with trio.move_on_after(5):  # (the prefetches run in the background: a busy machine is slow)
            while engine.counters["prefetched"] < before + 4 or sum(k.startswith("a/2.") for k in store.gets) < 8:
                await trio.sleep(0.01)
        assert engine.counters["prefetched"] == before + 4  # row of chunks 2, asked for again
        assert sum(k.startswith("a/2.") for k in store.gets) == 8
        n.cancel_scope.cancel()


async def test_a_slice_view_read_sequentially_with_read_ahead(two_arrays):
    """A slice view's stream read in small sequential reads, its read-ahead running (the window
    past its first read): numpy's selection of zarr-python's values, byte for byte."""
    store, engine, streams = setup(two_arrays)
    meta = streams["a"].meta
    s = SliceStream(meta, *selection("3:37, ::-1", meta.shape)[:1])
    want = np_save_bytes(zarr.open_array(os.path.join(two_arrays, "a"), mode="r")[...][3:37, ::-1])
    reader = ReadAhead()
    got = b""
    async with trio.open_nursery() as n:
        await n.start(engine.run)
        for off in range(0, s.size, 1000):
            got += await engine.read(s, off, 1000, readahead=reader)
        assert engine.counters["prefetched"] > 0
        n.cancel_scope.cancel()
    assert got == want


async def test_sequential_reads_prefetch_and_seeks_reset(two_arrays):
    store, engine, streams = setup(two_arrays)
    s = streams["a"]
    row = 40 * 8
    reader = ReadAhead()  # one open file's read-ahead state
    async with trio.open_nursery() as n:
        await n.start(engine.run)
        for i in range(5):  # sequential: the window doubles until it reaches chunk row 1
            await engine.read(s, len(s.header) + i * row, row, readahead=reader)
        await trio.sleep(0.2)
        assert engine.counters["prefetched"] > 0
        assert "a/1.0" in store.gets  # chunk row 1 was loaded before anyone read it
        before = engine.counters["prefetched"]
        await engine.read(s, len(s.header) + 30 * row, 8, readahead=reader)  # a seek: no read-ahead
        await trio.sleep(0.1)
        assert engine.counters["prefetched"] == before
        n.cancel_scope.cancel()


async def test_a_large_read_of_cached_chunks_elsewhere_starts_the_window_again(tmp_path):
    """A seek back to cached chunks, read at once (read_now: many rows of one row of chunks),
    resets the reader's window as a read through `read` does, and its bytes are zarr-python's
    values: the window is not left planned far ahead of where the reader now is."""
    path = str(tmp_path / "s")
    value = np.arange(600 * 1000, dtype="<f8").reshape(600, 1000)
    zarr.create_array(store=path, name="a", shape=value.shape, chunks=(100, 250), dtype="<f8", zarr_format=2)[...] = (
        value
    )
    zarr.create_array(store=path, name="b", shape=(1,), dtype="<i4", zarr_format=2)
    row, size = 1000 * 8, 20 * 1000 * 8  # reads of 20 rows (bands would take narrower chunks)
    store, engine, streams = setup(path, cache_bytes=64 << 20, config=EngineConfig(prefetch_max_bytes=200 * row))
    s = streams["a"]
    reader = ReadAhead()
    async with trio.open_nursery() as n:
        await n.start(engine.run)
        for i in range(0, 320, 20):  # sequential: the window grows to 200 rows past the reader
            await engine.read(s, len(s.header) + i * row, size, readahead=reader)
            await trio.sleep(0.01)
        assert reader.planned >= len(s.header) + 400 * row
        at = len(s.header) + 20 * row  # back into row of chunks 0, cached
        got = engine.read_now(s, at, size, reader)
        assert got is not None and bytes(got) == value[20:40].tobytes()
        assert engine.counters["row_reads"] == 1
        assert reader.planned <= at + size and reader.window == 0
        n.cancel_scope.cancel()


def test_decode_buffers_of_two_mib_or_more_are_backed_by_huge_pages():
    """private_buffer: a buffer of 2 MiB or more starts on a huge page boundary and, where the
    kernel gives huge pages to those who ask (transparent_hugepage `madvise` or `always`), is
    backed by them once touched, as /proc/self/smaps tells; a small one is an ordinary mapping."""
    from zarrfs.engine.fastpath.spares import private_buffer

    buf = private_buffer(5 << 20)
    assert buf.nbytes == 5 << 20 and buf.ctypes.data % (2 << 20) == 0
    buf[:] = 7
    assert int(buf[::4096].sum()) == 7 * len(buf[::4096])
    small = private_buffer(300_000)
    assert small.nbytes == 300_000
    with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
        mode = f.read().split("[")[1].split("]")[0]
    if mode == "never":
        return
    huge_kib = 0
    with open("/proc/self/smaps") as f:
        inside = False
        for line in f:
            if "-" in line.split()[0] and not line.startswith(("AnonHuge", "Size")):
                lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
                inside = lo <= buf.ctypes.data < hi
            elif inside and line.startswith("AnonHugePages:"):
                huge_kib = int(line.split()[1])
    assert huge_kib >= 4096  # (the two whole huge pages of its 5 MiB, at least)


async def test_idle_decoding_threads_leave_and_come_back(two_arrays, monkeypatch):
    """A decoding thread leaves after IDLE_S without a call (and with it its scratch buffer);
    the next call starts one again."""
    from zarrfs.engine import workers

    monkeypatch.setattr(workers, "IDLE_S", 0.2)
    store, engine, streams = setup(two_arrays, config=EngineConfig(decoder_thread_name="zarrfs-test-idle"))

    def alive():
        return sum(t.name == "zarrfs-test-idle" for t in threading.enumerate())

    assert await engine.run_cpu(threading.get_ident) != threading.get_ident()
    assert alive() >= 1
    await trio.sleep(1.0)
    assert alive() == 0
    assert await engine.run_cpu(lambda: 42) == 42
    assert alive() >= 1


@pytest.mark.parametrize(
    "blocks", [{}, {"TRANSPOSE_MIN_ROWS": 2, "TRANSPOSE_STAGE_BYTES": 0, "TRANSPOSE_BLOCK_BYTES": 24}]
)
@pytest.mark.parametrize("dtype", ["<f8", "<i2"])
@pytest.mark.parametrize("compressor", ["blosc", "zstd"])
@pytest.mark.parametrize("order", ["C", "F"])
def test_rows_of_chunks_decoded_into_a_band_equal_numpy_s_bytes(
    tmp_path, monkeypatch, order, compressor, dtype, blocks
):
    """decoded_rows_sync (bands of the F view of C-ordered chunks, or of the .npy of F-ordered
    ones, that decode into a buffer): any rows of the stream's chunks, in any share of their
    chunk columns, equal numpy's bytes of zarr-python's values; a chunk not stored gives its
    fill value. Each chunk copied whole, or (BLOCKS) 2 of its rows at a time in blocks of a few
    columns, so that every block is cut short at edge chunks."""
    import numcodecs

    from zarrfs.engine.fastpath import direct
    from zarrfs.engine.fastpath.bands import decoded_rows_sync

    for name, setting in blocks.items():
        monkeypatch.setattr(direct, name, setting)

    value = (np.arange(37 * 29) * 3 % 1000).astype(dtype).reshape(37, 29)
    path = tmp_path / "s"
    codec = (
        numcodecs.Blosc(cname="lz4", shuffle=numcodecs.Blosc.SHUFFLE)
        if compressor == "blosc"
        else numcodecs.Zstd(level=1)
    )
    arr = zarr.create_array(
        os.fspath(path),
        shape=value.shape,
        chunks=(8, 5),
        dtype=dtype,
        zarr_format=2,
        order=order,
        compressors=codec,
        fill_value=7,
    )
    arr[...] = value
    os.unlink(path / "2.3")
    value = arr[...]  # what zarr-python reads back: the fill value where the chunk went
    store = Store(os.fspath(path))
    view = "F" if order == "C" else "C"
    stream = ArrayStream(open_hierarchy_sync(store).node_sync(""), order=view)
    assert direct.transposed(stream, decoded=True)
    want = value.tobytes(order=view)
    a = stream._chunks[0]
    row = a * stream._shape[1] * value.itemsize  # bytes of a whole row of the stream's chunks
    nrows = -(-stream._shape[0] // a)
    for count in (1, 2):
        for k in range(nrows):
            for parts in (1, 2, 3):
                out = np.full(count * row + 8, 5, np.uint8)
                for part in range(parts):
                    got = decoded_rows_sync(stream, store, k, count, out, part, parts)[0]
                assert bytes(got) == want[k * row : (k + count) * row], (k, count, parts)
                assert bytes(out[len(got) :]) == b"\5" * (len(out) - len(got))


async def test_delayed_calls_run_once_after_the_last_ask(autojump_clock, caplog):
    """engine.delayed (DelayedCalls): asking again moves a call, cancel drops it, a failing call is logged and
    leaves the others running (the times are trio's mock clock's)."""
    from zarrfs.engine.debounce import DelayedCalls

    later = DelayedCalls()
    calls: list[tuple[str, float]] = []

    def recorder(name):
        async def record() -> None:
            calls.append((name, trio.current_time()))

        return record

    async def fail() -> None:
        raise RuntimeError("boom")

    assert not later.call("x", 1, recorder("x"))  # not attached: nothing runs later
    async with trio.open_nursery() as nursery:
        later.attach(nursery)
        start = trio.current_time()
        later.call("a", 5, recorder("a"))
        later.call("b", 2, fail)
        await trio.sleep(3)
        later.call("a", 5, recorder("a2"))  # moved: due at 8, with the newer call
        later.call("c", 1, recorder("c"))
        later.cancel("c")
        later.call("c", 6, recorder("c2"))  # asked again after a cancel: made once, at 9
        assert later.waiting == 2
        await trio.sleep(20)
        assert later.waiting == 0
        nursery.cancel_scope.cancel()
    assert [(name, round(t - start, 6)) for name, t in calls] == [("a2", 8.0), ("c2", 9.0)]
    assert "boom" in caplog.text


def test_engine_config_for_a_mount_runs_the_fast_paths_of_read_only_mounts(tmp_path):
    """EngineConfig.for_mount: direct reads and decode buffer reuse on read-only mounts of stores
    whose chunks lie in files, bands on any read-only mount; a writable mount runs none of them."""
    from zarrfs.options import Options

    class Remote:
        is_local = on_local_disk = chunk_files = False

    local = Store(str(tmp_path))
    assert EngineConfig.for_mount(Options(timeout_s=7.0), local) == EngineConfig(
        timeout_s=7.0, direct_reads=True, bands=True, recycle=True
    )
    assert EngineConfig.for_mount(Options(), Remote()) == EngineConfig(bands=True)
    assert EngineConfig.for_mount(Options(writable=True), local) == EngineConfig()

    class OwnBuffersOnLocalDisk:  # an Icechunk repository in a local directory, read by icechunk 1.x
        is_local, on_local_disk, chunk_files = False, True, False

    assert EngineConfig.for_mount(Options(), OwnBuffersOnLocalDisk()) == EngineConfig(bands=True, drop_behind=True)
    assert EngineConfig.for_mount(Options(writable=True), OwnBuffersOnLocalDisk()) == EngineConfig()

    class ChunkFilesOnLocalDisk:  # ... by icechunk 2.x, which tells where each chunk lies
        is_local, on_local_disk, chunk_files = False, True, True

    assert EngineConfig.for_mount(Options(), ChunkFilesOnLocalDisk()) == EngineConfig(
        direct_reads=True, bands=True, recycle=True
    )


async def read_as_fuse_does(engine, stream, size=128 << 10):
    """STREAM read whole from offset 0 as the FUSE layer reads: read_now, else read with reply."""
    reader, got = ReadAhead(), b""
    async with trio.open_nursery() as n:
        await n.start(engine.run)
        for off in range(0, stream.size, size):
            data = engine.read_now(stream, off, size, reader)
            if data is None:
                data = await engine.read(stream, off, size, readahead=reader, reply=True)
            got += bytes(data)  # (a view of the reused reply buffer: copied before the next read)
            del data  # as the FUSE layer lets go of a reply once sent
        n.cancel_scope.cancel()
    return got


def uncompressed_store(tmp_path, rows, chunks):
    """A v2 store written by zarr-python: array `a` (ROWS x 1024 float32, uncompressed, CHUNKS), and `b`."""
    path = str(tmp_path / "s")
    value = np.arange(rows * 1024, dtype="<f4").reshape(rows, 1024)
    zarr.create_array(
        store=path, name="a", shape=value.shape, chunks=chunks, dtype="<f4", zarr_format=2, compressors=None
    )[...] = value
    zarr.create_array(store=path, name="b", shape=(1,), dtype="<i4", zarr_format=2)
    return path


@pytest.mark.parametrize("fast", [True, False])
async def test_fast_paths_on_or_off_give_numpy_s_bytes(tmp_path, fast):
    """A sequential reader of narrow uncompressed chunks, read as the FUSE layer reads (read_now,
    then read with reply), gets np.save's bytes of zarr-python's values with every optional
    strategy on (some serving it) or off (none serving it)."""
    path = uncompressed_store(tmp_path, 256, (64, 64))
    config = EngineConfig(direct_reads=fast, bands=fast, recycle=fast)
    store, engine, streams = setup(path, config=config)
    got = await read_as_fuse_does(engine, streams["a"])
    assert got == np_save_bytes(zarr.open_array(os.path.join(path, "a"), mode="r")[...])
    served = engine.counters["direct_reads"] + engine.counters["band_reads"]
    assert served > 0 if fast else served == 0


class PackedStore(Store):
    """A local store whose chunks the engine finds packed in one file, each at an offset of its
    own, as a local Icechunk repository's chunk objects are found (`chunk_file`): its keys' own
    files are emptied, so a byte of a chunk read from anywhere else is a wrong byte."""

    def __init__(self, source):
        super().__init__(source)
        self.pack, self.places = os.path.join(source, "pack"), {}
        with open(self.pack, "wb") as pack:
            for key in sorted(k for k in self.sizes_below_sync("") if "/" in k and ".z" not in k):
                pack.write(os.urandom(4096 + len(self.places)))  # bytes that belong to no chunk
                value = super().get_sync(key, None)
                self.places[key] = (pack.tell(), len(value))
                pack.write(value)
                with open(self.path(key), "r+b") as f:
                    f.write(bytes(len(value)))

    def chunk_file(self, key, load=True):
        return (self.pack, *self.places[key]) if key in self.places else None


async def test_direct_reads_find_chunks_where_the_store_places_them(tmp_path):
    """Direct reads read each chunk from the file and offset the store's `chunk_file` gives (a
    local Icechunk repository's chunk objects): a sequential reader gets np.save's bytes of
    zarr-python's values, read before the chunks were packed."""
    path = uncompressed_store(tmp_path, 256, (64, 256))
    expected = np_save_bytes(zarr.open_array(os.path.join(path, "a"), mode="r")[...])
    config = EngineConfig(direct_reads=True, bands=True, recycle=True)
    store, engine, streams = setup(path, store_cls=PackedStore, config=config)
    got = await read_as_fuse_does(engine, streams["a"])
    assert got == expected
    assert engine.counters["direct_reads"] + engine.counters["bands_assembled"] > 0
    assert engine.counters["chunk_gets"] == 0  # no chunk came from its key


class OwnBuffersStore(Store):
    """A local store read as an Icechunk repository is: no file of its chunks for the engine to read
    into its own buffers, each value a buffer of the store's own."""

    def __init__(self, source):
        super().__init__(source)
        self.is_local, self.on_local_disk = False, True

    def get_sync(self, key, *bound, **kw):
        value = super().get_sync(key, *bound)
        return value if value is None or key.endswith((".zarray", ".zgroup", ".zattrs")) else memoryview(value)


@pytest.mark.parametrize("drop_behind", [True, False])
async def test_a_sequential_reader_drops_the_chunks_it_passed(tmp_path, drop_behind):
    """With drop_behind (a read-only mount of a store on local disk whose chunks are buffers of its
    own), the chunks a sequential reader has passed leave the cache, so that their memory serves
    the next loads; the reader gets np.save's bytes of zarr-python's values either way."""
    path = uncompressed_store(tmp_path, 512, (64, 256))
    config = EngineConfig(bands=True, drop_behind=drop_behind)
    store, engine, streams = setup(path, store_cls=OwnBuffersStore, cache_bytes=1 << 26, config=config)
    got = await read_as_fuse_does(engine, streams["a"])
    assert got == np_save_bytes(zarr.open_array(os.path.join(path, "a"), mode="r")[...])
    chunks = 8 * 4
    if drop_behind:
        assert engine.counters["chunks_dropped"] >= chunks - 4  # all but the last row of chunks
        assert engine.tables.cache.used_bytes <= 4 * 64 * 256 * 4  # at most that row is left
    else:
        assert engine.counters["chunks_dropped"] == 0
        assert engine.tables.cache.used_bytes == 512 * 1024 * 4
