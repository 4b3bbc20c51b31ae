"""Where a snapshot's native chunks lie in a repository on local disk, so that zarrfs reads them as files.

Icechunk 2 lists an array's chunk references (`array_chunk_iterator`): a native chunk is a
byte range (offset, length) of the object `chunks/ID` of the repository. In a repository in a
local directory that object is a file, which zarrfs then reads itself: Icechunk 2's local
storage reads an object as a stream of 8 KiB pieces, a thread hop each, four times the CPU of
one read (docs/PERFORMANCE.md: Icechunk), and an uncompressed chunk can be read straight into a
read's reply (engine/fastpath/direct.py). Chunk objects are never rewritten (a new chunk is a
new ID), so a snapshot's table holds as long as the snapshot. Icechunk 1 lists no chunk
references: its reads all go through icechunk.

Pure: the store (store.py) hands over the batches of references, read on its own loop.
"""

from __future__ import annotations

import collections
import logging
import os
import threading
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from ...errors import ZarrfsError
from .. import local

log = logging.getLogger(__package__)

# The kind of a native chunk in array_chunk_iterator's batches (icechunk.ChunkType.native).
NATIVE = 1
# The directory of native chunk objects in a repository, every format.
CHUNKS_DIR = "chunks"
# References per array beyond which no table is made (its chunks are read through icechunk):
# a table costs 36 bytes a chunk (its key, ID, offset and length), so at most 144 MiB.
MAX_REFS = 1 << 22
# What array_chunk_iterator hands over at once.
BATCH = 1 << 16

Batches = Callable[[str], Iterable[tuple[Any, ...]]]
Located = tuple[str, int, int]  # (file, offset, length)


def split_chunk_key(key: str) -> tuple[str, tuple[int, ...]] | None:
    """(array path, chunk coordinates) of a Zarr v3 chunk key in the default encoding (the only
    one Icechunk holds: `a/b/c/0/1`, `c/0` at the root, `a/c` for a 0-d array), else None."""
    if key == "c" or key.endswith("/c"):
        return key[:-2], ()
    path, sep, coords = ("/" + key).rpartition("/c/")
    if not sep or not coords:
        return None
    parts = coords.split("/")
    if not all(p.isdigit() for p in parts):
        return None
    return path.lstrip("/"), tuple(int(p) for p in parts)


class ArrayChunks:
    """One array's native chunks: their coordinates as one sorted number each, IDs, offsets, lengths."""

    def __init__(self, batches: Iterable[tuple[Any, ...]]) -> None:
        coords, ids, offsets, lengths = [], [], [], []
        total = 0
        for batch_coords, kinds, paths, batch_offsets, batch_lengths, _inlined in batches:
            native = np.asarray(kinds) == NATIVE
            total += int(native.sum())
            if total > MAX_REFS:
                raise OverflowError(f"more than {MAX_REFS} chunks")
            coords.append(np.asarray(batch_coords, np.int64)[native])
            ids.append(np.array([p for p, n in zip(paths, native) if n], dtype="S"))
            offsets.append(np.asarray(batch_offsets, np.uint64)[native])
            lengths.append(np.asarray(batch_lengths, np.uint64)[native])
        self.ndim = coords[0].shape[1] if coords and coords[0].ndim == 2 else 0
        grid = np.concatenate(coords) if coords else np.zeros((0, self.ndim), np.int64)
        # Each chunk's coordinates as one number (mixed radix over the largest coordinates seen).
        self.extent = tuple(int(x) + 1 for x in grid.max(axis=0)) if len(grid) else (0,) * self.ndim
        if np.prod([float(x) for x in self.extent]) >= 2.0**63:
            raise OverflowError("chunk grid too large to number")
        flat = np.ravel_multi_index(grid.T, self.extent) if self.ndim else np.zeros(len(grid), np.int64)
        order = np.argsort(flat, kind="stable")
        self.flat = np.asarray(flat, np.int64)[order]
        self.ids = (np.concatenate(ids) if ids else np.zeros(0, "S1"))[order]
        self.offsets = (np.concatenate(offsets) if offsets else np.zeros(0, np.uint64))[order]
        self.lengths = (np.concatenate(lengths) if lengths else np.zeros(0, np.uint64))[order]

    def __len__(self) -> int:
        return len(self.flat)

    def find(self, coords: tuple[int, ...]) -> tuple[str, int, int] | None:
        """(chunk ID, offset, length) of the native chunk at COORDS, else None (absent, inline or virtual)."""
        if len(coords) != self.ndim or any(c >= e for c, e in zip(coords, self.extent)):
            return None
        flat = np.ravel_multi_index(coords, self.extent) if self.ndim else 0
        at = int(np.searchsorted(self.flat, flat))
        if at >= len(self.flat) or self.flat[at] != flat:
            return None
        return self.ids[at].decode("ascii"), int(self.offsets[at]), int(self.lengths[at])


