"""The virtual namespace: inodes and names for groups, arrays and the `.zarrfs` views.

Runs in the trio thread (its tables need no locks); hierarchy and store I/O go through
the engine's worker threads. An inode is assigned once per (parent, name) and kept
while mounted, so names stay stable across lookups and directory pages.
"""

from __future__ import annotations

import base64
import bisect
import json
import logging
import math
import os
import re
import tempfile
from typing import Any

import numpy as np
import trio

from . import grid
from .engine import Engine
from . import npy
from .dtypes import check_fixed_size
from .errors import (Exists, Incomplete, InvalidArgument, IsADir, NotADir, NotEmpty, NotFound, NotPermitted,
                     TooBig, Unsupported, ZarrfsError)
from .formats.base import RESERVED_PREFIX, Hierarchy
from .model import ArrayMeta, BrokenNode, GroupMeta, NewArray, Node, join
from .layouts import ArrayStream

log = logging.getLogger(__name__)

ROOT_INODE = 1
NPY_SUFFIX = ".npy"
VIEWS_DIR = ".zarrfs"
STATS_FILE = "stats.json"
# The array views under .zarrfs: name -> (file suffix, element order, with NPY header).
ARRAY_VIEWS = {"": (".npy", "C", True), "npy-f": (".npy", "F", True),
               "raw": (".raw", "C", False), "raw-f": (".raw", "F", False)}
VIEW_DIRS = ("npy-f", "raw", "raw-f", "chunks", "store", "info")
# Linux's NAME_MAX: the kernel refuses a whole readdir reply that holds a longer name.
NAME_MAX_BYTES = 255
# A held-aside file (a temporary name) stays in memory up to this size, then spills to a
# file in tempfile.gettempdir() (TMPDIR, else /tmp): editors' and rsync's temporary files
# of small arrays never touch the disk, a large one costs no memory.
HELD_MEMORY_BYTES = 8 << 20
# A held file renamed to NAME.npy is streamed into the array in blocks of this size.
ADOPT_BLOCK_BYTES = 1 << 20


class Entry:
    """One file or directory of the mount."""

    __slots__ = ("inode", "kind", "view", "node", "stream", "error", "key", "stored_bytes", "children", "content",
                 "_lock", "_size", "pending", "replacing", "ingest", "parent", "staged", "received", "rejected",
                 "spool")

    def __init__(self, inode: int, kind: str, view: str = "", node: Node | None = None,
                 stream: ArrayStream | None = None, error: ZarrfsError | None = None,
                 key: str | None = None, size: int = 0) -> None:
        self.inode = inode
        # kind: group | array | views | chunkdir | chunk | storedir | storekey | info | stats | held
        self.kind = kind
        self.view = view
        self.node = node
        self.stream = stream
        self.error = error
        self.key = key  # store key (store view) or prefix (store dirs)
        self._size = stream.size if stream is not None else size
        self.stored_bytes: int | None = None  # bytes the store holds for it, when known
        self.children: dict[str, int] | None = None
        self.content: bytes | None = None
        self._lock: trio.Lock | None = None
        # Writes: an NPY file being created or replaced buffers its bytes until the header
        # is complete (`pending`); `replacing` is the array it replaces; then its chunks go
        # to a staged array (`staged`, committed at the close that completes it); `ingest`
        # is the stream the writer's own header describes (its order and header length);
        # `received` the data bytes that arrived; `rejected` why it will not be an array.
        self.pending: bytearray | None = None
        self.replacing: Node | None = None
        self.ingest: ArrayStream | None = None
        self.staged: Any = None
        self.received: Any = None
        self.rejected: ZarrfsError | None = None
        # A file held aside (kind "held"): its bytes, in memory or spilled to TMPDIR.
        self.spool: Any = None
        self.parent = 0

    @property
    def is_dir(self) -> bool:
        return self.kind in ("group", "views", "chunkdir", "storedir")

    @property
    def writable(self) -> bool:
        """Data files that writes go to (the .npy tree, npy-f, raw, raw-f, chunk files, held files)."""
        return self.kind in ("array", "chunk", "held")

    @property
    def size(self) -> int:
        if self.ingest is not None:
            return self.ingest.size
        if self.pending is not None:
            return len(self.pending)
        return self.stream.size if self.stream is not None else self._size

    @size.setter
    def size(self, value: int) -> None:
        self._size = value

    @property
    def lock(self) -> trio.Lock:
        if self._lock is None:
            self._lock = trio.Lock()
        return self._lock


def name_problem(name: str) -> str | None:
    """Why `name` cannot be a directory entry (None when it can)."""
    if name in ("", ".", ".."):
        return f"{name!r} is not a file name"
    if "/" in name or "\0" in name:
        return "a file name cannot hold / or NUL"
    try:
        n = len(os.fsencode(name))
    except UnicodeEncodeError:  # a lone surrogate from a JSON escape
        return "a file name must be valid text"
    if n > NAME_MAX_BYTES:
        return f"a name of {n} bytes is longer than a file name can be ({NAME_MAX_BYTES})"
    return None


def root_array_stem(source: str) -> str:
    """The name of a root array: SOURCE's last component without `.zarr`, else `array`."""
    last = re.split(r"[/\\]|::|://", source.rstrip("/"))[-1]
    stem = last[: -len(".zarr")] if last.endswith(".zarr") else last
    return stem or "array"


def _node_key(node: Node) -> str:
    """The store key a log line names for a node: its metadata document, else its path."""
    key = node.key if isinstance(node, BrokenNode) else node.metadata_key
    return key or node.path or "/"


def _stems(names: dict[str, int]) -> list[str]:
    """Node names of a group's listing: NAME.npy is node NAME, a directory its own name."""
    return [n[: -len(NPY_SUFFIX)] if n.endswith(NPY_SUFFIX) else n for n in names]


