"""The daemon: lifecycle.py mounts and serves, composition.py builds what is mounted from the options, logs.py sets up the log."""

from .composition import build
from .lifecycle import run
from .logs import redact, register_secrets, setup_logging, toggle_debug

__all__ = ["build", "redact", "register_secrets", "run", "setup_logging", "toggle_debug"]
