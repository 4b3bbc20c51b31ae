"""Hostile store values and chunks larger than the cache, through a real mount.

Keys that are FIFOs or device nodes, chunks that inflate to 256 MiB, and a chunk of 48 MiB
under an 8 MiB cache: each damaged read fails alone (EIO, the log naming the key and the
reason) without blocking or costing memory, and the big chunk is decoded once per pass.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import threading
from pathlib import Path

import numpy as np
import pytest

from support import bombs, mounting, oracles

# A read that the daemon answers takes well under a second; one that a FIFO blocks never
# returns. Past this we call it blocked (and the reader is killed).
READ_TIMEOUT_S = 30
# Growth of the daemon's peak resident memory allowed while it refuses every bomb: the
# bounded decoders allocate at most a chunk's bound (a few KiB here); today's decoders
# inflated each bomb (256 MiB) first.
BOMB_PEAK_GROWTH_MAX = 64 << 20
SMALL = dict(shape=(64, 32), chunks=(32, 32), dtype="<f8")  # chunks of 8 KiB decoded
# Chunks of 1 MiB decoded: every bomb (at most about 1.1 MiB stored) is within what such a
# chunk may take in the store (twice its size), so the decoder is what must refuse it.
BOMBED = dict(shape=(256, 1024), chunks=(128, 1024), dtype="<f8")
BOMBED_CHUNK_NBYTES = 128 * 1024 * 8
BIG_SHAPE = (6144, 1024)  # float64, one chunk of 48 MiB
CACHE = "cache_size=8M"


def _run(cmd: list[str]) -> subprocess.CompletedProcess:
    """CMD in a child process, failing the test when it does not finish."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        out, err = proc.communicate(timeout=READ_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()  # not waited for: a reader in uninterruptible sleep would hold us too
        pytest.fail(f"{' '.join(cmd)} blocked for {READ_TIMEOUT_S} s")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def _cat(path: Path) -> subprocess.CompletedProcess:
    return _run(["cat", os.fspath(path)])


def _assert_eio(path: Path) -> None:
    r = _cat(path)
    assert r.returncode != 0 and b"Input/output error" in r.stderr, (path, r.returncode, r.stderr[-300:])


def _assert_logged(mounter, mnt, *words) -> None:
    """Some WARNING/ERROR line of the daemon's log holds every one of WORDS."""

    def found():
        lines = mounting.log_lines_naming(mounter.log_text(mnt), words[0])
        return any(all(w in ln for w in words) for ln in lines)

    assert mounting.wait_until(found, 5, 0.05), f"no log line with {words}:\n{mounter.log_text(mnt)[-3000:]}"


def _v2_array(root: Path, name: str, compressor, rng, spec=SMALL) -> np.ndarray:
    import zarr

    arr = zarr.create_array(
        store=os.fspath(root), name=name, zarr_format=2, compressors=compressor, fill_value=0.0, **spec
    )
    value = rng.random(spec["shape"])
    arr[...] = value
    return value


@pytest.mark.log_errors_expected
def test_store_values_that_are_not_regular_files(mount, tmp_path):
    """FIFOs and device nodes as chunks and as a metadata document: EIO for that read or node
    only, at once; the rest of the mount reads, lists and unmounts as usual."""
    import numcodecs
    import zarr

    root = tmp_path / "s.zarr"
    zarr.open_group(os.fspath(root), mode="w", zarr_format=2)
    rng = np.random.default_rng(5)
    good = {
        name: _v2_array(root, name, numcodecs.Zstd(level=1), rng)
        for name in ("good", "fifo_chunk", "dev_chunk", "zero_link", "h/ok", "h/fifo_meta")
    }
    os.unlink(root / "fifo_chunk/0.0")
    os.mkfifo(root / "fifo_chunk/0.0")
    os.unlink(root / "dev_chunk/0.0")
    os.mknod(root / "dev_chunk/0.0", stat.S_IFCHR | 0o600, os.makedev(1, 5))  # what /dev/zero is
    os.unlink(root / "zero_link/0.0")
    os.symlink("/dev/zero", root / "zero_link/0.0")
    os.unlink(root / "h/fifo_meta/.zarray")
    os.mkfifo(root / "h/fifo_meta/.zarray")

    mnt = mount(root)
    # The node is there, broken (`ls`, not os.listdir: a blocked lookup must not hang the tests).
    assert _run(["ls", os.fspath(mnt / "h")]).stdout.split() == [b"fifo_meta.npy", b"ok.npy"]
    for name, why in (
        ("fifo_chunk", "not a regular file: FIFO"),
        ("dev_chunk", "not a regular file: character device"),
        ("zero_link", "outside the store"),
    ):
        _assert_eio(mnt / f"{name}.npy")
        _assert_logged(mount, mnt, f"{name}/0.0", why)
        # In the store view such a key has size 0 (what stat says), so no read reaches it.
        assert _cat(mnt / ".zarrfs" / "store" / name / "0.0").stdout == b""
    _assert_eio(mnt / "h" / "fifo_meta.npy")
    _assert_logged(mount, mnt, "h/fifo_meta/.zarray", "not a regular file: FIFO")
    for name in ("good", "h/ok"):
        assert _cat(mnt / f"{name}.npy").stdout == oracles.npy_bytes(good[name]), name
    mounting.unmount_and_wait(mount, mnt)  # no worker is left blocked: the unmount is clean


def _peak_rss(pid: int) -> int:
    """The process's peak resident memory (VmHWM) in bytes."""
    with open(f"/proc/{pid}/status") as f:
        line = next(ln for ln in f if ln.startswith("VmHWM:"))
    return int(line.split()[1]) * 1024


