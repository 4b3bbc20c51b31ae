"""Mount lifecycle: checks, open the store, pyfuse3.init, daemonize, trio main loop, signals, unmount.

In daemon mode the command forks first; the child opens the store, mounts, and only then
tells the parent through a pipe (`ok` or the one-line error), so the parent exits 0 once
the mount is live and user errors still reach the terminal. Forking before anything
starts threads keeps fsspec's event-loop thread and pyfuse3's state in one process.
"""

from __future__ import annotations

import contextlib
import errno
import gc
import logging
import logging.handlers
import os
import re
import resource
import signal
import socket
import sys
import threading

import pyfuse3
import trio

from .. import __version__, formats
from ..storage import icechunk, staging
from ..engine.cache import ChunkCache
from ..storage.diskcache import DiskCache, DiskCachedStore, default_cache_dir, store_identity
from ..engine.fastpath.direct import DirectReads
from ..engine import Engine
from ..errors import UserError, ZarrfsError
from ..codecs.adapters import compressor_config
from ..formats.icechunk import IcechunkHierarchy
from ..fuse_ops import ZarrOperations, invalidate_data_sync, invalidate_name
from ..tree.namespace import Namespace
from ..model import BrokenNode
from ..options import Options, read_storage_options_file, redact_url, secrets_in
from ..storage.references import open_references_sync
from ..storage.remote import (
    REMOTE_METADATA_TTL_S,
    bound_retries,
    bounded_storage_options,
    default_metadata_ttl_s,
    is_remote,
    missing_backend,
)
from ..storage.store import Store

log = logging.getLogger("zarrfs")

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
SYSLOG_FORMAT = "zarrfs[%(process)d]: %(levelname)s %(name)s: %(message)s"
# Read-ahead the kernel uses on our mount: 1 MiB requests are the point
# where a Python server stops being bound by request count (default is 128 KiB).
READ_AHEAD_KB = 1024
# The open files the daemon asks for (`_raise_open_file_limit`).
OPEN_FILES_WANTED = 1 << 16
# Longest wait for the store to answer at start-up (connection, credentials, the root's listing):
# long enough for a slow remote store, short enough that a boot with the network down does not
# hang a mount(8) for minutes.
START_TIMEOUT_S = float(os.environ.get("ZARRFS_START_TIMEOUT_S", "30"))
# Where a daemon logs without log_file when there is no syslog socket (README "Logging").
DEFAULT_LOG_FILE_ROOT = "/var/log/zarrfs.log"
# Records of this logger (mount and unmount) are written whatever log_level says.
lifecycle = logging.getLogger("zarrfs.lifecycle")
# systemd's credential for storage options (LoadCredential=storage_options.json:PATH).
CREDENTIAL_NAME = "storage_options.json"


def default_log_file() -> str:
    """Where a daemon logs when given no log_file and there is no /dev/log."""
    if os.geteuid() == 0:
        return DEFAULT_LOG_FILE_ROOT
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(state, "zarrfs", "zarrfs.log")


def check_mountpoint(mountpoint: str) -> None:
    dead = UserError(f"mountpoint {mountpoint} is a dead FUSE mount (its daemon is gone): "
                     f"run fusermount3 -uz {mountpoint} and mount again")
    try:
        os.stat(mountpoint)
        if os.path.ismount(mountpoint):
            os.statvfs(mountpoint)  # the kernel answers stat from its cache; statfs reaches the daemon
    except OSError as e:
        if e.errno in (errno.ENOTCONN, errno.ECONNABORTED):  # a FUSE mount whose daemon died (kill -9, crash)
            raise dead from None
        if e.errno != errno.ENOENT:
            raise UserError(f"mountpoint {mountpoint}: {e.strerror}") from None
    if not os.path.exists(mountpoint):
        raise UserError(f"mountpoint {mountpoint} does not exist")
    if not os.path.isdir(mountpoint):
        raise UserError(f"mountpoint {mountpoint} is not a directory")
    if os.path.ismount(mountpoint):
        raise UserError(f"mountpoint {mountpoint} is already a mount point "
                        f"(unmount it first: fusermount3 -u {mountpoint})")
    if os.listdir(mountpoint):
        raise UserError(f"mountpoint {mountpoint} is not empty")
    if not os.path.exists("/dev/fuse"):
        raise UserError("no FUSE: /dev/fuse is missing (load the fuse module or install fuse3)")


