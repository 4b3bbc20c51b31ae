#!/usr/bin/env python3
"""The ceiling of a Python FUSE server: pyfuse3 serving files of given sizes from memory.

``empty_server.py MOUNTPOINT SIZE [SIZE...]`` mounts files ``f0``, ``f1``,
... of those byte sizes (read-only, zarrfs's mount options: keep_cache, the kernel's read-ahead
raised to 1 MiB) and serves every read as a memoryview slice of one buffer; it unmounts on
SIGTERM or SIGINT. ``benchmarks/bench.py`` measures zarrfs against it in the same run.

``empty_server.py --array DIR [--array DIR...] MOUNTPOINT`` serves instead, as ``f0``, ``f1``,
..., the ``.npy`` of each uncompressed 2-d array DIR (Zarr v2 or v3, C order, native byte
order, columns a whole number of chunks), every read gathered from the chunk files straight
into one reused buffer by one ``preadv`` per chunk it touches. That is the least work any server
does to serve those bytes (the chunk files' rows are not contiguous in the ``.npy``: they must
be copied), in a few lines and without zarrfs's planning, cache or checks: the most a cold read
of zarrfs's ``.npy`` can reach on this machine.

Never imports zarrfs.
"""

from __future__ import annotations

import argparse
import errno
import io
import json
import os
import signal
import stat
from concurrent.futures import ThreadPoolExecutor

import numcodecs
import numcodecs.blosc
import numpy as np
import pyfuse3
import trio

READ_AHEAD_KB = 1024  # what zarrfs's daemon writes to the mount's bdi (1 MiB requests)
DECODE_AHEAD = 1  # --array: chunk rows decoded ahead of the one being read


class Empty(pyfuse3.Operations):
    def __init__(self, sizes: list[int]) -> None:
        super().__init__()
        self.sizes = sizes
        self.buf = memoryview(bytearray(max(sizes)))  # touched: bytearray zero-fills

    def _attr(self, inode: int) -> pyfuse3.EntryAttributes:
        a = pyfuse3.EntryAttributes()
        a.st_ino = inode
        a.entry_timeout = a.attr_timeout = 60.0
        if inode == pyfuse3.ROOT_INODE:
            a.st_mode, a.st_nlink = stat.S_IFDIR | 0o555, 2
        else:
            a.st_mode, a.st_nlink, a.st_size = stat.S_IFREG | 0o444, 1, self.sizes[inode - 2]
        a.st_blksize = 1 << 20
        return a

    async def getattr(self, inode, ctx=None):
        return self._attr(inode)

    async def lookup(self, parent, name, ctx=None):
        n = name.decode()
        if (
            parent != pyfuse3.ROOT_INODE
            or not n.startswith("f")
            or not n[1:].isdigit()
            or int(n[1:]) >= len(self.sizes)
        ):
            raise pyfuse3.FUSEError(errno.ENOENT)
        return self._attr(int(n[1:]) + 2)

    async def opendir(self, inode, ctx):
        return inode

    async def readdir(self, fh, start, token):
        for i in range(start, len(self.sizes)):
            if not pyfuse3.readdir_reply(token, f"f{i}".encode(), self._attr(i + 2), i + 1):
                return

    async def open(self, inode, flags, ctx):
        return pyfuse3.FileInfo(fh=inode, keep_cache=True)

    async def read(self, fh, off, size):
        end = min(off + size, self.sizes[fh - 2])
        return self.buf[off:end] if off < end else b""