@pytest.mark.log_errors_expected
def test_decode_bombs_fail_without_inflating(mount, tmp_path):
    """A chunk that decodes to 256 MiB in an array of 1 MiB chunks, for every compressor:
    EIO naming the key and the sizes; the daemon's peak memory barely moves. In an array of
    8 KiB chunks the same bomb is already too large a value to read."""
    import numcodecs
    import zarr

    root = tmp_path / "s.zarr"
    zarr.open_group(os.fspath(root), mode="w", zarr_format=2)
    rng = np.random.default_rng(6)
    healthy = _v2_array(root, "healthy", numcodecs.Zstd(level=1), rng)
    for codec_id in bombs.COMPRESSORS:
        _v2_array(root, codec_id, numcodecs.get_codec({"id": codec_id}), rng, BOMBED)
        (root / codec_id / "0.0").write_bytes(bombs.bomb(codec_id))
    _v2_array(root, "zstd_nosize", numcodecs.Zstd(level=1), rng, BOMBED)
    (root / "zstd_nosize" / "0.0").write_bytes(bombs.zstd_without_size(bombs.bomb("zstd")))
    _v2_array(root, "zlib_small", numcodecs.Zlib(), rng)
    (root / "zlib_small" / "0.0").write_bytes(bombs.bomb("zlib"))

    mnt = mount(root)
    (pid,) = mounting.pids_serving(mnt)
    assert _cat(mnt / "healthy.npy").stdout == oracles.npy_bytes(healthy)  # codecs loaded, caches warm
    before = _peak_rss(pid)
    for name in (*bombs.COMPRESSORS, "zstd_nosize"):
        _assert_eio(mnt / f"{name}.npy")
        _assert_logged(mount, mnt, f"{name}/0.0", f"more than the {BOMBED_CHUNK_NBYTES} expected")
    _assert_eio(mnt / "zlib_small.npy")
    _assert_logged(mount, mnt, "zlib_small/0.0", f"holds {len(bombs.bomb('zlib'))} bytes, more than")
    growth = _peak_rss(pid) - before
    assert growth < BOMB_PEAK_GROWTH_MAX, f"peak RSS grew by {growth >> 20} MiB refusing the bombs"


def _stats(mnt: Path) -> dict:
    return json.loads((mnt / ".zarrfs" / "stats.json").read_text())


def _two_big_arrays(root: Path, compressor) -> dict[str, np.ndarray]:
    import zarr

    values = {}
    for name in ("one", "two"):
        arr = zarr.create_array(
            store=os.fspath(root),
            name=name,
            zarr_format=2,
            shape=BIG_SHAPE,
            chunks=BIG_SHAPE,
            dtype="<f8",
            compressors=compressor,
        )
        values[name] = np.arange(np.prod(BIG_SHAPE), dtype="<f8").reshape(BIG_SHAPE) * (2 if name == "two" else 1)
        arr[...] = values[name]
    return values


def _two_readers(mnt: Path, name: str) -> dict[int, bytes]:
    got: dict[int, bytes] = {}

    def reader(i: int) -> None:
        got[i] = _cat(mnt / f"{name}.npy").stdout

    threads = [threading.Thread(target=reader, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return got


def test_chunk_larger_than_the_cache_is_decoded_once(mount, tmp_path):
    """A 48 MiB zstd chunk under an 8 MiB cache: `cat` reads it equal to np.save's bytes and
    decodes it once, not once per kernel read, a range at a time (never whole); two readers
    at once decode it once too."""
    import numcodecs

    root = tmp_path / "s.zarr"
    values = _two_big_arrays(root, numcodecs.Zstd(level=1))
    chunk_nbytes = values["one"].nbytes

    mnt = mount(root, CACHE)
    start = _stats(mnt)["bytes_decoded"]
    assert _cat(mnt / "one.npy").stdout == oracles.npy_bytes(values["one"])
    assert _stats(mnt)["bytes_decoded"] - start == chunk_nbytes

    start = _stats(mnt)["bytes_decoded"]
    got = _two_readers(mnt, "two")
    want = oracles.npy_bytes(values["two"])
    assert got[0] == want and got[1] == want
    stats = _stats(mnt)
    assert stats["bytes_decoded"] - start == chunk_nbytes, stats
    assert stats["oversize_loads"] == 0 and stats["oversize_chunks"] == 0 and stats["streamed_reads"] > 0


def test_chunk_larger_than_the_cache_decoded_whole_one_at_a_time(mount, tmp_path):
    """Chunks of a codec that cannot be decoded a range at a time (numcodecs' LZ4 block) under
    an 8 MiB cache: decoded whole, one chunk kept and decoded at a time, once per pass, and the
    log says what this costs."""
    import numcodecs

    root = tmp_path / "s.zarr"
    values = _two_big_arrays(root, numcodecs.LZ4())
    chunk_nbytes = values["one"].nbytes

    mnt = mount(root, CACHE)
    start = _stats(mnt)["bytes_decoded"]
    assert _cat(mnt / "one.npy").stdout == oracles.npy_bytes(values["one"])
    assert _stats(mnt)["bytes_decoded"] - start == chunk_nbytes
    _assert_logged(mount, mnt, "one/0.0", f"decodes to {chunk_nbytes} bytes, more than cache_size")

    got = _two_readers(mnt, "two")
    want = oracles.npy_bytes(values["two"])
    assert got[0] == want and got[1] == want
    stats = _stats(mnt)
    assert stats["oversize_chunks"] <= stats["oversize_slots"] == 1
