"""Direct reads: the bytes of uncompressed chunks copied from the files that hold them straight into a read's reply.

An uncompressed chunk file already holds the elements in the array's byte order: "decoding"
it is a copy. Loading it whole into the chunk cache costs a copy into fresh memory (fresh
memory costs several times a reused buffer) and keeps a second copy of what the OS page
cache holds anyway. A read of such an array (C order, the dtype as stored) instead reads
the parts of rows it needs from each chunk file it touches straight into their places in
the reply: one preadv per chunk for each run of rows in one row of chunks (`read_sync`).
The store says where a chunk lies (`chunk_file`): a local store's key is a file of its own; a
chunk of a local Icechunk repository, a byte range of one of its chunk objects.

Pure (no trio): the engine decides where it runs. `read_sync` first without blocking
(`RWF_NOWAIT`: only pages the OS has cached; tmpfs and ramfs never wait for a disk), and
what would wait, in a worker thread. A chunk that is not in a regular file of the exact size
(absent: the fill value; corrupt, special; one the store does not place) sends the read to the
engine's usual path, which says what is wrong.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import threading
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any, TypeGuard

import numpy as np

from ... import grid
from ...codecs.chain import decodes_into, reads_into
from ...grid import Index
from ...storage.base import BaseStore
from ...storage.local import LOCAL_OPEN_FLAGS
from ...views.streams import ArrayStream, ByteStream, ReadPlan, array_stream, plan_bytes
from .gates import LOAD_MAX_RATIO, PIECE_MIN_BYTES

# Open chunk files kept: a 1 MiB read of a wide array touches a row of chunks; a few rows of
# them open cost nothing, while reopening per read costs a path lookup per chunk per read.
OPEN_FILES = 256
# Recipes of runs the trio thread keeps (_Run.chunk_parts). A recipe has a view per row part of
# a read of at most 1 MiB (the kernel's largest): at most 256 of 4 KiB (narrower rows are read
# into scratch), some 100 KB of objects.
RECIPES = 64
# How a run is read (`_Run._recipe`): per chunk column, (J, where its bytes start, [(buffers of
# one preadv, their bytes)]).
Recipe = list[tuple[int, int, list[tuple[list[memoryview], int]]]]
# The most buffers one preadv takes (Linux's UIO_MAXIOV), and the least row read into place
# by one of them: narrower rows are read whole into scratch and copied into place (a buffer
# per narrow row costs the kernel more than the extra copy; docs/PERFORMANCE.md).
IOV_MAX = 1024
ROW_MIN_BYTES = 4096
# A transposing copy takes a chunk's rows TRANSPOSE_STAGE_BYTES of them at a time, at least
# TRANSPOSE_MIN_ROWS (`stage_rows`: 128 rows of 4 KiB), and copies them a block of
# TRANSPOSE_BLOCK_BYTES of their columns at a time (`copy_transposed`).
TRANSPOSE_STAGE_BYTES = 512 << 10
TRANSPOSE_MIN_ROWS = 16
TRANSPOSE_BLOCK_BYTES = 128 << 10


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


def eligible(stream: ByteStream) -> TypeGuard[ArrayStream]:
    """Whether reads of STREAM can be copied straight from chunk files: chunks stored one key
    each, nothing but the bytes layout in C order, elements in the stream's own dtype."""
    if not array_stream(stream):  # a slice view
        return False
    meta = stream.meta
    chain = meta.codec
    return (
        reads_into(chain)
        and chain.array_bytes.order == "C"
        and chain.array_bytes.stored_dtype(meta.dtype) == meta.dtype == stream.dtype
        and meta.source is None
        and stream.order == "C"
        and meta.dtype.itemsize > 0
        and not meta.dtype.hasobject
        and len(meta.shape) > 0
        and all(meta.chunk_shape)
    )


def transposed(stream: ArrayStream, decoded: bool = False) -> bool:
    """Whether a whole 2-d array's stream, in the array's own dtype, reads its chunks across
    their memory order (the F view of C-ordered chunks, or the .npy of F-ordered ones), each
    chunk its file's bytes (DECODED: decoded into a buffer given for it instead, a lone blosc or
    zstd compressor): each row of a chunk in memory holds a column of the stream's chunk, so a
    row of the stream's chunks (`ArrayStream.chunk_row_bytes`) is copied transposed from them
    (`transposed_chunks`)."""
    if not stream.is_array_stream or stream.chunk is not None or len(stream.meta.shape) != 2:
        return False
    meta = stream.meta
    chain = meta.codec
    if decoded:
        if not decodes_into(chain):
            return False
    elif not reads_into(chain) or chain.array_bytes.stored_dtype(meta.dtype) != meta.dtype:
        return False
    return (
        chain.array_bytes.order != stream.order
        and stream.dtype == meta.dtype
        and meta.source is None
        and meta.dtype.itemsize > 0
        and not meta.dtype.hasobject
        and all(meta.chunk_shape)
    )


