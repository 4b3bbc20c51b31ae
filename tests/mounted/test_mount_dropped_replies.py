"""A reply the kernel no longer waits for (a release answered after the unmount) is no
error of the daemon's: it logs it at debug level, never at ERROR."""

from __future__ import annotations

import errno
import os
import subprocess
import sys

from support import builders, mounting, oracles

# zarrfs whose release waits until its mount is gone before it answers: the race of a close
# just before an unmount, made certain (the kernel sends RELEASE after close(2) returns).
SLOW_RELEASE = """
import errno
import os
import sys

import trio

from zarrfs import fuse_ops
from zarrfs.cli import main

MOUNTPOINT = os.path.abspath(sys.argv[2])
answer = fuse_ops.ZarrOperations.release


def still_mounted() -> bool:
    with open("/proc/mounts") as f:
        return any(line.split()[1] == MOUNTPOINT for line in f)


async def release(self, fh):
    with trio.move_on_after(60):  # a test gone wrong still ends
        while still_mounted():
            await trio.sleep(0.02)
    return await answer(self, fh)


fuse_ops.ZarrOperations.release = release
sys.exit(main())
"""


def test_a_release_answered_after_the_unmount_is_logged_at_debug(mount, tmp_path):
    root = tmp_path / "ds.zarr"
    builders.build_root_array(root, 2)
    want = oracles.expected_for(root, "").npy
    script = tmp_path / "slow_release.py"
    script.write_text(SLOW_RELEASE)
    mnt, log = mount.new_mountpoint()
    cmd = mount.command(root, mnt, log, ["log_level=debug"], foreground=True)
    cmd = [sys.executable, os.fspath(script), *cmd[len(mounting.ZARRFS) :]]
    with open(tmp_path / "daemon.out", "wb") as out:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
    mount.adopt(mnt, log, proc)
    mounting.wait_until(lambda: mounting.is_mounted(mnt) or proc.poll() is not None, mounting.MOUNT_TIMEOUT_S)
    assert mounting.is_mounted(mnt), (tmp_path / "daemon.out").read_text(errors="replace")

    assert (mnt / "ds.npy").read_bytes() == want
    mounting.unmount_and_wait(mount, mnt)

    text = mount.log_text(mnt)
    # pyfuse3 says it, through libfuse's ENOENT from the write of the reply to /dev/fuse.
    dropped = f"pyfuse3: fuse_release(): fuse_reply_* failed with {os.strerror(errno.ENOENT)}"
    assert [ln for ln in text.splitlines() if ln.endswith(f" DEBUG {dropped}")], text[-3000:]
    assert not mounting.log_lines_naming(text, "fuse_reply_")  # at WARNING or ERROR
