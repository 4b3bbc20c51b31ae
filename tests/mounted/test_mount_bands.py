"""Mounted: a sequential reader of a read-only mount whose reads are cut into small pieces
(narrow chunks) or copied across the chunks' order (the F view) is served from bands assembled ahead
in worker threads (engine/bands.py). The bytes equal np.save's of what zarr-python reads, in the
C and F views, for uncompressed, compressed and sharded arrays with edge chunks; a refresh
never lets an assembled band serve bytes of chunks rewritten since; band buffers stay within
their budget with many readers and are freed when the files close."""

import errno
import json
import os
import threading

import numpy as np
import pytest
import zarr

from support import mounting
from support.oracles import npy_bytes, npy_f_bytes

VIEWS = ".zarrfs"
BAND = 8 << 20  # engine/bands.py BAND_BYTES
BUDGET = 192 << 20  # engine/bands.py BAND_BUDGET_BYTES
MIB = 1 << 20


def stats(mnt):
    return json.loads((mnt / VIEWS / "stats.json").read_bytes())


def read_sequentially(path, size=MIB, start=0, direct=False):
    """The file from START to its end in reads of SIZE (O_DIRECT: every read reaches the daemon)."""
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECT if direct else 0))
    with open(fd, "rb", buffering=0) as f:
        f.seek(start)
        parts = []
        while part := f.read(size):
            parts.append(part)
    return b"".join(parts)


def test_bands_serve_exact_bytes_of_every_kind_of_array(mount, tmp_path):
    rng = np.random.default_rng(11)
    data = rng.standard_normal((2500, 2100)).astype("<f4")  # 21 MB: bands 0-2, edge chunks both ways
    root = tmp_path / "b.zarr"
    zarr.open_group(os.fspath(root), mode="w")
    kinds = {
        "plain": {"chunks": (256, 32), "compressors": None},
        "zstd": {"chunks": (300, 40), "compressors": [zarr.codecs.ZstdCodec(level=1)]},
        "sharded": {"chunks": (250, 35), "shards": (1000, 1050), "compressors": [zarr.codecs.ZstdCodec(level=1)]},
    }
    for name, kw in kinds.items():
        zarr.create_array(store=os.fspath(root), name=name, shape=data.shape, dtype=data.dtype, **kw)[...] = data
    mnt = mount(root)
    for name in kinds:
        value = zarr.open_array(os.fspath(root / name), mode="r")[...]
        want = npy_bytes(value)
        assert read_sequentially(mnt / f"{name}.npy") == want, name
        assert read_sequentially(mnt / f"{name}.npy", size=3 * MIB + 4096, direct=True) == want, name
        # a reader that starts past the first band, in reads that straddle band ends
        assert read_sequentially(mnt / f"{name}.npy", size=700_000, start=BAND + 12_345) == want[BAND + 12_345 :]
        assert read_sequentially(mnt / VIEWS / "npy-f" / f"{name}.npy", direct=True) == npy_f_bytes(value), name
    s = stats(mnt)
    assert s["band_reads"] > 0
    assert s["band_bytes"] == 0  # every file is closed: the buffers went with their readers


