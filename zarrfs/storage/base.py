"""The store interface, declared once: what the formats, the engine, the tree and the daemon ask of a store."""

from __future__ import annotations

import abc
from typing import Any

from ..errors import ReadOnly, StoreError
from .requests import RequestCounts

# Metadata documents (and any key read without a bound of its own) larger than this are
# refused: the largest consolidated documents seen in practice are tens of MiB (about 1 KiB
# of JSON per array, hierarchies of tens of thousands of arrays); parsing costs several
# times a document's size, so this keeps a hostile one to about a GiB of memory.
METADATA_MAX_BYTES = 256 << 20

# (size, modification time in ns, etag) of a stored key, each None when the store does not tell.
Version = tuple[int | None, int | None, str | None]


class Upload(abc.ABC):
    """A value stored as it is written, in parts where the store takes them (S3's multipart
    upload): nothing of it is visible until `commit_sync`, and `abort_sync` leaves no part."""

    @abc.abstractmethod
    def write_sync(self, data: bytes) -> None:
        """Append bytes; a part goes to the store whenever a whole one is buffered."""

    @abc.abstractmethod
    def commit_sync(self) -> None:
        """Send what is left and make the value visible under its key."""

    @abc.abstractmethod
    def abort_sync(self) -> None:
        """Give up: the parts sent are dropped and the key keeps its previous value."""


