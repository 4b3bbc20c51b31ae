"""The daemon's logging: every record is one line and encodable, whatever names it holds, on every handler
setup_logging picks."""

from __future__ import annotations

import errno
import logging
import logging.handlers
import os
import socket

import pytest

from zarrfs import daemon
from zarrfs.daemon import lifecycle, logs
from zarrfs.options import build_options

# A name as os.fsdecode gives it for the bytes b"bad\xffname" (invalid UTF-8), and one with
# a newline, a carriage return, a tab, an escape and a Unicode line separator.
UNDECODABLE = os.fsdecode(b"bad\xffname")
CONTROL = "new\nline\rcr\ttab\x1besc\u2028sep"
ESCAPED = {UNDECODABLE: "bad\\xffname", CONTROL: "new\\nline\\rcr\\ttab\\x1besc\\u2028sep"}


@pytest.fixture
def restore_root_logger():
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for h in list(root.handlers):
        root.removeHandler(h)
        h.close()
    for h in handlers:
        root.addHandler(h)
    root.setLevel(level)


def _log_names(logger: logging.Logger) -> None:
    for name in ESCAPED:
        logger.warning("%s/.zarray: malformed JSON", name)


def test_log_file_holds_every_record_on_one_line(tmp_path, restore_root_logger, capsys):
    log_file = tmp_path / "zarrfs.log"
    daemon.setup_logging(build_options([f"log_file={log_file}", "log_level=info"]), daemon=False)
    logger = logging.getLogger("zarrfs.test")
    _log_names(logger)
    logging.getLogger().handlers[0].flush()
    lines = log_file.read_bytes().decode("utf-8").splitlines()
    assert len(lines) == len(ESCAPED), lines
    for line, want in zip(lines, ESCAPED.values()):
        assert line.endswith(f" WARNING zarrfs.test: {want}/.zarray: malformed JSON"), line
    assert "Logging error" not in capsys.readouterr().err


def test_stderr_records_are_one_line(restore_root_logger, capsys):
    daemon.setup_logging(build_options(["log_level=info"], foreground=True), daemon=False)
    _log_names(logging.getLogger("zarrfs.test"))
    err = capsys.readouterr().err
    assert "Logging error" not in err
    lines = err.splitlines()
    assert [ln.split(" zarrfs.test: ", 1)[1] for ln in lines] == [
        f"{w}/.zarray: malformed JSON" for w in ESCAPED.values()
    ]


def test_traceback_keeps_its_lines_and_is_encodable(tmp_path, restore_root_logger, capsys):
    log_file = tmp_path / "zarrfs.log"
    daemon.setup_logging(build_options([f"log_file={log_file}"]), daemon=False)
    try:
        raise ValueError(f"cannot read {UNDECODABLE}")
    except ValueError:
        logging.getLogger("zarrfs.test").exception("reading %s failed", CONTROL)
    logging.getLogger().handlers[0].flush()
    lines = log_file.read_bytes().decode("utf-8").splitlines()
    assert lines[0].endswith(f"ERROR zarrfs.test: reading {ESCAPED[CONTROL]} failed"), lines[0]
    assert lines[1] == "Traceback (most recent call last):", lines
    assert lines[-1] == "ValueError: cannot read bad\\xffname", lines
    assert "Logging error" not in capsys.readouterr().err