def test_a_cat_assembles_each_band_once(mount, tmp_path):
    """The kernel's read-ahead sends reads of the next band before the last ones of this band:
    a band the reader has just left is still there for them, not assembled a second time."""
    value = np.arange(5000 * 2048, dtype="<f4").reshape(5000, 2048)  # 41 MB: six bands
    root = tmp_path / "c.zarr"
    zarr.create_array(
        store=os.fspath(root), name="a", shape=value.shape, dtype=value.dtype, chunks=(5000, 32), compressors=None
    )[...] = value
    mnt = mount(root)
    assert (mnt / "a.npy").read_bytes() == npy_bytes(value)  # buffered: the kernel's concurrent reads
    s = stats(mnt)
    bands = -(-len(npy_bytes(value)) // BAND)
    assert 0 < s["bands_assembled"] <= bands, s
    assert s["reads"] - s["band_reads"] <= BAND // MIB + 2, s  # the reads of the first band, and the header's


def test_the_f_view_of_wide_c_chunks_is_served_from_bands(mount, tmp_path):
    """Copies that transpose (the F view of C-ordered chunks) are assembled in bands whatever
    the size of their pieces; the C view of the same array, in pieces of 64 KiB, is not."""
    value = np.random.default_rng(3).standard_normal((2000, 3000)).astype("<f4")  # 24 MB: three bands
    root = tmp_path / "f.zarr"
    zarr.create_array(
        store=os.fspath(root),
        name="a",
        shape=value.shape,
        dtype=value.dtype,
        chunks=(500, 600),
        compressors=[zarr.codecs.ZstdCodec(level=1)],
    )[...] = value
    mnt = mount(root)
    assert read_sequentially(mnt / "a.npy") == npy_bytes(value)
    assert stats(mnt)["band_reads"] == 0
    assert read_sequentially(mnt / VIEWS / "npy-f" / "a.npy") == npy_f_bytes(value)
    assert stats(mnt)["band_reads"] > 0


def test_transposing_views_of_uncompressed_local_chunks_are_read_from_their_files(mount, tmp_path):
    """The F views (.npy and raw) of uncompressed C-ordered chunks, and the .npy of F-ordered
    ones, of a local store: bands of whole rows of the stream's chunks, copied transposed
    straight from the chunk files, with no chunk loaded through the cache. Edge chunks both
    ways; reads across two bands, and across the header and the first; a chunk not stored
    (its fill value) sends its band's reads the usual way; after another writer rewrites
    every chunk, a refresh gives the new bytes."""
    value = np.random.default_rng(5).standard_normal((2500, 2150)).astype("<f4")  # 21.5 MB: 3 bands
    root = tmp_path / "t.zarr"
    zarr.open_group(os.fspath(root), mode="w", zarr_format=2)
    arrays = {}
    for name, order in (("c", "C"), ("f", "F"), ("h", "C")):
        arrays[name] = zarr.create_array(
            store=os.fspath(root),
            name=name,
            shape=value.shape,
            dtype=value.dtype,
            chunks=(300, 256),
            compressors=None,
            zarr_format=2,
            order=order,
            fill_value=-1.5,
        )
        arrays[name][...] = value
    os.unlink(root / "h" / "4.3")  # a chunk of the F view's second band
    mnt = mount(root)
    views = {
        "c": mnt / VIEWS / "npy-f" / "c.npy",
        "f": mnt / "f.npy",
        "h": mnt / VIEWS / "npy-f" / "h.npy",
        "c-raw": mnt / VIEWS / "raw-f" / "c.raw",
    }
    read_back = {name: zarr.open_array(os.fspath(root / name), mode="r")[...] for name in ("c", "f", "h")}
    wants = {
        "c": npy_f_bytes(read_back["c"]),
        "f": npy_bytes(read_back["f"]),
        "h": npy_f_bytes(read_back["h"]),
        "c-raw": read_back["c"].tobytes(order="F"),
    }
    for path in views.values():
        path.stat()  # (the array's metadata read)
    for name in ("c", "f", "c-raw"):
        before = stats(mnt)
        assert read_sequentially(views[name]) == wants[name], name
        after = stats(mnt)
        assert after["chunk_gets"] == before["chunk_gets"], name  # every byte from the bands
        assert after["bands_assembled"] - before["bands_assembled"] == 3, name
        assert read_sequentially(views[name], size=3 * MIB + 4096, direct=True) == wants[name], name
        start = 5 * MIB + 12_345
        assert read_sequentially(views[name], size=700_000, start=start, direct=True) == wants[name][start:], name
    before = stats(mnt)
    assert read_sequentially(views["h"]) == wants["h"]
    assert stats(mnt)["chunk_gets"] > before["chunk_gets"]  # the second band's chunks, through the cache
    assert stats(mnt)["band_reads"] > before["band_reads"]  # and the others' reads from bands
    arrays["c"][...] = value + 1  # another writer rewrites every chunk
    (mnt / VIEWS / "refresh").read_bytes()
    assert read_sequentially(views["c"], direct=True) == npy_f_bytes(value + 1)
    assert stats(mnt)["band_bytes"] == 0  # every file is closed: the buffers went with their readers


@pytest.mark.log_errors_expected
def test_transposing_views_of_compressed_local_chunks_are_decoded_into_their_bands(mount, tmp_path):
    """The F view of blosc and zstd C-ordered chunks, and the .npy of F-ordered ones, of a local
    store: bands of whole rows of the stream's chunks, each chunk read and decoded once by a
    worker thread and copied transposed into its band, none loaded through the cache. A chunk
    not stored gives its fill value there; a corrupt chunk fails only the reads of its band
    (EIO, the usual path), with its key in the log, and the bands before it serve their bytes."""
    import numcodecs

    value = np.random.default_rng(6).standard_normal((2500, 2150)).astype("<f4")  # 21.5 MB: 3 bands
    root = tmp_path / "z.zarr"
    zarr.open_group(os.fspath(root), mode="w", zarr_format=2)
    blosc, zstd = numcodecs.Blosc(cname="lz4", shuffle=numcodecs.Blosc.SHUFFLE), numcodecs.Zstd(level=1)
    for name, order, codec in (("cz", "C", zstd), ("fb", "F", blosc), ("hz", "C", zstd), ("bad", "C", zstd)):
        zarr.create_array(
            store=os.fspath(root),
            name=name,
            shape=value.shape,
            dtype=value.dtype,
            chunks=(300, 256),
            zarr_format=2,
            order=order,
            compressors=codec,
            fill_value=-1.5,
        )[...] = value
    os.unlink(root / "hz" / "4.3")  # a chunk of the F view's second band
    (root / "bad" / "4.3").write_bytes(b"not zstd at all")
    mnt = mount(root)
    views = {"cz": mnt / VIEWS / "npy-f" / "cz.npy", "fb": mnt / "fb.npy", "hz": mnt / VIEWS / "npy-f" / "hz.npy"}
    read_back = {name: zarr.open_array(os.fspath(root / name), mode="r")[...] for name in views}
    wants = {"cz": npy_f_bytes(read_back["cz"]), "fb": npy_bytes(read_back["fb"]), "hz": npy_f_bytes(read_back["hz"])}
    for path in views.values():
        path.stat()  # (the array's metadata read)
    for name, path in views.items():
        stored = len([f for f in os.listdir(root / name) if not f.startswith(".")])
        before = stats(mnt)
        assert read_sequentially(path) == wants[name], name
        after = stats(mnt)
        assert after["cache_misses"] == before["cache_misses"], name  # no chunk through the cache
        assert after["chunk_gets"] - before["chunk_gets"] == stored, name  # each chunk read once
        assert after["bands_assembled"] - before["bands_assembled"] == 3, name
        assert read_sequentially(path, size=3 * MIB + 4096, direct=True) == wants[name], name
    bad = mnt / VIEWS / "npy-f" / "bad.npy"
    good = npy_f_bytes(value)
    second = len(good) - value.nbytes + 3 * 256 * 2500 * 4  # where the second band begins (3 rows of chunks)
    got = []
    with open(bad, "rb", buffering=0) as f, pytest.raises(OSError) as failed:
        while part := f.read(MIB):  # (the kernel returns what it has before the page that fails)
            got.append(part)
    assert failed.value.errno == errno.EIO
    got = b"".join(got)
    assert second <= len(got) < second + 1200 * 4 and got == good[: len(got)]  # up to row 1200 of column 768
    assert mounting.log_lines_naming(mount.log_text(mnt), "bad/4.3")


@pytest.mark.parametrize("compressors", [[zarr.codecs.ZstdCodec(level=1)], None], ids=["zstd", "uncompressed"])
def test_a_refresh_keeps_bands_from_serving_what_the_store_no_longer_holds(mount, tmp_path, compressors):
    """Uncompressed, the bands are filled from chunk files that worker threads keep open, and
    zarr-python replaces each file by a new one: a refresh makes every thread open them again."""
    root = tmp_path / "r.zarr"
    old = np.arange(3000 * 2000, dtype="<f4").reshape(3000, 2000)  # 24 MB: three bands
    arr = zarr.create_array(
        store=os.fspath(root), name="a", shape=old.shape, dtype=old.dtype, chunks=(500, 40), compressors=compressors
    )
    arr[...] = old
    mnt = mount(root)
    fd = os.open(mnt / "a.npy", os.O_RDONLY | os.O_DIRECT)
    with open(fd, "rb", buffering=0) as f:
        head = f.read(MIB) + f.read(MIB) + f.read(MIB)  # sequential: the next bands are assembled
        assert stats(mnt)["band_bytes"] > 0
        new = old + 1
        arr[...] = new  # another writer rewrites every chunk
        (mnt / VIEWS / "refresh").read_bytes()
        rest = f.read()
    assert head == npy_bytes(old)[: len(head)]
    assert rest == npy_bytes(new)[len(head) :]


def test_many_readers_stay_within_the_band_budget(mount, tmp_path):
    root = tmp_path / "m.zarr"
    zarr.open_group(os.fspath(root), mode="w")
    values = {}
    for i in range(12):  # 12 readers that could each hold four 8 MiB buffers: 384 MiB without a budget
        values[f"a{i}"] = np.full((2300, 1000), i, "<i4") + np.arange(1000, dtype="<i4")
        zarr.create_array(
            store=os.fspath(root),
            name=f"a{i}",
            shape=(2300, 1000),
            dtype="<i4",
            chunks=(500, 25),
            compressors=[zarr.codecs.BloscCodec(cname="lz4")],
        )[...] = values[f"a{i}"]
    mnt = mount(root)
    got = {}
    threads = [
        threading.Thread(target=lambda n=n: got.__setitem__(n, read_sequentially(mnt / f"{n}.npy", direct=True)))
        for n in values
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for n, v in values.items():
        assert got[n] == npy_bytes(v), n
    s = stats(mnt)
    assert s["band_reads"] > 0
    assert 0 < s["band_bytes_peak"] <= BUDGET
    assert s["band_bytes"] == 0


def test_a_reader_that_seeks_back_gets_bands_again(mount, tmp_path):
    root = tmp_path / "s.zarr"
    value = np.arange(3000 * 2000, dtype="<f4").reshape(3000, 2000)  # 24 MB: three bands
    zarr.create_array(
        store=os.fspath(root),
        name="a",
        shape=value.shape,
        dtype=value.dtype,
        chunks=(500, 40),
        compressors=[zarr.codecs.ZstdCodec(level=1)],
    )[...] = value
    mnt = mount(root)
    want = npy_bytes(value)
    fd = os.open(mnt / "a.npy", os.O_RDONLY | os.O_DIRECT)
    with open(fd, "rb", buffering=0) as f:
        for _ in range(3):  # each pass holds its bands until the next seek
            f.seek(0)
            before = stats(mnt)["band_reads"]
            assert b"".join(iter(lambda: f.read(MIB), b"")) == want
            assert stats(mnt)["band_reads"] - before >= 8  # the second band's reads at least


def test_slice_views_of_uncompressed_arrays_read_in_large_reads(mount, tmp_path):
    """A slice view is not a stream direct reads can serve: large reads of one (uncompressed,
    local, read-only, wide chunks) failed with EIO before and only the kernel's page-sized
    retries passed. With narrow chunks, slice views get bands."""
    root = tmp_path / "sl.zarr"
    value = np.arange(3000 * 3000, dtype="<f4").reshape(3000, 3000)
    zarr.open_group(os.fspath(root), mode="w")
    for name, chunks in (("wide", (500, 3000)), ("narrow", (500, 40))):
        zarr.create_array(
            store=os.fspath(root), name=name, shape=value.shape, dtype=value.dtype, chunks=chunks, compressors=None
        )[...] = value
    mnt = mount(root)
    for name in ("wide", "narrow"):
        path = mnt / VIEWS / "slice" / f"{name}[100:2900:2, ::-1].npy"
        assert read_sequentially(path, direct=True) == npy_bytes(value[100:2900:2, ::-1]), name
    assert stats(mnt)["band_reads"] > 0
