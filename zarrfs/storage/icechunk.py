"""An Icechunk repository as a zarrfs store: a session of one snapshot behind the Store interface.

Icechunk keeps a Zarr v3 hierarchy under transactional control (snapshots, branches, tags);
its session store is asynchronous and speaks zarr-python's buffer types. This adapter runs
that store on an asyncio loop of its own, in one thread, and answers the synchronous calls
zarrfs's engine makes from its worker threads: reads of the snapshot mounted (and of any
other, for `.zarrfs/versions`), and on a writable branch, writes into a session that
`commit_sync` commits once per operation. `icechunk` is imported here only, lazily: it is an
optional extra (`zarrfs[icechunk]`).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import datetime
import fcntl
import json
import logging
import os
import re
import threading
from typing import Any, Callable, Coroutine

from ..errors import Conflict, ReadOnly, StoreError, UserError, ZarrfsError
from .keys import join
from ..options import AUTHORIZE
from ..repeats import RepeatedFailures
from .staging import LEASE_PREFIX
from .store import METADATA_MAX_BYTES, Store

log = logging.getLogger(__name__)

EXTRA = "zarrfs[icechunk]"
# What a repository holds at its root (every Icechunk version writes `snapshots/`; format 1
# keeps its branches and tags under `refs/`, later formats a `repo` object): one listing tells.
SNAPSHOTS_DIR = "snapshots"
REFS_DIR = "refs"
REPO_OBJECT = "repo"
# A Zarr hierarchy's own root documents: a store holding one is a hierarchy, whatever else it holds.
ZARR_ROOT_DOCS = ("zarr.json", ".zgroup", ".zarray", ".zmetadata", "meta")
# Keys below `SNAPSHOT_PREFIX + ID` are those of snapshot ID (the history under `.zarrfs/versions`):
# one store, one engine and one cache serve every version, each cached under its own paths.
# The prefix starts with `.zarrfs`, which no node name may.
SNAPSHOT_PREFIX = ".zarrfs-snapshot-"
RESERVED = ".zarrfs"  # names of the mount's own (staging areas of arrays being written)
# Sessions of other snapshots kept open (each holds its snapshot's node table in memory).
SESSIONS_KEPT = 32
# What an Icechunk snapshot ID looks like: 12 bytes in Crockford's base32.
SNAPSHOT_ID = re.compile(r"[0-9A-HJKMNP-TV-Z]{20}")
# Errors icechunk raises for a key it cannot hold at all (a view asking for `t`, not `t/zarr.json`):
# such a key is simply absent.
INVALID_KEY = "invalid zarr key"
# ... or for a key of a node that does not exist (a staged array none of whose chunks is stored yet).
NO_NODE = "node not found"
# ... for a virtual chunk whose container the mount was not authorised to read (its URL prefix named).
UNAUTHORIZED = re.compile(r"resolves to the url prefix (\S+?),? to be able to fetch the chunk you need to authorize")
# ... and for a prefix that is no node (a staged array none of whose chunks was stored): empty.
BAD_PREFIX = "bad key prefix"


def looks_like_repository_sync(store: Store) -> bool:
    """Whether SOURCE (opened as a plain store) holds an Icechunk repository, from one listing."""
    try:
        files, dirs = store.list_dir_sync("")
    except ZarrfsError:
        return False
    if any(doc in files or doc in dirs for doc in ZARR_ROOT_DOCS):
        return False
    return SNAPSHOTS_DIR in dirs and (REFS_DIR in dirs or REPO_OBJECT in files)


def _icechunk() -> Any:
    try:
        import icechunk
    except ImportError:
        raise UserError(f"Icechunk repositories need the icechunk package: pip install '{EXTRA}'") from None
    return icechunk


def _reason(error: BaseException) -> str:
    """One line from icechunk's multi-line error report: its first statement."""
    for line in str(error).splitlines():
        line = line.strip().lstrip("x").strip()
        if line:
            return line[:200]
    return type(error).__name__


