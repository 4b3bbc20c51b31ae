"""Direct reads: the bytes of uncompressed chunks of a local store copied from their files straight into a read's reply.

An uncompressed chunk file already holds the elements in the array's byte order: "decoding"
it is a copy. Loading it whole into the chunk cache costs a copy into fresh memory (which
this machine pays several times over, FACTS.md) and keeps a second copy of what the OS page
cache holds anyway. A read of such an array (C order, the dtype as stored) instead reads,
for each chunk it touches, the span of the chunk file between the first and the last
element it needs into a reused buffer, and copies a strided view of it into the reply.

Pure (no trio): the engine decides where it runs. `read_sync` first without blocking
(`RWF_NOWAIT`: only pages the OS has cached; tmpfs and ramfs never wait for a disk), and
what would wait, in a worker thread. A chunk that is not a regular file of the exact size
(absent: the fill value; corrupt, special) sends the read to the engine's usual path,
which says what is wrong.
"""

from __future__ import annotations

import errno
import math
import os
import stat
from collections import OrderedDict
from typing import Any

import numpy as np

from .codecs import reads_into
from .layouts import ArrayStream, ReadPlan, plan_bytes
from .store import LOCAL_OPEN_FLAGS

# Open chunk files kept: a 1 MiB read of a wide array touches a row of chunks; a few rows of
# them open cost nothing, while reopening per read costs a path lookup per chunk per read.
OPEN_FILES = 256
# The most buffers one preadv takes (Linux's UIO_MAXIOV), and the least row read into place
# by one of them: narrower rows (64 float32 columns) cost more as numpy rows in a Python list
# than one read of their span and a strided copy.
IOV_MAX = 1024
ROW_MIN_BYTES = 4096

Index = tuple[int, ...]


class Fallback(Exception):
    """This read cannot be done directly (a chunk absent, short, or not a regular file)."""


class WouldBlock(Exception):
    """Some bytes are not in the OS's page cache: read again where blocking is allowed."""


MEMORY_FILE_SYSTEMS = ("tmpfs", "ramfs")


def file_system_type(path: str) -> str:
    """The type of the file system PATH is on (/proc/self/mounts: the longest mount point above it)."""
    best, kind = "", ""
    try:
        with open("/proc/self/mounts", encoding="utf-8", errors="replace") as f:
            for line in f:
                fields = line.split()
                if len(fields) < 3:
                    continue
                point = fields[1].replace("\\040", " ")
                if (path == point or path.startswith(point.rstrip("/") + "/")) and len(point) >= len(best):
                    best, kind = point, fields[2]
    except OSError:
        pass
    return kind


def eligible(stream: ArrayStream) -> bool:
    """Whether reads of STREAM can be copied straight from chunk files: chunks stored one key
    each, nothing but the bytes layout in C order, elements in the stream's own dtype."""
    if not isinstance(stream, ArrayStream):  # a slice view
        return False
    meta = stream.meta
    chain = meta.codec
    return (reads_into(chain) and chain.array_bytes.order == "C"
            and chain.array_bytes.stored_dtype(meta.dtype) == meta.dtype == stream.dtype
            and meta.source is None and stream.order == "C" and meta.dtype.itemsize > 0
            and not meta.dtype.hasobject and len(meta.shape) > 0 and all(meta.chunk_shape))


