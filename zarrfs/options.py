"""Mount options: parse `-o` strings and `--flags` into one frozen, validated Options value; no I/O."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import stat
import urllib.parse
from typing import Any

from .errors import UserError
from .manual import AUTHORIZE, OPTION_NAMES

FORMATS = ("auto", "v1", "v2", "v3", "v3-draft", "icechunk")
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
URL_PREFIX = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")
# S3 refuses a multipart upload whose parts (all but the last) are smaller than this.
MIN_UPLOAD_PART_BYTES = 5 << 20

# Standard FUSE / mount(8) options that we pass through to libfuse (with a value) or accept
# and ignore because mount.fuse3 and /etc/fstab lines carry them.
FUSE_PASSTHROUGH_VALUE = ("uid", "gid", "umask", "subtype")
FUSE_PASSTHROUGH_FLAG = ("allow_other", "allow_root", "default_permissions", "auto_unmount")
MOUNT_IGNORED = (
    "rw",
    "dev",
    "nodev",
    "suid",
    "nosuid",
    "exec",
    "noexec",
    "auto",
    "noauto",
    "user",
    "nouser",
    "users",
    "_netdev",
    "nofail",
    "atime",
    "noatime",
    "relatime",
    "async",
    "sync",
    "defaults",
)


def redact_url(source: str) -> str:
    """SOURCE with any user name, password or token in URLs (chained with ::) removed."""
    parts = []
    for part in source.split("::"):
        try:
            u = urllib.parse.urlsplit(part)
        except ValueError:
            parts.append(part)
            continue
        if u.scheme and "@" in u.netloc:
            part = urllib.parse.urlunsplit(u._replace(netloc=u.netloc.rsplit("@", 1)[1]))
            u = urllib.parse.urlsplit(part)
        if u.scheme and u.query:
            query = [
                (k, "***" if _SECRET_KEY.search(k) else v)
                for k, v in urllib.parse.parse_qsl(u.query, keep_blank_values=True)
            ]
            part = urllib.parse.urlunsplit(u._replace(query=urllib.parse.urlencode(query, safe="*")))
        parts.append(part)
    return "::".join(parts)


# Keys of storage options (and URL query parameters) whose values are secrets: never logged.
_SECRET_KEY = re.compile(
    r"secret|password|passwd|token|key|credential|authorization|auth|sig|signature|session", re.IGNORECASE
)
_NOT_SECRET_KEYS = {"endpoint_url", "key_prefix", "signature_version"}
_AUTH_SCHEMES = {"bearer", "basic", "token", "digest", "negotiate"}


def secrets_in(storage_options: Any, source: str = "") -> set[str]:
    """The secret strings of a mount: values under secret-looking keys, header values, URL passwords."""
    found: set[str] = set()

    def walk(value: Any, secret: bool) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(
                    v,
                    secret
                    or (str(k) not in _NOT_SECRET_KEYS and bool(_SECRET_KEY.search(str(k))))
                    or str(k).lower() == "headers",
                )
        elif isinstance(value, (list, tuple)):
            for v in value:
                walk(v, secret)
        elif secret and isinstance(value, str) and len(value) >= 4:
            found.add(value)
            if " " in value:  # "Bearer TOKEN": the token alone too
                found.update(p for p in value.split() if len(p) >= 4 and p.lower() not in _AUTH_SCHEMES)

    walk(storage_options, False)
    for part in source.split("::"):
        try:
            u = urllib.parse.urlsplit(part)
            if u.password and len(u.password) >= 2:
                found.add(u.password)
                found.add(urllib.parse.quote(u.password, safe=""))
            for k, v in urllib.parse.parse_qsl(u.query):
                if _SECRET_KEY.search(k) and len(v) >= 4:
                    found.add(v)
        except ValueError:
            pass
    return found


def read_storage_options_file(path: str) -> dict[str, Any]:
    """A storage options JSON file; refused when others may read it (it holds credentials)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as e:
        raise UserError(f"storage_options_file={path}: {e.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise UserError(f"storage_options_file={path}: not a regular file")
        if st.st_mode & 0o077:
            raise UserError(
                f"storage_options_file={path}: readable or writable by others "
                f"(mode {stat.S_IMODE(st.st_mode):04o}); it holds credentials: chmod 600 {path}"
            )
        raw = f.read()
    try:
        value = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"storage_options_file={path} is not valid JSON: {getattr(e, 'msg', e)}") from None
    if not isinstance(value, dict):
        raise UserError(f"storage_options_file={path} must hold a JSON object")
    return value


