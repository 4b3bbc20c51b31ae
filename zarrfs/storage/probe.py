"""The start-up check of a store's root: return when it can be read, else one line naming why not."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..errors import StoreError, UserError
from .failures import describe_failure


def probe_root_sync(
    fs: Any,
    root: str,
    list_root: Callable[[], tuple[dict[str, int | None], list[str]]],
    has_buckets: bool,
    shown: str,
) -> None:
    """Return when ROOT of file system FS can be read; else raise a UserError naming the cause
    (connection refused, name not resolved, timeout, bucket or path missing, access denied,
    credentials missing). LIST_ROOT lists the store's root; HAS_BUCKETS: the root's first part is
    a bucket (object stores); SHOWN is the source as messages may show it."""
    try:
        fs.info(root)
        return
    except FileNotFoundError:
        pass
    except Exception as e:
        raise UserError(f"{shown}: {describe_failure(e)}") from None
    try:
        files, dirs = list_root()
    except StoreError as e:
        raise UserError(f"{shown}: {describe_failure(e.__cause__ or e)}") from None
    if files or dirs:
        return
    bucket = root.split("/", 1)[0]
    if has_buckets and bucket and bucket != root:
        try:
            fs.info(bucket)
        except FileNotFoundError:
            raise UserError(f"{shown}: bucket {bucket!r} does not exist") from None
        except Exception as e:
            raise UserError(f"{shown}: {describe_failure(e)}") from None
    elif has_buckets and bucket == root:
        raise UserError(f"{shown}: bucket {bucket!r} does not exist or is empty")
    raise UserError(f"{shown}: no such file, directory or store")
