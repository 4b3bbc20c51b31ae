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

FORMATS = ("auto", "v1", "v2", "v3", "v3-draft", "icechunk")
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
# Icechunk's own name for the virtual chunk containers a repository's reader trusts.
AUTHORIZE = "authorize_virtual_chunk_access"
URL_PREFIX = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")

# Standard FUSE / mount(8) options that we pass through to libfuse (with a value) or accept
# and ignore because mount.fuse3 and /etc/fstab lines carry them.
FUSE_PASSTHROUGH_VALUE = ("uid", "gid", "umask", "subtype")
FUSE_PASSTHROUGH_FLAG = ("allow_other", "allow_root", "default_permissions", "auto_unmount")
MOUNT_IGNORED = ("rw", "dev", "nodev", "suid", "nosuid", "exec", "noexec", "auto", "noauto",
                 "user", "nouser", "users", "_netdev", "nofail", "atime", "noatime", "relatime",
                 "async", "sync", "defaults")



@dataclasses.dataclass(frozen=True)
class OptionDoc:
    """One row of the option table that `--help`, docs/CONFIGURATION.md and zarrfs.1 are generated from."""

    spelling: str  # as a user writes it: `cache_size=SIZE`
    meaning: str
    default: str

    @property
    def name(self) -> str:
        return self.spelling.split("=", 1)[0]


# The one table of options: `zarrfs --help`, the option table of docs/CONFIGURATION.md
# (tests/unit/test_options.py checks it is the generated text) and `zarrfs --man` are all made from it, and build_options
# refuses a name that is not in it, so an option cannot exist undocumented.
OPTION_TABLE: tuple[OptionDoc, ...] = (
    OptionDoc("writable", "allow writes (docs/SEMANTICS.md: Writes); refused for read-only stores such as HTTP; on an "
              "Icechunk branch each operation is one commit (docs/SEMANTICS.md: Icechunk repositories)", "off"),
    OptionDoc("ro", "read-only for the kernel too: `mount` and statvfs say `ro` and every write call gets "
              "EROFS from the kernel, for every user; without it a read-only mount refuses writes itself "
              "and lets GDAL save statistics beside its views (docs/SEMANTICS.md: Writes)", "off"),
    OptionDoc("cache_size=SIZE", "budget of the decoded-chunk cache (`512M`, `2G`): a larger one keeps more chunks decoded "
              "and allows a larger read-ahead window, in the daemon's memory; chunks larger than the "
              "budget are decoded only as far as each read needs, or kept apart (docs/CONFIGURATION.md: Memory)", "`512M`"),
    OptionDoc("format=auto|v1|v2|v3|v3-draft|icechunk", "skip detection", "`auto`"),
    OptionDoc("ref=NAME", "Icechunk: the branch or tag to mount; a branch mount follows the branch's newest "
              "snapshot (docs/SEMANTICS.md: Icechunk repositories)", "branch `main`"),
    OptionDoc("snapshot=ID", "Icechunk: the snapshot to mount, by its ID", "none"),
    OptionDoc("authorize_virtual_chunk_access=PREFIX[,PREFIX...]", "Icechunk: the virtual chunk containers "
              "(URL prefixes as the repository's config names them, `file:///data/nc/`, `s3://bucket/nc/`) "
              "whose files virtual chunks may be read from (docs/SEMANTICS.md: Icechunk repositories)",
              "none: virtual chunks read as EIO"),
    OptionDoc("v1_order=spec|writer", "how v1 `order: F` chunks are laid out: `spec` as the v1 specification "
              "says (F order); `writer` as zarr 1.1.0, the one real v1 writer, stored them (F order only with "
              "blosc, C order with every other compressor). Use `writer` for stores that writer made", "`spec`"),
    OptionDoc("storage_options=JSON", "keyword arguments for the fsspec file system (`endpoint_url`, `anon`, "
              "credentials). Visible to every user in `ps` and `/proc/PID/cmdline`, and in fstab: give "
              "credentials with `storage_options_file` or the backend's environment instead", "none"),
    OptionDoc("storage_options_file=PATH", "the same as a JSON file; refused when group or others may read it "
              "(`chmod 600`). Under systemd a credential named `storage_options.json` (`LoadCredential=`) is "
              "used when this is not given. Merged under `storage_options`", "none"),
    OptionDoc("remote_protocol=NAME", "references (docs/REMOTE.md: References): the protocol of the data files they point "
              "to (`s3`, `file`, ...)", "the protocol of the first data file's URL"),
    OptionDoc("remote_options=JSON", "references: keyword arguments for the data files' fsspec file system "
              "(`endpoint_url`, `anon`); as visible as `storage_options`",
              "`storage_options` when the data files are on the reference file's protocol, else none"),
    OptionDoc("timeout=SECONDS", "longest wait on the store for one operation (a chunk, a listing, a "
              "metadata document), retries included; then the caller gets EIO and the log says why "
              "(docs/REMOTE.md: Remote stores)", "`30`"),
    OptionDoc("metadata_ttl=SECONDS", "how long listings, metadata documents and the validity of cached "
              "chunks are trusted before they are checked against the store again; `0` checks every time, "
              "`inf` never (`cat MOUNT/.zarrfs/refresh`, or `touch` on a writable mount, drops them at once); "
              "a longer one costs fewer requests and shows other writers' changes later (docs/REMOTE.md: "
              "Remote stores)",
              "`10` for remote stores and Icechunk branches, `inf` for local directories"),
    OptionDoc("cache_dir=PATH", "where the disk cache of remote stores lives (docs/REMOTE.md: Disk cache); created mode "
              "`0700`, its files `0600`; shared by every mount and process of the user",
              "`$XDG_CACHE_HOME/zarrfs` when XDG_CACHE_HOME is set, else `/var/cache/zarrfs` for root, "
              "`~/.cache/zarrfs` for other users"),
    OptionDoc("disk_cache_size=SIZE", "most bytes the disk cache holds (`4G`, `500M`); least recently used "
              "entries go first; `0` turns it off (do so for confidential data: entries outlive the mount). Local "
              "stores are never cached", "`4G`"),
    OptionDoc("show_views", "list `.zarrfs` in the root directory (it is always reachable by path, like ZFS's "
              "`.zfs`, so `cp -r MOUNT` copies only the `.npy` tree)", "off"),
    OptionDoc("chunks=N[,N...]", "chunk shape of arrays created through the mount (with writes)",
              "format's usual"),
    OptionDoc("codec=NAME[:LEVEL]", "compressor of arrays created through the mount (with writes)",
              "format's usual"),
    OptionDoc("log_level=LEVEL", "`debug`, `info`, `warning`, `error`, `critical`; `kill -USR1 PID` switches "
              "debug on and off while mounted", "`warning`"),
    OptionDoc("log_file=PATH", "where the log goes (a file that cannot be opened is an error at start)",
              "stderr with `-f` or under systemd; syslog when daemonized and `/dev/log` exists; else "
              "`/var/log/zarrfs.log` (root) or `~/.local/state/zarrfs/zarrfs.log`"),
    OptionDoc("fsname=NAME", "the source `mount`, `df` and `/proc/mounts` show", "SOURCE without credentials"),
    OptionDoc("allow_other", "let other users than the mounting one use the mount (FUSE; non-root users need "
              "`user_allow_other` in `/etc/fuse.conf`)", "off"),
    OptionDoc("allow_root", "let root use the mount too (FUSE)", "off"),
    OptionDoc("default_permissions", "the kernel checks modes against `uid`/`gid`/`umask` (FUSE)", "on"),
    OptionDoc("auto_unmount", "unmount when the daemon dies, even by `kill -9` (FUSE, through a `fusermount3` "
              "helper process that must be left running)", "off"),
    OptionDoc("uid=N", "owner the files show", "the mounting user"),
    OptionDoc("gid=N", "group the files show", "the mounting user's group"),
    OptionDoc("umask=OCTAL", "mode bits taken away from the files' modes (`0444`/`0555`, `0644`/`0755` when "
              "writable)", "`0`"),
    OptionDoc("subtype=NAME", "the type `mount` shows after `fuse.`", "`zarrfs`"),
)
OPTION_NAMES = frozenset(o.name for o in OPTION_TABLE) | {"foreground", "f"}


