"""The command line: `zarrfs SOURCE MOUNTPOINT [-f] [-o OPTIONS] [--OPTION[=VALUE]]`; one line per user error."""

from __future__ import annotations

import argparse
import os
import sys

from . import __version__
from .errors import UserError
from .options import TREE, build_options, options_help, options_man, split_o

USAGE = "zarrfs SOURCE MOUNTPOINT [-f] [-o OPTION[,OPTION...]] [--OPTION[=VALUE] ...]"


class _Parser(argparse.ArgumentParser):
    """argparse that reports a usage error as one UserError line instead of exiting."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UserError(f"{message} (usage: {USAGE})")


class _ManAction(argparse.Action):
    def __init__(self, option_strings: list[str], dest: str, **kwargs: object) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help=kwargs.get("help"))

    def __call__(self, parser: argparse.ArgumentParser, *args: object) -> None:
        sys.stdout.write(options_man(__version__))
        parser.exit()


def parse(argv: list[str]) -> tuple[str, str, list[str], bool]:
    parser = _Parser(
        prog="zarrfs", usage=USAGE, formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Mount a Zarr hierarchy: groups as directories, arrays as .npy files.",
        epilog="the tree of a mount (README: The tree):\n" + TREE + "\n\n"
               "mount options (-o NAME[=VALUE] or --NAME[=VALUE]):\n" + options_help() + "\n\n"
               "signals: SIGTERM/SIGINT unmount; SIGUSR1 switches debug logging on and off.\n"
               "unmount with: fusermount3 -u MOUNTPOINT (or umount as root)")
    parser.add_argument("source", metavar="SOURCE", help="local path or fsspec URL of the store")
    parser.add_argument("mountpoint", metavar="MOUNTPOINT", help="an empty directory")
    parser.add_argument("-f", "--foreground", action="store_true", help="stay in the foreground")
    parser.add_argument("-o", dest="o", action="append", default=[], metavar="OPTIONS",
                        help="comma-separated options")
    parser.add_argument("--version", action="version", version=f"zarrfs {__version__}")
    parser.add_argument("--man", action=_ManAction, help="print the zarrfs(1) manual page (roff) and exit")
    args, extra = parser.parse_known_args(argv)
    items = [i for o in args.o for i in split_o(o)]
    for flag in extra:
        if not flag.startswith("--") or len(flag) < 3:
            raise UserError(f"unexpected argument {flag!r} (usage: {USAGE})")
        items.append(flag[2:])
    return args.source, args.mountpoint, items, args.foreground




def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        source, mountpoint, items, foreground = parse(argv)
        options = build_options(items, foreground=foreground)
        from .daemon import run  # pyfuse3 is imported only once the command line is valid

        return run(source, os.path.abspath(mountpoint), options)
    except UserError as e:
        daemon = sys.modules.get("zarrfs.daemon")  # it knows the mount's secrets, once loaded
        print(f"zarrfs: {daemon.redact(str(e)) if daemon else e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