# What would break a record's line or its encoding: C0/C1 control characters (newline, CR,
# tab...), Unicode line and paragraph separators (str.splitlines splits there) and lone
# surrogates (os.fsdecode keeps an undecodable byte as U+DC80..U+DCFF; UTF-8 refuses them).
_UNSAFE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]")
_UNSAFE_IN_TRACEBACK = re.compile(r"[\ud800-\udfff]")
_NAMED_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape_char(m: re.Match) -> str:
    c = m.group()
    if c in _NAMED_ESCAPES:
        return _NAMED_ESCAPES[c]
    code = ord(c)
    if 0xDC80 <= code <= 0xDCFF:
        return f"\\x{code - 0xDC00:02x}"  # the undecodable byte itself
    if code <= 0xFF:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}"


def escape_log_text(text: str) -> str:
    """TEXT on one line and encodable in UTF-8: control characters, line separators and
    undecodable bytes written as backslash escapes (``\\n``, ``\\x1b``, ``\\xff``)."""
    return _UNSAFE.sub(_escape_char, text)


# Secret strings of this mount (credentials from storage options, URL passwords): every
# handler's formatter writes them as *** whatever the level and wherever they appear.
_secrets: set[str] = set()


def register_secrets(found: set[str]) -> None:
    _secrets.update(found)


def redact(text: str) -> str:
    for secret in sorted(_secrets, key=len, reverse=True):
        if secret in text:
            text = text.replace(secret, "***")
    return text


class OneLineFormatter(logging.Formatter):
    """A record is one line, whatever names its message holds; an attached traceback keeps
    its own lines, with undecodable bytes escaped so that it can be written too. Secrets of
    the mount never reach the output."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        return escape_log_text(redact(super().formatMessage(record)))

    def formatException(self, ei) -> str:
        return _UNSAFE_IN_TRACEBACK.sub(_escape_char, redact(super().formatException(ei)))

    def formatStack(self, stack_info: str) -> str:
        return _UNSAFE_IN_TRACEBACK.sub(_escape_char, redact(super().formatStack(stack_info)))


class DroppedReplyFilter(logging.Filter):
    """pyfuse3's ERROR for a reply the kernel refused with ENOENT becomes a DEBUG line (kept
    only at debug level): the kernel had dropped that request (interrupted, or the mount going
    away while a release was answered), so nothing failed here. Other reply errors stay ERROR."""

    NO_WAITER = os.strerror(errno.ENOENT)

    def filter(self, record: logging.LogRecord) -> bool:
        if (record.levelno == logging.ERROR and record.args == (self.NO_WAITER,)
                and isinstance(record.msg, str) and record.msg.endswith("(): fuse_reply_* failed with %s")):
            record.levelno, record.levelname = logging.DEBUG, logging.getLevelName(logging.DEBUG)
            # The pyfuse3 logger never lets its own debug through; the root's level decides.
            return logging.getLogger().isEnabledFor(logging.DEBUG)
        return True


_dropped_replies = DroppedReplyFilter()


def _open_log_file(path: str) -> logging.Handler:
    try:
        return logging.FileHandler(path, encoding="utf-8")
    except OSError as e:
        raise UserError(f"log_file={path}: {e.strerror}") from None


def log_destination(options: Options, daemon: bool) -> str:
    """Where setup_logging sends the log: a file path, `syslog` or `stderr`."""
    if options.log_file:
        return options.log_file
    if not daemon:
        return "stderr"
    if os.path.exists("/dev/log"):
        return "syslog"
    return default_log_file()


def check_log_destination(options: Options, daemon: bool) -> str:
    """Open (and create) the log file now, so that a bad path is a one-line error before anything starts."""
    dest = log_destination(options, daemon)
    if dest not in ("stderr", "syslog"):
        if not options.log_file:
            os.makedirs(os.path.dirname(dest), mode=0o700, exist_ok=True)
        _open_log_file(dest).close()
    return dest


def setup_logging(options: Options, daemon: bool) -> str:
    """Send the log where log_destination says; returns that destination."""
    dest = log_destination(options, daemon)
    if dest == "syslog":
        handler: logging.Handler = logging.handlers.SysLogHandler(address="/dev/log")
        handler.setFormatter(OneLineFormatter(SYSLOG_FORMAT))
    elif dest == "stderr":
        handler = logging.StreamHandler(sys.stderr)
    else:
        if not options.log_file:
            os.makedirs(os.path.dirname(dest), mode=0o700, exist_ok=True)
        handler = _open_log_file(dest)
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    if handler.formatter is None:
        handler.setFormatter(OneLineFormatter(LOG_FORMAT))
    root.addHandler(handler)
    set_log_level(options.log_level.upper())
    lifecycle.setLevel(logging.INFO)
    logging.getLogger("pyfuse3").addFilter(_dropped_replies)  # a no-op when already there
    return dest


def set_log_level(level: str | int) -> None:
    root = logging.getLogger()
    root.setLevel(level)
    # fsspec and pyfuse3 are chatty at debug level; keep them at our level or above info.
    for noisy in ("fsspec", "pyfuse3", "asyncio", "aiohttp", "botocore", "s3fs", "urllib3", "gcsfs"):
        logging.getLogger(noisy).setLevel(max(logging.INFO, root.level))


def toggle_debug(configured: str) -> str:
    """SIGUSR1: debug logging on, or back to the configured level; returns the new level name."""
    root = logging.getLogger()
    level = configured.upper() if root.level == logging.DEBUG else "DEBUG"
    set_log_level(level)
    lifecycle.info("SIGUSR1: log level now %s", level.lower())
    return level


def notify_systemd(message: str) -> bool:
    """Send MESSAGE (READY=1, STOPPING=1) to $NOTIFY_SOCKET, systemd's readiness protocol; False when not asked."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):
        address = "\0" + address[1:]  # an abstract socket
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(address)
            sock.sendall(message.encode())
        return True
    except OSError as e:
        log.warning("cannot notify systemd (%s): %s", message.split("\n")[0], e)
        return False