class DirectReads:
    """Reads of eligible streams from a local store's chunk files, with a few files kept open."""

    def __init__(self, store: Any) -> None:
        self.store = store
        # tmpfs and ramfs never wait for a disk (and refuse RWF_NOWAIT): read them anywhere.
        self.in_memory = file_system_type(os.path.realpath(store.root)) in MEMORY_FILE_SYSTEMS
        self.nowait_works = True  # until the file system refuses RWF_NOWAIT
        self._buf = np.empty(0, np.uint8)  # see _scratch
        self._files: OrderedDict[tuple[str, Index], tuple[int, int]] = OrderedDict()  # (path, idx) -> (fd, size)

    def close(self) -> None:
        """Close every kept file (a refresh: the store may hold other files under those keys now)."""
        while self._files:
            os.close(self._files.popitem()[1][0])

    def _file(self, meta: Any, idx: Index, nbytes: int, keep: bool) -> tuple[int, bool]:
        """An open file of a chunk of NBYTES (and whether the caller closes it)."""
        if keep:
            found = self._files.get((meta.path, idx))
            if found is not None:
                self._files.move_to_end((meta.path, idx))
                return found[0], False
        key = meta.chunk_key(idx)
        try:
            fd = os.open(self.store.path(key), LOCAL_OPEN_FLAGS)
        except OSError:
            raise Fallback(key) from None
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size != nbytes:
            os.close(fd)
            raise Fallback(key)
        if not keep:
            return fd, True
        self._files[(meta.path, idx)] = (fd, nbytes)
        while len(self._files) > OPEN_FILES:
            os.close(self._files.popitem(last=False)[1][0])
        return fd, False

    def read_sync(self, stream: ArrayStream, plan: ReadPlan, out: np.ndarray, nowait: bool) -> memoryview | bytes:
        """The bytes of PLAN, assembled in OUT (at least `stream.element_bytes(plan)` bytes).

        With NOWAIT (the trio thread): only from the OS's page cache, else WouldBlock; files
        are kept open. Without (a worker thread): may wait for a disk; files are opened and
        closed here, so no table is shared with the trio thread.
        """
        if plan.take_bytes == 0:
            return plan.header_part
        meta = stream.meta
        dtype = stream.dtype
        item = dtype.itemsize
        chunk_bytes = math.prod(meta.chunk_shape) * item
        strides = _strides(meta.chunk_shape)
        byte_strides = tuple(st * item for st in strides)
        flags = os.RWF_NOWAIT if nowait and not self.in_memory else 0
        buf = out[:stream.element_bytes(plan)].view(dtype)
        own = np.empty(0, np.uint8)  # a worker thread's scratch, reused by the call's pieces
        for idx, src, pos, box, dst in stream._pieces(plan):
            # The piece's elements lie between its first and its last in the chunk file.
            first = sum(sl.start * st for sl, st in zip(src, strides))
            span = (sum((sl.stop - 1) * st for sl, st in zip(src, strides)) - first + 1) * item
            target = buf[pos:pos + math.prod(box)].reshape(box)[dst]
            rows = _rows_in_place(target, src, meta.chunk_shape, span)
            if rows is None:  # one read of the span, then a strided view of it copied into place
                if nowait:
                    scratch = self._scratch(span)
                else:
                    scratch = own = own if len(own) >= span else np.empty(span, np.uint8)
                reads = [[scratch[:span]]]
            else:  # straight into place: a read into the rows of the piece, IOV_MAX at a time
                reads = [rows[i:i + IOV_MAX] for i in range(0, len(rows), IOV_MAX)]
            fd, owned = self._file(meta, idx, chunk_bytes, keep=nowait)
            try:
                at = first * item
                for iov in reads:
                    want = sum(v.nbytes for v in iov)
                    got = os.preadv(fd, iov, at, flags)
                    if got != want:
                        if nowait and flags:
                            raise WouldBlock()
                        raise Fallback(meta.chunk_key(idx))
                    at += got
            except BlockingIOError:
                raise WouldBlock() from None
            except OSError as e:
                if e.errno != errno.EOPNOTSUPP or not flags:
                    raise Fallback(meta.chunk_key(idx)) from None
                self.nowait_works = False
                raise WouldBlock() from None
            finally:
                if owned:
                    os.close(fd)
            if rows is None:
                target[...] = np.ndarray(tuple(sl.stop - sl.start for sl in src), dtype, scratch, 0, byte_strides)
        return plan_bytes(plan, out)

    def _scratch(self, nbytes: int) -> np.ndarray:
        """A buffer of at least NBYTES for the trio thread's reads, reused (no fresh memory per read)."""
        if len(self._buf) < nbytes:
            self._buf = np.empty(nbytes, np.uint8)
        return self._buf


def _rows_in_place(target: np.ndarray, src: tuple[slice, ...], chunk_shape: Index, span: int) -> list | None:
    """The pieces of TARGET (a piece's place in the reply) that its SPAN of chunk file bytes
    fills in order, when they can be read into directly: TARGET contiguous, or its rows each
    contiguous while the piece spans whole rows of the chunk (every other dimension whole)."""
    if target.flags.c_contiguous:
        return [target] if target.nbytes == span else None
    if (target.ndim >= 2 and target[0].nbytes >= ROW_MIN_BYTES and all(sl.start == 0 and sl.stop == n for sl, n in zip(src[1:], chunk_shape[1:]))
            and target[0].flags.c_contiguous and target[0].nbytes * len(target) == span):
        return list(target)
    return None


def _strides(shape: Index) -> list[int]:
    """C-order element strides of SHAPE."""
    out, acc = [], 1
    for n in reversed(shape):
        out.append(acc)
        acc *= n
    return out[::-1]