def _jsonable(value: Any) -> Any:
    """A fill value or attribute as JSON: NaN/Infinity as strings, bytes as base64."""
    if isinstance(value, np.ndarray):
        value = value.tolist() if value.dtype.kind not in "SVmM" or value.dtype.fields else value[()]
    if isinstance(value, (bytes, np.void)):
        return base64.b64encode(bytes(value)).decode()
    if isinstance(value, (np.datetime64, np.timedelta64)):
        return str(value)
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, complex):
        return [_jsonable(value.real), _jsonable(value.imag)]
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.generic):
        return _jsonable(value.item())
    return value


class Coverage:
    """Which bytes of a range arrived: sorted, disjoint, merged [start, end) spans."""

    def __init__(self) -> None:
        self._spans: list[tuple[int, int]] = []

    def add(self, start: int, end: int) -> None:
        if end <= start:
            return
        i = bisect.bisect_left(self._spans, (start, start))
        if i and self._spans[i - 1][1] >= start:
            i -= 1
        j = i
        while j < len(self._spans) and self._spans[j][0] <= end:
            start, end = min(start, self._spans[j][0]), max(end, self._spans[j][1])
            j += 1
        self._spans[i:j] = [(start, end)]

    @property
    def covered(self) -> int:
        return sum(end - start for start, end in self._spans)


def is_held_name(name: str) -> bool:
    """Names of files held aside (never stored): anything but NAME.npy, and hidden names
    (`.x.npy.AbC123` of rsync, `.x.swp` of editors)."""
    return name.startswith(".") or not name.endswith(NPY_SUFFIX) or name == NPY_SUFFIX


