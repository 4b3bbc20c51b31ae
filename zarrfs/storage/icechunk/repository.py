"""An Icechunk repository and the version of it a mount shows: opening, refs, following a branch's tip, the history, commits.

`icechunk` is imported here only, lazily: it is an optional extra (`zarrfs[icechunk]`).
"""

from __future__ import annotations

import collections
import datetime
import json
import logging
import os
import re
import threading
from typing import Any

from ...errors import Conflict, StoreError, UserError, ZarrfsError
from ...manual import AUTHORIZE
from ...repeats import RepeatedFailures
from ..base import BaseStore
from ..remote import install_hint
from .commitlock import CommitLock, lock_path, locked

log = logging.getLogger(__package__)  # one logger for the Icechunk adapter, named as before its split

# What a repository holds at its root (every Icechunk version writes `snapshots/`; format 1
# keeps its branches and tags under `refs/`, later formats a `repo` object): one listing tells.
SNAPSHOTS_DIR = "snapshots"
REFS_DIR = "refs"
REPO_OBJECT = "repo"
# A Zarr hierarchy's own root documents: a store holding one is a hierarchy, whatever else it holds.
ZARR_ROOT_DOCS = ("zarr.json", ".zgroup", ".zarray", ".zmetadata", "meta")
RESERVED = ".zarrfs"  # names of the mount's own (staging areas of arrays being written)
# Sessions of other snapshots kept open (each holds its snapshot's node table in memory).
SESSIONS_KEPT = 32
# What an Icechunk snapshot ID looks like: 12 bytes in Crockford's base32.
SNAPSHOT_ID = re.compile(r"[0-9A-HJKMNP-TV-Z]{20}")
# What icechunk says of a virtual chunk whose container the mount was not authorised to read
# (its URL prefix named).
UNAUTHORIZED = re.compile(r"resolves to the url prefix (\S+?),? to be able to fetch the chunk you need to authorize")


# Concurrent parts an object of a local repository is read in (local_reads): 1 would read it as a
# stream of small pieces, several times slower.
LOCAL_PARTS = 2


def looks_like_repository_sync(store: BaseStore) -> bool:
    """Whether SOURCE (opened as a plain store) holds an Icechunk repository, from one listing."""
    try:
        files, dirs = store.list_dir_sync("")
    except ZarrfsError:
        return False
    if any(doc in files or doc in dirs for doc in ZARR_ROOT_DOCS):
        return False
    return SNAPSHOTS_DIR in dirs and (REFS_DIR in dirs or REPO_OBJECT in files)


def icechunk_module() -> Any:
    """The icechunk package; a UserError naming the extra when it is not installed."""
    try:
        import icechunk
    except ImportError:
        raise UserError(f"Icechunk repositories need the icechunk package: {install_hint('icechunk')}") from None
    return icechunk


def error_reason(error: BaseException) -> str:
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
    icechunk = icechunk_module()
    key = storage_options.get("key") or storage_options.get("aws_access_key_id")
    secret = storage_options.get("secret") or storage_options.get("aws_secret_access_key")
    access: dict[str, Any] = {}
    for prefix in prefixes:
        s3 = prefix.startswith(("s3://", "s3a://"))
        access[prefix] = (
            icechunk.containers_credentials(
                {
                    prefix: icechunk.s3_credentials(
                        access_key_id=key, secret_access_key=secret, session_token=storage_options.get("token")
                    )
                }
            )[prefix]
            if s3 and key and secret
            else None
        )
    return access


def local_reads() -> Any:
    """The repository's settings for this mount when it is on local disk (not saved in it): each
    object read in at most LOCAL_PARTS concurrent parts. Icechunk's default for local storage
    reads a chunk in 5 parts of at least 4 KiB, each its own open, read and close in a thread of
    its own and then a copy into one buffer: on local disk, 2 parts cost 14% less CPU and half
    the context switches (docs/PERFORMANCE.md: Icechunk)."""
    icechunk = icechunk_module()
    concurrency = icechunk.StorageConcurrencySettings(max_concurrent_requests_for_object=LOCAL_PARTS)
    return icechunk.RepositoryConfig(storage=icechunk.StorageSettings(concurrency=concurrency))


def local_path(source: str) -> str | None:
    """The directory of a repository in a local directory (SOURCE a path, or file://), else None."""
    scheme, sep, rest = source.partition("://")
    if not sep:
        return os.path.abspath(source)
    return os.path.abspath(rest) if scheme == "file" else None


