"""Mount lifecycle: checks, pyfuse3.init, daemonize, the trio main loop, signals, unmount.

In daemon mode the command forks first; the child opens the store, mounts, and only then
tells the parent through a pipe (`ok` or the one-line error), so the parent exits 0 once
the mount is live and user errors still reach the terminal. Forking before anything
starts threads keeps fsspec's event-loop thread and pyfuse3's state in one process.
composition.py builds what is mounted; logs.py sets up the log.
"""

from __future__ import annotations

import contextlib
import errno
import gc
import logging
import os
import resource
import signal
import socket

import pyfuse3
import trio

from .. import __version__
from ..errors import UserError, ZarrfsError
from ..fuse_ops import ZarrOperations
from ..options import Options, redact_url
from ..storage import staging
from .composition import build
from .logs import check_log_destination, lifecycle_log, redact, setup_logging, toggle_debug

log = logging.getLogger("zarrfs")

# Read-ahead the kernel uses on our mount: 1 MiB requests are the point
# where a Python server stops being bound by request count (default is 128 KiB).
READ_AHEAD_KB = 1024
# The open files the daemon asks for (`_raise_open_file_limit`).
OPEN_FILES_WANTED = 1 << 16


def check_mountpoint(mountpoint: str) -> None:
    """Raise a UserError unless MOUNTPOINT is an empty directory, not mounted, and FUSE is there."""
    dead = UserError(
        f"mountpoint {mountpoint} is a dead FUSE mount (its daemon is gone): "
        f"run fusermount3 -uz {mountpoint} and mount again"
    )
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
        raise UserError(
            f"mountpoint {mountpoint} is already a mount point (unmount it first: fusermount3 -u {mountpoint})"
        )
    if os.listdir(mountpoint):
        raise UserError(f"mountpoint {mountpoint} is not empty")
    if not os.path.exists("/dev/fuse"):
        raise UserError("no FUSE: /dev/fuse is missing (load the fuse module or install fuse3)")


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
    was still alive and give up, leaving a dead mount.
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
                    lifecycle_log.info("%s: unmounting %s", signal.Signals(signum).name, mountpoint)
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
        # replaced arrays' old keys, erased in the background: each erase is bounded by the store's timeouts
        await trio.to_thread.run_sync(ops.ns.hierarchy.erases.drain, ops.options.timeout_s)
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
    await trio.to_thread.run_sync(staging.sweep_sync, ops.ns.hierarchy, ops.ns.lease.writer, abandon_on_cancel=True)


async def _refresh_lease(ops: ZarrOperations) -> None:
    """Writable mounts, from the start: rewrite this daemon's lease while it stages."""
    while True:
        await trio.sleep(staging.LEASE_REFRESH_S)
        await ops.ns.renew_lease(refresh=True)


def serve(ops: ZarrOperations, mountpoint: str) -> None:
    """Run the main loop until unmounted or signalled, then unmount."""
    _raise_open_file_limit()
    # What exists now (modules, the tree's root, the options) lives as long as the mount: out of
    # the collector's sight, a full collection during sequential reads no longer walks it.
    gc.freeze()
    try:
        trio.run(_serve, ops, mountpoint)
    finally:
        pyfuse3.close(unmount=True)
        stats = ops.engine.stats()
        stats["errors_by_key"] = len(stats["errors_by_key"])  # how many keys failed: stats.json names them
        lifecycle_log.info("unmounted %s; %s", mountpoint, stats)


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
    lifecycle_log.info(
        "zarrfs %s (pid %d) mounted %s on %s; log: %s; SIGUSR1 toggles debug logging",
        __version__,
        os.getpid(),
        redact_url(source),
        mountpoint,
        dest,
    )


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