def virtual_access(prefixes: tuple[str, ...], storage_options: dict[str, Any]) -> dict[str, Any] | None:
    """Icechunk's `authorize_virtual_chunk_access` for the containers PREFIXES name: S3 ones read with
    the credentials of storage_options when it has some, every other (and S3 without) with what
    the environment gives, or anonymously where the container allows it."""
    if not prefixes:
        return None
    icechunk = _icechunk()
    key = storage_options.get("key") or storage_options.get("aws_access_key_id")
    secret = storage_options.get("secret") or storage_options.get("aws_secret_access_key")
    access: dict[str, Any] = {}
    for prefix in prefixes:
        s3 = prefix.startswith(("s3://", "s3a://"))
        access[prefix] = (icechunk.containers_credentials({prefix: icechunk.s3_credentials(
            access_key_id=key, secret_access_key=secret, session_token=storage_options.get("token"))})[prefix]
            if s3 and key and secret else None)
    return access


def storage_of(source: str, storage_options: dict[str, Any]) -> Any:
    """Icechunk's Storage for SOURCE: a local directory, or s3:// / gs:// with fsspec-style options."""
    icechunk = _icechunk()
    scheme, sep, rest = source.partition("://")
    if not sep:
        return icechunk.local_filesystem_storage(os.path.abspath(source))
    if scheme == "file":
        return icechunk.local_filesystem_storage(rest)
    bucket, _, prefix = rest.partition("/")
    prefix = prefix.strip("/") or None
    if scheme in ("s3", "s3a"):
        client = storage_options.get("client_kwargs", {})
        endpoint = storage_options.get("endpoint_url") or client.get("endpoint_url")
        key = storage_options.get("key") or storage_options.get("aws_access_key_id")
        secret = storage_options.get("secret") or storage_options.get("aws_secret_access_key")
        anonymous = bool(storage_options.get("anon")) or None
        return icechunk.s3_storage(
            bucket=bucket, prefix=prefix, endpoint_url=endpoint,
            region=storage_options.get("region_name") or client.get("region_name"),
            allow_http=bool(endpoint and endpoint.startswith("http://")),
            access_key_id=key, secret_access_key=secret, session_token=storage_options.get("token"),
            anonymous=anonymous, from_env=None if key or anonymous else True,
            # Path-style addressing: what S3-compatible servers on an endpoint_url expect.
            force_path_style=bool(endpoint))
    if scheme in ("gs", "gcs"):
        return icechunk.gcs_storage(bucket=bucket, prefix=prefix, from_env=True)
    raise UserError(f"{source}: Icechunk repositories are mounted from a local directory, s3:// or gs://")


class _Bytes:
    """The buffer type handed to icechunk's store: it keeps the value icechunk hands over (a
    buffer of its own), uncopied; `_plain` or a copy into the chunk's buffer makes it usable."""

    @classmethod
    def from_bytes(cls, data: Any) -> Any:
        return data


def _plain(data: Any) -> bytes:
    """A value as bytes (JSON parsing and slicing do not take icechunk's buffer)."""
    return data if isinstance(data, bytes) else bytes(data)


class Version:
    """One snapshot of a repository, opened as a session (read-only, or writable on a branch)."""

    def __init__(self, session: Any) -> None:
        self.session = session
        self.snapshot_id: str = session.snapshot_id
        self.store = session.store


