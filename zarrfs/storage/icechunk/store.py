"""An Icechunk snapshot behind the Store interface: reads, listings and writes of a session, on an asyncio loop of its own.

Icechunk keeps a Zarr v3 hierarchy under transactional control (snapshots, branches, tags);
its session store is asynchronous and speaks zarr-python's buffer types. This adapter runs
that store on an asyncio loop of its own, in one thread, and answers the synchronous calls
zarrfs's engine makes from its worker threads: reads of the snapshot mounted (and of any
other, for `.zarrfs/versions`), and on a writable branch, writes into a session that
`commit_sync` commits once per operation (writes.py; repository.py keeps the repository's side).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
from collections.abc import Callable, Coroutine
from typing import Any

from ...errors import StoreError, ZarrfsError
from ..base import METADATA_MAX_BYTES, BaseStore
from ..base import Version as KeyVersion
from ..keys import check_key, join
from ..requests import RequestCounts
from .chunkfiles import BATCH, Located, RepositoryChunks, read_located
from .keys import BAD_PREFIX, INVALID_KEY, NO_NODE, SNAPSHOT_PREFIX
from .repository import SESSIONS_KEPT, Repository, Version, icechunk_module
from .writes import SessionWrites


class _Bytes:
    """The buffer type handed to icechunk's store: it keeps the value icechunk hands over (a
    buffer of its own), uncopied; `_plain` or a copy into the chunk's buffer makes it usable."""

    @classmethod
    def from_bytes(cls, data: Any) -> Any:
        return data


def _plain(data: Any) -> bytes:
    """A value as bytes (JSON parsing and slicing do not take icechunk's buffer)."""
    return data if isinstance(data, bytes) else bytes(data)


