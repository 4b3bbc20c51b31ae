#!/usr/bin/env python3
"""The ceiling of a Python FUSE server: pyfuse3 serving files of given sizes from memory.

``empty_server.py [--push THREADS] MOUNTPOINT SIZE [SIZE...]`` mounts files ``f0``, ``f1``,
... of those byte sizes (read-only, zarrfs's mount options: keep_cache, the kernel's read-ahead
raised to 1 MiB) and serves every read as a memoryview slice of one buffer; it unmounts on
SIGTERM or SIGINT. ``scripts/bench.py`` measures zarrfs against it in the same run.

With ``--push``, the first open of a file also starts THREADS threads that store the whole file
in the kernel's page cache (``pyfuse3.notify_store``, PUSH_BYTES at a time, each thread every
THREADS-th piece) while the reader reads: the bytes a reader then finds cached never reach the
server as reads. ``scripts/bench_push.py`` measures what that gains. Never imports zarrfs.
"""

from __future__ import annotations

import argparse
import errno
import os
import signal
import stat
import sys
import threading

import pyfuse3
import trio

READ_AHEAD_KB = 1024  # what zarrfs's daemon writes to the mount's bdi (1 MiB requests)
PUSH_BYTES = 4 << 20  # one notify_store: whole pages but for the file's last
PUSH_JOIN_S = 10.0


class Empty(pyfuse3.Operations):
    def __init__(self, sizes: list[int], push_threads: int = 0) -> None:
        super().__init__()
        self.sizes = sizes
        self.buf = memoryview(bytearray(max(sizes)))  # touched: bytearray zero-fills
        self.push_threads = push_threads
        self.pushed: set[int] = set()
        self.pushers: list[threading.Thread] = []

    def _attr(self, inode: int) -> pyfuse3.EntryAttributes:
        a = pyfuse3.EntryAttributes()
        a.st_ino = inode
        a.entry_timeout = a.attr_timeout = 60.0
        if inode == pyfuse3.ROOT_INODE:
            a.st_mode, a.st_nlink = stat.S_IFDIR | 0o555, 2
        else:
            a.st_mode, a.st_nlink, a.st_size = stat.S_IFREG | 0o444, 1, self.sizes[inode - 2]
        a.st_blksize = 1 << 20
        return a

    async def getattr(self, inode, ctx=None):
        return self._attr(inode)

    async def lookup(self, parent, name, ctx=None):
        n = name.decode()
        if parent != pyfuse3.ROOT_INODE or not n.startswith("f") or not n[1:].isdigit() or int(n[1:]) >= len(self.sizes):
            raise pyfuse3.FUSEError(errno.ENOENT)
        return self._attr(int(n[1:]) + 2)

    async def opendir(self, inode, ctx):
        return inode

    async def readdir(self, fh, start, token):
        for i in range(start, len(self.sizes)):
            if not pyfuse3.readdir_reply(token, f"f{i}".encode(), self._attr(i + 2), i + 1):
                return

    async def open(self, inode, flags, ctx):
        if self.push_threads and inode not in self.pushed:
            self.pushed.add(inode)
            for k in range(self.push_threads):
                self.pushers.append(threading.Thread(target=self.push, args=(inode, k), daemon=True))
                self.pushers[-1].start()
        return pyfuse3.FileInfo(fh=inode, keep_cache=True)

    def push(self, inode: int, k: int) -> None:
        """Store pieces K, K + threads, ... of the file in the page cache. A worker thread: a
        piece whose pages a read is filling waits for its reply, which the main loop sends."""
        size, step = self.sizes[inode - 2], PUSH_BYTES * self.push_threads
        try:
            for at in range(k * PUSH_BYTES, size, step):
                pyfuse3.notify_store(inode, at, self.buf[at:min(size, at + PUSH_BYTES)])
        except OSError as e:  # unmounted meanwhile
            print(f"empty_server: push of inode {inode} stopped: {e}", file=sys.stderr)

    async def read(self, fh, off, size):
        end = min(off + size, self.sizes[fh - 2])
        return self.buf[off:end] if off < end else b""


async def serve(mnt: str) -> None:
    async with trio.open_nursery() as nursery:
        async def stop() -> None:
            with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                async for _ in signals:
                    pyfuse3.terminate()
                    return

        def tune() -> None:
            dev = os.stat(mnt).st_dev
            with open(f"/sys/class/bdi/{os.major(dev)}:{os.minor(dev)}/read_ahead_kb", "w") as f:
                f.write(str(READ_AHEAD_KB))

        nursery.start_soon(stop)
        nursery.start_soon(trio.to_thread.run_sync, tune)
        await pyfuse3.main()
        nursery.cancel_scope.cancel()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--push", type=int, default=0, metavar="THREADS")
    parser.add_argument("mountpoint")
    parser.add_argument("sizes", type=int, nargs="+")
    args = parser.parse_args()
    opts = set(pyfuse3.default_options) | {"fsname=empty", "ro"}
    ops = Empty(args.sizes, args.push)
    pyfuse3.init(ops, args.mountpoint, opts)
    try:
        trio.run(serve, args.mountpoint)
    finally:
        for t in ops.pushers:  # not past the session's end (a push waiting for a read's pages: bounded)
            t.join(PUSH_JOIN_S)
        pyfuse3.close(unmount=True)


if __name__ == "__main__":
    main()