class ChunkFiles:
    """The native chunks of one read-only snapshot of a local repository: a table per array, made
    at the first read of one of its chunks (`locate`), in a worker thread."""

    def __init__(self, repository_dir: str, batches: Batches) -> None:
        self.chunks_dir = os.path.join(repository_dir, CHUNKS_DIR)
        self._batches = batches  # array path -> its batches of references (may raise)
        self._tables: dict[str, ArrayChunks | None] = {}  # None: not made (too many chunks)
        self._lock = threading.Lock()

    def locate(self, key: str, load: bool = True) -> Located | None:
        """(file, offset, length) of the chunk under KEY when it is a native chunk, else None.
        Without LOAD (a thread that must not wait), None also while its array has no table yet."""
        split = split_chunk_key(key)
        if split is None:
            return None
        path, coords = split
        if path in self._tables:  # (entries are only ever added)
            table = self._tables[path]
        elif not load:
            return None
        else:
            table = self._table(path)
        if table is None:
            return None
        found = table.find(coords)
        if found is None:
            return None
        chunk_id, offset, length = found
        return os.path.join(self.chunks_dir, chunk_id), offset, length

    def _table(self, path: str) -> ArrayChunks | None:
        with self._lock:  # one thread reads the references; the others wait for its table
            if path in self._tables:
                table = self._tables[path]
            else:
                try:
                    table = ArrayChunks(self._batches("/" + path))
                except (OverflowError, ZarrfsError) as e:  # its chunks are read through icechunk
                    log.warning("chunks of %r are read through icechunk: %s", path or "/", e)
                    table = None
                self._tables[path] = table
            return table


class RepositoryChunks:
    """The native chunks of a local repository's read-only snapshots: a ChunkFiles for each, the
    KEPT most recently used."""

    def __init__(self, repository_dir: str, references: Callable[[Any, str], Any], kept: int) -> None:
        self.repository_dir, self.kept = repository_dir, kept
        self._references = references  # (a session's store, array path) -> its batches of references
        self._snapshots: collections.OrderedDict[str, ChunkFiles] = collections.OrderedDict()
        self._lock = threading.Lock()

    def locate(self, snapshot_id: str, store: Callable[[], Any], key: str, load: bool) -> Located | None:
        """Where the chunk under KEY of snapshot SNAPSHOT_ID lies (see ChunkFiles.locate); STORE()
        gives its session's store (None: no such snapshot) when its references are to be read."""
        with self._lock:
            files = self._snapshots.get(snapshot_id)
            if files is not None:
                self._snapshots.move_to_end(snapshot_id)
        if files is None:
            session_store = store() if load else None
            if session_store is None:
                return None
            files = ChunkFiles(self.repository_dir, lambda path: self._references(session_store, path))
            with self._lock:
                files = self._snapshots.setdefault(snapshot_id, files)
                while len(self._snapshots) > self.kept:
                    self._snapshots.popitem(last=False)
        return files.locate(key, load)


def read_located(key: str, located: Located, max_nbytes: int | None, into: Any) -> Any:
    """The chunk under KEY from where it lies (read into INTO as local.read_file does), or None
    when that file does not hold it (icechunk then reads it, and says what is wrong)."""
    path, offset, length = located
    try:
        data = local.read_file(path, key, offset, offset + length, max_nbytes, into)
    except OSError:
        return None
    return data if data is not None and len(data) == length else None
