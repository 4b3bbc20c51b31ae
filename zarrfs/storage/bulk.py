"""Many keys of a remote store at once: listings below a prefix, server-side copies and bulk erases, concurrent on asynchronous file systems.

A copy runs in the store (S3 CopyObject, GCS rewrite): no byte of the value crosses the
network to the daemon. Functions here take fsspec paths and raise what the backend raised;
the Store names the key and the reason.
"""

from __future__ import annotations

import asyncio
from typing import Any

import fsspec
from fsspec.asyn import AsyncFileSystem

# Copies in flight at once: the connections the store's client keeps open (remote.POOL_CONNECTIONS).
COPIES_IN_FLIGHT = 64
# S3 copies a value of up to 5 GiB in one request; larger ones take a multipart copy.
SINGLE_COPY_MAX_BYTES = 5 << 30
# Keys S3 removes in one DeleteObjects request (s3fs batches them so).
BULK_ERASE_KEYS = 1000


class CopyFailed(Exception):
    """A copy of SOURCE failed (the backend's exception is the cause)."""

    def __init__(self, source: str) -> None:
        super().__init__(source)
        self.source = source


async def _copy_one(fs: AsyncFileSystem, src: str, dst: str, size: int | None) -> None:
    copy_basic = getattr(fs, "_copy_basic", None)  # s3fs: one CopyObject, no HEAD for the size first
    if copy_basic is not None and size is not None and size <= SINGLE_COPY_MAX_BYTES:
        await copy_basic(src, dst)
    else:
        await fs._cp_file(src, dst)


def copy_many(fs: fsspec.AbstractFileSystem, copies: list[tuple[str, str, int | None]]) -> None:
    """Copy each (source, destination, size or None) path in the store, many at once; raise
    CopyFailed for the first that failed (after every copy started has ended)."""
    if not isinstance(fs, AsyncFileSystem):
        for src, dst, _ in copies:
            try:
                fs.cp_file(src, dst)
            except Exception as e:
                raise CopyFailed(src) from e
        return

    async def gather() -> list[Any]:
        gate = asyncio.Semaphore(COPIES_IN_FLIGHT)

        async def one(src: str, dst: str, size: int | None) -> None:
            async with gate:
                await _copy_one(fs, src, dst, size)

        return await asyncio.gather(*(one(*c) for c in copies), return_exceptions=True)

    for (src, _, _), res in zip(copies, fsspec.asyn.sync(fs.loop, gather)):
        if isinstance(res, BaseException):
            raise CopyFailed(src) from res


def can_copy(fs: fsspec.AbstractFileSystem) -> bool:
    """Whether the file system copies a value itself (else it is read and written again)."""
    return isinstance(fs, AsyncFileSystem) or type(fs).cp_file is not fsspec.AbstractFileSystem.cp_file


def find_below(fs: fsspec.AbstractFileSystem, base: str) -> dict[str, dict[str, Any]]:
    """Every file below path BASE, with its details: one listing on S3 even below an empty prefix
    (s3fs's own `find` of an empty prefix asks twice more, for a file named BASE)."""
    parent, _, name = base.rstrip("/").rpartition("/")
    if parent and name and type(fs).__module__.startswith("s3fs"):
        return fs.find(parent, prefix=name + "/", detail=True, withdirs=False)
    return fs.find(base, detail=True, withdirs=False)


# Parts of one multipart upload sent at once: a chunk of a few hundred MiB goes up several parts
# at a time, while other chunks' uploads (16 at once) share the store's 64 connections.
PARTS_IN_FLIGHT = 8


def uploads_in_parts(fs: fsspec.AbstractFileSystem) -> bool:
    """Whether values can go to the file system as multipart uploads (s3fs: S3's)."""
    return type(fs).__module__.startswith("s3fs")


def upload_options(fs: fsspec.AbstractFileSystem, nbytes: int, part_bytes: int) -> tuple[dict[str, Any], int]:
    """The keyword arguments of `pipe_file` that store NBYTES as a multipart upload in parts of
    PART_BYTES where the file system makes those (s3fs: from twice the part size on, aborted
    when a part fails), and the requests that costs; one PUT elsewhere."""
    if not uploads_in_parts(fs) or nbytes < 2 * part_bytes:
        return {}, 1
    return {"chunksize": part_bytes, "max_concurrency": PARTS_IN_FLIGHT}, -(-nbytes // part_bytes) + 2


def erase_requests(fs: fsspec.AbstractFileSystem, nkeys: int) -> int:
    """The requests `erase_many` sends for NKEYS paths."""
    return -(-nkeys // BULK_ERASE_KEYS) if isinstance(fs, AsyncFileSystem) else nkeys


def erase_many(fs: fsspec.AbstractFileSystem, paths: list[str]) -> None:
    """Remove many paths: S3 deletes up to 1000 in one request; absent paths are no error."""
    if not paths:
        return
    if isinstance(fs, AsyncFileSystem):
        fsspec.asyn.sync(fs.loop, fs._rm, paths)
        return
    for path in paths:
        try:
            fs.rm_file(path)
        except (FileNotFoundError, IsADirectoryError):
            pass
