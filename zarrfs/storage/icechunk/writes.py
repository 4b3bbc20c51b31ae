"""Writes into an Icechunk session, committed once per operation: the part of IcechunkStore that writes."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from ...errors import ReadOnly, StoreError
from ..staging import LEASE_PREFIX
from .keys import BAD_PREFIX, INVALID_KEY, SNAPSHOT_PREFIX
from .repository import Repository


class SessionWrites:
    """IcechunkStore's writes: into the writable session of the snapshot shown (read-only ones
    refuse them), each operation's made a commit by `commit_sync`. Icechunk stores a chunk only
    for an array it knows: a staged array's documents go in before its first chunk.

    Given what it uses: the repository, whether the mount is read-only, how a coroutine runs
    on the store's loop (RUN), icechunk's error type, how a failure is said (FAILED) and how a
    value is read (GET, for `move_sync`)."""

    def __init__(
        self,
        repository: Repository,
        read_only: bool,
        run: Callable[[Callable[[], Coroutine[Any, Any, Any]]], Any],
        error: type[BaseException],
        failed: Callable[[str, BaseException], StoreError],
        get: Callable[[str, int | None], Any],
    ) -> None:
        self.repository, self.read_only = repository, read_only
        self._run, self._error, self._failed, self._get = run, error, failed, get
        self._staging_docs: dict[str, dict[str, bytes]] = {}  # arrays being written: their documents

    def commit_sync(self, message: str) -> str | None:
        """Commit what the session holds (see Repository.commit_sync); None when it holds nothing."""
        return self.repository.commit_sync(message, self._staging_docs)

    def _writing(self, key: str) -> Any:
        """The writable session's store, for a key of the mounted version."""
        if self.read_only or key.startswith(SNAPSHOT_PREFIX):
            raise ReadOnly(f"{key}: this version of the repository is read-only")
        return self.repository.version.store

    def _write(self, key: str, change: Callable[[Any], Coroutine[Any, Any, Any]]) -> Any:
        """CHANGE(the session's store) run, never while a commit replaces the session: a change
        lands in the session the next commit takes."""
        with self.repository.commit_lock.writing():
            store = self._writing(key)
            return self._run(lambda: change(store))

    def stage_docs(self, staging: str, docs: dict[str, bytes]) -> None:
        """The documents of an array being written under STAGING: icechunk takes a chunk only
        for an array it knows, so they are stored before its first chunk."""
        self._staging_docs[staging] = docs

    def set_sync(self, key: str, value: bytes) -> None:
        """Store a value in the session (seen by this mount at once, by others after the commit)."""
        from zarr.core.buffer import cpu

        if key.startswith(LEASE_PREFIX):
            return  # uncommitted changes die with the daemon that made them: no staging outlives it
        self._writing(key)
        docs = next((d for prefix, d in self._staging_docs.items() if key.startswith(prefix + "/")), None)

        async def put(store: Any) -> None:
            if docs is not None:
                for doc_key, doc in docs.items():
                    await store.set(doc_key, cpu.Buffer.from_bytes(doc))
            await store.set(key, cpu.Buffer.from_bytes(bytes(value)))

        try:
            self._write(key, put)
        except self._error as e:
            raise self._failed(f"writing {key!r}", e) from None
        if docs is not None:
            self._staging_docs = {p: d for p, d in self._staging_docs.items() if d is not docs}

    def erase_sync(self, key: str) -> None:
        """Remove a key from the session; an absent key is not an error."""
        if key.startswith(LEASE_PREFIX):
            return

        async def delete(store: Any) -> None:
            try:
                await store.delete(key)
            except KeyError:  # no node holds it (a staged array none of whose chunks is stored yet)
                pass
            except self._error as e:
                if INVALID_KEY not in str(e):  # its node is gone already
                    raise

        try:
            self._write(key, delete)
        except self._error as e:
            raise self._failed(f"erasing {key!r}", e) from None

    def erase_below_sync(self, prefix: str) -> None:
        """Remove every key below a prefix (a staging area being dropped, a node removed)."""
        self._writing(prefix)
        self._staging_docs.pop(prefix, None)
        try:
            self._write(prefix, lambda store: store.delete_dir(prefix))
        except self._error as e:
            if BAD_PREFIX not in str(e):
                raise self._failed(f"removing {prefix!r}", e) from None

    def move_node_sync(self, src: str, dst: str, message: str) -> bool:
        """Move node SRC to DST as one commit of its own, no chunk copied (see
        Repository.move_node_sync); False when the caller must copy it instead."""
        return self.repository.move_node_sync(src, dst, message)

    def move_sync(self, src: str, dst: str) -> None:
        """Give key `src`'s value to `dst` and remove `src` (a copy: icechunk 1.x moves nothing)."""
        value = self._get(src, None)
        if value is None:
            raise StoreError(f"moving {src!r} to {dst!r}: {src!r} vanished")
        self.set_sync(dst, value)
        self.erase_sync(src)