class BaseStore(abc.ABC):
    """A key-value store of `/`-separated keys (as zarr-python's `abc.store.Store`).

    Every method is synchronous (ends in `_sync`): the engine calls them in worker threads.
    Implemented by `Store` (fsspec, with local fast paths), `DiskCachedStore` (a disk cache in
    front of a remote Store) and `IcechunkStore` (one snapshot of a repository); the contract
    they share is tested once for every kind (tests/support/store_contract.py).
    """

    source: str  # the URL or path it was opened from (as messages may show it, once redacted)
    root: str  # where its keys lie in its file system ("" when none does)
    is_local: bool  # keys are files under `root` (direct reads, renames, directory swaps)
    on_local_disk: bool  # reading a key again costs no network
    read_only: bool
    is_references: bool  # a reference set: byte ranges of other files
    ranges_ignored: bool  # a ranged read came back whole: callers read whole values
    requests: RequestCounts

    # --- reads ----------------------------------------------------------------------------

    @staticmethod
    def bounded(key: str, data: bytes, max_nbytes: int | None) -> bytes:
        """DATA, unless it is longer than MAX_NBYTES (a key holding more than it can legitimately take)."""
        if max_nbytes is not None and len(data) > max_nbytes:
            raise StoreError(f"{key!r} holds {len(data)} bytes, more than the {max_nbytes} it can legitimately take")
        return data

    @abc.abstractmethod
    def get_sync(self, key: str, max_nbytes: int | None = METADATA_MAX_BYTES, into: Any = None) -> Any:
        """The value of a key (bytes, or a view of INTO), or None when the key is absent;
        StoreError for a value larger than MAX_NBYTES or a store that fails."""

    @abc.abstractmethod
    def get_many_sync(self, keys: list[str], max_nbytes: int | None = METADATA_MAX_BYTES) -> dict[str, bytes | None]:
        """Several keys at once, each as `get_sync` reads it."""

    @abc.abstractmethod
    def size_sync(self, key: str) -> int | None:
        """The size of a key's value, or None when the key is absent."""

    @abc.abstractmethod
    def get_range_sync(self, key: str, start: int, end: int) -> bytes:
        """Bytes [start, end) of a key's value (fewer at its end)."""

    @abc.abstractmethod
    def get_ranges_sync(self, key: str, ranges: list[tuple[int, int]]) -> list[bytes]:
        """Several byte ranges of one key's value."""

    @abc.abstractmethod
    def get_prefix_sync(self, key: str, nbytes: int) -> bytes | None:
        """The first NBYTES bytes of a key's value (a shard index at its start), None when absent."""

    @abc.abstractmethod
    def get_suffix_sync(self, key: str, nbytes: int) -> bytes | None:
        """The last NBYTES bytes of a key's value (a shard index at its end), None when absent."""

    # --- listings -------------------------------------------------------------------------

    @abc.abstractmethod
    def list_dir_sync(self, prefix: str) -> tuple[dict[str, int | None], list[str]]:
        """Keys right under a prefix (names, with their sizes when known) and sub-prefixes."""

    @abc.abstractmethod
    def sizes_below_sync(self, prefix: str) -> dict[str, int | None]:
        """Every key below a prefix (recursively), relative to it, with its size when known."""

    @abc.abstractmethod
    def versions_below_sync(self, prefix: str) -> dict[str, Version]:
        """Every key below a prefix with its `Version` (one listing: what revalidation compares)."""

    # --- writes ---------------------------------------------------------------------------

    @abc.abstractmethod
    def set_sync(self, key: str, value: bytes) -> None:
        """Store a value; a failure leaves the previous value intact. A large value may go in
        parts where the store takes them (S3's multipart upload); a failure then leaves no part."""

    @abc.abstractmethod
    def put_stream_sync(self, key: str, source: Any, block_bytes: int = 1 << 20) -> None:
        """Store the bytes read from a file object, block by block."""

    @property
    def upload_parts(self) -> int | None:
        """The part size of `open_upload_sync`'s uploads; None where the store has none."""
        return None

    def open_upload_sync(self, key: str) -> Upload | None:
        """An upload of a value to KEY whose parts go as they are written, where the store has
        such uploads (`upload_parts`: S3); None elsewhere (then store it whole with `set_sync`)."""
        return None

    @abc.abstractmethod
    def erase_sync(self, key: str) -> None:
        """Remove a key; removing an absent key is not an error."""

    @abc.abstractmethod
    def erase_below_sync(self, prefix: str) -> None:
        """Remove every key below a prefix."""

    @abc.abstractmethod
    def move_sync(self, src: str, dst: str) -> None:
        """Give key SRC's value to DST and remove SRC."""

    def erase_many_sync(self, keys: list[str]) -> None:
        """Remove many keys (an object store: in bulk requests); absent keys are no error."""
        for key in keys:
            self.erase_sync(key)

    def move_many_sync(self, moves: dict[str, str], sizes: dict[str, int | None] | None = None) -> None:
        """Give each source key's value to its destination key, then remove the sources (an object
        store: copies it makes itself, then a bulk erase; SIZES: the sources' sizes where known)."""
        for src, dst in moves.items():
            self.move_sync(src, dst)

    def set_mtime_sync(self, key: str, mtime_ns: int) -> bool:
        """Give a key a modification time; False where the store cannot."""
        return False

    def is_dir_sync(self, prefix: str) -> bool:
        """Whether a prefix is a directory on disk (local stores)."""
        return False

    def swap_dirs_sync(self, staging: str, final: str) -> None:
        """Put directory STAGING at FINAL in one step (local stores)."""
        raise ReadOnly("directories are swapped on local stores only")

    # --- what a cache in front of the store is told ---------------------------------------

    def note_array(self, keys: Any) -> None:  # noqa: B027 (a hook: most stores keep nothing)
        """An array with these ChunkKeys is about to be read."""

    def refresh(self) -> None:  # noqa: B027 (a hook: most stores keep nothing)
        """Whatever was kept of the store is checked again before its next use."""

    def version_time(self, key: str, began: float) -> float:
        """When the value last read of KEY is known to have matched the store: when its read began."""
        return began

    # --- operations: start-up checks, counters, times, space ------------------------------

    @abc.abstractmethod
    def probe_sync(self, shown: str) -> None:
        """Return when the store's root can be read; else a UserError naming the cause."""

    @abc.abstractmethod
    def exists_sync(self) -> bool:
        """Whether the store's root exists at all."""

    @abc.abstractmethod
    def mtime_ns_sync(self, key: str) -> int | None:
        """Modification time of a key as the store reports it (ns since the epoch), or None."""

    def stored_bytes_sync(self) -> int | None:
        """Bytes of every key below the root, for statfs; None where that is not cheap."""
        return None

    def free_bytes_sync(self) -> int | None:
        """Space left where the store lives, or None."""
        return None

    @property
    def chunk_files(self) -> bool:
        """Whether `chunk_file` can tell where chunks lie as local files."""
        return False

    def chunk_file(self, key: str, load: bool = True) -> tuple[str, int, int | None] | None:
        """(path, offset, length: None to its end) of the local file holding KEY's bytes, if any."""
        return None

    def request_stats(self) -> dict[str, int]:
        """Requests sent to the backend since the mount (stats.json)."""
        return self.requests.stats()

    def disk_stats(self) -> dict[str, Any]:
        """Counters of a disk cache in front of the store: none here."""
        return {
            "disk_hits": 0,
            "disk_misses": 0,
            "disk_bytes": 0,
            "disk_max_bytes": 0,
            "disk_evictions": 0,
            "disk_errors": 0,
            "disk_cache_dir": None,
        }
