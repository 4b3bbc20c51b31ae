"""The command line: `zarrfs SOURCE MOUNTPOINT [-f] [-o OPTIONS] [--OPTION[=VALUE]]`; one line per user error."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from . import __version__
from .errors import UserError
from .manual import TREE, options_help, options_man
from .options import build_options, split_o

USAGE = "zarrfs SOURCE MOUNTPOINT [-f] [-o OPTION[,OPTION...]] [--OPTION[=VALUE] ...]"
CLEAR_USAGE = "zarrfs --clear-cache [-o cache_dir=PATH]"


class _Parser(argparse.ArgumentParser):
    """argparse that reports a usage error as one UserError line instead of exiting."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UserError(f"{message} (usage: {USAGE})")


class _ManAction(argparse.Action):
    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help=kwargs.get("help"))

    def __call__(self, parser: argparse.ArgumentParser, *args: object) -> None:
        sys.stdout.write(options_man(__version__))
        parser.exit()


def parse(argv: list[str]) -> tuple[str, str, list[str], bool]:
    parser = _Parser(
        prog="zarrfs",
        usage=USAGE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Mount a Zarr hierarchy: groups as directories, arrays as .npy files.",
        epilog="the tree of a mount (docs/VIEWS.md: The tree):\n" + TREE + "\n\n"
        "mount options (-o NAME[=VALUE] or --NAME[=VALUE]):\n" + options_help() + "\n\n"
        "signals: SIGTERM/SIGINT unmount; SIGUSR1 switches debug logging on and off.\n"
        "unmount with: fusermount3 -u MOUNTPOINT (or umount as root)",
    )
    parser.add_argument("source", metavar="SOURCE", help="local path or fsspec URL of the store")
    parser.add_argument("mountpoint", metavar="MOUNTPOINT", help="an empty directory")
    parser.add_argument("-f", "--foreground", action="store_true", help="stay in the foreground")
    parser.add_argument("-o", dest="o", action="append", default=[], metavar="OPTIONS", help="comma-separated options")
    parser.add_argument("--version", action="version", version=f"zarrfs {__version__}")
    parser.add_argument("--man", action=_ManAction, help="print the zarrfs(1) manual page (roff) and exit")
    parser.add_argument(
        "--clear-cache", action="store_true", help=f"remove every entry of the disk cache and exit ({CLEAR_USAGE})"
    )
    args, extra = parser.parse_known_args(argv)
    items = [i for o in args.o for i in split_o(o)]
    for flag in extra:
        if not flag.startswith("--") or len(flag) < 3:
            raise UserError(f"unexpected argument {flag!r} (usage: {USAGE})")
        items.append(flag[2:])
    return args.source, args.mountpoint, items, args.foreground


def clear_cache(argv: list[str]) -> int:
    """`zarrfs --clear-cache [-o cache_dir=PATH]`: empty the disk cache (mounts using it just read again)."""
    from .storage.diskcache import DiskCache, default_cache_dir

    items: list[str] = []
    rest = [a for a in argv if a != "--clear-cache"]
    while rest:
        arg = rest.pop(0)
        if arg == "-o" and rest:
            items += split_o(rest.pop(0))
        elif arg.startswith("--") and len(arg) > 2:
            items.append(arg[2:])
        else:
            raise UserError(f"unexpected argument {arg!r} (usage: {CLEAR_USAGE})")
    options = build_options(items)
    directory = options.cache_dir or default_cache_dir()
    if not os.path.isdir(directory):
        print(f"zarrfs: no disk cache at {directory}")
        return 0
    cache = DiskCache(directory, options.disk_cache_bytes)
    if not cache.usable:
        raise UserError(f"cannot clear the disk cache at {directory} (see above)")
    freed = cache.clear_sync()
    cache.close()
    print(f"zarrfs: removed the disk cache entries in {directory} ({freed} bytes)")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        if "--clear-cache" in argv:
            return clear_cache(argv)
        source, mountpoint, items, foreground = parse(argv)
        options = build_options(items, foreground=foreground)
        from .daemon import run

        return run(source, os.path.abspath(mountpoint), options)
    except UserError as e:
        daemon = sys.modules.get("zarrfs.daemon")  # it knows the mount's secrets, once loaded
        print(f"zarrfs: {daemon.redact(str(e)) if daemon else e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