class GatherArrays(Empty):
    """Files f0.. are the .npy of 2-d arrays, each read gathered from their chunks."""

    def __init__(self, arrays: list[str]) -> None:
        self.arrays = [_Array(a) for a in arrays]
        super().__init__([len(a.header) + a.nbytes for a in self.arrays])
        self.out = bytearray(1 << 20)
        self.pool = ThreadPoolExecutor(os.cpu_count() or 1) if any(a.codec for a in self.arrays) else None
        numcodecs.blosc.use_threads = False  # several threads decode

    async def read(self, fh, off, size):
        arr = self.arrays[fh - 2]
        end = min(off + size, self.sizes[fh - 2])
        if off >= end:
            return b""
        if end - off > len(self.out):
            self.out = bytearray(end - off)
        out = memoryview(self.out)[: end - off]
        h = arr.header
        n = max(0, min(len(h), end) - off)
        out[:n] = h[off : off + n]
        d0, d1 = off + n - len(h), end - len(h)  # the read's bytes of the array's data
        rb, cb, ch = arr.row_bytes, arr.strip_bytes, arr.chunk_rows
        while d0 < d1:
            r = d0 // rb
            stop = min((r // ch + 1) * ch * rb, d1)  # up to the end of this row of chunks
            base = d0 - n  # a data byte's place in OUT is its offset minus BASE
            decoded = arr.decoded_row(r // ch, self.pool) if arr.codec else None
            for j in range(arr.chunk_cols):
                s = r * rb + j * cb  # row R's strip of chunk column J
                a, b = max(s, d0), min(s + cb, stop)
                at = (r % ch) * cb + a - s if a < b else (r % ch + 1) * cb  # in the chunk's bytes
                if decoded is None:  # the chunk's file holds its bytes: read them into place
                    iov = [out[a - base : b - base]] if a < b else []
                    # the later rows' strips follow each other in the chunk's file
                    iov += [out[t - base : min(t + cb, stop) - base] for t in range(s + rb, stop, rb)]
                    fd = arr.fd(r // ch, j)
                    for k in range(0, len(iov), 1024):  # IOV_MAX
                        at += os.preadv(fd, iov[k : k + 1024], at)
                    continue
                c = decoded[j]
                if a < b:
                    out[a - base : b - base] = c[at : at + b - a]
                    at += b - a
                full = max(0, (stop - s - cb) // rb)  # later rows' strips wholly before STOP
                if full > 0:  # whole strips: one strided copy
                    dst = np.ndarray((full, cb), np.uint8, self.out, s + rb - base, (rb, 1))
                    dst[...] = c[at : at + full * cb].reshape(full, cb)
                    at += full * cb
                t = s + (full + 1) * rb
                if t < stop:  # the last row's part
                    out[t - base : stop - base] = c[at : at + stop - t]
            n += stop - d0
            d0 = stop
        return out


class _Array:
    """A 2-d Zarr array's chunk files, their codec (a lone blosc, zstd or gzip compressor, or
    none) and its .npy header; chunk rows decoded ahead (`decoded_row`)."""

    def __init__(self, path: str) -> None:
        self.path = path
        if os.path.exists(os.path.join(path, "zarr.json")):
            with open(os.path.join(path, "zarr.json")) as f:
                m = json.load(f)
            shape, chunks = m["shape"], m["chunk_grid"]["configuration"]["chunk_shape"]
            codecs = m["codecs"]
            dtype = np.dtype(m["data_type"]).newbyteorder(
                "<" if codecs[0].get("configuration", {}).get("endian", "little") == "little" else ">"
            )
            plain = codecs[0]["name"] == "bytes" and len(codecs) <= 2
            compressor = {"id": codecs[1]["name"], **codecs[1].get("configuration", {})} if len(codecs) == 2 else None
            enc = m["chunk_key_encoding"]
            sep = enc.get("configuration", {}).get("separator", "/" if enc["name"] == "default" else ".")
            self.key = ("c" + sep if enc["name"] == "default" else "") + "{}" + sep + "{}"
        else:
            with open(os.path.join(path, ".zarray")) as f:
                m = json.load(f)
            shape, chunks, dtype = m["shape"], m["chunks"], np.dtype(m["dtype"])
            plain, compressor = not m.get("filters") and m["order"] == "C", m["compressor"]
            self.key = "{}" + m.get("dimension_separator", ".") + "{}"
        if compressor is not None and compressor["id"] not in ("blosc", "zstd", "gzip"):
            plain = False
        if len(shape) != 2 or not plain or not dtype.isnative or shape[1] % chunks[1]:
            raise SystemExit(
                f"empty_server: {path} is not a 2-d array of whole chunk columns, "
                "without filters, compressed by blosc, zstd, gzip or nothing"
            )
        self.codec = (
            {"blosc": numcodecs.Blosc, "zstd": numcodecs.Zstd, "gzip": numcodecs.GZip}[compressor["id"]]()
            if compressor
            else None
        )
        self.nbytes = shape[0] * shape[1] * dtype.itemsize
        self.row_bytes, self.strip_bytes = shape[1] * dtype.itemsize, chunks[1] * dtype.itemsize
        self.chunk_rows, self.chunk_cols = chunks[0], shape[1] // chunks[1]
        self.chunk_bytes = chunks[0] * self.strip_bytes
        h = io.BytesIO()
        np.lib.format.write_array_header_1_0(
            h, {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": tuple(shape)}
        )
        self.header = h.getvalue()
        self.fds: dict[tuple[int, int], int] = {}
        self.rows: dict[int, list] = {}  # chunk row -> its chunks' decodes (futures)
        self.spare: list[np.ndarray] = []  # decode buffers given back

    def fd(self, i: int, j: int) -> int:
        fd = self.fds.get((i, j))
        if fd is None:
            fd = self.fds[(i, j)] = os.open(os.path.join(self.path, self.key.format(i, j)), os.O_RDONLY)
        return fd

    def decoded_row(self, i: int, pool: ThreadPoolExecutor) -> list[np.ndarray]:
        """Chunk row I's chunks decoded (the next DECODE_AHEAD rows started); rows before I are
        dropped, their buffers kept for the next decodes."""
        for k in [k for k in self.rows if k < i]:
            self.spare += [f.result() for f in self.rows.pop(k)]
        for k in range(i, min(i + 1 + DECODE_AHEAD, -(-self.nbytes // (self.chunk_rows * self.row_bytes)))):
            if k not in self.rows:
                self.rows[k] = [
                    pool.submit(self._decode, k, j, self.spare.pop() if self.spare else None)
                    for j in range(self.chunk_cols)
                ]
        return [f.result() for f in self.rows[i]]

    def _decode(self, i: int, j: int, buf: np.ndarray | None) -> np.ndarray:
        with open(os.path.join(self.path, self.key.format(i, j)), "rb") as f:
            data = f.read()
        if buf is None:
            buf = np.empty(self.chunk_bytes, np.uint8)
        self.codec.decode(data, out=buf)
        return buf


async def serve(mnt: str) -> None:
    async with trio.open_nursery() as nursery:

        async def stop() -> None:
            with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                async for _ in signals:
                    pyfuse3.terminate()
                    return

        def tune() -> None:
            dev = os.stat(mnt).st_dev
            with open(f"/sys/class/bdi/{os.major(dev)}:{os.minor(dev)}/read_ahead_kb", "w") as f:
                f.write(str(READ_AHEAD_KB))

        nursery.start_soon(stop)
        nursery.start_soon(trio.to_thread.run_sync, tune)
        await pyfuse3.main()
        nursery.cancel_scope.cancel()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--array", action="append", default=[], metavar="DIR")
    parser.add_argument("mountpoint")
    parser.add_argument("sizes", type=int, nargs="*")
    args = parser.parse_args()
    if bool(args.array) == bool(args.sizes):
        parser.error("give either file sizes or --array directories")
    opts = set(pyfuse3.default_options) | {"fsname=empty", "ro"}
    ops = GatherArrays(args.array) if args.array else Empty(args.sizes)
    pyfuse3.init(ops, args.mountpoint, opts)
    try:
        trio.run(serve, args.mountpoint)
    finally:
        pyfuse3.close(unmount=True)


if __name__ == "__main__":
    main()