# The tree of a mount, short, for `zarrfs --help` and zarrfs(1); docs/VIEWS.md says more.
TREE = """\
MOUNT/
  GROUP/                a group
    ARRAY.npy           an array: NPY header, elements in C order
  .zarrfs/              views (listed with show_views, reachable always)
    npy-f/PATH.npy      the array as a Fortran-order NPY file
    raw/PATH.raw        element bytes in C order, no header
    raw/PATH.hdr        its ENVI header: GDAL and ENVI open PATH.raw
    raw/PATH.raw.aux.xml  statistics GDAL saved (gdalinfo -stats)
    raw-f/PATH.raw      element bytes in Fortran order, no header
    chunks/PATH/I.J.npy one decoded chunk per grid position
    store/KEY           the store's own keys, byte for byte
    info/PATH.json      shape, dtype, chunks, codecs, attributes
    netcdf/PATH.nc      a group as a netCDF classic file
    slice/PATH[SEL].npy a numpy selection (looked up, never listed)
    tiff/PATH.tif       arrays of 2+ dimensions as (multi-page) TIFF
    gdal/PATH.vrt       GDAL VRT over the .npy (2-D and 3-D arrays)
    preview/PATH.png    a small grey picture
    stats.json          counters since mount
    refresh             cat or touch it: drop cached listings, metadata
    versions/           Icechunk: branches/NAME/, tags/NAME/, snapshots/ID/, log.json
PATH: a node's path in the hierarchy; a root array is MOUNT/NAME.npy."""


# How the help texts cite the documentation: `(docs/FILE.md: Heading)`.
DOC_CITATION = re.compile(r"\(docs/([A-Z]+\.md): ([^()]+)\)")