def storage_options_of(options: Options) -> dict:
    """storage_options_file (or systemd's credential) merged under storage_options."""
    path = options.storage_options_file
    credentials_dir = os.environ.get("CREDENTIALS_DIRECTORY")
    if path is None and credentials_dir and os.path.exists(os.path.join(credentials_dir, CREDENTIAL_NAME)):
        path = os.path.join(credentials_dir, CREDENTIAL_NAME)
    merged = read_storage_options_file(path) if path else {}
    merged.update(options.storage_options)
    return merged


def build(source: str, options: Options) -> ZarrOperations:
    """Open the store and its hierarchy; everything that can be a user error happens here."""
    storage_options = storage_options_of(options)
    register_secrets(secrets_in(storage_options, source) | secrets_in(options.remote_options))
    shown = redact_url(source)
    store = open_store(source, storage_options, options, shown)
    check_store(store, shown, min(START_TIMEOUT_S, options.timeout_s))
    versioned = options.format == "icechunk" or (
        options.format == "auto" and icechunk.looks_like_repository_sync(store))
    if versioned:
        store = icechunk.IcechunkStore(source, storage_options, ref=options.ref, snapshot=options.snapshot,
                                            log_level=options.log_level, timeout_s=options.timeout_s,
                                            writable=options.writable,
                                            authorized=options.authorize_virtual_chunk_access)
    elif options.ref is not None or options.snapshot is not None:
        raise UserError(f"{shown}: ref= and snapshot= choose a version of an Icechunk repository; "
                        f"this is not one")
    if options.writable and store.read_only:
        scheme = source.split("://", 1)[0] if "://" in source else "this protocol"
        what = "references" if getattr(store, "is_references", False) else f"{scheme} stores"
        raise UserError(f"{shown}: {what} cannot be written; mount it without writable")
    metadata_ttl_s = mount_metadata_ttl_s(source, options, store)
    # metadata_ttl=0 asks the store at every read: a kept entry would cost a listing each time.
    # An Icechunk repository's keys are its snapshots' own, not objects of the store: not cached.
    if (is_remote(source) and not versioned and not store.is_local and not store.is_references
            and options.disk_cache_bytes > 0 and metadata_ttl_s > 0):
        disk = DiskCache(options.cache_dir or default_cache_dir(), options.disk_cache_bytes)
        if disk.usable:
            log.info("disk cache: %s, at most %d bytes", disk.directory, disk.max_bytes)
            store = DiskCachedStore(store, disk, store_identity(source, storage_options), metadata_ttl_s,
                                    own_prefix=formats.base.RESERVED_PREFIX)
    if options.codec:
        compressor_config(options.codec, "none", 1)  # an unknown codec name is a user error now, not later
    if versioned:  # an Icechunk snapshot holds a Zarr v3 hierarchy, read as it is
        hierarchy = IcechunkHierarchy.open_sync(store, options)
    else:
        hierarchy = formats.open_hierarchy_sync(store, options.format, options)
    root = hierarchy.node_sync("")
    if root is None:
        raise UserError(f"{shown}: not a Zarr hierarchy")
    if isinstance(root, BrokenNode) and root.kind == "array":  # the only node: nothing to mount
        raise UserError(f"{shown}: {root.error}")
    engine = Engine(store, ChunkCache(options.cache_size_bytes), timeout_s=options.timeout_s)
    if store.is_local and not options.writable:
        engine.direct = DirectReads(store)
    engine.bands_enabled = not options.writable
    engine.recycle_enabled = store.is_local and not options.writable
    namespace = Namespace(hierarchy, root, source, engine, show_views=options.show_views, writable=options.writable,
                          create_chunks=options.chunks, create_codec=options.codec, on_name_gone=invalidate_name,
                          on_data_stale_sync=invalidate_data_sync,
                          metadata_ttl_s=metadata_ttl_s)
    log.info("opened %s as %s (root: %s)", shown, hierarchy.name, root.kind)
    return ZarrOperations(namespace, engine, options)