def transposed_chunks(
    stream: ArrayStream, k: int, count: int, out: np.ndarray, part: int = 0, parts: int = 1
) -> Iterator[tuple[Index, np.ndarray]]:
    """For rows K.. K+COUNT-1 of a `transposed` stream's chunks (as many as there are), laid
    out in OUT as the stream's bytes: each chunk of share PART of PARTS of their chunk columns,
    as (its grid position in the array, the view of OUT it fills: the stream's rows by the
    chunk's columns there, edge chunks clipped)."""
    (s0, s1), (a, b) = stream.stream_shape, stream.stream_chunks
    columns = -(-s1 // b)
    at = 0
    for i in range(k, min(k + count, -(-s0 // a))):
        rows = np.ndarray((min(a, s0 - i * a), s1), stream.dtype, out, at)
        for m in range(part * columns // parts, (part + 1) * columns // parts):
            yield stream.array_index((i, m)), rows[:, m * b : (m + 1) * b]
        at += rows.nbytes


def stage_rows(row_bytes: int) -> int:
    """Rows of ROW_BYTES of a chunk that a transposing copy takes at a time (from its file,
    through a stage, or from its decoded buffer)."""
    return max(TRANSPOSE_MIN_ROWS, TRANSPOSE_STAGE_BYTES // max(1, row_bytes))


def copy_transposed(dst: np.ndarray, src: np.ndarray) -> None:
    """DST[...] = SRC.T (SRC: a few rows of a chunk in memory order), a block of SRC's columns
    at a time: each block (TRANSPOSE_BLOCK_BYTES) stays in the CPU's caches while it is read
    across, and each of DST's rows gets SRC's rows' count of elements in one run.

    Those runs are numpy's inner loop, and short ones cost; the blocks keep what is read
    across small on CPUs whose caches hold little (docs/PERFORMANCE.md)."""
    n = src.shape[0]
    step = max(1, TRANSPOSE_BLOCK_BYTES // max(1, n * src.itemsize))
    for c in range(0, src.shape[1], step):
        dst[c : c + step] = src[:, c : c + step].T


def transposed_bytes(stream: ArrayStream, k: int, count: int) -> int:
    """Bytes of the stream that rows K.. K+COUNT-1 of its chunks hold (as many as there are)."""
    (s0, s1), a = stream.stream_shape, stream.stream_chunks[0]
    return max(0, min((k + count) * a, s0) - k * a) * s1 * stream.dtype.itemsize


def worth(stream: ByteStream, plan: ReadPlan, nbytes: int) -> TypeGuard[ArrayStream]:
    """Whether a read of NBYTES of STREAM is taken from the chunk files (see PIECE_MIN_BYTES)."""
    pieces = len(plan.chunks)
    if pieces * PIECE_MIN_BYTES > nbytes and pieces * stream.meta.chunk_nbytes <= LOAD_MAX_RATIO * nbytes:
        return False
    return eligible(stream)


class DirectReads:
    """Reads of eligible streams from the files that hold their chunks (a store's `chunk_file`:
    a local store's keys, a local Icechunk repository's chunk objects), a few files kept open."""

    def __init__(self, store: BaseStore) -> None:
        self.store = store
        # tmpfs and ramfs never wait for a disk (and refuse RWF_NOWAIT): read them anywhere.
        self.in_memory = file_system_type(os.path.realpath(store.root)) in MEMORY_FILE_SYSTEMS
        self.nowait_works = True  # until the file system refuses RWF_NOWAIT
        self._buf = np.empty(0, np.uint8)  # see _scratch
        self._pad = memoryview(bytearray(0))  # see _junk
        self._files = _OpenFiles()  # the trio thread's
        # The trio thread's recipes (_Run.chunk_parts): (stream, run) -> (the buffer it reads into, recipe).
        self._recipes: dict[tuple[ByteStream, int, int, int, int], tuple[np.ndarray, Recipe]] = {}
        self._local = threading.local()  # each worker thread's own (`_worker_files`)
        self._generation = 0  # of the worker threads' tables: older ones are dropped at their next use

    def close(self) -> None:
        """Close every kept file (a refresh: the store may hold other files under those keys now).
        Worker threads close theirs at their next read."""
        self._generation += 1
        self._files.close()
        self._recipes.clear()

    def _worker_files(self) -> _OpenFiles:
        """The calling worker thread's table of open files (closed with the thread)."""
        local = self._local
        if getattr(local, "generation", None) != self._generation:
            if getattr(local, "files", None) is not None:
                local.files.close()
            local.files, local.generation = _OpenFiles(), self._generation
        return local.files

    def _file(self, meta: Any, idx: Index, nbytes: int, files: _OpenFiles, load: bool = True) -> tuple[int, int]:
        """An open file holding a chunk of NBYTES, and where in it the chunk starts; kept in FILES.
        Without LOAD (the trio thread), a chunk whose place the store would have to look up first
        is left to the usual path."""
        found = files.get((meta.path, idx))
        if found is not None:
            files.move_to_end((meta.path, idx))
            return found
        key = meta.chunk_key(idx)
        located = self.store.chunk_file(key, load)
        if located is None:
            raise Fallback(key)
        path, offset, length = located
        if length is not None and length != nbytes:
            raise Fallback(key)
        try:
            fd = os.open(path, LOCAL_OPEN_FLAGS)
        except OSError:
            raise Fallback(key) from None
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or (st.st_size != nbytes if length is None else st.st_size < offset + nbytes):
            os.close(fd)
            raise Fallback(key)
        files[(meta.path, idx)] = found = (fd, offset)
        while len(files) > OPEN_FILES:
            os.close(files.popitem(last=False)[1][0])
        return found

    def read_sync(self, stream: ArrayStream, plan: ReadPlan, out: np.ndarray, nowait: bool) -> memoryview | bytes:
        """The bytes of PLAN, assembled in OUT (at least `stream.element_bytes(plan)` bytes).

        With NOWAIT (the trio thread): only from the OS's page cache, else WouldBlock.
        Without (a worker thread): may wait for a disk. Each thread keeps files open in a
        table of its own.

        The read is taken a run of rows at a time (rows of the last dimension in one row of
        chunks, at consecutive rows of its chunk files), each run a chunk at a time: the
        run's bytes in a chunk file are one span (its rows' parts, and an edge chunk's padding
        between them), read by one preadv straight into the rows' places in OUT. Rows
        narrower than ROW_MIN_BYTES are read whole into a scratch buffer instead, every
        chunk's, and put in place by a few strided copies per run.
        """
        if plan.take_bytes == 0:
            return plan.header_part
        shape, chunks = stream.stream_shape, stream.stream_chunks  # C order: the array's own
        ncols = shape[-1]
        run = _Run(self, stream, out, nowait)
        e0, e1 = plan.first_elem, plan.stop_elem
        row = e0 // ncols
        while row * ncols < e1:
            lead, within, m = grid.row_run(row, shape, chunks)
            q = grid.flat_row(within, chunks)  # the row's row in its chunks' files
            m = min(m, -(-e1 // ncols) - row)
            lo = e0 - row * ncols if row * ncols < e0 else 0
            if m == 2 and e1 - (row + 1) * ncols < lo:  # the end of a row, the start of the next: no column in both
                m = 1
            hi = min(e1 - (row + m - 1) * ncols, ncols)
            at = (row * ncols - e0) * run.item  # where the run's first row begins in OUT (its column 0)
            if m > 1 and run.narrow:
                run.whole_rows(lead, q, m, lo, hi, at)
            else:
                run.chunk_parts(lead, q, m, lo, hi, at)
            row += m
        return plan_bytes(plan, out)

    def transposed_rows_sync(self, stream: ArrayStream, k: int, count: int, out: np.ndarray) -> memoryview:
        """The bytes of rows K.. K+COUNT-1 of a `transposed` stream's chunks (as many of them as
        there are), assembled in OUT from their chunk files: a few file rows at a time
        (`stage_rows`) read into a stage that stays in the CPU's caches, then copied transposed
        into place (`copy_transposed`). A worker thread (files of its own); Fallback for a
        chunk that is absent, short, or not a regular file."""
        meta, item, a = stream.meta, stream.dtype.itemsize, stream.stream_chunks[0]
        per = stage_rows(a * item)
        local = self._local
        stage = getattr(local, "stage", None)
        if stage is None or len(stage) < per * a * item:
            stage = local.stage = np.empty(per * a * item, np.uint8)
        file_rows = stage[: per * a * item].view(stream.dtype).reshape(per, a)
        flat = stage.data
        files = self._worker_files()
        for idx, dst in transposed_chunks(stream, k, count, out):
            fd, base = self._file(meta, idx, meta.chunk_nbytes, files)
            rows, cols = dst.shape
            for r in range(0, cols, per):
                n = min(per, cols - r)
                if os.preadv(fd, [flat[: n * a * item]], base + r * a * item) != n * a * item:
                    raise Fallback(meta.chunk_key(idx))  # cut short meanwhile
                copy_transposed(dst[:, r : r + n], file_rows[:n, :rows])
        return out.data[: transposed_bytes(stream, k, count)]

    def _scratch(self, nbytes: int) -> np.ndarray:
        """A buffer of at least NBYTES for the trio thread's reads, reused (no fresh memory per read)."""
        if len(self._buf) < nbytes:
            self._buf = np.empty(nbytes, np.uint8)
        return self._buf

    def _junk(self, nbytes: int) -> memoryview:
        """NBYTES to read an edge chunk's padding into (never read back: any thread may share them)."""
        if len(self._pad) < nbytes:
            self._pad = memoryview(bytearray(nbytes))
        return self._pad[:nbytes]


class _Run:
    """One read_sync call's reading of runs of rows into OUT."""

    def __init__(self, reads: DirectReads, stream: ArrayStream, out: np.ndarray, nowait: bool) -> None:
        self.reads, self.nowait, self.out, self.stream = reads, nowait, out, stream
        self.meta = meta = stream.meta
        self.item = item = stream.dtype.itemsize
        self.ncols, self.width = stream.stream_shape[-1], stream.stream_chunks[-1]
        self.row_bytes, self.chunk_row = self.ncols * item, self.width * item
        self.narrow = self.chunk_row < ROW_MIN_BYTES
        self.chunk_bytes = meta.chunk_nbytes  # (eligible: the stream's dtype and chunks are the array's)
        self.flags = os.RWF_NOWAIT if nowait and not reads.in_memory else 0
        self.files = reads._files if nowait else reads._worker_files()
        self.view = out.data.cast("B")
        # the trio thread, whose reads reuse one buffer: its recipes are kept
        self.recipes: dict[tuple[ByteStream, int, int, int, int], tuple[np.ndarray, Recipe]] | None = (
            reads._recipes if nowait else None
        )

    def chunk_parts(self, lead: Index, q: int, m: int, lo: int, hi: int, at: int) -> None:
        """Rows Q.. Q+M-1 of the chunk files of row of chunks LEAD (columns LO.. of the first
        row, ..HI of the last) read into OUT, the first row's column 0 being at AT: a preadv
        per chunk, by the run's recipe."""
        recipes, key = self.recipes, (self.stream, m, lo, hi, at)
        kept = recipes.get(key) if recipes is not None else None
        if kept is not None and kept[0] is self.out:
            recipe = kept[1]
        else:
            recipe = self._recipe(m, lo, hi, at)
            if recipes is not None:
                if len(recipes) >= RECIPES:
                    recipes.clear()
                recipes[key] = (self.out, recipe)
        stream, row_at = self.stream, q * self.chunk_row  # (the run's first row in the chunk files)
        for j, start, parts in recipe:
            self._read(stream.array_index(lead + (j,)), parts, row_at + start)

    def _recipe(self, m: int, lo: int, hi: int, at: int) -> Recipe:
        """How chunk_parts reads a run: for each chunk column J it touches, (J, the byte in its
        files' rows where the run's bytes start, [(buffers of OUT for one preadv, their bytes)]).

        A reader's reads are alike: `cat`'s 1 MiB reads of a 64 KiB-row array all begin at
        the same column, so all but those crossing a row of chunks read by one recipe, and
        the trio thread keeps them (one buffer's: its reused reply buffer). Building the
        buffers' views was most of the Python in a read (a 1 MiB read of the reference array
        is 16 chunks of 17 row parts each)."""
        item, view, rb, width, ncols = self.item, self.view, self.row_bytes, self.width, self.ncols
        recipe: Recipe = []
        for j in range(lo // width, (hi - 1) // width + 1) if m == 1 else range(-(-ncols // width)):
            c0 = j * width
            c1 = min(c0 + width, ncols)
            a, b = max(lo, c0), min(hi, c1)
            if m == 1:
                if a >= b:
                    continue
                iov = [view[at + a * item : at + b * item]]
                start = a - c0
            else:
                full = (c1 - c0) * item
                iov = [view[at + a * item : at + c1 * item]] if a < c1 else []
                start = a - c0 if a < c1 else width
                s = at + rb + c0 * item
                iov += [view[x : x + full] for x in range(s, s + (m - 2) * rb, rb)]
                if b > c0:
                    iov.append(view[at + (m - 1) * rb + c0 * item : at + (m - 1) * rb + b * item])
                if c1 - c0 < width:  # an edge chunk: its rows' padding lies between them
                    pad = self.reads._junk((width - c1 + c0) * item)
                    iov = [v for part in iov for v in (part, pad)][:-1]
            recipe.append((j, start * item, _parts(iov)))
        return recipe

    def whole_rows(self, lead: Index, q: int, m: int, lo: int, hi: int, at: int) -> None:
        """A run of narrow rows: rows Q.. Q+M-1 of every chunk column's file read whole into
        scratch, then copied into OUT (columns LO.. of the first row, ..HI of the last)."""
        item, rb, cr, ncols = self.item, self.row_bytes, self.chunk_row, self.ncols
        nj = -(-ncols // self.width)
        span = m * cr
        need = (nj * m + nj) * cr  # every chunk's rows, then one row put together
        if self.nowait:
            scratch = self.reads._scratch(need)
        else:
            scratch = np.empty(need, np.uint8)
        sv = scratch.data
        for j in range(nj):
            self._read(self.stream.array_index(lead + (j,)), _parts([sv[j * span : (j + 1) * span]]), q * cr)
        rows = scratch[: nj * span].reshape(nj, m, cr)
        nfull, edge = divmod(ncols * item, cr)  # whole chunk columns, and the edge one's bytes
        t0, t1 = (0 if lo == 0 else 1), (m if hi == ncols else m - 1)  # the rows needed whole
        if t1 > t0:
            dst = np.ndarray((t1 - t0, nfull, cr), np.uint8, self.out, at + t0 * rb, (rb, cr, 1))
            dst[...] = rows[:nfull, t0:t1].transpose(1, 0, 2)
            if edge:
                dst = np.ndarray((t1 - t0, edge), np.uint8, self.out, at + t0 * rb + nfull * cr, (rb, 1))
                dst[...] = rows[nfull, t0:t1, :edge]
        one = scratch[nj * span : need].reshape(nj, cr)
        out = self.out
        if t0 == 1:  # the first row from column LO
            one[...] = rows[:, 0]
            out[at + lo * item : at + rb] = one.reshape(-1)[lo * item : rb]
        if t1 == m - 1:  # the last row up to column HI
            one[...] = rows[:, m - 1]
            out[at + (m - 1) * rb : at + (m - 1) * rb + hi * item] = one.reshape(-1)[: hi * item]

    def _read(self, idx: Index, parts: list[tuple[list[memoryview], int]], at: int) -> None:
        """PARTS (`_parts`) filled from chunk IDX's file from byte AT on (WouldBlock, or Fallback
        for a file that falls short)."""
        reads, flags = self.reads, self.flags
        fd, base = reads._file(self.meta, idx, self.chunk_bytes, self.files, not self.nowait)
        at += base
        try:
            for iov, want in parts:
                if os.preadv(fd, iov, at, flags) != want:
                    if flags:
                        raise WouldBlock()
                    raise Fallback(self.meta.chunk_key(idx))
                at += want
        except BlockingIOError:
            raise WouldBlock() from None
        except OSError as e:
            if e.errno != errno.EOPNOTSUPP or not flags:
                raise Fallback(self.meta.chunk_key(idx)) from None
            reads.nowait_works = False
            raise WouldBlock() from None


def _parts(iov: list[memoryview]) -> list[tuple[list[memoryview], int]]:
    """IOV cut into lists one preadv takes (IOV_MAX), each with the bytes it holds (flat byte
    views: their lengths are their bytes)."""
    return [(iov[k : k + IOV_MAX], sum(map(len, iov[k : k + IOV_MAX]))) for k in range(0, len(iov), IOV_MAX)]


class _OpenFiles(OrderedDict[tuple[str, Index], tuple[int, int]]):
    """Chunk files kept open by one thread, least recently used first: (array path, chunk
    index) -> (file descriptor, where the chunk starts). Closed when dropped (a worker thread's,
    when the thread ends)."""

    def close(self) -> None:
        while self:
            os.close(self.popitem()[1][0])

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()
