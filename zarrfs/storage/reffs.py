"""A reference set as a file system: fsspec's ReferenceFileSystem, each target read by its own protocol's file system, where the mount trusts it.

fsspec keeps one file system for the protocol of the first target it finds (a set mixing local
files and `https://` ones fails every https chunk); here each target's own URL picks its file
system, made when first needed with the mount's bounded waits. Every read asks the mount's
Trust first (reftrust.py). A server that answers a ranged read with the whole object has it
cut to the range asked for, and is named once in the log. Pure: no trio.
"""

from __future__ import annotations

import io
import logging
import os
import stat
import threading
from collections.abc import Callable
from typing import Any

import fsspec
from fsspec.implementations.asyn_wrapper import AsyncFileSystemWrapper
from fsspec.implementations.reference import ReferenceFileSystem, ReferenceNotReachable

from ..errors import StoreError, UserError, ZarrfsError
from .ranges import WholeAnswers
from .reftrust import LOCAL_PROTOCOLS, Target, Trust, origin
from .remote import bound_retries, bounded_storage_options, missing_backend

log = logging.getLogger(__name__)


class TargetFileSystems:
    """One file system per protocol of the data files, each made once, with the waits of `timeout`."""

    def __init__(self, options_for: Callable[[str, str | None], tuple[str, dict[str, Any]]], timeout_s: float) -> None:
        """OPTIONS_FOR(protocol, origin): the fsspec options of the file system of the targets of that
        protocol (on that http(s) origin, else None), and a name of them (one file system per name)."""
        self.options_for = options_for
        self.timeout_s = timeout_s
        self._made: dict[tuple[str, str], tuple[Any, Any]] = {}  # -> (file system, its async face)
        self._lock = threading.Lock()
        self._whole_answers = WholeAnswers()

    def make_sync(self, protocol: str, url_origin: str | None = None) -> tuple[Any, Any]:
        """(file system, the same with async methods) for PROTOCOL (targets on URL_ORIGIN); a
        UserError when it cannot be made."""
        scope, options = self.options_for(protocol, url_origin)
        with self._lock:
            made = self._made.get((protocol, scope))
            if made is not None:
                return made
            options = bounded_storage_options(f"{protocol}://", options, self.timeout_s)
            try:
                fs = fsspec.filesystem(protocol, skip_instance_cache=True, **options)
            except ImportError as e:
                raise UserError(f"data files on {protocol}://: {missing_backend(e) or e}") from None
            except (ValueError, TypeError) as e:
                raise UserError(f"data files on {protocol}://: cannot open their file system: {e}") from None
            bound_retries(fs)
            made = self._made[(protocol, scope)] = (fs, fs if fs.async_impl else AsyncFileSystemWrapper(fs))
            return made

    def _file_system(self, target: Target) -> tuple[Any, Any]:
        try:
            made = self.make_sync(target.protocol, origin(target.url))
        except UserError as e:
            raise StoreError(str(e)) from None
        if target.protocol in LOCAL_PROTOCOLS:
            try:
                mode = os.stat(target.url).st_mode
            except OSError:
                mode = stat.S_IFREG  # the read says why
            if not stat.S_ISREG(mode):  # a pipe would block the read, a device read whole never end
                raise StoreError(f"data file {target.url} is not a regular file")
        return made

    def read_sync(self, key: str, target: Target, start: int | None, end: int | None) -> bytes:
        """Bytes [start, end) of TARGET (all of it for None, None), for KEY."""
        fs, _ = self._file_system(target)
        try:
            data = fs.cat_file(target.url, start=start, end=end)
        except ZarrfsError:
            raise
        except Exception as e:
            raise ReferenceNotReachable(key, target.url) from e
        return self.asked(target, data, start, end)

    async def read(self, key: str, target: Target, start: int | None, end: int | None) -> bytes:
        """`read_sync` in fsspec's event loop."""
        _, afs = self._file_system(target)
        try:
            data = await afs._cat_file(target.url, start=start, end=end)
        except ZarrfsError:
            raise
        except Exception as e:
            raise ReferenceNotReachable(key, target.url) from e
        return self.asked(target, data, start, end)

    def asked(self, target: Target, data: bytes, start: int | None, end: int | None) -> bytes:
        """DATA cut to [start, end) when the server sent more (the whole object: it ignores Range)."""
        if start is None or end is None or len(data) <= end - start:
            return data
        if len(data) < end:  # neither the range nor the whole object
            raise StoreError(f"data file {target.url}: bytes {start}:{end} were answered with {len(data)} bytes")
        return self._whole_answers.cut(target.url, data, start, end)


class ReferenceSet(ReferenceFileSystem):
    """fsspec's reference file system over a table of references (refspec.py) or Parquet ones,
    reading each target through TARGETS where TRUST allows it."""

    def __init__(self, references: Any, trust: Trust, targets: TargetFileSystems, **kwargs: Any) -> None:
        super().__init__({}, fs={}, **kwargs)  # no file system made from the references: TARGETS makes them
        self.references = references
        self.trust = trust
        self.targets = targets

    def _part(self, path: str, start: int | None, end: int | None) -> bytes | tuple[Target, int | None, int | None]:
        """Inline bytes of PATH (cut to [start, end)), or its trusted target and byte range."""
        found, start1, end1 = self._cat_common(path, start=start, end=end)
        if isinstance(found, bytes):
            return found[start:end]
        if not isinstance(found, str) or not found:
            raise StoreError(f"reading {path!r}: its reference names no data file")
        return self.trust.target(found, path), start1, end1

    def cat_file(self, path: str, start: int | None = None, end: int | None = None, **kwargs: Any) -> bytes:
        part = self._part(self._strip_protocol(path), start, end)
        if isinstance(part, bytes):
            return part
        return self.targets.read_sync(path, *part)

    async def _cat_file(self, path: str, start: int | None = None, end: int | None = None, **kwargs: Any) -> bytes:
        part = self._part(self._strip_protocol(path), start, end)
        if isinstance(part, bytes):
            return part
        return await self.targets.read(path, *part)

    def cat(self, path: Any, recursive: bool = False, on_error: str = "raise", **kwargs: Any) -> Any:
        """Each path through `cat_file` (fsspec's batch would read targets without asking the Trust)."""
        if isinstance(path, str):
            return self.cat_file(path)
        return {p: self.cat_file(p) for p in path}

    def _open(self, path: str, mode: str = "rb", **kwargs: Any) -> Any:
        if mode != "rb":
            raise NotImplementedError("references are read only")
        return io.BytesIO(self.cat_file(path))

    def info(self, path: str, **kwargs: Any) -> dict[str, Any]:
        part = self.references.get(path)
        if isinstance(part, (list, tuple)) and len(part) == 1:  # a whole file: its size is the target's
            target = self.trust.target(part[0], path)
            fs, _ = self.targets.make_sync(target.protocol, origin(target.url))
            return {"name": path, "type": "file", "size": fs.size(target.url)}
        return super().info(path, **kwargs)

    async def _info(self, path: str, **kwargs: Any) -> dict[str, Any]:
        return self.info(path, **kwargs)
