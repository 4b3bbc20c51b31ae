"""Mounted: small reads within one row of an array, or across one row's end, whose chunks are
cached are served from the chunks without a plan (Engine._small_read: a view of one chunk's
bytes, or pieces copied), and so are reads of many rows in one row of chunks (Engine._rows_read);
their bytes equal np.save's of what zarr-python reads, in 1-d and n-d arrays with F-ordered
chunks, edge chunks, structured and datetime elements, and they see a write that the store
does not hold yet."""

import json
import os
import random

import numpy as np
import zarr

from support.oracles import npy_bytes

VIEWS = ".zarrfs"


def stats(mnt):
    return json.loads((mnt / VIEWS / "stats.json").read_bytes())


def random_reads(path, want, n=400, most=9000, seed=0, least=1):
    rng = random.Random(seed)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)  # every read reaches the daemon at its own size
    with open(fd, "rb", buffering=0) as f:
        for _ in range(n):
            off, size = rng.randrange(len(want)), rng.randrange(least, most)
            f.seek(off)
            assert f.read(size) == want[off : off + size], (path, off, size)


def write_arrays(root, arrays, written):
    """ARRAYS (name: (value, create_array's keywords)) in the v2 group ROOT: every element, but
    of "sparse" only the region WRITTEN (one chunk: the others are never written)."""
    for name, (value, kw) in arrays.items():
        a = zarr.create_array(
            store=os.fspath(root), name=name, shape=value.shape, dtype=value.dtype, zarr_format=2, **kw
        )
        if name == "sparse":
            a[written] = value[written]
        else:
            a[...] = value


def reads_are_exact(mnt, root, arrays, counter, **reads):
    """Each array read whole (every chunk cached), then at random (`random_reads` with READS):
    np.save's bytes of zarr-python's values, some of the reads counted in COUNTER."""
    for name in arrays:
        want = npy_bytes(zarr.open_array(os.fspath(root / name), mode="r")[...])
        assert (mnt / f"{name}.npy").read_bytes() == want
        before = stats(mnt)[counter]
        random_reads(mnt / f"{name}.npy", want, **reads)
        assert stats(mnt)[counter] > before, name


def test_small_reads_of_cached_chunks_are_exact(mount, tmp_path):
    root = tmp_path / "s.zarr"
    zarr.open_group(os.fspath(root), mode="w", zarr_format=2)
    rng = np.random.default_rng(5)
    arrays = {
        "f3d": (rng.integers(-999, 999, (7, 45, 3001)).astype(">i2"), {"chunks": (3, 20, 700), "order": "F"}),
        "c2d": (rng.standard_normal((300, 2500)).astype("<f8"), {"chunks": (64, 1000)}),
        "rec": (np.zeros((40, 300), [("a", "<i4"), ("b", "<f8")]), {"chunks": (16, 128)}),
        # Datetimes: numpy cannot export their buffer (the bytes of a chunk are taken another way).
        "when": (rng.integers(0, 2**40, (30, 900)).astype("<M8[s]"), {"chunks": (7, 256)}),
        "line": (rng.integers(0, 2**60, 5000, dtype="<u8"), {"chunks": (600,)}),
        # Chunks never written: their fill value (a cached chunk whose elements are one value).
        "sparse": (np.full((90, 700), 2.5, "<f4"), {"chunks": (40, 300), "fill_value": 2.5}),
    }
    arrays["rec"][0]["a"] = rng.integers(0, 9, (40, 300))
    arrays["sparse"][0][40:80, 300:600] = rng.standard_normal((40, 300))
    write_arrays(root, arrays, np.s_[40:80, 300:600])
    reads_are_exact(mount(root), root, arrays, "small_reads")


def test_reads_of_many_rows_of_cached_chunks_are_exact(mount, tmp_path):
    """Reads of 64 KiB to 400 KiB (many rows; most in one row of chunks, some across two, which
    take the usual way) of arrays whose chunks are cached: C- and F-ordered chunks, 2-d and 3-d,
    an edge column of chunks, chunks never written."""
    root = tmp_path / "m.zarr"
    zarr.open_group(os.fspath(root), mode="w", zarr_format=2)
    rng = np.random.default_rng(11)
    arrays = {
        "c2d": (rng.standard_normal((600, 2000)), {"chunks": (100, 500)}),
        "f3d": (rng.integers(-999, 999, (4, 60, 3000)).astype(">i2"), {"chunks": (3, 40, 1500), "order": "F"}),
        "edge": (rng.standard_normal((300, 2100)).astype("<f4"), {"chunks": (128, 1000)}),
        "sparse": (np.full((400, 3000), -1, "<i8"), {"chunks": (150, 1000), "fill_value": -1}),
    }
    arrays["sparse"][0][150:300, 1000:2000] = rng.integers(0, 99, (150, 1000))
    write_arrays(root, arrays, np.s_[150:300, 1000:2000])
    reads_are_exact(mount(root), root, arrays, "row_reads", n=150, least=64 << 10, most=400 << 10)


