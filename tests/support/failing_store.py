"""An fsspec file system over the local disk whose ``pipe_file`` fails on chosen calls, and a zarrfs launcher using it.

Imported, it registers the protocol ``failfile`` with fsspec (``failfile:///abs/path``).
Run as a script, ``python tests/support/failing_store.py SOURCE MOUNTPOINT [zarrfs arguments]``
runs zarrfs's own command line (``zarrfs.cli.main``) with a local SOURCE given as
``failfile://SOURCE``. zarrfs writes a non-local store with ``pipe_file`` (see
``Store.set_sync``) and streams plain files through ``open(key, "wb")``, so every chunk,
metadata and plain-file write goes through the failure switch; reads, listings and
removals are the local file system's own.

The switch is read from the environment at each call, so a test sets it per daemon:

- ``FAILFILE_FAIL_AT``: comma-separated 1-based numbers of the counted ``pipe_file``
  calls (and opens for writing) that fail with OSError(EIO) and write nothing (a failed
  PUT); empty: none fail.
- ``FAILFILE_MATCH``: only calls whose path contains this text are counted (default: all).
- ``FAILFILE_CALLS``: a file to which each ``pipe_file`` call appends ``N PATH ok|FAILED``.

A successful ``pipe_file`` writes a temporary file and renames it over the key, as an
object store replaces an object whole: a reader sees the old value or the new one.
"""

from __future__ import annotations

import errno
import os
import sys
import threading

import fsspec
from fsspec.implementations.local import LocalFileSystem
from fsspec.spec import AbstractFileSystem
from fsspec.utils import stringify_path

PROTOCOL = "failfile"


class FailingFileSystem(AbstractFileSystem):
    """The local file system, reached through ``failfile://``, with a failure switch on ``pipe_file``."""

    protocol = PROTOCOL
    root_marker = "/"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.local = LocalFileSystem()
        self._lock = threading.Lock()
        self._counted = 0

    @classmethod
    def _strip_protocol(cls, path):
        path = stringify_path(path)
        if path.startswith(PROTOCOL + "://"):
            path = path[len(PROTOCOL) + 3 :]
        return LocalFileSystem._strip_protocol(path)

    def _local(self, path) -> str:
        return self._strip_protocol(path)

    # --- reads, listings, removals: the local file system's -----------------------------

    def ls(self, path, detail=True, **kwargs):
        return self.local.ls(self._local(path), detail=detail, **kwargs)

    def info(self, path, **kwargs):
        return self.local.info(self._local(path), **kwargs)

    def cat_file(self, path, start=None, end=None, **kwargs):
        return self.local.cat_file(self._local(path), start=start, end=end, **kwargs)

    def _open(self, path, mode="rb", **kwargs):
        if "w" in mode:
            self._switch(self._local(path))
        return self.local._open(self._local(path), mode=mode, **kwargs)

    def rm_file(self, path):
        self.local.rm_file(self._local(path))

    def rm(self, path, recursive=False, maxdepth=None):
        self.local.rm(self._local(path), recursive=recursive, maxdepth=maxdepth)

    def mkdir(self, path, create_parents=True, **kwargs):
        self.local.mkdir(self._local(path), create_parents=create_parents, **kwargs)

    def makedirs(self, path, exist_ok=False):
        self.local.makedirs(self._local(path), exist_ok=exist_ok)

    # --- writes: through the switch -----------------------------------------------------

    def pipe_file(self, path, value, mode="overwrite", **kwargs):
        local = self._local(path)
        self._switch(local)
        directory = os.path.dirname(local)
        os.makedirs(directory, exist_ok=True)
        tmp = os.path.join(directory, f".{os.path.basename(local)}.failfile-{os.getpid()}-{threading.get_ident()}")
        with open(tmp, "wb") as f:
            f.write(bytes(value))
        os.replace(tmp, local)

    def _switch(self, local: str) -> None:
        """Count a write of `local`, record it, and fail it (OSError EIO) if the switch says so."""
        match = os.environ.get("FAILFILE_MATCH", "")
        fail = False
        with self._lock:
            if match in local:
                self._counted += 1
                fail_at = {int(n) for n in os.environ.get("FAILFILE_FAIL_AT", "").split(",") if n.strip()}
                fail = self._counted in fail_at
                n = self._counted
            else:
                n = 0
        record = os.environ.get("FAILFILE_CALLS")
        if record:
            with open(record, "a") as f:
                f.write(f"{n} {local} {'FAILED' if fail else 'ok'}\n")
        if fail:
            raise OSError(errno.EIO, f"failfile: injected failure of write #{n}", local)

    def _pipe_file(self, path, value, **kwargs):  # the name async file systems use
        self.pipe_file(path, value, **kwargs)


fsspec.register_implementation(PROTOCOL, FailingFileSystem, clobber=True)


def main(argv: list[str]) -> int:
    """zarrfs's command line with a local SOURCE turned into a ``failfile://`` URL."""
    if not argv:
        print("usage: failing_store.py SOURCE MOUNTPOINT [zarrfs arguments]", file=sys.stderr)
        return 2
    source = argv[0]
    if "://" not in source:
        source = f"{PROTOCOL}://{os.path.abspath(source)}"
    from zarrfs.cli import main as zarrfs_main

    return zarrfs_main([source, *argv[1:]])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
