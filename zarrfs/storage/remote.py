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
# A PUT of a smaller body sends it with its headers. botocore asks S3 first (`Expect:
# 100-continue`) for every PutObject, which costs each chunk written one round trip more; past
# this size the round trip is small beside the body that a refused request would have sent.
EXPECT_CONTINUE_MIN_BYTES = 16 << 20
# Storage options fsspec's own file system classes take (the rest of s3fs's own go to botocore).
FSSPEC_OPTIONS = frozenset({"use_listings_cache", "listings_expiry_time", "max_paths", "skip_instance_cache"})
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
        if "session" not in out:
            session = _s3_session(out)
            if session is not None:
                out["session"] = session
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


def _s3_session(options: dict[str, Any]) -> Any:
    """The botocore session s3fs would make from OPTIONS (the ones it does not name itself, such
    as `profile`), whose PutObject requests of less than EXPECT_CONTINUE_MIN_BYTES send their
    body without waiting for the server's `100 Continue`; None where s3fs or botocore is missing
    or would refuse those options (s3fs then says why, as without this)."""
    try:
        import inspect

        import aiobotocore.session
        import s3fs
    except ImportError:
        return None
    named = set(inspect.signature(s3fs.S3FileSystem.__init__).parameters) | FSSPEC_OPTIONS
    try:
        session = aiobotocore.session.AioSession(**{k: v for k, v in options.items() if k not in named})
    except TypeError:
        return None
    session.get_component("event_emitter").register_last("before-sign.s3.PutObject", _body_at_once)
    return session


def _body_at_once(request: Any, **kwargs: Any) -> None:
    """botocore's hook before a PutObject is signed: no `Expect: 100-continue` for a small body."""
    from botocore.utils import determine_content_length

    size = determine_content_length(request.body)
    if "Expect" in request.headers and size is not None and size < EXPECT_CONTINUE_MIN_BYTES:
        del request.headers["Expect"]


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