class NamespaceWrites:
    """The changes a writable mount makes: create, replace, write, mkdir, rmdir, unlink, rename, attributes.

    Mixed into Namespace; every store change runs in a worker thread through the engine.
    A new or replacing array is staged (Hierarchy.stage_array) and committed at the close
    that completes it; files under other names are held aside in the daemon.
    """

    def _group_dir(self: "Namespace", inode: int) -> Entry:
        entry = self.get(inode)
        if entry.kind != "group" or entry.view != "":
            raise NotPermitted("only groups of the main tree take new files and directories")
        if entry.error is not None:
            raise entry.error
        if entry.node is None and self.root_node.kind == "array":
            raise NotPermitted("a store whose root is an array holds no other nodes")
        return entry

    async def _repoint(self: "Namespace", old_path: str, new_path: str, skip: int = 0) -> None:
        """Entries of nodes at or below `old_path` now show the nodes at `new_path` (after a
        move or a replacement); those with nothing left to show give ENOENT."""
        fresh_nodes: dict[str, Node | None] = {}  # one metadata read per node, however many views
        for other in list(self._entries.values()):
            was = other.node
            if other.inode == skip or was is None or isinstance(was, BrokenNode) or not (
                    was.path == old_path or (old_path and was.path.startswith(old_path + "/"))):
                continue
            target = new_path + was.path[len(old_path):]
            if target not in fresh_nodes:
                fresh_nodes[target] = await self.engine.run_io(self.hierarchy.node_sync, target)
            fresh = fresh_nodes[target]
            if fresh is None or fresh.kind != was.kind:
                other.error = NotFound(f"{was.path} is gone")
                continue
            other.node, other.stored_bytes, other.content, other.error = fresh, None, None, None
            if other.stream is not None and isinstance(fresh, ArrayMeta):
                stream = other.stream
                origin = stream.origin if other.kind == "chunk" else None
                if origin is not None and (len(origin) != len(fresh.shape) or any(
                        i >= n for i, n in zip(origin, grid.grid_shape(fresh.shape, fresh.chunk_shape)))):
                    other.error = NotFound(f"chunk {origin} of {fresh.path} no longer exists")
                    continue
                other.stream = ArrayStream(fresh, stream.order, bool(stream.header), chunk=origin)
        self._sizes.pop(old_path, None)
        self._sizes.pop(new_path, None)

    def _forget(self: "Namespace", path: str, keep: int = 0) -> None:
        """Entries of a removed or replaced node (and its views, chunk files, descendants)
        lose their names; open handles to them get ENOENT from now on."""
        gone = {e.inode for e in self._entries.values() if e.inode != keep and e.node is not None and (
            e.node.path == path or e.node.path.startswith(path + "/") or (not path and e.inode != ROOT_INODE))}
        for name_key in [k for k, inode in self._by_name.items() if inode in gone or k[0] in gone]:
            del self._by_name[name_key]
            self.forget_name(*name_key)
        for inode in gone:
            self._entries[inode].error = NotFound(f"{path} was removed or replaced")
        self._sizes.pop(path, None)

    def _invalidate(self: "Namespace") -> None:
        """Listings are read again after a change (inodes of unchanged names stay)."""
        self._below.clear()
        for entry in self._entries.values():
            if entry.kind == "group" and entry.children is not None:
                entry.children = None

    async def children(self: "Namespace", inode: int) -> dict[str, int]:
        names = dict(await Namespace._listing(self, inode))  # the cached listing stays as the store has it
        for (parent, name), child in self._pending_names.items():
            if parent == inode:
                names.setdefault(name, child)
        return names

    def _register(self: "Namespace", parent_inode: int, name: str, entry: Entry) -> None:
        """A file that is not (yet) a node: listed under `name` until it is one or is dropped."""
        entry.parent = parent_inode
        self._pending_names[(parent_inode, name)] = entry.inode
        self._by_name[(parent_inode, name)] = entry.inode

    def _unregister(self: "Namespace", entry: Entry, keep_name: bool = False, forget: bool = True) -> None:
        """No longer a file apart: it became a node (`keep_name`: same inode, same name) or is
        gone (`forget`: the kernel drops the name; not while it renames it itself)."""
        for key, inode in list(self._pending_names.items()):
            if inode == entry.inode:
                del self._pending_names[key]
                if keep_name or self._by_name.get(key) != inode:
                    continue
                del self._by_name[key]
                if forget:
                    self.forget_name(*key)

    def _name_of(self: "Namespace", entry: Entry) -> str:
        """The file's path in the mount, for log lines."""
        for (parent, name), inode in list(self._pending_names.items()) + list(self._by_name.items()):
            if inode == entry.inode:
                base = self.get(parent).node
                return join(base.path if base is not None else "", name)
        return entry.key or (entry.node.path + NPY_SUFFIX if entry.node is not None else f"inode {entry.inode}")

    async def _new_array_path(self: "Namespace", parent_inode: int, name: str, names: dict[str, int]) -> str:
        """The hierarchy path of a new array NAME.npy in a group, its name checked against the format."""
        parent = self._group_dir(parent_inode)
        stem = name[: -len(NPY_SUFFIX)]
        if stem in names:  # an array and a group cannot share a path
            raise Exists(name)
        self.hierarchy.check_name(stem, _stems(names))
        return join(parent.node.path if parent.node else "", stem)

    async def create(self: "Namespace", parent_inode: int, name: str) -> Entry:
        self._group_dir(parent_inode)
        names = await self.children(parent_inode)
        if name in names:
            raise Exists(name)
        if is_held_name(name):
            entry = self._new("held", "", None, key=name)
            entry.spool = tempfile.SpooledTemporaryFile(max_size=HELD_MEMORY_BYTES, prefix="zarrfs-held-")
            self._register(parent_inode, name, entry)
            return entry
        path = await self._new_array_path(parent_inode, name, names)
        entry = self._new("array", "", None, key=path)
        entry.pending = bytearray()
        self._register(parent_inode, name, entry)
        return entry

    async def truncate(self: "Namespace", entry: Entry, size: int = 0) -> None:
        """A held file takes any size; a .npy file only 0: its next NPY header defines the
        array that replaces it (the old one stays until the new one is complete)."""
        if entry.kind == "held":
            def resize() -> int:
                entry.spool.seek(0, os.SEEK_END)
                end = entry.spool.tell()
                if size < end:
                    entry.spool.truncate(size)
                elif size > end:  # in memory, truncate does not extend: write the zeros
                    entry.spool.write(bytes(size - end))
                return size

            async with entry.lock:
                entry.size = await trio.to_thread.run_sync(resize)
            return
        if entry.kind != "array" or entry.view != "":
            raise InvalidArgument("only .npy files of the main tree can be truncated (to replace the array)")
        if size != 0:
            raise InvalidArgument(f"arrays have a fixed size ({entry.size}); truncate to 0 to replace one")
        if entry.staged is not None:
            await self._drop_staged(entry)
        if entry.pending is None and entry.node is not None:
            entry.replacing = entry.node
        entry.pending = bytearray()
        entry.ingest = entry.received = entry.rejected = None

    async def write(self: "Namespace", entry: Entry, offset: int, data: bytes) -> int:
        if entry.kind == "held":
            return await self._held_write(entry, offset, data)
        if entry.pending is not None:
            return await self._ingest(entry, offset, data)
        if entry.error is not None:
            raise entry.error
        stream = entry.ingest or entry.stream
        if offset + len(data) > stream.size:
            raise TooBig(f"{entry.key or stream.meta.path}: an array's file cannot grow "
                         f"(write ends at {offset + len(data)}, size {stream.size}); truncate to replace it")
        hlen = len(stream.header)
        if offset < hlen and data[: hlen - offset] != stream.header[offset:offset + len(data)]:
            raise InvalidArgument("a write to the NPY header may not change shape or dtype; truncate first")
        await self.engine.write(stream, offset, data)
        if entry.received is not None:
            entry.received.add(max(offset, hlen), offset + len(data))
        self._sizes.pop(stream.meta.path, None)
        entry.stored_bytes = None
        return len(data)

    def _reject(self: "Namespace", entry: Entry, error: ZarrfsError) -> ZarrfsError:
        """A file that will not become an array: later writes fail too, the last close drops it."""
        entry.pending = bytearray()
        entry.rejected = error
        return error

    async def _ingest(self: "Namespace", entry: Entry, offset: int, data: bytes) -> int:
        if entry.rejected is not None:
            raise entry.rejected
        buf = entry.pending
        if offset > npy.MAX_HEADER_BYTES:
            raise self._reject(entry, InvalidArgument(f"{self._name_of(entry)}: the NPY header must be written first"))
        if offset > len(buf):
            buf.extend(bytes(offset - len(buf)))
        buf[offset:offset + len(data)] = data
        try:
            parsed = npy.parse_header(buf)
            if parsed is not None:
                check_fixed_size(parsed[2])
        except (npy.NotNpy, Unsupported) as e:
            raise self._reject(entry, InvalidArgument(f"{self._name_of(entry)}: {e}")) from None
        if parsed is None:
            return len(data)
        shape, fortran, dtype, hlen = parsed
        path = entry.replacing.path if entry.replacing is not None else entry.key
        try:  # every check of the format (data type, codec, chunks) before the store changes
            staged = self.hierarchy.stage_array(path, self._new_array(shape, dtype))
        except ZarrfsError as e:
            raise self._reject(entry, type(e)(f"{self._name_of(entry)}: {e}")) from None
        entry.staged = staged
        entry.ingest = ArrayStream(staged.meta, "F" if fortran else "C", header=bytes(buf[:hlen]), dtype=dtype)
        entry.received = Coverage()
        entry.pending = None
        rest = bytes(buf[hlen:])
        if rest:
            if len(buf) > entry.ingest.size:
                raise TooBig(f"{path}: {len(buf)} bytes written, more than the {entry.ingest.size} "
                             f"its NPY header declares")
            await self.engine.write(entry.ingest, hlen, rest)
            entry.received.add(hlen, len(buf))
        return len(data)

    def _new_array(self: "Namespace", shape: tuple[int, ...], dtype: np.dtype) -> NewArray:
        chunks = self.create_chunks if self.create_chunks and len(self.create_chunks) == len(shape) else None
        return NewArray(shape, dtype, chunks, self.create_codec)

    async def _commit(self: "Namespace", entry: Entry) -> None:
        """A staged array that is complete becomes the node at its path (all-or-nothing)."""
        staged, old = entry.staged, entry.replacing
        try:
            await self.engine.flush(staged.meta.path)
            await self.engine.run_io(self.hierarchy.commit_array_sync, staged, old)
        except ZarrfsError as e:
            what = "the old array is kept" if old is not None else "nothing was created"
            log.warning("%s: storing the new array failed (%s); %s", self._name_of(entry), e, what)
            await self._abandon(entry)
            raise
        self.engine.discard(staged.meta.path)
        if old is not None:
            self.engine.discard(old.path)
        meta = staged.final
        ingest = entry.ingest
        entry.node, entry.replacing, entry.staged, entry.received, entry.error = meta, None, None, None, None
        entry.stream = ArrayStream(meta, "C")
        entry.ingest = ArrayStream(meta, ingest.order, header=ingest.header, dtype=ingest.dtype)
        if not meta.path:
            self.root_node = meta
        self._unregister(entry, keep_name=True)
        self._sizes.pop(meta.path, None)
        # Views of an array replaced here, or removed and now created again, are names the
        # kernel may still hold: they show the new array.
        await self._repoint(meta.path, meta.path, skip=entry.inode)
        self._invalidate()

    async def _drop_staged(self: "Namespace", entry: Entry) -> None:
        """Forget a staged array's chunks (held and stored): the old array, if any, stays."""
        staged = entry.staged
        entry.staged, entry.ingest, entry.received = None, None, None
        self.engine.discard(staged.meta.path)
        await self.engine.run_io(self.hierarchy.discard_staging_sync, staged)

    async def _abandon(self: "Namespace", entry: Entry) -> None:
        """A file that did not become an array: its staged chunks go; a replaced array stays
        as it was; a created one disappears."""
        if entry.staged is not None:
            await self._drop_staged(entry)
        entry.pending = entry.ingest = entry.received = entry.rejected = None
        if entry.replacing is not None:
            entry.replacing = None
        else:
            self._unregister(entry)
            entry.error = NotFound(f"{entry.key} was never stored")

    def _header_problem(self: "Namespace", entry: Entry) -> InvalidArgument | None:
        """Why a file given some bytes but no whole NPY header cannot be an array (None: it is fine)."""
        if entry.pending is None or entry.rejected is not None or not entry.pending:
            return None
        return InvalidArgument(f"{self._name_of(entry)}: {npy.incomplete_reason(entry.pending)}")

    async def sync(self: "Namespace", entry: Entry) -> None:
        """fsync: what was written is in the store (a staged array's chunks, in its staging area)."""
        problem = self._header_problem(entry)
        if problem is not None:
            raise problem
        await self._flush_entry(entry)

    async def _flush_entry(self: "Namespace", entry: Entry) -> None:
        stream = entry.ingest if entry.staged is not None else entry.stream
        if stream is not None and entry.kind in ("array", "chunk"):
            await self.engine.flush(stream.meta.path)
            self._sizes.pop(stream.meta.path, None)
            entry.stored_bytes = None

    async def close(self: "Namespace", entry: Entry, last_handle: bool) -> None:
        """close(2): store what was written; a new array complete now is committed; one whose
        header or data stopped short fails here (EINVAL, EIO) and, at its last close, is dropped."""
        problem = self._header_problem(entry)
        if problem is not None:
            if last_handle:
                await self._abandon(entry)
                problem = InvalidArgument(f"{problem}; {'the old array is kept' if entry.node else 'not stored'}")
            raise problem
        if entry.staged is None:
            await self._flush_entry(entry)
            return
        want = entry.ingest.size - len(entry.ingest.header)
        got = entry.received.covered
        if got == want:
            await self._commit(entry)
        elif last_handle:
            what = "the old array is kept" if entry.replacing is not None else "not stored"
            name = self._name_of(entry)
            await self._abandon(entry)
            raise Incomplete(f"{name}: received {got} of {want} data bytes its NPY header declares; {what}")
        else:
            await self._flush_entry(entry)

    async def release(self: "Namespace", entry: Entry) -> None:
        """The last handle is gone: a file that never became an array is dropped (an empty
        NAME.npy stays, held aside); a committed writer's own layout is forgotten."""
        if entry.kind != "array":
            return
        if entry.staged is not None or entry.rejected is not None:
            log.warning("%s: closed before it was a complete array; dropped", self._name_of(entry))
            await self._abandon(entry)
        elif entry.pending is not None and entry.replacing is not None and not entry.pending:
            entry.pending, entry.replacing = None, None  # truncated, never rewritten: the old array stays
        elif entry.pending is None:
            entry.ingest = None

    async def shutdown(self: "Namespace") -> None:
        """Unmount: complete staged arrays are committed, the rest dropped, each with a log line."""
        for entry in list(self._entries.values()):
            name = None
            try:
                if entry.kind == "held" and entry.error is None:
                    name = self._name_of(entry)
                    log.warning("%s: held-aside file (%d bytes) never renamed to NAME.npy; dropped at unmount",
                                name, entry.size)
                    entry.spool.close()
                elif entry.staged is not None:
                    name = self._name_of(entry)
                    await self.close(entry, last_handle=True)
                    log.info("%s: complete at unmount; stored", name)
                elif entry.pending is not None and entry.node is None:
                    log.info("%s: empty file, never an array; dropped at unmount", self._name_of(entry))
            except ZarrfsError as e:
                log.warning("unmount: %s", e)

    # --- files held aside (temporary names) --------------------------------------------------

    async def _held_write(self: "Namespace", entry: Entry, offset: int, data: bytes) -> int:
        def put() -> int:
            entry.spool.seek(offset)
            entry.spool.write(data)
            entry.spool.seek(0, os.SEEK_END)
            return entry.spool.tell()

        async with entry.lock:
            entry.size = await trio.to_thread.run_sync(put)
        return len(data)

    async def held_read(self: "Namespace", entry: Entry, offset: int, size: int) -> bytes:
        def get() -> bytes:
            entry.spool.seek(offset)
            return entry.spool.read(size)

        async with entry.lock:
            return await trio.to_thread.run_sync(get)

    async def _adopt(self: "Namespace", entry: Entry, parent_inode: int, name: str) -> None:
        """A held file renamed to NAME.npy becomes array NAME (staged, streamed in, committed).
        On any error the held file stays as it was and the rename fails."""
        names = await self.children(parent_inode)
        other = self.get(names[name]) if name in names else None
        if other is not None and (other.kind != "array" or other.node is None or other.staged is not None
                                  or other.pending is not None):
            raise Exists(f"{name} is being written or is not an array")
        path = await self._new_array_path(parent_inode, name, {n: i for n, i in names.items() if n != name})
        old = other.node if other is not None else None
        head = await self.held_read(entry, 0, npy.MAX_HEADER_BYTES)
        label = self._name_of(entry)
        try:
            parsed = npy.parse_header(head)
            if parsed is None:
                raise InvalidArgument(f"{label}: {npy.incomplete_reason(head)}")
            check_fixed_size(parsed[2])
        except (npy.NotNpy, Unsupported) as e:
            raise InvalidArgument(f"{label}: cannot become {path}: {e}") from None
        shape, fortran, dtype, hlen = parsed
        staged = self.hierarchy.stage_array(path, self._new_array(shape, dtype))
        ingest = ArrayStream(staged.meta, "F" if fortran else "C", header=bytes(head[:hlen]), dtype=dtype)
        if entry.size != ingest.size:
            kind = Incomplete if entry.size < ingest.size else InvalidArgument
            raise kind(f"{label}: holds {entry.size - hlen} data bytes, its NPY header declares "
                       f"{ingest.size - hlen}; not renamed to {name}")
        try:
            for offset in range(hlen, ingest.size, ADOPT_BLOCK_BYTES):
                block = await self.held_read(entry, offset, ADOPT_BLOCK_BYTES)
                await self.engine.write(ingest, offset, block)
            await self.engine.flush(staged.meta.path)
            await self.engine.run_io(self.hierarchy.commit_array_sync, staged, old)
        except BaseException:
            self.engine.discard(staged.meta.path)
            with trio.CancelScope(shield=True):
                await self.engine.run_io(self.hierarchy.discard_staging_sync, staged)
            raise
        self.engine.discard(staged.meta.path)
        if old is not None:
            self.engine.discard(old.path)
        self._unregister(entry, forget=False)
        entry.spool.close()
        entry.spool, entry.kind, entry.key = None, "array", path
        entry.node, entry.stream, entry.error = staged.final, ArrayStream(staged.final, "C"), None
        if not path:
            self.root_node = staged.final
        self._by_name[(parent_inode, name)] = entry.inode
        self._sizes.pop(path, None)
        await self._repoint(path, path, skip=entry.inode)
        self._invalidate()

    # --- groups and names ------------------------------------------------------------------

    async def mkdir(self: "Namespace", parent_inode: int, name: str) -> Entry:
        parent = self._group_dir(parent_inode)
        names = await self.children(parent_inode)
        if name in names or name + NPY_SUFFIX in names:  # an array and a group cannot share a path
            raise Exists(name)
        self.hierarchy.check_name(name, _stems(names))
        path = join(parent.node.path if parent.node else "", name)
        await self.engine.run_io(self.hierarchy.create_group_sync, path)
        self._invalidate()
        return await self.lookup(parent_inode, name)

    async def rmdir(self: "Namespace", parent_inode: int, name: str) -> None:
        self._group_dir(parent_inode)
        entry = await self.lookup(parent_inode, name)
        if entry.kind != "group" or entry.node is None:
            raise NotADir(name)
        self._below.pop(entry.node.path, None)
        if await self.nodes_below(entry.node.path):
            raise NotEmpty(name)
        await self.engine.run_io(self.hierarchy.erase_node_sync, entry.node)
        self._forget(entry.node.path)
        self._invalidate()

    async def unlink(self: "Namespace", parent_inode: int, name: str) -> None:
        self._group_dir(parent_inode)
        entry = await self.lookup(parent_inode, name)
        if entry.kind == "held":
            self._unregister(entry)
            entry.spool.close()
            entry.error = NotFound(f"{name} was removed")
            return
        if entry.kind != "array":
            raise IsADir(name)
        if entry.staged is not None or entry.pending is not None:
            await self._abandon(entry)
        node = entry.node
        if node is not None:
            await self.engine.run_io(self.hierarchy.erase_node_sync, node)
            self.engine.discard(node.path)
            self._forget(node.path)
        self._pending_names.pop((parent_inode, name), None)
        self._by_name.pop((parent_inode, name), None)
        self._invalidate()

    async def rename(self: "Namespace", old_parent: int, old_name: str, new_parent: int, new_name: str) -> None:
        self._group_dir(old_parent)
        target_dir = self._group_dir(new_parent)
        entry = await self.lookup(old_parent, old_name)
        if entry.kind == "held":
            await self._rename_held(entry, new_parent, new_name)
            return
        node = entry.node
        if node is None or entry.kind not in ("group", "array") or entry.pending is not None \
                or entry.staged is not None:
            raise NotPermitted(f"{old_name} cannot be moved now")
        if (entry.kind == "array") != new_name.endswith(NPY_SUFFIX) or new_name == NPY_SUFFIX:
            raise NotPermitted(f"{new_name}: arrays are NAME.npy files, groups are directories")
        stem = new_name[: -len(NPY_SUFFIX)] if entry.kind == "array" else new_name
        new_path = join(target_dir.node.path if target_dir.node else "", stem)
        if new_path == node.path or (node.path and new_path.startswith(node.path + "/")):
            raise InvalidArgument(f"cannot move {node.path} into itself")
        siblings = await self.children(new_parent)
        self.hierarchy.check_name(stem, _stems({n: i for n, i in siblings.items() if n != old_name
                                                or new_parent != old_parent}))
        existing = siblings.get(new_name)
        if existing is not None:
            other = self.get(existing)
            if other.kind != "array" or entry.kind != "array":
                raise Exists(new_name)
            await self.unlink(new_parent, new_name)  # mv onto an array replaces it
        await self.engine.flush(node.path) if entry.kind == "array" else await self.engine.flush()
        await self.engine.run_io(self.hierarchy.move_node_sync, node, new_path)
        self.engine.discard(node.path)
        # The kernel keeps the moved inodes under their new names: point them (and every
        # view of the moved nodes) at the new place.
        await self._repoint(node.path, new_path)
        self._by_name.pop((old_parent, old_name), None)
        self._by_name[(new_parent, new_name)] = entry.inode
        self._invalidate()

    async def _rename_held(self: "Namespace", entry: Entry, new_parent: int, new_name: str) -> None:
        """A held file renamed: to NAME.npy it becomes that array; to another held name it moves."""
        if not is_held_name(new_name):
            await self._adopt(entry, new_parent, new_name)
            return
        names = await self.children(new_parent)
        other = self.get(names[new_name]) if new_name in names else None
        if other is not None and other.inode != entry.inode:
            if other.kind != "held":
                raise Exists(new_name)
            self._unregister(other, forget=False)
            other.spool.close()
            other.error = NotFound(f"{new_name} was replaced")
        self._unregister(entry, forget=False)
        entry.key = new_name
        self._register(new_parent, new_name, entry)

    async def set_attributes(self: "Namespace", entry: Entry, value: bytes) -> None:
        try:
            attrs = json.loads(value)
        except (ValueError, UnicodeDecodeError) as e:
            raise InvalidArgument(f"user.zarr.attributes must be a JSON object: {e}") from None
        if not isinstance(attrs, dict):
            raise InvalidArgument("user.zarr.attributes must be a JSON object")
        node = entry.node
        if node is None or entry.kind not in ("group", "array", "chunkdir") or isinstance(node, BrokenNode):
            raise NotPermitted("only groups and arrays have attributes")
        entry.node = await self.engine.run_io(self.hierarchy.set_attributes_sync, node, attrs)
        self._invalidate()