def test_syslog_records_are_one_encodable_line(tmp_path, restore_root_logger, monkeypatch, capsys):
    """The daemon's syslog handler (used without log_file) escapes the same way."""
    sock_path = os.fspath(tmp_path / "log.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    server.bind(sock_path)

    class LocalSysLogHandler(logging.handlers.SysLogHandler):
        def __init__(self, address="/dev/log", **kwargs):
            assert address == "/dev/log"
            super().__init__(sock_path, **kwargs)

    real_exists = os.path.exists
    monkeypatch.setattr(logs.os.path, "exists", lambda p: True if p == "/dev/log" else real_exists(p))
    monkeypatch.setattr(logs.logging.handlers, "SysLogHandler", LocalSysLogHandler)
    try:
        daemon.setup_logging(build_options([]), daemon=True)
        assert isinstance(logging.getLogger().handlers[0], LocalSysLogHandler)
        _log_names(logging.getLogger("zarrfs.test"))
        server.setblocking(False)  # SysLogHandler sends in emit(): the datagrams are there already
        got = []
        for _ in ESCAPED:
            try:
                got.append(server.recv(65536))
            except BlockingIOError:
                break
    finally:
        server.close()
    assert "Logging error" not in capsys.readouterr().err
    assert len(got) == len(ESCAPED), f"records lost: {got}"
    for datagram, want in zip(got, ESCAPED.values()):
        text = datagram.decode("utf-8").rstrip("\0")
        assert len(text.splitlines()) == 1, text
        assert text.endswith(f"WARNING zarrfs.test: {want}/.zarray: malformed JSON"), text
        assert f"zarrfs[{os.getpid()}]: " in text, text


def test_secrets_are_redacted_at_every_level(tmp_path, restore_root_logger):
    """Whatever logs a registered secret (a message, an argument, a traceback) writes *** instead."""
    log_file = tmp_path / "zarrfs.log"
    daemon.setup_logging(build_options([f"log_file={log_file}", "log_level=debug"]), daemon=False)
    daemon.register_secrets({"S3CRET-VALUE-42"})
    logger = logging.getLogger("zarrfs.test")
    logger.debug("options %s", {"secret": "S3CRET-VALUE-42"})
    try:
        raise RuntimeError("auth with S3CRET-VALUE-42 failed")
    except RuntimeError:
        logger.exception("failed")
    logging.getLogger().handlers[0].flush()
    text = log_file.read_text()
    assert "S3CRET-VALUE-42" not in text and text.count("***") >= 2, text


def test_sigusr1_toggle(restore_root_logger, tmp_path):
    daemon.setup_logging(build_options([f"log_file={tmp_path / 'x.log'}", "log_level=error"]), daemon=False)
    assert daemon.toggle_debug("error") == "DEBUG" and logging.getLogger().level == logging.DEBUG
    assert daemon.toggle_debug("error") == "ERROR" and logging.getLogger().level == logging.ERROR


@pytest.fixture
def restore_pyfuse3_logger():
    logger = logging.getLogger("pyfuse3")
    filters, level = list(logger.filters), logger.level
    yield logger
    logger.filters[:] = filters
    logger.setLevel(level)


def _reply_failures(logger: logging.Logger) -> None:
    """What pyfuse3 logs when libfuse's write of a reply to /dev/fuse fails (its own format)."""
    logger.error("fuse_release(): fuse_reply_* failed with %s", os.strerror(errno.ENOENT))
    logger.error("fuse_read(): fuse_reply_* failed with %s", os.strerror(errno.EINVAL))
    logger.error("fuse_read(): fuse_reply_* failed with %s", os.strerror(errno.ENOENT))


@pytest.mark.parametrize("level", ["info", "debug"])
def test_a_reply_the_kernel_dropped_is_no_error(tmp_path, restore_root_logger, restore_pyfuse3_logger, level):
    """ENOENT from a reply: the kernel no longer waited for it (interrupted, or unmounted meanwhile),
    said at debug level only; any other failed reply stays an ERROR."""
    log_file = tmp_path / "zarrfs.log"
    daemon.setup_logging(build_options([f"log_file={log_file}", f"log_level={level}"]), daemon=False)
    _reply_failures(restore_pyfuse3_logger)
    logging.getLogger().handlers[0].flush()
    lines = [ln.split(" ", 2)[2] for ln in log_file.read_text().splitlines()]
    dropped = [
        f"DEBUG pyfuse3: fuse_release(): fuse_reply_* failed with {os.strerror(errno.ENOENT)}",
        f"DEBUG pyfuse3: fuse_read(): fuse_reply_* failed with {os.strerror(errno.ENOENT)}",
    ]
    other = f"ERROR pyfuse3: fuse_read(): fuse_reply_* failed with {os.strerror(errno.EINVAL)}"
    assert lines == ([dropped[0], other, dropped[1]] if level == "debug" else [other])


def test_the_lease_is_refreshed_while_the_staging_sweep_still_runs(monkeypatch):
    """A sweep that outlasts several refresh periods must not hold back the lease's refreshes."""
    import threading
    import types

    import trio
    import trio.testing

    from zarrfs.storage import staging

    sweep_may_end = threading.Event()
    refreshes: list[bool] = []

    def slow_sweep_sync(hierarchy, writer):
        sweep_may_end.wait()

    async def renew_lease(refresh: bool = False) -> None:
        refreshes.append(refresh)

    monkeypatch.setattr(staging, "sweep_sync", slow_sweep_sync)
    ns = types.SimpleNamespace(hierarchy=None, lease=types.SimpleNamespace(writer="w"), renew_lease=renew_lease)
    ops = types.SimpleNamespace(ns=ns)

    async def main() -> None:
        try:
            with trio.fail_after(3.5 * staging.LEASE_REFRESH_S):  # the mock clock's seconds
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(lifecycle._tend_staging, ops)
                    while len(refreshes) < 3:
                        await trio.sleep(1)
                    nursery.cancel_scope.cancel()
        finally:
            sweep_may_end.set()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert refreshes == [True, True, True]