_SIZE_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text: str) -> int:
    """Parse a byte size such as `512M`, `2G`, `1048576` or `1.5GiB`."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:I?B)?\s*", text, re.IGNORECASE)
    if not m:
        raise UserError(f"not a size: {text!r} (examples: 512M, 2G, 1048576)")
    return int(float(m.group(1)) * _SIZE_UNITS[m.group(2).upper()])


@dataclasses.dataclass(frozen=True)
class Options:
    """Everything a mount is configured with; see the option table in docs/CONFIGURATION.md."""

    writable: bool = False
    cache_size_bytes: int = 512 << 20
    format: str = "auto"
    storage_options: dict[str, Any] = dataclasses.field(default_factory=dict)
    show_views: bool = False
    chunks: tuple[int, ...] | None = None
    codec: str | None = None
    v1_order: str = "spec"
    ref: str | None = None  # Icechunk: a branch or tag (None: branch main)
    snapshot: str | None = None  # Icechunk: a snapshot ID
    # Icechunk: URL prefixes of the virtual chunk containers the mount may read from.
    authorize_virtual_chunk_access: tuple[str, ...] = ()
    timeout_s: float = 30.0
    upload_part_bytes: int = 50 << 20  # s3fs's own part size: values of 100 MiB or more go in parts
    cache_dir: str | None = None  # None: diskcache.default_cache_dir()
    # A few datasets' worth of encoded chunks on a workstation's disk, yet little of a laptop's.
    disk_cache_bytes: int = 4 << 30
    metadata_ttl_s: float | None = None  # None: the store kind's default (remote.default_metadata_ttl_s)
    log_level: str = "warning"
    log_file: str | None = None
    storage_options_file: str | None = None
    remote_protocol: str | None = None
    remote_options: dict[str, Any] | None = None
    fsname: str | None = None
    foreground: bool = False
    # Options handed to libfuse as they are (allow_other, uid=..., ...).
    fuse_options: tuple[str, ...] = ()


def _flag(name: str, value: str | None) -> bool:
    if value is None:
        return True
    low = value.lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise UserError(f"option {name} takes no value or a boolean, not {value!r}")


def _seconds(name: str, text: str, allow_zero: bool) -> float:
    try:
        seconds = float(text)
    except ValueError:
        raise UserError(f"{name}={text}: expected a number of seconds") from None
    if (
        seconds != seconds
        or seconds < 0
        or (seconds == 0 and not allow_zero)
        or (seconds == float("inf") and name == "timeout")
    ):
        raise UserError(
            f"{name}={text}: expected a {'non-negative' if allow_zero else 'positive'} "
            f"finite number of seconds" + (" or inf" if allow_zero else "")
        )
    return seconds


def _need(name: str, value: str | None) -> str:
    if value is None or value == "":
        raise UserError(f"option {name} needs a value ({name}=...)")
    return value


def split_o(text: str) -> list[str]:
    """Split one `-o` argument at commas, keeping commas inside JSON braces or brackets."""
    items: list[str] = []
    cur: list[str] = []
    depth, quote = 0, False
    for ch in text:
        if ch == '"':
            quote = not quote
        elif not quote and ch in "{[":
            depth += 1
        elif not quote and ch in "}]":
            depth -= 1
        if ch == "," and depth == 0 and not quote:
            items.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    items.append("".join(cur))
    return [i.strip() for i in items if i.strip()]


def build_options(items: list[str], foreground: bool = False) -> Options:
    """Build Options from `name` / `name=value` items (from -o and --name[=value])."""
    kw: dict[str, Any] = {"foreground": foreground}
    fuse: list[str] = []
    merged: list[str] = []
    for item in items:  # `-o chunks=8,5` arrives split at its comma: bare numbers join chunks=
        if merged and merged[-1].startswith("chunks=") and item.isdigit():
            merged[-1] += "," + item
        elif merged and merged[-1].startswith(f"{AUTHORIZE}=") and URL_PREFIX.match(item):
            merged[-1] += "," + item  # ... and URLs join the prefixes authorised
        else:
            merged.append(item)
    for item in merged:
        name, sep, raw = item.partition("=")
        value = raw if sep else None
        name = name.strip().replace("-", "_") if name not in FUSE_PASSTHROUGH_FLAG else name
        if name.startswith("x_") or name == "comment":
            continue  # fstab's x-systemd.automount, x-mount.mkdir, comment=...: for mount and systemd
        if name not in OPTION_NAMES and name not in MOUNT_IGNORED:
            raise UserError(f"unknown option: {name} (zarrfs --help lists them)")
        if name == "writable":
            kw["writable"] = _flag(name, value)
        elif name == "cache_size":
            kw["cache_size_bytes"] = parse_size(_need(name, value))
        elif name == "upload_part_size":
            kw["upload_part_bytes"] = parse_size(_need(name, value))
            if kw["upload_part_bytes"] < MIN_UPLOAD_PART_BYTES:
                raise UserError(f"upload_part_size={value}: S3 takes parts of 5M or more")
        elif name == "disk_cache_size":
            kw["disk_cache_bytes"] = parse_size(_need(name, value))
        elif name == "cache_dir":
            kw["cache_dir"] = os.path.abspath(os.path.expanduser(_need(name, value)))
        elif name == "format":
            fmt = _need(name, value)
            if fmt not in FORMATS:
                raise UserError(f"format={fmt}: expected one of {', '.join(FORMATS)}")
            kw["format"] = fmt
        elif name in ("storage_options", "remote_options"):
            try:
                so = json.loads(_need(name, value))
            except json.JSONDecodeError as e:
                raise UserError(f"{name} is not valid JSON: {e.msg}") from None
            if not isinstance(so, dict):
                raise UserError(f"{name} must be a JSON object")
            kw[name] = so
        elif name == "remote_protocol":
            protocol = _need(name, value)
            if not re.fullmatch(r"[a-z][a-z0-9+.-]*", protocol):
                raise UserError(f"remote_protocol={protocol}: expected a protocol name such as s3 or file")
            kw["remote_protocol"] = protocol
        elif name == "show_views":
            kw["show_views"] = _flag(name, value)
        elif name == "chunks":
            try:
                chunks = tuple(int(x) for x in _need(name, value).replace(":", ",").split(","))
            except ValueError:
                raise UserError(f"chunks={value}: expected N[,N...] positive integers") from None
            if not chunks or min(chunks) < 1:
                raise UserError(f"chunks={value}: expected N[,N...] positive integers")
            kw["chunks"] = chunks
        elif name == "codec":
            codec = _need(name, value)
            if not re.fullmatch(r"[A-Za-z0-9_.-]+(:-?\d+)?", codec):
                raise UserError(f"codec={codec}: expected NAME or NAME:LEVEL")
            kw["codec"] = codec
        elif name == "v1_order":
            v1_order = _need(name, value)
            if v1_order not in ("spec", "writer"):
                raise UserError(f"v1_order={v1_order}: expected spec or writer")
            kw["v1_order"] = v1_order
        elif name in ("ref", "snapshot"):
            kw[name] = _need(name, value)
        elif name == AUTHORIZE:
            prefixes = tuple(p.strip() for p in _need(name, value).split(",") if p.strip())
            bad = [p for p in prefixes if not URL_PREFIX.match(p)]
            if bad or not prefixes:
                raise UserError(f"{name}={value}: expected URL prefixes such as file:///data/ or s3://bucket/nc/")
            kw[name] = kw.get(name, ()) + prefixes
        elif name in ("timeout", "metadata_ttl"):
            kw[f"{name}_s"] = _seconds(name, _need(name, value), allow_zero=name == "metadata_ttl")
        elif name == "log_level":
            level = _need(name, value).lower()
            if level not in LOG_LEVELS:
                raise UserError(f"log_level={value}: expected one of {', '.join(LOG_LEVELS)}")
            kw["log_level"] = level
        elif name == "log_file":
            kw["log_file"] = _need(name, value)
        elif name == "storage_options_file":
            kw["storage_options_file"] = _need(name, value)
        elif name == "fsname":
            kw["fsname"] = _need(name, value)
        elif name in ("foreground", "f"):
            kw["foreground"] = _flag(name, value)
        elif name in FUSE_PASSTHROUGH_FLAG:
            fuse.append(name)
        elif name in FUSE_PASSTHROUGH_VALUE:
            v = _need(name, value)
            if name in ("uid", "gid") and not v.isdigit():
                raise UserError(f"{name}={v}: expected a number")
            if name == "umask" and not re.fullmatch(r"[0-7]{1,4}", v):
                raise UserError(f"umask={v}: expected an octal number")
            fuse.append(f"{name}={v}")
        elif name == "ro":
            fuse.append("ro")  # read-only for the kernel too (see OPTION_TABLE)
        elif name in MOUNT_IGNORED:
            pass
        else:
            raise UserError(f"unknown option: {name}")
    if "ro" in fuse and kw.get("writable"):
        raise UserError("ro and writable contradict each other: give one")
    kw["fuse_options"] = tuple(fuse)
    if "ref" in kw and "snapshot" in kw:
        raise UserError("ref= and snapshot= name two versions: give one of them")
    return Options(**kw)