def heading_anchor(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading (its first one of that text)."""
    return re.sub(r"[^\w\- ]", "", heading.replace("`", "").strip().lower()).replace(" ", "-")


def options_markdown() -> str:
    """The option table of docs/CONFIGURATION.md, its citations of docs/ made links."""
    def link(m: re.Match) -> str:
        return f"([{m.group(1)}: {m.group(2)}]({m.group(1)}#{heading_anchor(m.group(2))}))"

    rows = ["| option | meaning | default |", "|---|---|---|"]
    for o in OPTION_TABLE:
        meaning = DOC_CITATION.sub(link, o.meaning)
        rows.append(f"| `{o.spelling.replace('|', chr(92) + '|')}` | {meaning} | {o.default} |")
    return "\n".join(rows) + "\n"


def _plain(text: str) -> str:
    return text.replace("`", "")


def options_help() -> str:
    """The option list of `zarrfs --help`."""
    import textwrap

    out = []
    for o in OPTION_TABLE:
        out.append(f"  {o.spelling}")
        body = f"{_plain(o.meaning)} (default: {_plain(o.default)})"
        out.extend(textwrap.wrap(body, 90, initial_indent=" " * 6, subsequent_indent=" " * 6))
    return "\n".join(out)


def _roff(text: str) -> str:
    text = text.replace("\\", "\\e").replace("-", "\\-")
    text = re.sub(r"`([^`]*)`", r"\\fB\1\\fR", text)
    return "\n".join(("\\&" + ln) if ln.startswith((".", "'")) else ln for ln in text.splitlines())


def options_man(version: str) -> str:
    """The zarrfs(1) manual page, in roff."""
    lines = [f'.TH ZARRFS 1 "" "zarrfs {version}" "User Commands"', ".SH NAME",
             "zarrfs \\- mount a Zarr hierarchy as a file system of .npy files", ".SH SYNOPSIS",
             ".B zarrfs", "SOURCE MOUNTPOINT [\\-f] [\\-o OPTION[,OPTION...]] [\\-\\-OPTION[=VALUE] ...]",
             ".br", ".B mount \\-t fuse.zarrfs", "SOURCE MOUNTPOINT \\-o OPTIONS", ".SH DESCRIPTION",
             _roff("Groups of the Zarr hierarchy at SOURCE (a local directory or an fsspec URL) become "
                   "directories; arrays become `.npy` files. Without `-f` the command returns once the mount "
                   "is live. Unmount with `fusermount3 -u MOUNTPOINT` or `umount`."),
             ".SH FILES", _roff("The tree of a mount (docs/VIEWS.md: The tree):"), ".PP", ".nf",
             *_roff(TREE).splitlines(), ".fi",
             ".SH OPTIONS", "Every option is given as \\fB\\-o name[=value]\\fR or \\fB\\-\\-name[=value]\\fR.",
             ".TP", ".B \\-f", "stay in the foreground (under systemd: Type=notify readiness)"]
    for o in OPTION_TABLE:
        lines += [".TP", f".B {_roff(o.spelling)}", _roff(f"{o.meaning} (default: {o.default})")]
    lines += [".SH SIGNALS", _roff("SIGINT, SIGTERM: store pending writes and unmount. "
                                   "SIGUSR1: switch debug logging on or off."),
              ".SH SEE ALSO", "fusermount3(1), mount.fuse3(8), fstab(5), systemd.mount(5)"]
    return "\n".join(lines) + "\n"


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
            query = [(k, "***" if _SECRET_KEY.search(k) else v)
                     for k, v in urllib.parse.parse_qsl(u.query, keep_blank_values=True)]
            part = urllib.parse.urlunsplit(u._replace(query=urllib.parse.urlencode(query, safe="*")))
        parts.append(part)
    return "::".join(parts)


# Keys of storage options (and URL query parameters) whose values are secrets: never logged.
_SECRET_KEY = re.compile(r"secret|password|passwd|token|key|credential|authorization|auth|sig|signature|session",
                         re.IGNORECASE)
_NOT_SECRET_KEYS = {"endpoint_url", "key_prefix", "signature_version"}
_AUTH_SCHEMES = {"bearer", "basic", "token", "digest", "negotiate"}


def secrets_in(storage_options: Any, source: str = "") -> set[str]:
    """The secret strings of a mount: values under secret-looking keys, header values, URL passwords."""
    found: set[str] = set()

    def walk(value: Any, secret: bool) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(v, secret or (str(k) not in _NOT_SECRET_KEYS and bool(_SECRET_KEY.search(str(k))))
                     or str(k).lower() == "headers")
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
            raise UserError(f"storage_options_file={path}: readable or writable by others "
                            f"(mode {stat.S_IMODE(st.st_mode):04o}); it holds credentials: chmod 600 {path}")
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
    if seconds != seconds or seconds < 0 or (seconds == 0 and not allow_zero) or (
            seconds == float("inf") and name == "timeout"):
        raise UserError(f"{name}={text}: expected a {'non-negative' if allow_zero else 'positive'} "
                        f"finite number of seconds" + (" or inf" if allow_zero else ""))
    return seconds


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
