"""What an fsspec info() or listing entry says of a key: its size, modification time, ETag."""

from __future__ import annotations

import datetime
import email.utils
from typing import Any

# A stored object's modification time is when its upload began, in whole seconds on S3, by the
# store's clock: a chunk is kept on the strength of its time only if it was written at least this
# long before the GET that read it began (an upload under way while we read, a second of rounding,
# clocks a little apart), else it is read again.
FETCH_MARGIN_S = 5.0


def size_of(info: dict[str, Any]) -> int | None:
    """The size in an fsspec info() dict as a Python int (Parquet references give numpy integers)."""
    size = info.get("size")
    return None if size is None else int(size)


def etag_of(info: dict[str, Any]) -> str | None:
    """What changes with every write of a key, where the listing tells it: S3's ETag, GCS's generation."""
    for field in ("ETag", "etag", "generation"):
        if info.get(field) is not None:
            return str(info[field])
    return None


def mtime_ns_of(info: dict[str, Any]) -> int | None:
    """The modification time in an fsspec info() dict: `mtime` (local, sftp), `LastModified` (s3),
    `updated` (gcs), `last_modified` (azure), `created` as a last resort; None if absent."""
    for field in ("mtime", "LastModified", "last_modified", "updated", "modified"):
        value = info.get(field)
        if value is None:
            continue
        if isinstance(value, (int, float)):
            return int(value * 1e9)
        if isinstance(value, datetime.datetime):
            if value.tzinfo is None:
                value = value.replace(tzinfo=datetime.UTC)
            return int(value.timestamp() * 1e9)
        if isinstance(value, str):
            try:
                parsed = datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
            except ValueError:
                try:
                    parsed = email.utils.parsedate_to_datetime(value)
                except (TypeError, ValueError):
                    continue
            if parsed.tzinfo is None:
                parsed = parsed.replace(tzinfo=datetime.UTC)
            return int(parsed.timestamp() * 1e9)
    return None
