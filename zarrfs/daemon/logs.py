"""The daemon's log: where it goes (stderr, syslog, log_file), one encodable line per record with the mount's secrets redacted, and SIGUSR1's debug toggle."""

from __future__ import annotations

import errno
import logging
import logging.handlers
import os
import re
import sys
from types import TracebackType

from ..errors import UserError
from ..options import Options

log = logging.getLogger("zarrfs")

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
SYSLOG_FORMAT = "zarrfs[%(process)d]: %(levelname)s %(name)s: %(message)s"
# Where a daemon logs without log_file when there is no syslog socket (docs/CONFIGURATION.md: Logging).
DEFAULT_LOG_FILE_ROOT = "/var/log/zarrfs.log"
# Records of this logger (mount and unmount) are written whatever log_level says.
lifecycle_log = logging.getLogger("zarrfs.lifecycle")


def default_log_file() -> str:
    """Where a daemon logs when given no log_file and there is no /dev/log."""
    if os.geteuid() == 0:
        return DEFAULT_LOG_FILE_ROOT
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(state, "zarrfs", "zarrfs.log")


# What would break a record's line or its encoding: C0/C1 control characters (newline, CR,
# tab...), Unicode line and paragraph separators (str.splitlines splits there) and lone
# surrogates (os.fsdecode keeps an undecodable byte as U+DC80..U+DCFF; UTF-8 refuses them).
_UNSAFE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]")
_UNSAFE_IN_TRACEBACK = re.compile(r"[\ud800-\udfff]")
_NAMED_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape_char(m: re.Match[str]) -> str:
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

    def formatException(
        self, ei: tuple[type[BaseException], BaseException, TracebackType | None] | tuple[None, None, None]
    ) -> str:
        return _UNSAFE_IN_TRACEBACK.sub(_escape_char, redact(super().formatException(ei)))

    def formatStack(self, stack_info: str) -> str:
        return _UNSAFE_IN_TRACEBACK.sub(_escape_char, redact(super().formatStack(stack_info)))


class DroppedReplyFilter(logging.Filter):
    """pyfuse3's ERROR for a reply the kernel refused with ENOENT becomes a DEBUG line (kept
    only at debug level): the kernel had dropped that request (interrupted, or the mount going
    away while a release was answered), so nothing failed here. Other reply errors stay ERROR."""

    NO_WAITER = os.strerror(errno.ENOENT)

    def filter(self, record: logging.LogRecord) -> bool:
        if (
            record.levelno == logging.ERROR
            and record.args == (self.NO_WAITER,)
            and isinstance(record.msg, str)
            and record.msg.endswith("(): fuse_reply_* failed with %s")
        ):
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
    lifecycle_log.setLevel(logging.INFO)
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
    lifecycle_log.info("SIGUSR1: log level now %s", level.lower())
    return level