def open_store(source: str, storage_options: dict, options: Options, shown: str) -> Store:
    """The store SOURCE names: a reference set (kerchunk, VirtualiZarr), or any fsspec URL; a
    backend that is not installed is a one-line error naming the extra that brings it."""
    try:
        refs = open_references_sync(source, storage_options, options.remote_protocol, options.remote_options,
                                    options.timeout_s, shown)
        if refs is not None:
            return Store(source, fs=refs)
        if options.remote_protocol is not None or options.remote_options is not None:
            raise UserError(f"{shown}: remote_protocol and remote_options are for references only")
        store = Store(source, bounded_storage_options(source, storage_options, options.timeout_s))
    except ImportError as e:
        remedy = missing_backend(e)
        if remedy is None:
            raise
        raise UserError(f"{shown}: {remedy}") from None
    bound_retries(store.fs)
    return store


def mount_metadata_ttl_s(source: str, options: Options, store: Store | icechunk.IcechunkStore) -> float:
    """The mount's metadata_ttl: the user's, else a branch of an Icechunk repository is checked for
    new commits as often as a remote store (one small read of the branch), else the store kind's."""
    if options.metadata_ttl_s is None and getattr(store, "follows_branch", False):
        return REMOTE_METADATA_TTL_S
    references = getattr(store, "is_references", False)
    return default_metadata_ttl_s("reference://" if references else source, options.metadata_ttl_s)


def check_store(store: Store, shown: str, timeout_s: float = START_TIMEOUT_S) -> None:
    """Raise a UserError naming why the store cannot be used, within `timeout_s` (the `timeout`
    option, at most START_TIMEOUT_S): the backend's own retries may take several times longer."""
    outcome: list[BaseException | None] = []

    def probe() -> None:
        try:
            store.probe_sync(shown)
            outcome.append(None)
        except BaseException as e:  # handed to the waiting thread
            outcome.append(e)

    worker = threading.Thread(target=probe, name="zarrfs-probe", daemon=True)
    worker.start()
    worker.join(timeout_s)
    if not outcome:
        raise UserError(f"{shown}: the store did not answer within {timeout_s:g} s (timed out)")
    if outcome[0] is not None:
        raise outcome[0]


def fsname(source: str, options: Options) -> str:
    """What mount(8) and df show as the source: fsname=, else SOURCE without credentials."""
    if options.fsname is not None:
        name = options.fsname
    elif "://" not in source and "::" not in source:
        # A local path as typed is relative to a shell's directory that mount(8) and df know nothing of.
        name = os.path.abspath(source)
    else:
        name = redact_url(source)
    # libfuse splits options at commas (a backslash escapes one); other characters pass as they are.
    return name.replace("\\", "\\\\").replace(",", "\\,")