class IcechunkStore:
    """A zarrfs store over one snapshot of an Icechunk repository, and over any other snapshot
    below `SNAPSHOT_PREFIX + ID` (read-only).

    A branch mount follows the branch: `follow_tip_sync` moves it to the branch's newest
    snapshot (a new session), never while a file is open, so a reader sees one snapshot.
    With `writable`, the session is writable and `commit_sync` makes what it holds a commit.
    """

    is_local = False  # no file paths: reads go through icechunk, whatever holds the repository
    ranges_ignored = False

    def __init__(self, source: str, storage_options: dict[str, Any] | None = None, ref: str | None = None,
                 snapshot: str | None = None, log_level: str = "warning", timeout_s: float | None = None,
                 writable: bool = False, authorized: tuple[str, ...] = ()) -> None:
        icechunk = _icechunk()
        if "ICECHUNK_LOG" not in os.environ:  # icechunk's own log goes to stderr, not ours
            icechunk.set_logs_filter("icechunk=info" if log_level == "debug" else "error")
        self.source = source
        self.timeout_s = timeout_s  # the longest wait for one call (the engine gives up then too)
        self._loop = asyncio.new_event_loop()
        thread = threading.Thread(target=self._loop.run_forever, name="zarrfs-icechunk", daemon=True)
        thread.start()
        try:
            self.repo = icechunk.Repository.open(
                storage_of(source, storage_options or {}),
                authorize_virtual_chunk_access=virtual_access(authorized, storage_options or {}))
        except icechunk.IcechunkError as e:
            raise UserError(f"{source}: cannot open the Icechunk repository: {_reason(e)}") from None
        self.branch: str | None = None
        self.tag: str | None = None
        try:
            if snapshot is not None:
                session = self.repo.readonly_session(snapshot_id=snapshot)
            elif ref is None or ref in self.repo.list_branches():
                self.branch = ref or "main"
                session = self.repo.readonly_session(branch=self.branch)
            elif ref in self.repo.list_tags():
                self.tag = ref
                session = self.repo.readonly_session(tag=ref)
            else:
                raise UserError(f"{source}: ref={ref}: no such branch or tag (branches: "
                                f"{', '.join(sorted(self.repo.list_branches()))}; tags: "
                                f"{', '.join(sorted(self.repo.list_tags())) or 'none'})")
        except icechunk.IcechunkError as e:
            what = f"snapshot={snapshot}" if snapshot is not None else f"ref={ref or 'main'}"
            raise UserError(f"{source}: {what}: {_reason(e)}") from None
        if writable and self.branch is None:
            raise UserError(f"{source}: writes go to a branch; ref={ref or snapshot} is not one")
        self.read_only = not writable
        self.version = Version(self.repo.writable_session(self.branch) if writable else session)
        self.tip_pending: str | None = None  # a newer snapshot of the branch, taken once no file is open
        # Set when a commit of ours took in other writers' commits: what the mount cached may be stale.
        self.others_taken_in = False
        self._staging_docs: dict[str, dict[str, bytes]] = {}  # arrays being written: their documents
        self._lock_path = _lock_path(source) if writable else None
        self._error = icechunk.IcechunkError
        self._prototype = _prototype()
        # Sessions of other snapshots (the history), most recently used last.
        self._others: collections.OrderedDict[str, Any] = collections.OrderedDict()
        self._others_lock = threading.Lock()
        # Containers virtual chunks were refused from: said once a minute each, not once per chunk.
        self._refused = RepeatedFailures()

    def __repr__(self) -> str:
        return f"IcechunkStore({self.source!r}, {self.snapshot_id})"

    @property
    def snapshot_id(self) -> str:
        return self.version.snapshot_id

    @property
    def follows_branch(self) -> bool:
        return self.branch is not None

    # --- the branch's tip -------------------------------------------------------------

    def follow_tip_sync(self, may_move: bool) -> bool:
        """Look up the branch's newest snapshot; move to it when MAY_MOVE (no file open), else
        remember it for later. True when the mount now shows another snapshot."""
        if self.branch is None:
            return False
        if self.others_taken_in:  # the session is at the tip already; what the mount cached is not
            if may_move:
                self.others_taken_in, self.tip_pending = False, None
            return may_move
        if self.writable and self.version.session.has_uncommitted_changes:
            return False  # an operation under way: the next commit takes the tip in
        try:
            tip = self.repo.lookup_branch(self.branch)
        except self._error as e:
            raise StoreError(f"looking up branch {self.branch!r} failed: {_reason(e)}") from None
        if tip == self.snapshot_id:
            self.tip_pending = None
            return False
        if not may_move:
            if self.tip_pending != tip:
                log.info("branch %s moved to snapshot %s: shown once no file of the mount is open",
                         self.branch, tip)
            self.tip_pending = tip
            return False
        try:
            session = (self.repo.writable_session(self.branch) if self.writable
                       else self.repo.readonly_session(snapshot_id=tip))
        except self._error as e:
            raise StoreError(f"opening snapshot {tip} of branch {self.branch!r} failed: {_reason(e)}") from None
        log.info("branch %s: now showing snapshot %s (was %s)", self.branch, tip, self.snapshot_id)
        self.version = Version(session)
        self.tip_pending = None
        return True

    # --- the history ------------------------------------------------------------------

    def refs_sync(self, kind: str) -> dict[str, str]:
        """Branches or tags (KIND) -> the snapshot each names now."""
        try:
            if kind == "branches":
                return {name: self.repo.lookup_branch(name) for name in sorted(self.repo.list_branches())}
            return {name: self.repo.lookup_tag(name) for name in sorted(self.repo.list_tags())}
        except self._error as e:
            raise StoreError(f"listing the {kind} failed: {_reason(e)}") from None

    def ancestry_sync(self) -> list[dict[str, Any]]:
        """The snapshot shown and its ancestors, newest first: id, time, message, parent."""
        try:
            found = list(self.repo.ancestry(snapshot_id=self.snapshot_id))
        except self._error as e:
            raise StoreError(f"reading the ancestry of snapshot {self.snapshot_id} failed: {_reason(e)}") from None
        return [{"id": s.id, "time": s.written_at.astimezone(datetime.timezone.utc).isoformat(),
                 "message": s.message, "parent": s.parent_id} for s in found]

    def log_json_sync(self) -> bytes:
        """`.zarrfs/versions/log.json`: what is mounted and its ancestry."""
        doc = {"branch": self.branch, "tag": self.tag, "snapshot": self.snapshot_id,
               "ancestry": self.ancestry_sync()}
        return (json.dumps(doc, indent=2) + "\n").encode()

    def has_snapshot_sync(self, snapshot_id: str) -> bool:
        """Whether the repository holds a snapshot of that ID."""
        return self._session_store(snapshot_id) is not None

    def _session_store(self, snapshot_id: str) -> Any:
        """The store of a read-only session at SNAPSHOT_ID (kept for later), None when there is none."""
        if snapshot_id == self.snapshot_id:
            return self.version.store
        with self._others_lock:
            store = self._others.get(snapshot_id)
            if store is not None:
                self._others.move_to_end(snapshot_id)
                return store
        if not SNAPSHOT_ID.fullmatch(snapshot_id):
            return None
        try:
            store = self.repo.readonly_session(snapshot_id=snapshot_id).store
        except self._error as e:
            if "not found" in str(e):
                return None
            raise self._failed(f"opening snapshot {snapshot_id}", e) from None
        with self._others_lock:
            self._others[snapshot_id] = store
            while len(self._others) > SESSIONS_KEPT:
                self._others.popitem(last=False)
        return store

    def _route(self, key: str) -> tuple[Any, str]:
        """The session store a key belongs to (None: a snapshot that does not exist) and the key there."""
        if not key.startswith(SNAPSHOT_PREFIX):
            return self.version.store, key
        head, _, rest = key.partition("/")
        return self._session_store(head[len(SNAPSHOT_PREFIX):]), rest

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
        refused = UNAUTHORIZED.search(str(error))
        if refused is not None:
            return self._unauthorized(what, refused.group(1))
        return StoreError(f"{what} failed (snapshot {self.snapshot_id}): {_reason(error)}")

    def _unauthorized(self, what: str, prefix: str) -> StoreError:
        """A virtual chunk of a container not authorised: one line per container (not per chunk)
        naming it and the option, then EIO for each read it fails."""
        reason = (f"virtual chunks in container {prefix} are not read: the mount is not authorised to "
                  f"(mount with -o {AUTHORIZE}={prefix})")
        line = self._refused.line(prefix, reason)
        if line is not None:
            log.warning("%s; %s", line, f"{what} failed")
        error = StoreError(f"{what} failed: {reason}")
        error.logged = error.logged_by_store = True  # said above, once per container: only counted
        return error

    def get_sync(self, key: str, max_nbytes: int | None = METADATA_MAX_BYTES, into: Any = None) -> Any:
        """The value of a key, or None; larger than `max_nbytes`: StoreError. A value that fits in
        INTO (a writable buffer) is copied into it: INTO returned when it is exactly its size, else
        a view of its first bytes. Documents (`zarr.json`: a repository holds v3 only) come as
        bytes; any other value as a read-only view of icechunk's own buffer."""
        store, rel = self._route(key)
        try:
            data = self._run(lambda: self._get(store, rel))
        except self._error as e:
            raise self._failed(f"reading {key!r}", e) from None
        if data is None:
            return None
        Store._bounded(key, data, max_nbytes)
        if into is not None and len(data) <= len(into):  # the chunk's own buffer: no decoding copy after
            view = memoryview(into).cast("B")
            view[:len(data)] = data
            return into if len(data) == len(view) else view[:len(data)]
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

        out: dict[str, bytes | None] = {}
        for key, res in zip(keys, self._run(gather)):
            if isinstance(res, BaseException):
                raise self._failed(f"reading {key!r}", res)
            out[key] = None if res is None else Store._bounded(key, _plain(res), max_nbytes)
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
            return _plain(data)[:end - start]

        async def gather() -> list[Any]:
            return await asyncio.gather(*(one(a, b) for a, b in ranges), return_exceptions=True)

        out = []
        for (start, end), res in zip(ranges, self._run(gather)):
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
            out[key[len(base):]] = res
        return out

    def versions_below_sync(self, prefix: str) -> dict[str, tuple[int | None, int | None, str | None]]:
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

    def stored_bytes_sync(self) -> int | None:
        return None

    def free_bytes_sync(self) -> int | None:
        return None

    def is_dir_sync(self, prefix: str) -> bool:
        return False

    def set_mtime_sync(self, key: str, mtime_ns: int) -> bool:
        return False  # a snapshot keeps no times of its keys (its commit has one)

    # --- what a cache in front of a store is told: nothing here (snapshots never change) ---

    def note_array(self, keys: Any) -> None:
        """An array with these ChunkKeys is about to be read."""

    def refresh(self) -> None:
        """Whatever was kept of the store is checked again before its next use."""

    def version_time(self, key: str, began: float) -> float:
        return began

    def disk_stats(self) -> dict[str, Any]:
        return Store.disk_stats(self)  # the same counters as a store without a disk cache: none

    # --- writes: into the session, committed once per operation -------------------------

    @property
    def writable(self) -> bool:
        return not self.read_only

    def _writing(self, key: str) -> Any:
        """The writable session's store, for a key of the mounted version."""
        if self.read_only or key.startswith(SNAPSHOT_PREFIX):
            raise ReadOnly(f"{key}: this version of the repository is read-only")
        return self.version.store

    def stage_docs(self, staging: str, docs: dict[str, bytes]) -> None:
        """The documents of an array being written under STAGING: icechunk takes a chunk only
        for an array it knows, so they are stored before its first chunk."""
        self._staging_docs[staging] = docs

    def set_sync(self, key: str, value: bytes) -> None:
        """Store a value in the session (seen by this mount at once, by others after the commit)."""
        from zarr.core.buffer import cpu

        if key.startswith(LEASE_PREFIX):
            return  # uncommitted changes die with the daemon that made them: no staging outlives it
        store = self._writing(key)
        docs = next((d for prefix, d in self._staging_docs.items() if key.startswith(prefix + "/")), None)

        async def put() -> None:
            if docs is not None:
                for doc_key, doc in docs.items():
                    await store.set(doc_key, cpu.Buffer.from_bytes(doc))
            await store.set(key, cpu.Buffer.from_bytes(bytes(value)))

        try:
            self._run(put)
        except self._error as e:
            raise self._failed(f"writing {key!r}", e) from None
        if docs is not None:
            self._staging_docs = {p: d for p, d in self._staging_docs.items() if d is not docs}

    def erase_sync(self, key: str) -> None:
        """Remove a key from the session; an absent key is not an error."""
        if key.startswith(LEASE_PREFIX):
            return
        store = self._writing(key)

        async def delete() -> None:
            try:
                await store.delete(key)
            except KeyError:  # no node holds it (a staged array none of whose chunks is stored yet)
                pass
            except self._error as e:
                if INVALID_KEY not in str(e):  # its node is gone already
                    raise

        try:
            self._run(delete)
        except self._error as e:
            raise self._failed(f"erasing {key!r}", e) from None

    def erase_below_sync(self, prefix: str) -> None:
        """Remove every key below a prefix (a staging area being dropped, a node removed)."""
        store = self._writing(prefix)
        self._staging_docs.pop(prefix, None)
        try:
            self._run(lambda: store.delete_dir(prefix))
        except self._error as e:
            if BAD_PREFIX not in str(e):
                raise self._failed(f"removing {prefix!r}", e) from None

    def move_sync(self, src: str, dst: str) -> None:
        """Give key `src`'s value to `dst` and remove `src` (a copy: icechunk 1.x moves nothing)."""
        value = self.get_sync(src, None)
        if value is None:
            raise StoreError(f"moving {src!r} to {dst!r}: {src!r} vanished")
        self.set_sync(dst, value)
        self.erase_sync(src)

    def swap_dirs_sync(self, staging: str, final: str) -> None:
        raise ReadOnly("directories are swapped on local stores only")

    def commit_sync(self, message: str) -> str | None:
        """Commit what the session holds as one snapshot of the branch (None when it holds nothing).

        Another writer's commit in between is taken in where the changes do not overlap
        (icechunk's conflict detection); where they do, the change becomes a branch of its own
        and Conflict says which. Either way the mount then writes on the branch's newest snapshot.
        Local repositories: commits of several mounts take turns (a lock file beside it).
        """
        icechunk = _icechunk()
        session = self.version.session
        if self.read_only or not session.has_uncommitted_changes:
            return None
        base = session.snapshot_id
        with _locked(self._lock_path):
            try:
                tip = self.repo.lookup_branch(self.branch)
                # icechunk's detector lets two replacements of one array (each a deletion and a new
                # node) both through: a node both sides changed is a conflict here.
                both = (_touched(session.status()) & _touched(self.repo.diff(from_snapshot_id=base,
                                                                               to_snapshot_id=tip))
                        if tip != base else set())
                if both:
                    return self._conflict(message, f"both changed {', '.join(sorted(both))}")
                new = session.commit(message, rebase_with=icechunk.ConflictDetector())
            except (icechunk.ConflictError, icechunk.RebaseFailedError) as e:
                return self._conflict(message, _reason(e))
            except self._error as e:
                raise self._failed(f"committing {message!r}", e) from None
            finally:
                self._staging_docs.clear()
            parent = self.repo.lookup_snapshot(new).parent_id
            self.version = Version(self.repo.writable_session(self.branch))
        if parent != base:  # others' commits are in it now
            self.others_taken_in, self.tip_pending = True, new
        log.info("committed snapshot %s on branch %s: %s", new, self.branch, message)
        return new

    def _conflict(self, message: str, reason: str) -> str:
        """The session's change saved as a snapshot of its own, on a new branch; Conflict raised."""
        session = self.version.session
        stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%S")
        name = f"{self.branch}.zarrfs-conflict-{stamp}-{os.getpid()}"
        try:
            saved = session.flush(f"{message} (conflicted with branch {self.branch})")
            self.repo.create_branch(name, snapshot_id=saved)
        except self._error as e:
            raise self._failed(f"saving {message!r} after a conflict", e) from None
        finally:
            self.version = Version(self.repo.writable_session(self.branch))
            self.others_taken_in, self.tip_pending = True, self.version.snapshot_id
        log.warning("%s: conflicts with another commit on branch %s (%s); the change is on branch %s",
                    message, self.branch, reason, name)
        raise Conflict(f"{message}: conflicts with another commit on branch {self.branch}; "
                       f"the change is on branch {name}")


