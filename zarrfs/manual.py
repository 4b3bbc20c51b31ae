"""The one table of options and the tree of a mount, and what is made from them: `--help`, zarrfs(1), docs/CONFIGURATION.md."""

from __future__ import annotations

import dataclasses
import re

# Icechunk's own name for the virtual chunk containers a repository's reader trusts (named here,
# the lowest layer, so that a store's error message can suggest the option).
AUTHORIZE = "authorize_virtual_chunk_access"


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
    OptionDoc(
        "writable",
        "allow writes (docs/SEMANTICS.md: Writes); refused for read-only stores such as HTTP; on an "
        "Icechunk branch each operation is one commit (docs/SEMANTICS.md: Icechunk repositories)",
        "off",
    ),
    OptionDoc(
        "ro",
        "read-only for the kernel too: `mount` and statvfs say `ro` and every write call gets "
        "EROFS from the kernel, for every user; without it a read-only mount refuses writes itself "
        "and lets GDAL save statistics beside its views (docs/SEMANTICS.md: Writes)",
        "off",
    ),
    OptionDoc(
        "cache_size=SIZE",
        "budget of the decoded-chunk cache (`512M`, `2G`): a larger one keeps more chunks decoded "
        "and allows a larger read-ahead window, in the daemon's memory; chunks larger than the "
        "budget are decoded only as far as each read needs, or kept apart (docs/CONFIGURATION.md: Memory)",
        "`512M`",
    ),
    OptionDoc("format=auto|v1|v2|v3|v3-draft|icechunk", "skip detection", "`auto`"),
    OptionDoc(
        "ref=NAME",
        "Icechunk: the branch or tag to mount; a branch mount follows the branch's newest "
        "snapshot (docs/SEMANTICS.md: Icechunk repositories)",
        "branch `main`",
    ),
    OptionDoc("snapshot=ID", "Icechunk: the snapshot to mount, by its ID", "none"),
    OptionDoc(
        "authorize_virtual_chunk_access=PREFIX[,PREFIX...]",
        "where virtual chunks (Icechunk) and reference targets (kerchunk, VirtualiZarr) may be read "
        "from beyond the defaults: URL prefixes, each a directory (`file:///data/nc/`, `s3://bucket/nc/`); "
        "for Icechunk the containers as the repository's config names them "
        "(docs/SEMANTICS.md: What reference sets may read)",
        "Icechunk: none (virtual chunks read as EIO); references: a local reference file may name "
        "anything, a remote one object stores and web servers only",
    ),
    OptionDoc(
        "v1_order=spec|writer",
        "how v1 `order: F` chunks are laid out: `spec` as the v1 specification "
        "says (F order); `writer` as zarr 1.1.0, the one real v1 writer, stored them (F order only with "
        "blosc, C order with every other compressor). Use `writer` for stores that writer made",
        "`spec`",
    ),
    OptionDoc(
        "storage_options=JSON",
        "keyword arguments for the fsspec file system (`endpoint_url`, `anon`, "
        "credentials). Visible to every user in `ps` and `/proc/PID/cmdline`, and in fstab: give "
        "credentials with `storage_options_file` or the backend's environment instead",
        "none",
    ),
    OptionDoc(
        "storage_options_file=PATH",
        "the same as a JSON file; refused when group or others may read it "
        "(`chmod 600`). Under systemd a credential named `storage_options.json` (`LoadCredential=`) is "
        "used when this is not given. Merged under `storage_options`",
        "none",
    ),
    OptionDoc(
        "remote_protocol=NAME",
        "references (docs/REMOTE.md: References): the protocol of the data files they point to (`s3`, `file`, ...)",
        "each data file's own URL's protocol (`file` for a path)",
    ),
    OptionDoc(
        "remote_options=JSON",
        "references: keyword arguments for the file system of the data files on `remote_protocol` "
        "(without it: on the first remote data file's protocol), `endpoint_url`, `anon`; as visible as `storage_options`",
        "`storage_options` when the data files are on the reference file's protocol, else none",
    ),
    OptionDoc(
        "timeout=SECONDS",
        "longest wait on the store for one operation (a chunk, a listing, a "
        "metadata document), retries included; then the caller gets EIO and the log says why "
        "(docs/REMOTE.md: Remote stores)",
        "`30`",
    ),
    OptionDoc(
        "upload_part_size=SIZE",
        "S3: a chunk or shard of twice this size or more is stored as a multipart upload in parts "
        "of this size, up to 8 at once, a v3 shard's sent while it is being written (at least `5M`, "
        "S3's smallest part; docs/SEMANTICS.md: Writes)",
        "`50M`",
    ),
    OptionDoc(
        "metadata_ttl=SECONDS",
        "how long listings, metadata documents and the validity of cached "
        "chunks are trusted before they are checked against the store again; `0` checks every time, "
        "`inf` never (`cat MOUNT/.zarrfs/refresh`, or `touch` on a writable mount, drops them at once); "
        "a longer one costs fewer requests and shows other writers' changes later (docs/REMOTE.md: "
        "Remote stores)",
        "`10` for remote stores and Icechunk branches, `inf` for local directories",
    ),
    OptionDoc(
        "cache_dir=PATH",
        "where the disk cache of remote stores lives (docs/REMOTE.md: Disk cache); created mode "
        "`0700`, its files `0600`; shared by every mount and process of the user",
        "`$XDG_CACHE_HOME/zarrfs` when XDG_CACHE_HOME is set, else `/var/cache/zarrfs` for root, "
        "`~/.cache/zarrfs` for other users",
    ),
    OptionDoc(
        "disk_cache_size=SIZE",
        "most bytes the disk cache holds (`4G`, `500M`); least recently used "
        "entries go first; `0` turns it off (do so for confidential data: entries outlive the mount). Local "
        "stores are never cached",
        "`4G`",
    ),
    OptionDoc(
        "show_views",
        "list `.zarrfs` in the root directory (it is always reachable by path, like ZFS's "
        "`.zfs`, so `cp -r MOUNT` copies only the `.npy` tree)",
        "off",
    ),
    OptionDoc("chunks=N[,N...]", "chunk shape of arrays created through the mount (with writes)", "format's usual"),
    OptionDoc("codec=NAME[:LEVEL]", "compressor of arrays created through the mount (with writes)", "format's usual"),
    OptionDoc(
        "log_level=LEVEL",
        "`debug`, `info`, `warning`, `error`, `critical`; `kill -USR1 PID` switches debug on and off while mounted",
        "`warning`",
    ),
    OptionDoc(
        "log_file=PATH",
        "where the log goes (a file that cannot be opened is an error at start)",
        "stderr with `-f` or under systemd; syslog when daemonized and `/dev/log` exists; else "
        "`/var/log/zarrfs.log` (root) or `~/.local/state/zarrfs/zarrfs.log`",
    ),
    OptionDoc("fsname=NAME", "the source `mount`, `df` and `/proc/mounts` show", "SOURCE without credentials"),
    OptionDoc(
        "allow_other",
        "let other users than the mounting one use the mount (FUSE; non-root users need "
        "`user_allow_other` in `/etc/fuse.conf`)",
        "off",
    ),
    OptionDoc("allow_root", "let root use the mount too (FUSE)", "off"),
    OptionDoc("default_permissions", "the kernel checks modes against `uid`/`gid`/`umask` (FUSE)", "on"),
    OptionDoc(
        "auto_unmount",
        "unmount when the daemon dies, even by `kill -9` (FUSE, through a `fusermount3` "
        "helper process that must be left running)",
        "off",
    ),
    OptionDoc("uid=N", "owner the files show", "the mounting user"),
    OptionDoc("gid=N", "group the files show", "the mounting user's group"),
    OptionDoc(
        "umask=OCTAL", "mode bits taken away from the files' modes (`0444`/`0555`, `0644`/`0755` when writable)", "`0`"
    ),
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
    ome-tiff/IMAGE.ome.tif  an OME-Zarr image as one pyramidal OME-TIFF
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

    def link(m: re.Match[str]) -> str:
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
    lines = [
        f'.TH ZARRFS 1 "" "zarrfs {version}" "User Commands"',
        ".SH NAME",
        "zarrfs \\- mount a Zarr hierarchy as a file system of .npy files",
        ".SH SYNOPSIS",
        ".B zarrfs",
        "SOURCE MOUNTPOINT [\\-f] [\\-o OPTION[,OPTION...]] [\\-\\-OPTION[=VALUE] ...]",
        ".br",
        ".B mount \\-t fuse.zarrfs",
        "SOURCE MOUNTPOINT \\-o OPTIONS",
        ".SH DESCRIPTION",
        _roff(
            "Groups of the Zarr hierarchy at SOURCE (a local directory or an fsspec URL) become "
            "directories; arrays become `.npy` files. Without `-f` the command returns once the mount "
            "is live. Unmount with `fusermount3 -u MOUNTPOINT` or `umount`."
        ),
        ".SH FILES",
        _roff("The tree of a mount (docs/VIEWS.md: The tree):"),
        ".PP",
        ".nf",
        *_roff(TREE).splitlines(),
        ".fi",
        ".SH OPTIONS",
        "Every option is given as \\fB\\-o name[=value]\\fR or \\fB\\-\\-name[=value]\\fR.",
        ".TP",
        ".B \\-f",
        "stay in the foreground (under systemd: Type=notify readiness)",
    ]
    for o in OPTION_TABLE:
        lines += [".TP", f".B {_roff(o.spelling)}", _roff(f"{o.meaning} (default: {o.default})")]
    lines += [
        ".SH SIGNALS",
        _roff("SIGINT, SIGTERM: store pending writes and unmount. SIGUSR1: switch debug logging on or off."),
        ".SH SEE ALSO",
        "fusermount3(1), mount.fuse3(8), fstab(5), systemd.mount(5)",
    ]
    return "\n".join(lines) + "\n"