def storage_of(source: str, storage_options: dict[str, Any]) -> Any:
    """Icechunk's Storage for SOURCE: a local directory, or s3:// / gs:// with fsspec-style options."""
    icechunk = icechunk_module()
    path = local_path(source)
    if path is not None:
        return icechunk.local_filesystem_storage(path)
    scheme, _, rest = source.partition("://")
    bucket, _, below = rest.partition("/")
    prefix = below.strip("/") or None
    if scheme in ("s3", "s3a"):
        client = storage_options.get("client_kwargs", {})
        endpoint = storage_options.get("endpoint_url") or client.get("endpoint_url")
        key = storage_options.get("key") or storage_options.get("aws_access_key_id")
        secret = storage_options.get("secret") or storage_options.get("aws_secret_access_key")
        anonymous = bool(storage_options.get("anon")) or None
        return icechunk.s3_storage(
            bucket=bucket,
            prefix=prefix,
            endpoint_url=endpoint,
            region=storage_options.get("region_name") or client.get("region_name"),
            allow_http=bool(endpoint and endpoint.startswith("http://")),
            access_key_id=key,
            secret_access_key=secret,
            session_token=storage_options.get("token"),
            anonymous=anonymous,
            from_env=None if key or anonymous else True,
            # Path-style addressing: what S3-compatible servers on an endpoint_url expect.
            force_path_style=bool(endpoint),
        )
    if scheme in ("gs", "gcs"):
        return icechunk.gcs_storage(bucket=bucket, prefix=prefix, from_env=True)
    raise UserError(f"{source}: Icechunk repositories are mounted from a local directory, s3:// or gs://")


class Version:
    """One snapshot of a repository, opened as a session (read-only, or writable on a branch)."""

    def __init__(self, session: Any) -> None:
        self.session = session
        self.snapshot_id: str = session.snapshot_id
        self.store = session.store