def fuse_options(options: Options, source: str = "zarrfs") -> set[str]:
    opts = set(pyfuse3.default_options)
    opts.update((f"fsname={fsname(source, options)}", "subtype=zarrfs"))
    if any(o.startswith("subtype=") for o in options.fuse_options):
        opts.discard("subtype=zarrfs")
    # A read-only mount is not `ro` for the kernel: every write call reaches zarrfs, which
    # refuses it with EROFS, except a rewrite that saves GDAL's statistics (gdal/PATH.vrt,
    # raw/PATH.raw.aux.xml), which GDAL reports as an error when it fails.
    opts.update(o for o in options.fuse_options if o.split("=")[0] not in ("uid", "gid", "umask"))
    return opts


def _socket_fds() -> set[int]:
    """This process's open sockets (file descriptor numbers)."""
    out = set()
    for name in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{name}").startswith("socket:"):
                out.add(int(name))
        except OSError:
            pass
    return out


def mount(ops: ZarrOperations, mountpoint: str, options: Options, source: str) -> list[int]:
    """Mount; returns the sockets the mount opened (with auto_unmount, the one to fusermount3's helper)."""
    before = _socket_fds()
    # How other processes' descriptors name our files (engine/interrupts.py): resolved before
    # the mount, when resolving it cannot ask this daemon.
    ops.engine.interrupts.mountpoint = os.path.realpath(mountpoint)
    try:
        pyfuse3.init(ops, mountpoint, fuse_options(options, source))
    except RuntimeError as e:
        raise UserError(f"cannot mount on {mountpoint}: {e}") from None
    return sorted(_socket_fds() - before)


def _release_helper_socket_last(sockets: list[int]) -> None:
    """Give the socket to fusermount3's auto_unmount helper the lowest descriptor (stdin).

    The helper unmounts when that socket closes, after checking the mount point; on a
    `kill -9` the kernel releases a dying process's files last-closed-first, so a socket
    numbered above /dev/fuse let the helper look at the mount while the FUSE connection
    was still alive and give up (about 1 kill in 40 under load left a dead mount; none
    in 120 with this).
    """
    if len(sockets) == 1:
        os.dup2(sockets[0], 0)
        os.close(sockets[0])


def _tune_read_ahead_sync(mountpoint: str) -> None:
    """Let the kernel send 1 MiB reads (root only; best effort)."""
    try:
        dev = os.stat(mountpoint).st_dev
        with open(f"/sys/class/bdi/{os.major(dev)}:{os.minor(dev)}/read_ahead_kb", "w") as f:
            f.write(str(READ_AHEAD_KB))
    except OSError as e:
        log.info("read-ahead left at the kernel's default: %s", e)


def _answers_sync(mountpoint: str) -> None:
    """Return once the mount answers a request (our own main loop serves this stat)."""
    os.stat(mountpoint)


async def _serve(ops: ZarrOperations, mountpoint: str) -> None:
    async with trio.open_nursery() as nursery:
        await nursery.start(ops.engine.run)

        async def on_signals() -> None:
            with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, signal.SIGUSR1) as signals:
                async for signum in signals:
                    if signum == signal.SIGUSR1:
                        toggle_debug(ops.options.log_level)
                        continue
                    lifecycle.info("%s: unmounting %s", signal.Signals(signum).name, mountpoint)
                    notify_systemd("STOPPING=1")
                    pyfuse3.terminate()
                    return

        async def ready() -> None:
            await trio.to_thread.run_sync(_answers_sync, mountpoint)
            notify_systemd(f"READY=1\nMAINPID={os.getpid()}\nSTATUS=serving {mountpoint}")

        nursery.start_soon(on_signals)
        nursery.start_soon(ready)
        if ops.options.writable:
            nursery.start_soon(_tend_staging, ops)
        nursery.start_soon(trio.to_thread.run_sync, _tune_read_ahead_sync, mountpoint)
        await pyfuse3.main()
        notify_systemd("STOPPING=1")
        await ops.ns.shutdown()  # arrays still being written: stored if complete, else dropped
        try:
            await ops.engine.flush()  # anything still dirty reaches the store before we exit
        except ZarrfsError as e:
            log.error("chunks written before unmount could not be stored: %s", e)
        await ops.ns.renew_lease()  # erased once nothing is staged
        nursery.cancel_scope.cancel()


async def _tend_staging(ops: ZarrOperations) -> None:
    """Writable mounts, until cancelled: the sweep of staging left by writers that died, and
    beside it, from the start, the refreshes of this daemon's lease (a sweep of a big remote
    hierarchy can outlast a lease: another machine's sweep would then remove live staging)."""
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_refresh_lease, ops)
        nursery.start_soon(_sweep_staging, ops)


