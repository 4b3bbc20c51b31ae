"""Remote stores as zarrfs meets them: the backend's own timeouts and retries, no hidden listing cache, TTL defaults.

Pure (no trio): the daemon applies `bounded_storage_options` before the store is opened;
the engine bounds each wait on top of it (a backend that ignores its own timeouts still
cannot hold a reader past `timeout`).
"""

from __future__ import annotations

import copy
import math
from typing import Any

# Protocols fsspec spells for the object stores and web servers that the options below configure.
S3_PROTOCOLS = ("s3", "s3a")
HTTP_PROTOCOLS = ("http", "https")
GCS_PROTOCOLS = ("gs", "gcs")
REMOTE_PROTOCOLS = S3_PROTOCOLS + HTTP_PROTOCOLS + GCS_PROTOCOLS + ("abfs", "az", "adl", "sftp", "ftp", "webdav")
# Connecting is one round trip: a store that takes longer than this to accept a connection is
# as good as down (a refused or unroutable address must give EIO in well under 10 s).
CONNECT_TIMEOUT_MAX_S = 5.0
# Attempts per request (the first included): one retry hides a dropped connection or a
# throttled request; more would multiply the wait a user sits through when the store is down.
ATTEMPTS = 2
# Remote listings and metadata documents are trusted this long before they are asked again:
# long enough that `ls -lR`, `find` and a program's open/stat/read sequence cost one listing,
# short enough that another client's new array shows up while the user is still looking.
REMOTE_METADATA_TTL_S = 10.0
# Connections kept open to an object store: the engine's 16 store threads, plus room for the
# concurrent document GETs of a directory listing.
POOL_CONNECTIONS = 64
# Connections at once to one web server, as a browser opens: past a small listen backlog, new
# connections wait for a SYN retransmit (docs/PERFORMANCE.md: Remote stores).
HTTP_CONNECTIONS = 6
# The packages optional backends need, by top-level module, and the zarrfs extra that brings each.
BACKEND_EXTRAS = {
    "aiohttp": "http",
    "requests": "http",
    "s3fs": "s3",
    "aiobotocore": "s3",
    "botocore": "s3",
    "gcsfs": "gcs",
    "pyarrow": "references",
    "pandas": "references",
    "jinja2": "references",
}
# The extras scripts/install.sh installs by default: its venv is made again with exactly the extras
# given, so the remedy names these beside the one missing.
SYSTEM_EXTRAS = ("http", "s3", "gcs")


def missing_backend(exc: BaseException | None) -> str | None:
    """What to install when EXC (or what caused it) is a missing module of an optional backend:
    one phrase naming the zarrfs extra; None for any other failure."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, ModuleNotFoundError) and exc.name:
            module = exc.name.split(".", 1)[0]
            extra = BACKEND_EXTRAS.get(module)
            if extra is not None:
                return f"module {module} is not installed: {install_hint(extra)}"
        exc = exc.__cause__ or exc.__context__
    return None


def install_hint(extra: str) -> str:
    """How to install a zarrfs extra, in a venv and in the system install."""
    extras = ",".join(dict.fromkeys((*SYSTEM_EXTRAS, extra)))
    return f"pip install 'zarrfs[{extra}]' (the system install: ZARRFS_EXTRAS={extras} scripts/install.sh)"


def protocol_of(source: str) -> str:
    """The fsspec protocol of SOURCE's outermost file system (`file` for a plain path)."""
    head = source.split("::", 1)[0]
    return head.split("://", 1)[0].lower() if "://" in head else "file"


def is_remote(source: str) -> bool:
    return protocol_of(source) in REMOTE_PROTOCOLS


def default_metadata_ttl_s(source: str, chosen: float | None) -> float:
    """The TTL of listings and metadata: the user's, else 10 s remote and never for local stores."""
    if chosen is not None:
        return chosen
    return REMOTE_METADATA_TTL_S if is_remote(source) else math.inf


def _per_attempt_s(timeout_s: float) -> float:
    return max(timeout_s / ATTEMPTS, 0.5)


def bounded_storage_options(source: str, storage_options: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    """Storage options with the backend's timeouts and retries set from `timeout` (what the user
    gave wins), and fsspec's listing cache off (zarrfs keeps its own, with a TTL)."""
    out = copy.deepcopy(storage_options)
    protocol = protocol_of(source)
    if protocol not in REMOTE_PROTOCOLS:
        return out
    attempt_s = _per_attempt_s(timeout_s)
    connect_s = min(CONNECT_TIMEOUT_MAX_S, attempt_s)
    if protocol in S3_PROTOCOLS:
        config = out.setdefault("config_kwargs", {})
        config.setdefault("connect_timeout", connect_s)
        config.setdefault("read_timeout", attempt_s)
        config.setdefault("retries", {"max_attempts": ATTEMPTS, "mode": "standard"})
        # botocore keeps 10 connections by default: fewer than the engine's store threads, and a
        # directory's documents are fetched all at once (one GET each) when there is no
        # consolidated metadata.
        config.setdefault("max_pool_connections", POOL_CONNECTIONS)
        # s3fs asks for an object's size (a HEAD) before each whole-object GET, to split large ones
        # into parallel parts; zarrfs already reads many chunks at once, so one GET per object.
        out.setdefault("max_concurrency", 1)
    elif protocol in HTTP_PROTOCOLS:
        import aiohttp

        client = out.setdefault("client_kwargs", {})
        client.setdefault("timeout", aiohttp.ClientTimeout(total=timeout_s, connect=connect_s, sock_read=attempt_s))
        out.setdefault("get_client", _http_client)
    elif protocol in GCS_PROTOCOLS:
        out.setdefault("requests_timeout", attempt_s)
    if protocol in S3_PROTOCOLS + HTTP_PROTOCOLS + GCS_PROTOCOLS:
        out.setdefault("use_listings_cache", False)
    return out


async def _http_client(**kwargs: Any) -> Any:
    """fsspec's HTTP session (made in its event loop), at most HTTP_CONNECTIONS to a server at once."""
    import aiohttp

    kwargs.setdefault("connector", aiohttp.TCPConnector(limit_per_host=HTTP_CONNECTIONS))
    return aiohttp.ClientSession(**kwargs)


def bound_retries(fs: Any) -> None:
    """Bound a file system's own retry loop (s3fs retries 5 times with up to 15 s waits, around
    botocore's retries: 54 s before a refused connection failed)."""
    if isinstance(getattr(type(fs), "retries", None), int):
        fs.retries = ATTEMPTS