class Namespace(NamespaceWrites):
    """Maps inodes and names to groups, arrays and views."""

    def __init__(self, hierarchy: Hierarchy, root: Node, source: str, engine: Engine,
                 show_views: bool = False) -> None:
        self.hierarchy = hierarchy
        self.engine = engine
        self.show_views = show_views
        self.root_stem = root_array_stem(source)
        self.root_node = root
        self._entries: dict[int, Entry] = {}
        self._by_name: dict[tuple[int, str], int] = {}
        self._next_inode = ROOT_INODE
        # Shared by every view of a group: its child nodes; and per array, its stored keys' sizes.
        self._below: dict[str, list[Node]] = {}
        self._sizes: dict[str, dict[str, int | None] | None] = {}
        # Keys whose names cannot be file names (logged once, never listed)
        self._unlistable: set[str] = set()
        # Files created and not yet arrays: (parent inode, name) -> inode
        self._pending_names: dict[tuple[int, str], int] = {}
        # Told when a name disappears (the FUSE layer tells the kernel to drop its dentry)
        self.forget_name: Any = lambda parent, name: None
        # Chunking and codec of arrays created through the mount (options chunks=, codec=)
        self.create_chunks: tuple[int, ...] | None = None
        self.create_codec: str | None = None
        self._new("group", "", root if isinstance(root, GroupMeta) else None)

    # --- entries ----------------------------------------------------------------------

    def _new(self, kind: str, view: str, node: Node | None = None, **kw: Any) -> Entry:
        entry = Entry(self._next_inode, kind, view, node, **kw)
        self._entries[entry.inode] = entry
        self._next_inode += 1
        return entry

    def _child(self, parent: int, name: str, make: Any) -> int:
        """The inode of `name` in `parent`, created once by `make()`."""
        inode = self._by_name.get((parent, name))
        if inode is None:
            inode = make().inode
            self._by_name[(parent, name)] = inode
        return inode

    def get(self, inode: int) -> Entry:
        try:
            return self._entries[inode]
        except KeyError:
            raise NotFound(f"no inode {inode}") from None

    def _node_entry(self, view: str, node: Node) -> tuple[str, Any] | list[tuple[str, Any]]:
        """(name, maker) of a node's entry in a view directory (info lists groups twice)."""
        base = node.path.rsplit("/", 1)[-1] if node.path else self.root_stem
        is_array = node.kind == "array"
        error = node.error if isinstance(node, BrokenNode) else None
        if view == "info":
            out = [(base + ".json", lambda: self._new("info", view, node, error=error))]
            if not is_array:
                out.append((base, lambda: self._new("group", view, node, error=error)))
            return out
        if not is_array:
            return [(base, lambda: self._new("group", view, node, error=error))]
        if view == "chunks":
            return [(base, lambda: self._new("chunkdir", view, node, error=error))]
        suffix, order, header = ARRAY_VIEWS[view]
        if error is not None:
            return [(base + suffix, lambda: self._new("array", view, node, error=error))]
        return [(base + suffix, lambda: self._new("array", view, node,
                                                  stream=ArrayStream(node, order, header)))]

    # --- directories --------------------------------------------------------------

    async def nodes_below(self, path: str) -> list[Node]:
        nodes = self._below.get(path)
        if nodes is None:
            try:
                nodes = await self.engine.run_io(self.hierarchy.children_sync, path)
            except ZarrfsError as e:
                log.warning("listing %s: %s", path or "/", e)
                raise
            for node in nodes:
                if isinstance(node, BrokenNode):
                    log.warning("%s: %s", node.key, node.error)
            self._below[path] = nodes
        return nodes

    async def _listing(self, inode: int) -> dict[str, int]:
        """Name -> inode of a directory (all but chunk directories, which are computed)."""
        entry = self.get(inode)
        if entry.children is not None:
            return entry.children
        async with entry.lock:
            if entry.children is None:
                entry.children = await self._load_children(entry)
        return entry.children

    async def _load_children(self, entry: Entry) -> dict[str, int]:
        if entry.error is not None:
            raise entry.error
        inode = entry.inode
        names: dict[str, int] = {}
        if entry.kind == "views":
            for view in VIEW_DIRS:
                if view == "store":
                    names[view] = self._child(inode, view, lambda: self._new("storedir", "store", key=""))
                else:
                    names[view] = self._child(inode, view, lambda v=view: self._new("group", v, self._root_group()))
            names[STATS_FILE] = self._child(inode, STATS_FILE, lambda: self._new("stats", "stats"))
            return names
        if entry.kind == "storedir":
            files, dirs = await self.engine.run_io(self.hierarchy.store.list_dir_sync, entry.key)
            for d in dirs:
                if self._listable(d, join(entry.key, d)):
                    names[d] = self._child(inode, d, lambda d=d: self._new("storedir", "store", key=join(entry.key, d)))
            for f, size in files.items():
                if self._listable(f, join(entry.key, f)):
                    names[f] = self._child(inode, f, lambda f=f, s=size: self._new(
                        "storekey", "store", key=join(entry.key, f), size=s if s is not None else -1))
            return names
        if entry.kind != "group":
            raise NotFound("not a directory")
        if entry.node is None and self.root_node.kind == "array":
            nodes: list[Node] = [self.root_node]  # a root array: the root holds just NAME.npy
        else:
            nodes = await self.nodes_below(entry.node.path if entry.node is not None else "")
        if entry.view == "info" and isinstance(entry.node, GroupMeta) and entry.node.path == "":
            names[".json"] = self._child(inode, ".json", lambda: self._new("info", "info", entry.node))
        for node in nodes:
            if node.path.rsplit("/", 1)[-1].startswith(RESERVED_PREFIX):
                continue  # a staging area of an array being written (or left by a killed daemon)
            for name, make in self._node_entry(entry.view, node):
                if name not in names and self._listable(name, _node_key(node)):
                    names[name] = self._child(inode, name, make)
        return names

    def _listable(self, name: str, key: str) -> bool:
        """Whether `name` can be listed; if not, say so once (naming the key) and leave it out."""
        problem = name_problem(name)
        if problem is not None and key not in self._unlistable:
            self._unlistable.add(key)
            log.warning("%s: not listed: %s", key, problem)
        return problem is None

    def _root_group(self) -> GroupMeta | None:
        return self.root_node if isinstance(self.root_node, GroupMeta) else None

    def _chunk_names(self, entry: Entry) -> tuple[tuple[int, ...], int]:
        meta = entry.node
        shape = grid.grid_shape(meta.shape, meta.chunk_shape)
        return shape, math.prod(shape)

    async def dir_len(self, inode: int) -> int:
        entry = self.get(inode)
        if entry.kind == "chunkdir":
            if entry.error is not None:
                raise entry.error
            return self._chunk_names(entry)[1]
        n = len(await self.children(inode))
        return n + (1 if inode == ROOT_INODE and self.show_views else 0)

    async def dir_item(self, inode: int, i: int) -> tuple[str, Entry]:
        """The i-th entry of a directory (chunk directories are never materialized whole)."""
        entry = self.get(inode)
        if entry.kind == "chunkdir":
            shape, _ = self._chunk_names(entry)
            idx = tuple(int(x) for x in np.unravel_index(i, shape)) if shape else ()
            name = (".".join(map(str, idx)) or "0") + ".npy"
            child = self.get(self._child(inode, name, lambda: self._chunk_entry(entry, idx)))
        else:
            children = await self.children(inode)
            if i == len(children):  # only with show_views at the root
                name, child = VIEWS_DIR, await self.lookup(inode, VIEWS_DIR)
            else:
                name = list(children)[i] if i < len(children) else None
                if name is None:
                    raise NotFound(f"entry {i}")
                child = self.get(children[name])
        await self.settle(child)
        return name, child

    def _chunk_entry(self, parent: Entry, idx: tuple[int, ...]) -> Entry:
        return self._new("chunk", "chunks", parent.node, stream=ArrayStream(parent.node, "C", True, chunk=idx))

    async def lookup(self, parent: int, name: str) -> Entry:
        entry = self.get(parent)
        if parent == ROOT_INODE and name == VIEWS_DIR:
            child = self.get(self._child(parent, name, lambda: self._new("views", "views")))
        elif entry.kind == "chunkdir":
            child = self.get(self._child(parent, name, lambda: self._parse_chunk_name(entry, name)))
        else:
            inode = (await self.children(parent)).get(name)
            if inode is None:
                raise NotFound(name)
            child = self.get(inode)
        await self.settle(child)
        return child

    def _parse_chunk_name(self, entry: Entry, name: str) -> Entry:
        if entry.error is not None:
            raise entry.error
        meta = entry.node
        m = re.fullmatch(r"(\d+(?:\.\d+)*)\.npy", name)
        if not m:
            raise NotFound(name)
        idx = tuple(int(x) for x in m.group(1).split("."))
        if not meta.shape:
            idx = () if idx == (0,) else (-1,)
        shape = grid.grid_shape(meta.shape, meta.chunk_shape)
        if len(idx) != len(shape) or any(i >= n for i, n in zip(idx, shape)) or name != (
                ".".join(map(str, idx)) or "0") + ".npy":
            raise NotFound(name)
        return self._chunk_entry(entry, idx)

    # --- sizes, stored bytes, generated files ---------------------------------------

    async def stored_sizes(self, meta: ArrayMeta) -> dict[str, int | None] | None:
        """Sizes of an array's stored chunk keys (None when the store cannot list them)."""
        if meta.path not in self._sizes:
            try:
                self._sizes[meta.path] = await self.engine.run_io(self.hierarchy.chunk_sizes_sync, meta)
            except ZarrfsError as e:
                log.info("stored size of %s unknown: %s", meta.path or "/", e)
                self._sizes[meta.path] = None
        return self._sizes[meta.path]

    async def settle(self, entry: Entry) -> None:
        """Fill in what an entry's attributes need: stored bytes, sizes of generated files."""
        if entry.stored_bytes is not None or entry.error is not None:
            return
        if entry.kind == "array" and entry.node is None:  # created, no header yet
            entry.stored_bytes = 0
        elif entry.kind == "array" or entry.kind == "chunk":
            sizes = await self.stored_sizes(entry.node)
            if sizes is None:
                entry.stored_bytes = entry.size
            elif entry.kind == "array":
                entry.stored_bytes = sum(s or 0 for s in sizes.values())
            else:
                key = entry.node.chunk_key(entry.stream.origin)
                entry.stored_bytes = sizes.get(key) or 0
                inner_size = getattr(entry.node.source, "stored_nbytes_sync", None)
                if inner_size is not None and entry.stored_bytes:  # an inner chunk: its part of the shard
                    try:
                        entry.stored_bytes = await self.engine.run_io(inner_size, self.hierarchy.store,
                                                                      entry.stream.origin)
                    except ZarrfsError as e:
                        log.info("stored size of chunk %s of %s unknown: %s", entry.stream.origin,
                                 entry.node.path or "/", e)
        elif entry.kind == "info":
            entry.content = await self._info(entry.node)
            entry.size = entry.stored_bytes = len(entry.content)
        elif entry.kind == "storekey":
            if entry.size < 0:
                size = await self.engine.run_io(self.hierarchy.store.size_sync, entry.key)
                entry.size = size or 0
            entry.stored_bytes = entry.size
        elif entry.kind == "stats":
            entry.size = len(self.stats_bytes())
            entry.stored_bytes = 0
        else:
            entry.stored_bytes = entry.size

    async def _info(self, node: Node) -> bytes:
        info: dict[str, Any] = {"path": node.path, "kind": node.kind}
        if isinstance(node, ArrayMeta):
            sizes = await self.stored_sizes(node)
            info.update(
                format=node.format, shape=list(node.shape), dtype=np.lib.format.dtype_to_descr(node.dtype),
                chunk_shape=list(node.chunk_shape), order=node.codec.order, codecs=node.codec.describe(),
                fill_value=_jsonable(node.fill_value), dimension_names=_jsonable(node.dimension_names),
                attributes=node.attributes, metadata_key=node.metadata_key,
                chunks_total=grid.n_chunks(node.shape, node.chunk_shape),
                chunks_stored=len(sizes) if sizes is not None else None,
                logical_bytes=node.nbytes,
                stored_bytes=sum(s or 0 for s in sizes.values()) if sizes is not None else None)
        elif isinstance(node, GroupMeta):
            info.update(format=node.format, attributes=node.attributes, metadata_key=node.metadata_key,
                        implicit=node.metadata_key is None)
        return (json.dumps(info, indent=2) + "\n").encode()

    def stats_bytes(self) -> bytes:
        return (json.dumps(self.engine.stats(), indent=2) + "\n").encode()

    def xattrs(self, entry: Entry) -> dict[str, bytes]:
        """The read-only `user.zarr.*` attributes of groups and arrays (main tree and views)."""
        node = entry.node
        if node is None or entry.kind not in ("group", "array", "chunkdir"):
            return {}
        out: dict[str, Any] = {"attributes": node.attributes}
        if isinstance(node, ArrayMeta):
            out.update(shape=list(node.shape), dtype=np.lib.format.dtype_to_descr(node.dtype),
                       chunks=list(node.chunk_shape), codecs=node.codec.describe())
        return {"user.zarr." + k: json.dumps(_jsonable(v)).encode() for k, v in out.items()}


def fs_name(name: bytes) -> str:
    return os.fsdecode(name)

