"""Exceptions of zarrfs, each carrying the errno the FUSE layer answers with."""

from __future__ import annotations

import errno
from typing import TypeVar

T = TypeVar("T")


class ZarrfsError(Exception):
    """Base class: a problem with a message and the errno a file operation reports."""

    errno: int = errno.EIO
    #: set once the failure was logged with the key it names (by the engine, which limits repeats)
    logged: bool = False
    #: set by a store that logged the failure itself, once for many keys failing for one cause:
    #: the engine counts it without a line of its own
    logged_by_store: bool = False


class UserError(ZarrfsError):
    """A problem the user can fix (bad option, missing source): one line, no traceback."""

    errno = errno.EINVAL


class NotFound(ZarrfsError):
    """A node, key or file that does not exist."""

    errno = errno.ENOENT


class StoreError(ZarrfsError):
    """A store operation failed (network, permissions, server error)."""

    errno = errno.EIO


class MetadataError(ZarrfsError):
    """A metadata document that cannot be parsed or does not follow its format."""

    errno = errno.EIO


class CorruptChunk(ZarrfsError):
    """An encoded chunk that does not decode to the expected shape and dtype."""

    errno = errno.EIO


class Unsupported(ZarrfsError):
    """Valid input that zarrfs does not handle (variable-size types, unknown codecs)."""

    errno = errno.EOPNOTSUPP


class UnknownCodec(ZarrfsError):
    """A codec that numcodecs does not know: the array's data cannot be decoded (EIO; docs/VIEWS.md: The tree)."""

    errno = errno.EIO


class ReadOnly(ZarrfsError):
    """A write to a read-only mount."""

    errno = errno.EROFS


class InvalidArgument(ZarrfsError):
    """A write that cannot be done as asked (bad NPY header, header change without truncation)."""

    errno = errno.EINVAL


class NotPermitted(ZarrfsError):
    """An operation the tree does not allow there (a non-.npy file, a view, a v1 store's second array)."""

    errno = errno.EPERM


class Exists(ZarrfsError):
    errno = errno.EEXIST


class NameTooLong(ZarrfsError):
    """A node name whose stored key component would exceed what file systems hold (255 bytes)."""

    errno = errno.ENAMETOOLONG


class NotEmpty(ZarrfsError):
    errno = errno.ENOTEMPTY


class NotADir(ZarrfsError):
    errno = errno.ENOTDIR


class IsADir(ZarrfsError):
    errno = errno.EISDIR


class TooBig(ZarrfsError):
    """A write past the end of an array's file (arrays do not grow)."""

    errno = errno.EFBIG


class NoSpace(ZarrfsError):
    """Room the mount sets aside is used up (ENOSPC)."""

    errno = errno.ENOSPC


class Incomplete(ZarrfsError):
    """A new array's file closed before all the data its NPY header declares arrived (nothing stored)."""

    errno = errno.EIO


class AccessDenied(ZarrfsError):
    """A write to a file that is never written (a generated file, a store key, a directory)."""

    errno = errno.EACCES


class Interrupted(ZarrfsError):
    """The process waiting for the request got a signal (FUSE interrupts, answered early)."""

    errno = errno.EINTR


class Stale(ZarrfsError):
    """A file of an array the store no longer holds as it was (replaced with another shape, data
    type or chunking, or removed): its open files fail; a path leading to it is looked up again."""

    errno = errno.ESTALE


class Conflict(ZarrfsError):
    """A change that another writer's overlapping commit kept from its branch (saved on another)."""

    errno = errno.EBUSY


def required(value: T | None, defect: str) -> T:
    """VALUE, which the caller's state guarantees is set (TypeError naming DEFECT if not: a defect)."""
    if value is None:
        raise TypeError(defect)
    return value
