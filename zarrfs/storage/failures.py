"""Why a store could not be reached or read, in one phrase, from any fsspec backend's exception."""

from __future__ import annotations

import socket

from fsspec.implementations.reference import ReferenceNotReachable

from ..errors import ZarrfsError


def _chain(exc: BaseException | None) -> list[BaseException]:
    out, seen = [], set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        out.append(exc)
        exc = exc.__cause__ or exc.__context__
    return out


def describe_failure(exc: BaseException) -> str:
    """One phrase naming why a store could not be reached or read, from any backend's exception."""
    if isinstance(exc, ReferenceNotReachable) and exc.__cause__ is not None:
        # A reference set's data file failed: its own failure says why.
        target = exc.target[0] if isinstance(exc.target, (list, tuple)) and exc.target else exc.target
        return f"data file {target}: {describe_failure(exc.__cause__)}"
    chain = _chain(exc)
    # A failure described already (a StoreError of ours) is told by the backend's own exception,
    # so the reason is not said twice.
    exc = next((e for e in chain if not isinstance(e, ZarrfsError)), exc)
    text = " ".join(f"{type(e).__name__}: {e}" for e in chain)
    low = text.lower()
    names = {type(e).__name__ for e in chain}
    if any(isinstance(e, socket.gaierror) for e in chain) or any(
        s in low
        for s in (
            "name or service not known",
            "temporary failure in name resolution",
            "nodename nor servname",
            "no address associated",
            "name resolution",
            "could not resolve",
            "getaddrinfo",
        )
    ):
        return f"host name not resolved ({_short(exc)})"
    if (
        any(isinstance(e, ConnectionRefusedError) for e in chain)
        or "connection refused" in low
        or "connect call failed" in low
    ):
        return f"connection refused ({_short(exc)})"
    if "EndpointConnectionError" in names or "ClientConnectorError" in names or "could not connect" in low:
        return f"cannot connect ({_short(exc)})"
    if any(isinstance(e, TimeoutError) for e in chain) or "timeout" in low or "timed out" in low:
        return f"timed out ({_short(exc)})"
    if (
        "NoCredentialsError" in names
        or "DefaultCredentialsError" in names
        or "unable to locate credentials" in low
        or "partialcredentials" in low
    ):
        return (
            "no credentials found (give them by the backend's environment variables or profile, or "
            "storage_options_file)"
        )
    if any(s in low for s in ("invalidaccesskeyid", "signaturedoesnotmatch", "expiredtoken", "invalidtoken")):
        return f"credentials refused ({_short(exc)})"
    if any(isinstance(e, PermissionError) for e in chain) or any(
        s in low for s in ("accessdenied", "access denied", "forbidden", " 403", "401", "unauthorized")
    ):
        return f"access denied ({_short(exc)})"
    if "nosuchbucket" in low:
        return "bucket does not exist"
    return _short(exc)


def _short(exc: BaseException) -> str:
    message = " ".join(str(exc).split())
    if len(message) > 200:
        message = message[:200] + "..."
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__
