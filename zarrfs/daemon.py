"""Mount lifecycle: checks, open the store, pyfuse3.init, daemonize, trio main loop, signals, unmount.

In daemon mode the command forks first; the child opens the store, mounts, and only then
tells the parent through a pipe (`ok` or the one-line error), so the parent exits 0 once
the mount is live and user errors still reach the terminal. Forking before anything
starts threads keeps fsspec's event-loop thread and pyfuse3's state in one process.
"""

from __future__ import annotations

import logging
import logging.handlers
import os
import re
import signal
import sys

import pyfuse3
import trio

from . import formats
from .cache import ChunkCache
from .engine import Engine
from .errors import UserError, ZarrfsError
from .formats.base import compressor_config
from .fuse_ops import ZarrOperations
from .model import BrokenNode
from .options import Options
from .store import Store
from .tree import Namespace

log = logging.getLogger("zarrfs")

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
SYSLOG_FORMAT = "zarrfs[%(process)d]: %(levelname)s %(name)s: %(message)s"
# Read-ahead the kernel uses on our mount: FACTS.md measured 1 MiB requests as the point
# where a Python server stops being bound by request count (default is 128 KiB).
READ_AHEAD_KB = 1024


def check_mountpoint(mountpoint: str) -> None:
    if not os.path.exists(mountpoint):
        raise UserError(f"mountpoint {mountpoint} does not exist")
    if not os.path.isdir(mountpoint):
        raise UserError(f"mountpoint {mountpoint} is not a directory")
    if os.path.ismount(mountpoint):
        raise UserError(f"mountpoint {mountpoint} is already a mount point")
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


class OneLineFormatter(logging.Formatter):
    """A record is one line, whatever names its message holds; an attached traceback keeps
    its own lines, with undecodable bytes escaped so that it can be written too."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        return escape_log_text(super().formatMessage(record))

    def formatException(self, ei) -> str:
        return _UNSAFE_IN_TRACEBACK.sub(_escape_char, super().formatException(ei))

    def formatStack(self, stack_info: str) -> str:
        return _UNSAFE_IN_TRACEBACK.sub(_escape_char, super().formatStack(stack_info))


def setup_logging(options: Options, daemon: bool) -> None:
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    if options.log_file:
        handler: logging.Handler = logging.FileHandler(options.log_file, encoding="utf-8")
    elif daemon and os.path.exists("/dev/log"):
        handler = logging.handlers.SysLogHandler(address="/dev/log")
        handler.setFormatter(OneLineFormatter(SYSLOG_FORMAT))
    elif daemon:
        handler = logging.NullHandler()
    else:
        handler = logging.StreamHandler(sys.stderr)
    if handler.formatter is None:
        handler.setFormatter(OneLineFormatter(LOG_FORMAT))
    root.addHandler(handler)
    root.setLevel(options.log_level.upper())
    # fsspec and pyfuse3 are chatty at debug level; keep them at our level or above info.
    for noisy in ("fsspec", "pyfuse3", "asyncio", "aiohttp"):
        logging.getLogger(noisy).setLevel(max(logging.INFO, root.level))


def build(source: str, options: Options) -> ZarrOperations:
    """Open the store and its hierarchy; everything that can be a user error happens here."""
    store = Store(source, options.storage_options)
    if not store.exists_sync():
        raise UserError(f"{source}: no such file, directory or store")
    if options.writable and store.read_only:
        raise UserError(f"{source}: this store cannot be written ({store.fs.protocol}); mount it without writable")
    if options.codec:
        compressor_config(options.codec, "none", 1)  # an unknown codec name is a user error now, not later
    hierarchy = formats.open_hierarchy_sync(store, options.format, options)
    root = hierarchy.node_sync("")
    if root is None:
        raise UserError(f"{source}: not a Zarr hierarchy")
    if isinstance(root, BrokenNode) and root.kind == "array":  # the only node: nothing to mount
        raise UserError(f"{source}: {root.error}")
    engine = Engine(store, ChunkCache(options.cache_size_bytes))
    namespace = Namespace(hierarchy, root, source, engine, options.show_views)
    log.info("opened %s as %s (root: %s)", source, hierarchy.name, root.kind)
    return ZarrOperations(namespace, engine, options)


def fuse_options(options: Options) -> set[str]:
    opts = set(pyfuse3.default_options)
    opts.update(("fsname=zarrfs", "subtype=zarrfs"))
    if not options.writable:
        opts.add("ro")
    opts.update(o for o in options.fuse_options if o.split("=")[0] not in ("uid", "gid", "umask"))
    return opts


def mount(ops: ZarrOperations, mountpoint: str, options: Options) -> None:
    try:
        pyfuse3.init(ops, mountpoint, fuse_options(options))
    except RuntimeError as e:
        raise UserError(f"cannot mount on {mountpoint}: {e}") from None


def _tune_read_ahead_sync(mountpoint: str) -> None:
    """Let the kernel send 1 MiB reads (root only; best effort)."""
    try:
        dev = os.stat(mountpoint).st_dev
        with open(f"/sys/class/bdi/{os.major(dev)}:{os.minor(dev)}/read_ahead_kb", "w") as f:
            f.write(str(READ_AHEAD_KB))
    except OSError as e:
        log.info("read-ahead left at the kernel's default: %s", e)


async def _serve(ops: ZarrOperations, mountpoint: str) -> None:
    async with trio.open_nursery() as nursery:
        await nursery.start(ops.engine.run)

        async def on_signals() -> None:
            with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                async for signum in signals:
                    log.info("%s: unmounting", signal.Signals(signum).name)
                    pyfuse3.terminate()
                    return

        nursery.start_soon(on_signals)
        nursery.start_soon(trio.to_thread.run_sync, _tune_read_ahead_sync, mountpoint)
        await pyfuse3.main()
        await ops.ns.shutdown()  # arrays still being written: stored if complete, else dropped
        try:
            await ops.engine.flush()  # anything still dirty reaches the store before we exit
        except ZarrfsError as e:
            log.error("chunks written before unmount could not be stored: %s", e)
        nursery.cancel_scope.cancel()


def serve(ops: ZarrOperations, mountpoint: str) -> None:
    """Run the main loop until unmounted or signalled, then unmount."""
    try:
        trio.run(_serve, ops, mountpoint)
    finally:
        pyfuse3.close(unmount=True)
        log.info("unmounted %s; %s", mountpoint, ops.engine.stats())


def run(source: str, mountpoint: str, options: Options) -> int:
    """Mount and serve; returns the exit code. Raises UserError before anything is mounted."""
    check_mountpoint(mountpoint)
    if options.foreground:
        setup_logging(options, daemon=False)
        ops = build(source, options)
        mount(ops, mountpoint, options)
        serve(ops, mountpoint)
        return 0
    return _daemonize(source, mountpoint, options)


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
        setup_logging(options, daemon=True)
        ops = build(source, options)
        mount(ops, mountpoint, options)
    except ZarrfsError as e:
        os.write(write_fd, str(e).encode())
        os._exit(1)
    except BaseException as e:  # an unexpected failure still reaches the user as one line
        log.exception("start-up failed")
        os.write(write_fd, f"start-up failed: {type(e).__name__}: {e}".encode())
        os._exit(1)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
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