class IcechunkStore(BaseStore):
    """A zarrfs store over one snapshot of an Icechunk repository, and over any other snapshot
    below `SNAPSHOT_PREFIX + ID` (read-only).

    A branch mount follows the branch: `follow_tip_sync` finds the branch's newest snapshot (a
    new session) and `show_ready` moves to it, never while a file is open, so a reader sees one
    snapshot.
    With `writable`, the session is writable and `commit_sync` makes what it holds a commit.
    """

    is_local = False  # no keys as file paths: reads go through icechunk, but for `chunk_file`
    is_references = False
    ranges_ignored = False
    makes_commits = True

    def __init__(
        self,
        source: str,
        storage_options: dict[str, Any] | None = None,
        ref: str | None = None,
        snapshot: str | None = None,
        log_level: str = "warning",
        timeout_s: float | None = None,
        writable: bool = False,
        authorized: tuple[str, ...] = (),
    ) -> None:
        icechunk = icechunk_module()
        if "ICECHUNK_LOG" not in os.environ:  # icechunk's own log goes to stderr, not ours
            icechunk.set_logs_filter("icechunk=info" if log_level == "debug" else "error")
        self.source = source
        self.timeout_s = timeout_s  # the longest wait for one call (the engine gives up then too)
        self._loop = asyncio.new_event_loop()
        thread = threading.Thread(target=self._loop.run_forever, name="zarrfs-icechunk", daemon=True)
        thread.start()
        self.repository = Repository(source, storage_options or {}, ref, snapshot, writable, authorized)
        self.read_only = not writable
        self._error = icechunk.IcechunkError
        self.on_local_disk = self.repository.on_local_disk
        self._writes = SessionWrites(
            self.repository, self.read_only, self._run, self._error, self._failed, self.get_sync
        )
        self._prototype = _prototype()
        self.requests = RequestCounts()
        # Native chunks read as files (chunkfiles.py): a read-only mount of a repository in a local
        # directory, by an icechunk that lists chunk references (2.x).
        files_dir = self.repository.local_dir if self.read_only and _lists_chunks(icechunk) else None
        self._chunks = None if files_dir is None else RepositoryChunks(files_dir, self._references, SESSIONS_KEPT)
        self.root = files_dir or ""  # (where those files lie)

    def __repr__(self) -> str:
        return f"IcechunkStore({self.source!r}, {self.snapshot_id})"

    # --- the repository's side: the version shown, its branch's tip, the history, commits ---

    @property
    def version(self) -> Version:
        return self.repository.version

    @property
    def snapshot_id(self) -> str:
        return self.repository.snapshot_id

    @property
    def follows_branch(self) -> bool:
        return self.repository.branch is not None

    @property
    def tip_pending(self) -> str | None:
        """A newer snapshot of the branch, shown once no file of the mount is open."""
        return self.repository.tip_pending

    def follow_tip_sync(self, may_move: bool) -> bool:
        """See Repository.follow_tip_sync."""
        return self.repository.follow_tip_sync(may_move)

    def show_ready(self, may_move: bool) -> bool:
        """See Repository.show_ready."""
        return self.repository.show_ready(may_move)

    def refs_sync(self, kind: str) -> dict[str, str]:
        """Branches or tags (KIND) -> the snapshot each names now."""
        return self.repository.refs_sync(kind)

    def ancestry_sync(self) -> list[dict[str, Any]]:
        """The snapshot shown and its ancestors, newest first."""
        return self.repository.ancestry_sync()

    def log_json_sync(self) -> bytes:
        """`.zarrfs/versions/log.json`: what is mounted and its ancestry."""
        return self.repository.log_json_sync()

    def has_snapshot_sync(self, snapshot_id: str) -> bool:
        """Whether the repository holds a snapshot of that ID."""
        return self.repository.has_snapshot_sync(snapshot_id)

    def _route(self, key: str) -> tuple[Any, str]:
        """The session store a key belongs to (None: a snapshot that does not exist) and the key there;
        a key no store could hold (`..`, empty parts) is refused as every store refuses it."""
        snapshot_id, rel = _split(check_key(key))
        if snapshot_id is None:
            return self.version.store, key
        return self.repository.snapshot_store(snapshot_id), rel

    # --- reads ------------------------------------------------------------------------

    def _run(self, make: Callable[[], Coroutine[Any, Any, Any]]) -> Any:
        """Run a coroutine of icechunk's store on this store's loop; wait for its result."""

        async def call() -> Any:
            return await make()

        future = asyncio.run_coroutine_threadsafe(call(), self._loop)
        try:
            return future.result(self.timeout_s)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise StoreError(f"icechunk did not answer within {self.timeout_s:g} s (timed out)") from None

    async def _get(self, store: Any, key: str, byte_range: Any = None) -> Any:
        if store is None or not key:
            return None
        try:
            return await store.get(key, self._prototype, byte_range)
        except self._error as e:
            if INVALID_KEY in str(e) or NO_NODE in str(e):
                return None
            raise

    def _failed(self, what: str, error: BaseException) -> StoreError:
        return self.repository.failed(what, error)

    @property
    def chunk_files(self) -> bool:
        """Whether chunks may lie in files of their own (`chunk_file`)."""
        return self._chunks is not None

    def chunk_file(self, key: str, load: bool = True) -> Located | None:
        """Where the chunk under KEY lies in a local repository: (file, offset, length); None when it
        is no native chunk (absent, inline, virtual) or this icechunk does not tell. Without LOAD
        (a thread that must not wait), None also until its array's references are read."""
        if self._chunks is None:
            return None
        snapshot_id, rel = _split(key)
        if snapshot_id is not None:
            return self._chunks.locate(snapshot_id, lambda: self.repository.snapshot_store(snapshot_id), rel, load)
        version = self.version
        return self._chunks.locate(version.snapshot_id, lambda: version.store, rel, load)

    def _references(self, store: Any, path: str) -> list[Any]:
        """The batches of chunk references of array PATH of a session's STORE."""

        async def collect() -> list[Any]:
            return [batch async for batch in store.array_chunk_iterator(path, BATCH)]

        try:
            return self._run(collect)
        except self._error as e:
            raise self._failed(f"listing the chunks of {path!r}", e) from None

    def get_sync(self, key: str, max_nbytes: int | None = METADATA_MAX_BYTES, into: Any = None) -> Any:
        """The value of a key, or None; larger than `max_nbytes`: StoreError. A value that fits in
        INTO (a writable buffer) is copied into it: INTO returned when it is exactly its size, else
        a view of its first bytes. Documents (`zarr.json`: a repository holds v3 only) come as
        bytes; a chunk of a local repository's file, as read from it; any other value as a
        read-only view of icechunk's own buffer."""
        located = self.chunk_file(key)
        if located is not None:
            data = read_located(key, located, max_nbytes, into)
            if data is not None:
                self.requests.got(len(data))
                return data
        store, rel = self._route(key)
        try:
            data = self._run(lambda: self._get(store, rel))
        except self._error as e:
            raise self._failed(f"reading {key!r}", e) from None
        self.requests.got(0 if data is None else len(data))
        if data is None:
            return None
        self.bounded(key, data, max_nbytes)
        if into is not None and len(data) <= len(into):  # the chunk's own buffer: no decoding copy after
            view = memoryview(into).cast("B")
            view[: len(data)] = data
            return into if len(data) == len(view) else view[: len(data)]
        if key.rsplit("/", 1)[-1] == "zarr.json":  # a document: parsed as JSON, which takes bytes only
            return _plain(data)
        # A chunk: decoded straight from icechunk's buffer, uncopied (a copy here costs more
        # than the read itself on a local repository).
        return memoryview(data)

    def get_many_sync(self, keys: list[str], max_nbytes: int | None = METADATA_MAX_BYTES) -> dict[str, bytes | None]:
        """Several keys at once, concurrently, each bounded as in `get_sync`."""
        routed = [self._route(k) for k in keys]

        async def gather() -> list[Any]:
            return await asyncio.gather(*(self._get(store, rel) for store, rel in routed), return_exceptions=True)

        results = self._run(gather)
        self.requests.got(sum(len(r) for r in results if r is not None and not isinstance(r, BaseException)), len(keys))
        out: dict[str, bytes | None] = {}
        for key, res in zip(keys, results):
            if isinstance(res, BaseException):
                raise self._failed(f"reading {key!r}", res)
            out[key] = None if res is None else self.bounded(key, _plain(res), max_nbytes)
        return out

    async def _size(self, store: Any, key: str) -> int | None:
        if store is None or not key:
            return None
        try:
            if not await store.exists(key):
                return None
        except self._error as e:
            if INVALID_KEY in str(e) or NO_NODE in str(e):  # a prefix, not a key; or no node yet
                return None
            raise
        return await store.getsize(key)

    def size_sync(self, key: str) -> int | None:
        """Size of one key, or None when it is absent."""
        store, rel = self._route(key)
        try:
            return self._run(lambda: self._size(store, rel))
        except self._error as e:
            raise self._failed(f"size of {key!r}", e) from None

    def get_range_sync(self, key: str, start: int, end: int) -> bytes:
        """Bytes [start, end) of a key (b"" past its end)."""
        return self.get_ranges_sync(key, [(start, end)])[0]

    def get_ranges_sync(self, key: str, ranges: list[tuple[int, int]]) -> list[bytes]:
        """Byte ranges [start, end) of one key, concurrently."""
        from zarr.abc.store import RangeByteRequest

        store, rel = self._route(key)

        async def one(start: int, end: int) -> bytes:
            if end <= start:  # icechunk refuses empty ranges
                return b""
            data = await self._get(store, rel, RangeByteRequest(start, end))
            if data is None:
                raise StoreError(f"reading {key!r} [{start}:{end}]: no such key")
            return _plain(data)[: end - start]

        async def gather() -> list[Any]:
            return await asyncio.gather(*(one(a, b) for a, b in ranges), return_exceptions=True)

        results = self._run(gather)
        self.requests.got(sum(len(r) for r in results if isinstance(r, bytes)), len(ranges))
        out = []
        for (start, end), res in zip(ranges, results):
            if isinstance(res, ZarrfsError):
                raise res
            if isinstance(res, BaseException):
                raise self._failed(f"reading {key!r} [{start}:{end}]", res)
            out.append(res)
        return out

    def get_prefix_sync(self, key: str, nbytes: int) -> bytes | None:
        """The first `nbytes` bytes of a key (all of it when shorter), or None when it is absent."""
        size = self.size_sync(key)
        if size is None:
            return None
        return self.get_range_sync(key, 0, min(nbytes, size))

    def get_suffix_sync(self, key: str, nbytes: int) -> bytes | None:
        """The last `nbytes` bytes of a key (all of it when shorter), or None when it is absent."""
        # icechunk 1.x refuses a suffix longer than the object: the size bounds it first.
        size = self.size_sync(key)
        if size is None:
            return None
        return self.get_range_sync(key, max(0, size - nbytes), size)

    # --- listings ---------------------------------------------------------------------

    def _names_sync(self, lister: str, store: Any, prefix: str, shown: str) -> list[str]:
        if store is None:
            return []

        async def names() -> list[str]:
            return [name async for name in getattr(store, lister)(prefix)]

        self.requests.listed()
        try:
            return self._run(names)
        except self._error as e:
            if BAD_PREFIX in str(e):
                return []
            raise self._failed(f"listing {shown or '/'!r}", e) from None

    def list_dir_sync(self, prefix: str) -> tuple[dict[str, int | None], list[str]]:
        """Keys (with their sizes) and sub-prefixes directly under a prefix."""
        store, rel = self._route(prefix)
        names = self._names_sync("list_dir", store, rel, prefix)

        async def sizes() -> list[Any]:
            return await asyncio.gather(*(self._size(store, join(rel, n)) for n in names), return_exceptions=True)

        files: dict[str, int | None] = {}
        dirs: list[str] = []
        for name, res in zip(names, self._run(sizes)):
            if isinstance(res, BaseException):
                raise self._failed(f"listing {prefix or '/'!r}", res)
            if res is None:
                dirs.append(name)
            else:
                files[name] = res
        return dict(sorted(files.items())), sorted(dirs)

    def sizes_below_sync(self, prefix: str) -> dict[str, int | None]:
        """Every key below a prefix (recursively), relative to it, with its size."""
        store, rel = self._route(prefix)
        base = rel + "/" if rel else ""
        keys = [k for k in self._names_sync("list_prefix", store, base, prefix) if k.startswith(base)]

        async def sizes() -> list[Any]:
            return await asyncio.gather(*(store.getsize(k) for k in keys), return_exceptions=True)

        out: dict[str, int | None] = {}
        for key, res in zip(keys, self._run(sizes)):
            if isinstance(res, BaseException):
                raise self._failed(f"size of {key!r}", res)
            out[key[len(base) :]] = res
        return out

    def versions_below_sync(self, prefix: str) -> dict[str, KeyVersion]:
        """Keys below a prefix with (size, no time, no tag): a snapshot never changes, and the mount
        drops its cached chunks whenever it moves to another one."""
        return {rel: (size, None, None) for rel, size in self.sizes_below_sync(prefix).items()}

    # --- operations: what the daemon and fuse_ops ask of any store ---------------------

    def probe_sync(self, shown: str) -> None:
        """The repository was opened when this store was made: nothing more to check."""

    def exists_sync(self) -> bool:
        return True

    def mtime_ns_sync(self, key: str) -> int | None:
        return None

    def set_mtime_sync(self, key: str, mtime_ns: int) -> bool:
        return False  # a snapshot keeps no times of its keys (its commit has one)

    # --- writes, into the session (writes.py) ----------------------------------------------

    def commit_sync(self, message: str) -> str | None:
        """Commit what the session holds (see Repository.commit_sync); None when it holds nothing."""
        return self._writes.commit_sync(message)

    def stage_docs(self, staging: str, docs: dict[str, bytes]) -> None:
        """The documents of an array being written under STAGING, stored before its first chunk."""
        self._writes.stage_docs(staging, docs)

    def set_sync(self, key: str, value: bytes) -> None:
        self._writes.set_sync(key, value)

    def put_stream_sync(self, key: str, source: Any, block_bytes: int = 1 << 20) -> None:
        self._writes.set_sync(key, source.read())  # (a session takes whole values)

    def erase_sync(self, key: str) -> None:
        self._writes.erase_sync(key)

    def erase_below_sync(self, prefix: str) -> None:
        self._writes.erase_below_sync(prefix)

    def move_node_sync(self, src: str, dst: str, message: str) -> bool:
        """Move node SRC to DST as one commit of its own (see Repository.move_node_sync)."""
        return self._writes.move_node_sync(src, dst, message)

    def move_sync(self, src: str, dst: str) -> None:
        self._writes.move_sync(src, dst)


def _split(key: str) -> tuple[str | None, str]:
    """(the snapshot a key below `SNAPSHOT_PREFIX + ID` belongs to, or None: the one shown; the key there)."""
    if not key.startswith(SNAPSHOT_PREFIX):
        return None, key
    head, _, rel = key.partition("/")
    return head[len(SNAPSHOT_PREFIX) :], rel


def _lists_chunks(icechunk: Any) -> bool:
    """Whether this icechunk lists an array's chunk references (2.x)."""
    return hasattr(icechunk.IcechunkStore, "array_chunk_iterator")


def _prototype() -> Any:
    """zarr-python's buffer prototype with `_Bytes` as its buffer: values arrive uncopied."""
    from zarr.core.buffer import BufferPrototype, default_buffer_prototype

    return BufferPrototype(buffer=_Bytes, nd_buffer=default_buffer_prototype().nd_buffer)  # type: ignore[arg-type]