async def _sweep_staging(ops: ZarrOperations) -> None:
    """Writable mounts, in the background: remove what writers that died left staged (a walk of
    every group, which a big remote hierarchy makes long).

    One thread outside the engine's I/O limiter, one store call at a time: reads keep every I/O
    thread, and each call is bounded by the backend timeouts that `timeout` sets."""
    await trio.to_thread.run_sync(staging.sweep_sync, ops.ns.hierarchy, ops.ns.lease.writer,
                                  abandon_on_cancel=True)


async def _refresh_lease(ops: ZarrOperations) -> None:
    """Writable mounts, from the start: rewrite this daemon's lease while it stages."""
    while True:
        await trio.sleep(staging.LEASE_REFRESH_S)
        await ops.ns.renew_lease(refresh=True)


def serve(ops: ZarrOperations, mountpoint: str) -> None:
    """Run the main loop until unmounted or signalled, then unmount."""
    _raise_open_file_limit()
    # What exists now (modules, the tree's root, the options: some 42,000 objects) lives as long
    # as the mount; out of the collector's sight, a collection of every generation (one per GiB
    # or so of sequential reads) no longer walks it: 16 ms each in-process, 1 ms after.
    gc.freeze()
    try:
        trio.run(_serve, ops, mountpoint)
    finally:
        pyfuse3.close(unmount=True)
        stats = ops.engine.stats()
        stats["errors_by_key"] = len(stats["errors_by_key"])  # how many keys failed: stats.json names them
        lifecycle.info("unmounted %s; %s", mountpoint, stats)


def _raise_open_file_limit() -> None:
    """Let the daemon keep chunk files open (direct.OPEN_FILES in each thread that reads them:
    the trio thread and every worker) past the usual soft limit of 1,024, up to the hard one."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = OPEN_FILES_WANTED if hard == resource.RLIM_INFINITY else min(hard, OPEN_FILES_WANTED)
    if soft != resource.RLIM_INFINITY and soft < want:
        with contextlib.suppress(OSError, ValueError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


def run(source: str, mountpoint: str, options: Options) -> int:
    """Mount and serve; returns the exit code. Raises UserError before anything is mounted."""
    check_mountpoint(mountpoint)
    check_log_destination(options, daemon=not options.foreground)
    if options.foreground:
        dest = setup_logging(options, daemon=False)
        ops = build(source, options)
        mount(ops, mountpoint, options, source)
        _started(source, mountpoint, dest)
        serve(ops, mountpoint)
        return 0
    return _daemonize(source, mountpoint, options)


def _started(source: str, mountpoint: str, dest: str) -> None:
    lifecycle.info("zarrfs %s (pid %d) mounted %s on %s; log: %s; SIGUSR1 toggles debug logging",
                   __version__, os.getpid(), redact_url(source), mountpoint, dest)


def _daemonize(source: str, mountpoint: str, options: Options) -> int:
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid:
        os.close(write_fd)
        with os.fdopen(read_fd, "rb") as pipe:
            message = pipe.read().decode(errors="replace").strip()
        if message == "ok":
            return 0
        if not message:
            _, status = os.waitpid(pid, 0)
            message = f"the daemon died while starting (status {status}); see its log"
        raise UserError(message)
    # The child: a session of its own, then everything that can fail, then report.
    os.close(read_fd)
    os.setsid()
    code = 0
    try:
        dest = setup_logging(options, daemon=True)
        ops = build(source, options)
        helper_sockets = mount(ops, mountpoint, options, source)
        _started(source, mountpoint, dest)
    except ZarrfsError as e:
        log.error("%s", e)
        os.write(write_fd, redact(str(e)).encode())
        os._exit(1)
    except BaseException as e:  # an unexpected failure still reaches the user as one line
        log.exception("start-up failed")
        os.write(write_fd, redact(f"start-up failed: {type(e).__name__}: {e}").encode())
        os._exit(1)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    _release_helper_socket_last(helper_sockets)
    os.chdir("/")
    os.write(write_fd, b"ok")
    os.close(write_fd)
    try:
        serve(ops, mountpoint)
    except BaseException:
        log.exception("main loop failed")
        code = 1
    logging.shutdown()
    os._exit(code)