def _touched(diff: Any) -> set[str]:
    """The nodes a change (icechunk's Diff) created, removed or changed; staging areas left out."""
    paths = (diff.new_groups | diff.new_arrays | diff.deleted_groups | diff.deleted_arrays | diff.updated_groups
             | diff.updated_arrays | set(diff.updated_chunks))
    return {p for p in paths if "/" + RESERVED not in p}


def _lock_path(source: str) -> str | None:
    """The lock file commits of a local repository take turns on: beside the repository."""
    scheme, sep, rest = source.partition("://")
    if sep and scheme != "file":
        return None  # object stores: icechunk's own conditional writes order the commits
    path = os.path.abspath(rest if sep else source).rstrip("/")
    return os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.zarrfs-lock")


class _locked:
    """Hold an exclusive flock on PATH (None: nothing to hold) for a `with` block."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self.fd: int | None = None

    def __enter__(self) -> None:
        if self.path is not None:
            self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            fcntl.flock(self.fd, fcntl.LOCK_EX)

    def __exit__(self, *exc: Any) -> None:
        if self.fd is not None:
            os.close(self.fd)  # releases the lock
            self.fd = None


def _prototype() -> Any:
    """zarr-python's buffer prototype with `_Bytes` as its buffer: values arrive uncopied."""
    from zarr.core.buffer import BufferPrototype, default_buffer_prototype

    return BufferPrototype(buffer=_Bytes, nd_buffer=default_buffer_prototype().nd_buffer)
