"""The store: get, get many, set, erase, list a prefix, over any fsspec file system; key checks.

Every method is synchronous (ends in `_sync`): the engine calls them in worker threads.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import urllib.parse
from typing import Any

import fsspec
from fsspec.asyn import AsyncFileSystem
from fsspec.implementations.local import LocalFileSystem

from ..errors import StoreError, UserError, ZarrfsError
from . import bulk, local
from .base import METADATA_MAX_BYTES, BaseStore, Upload, Version
from .failures import describe_failure
from .fsinfo import etag_of, mtime_ns_of, size_of
from .keys import check_key, join
from .probe import probe_root_sync
from .ranges import WholeAnswers
from .remote import missing_backend
from .requests import RequestCounts
from .uploads import PartsUpload

log = logging.getLogger(__name__)


class Store(BaseStore):
    """A Zarr store rooted at an fsspec URL or local path; keys are `/`-separated strings."""

    upload_part_bytes = 50 << 20  # values of twice this go in parts where they can (option upload_part_size)

    def __init__(
        self, source: str, storage_options: dict[str, Any] | None = None, fs: fsspec.AbstractFileSystem | None = None
    ) -> None:
        """The store at SOURCE; or, given FS (a file system opened already), FS's keys from its
        root, SOURCE being only what messages call it."""
        self.source = source
        if fs is not None:
            self.fs, root = fs, ""
        else:
            try:
                # A fresh instance: fsspec's cached instances are not safe across fork().
                self.fs, root = fsspec.core.url_to_fs(source, skip_instance_cache=True, **(storage_options or {}))
            except ImportError as e:
                if missing_backend(e) is not None:
                    raise  # the caller names the extra to install
                raise UserError(f"cannot open {source}: {e}") from None
            except (ValueError, TypeError) as e:
                raise UserError(f"cannot open {source}: {e}") from None
        self.root = root.rstrip("/") if root not in ("/", "") else root
        self.is_local = isinstance(self.fs, LocalFileSystem)
        self.on_local_disk = self.is_local  # reading a key again costs no network
        # HTTP listings are links: names in them are percent-encoded.
        # fsspec spells a file system's protocol as a string, a tuple or (older backends) a list.
        protocol = self.fs.protocol
        protocols = {protocol} if isinstance(protocol, str) else set(protocol)
        self._quoted_names = bool({"http", "https"} & protocols)
        # fsspec's HTTP file system cannot write; a reference set (kerchunk, VirtualiZarr) describes
        # byte ranges of other files, and its file system would keep a write in memory only.
        self.is_references = "reference" in protocols
        self.read_only = self._quoted_names or self.is_references
        # Set once a ranged read came back whole (a server that ignores Range): reading
        # parts of an object then costs the whole object each time, so callers read whole.
        self.ranges_ignored = False
        self._whole_answers = WholeAnswers()
        self._inside = local.InsideRoot(self.root) if self.is_local else None
        self.requests = RequestCounts()

    def _below(self, base: str) -> str:
        """What the names a listing gives below BASE (a path, without a trailing `/`) start with:
        `BASE/`; nothing at a root fsspec spells `""` (the reference file system's names
        have no leading `/`)."""
        return base + "/" if base or self.root == "/" else ""

    def __repr__(self) -> str:
        return f"Store({self.source!r})"

    @property
    def chunk_files(self) -> bool:
        """Whether values may lie in files the engine reads itself (`chunk_file`): a local store's."""
        return self.is_local

    def chunk_file(self, key: str, load: bool = True) -> tuple[str, int, int | None] | None:
        """Where the value of KEY lies as a file: (path, offset, length; None: the whole file), or
        None when it does not (LOAD: see IcechunkStore.chunk_file)."""
        return (self.path(key), 0, None) if self.is_local else None

    def path(self, key: str) -> str:
        """The file system path of a key; never outside the store's root."""
        check_key(key)
        full = join(self.root, key) if self.root != "/" else "/" + key
        if not key:
            full = self.root
        if self._inside is not None:
            self._inside.check(key, full)
        return full

    def _read_local(
        self, key: str, start: int, end: int | None, max_nbytes: int | None = None, into: Any = None
    ) -> Any:
        """Bytes [start, end) of a local key, or None when it is absent (see local.read_file)."""
        return local.read_file(self.path(key), key, start, end, max_nbytes, into)

    def get_sync(self, key: str, max_nbytes: int | None = METADATA_MAX_BYTES, into: Any = None) -> Any:
        """The value of a key, or None when the key is absent.

        A value larger than `max_nbytes` is refused (StoreError): by default the bound of
        metadata documents; chunk reads pass what their codecs can produce, None means any
        size. Local stores check the size before reading; other backends, after. A local
        value that fits in INTO (a writable buffer) is read into it: INTO returned when it is
        exactly its size, else a view of its first bytes.
        """
        try:
            if self.is_local:
                data = self._read_local(key, 0, None, max_nbytes, into)
                self.requests.got(0 if data is None else len(data))
                return data
            data = self.fs.cat_file(self.path(key))
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            self.requests.got(0)
            return None
        except ZarrfsError:
            raise
        except Exception as e:  # any failure of any backend is a store error of this key
            raise StoreError(f"reading {key!r} failed: {describe_failure(e)}") from None
        self.requests.got(len(data))
        return self.bounded(key, data, max_nbytes)

    def get_many_sync(self, keys: list[str], max_nbytes: int | None = METADATA_MAX_BYTES) -> dict[str, bytes | None]:
        """Several keys at once (concurrently on asynchronous file systems), each bounded as in `get_sync`."""
        if not isinstance(self.fs, AsyncFileSystem) or len(keys) < 2:
            return {k: self.get_sync(k, max_nbytes) for k in keys}
        paths = [self.path(k) for k in keys]

        async def gather() -> list[Any]:
            return await asyncio.gather(*(self.fs._cat_file(p) for p in paths), return_exceptions=True)

        results = fsspec.asyn.sync(self.fs.loop, gather)
        self.requests.got(sum(len(r) for r in results if isinstance(r, bytes)), len(keys))
        out: dict[str, bytes | None] = {}
        for key, res in zip(keys, results):
            if isinstance(res, (FileNotFoundError, IsADirectoryError, NotADirectoryError)):
                out[key] = None
            elif isinstance(res, ZarrfsError):  # said by the store already (a refused reference)
                raise res
            elif isinstance(res, BaseException):
                raise StoreError(f"reading {key!r} failed: {describe_failure(res)}")
            else:
                out[key] = self.bounded(key, res, max_nbytes)
        return out

    def list_dir_sync(self, prefix: str) -> tuple[dict[str, int | None], list[str]]:
        """Keys (files, with their sizes when the backend tells) and sub-prefixes (dirs) under a prefix."""
        base = self.path(prefix).rstrip("/")
        self.requests.listed()
        try:
            entries = self.fs.ls(base + ("/" if not self.is_local else ""), detail=True)
        except (FileNotFoundError, NotADirectoryError):
            return {}, []
        except Exception as e:
            raise StoreError(f"listing {prefix or '/'!r} failed: {describe_failure(e)}") from None
        files: dict[str, int | None] = {}
        dirs: set[str] = set()
        below = self._below(base)
        for entry in entries:
            name = entry["name"].rstrip("/")
            if not name.startswith(below):
                continue
            leaf = name[len(below) :]
            if self._quoted_names:
                leaf = urllib.parse.unquote(leaf)
            if not leaf or "/" in leaf or leaf in (".", ".."):
                continue
            if entry.get("type") == "directory":
                dirs.add(leaf)
            else:
                files[leaf] = size_of(entry)
        return dict(sorted(files.items())), sorted(dirs)

    def sizes_below_sync(self, prefix: str) -> dict[str, int | None]:
        """Every key below a prefix (recursively), relative to it, with its size if known."""
        return {rel: size_of(info) for rel, info in self._infos_below_sync(prefix).items()}

    def versions_below_sync(self, prefix: str) -> dict[str, Version]:
        """Every key below a prefix (recursively), relative to it: (size, modification time in ns,
        ETag or generation) as far as one listing tells."""
        return {
            rel: (size_of(info), mtime_ns_of(info), etag_of(info))
            for rel, info in self._infos_below_sync(prefix).items()
        }

    def _infos_below_sync(self, prefix: str) -> dict[str, dict[str, Any]]:
        base = self.path(prefix).rstrip("/")
        self.requests.listed()
        try:
            found = bulk.find_below(self.fs, base)
        except (FileNotFoundError, NotADirectoryError):
            return {}
        except Exception as e:
            raise StoreError(f"listing below {prefix or '/'!r} failed: {describe_failure(e)}") from None
        out = {}
        below = self._below(base)
        for name, info in found.items():
            name = name.rstrip("/")
            if name.startswith(below) and name != base:
                rel = name[len(below) :]
                out[urllib.parse.unquote(rel) if self._quoted_names else rel] = info
        return out

    def size_sync(self, key: str) -> int | None:
        """Size of one key, or None when it is absent."""
        try:
            return int(self.fs.size(self.path(key)))
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None
        except ZarrfsError:
            raise
        except Exception as e:
            raise StoreError(f"size of {key!r} failed: {describe_failure(e)}") from None

    def get_range_sync(self, key: str, start: int, end: int) -> bytes:
        """Bytes [start, end) of a key (b"" past its end)."""
        try:
            if self.is_local:
                data = self._read_local(key, start, end)
                if data is None:
                    raise FileNotFoundError(key)
            else:
                data = self.fs.cat_file(self.path(key), start=start, end=end)
        except ZarrfsError:
            raise
        except Exception as e:
            raise StoreError(f"reading {key!r} [{start}:{end}] failed: {describe_failure(e)}") from None
        self.requests.got(len(data))
        # A server that ignores Range (python -m http.server) sends the whole object.
        return self._asked(data, start, end)

    def get_ranges_sync(self, key: str, ranges: list[tuple[int, int]]) -> list[bytes]:
        """Byte ranges [start, end) of one key, concurrently on asynchronous file systems (one
        round trip for all of them, not one each)."""
        if not isinstance(self.fs, AsyncFileSystem) or len(ranges) < 2:
            return [self.get_range_sync(key, start, end) for start, end in ranges]
        path = self.path(key)

        async def gather() -> list[Any]:
            return await asyncio.gather(
                *(self.fs._cat_file(path, start=a, end=b) for a, b in ranges), return_exceptions=True
            )

        results = fsspec.asyn.sync(self.fs.loop, gather)
        self.requests.got(sum(len(r) for r in results if isinstance(r, bytes)), len(ranges))
        out = []
        for (start, end), res in zip(ranges, results):
            if isinstance(res, BaseException):
                raise StoreError(f"reading {key!r} [{start}:{end}] failed: {describe_failure(res)}")
            out.append(self._asked(res, start, end))
        return out

    def _asked(self, data: bytes, start: int, end: int) -> bytes:
        """The bytes [start, end) of `data` a ranged read asked for, when the server sent more (all
        of it): callers then read whole values (`ranges_ignored`)."""
        part = self._whole_answers.cut(self.source, data, start, end)
        if len(part) < len(data):
            self.ranges_ignored = True
        return part

    def get_prefix_sync(self, key: str, nbytes: int) -> bytes | None:
        """The first `nbytes` bytes of a key (all of it when shorter), or None when the key is absent."""
        try:
            if self.is_local:
                data = self._read_local(key, 0, nbytes)
                self.requests.got(0 if data is None else len(data))
                return data
            data = self.fs.cat_file(self.path(key), start=0, end=nbytes)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            self.requests.got(0)
            return None
        except ZarrfsError:
            raise
        except Exception as e:
            raise StoreError(f"reading the first {nbytes} bytes of {key!r} failed: {describe_failure(e)}") from None
        self.requests.got(len(data))
        return self._asked(data, 0, nbytes)

    def get_suffix_sync(self, key: str, nbytes: int) -> bytes | None:
        """The last `nbytes` bytes of a key (all of it when shorter), or None when the key is absent.

        One request where the backend supports suffix ranges (local, memory, HTTP `bytes=-N`).
        """
        try:
            if self.is_local:
                data = self._read_local(key, -nbytes, None)
                self.requests.got(0 if data is None else len(data))
                return data
            data = self.fs.cat_file(self.path(key), start=-nbytes)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            self.requests.got(0)
            return None
        except ZarrfsError:
            raise
        except Exception as e:
            raise StoreError(f"reading the last {nbytes} bytes of {key!r} failed: {describe_failure(e)}") from None
        self.requests.got(len(data))
        return self._asked(data, len(data) - nbytes, len(data))

    # --- writes -------------------------------------------------------------------------

    def set_sync(self, key: str, value: bytes) -> None:
        """Store a value; a failure leaves the previous value intact.

        Local stores write a temporary file beside the key and rename it over the key,
        so a reader (or a crash) sees the old value or the new one, never a mix.
        """
        path = self.path(key)
        requests = 1
        try:
            if self.is_local:
                local.replace_file(path, id(value), lambda f: f.write(value))
            else:
                parts, requests = bulk.upload_options(self.fs, len(value), self.upload_part_bytes)
                self.fs.pipe_file(path, bytes(value), **parts)
        except ZarrfsError:
            raise
        except Exception as e:
            raise StoreError(f"writing {key!r} failed: {describe_failure(e)}") from None
        self.requests.put(len(value), requests)

    def put_stream_sync(self, key: str, source: Any, block_bytes: int = 1 << 20) -> None:
        """Store the bytes read from a file object, block by block (never whole in memory); like
        `set_sync`, a failure leaves the previous value intact on a local store."""
        path = self.path(key)
        written = 0

        def copy(f: Any) -> None:
            nonlocal written
            shutil.copyfileobj(source, f, block_bytes)
            written = f.tell()

        try:
            if self.is_local:
                local.replace_file(path, id(source), copy)
            else:
                with self.fs.open(path, "wb") as f:
                    copy(f)
        except ZarrfsError:
            raise
        except Exception as e:
            raise StoreError(f"writing {key!r} failed: {describe_failure(e)}") from None
        self.requests.put(written)

    @property
    def upload_parts(self) -> int | None:
        return self.upload_part_bytes if bulk.uploads_in_parts(self.fs) else None

    def open_upload_sync(self, key: str) -> Upload | None:
        if self.upload_parts is None:
            return None
        return PartsUpload(self.fs, self.path(key), key, self.upload_part_bytes, self.requests)

    def set_mtime_sync(self, key: str, mtime_ns: int) -> bool:
        """Give a key a modification time (local stores); False where the store cannot."""
        if not self.is_local:
            return False
        try:
            os.utime(self.path(key), ns=(mtime_ns, mtime_ns))
        except OSError as e:
            log.info("setting the time of %s: %s", key, e)
            return False
        return True

    def erase_sync(self, key: str) -> None:
        """Remove a key; removing an absent key is not an error."""
        self.requests.deleted()
        try:
            self.fs.rm_file(self.path(key))
        except (FileNotFoundError, IsADirectoryError):
            pass
        except ZarrfsError:
            raise
        except Exception as e:
            raise StoreError(f"erasing {key!r} failed: {describe_failure(e)}") from None
        if self.is_local:
            local.prune_empty_dirs(self.root, key)

    def erase_below_sync(self, prefix: str) -> None:
        """Remove every key below a prefix (a staging area being dropped)."""
        if self.is_local:
            try:
                shutil.rmtree(self.path(prefix))
            except FileNotFoundError:
                pass
            except OSError as e:
                raise StoreError(f"removing {prefix!r} failed: {e}") from None
            local.prune_empty_dirs(self.root, prefix)
            return
        self.erase_many_sync([join(prefix, rel) for rel in self.sizes_below_sync(prefix)])

    def erase_many_sync(self, keys: list[str]) -> None:
        """Remove many keys (S3: up to 1000 in one request); absent keys are no error."""
        if self.is_local or not keys:
            for key in keys:
                self.erase_sync(key)
            return
        self.requests.deleted(bulk.erase_requests(self.fs, len(keys)))
        try:
            bulk.erase_many(self.fs, [self.path(k) for k in keys])
        except Exception as e:
            raise StoreError(f"erasing {keys[0]!r} and {len(keys) - 1} more failed: {describe_failure(e)}") from None

    def move_sync(self, src: str, dst: str) -> None:
        """Give key `src`'s value to `dst` and remove `src` (local: one rename; else copy, then erase)."""
        try:
            if self.is_local:
                target = self.path(dst)
                os.makedirs(os.path.dirname(target), exist_ok=True)
                os.replace(self.path(src), target)
                local.prune_empty_dirs(self.root, src)
                return
        except ZarrfsError:
            raise
        except Exception as e:
            raise StoreError(f"moving {src!r} to {dst!r} failed: {describe_failure(e)}") from None
        value = self.get_sync(src)
        if value is None:
            raise StoreError(f"moving {src!r} to {dst!r}: {src!r} vanished")
        self.set_sync(dst, value)
        self.erase_sync(src)

    def move_many_sync(self, moves: dict[str, str], sizes: dict[str, int | None] | None = None) -> None:
        """Give each source key's value to its destination key, then remove the sources: renames on
        a local store; elsewhere copies the store makes itself, many at once (SIZES: the sources'
        sizes where known), then one bulk erase. A failure leaves every source in place."""
        if self.is_local or not bulk.can_copy(self.fs):
            for src, dst in moves.items():
                self.move_sync(src, dst)
            return
        keys = {self.path(src): src for src in moves}
        self.requests.put(0, len(keys))  # a copy is a PUT naming its source
        try:
            bulk.copy_many(
                self.fs, [(path, self.path(moves[src]), (sizes or {}).get(src)) for path, src in keys.items()]
            )
        except bulk.CopyFailed as e:
            raise StoreError(f"copying {keys[e.source]!r} failed: {describe_failure(e.__cause__ or e)}") from None
        self.erase_many_sync(list(moves))

    def is_dir_sync(self, prefix: str) -> bool:
        """Local stores: whether a prefix is a directory on disk."""
        return self.is_local and os.path.isdir(self.path(prefix))

    def swap_dirs_sync(self, staging: str, final: str) -> None:
        """Local stores: put directory `staging` at `final` in one step; the old `final` (if any)
        ends up at `staging`. Without renameat2's exchange, two renames (a moment with no `final`)."""
        try:
            local.swap_dirs(self.path(staging), self.path(final))
        except OSError as e:
            raise StoreError(f"swapping {staging!r} into {final!r} failed: {e}") from None

    def exists_sync(self) -> bool:
        """Whether the store's root exists at all (for a clear error at mount time)."""
        try:
            return bool(self.fs.exists(self.root)) or bool(self.list_dir_sync("")[0])
        except Exception:
            return False

    # --- operations: start-up checks, times, space (the daemon and fuse_ops use these) ----

    def probe_sync(self, shown: str) -> None:
        """Return when the store's root can be read; else a UserError naming the cause (probe.py)."""
        has_buckets = not self.is_local and not self._quoted_names
        probe_root_sync(self.fs, self.root, lambda: self.list_dir_sync(""), has_buckets, shown)

    def mtime_ns_sync(self, key: str) -> int | None:
        """Modification time of a key as the store reports it (ns since the epoch), or None."""
        if self.is_local:
            try:
                return os.stat(self.path(key)).st_mtime_ns
            except (OSError, ZarrfsError):
                return None
        try:
            info = self.fs.info(self.path(key))
        except Exception:
            return None
        return mtime_ns_of(info)

    def stored_bytes_sync(self) -> int | None:
        """Bytes of every key below the root, for statfs; None where that is not cheap (remote stores)."""
        return local.tree_bytes(self.root) if self.is_local else None

    def free_bytes_sync(self) -> int | None:
        """Space left where a local store lives (statfs of its file system), else None."""
        return local.free_bytes(self.root) if self.is_local else None