class Repository:
    """The repository opened, and the snapshot shown (`version`): on a branch (followed to its
    newest snapshot), at a tag, or at a snapshot. Other snapshots open read-only on demand.
    With `writable`, the session is writable and `commit_sync` makes what it holds a commit."""

    def __init__(
        self,
        source: str,
        storage_options: dict[str, Any],
        ref: str | None,
        snapshot: str | None,
        writable: bool,
        authorized: tuple[str, ...],
    ) -> None:
        icechunk = icechunk_module()
        self.source = source
        self.local_dir = local_path(source)  # a repository in a local directory: where, else None
        self.on_local_disk = self.local_dir is not None  # reading a chunk again costs no network
        try:
            self.repo = icechunk.Repository.open(
                storage_of(source, storage_options),
                config=local_reads() if self.on_local_disk else None,
                authorize_virtual_chunk_access=virtual_access(authorized, storage_options),
            )
        except icechunk.IcechunkError as e:
            raise UserError(f"{source}: cannot open the Icechunk repository: {error_reason(e)}") from None
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
                raise UserError(
                    f"{source}: ref={ref}: no such branch or tag (branches: "
                    f"{', '.join(sorted(self.repo.list_branches()))}; tags: "
                    f"{', '.join(sorted(self.repo.list_tags())) or 'none'})"
                )
        except icechunk.IcechunkError as e:
            what = f"snapshot={snapshot}" if snapshot is not None else f"ref={ref or 'main'}"
            raise UserError(f"{source}: {what}: {error_reason(e)}") from None
        if writable and self.branch is None:
            raise UserError(f"{source}: writes go to a branch; ref={ref or snapshot} is not one")
        self.read_only = not writable
        self.version = Version(self.repo.writable_session(self.branch) if writable else session)
        self.tip_pending: str | None = None  # a newer snapshot of the branch, taken once no file is open
        # Set when a commit of ours took in other writers' commits: what the mount cached may be stale.
        self.others_taken_in = False
        self._ready: Version | None = None  # what follow_tip_sync found, for show_ready to show
        self._lock_path = lock_path(self.local_dir) if writable else None
        self.error = icechunk.IcechunkError
        # Sessions of other snapshots (the history), most recently used last.
        self._others: collections.OrderedDict[str, Any] = collections.OrderedDict()
        self._others_lock = threading.Lock()
        # Containers virtual chunks were refused from: said once a minute each, not once per chunk.
        self._refused = RepeatedFailures()
        self.commit_lock = CommitLock()  # writes into the session (shared), commits that replace it

    @property
    def snapshot_id(self) -> str:
        return self.version.snapshot_id

    @property
    def writable(self) -> bool:
        return not self.read_only

    # --- the branch's tip -------------------------------------------------------------

    def follow_tip_sync(self, may_move: bool) -> bool:
        """Look up the branch's newest snapshot; when MAY_MOVE (no file open), open a session of
        it for `show_ready` to show, else remember it for later. True when there is one to show."""
        self._ready = None
        if self.branch is None:
            return False
        if self.others_taken_in:  # the session is at the tip already; what the mount cached is not
            if may_move:
                self._ready = self.version
            return may_move
        if self.writable and self.version.session.has_uncommitted_changes:
            return False  # an operation under way: the next commit takes the tip in
        try:
            tip = self.repo.lookup_branch(self.branch)
        except self.error as e:
            raise StoreError(f"looking up branch {self.branch!r} failed: {error_reason(e)}") from None
        if tip == self.snapshot_id:
            self.tip_pending = None
            return False
        if not may_move:
            if self.tip_pending != tip:
                log.info("branch %s moved to snapshot %s: shown once no file of the mount is open", self.branch, tip)
            self.tip_pending = tip
            return False
        try:
            session = (
                self.repo.writable_session(self.branch)
                if self.writable
                else self.repo.readonly_session(snapshot_id=tip)
            )
        except self.error as e:
            raise StoreError(f"opening snapshot {tip} of branch {self.branch!r} failed: {error_reason(e)}") from None
        self._ready = Version(session)
        return True

    def show_ready(self, may_move: bool) -> bool:
        """Show the snapshot follow_tip_sync found, when MAY_MOVE still holds: called in the thread
        that opens files, with nothing in between, so that a file opened while the tip was looked
        up keeps the mount on its snapshot (the new one then waits as `tip_pending`). True when
        the mount now shows another snapshot."""
        ready, self._ready = self._ready, None
        if ready is None:
            return False
        if not may_move:
            self.tip_pending = ready.snapshot_id
            return False
        if ready is not self.version:
            log.info("branch %s: now showing snapshot %s (was %s)", self.branch, ready.snapshot_id, self.snapshot_id)
        self.version, self.tip_pending, self.others_taken_in = ready, None, False
        return True

    # --- the history ------------------------------------------------------------------

    def refs_sync(self, kind: str) -> dict[str, str]:
        """Branches or tags (KIND) -> the snapshot each names now."""
        try:
            if kind == "branches":
                return {name: self.repo.lookup_branch(name) for name in sorted(self.repo.list_branches())}
            return {name: self.repo.lookup_tag(name) for name in sorted(self.repo.list_tags())}
        except self.error as e:
            raise StoreError(f"listing the {kind} failed: {error_reason(e)}") from None

    def ancestry_sync(self) -> list[dict[str, Any]]:
        """The snapshot shown and its ancestors, newest first: id, time, message, parent."""
        try:
            found = list(self.repo.ancestry(snapshot_id=self.snapshot_id))
        except self.error as e:
            raise StoreError(f"reading the ancestry of snapshot {self.snapshot_id} failed: {error_reason(e)}") from None
        return [
            {
                "id": s.id,
                "time": s.written_at.astimezone(datetime.UTC).isoformat(),
                "message": s.message,
                "parent": s.parent_id,
            }
            for s in found
        ]

    def log_json_sync(self) -> bytes:
        """`.zarrfs/versions/log.json`: what is mounted and its ancestry."""
        doc = {"branch": self.branch, "tag": self.tag, "snapshot": self.snapshot_id, "ancestry": self.ancestry_sync()}
        return (json.dumps(doc, indent=2) + "\n").encode()

    def has_snapshot_sync(self, snapshot_id: str) -> bool:
        """Whether the repository holds a snapshot of that ID."""
        return self.snapshot_store(snapshot_id) is not None

    def snapshot_store(self, snapshot_id: str) -> Any:
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
        except self.error as e:
            if "not found" in str(e):
                return None
            raise self.failed(f"opening snapshot {snapshot_id}", e) from None
        with self._others_lock:
            self._others[snapshot_id] = store
            while len(self._others) > SESSIONS_KEPT:
                self._others.popitem(last=False)
        return store

    def failed(self, what: str, error: BaseException) -> StoreError:
        """The StoreError of a failed icechunk call (WHAT failed): one line naming the snapshot, or
        the container a virtual chunk was refused from."""
        refused = UNAUTHORIZED.search(str(error))
        if refused is not None:
            return self._unauthorized(what, refused.group(1))
        return StoreError(f"{what} failed (snapshot {self.snapshot_id}): {error_reason(error)}")

    def _unauthorized(self, what: str, prefix: str) -> StoreError:
        """A virtual chunk of a container not authorised: one line per container (not per chunk)
        naming it and the option, then EIO for each read it fails."""
        reason = (
            f"virtual chunks in container {prefix} are not read: the mount is not authorised to "
            f"(mount with -o {AUTHORIZE}={prefix})"
        )
        line = self._refused.line(prefix, reason)
        if line is not None:
            log.warning("%s; %s", line, f"{what} failed")
        error = StoreError(f"{what} failed: {reason}")
        error.logged = error.logged_by_store = True  # said above, once per container: only counted
        return error

    def commit_sync(self, message: str, staged_docs: dict[str, Any]) -> str | None:
        """Commit what the session holds as one snapshot of the branch (None when it holds nothing);
        STAGED_DOCS (the store's documents of arrays being staged) is emptied once it is tried.

        Another writer's commit in between is taken in where the changes do not overlap
        (icechunk's conflict detection); where they do, the change becomes a branch of its own
        and Conflict says which. Either way the mount then writes on the branch's newest snapshot.
        Local repositories: commits of several mounts take turns (a lock file beside it).
        """
        icechunk = icechunk_module()
        session = self.version.session
        if self.read_only or not session.has_uncommitted_changes:
            return None
        base = session.snapshot_id
        with self.commit_lock.committing(), locked(self._lock_path):
            try:
                tip = self.repo.lookup_branch(self.branch)
                # icechunk's detector lets two replacements of one array (each a deletion and a new
                # node) both through: a node both sides changed is a conflict here.
                both = (
                    _touched(session.status()) & _touched(self.repo.diff(from_snapshot_id=base, to_snapshot_id=tip))
                    if tip != base
                    else set()
                )
                if both:
                    return self._conflict(message, f"both changed {', '.join(sorted(both))}")
                new = session.commit(message, rebase_with=icechunk.ConflictDetector())
            except (icechunk.ConflictError, icechunk.RebaseFailedError) as e:
                return self._conflict(message, error_reason(e))
            except self.error as e:
                raise self.failed(f"committing {message!r}", e) from None
            finally:
                staged_docs.clear()
            parent = self.repo.lookup_snapshot(new).parent_id
            self.version = Version(self.repo.writable_session(self.branch))
        if parent != base:  # others' commits are in it now
            self.others_taken_in, self.tip_pending = True, new
        log.info("committed snapshot %s on branch %s: %s", new, self.branch, message)
        return new

    def move_node_sync(self, src: str, dst: str, message: str) -> bool:
        """Move node SRC to DST as one commit of its own (MESSAGE), no chunk copied: icechunk 2.x's
        rearrange session. False when that cannot be (icechunk 1.x; the session holds changes not
        committed yet, which a commit of moves only cannot take; the move refused on the branch's
        newest snapshot): the caller copies the node instead, in the session."""
        icechunk = icechunk_module()
        if self.read_only or self.branch is None or not hasattr(self.repo, "rearrange_session"):
            return False
        with self.commit_lock.committing(), locked(self._lock_path):
            if self.version.session.has_uncommitted_changes:
                return False
            shown = self.snapshot_id
            try:
                session = self.repo.rearrange_session(self.branch)
                session.move("/" + src, "/" + dst)
                new = session.commit(message, rebase_with=icechunk.ConflictDetector())
            except self.error as e:  # (conflicts included: nothing was changed)
                log.info("%s: not a move of icechunk's (%s): copied instead", message, error_reason(e))
                return False
            self.version = Version(self.repo.writable_session(self.branch))
        if self.repo.lookup_snapshot(new).parent_id != shown:  # others' commits are in it now
            self.others_taken_in, self.tip_pending = True, new
        log.info("committed snapshot %s on branch %s: %s", new, self.branch, message)
        return True

    def _conflict(self, message: str, reason: str) -> str:
        """The session's change saved as a snapshot of its own, on a new branch; Conflict raised."""
        session = self.version.session
        stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%S")
        name = f"{self.branch}.zarrfs-conflict-{stamp}-{os.getpid()}"
        try:
            saved = session.flush(f"{message} (conflicted with branch {self.branch})")
            self.repo.create_branch(name, snapshot_id=saved)
        except self.error as e:
            raise self.failed(f"saving {message!r} after a conflict", e) from None
        finally:
            self.version = Version(self.repo.writable_session(self.branch))
            self.others_taken_in, self.tip_pending = True, self.version.snapshot_id
        log.warning(
            "%s: conflicts with another commit on branch %s (%s); the change is on branch %s",
            message,
            self.branch,
            reason,
            name,
        )
        raise Conflict(
            f"{message}: conflicts with another commit on branch {self.branch}; the change is on branch {name}"
        )


def _touched(diff: Any) -> set[str]:
    """The nodes a change (icechunk's Diff) created, removed, changed or moved (from and to:
    icechunk 2.x); staging areas left out."""
    paths = (
        diff.new_groups
        | diff.new_arrays
        | diff.deleted_groups
        | diff.deleted_arrays
        | diff.updated_groups
        | diff.updated_arrays
        | set(diff.updated_chunks)
        | {p for move in getattr(diff, "moved_nodes", ()) for p in move}
    )
    return {p for p in paths if "/" + RESERVED not in p}