def test_small_reads_see_written_chunks(mount, tmp_path):
    root = tmp_path / "w.zarr"
    value = np.arange(200 * 3000, dtype="<i4").reshape(200, 3000)
    zarr.create_array(store=os.fspath(root), name="a", shape=value.shape, dtype=value.dtype, chunks=(50, 1000))[...] = (
        value
    )
    mnt = mount(root, "writable")
    with open(mnt / "a.npy", "r+b") as f:
        f.read()
        header = len(npy_bytes(value)) - value.nbytes
        f.seek(header + (120 * 3000 + 990) * 4)
        f.write(np.arange(-20, 0, dtype="<i4").tobytes())  # across two chunks of one row
        value[120, 990:1010] = np.arange(-20, 0)
        f.flush()
        random_reads(mnt / "a.npy", npy_bytes(value), n=100)
        fd = os.open(mnt / "a.npy", os.O_RDONLY | os.O_DIRECT)
        with open(fd, "rb", buffering=0) as g:
            g.seek(header + (120 * 3000 + 980) * 4)
            assert g.read(200) == value[120, 980:1030].tobytes()
            g.seek(header + 110 * 3000 * 4)  # many rows, the written one among them (the usual way while written)
            assert g.read(20 * 3000 * 4) == value[110:130].tobytes()
    assert stats(mnt)["small_reads"] > 0


def test_small_reads_across_the_end_of_a_row(mount, tmp_path):
    """A read that runs from the end of one row into the next (one in every row's bytes / 4 KiB
    of random 4 KiB reads) is served from the cached chunks of both rows, also where the rows lie
    in different chunks, starting and ending inside elements; one over three rows takes the usual way."""
    root = tmp_path / "r.zarr"
    rng = np.random.default_rng(7)
    arrays = {
        "c": (rng.standard_normal((40, 1000)).astype("<f4"), {"chunks": (16, 300)}),
        "f": (rng.integers(-99, 99, (3, 20, 500)).astype(">i8"), {"chunks": (2, 8, 128), "order": "F"}),
        "one": (rng.standard_normal((40, 300)).astype("<f8"), {"chunks": (16, 300)}),  # one chunk wide
    }
    for name, (value, kw) in arrays.items():
        zarr.create_array(store=os.fspath(root), name=name, shape=value.shape, dtype=value.dtype, zarr_format=2, **kw)[
            ...
        ] = value
    mnt = mount(root)
    for name, (value, _) in arrays.items():
        want = npy_bytes(zarr.open_array(os.fspath(root / name), mode="r")[...])
        assert (mnt / f"{name}.npy").read_bytes() == want  # every chunk cached
        header = len(want) - value.nbytes
        row = value.shape[-1] * value.dtype.itemsize
        nrows = value.size // value.shape[-1]
        fd = os.open(mnt / f"{name}.npy", os.O_RDONLY | os.O_DIRECT)
        with open(fd, "rb", buffering=0) as f:
            before = stats(mnt)["small_reads"]
            ends = range(1, nrows)
            for end in ends:  # across row END-1's end; from inside an element to inside one
                at = header + end * row - 1001
                f.seek(at)
                assert f.read(1700) == want[at : at + 1700], (name, end)
            assert stats(mnt)["small_reads"] - before == len(ends), name
            for end in ends:  # from inside row END-1 to the end of row END
                at = header + end * row - 24
                f.seek(at)
                assert f.read(24 + row) == want[at : at + 24 + row], (name, end)
            assert stats(mnt)["small_reads"] - before == 2 * len(ends), name
            at = header + row - 5  # over rows 0, 1 and 2: the usual way
            f.seek(at)
            assert f.read(row + 10) == want[at : at + row + 10]
            assert stats(mnt)["small_reads"] - before == 2 * len(ends), name
