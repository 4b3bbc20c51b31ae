"""Which data files a reference set may read: each target's URL made canonical, then checked against what the mount trusts.

A reference set is data someone else wrote, and it names the files the daemon opens. By
default a local reference file (or references given inline) may name any target: it is the
user's own, as trusted as the command line. A remote one may name object stores and web
servers only, never the local file system, a protocol that reaches it (sftp with the user's
keys, archives, caches, nested references) or a loopback or link-local address other than its
own server's (a cloud's metadata service): those need `authorize_virtual_chunk_access`
prefixes, the option Icechunk mounts use for their virtual chunks.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import socket
import urllib.parse
from dataclasses import dataclass
from typing import Any

import fsspec

from ..errors import StoreError, UserError
from ..manual import AUTHORIZE
from ..repeats import LogOnce
from .refspec import target_problem
from .remote import GCS_PROTOCOLS, HTTP_PROTOCOLS, S3_PROTOCOLS, protocol_of

log = logging.getLogger(__name__)

LOCAL_PROTOCOLS = ("file", "local")
# What a remote reference file may name without the option: object stores and web servers,
# reached through the network only, with the options the mount gives them.
NETWORK_PROTOCOLS = S3_PROTOCOLS + HTTP_PROTOCOLS + GCS_PROTOCOLS + ("abfs", "az", "adl")
# Host names that are this machine whatever the network says.
LOCAL_HOST_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost")


@dataclass(frozen=True)
class Target:
    """A data file as it is read: its file system's protocol, and the URL or path given to it."""

    protocol: str
    url: str


class Trust:
    """What one mount's reference set may read (see the module's docstring)."""

    def __init__(
        self,
        reference_url: str | None,
        authorized: tuple[str, ...],
        remote_protocol: str | None,
        reference_host: str | None = None,
    ) -> None:
        """REFERENCE_URL: where the reference file is (None: given inline, by the user); AUTHORIZED:
        the option's prefixes; REMOTE_PROTOCOL: the protocol of targets that name none;
        REFERENCE_HOST: the host serving a remote reference file (an object store's endpoint),
        when its URL does not say."""
        self.local_reference = reference_url is None or protocol_of(reference_url) in LOCAL_PROTOCOLS
        host = reference_host or (urllib.parse.urlsplit(reference_url).hostname if reference_url else None)
        # A reference file this machine serves may name what else it serves: no further reach.
        self.reference_here = not self.local_reference and internal_host(host)
        local = [p for p in authorized if protocol_of(p) in LOCAL_PROTOCOLS]
        for prefix in local:
            if not prefix.partition("://")[2].startswith("/"):
                raise UserError(f"{AUTHORIZE}={prefix}: a local prefix is an absolute path (file:///data/nc/)")
        # Local prefixes with their links resolved, as targets are: a link cannot lead out of one.
        self.authorized_paths = tuple(os.path.realpath(p.partition("://")[2] or "/") for p in local)
        self.authorized_urls = tuple(_canonical_url(p) for p in authorized if p not in local)
        self.remote_protocol = remote_protocol
        self._said = LogOnce()

    def target(self, url: str, key: str) -> Target:
        """The Target URL names, when the mount trusts it; else a StoreError (logged once per prefix)."""
        problem = target_problem(url, self.remote_protocol)
        if problem is not None:
            raise StoreError(f"reading {key!r}: {problem}")
        protocol, path = fsspec.core.split_protocol(url)
        protocol = (protocol or self.remote_protocol or "file").lower()
        if protocol in LOCAL_PROTOCOLS:
            if self.local_reference:
                return Target("file", path)
            real = os.path.realpath(path)  # `..` and symbolic links resolved: what would be opened
            if any(real == p or real.startswith(p.rstrip("/") + "/") for p in self.authorized_paths):
                return Target("file", real)
            raise self._refusal(url, key, f"file://{os.path.dirname(real).rstrip('/')}/")
        full = url if "://" in url else f"{protocol}://{path}"
        canonical = _canonical_url(full)
        if self.local_reference or (protocol in NETWORK_PROTOCOLS and not self._internal(canonical)):
            return Target(protocol, full)
        if not _dot_segments(canonical) and any(_under(canonical, p) for p in self.authorized_urls):
            return Target(protocol, full)
        parts = urllib.parse.urlsplit(canonical)
        raise self._refusal(url, key, f"{parts.scheme}://{parts.netloc}/")

    def _internal(self, url: str) -> bool:
        """Whether URL names this machine or its link (loopback, link-local), which a remote
        reference file may name only when this machine serves it too."""
        return (
            origin(url) is not None and not self.reference_here and internal_host(urllib.parse.urlsplit(url).hostname)
        )

    def _refusal(self, url: str, key: str, prefix: str) -> StoreError:
        """A target outside the trusted prefixes: one line per prefix (not per chunk), then EIO for each read."""
        where = "a remote reference file" if not self.local_reference else "the references"
        advice = f"{where} may not name data files under {prefix} (to trust them, mount with -o {AUTHORIZE}={prefix})"
        if self._said.first(prefix):
            log.warning("data files under %s are not read, first %s for %r: %s", prefix, url, key, advice)
        error = StoreError(f"reading {key!r}: data file {url} is not read: {advice}")
        error.logged = error.logged_by_store = True  # said above, once per prefix: only counted
        return error


def internal_host(host: str | None) -> bool:
    """Whether HOST is this machine or its link: localhost, loopback, link-local (a cloud's metadata service)."""
    host = (host or "").rstrip(".").lower()
    if not host:
        return False
    if host in LOCAL_HOST_NAMES or host.endswith(".localhost"):
        return True
    try:
        address: Any = ipaddress.ip_address(host)
    except ValueError:
        try:  # the forms a resolver still takes for IPv4: 127.1, 2130706433, 0x7f.1
            address = ipaddress.IPv4Address(socket.inet_aton(host))
        except OSError:
            return False
    mapped = getattr(address, "ipv4_mapped", None) or address
    return bool(mapped.is_loopback or mapped.is_link_local or mapped.is_unspecified)


def _canonical_url(url: str) -> str:
    """URL with its scheme and host in lower case (how they compare)."""
    parts = urllib.parse.urlsplit(url)
    return urllib.parse.urlunsplit((parts.scheme.lower(), parts.netloc.lower(), parts.path, parts.query, ""))


def _under(url: str, prefix: str) -> bool:
    """Whether URL is PREFIX, or lies below it (a prefix names a directory, `s3://b/nc` not `s3://b/nc2`)."""
    return url == prefix or url.startswith(prefix if prefix.endswith("/") else prefix + "/")


def _dot_segments(url: str) -> bool:
    """Whether URL's path has `.` or `..` segments (percent-encoded or not): a server may resolve them."""
    path = urllib.parse.unquote(urllib.parse.urlsplit(url).path)
    return any(segment in (".", "..") for segment in path.replace("\\", "/").split("/"))


def origin(url: str | None) -> str | None:
    """scheme://host:port of an http(s) URL, else None."""
    if not url or protocol_of(url) not in HTTP_PROTOCOLS:
        return None
    parts = urllib.parse.urlsplit(url)
    return f"{parts.scheme.lower()}://{parts.netloc.lower()}"
