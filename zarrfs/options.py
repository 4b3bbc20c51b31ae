"""Mount options: parse `-o` strings and `--flags` into one frozen, validated Options value; no I/O."""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

from .errors import UserError

FORMATS = ("auto", "v1", "v2", "v3", "v3-draft")
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")

# Standard FUSE / mount(8) options that we pass through to libfuse (with a value) or accept
# and ignore because mount.fuse3 and /etc/fstab lines carry them.
FUSE_PASSTHROUGH_VALUE = ("uid", "gid", "umask", "fsname", "subtype")
FUSE_PASSTHROUGH_FLAG = ("allow_other", "allow_root", "default_permissions", "auto_unmount")
MOUNT_IGNORED = ("rw", "ro", "dev", "nodev", "suid", "nosuid", "exec", "noexec", "auto", "noauto",
                 "user", "nouser", "users", "_netdev", "nofail", "atime", "noatime", "relatime",
                 "async", "sync", "defaults")

_SIZE_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text: str) -> int:
    """Parse a byte size such as `512M`, `2G`, `1048576` or `1.5GiB`."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:I?B)?\s*", text, re.IGNORECASE)
    if not m:
        raise UserError(f"not a size: {text!r} (examples: 512M, 2G, 1048576)")
    return int(float(m.group(1)) * _SIZE_UNITS[m.group(2).upper()])


@dataclasses.dataclass(frozen=True)
class Options:
    """Everything a mount is configured with; see the README's option table."""

    writable: bool = False
    cache_size_bytes: int = 512 << 20
    format: str = "auto"
    storage_options: dict[str, Any] = dataclasses.field(default_factory=dict)
    show_views: bool = False
    chunks: tuple[int, ...] | None = None
    codec: str | None = None
    v1_order: str = "spec"
    log_level: str = "warning"
    log_file: str | None = None
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


def _need(name: str, value: str | None) -> str:
    if value is None or value == "":
        raise UserError(f"option {name} needs a value ({name}=...)")
    return value


def split_o(text: str) -> list[str]:
    """Split one `-o` argument at commas, keeping commas inside JSON braces or brackets."""
    items, depth, cur, quote = [], 0, [], False
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
        else:
            merged.append(item)
    for item in merged:
        name, sep, raw = item.partition("=")
        value = raw if sep else None
        name = name.strip().replace("-", "_") if name not in FUSE_PASSTHROUGH_FLAG else name
        if name == "writable":
            kw["writable"] = _flag(name, value)
        elif name == "cache_size":
            kw["cache_size_bytes"] = parse_size(_need(name, value))
        elif name == "format":
            fmt = _need(name, value)
            if fmt not in FORMATS:
                raise UserError(f"format={fmt}: expected one of {', '.join(FORMATS)}")
            kw["format"] = fmt
        elif name == "storage_options":
            try:
                so = json.loads(_need(name, value))
            except json.JSONDecodeError as e:
                raise UserError(f"storage_options is not valid JSON: {e.msg}") from None
            if not isinstance(so, dict):
                raise UserError("storage_options must be a JSON object")
            kw["storage_options"] = so
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
        elif name == "log_level":
            level = _need(name, value).lower()
            if level not in LOG_LEVELS:
                raise UserError(f"log_level={value}: expected one of {', '.join(LOG_LEVELS)}")
            kw["log_level"] = level
        elif name == "log_file":
            kw["log_file"] = _need(name, value)
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
        elif name in MOUNT_IGNORED:
            pass
        else:
            raise UserError(f"unknown option: {name}")
    kw["fuse_options"] = tuple(fuse)
    return Options(**kw)
