"""A store that stops answering or refuses, as a reader meets it: EIO within `timeout` (not once per
kernel retry), recovery without remount, what SIGINT does; behind benchmarks/latency_proxy.py and moto."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from support import mounting, oracles
from support.remote import STUCK_AFTER_S, assert_recovers, put_v3, run_reader, s3_options, serving, wait_or_describe
from support.s3 import BUCKET

# The `timeout` these tests mount with, and what a reader may wait past it: the bound is
# "EIO within timeout" (plus a FUSE round trip and scheduling on a loaded machine). Twice
# the timeout (a second bounded wait for the kernel's retry) is past the bound.
TIMEOUT_S = 4
MARGIN_S = 2.5


def test_silent_store_gives_eio_within_timeout_not_per_retry(s3, proxy, tmp_path, mount):
    _, fs = s3
    mnt, values = serving(fs, tmp_path, mount, proxy, "silent1.zarr", 2, 2, TIMEOUT_S)
    proxy.set_mode("silent")
    code, seconds, err = run_reader(["cat", str(mnt / "g0" / "a1.npy")], 3 * TIMEOUT_S)
    assert code is not None and code != 0 and "Input/output error" in err, (code, err)
    assert seconds <= TIMEOUT_S + MARGIN_S, f"EIO after {seconds:.1f} s with timeout={TIMEOUT_S}"
    assert "did not answer within" in mount.log_text()
    proxy.set_mode("pass")
    # Back at once for what was not asked while the store was silent, and within a second or two
    # for the array whose request timed out.
    assert (mnt / "g1" / "a0.npy").read_bytes() == oracles.npy_bytes(values["g1/a0"])
    assert_recovers(mnt, values, "g0/a1")


# The "interrupting the reader (SIGINT) ends its wait promptly": within this, against a
# `timeout` far longer, so that a wait that ends only at the timeout cannot pass.
PROMPT_S = 2.0
LONG_TIMEOUT_S = 20
LOG_TAIL = 6000  # of the daemon's debug log, in the message of a reader that ended late


@pytest.fixture
def sigint_taken():
    """The readers a test starts take SIGINT as a terminal's foreground job does. A suite started
    in the background by a shell without job control (`nohup scripts/test.sh &`) runs with SIGINT
    ignored, which every child inherits: cat would then never see its Ctrl-C. A handler in this
    process is reset to the default action in each child's exec."""
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, old)


def test_sigint_ends_a_wait_on_a_silent_store_promptly(s3, proxy, tmp_path, mount, sigint_taken):
    _, fs = s3
    values = put_v3(fs, tmp_path, "sigint.zarr", 4, 2, consolidated=False)
    mnt = mount(
        f"s3://{BUCKET}/sigint.zarr",
        *s3_options(proxy.port, f"timeout={LONG_TIMEOUT_S}", "metadata_ttl=inf", "log_level=debug"),
    )
    for g in ("g0", "g1"):
        assert sorted(p.name for p in (mnt / g).iterdir()) == ["a0.npy", "a1.npy"]
    proxy.set_mode("silent")
    readers = {
        "cat": ["cat", str(mnt / "g0" / "a0.npy")],  # default SIGINT: fatal, the page wait is killable
        "python read": [sys.executable, "-c", f"open({str(mnt / 'g1' / 'a0.npy')!r}, 'rb').read()"],  # catches it
        "dd iflag=direct": ["dd", f"if={mnt / 'g1' / 'a1.npy'}", "of=/dev/null", "iflag=direct", "bs=4096"],
        "ls of a group not listed yet": ["ls", "-l", str(mnt / "g2")],
        "python listdir": [sys.executable, "-c", f"import os; os.listdir({str(mnt / 'g3')!r})"],
    }
    for what, cmd in readers.items():
        code, seconds, err = run_reader(cmd, LONG_TIMEOUT_S + 10, sigint_after_s=1.5)
        assert code is not None and code != 0, (what, code, err)
        assert seconds <= PROMPT_S, (
            f"{what}: ended {seconds:.1f} s after SIGINT (timeout={LONG_TIMEOUT_S})"
            f"{err}\nlog:\n{mount.log_text()[-LOG_TAIL:]}"
        )
    proxy.set_mode("pass")
    assert mounting.wait_until(lambda: run_reader(["cat", str(mnt / "g0" / "a0.npy")], 30)[0] == 0, 5)
    assert (mnt / "g2" / "a1.npy").read_bytes() == oracles.npy_bytes(values["g2/a1"])


# A reader that did not open the file it reads, in a process group of its own: (what, command).
# FUSE names no process in a read, and the one that opened the file has no signal pending here.
CHILD_PREAD = """
import mmap, os, signal, sys
signal.signal(signal.SIGINT, signal.SIG_IGN)  # the opener: only its child takes Ctrl-C
fd = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECT)
child = os.fork()
if child == 0:
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.preadv(fd, [mmap.mmap(-1, 1 << 16)], 0)
    os._exit(0)
sys.exit(os.waitstatus_to_exitcode(os.waitpid(child, 0)[1]))
"""


def test_sigint_ends_the_wait_of_a_reader_that_did_not_open_the_file(s3, proxy, tmp_path, mount, sigint_taken):
    _, fs = s3
    values = put_v3(fs, tmp_path, "sigchild.zarr", 1, 2, consolidated=True)
    mnt = mount(
        f"s3://{BUCKET}/sigchild.zarr",
        *s3_options(proxy.port, f"timeout={LONG_TIMEOUT_S}", "metadata_ttl=inf", "log_level=debug"),
    )
    assert sorted(p.name for p in (mnt / "g0").iterdir()) == ["a0.npy", "a1.npy"]
    proxy.set_mode("silent")
    readers = {
        "a forked child's pread": [sys.executable, "-c", CHILD_PREAD, str(mnt / "g0" / "a0.npy")],
        # The shell opens the file; dd (which catches SIGINT) reads it from its stdin.
        "dd reading what its shell opened": [
            "bash",
            "-c",
            f"exec 3<{mnt / 'g0' / 'a1.npy'}; dd bs=65536 count=4 of=/dev/null <&3; exit $?",
        ],
    }
    for what, cmd in readers.items():
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
        time.sleep(1.5)
        t0 = time.monotonic()
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: to the whole foreground group
        stuck = wait_or_describe(proc, STUCK_AFTER_S)
        try:
            proc.communicate(timeout=LONG_TIMEOUT_S + 10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
        seconds = time.monotonic() - t0
        assert proc.returncode != 0, what
        assert seconds <= PROMPT_S, (
            f"{what}: ended {seconds:.1f} s after SIGINT (timeout={LONG_TIMEOUT_S})"
            f"{stuck}\nlog:\n{mount.log_text()[-LOG_TAIL:]}"
        )
    proxy.set_mode("pass")
    assert mounting.wait_until(lambda: run_reader(["cat", str(mnt / "g0" / "a0.npy")], 30)[0] == 0, 5)
    assert (mnt / "g0" / "a1.npy").read_bytes() == oracles.npy_bytes(values["g0/a1"])


def _mount_cli(mount, proxy, name: str, timeout_s: int) -> tuple[int, float, str]:
    """Run the mount command (daemon mode) against the proxy: (exit code, seconds, stderr)."""
    mnt, log = mount.new_mountpoint()
    cmd = mount.command(f"s3://{BUCKET}/{name}", mnt, log, s3_options(proxy.port, f"timeout={timeout_s}"))
    t0 = time.monotonic()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if r.returncode == 0:
        mount.adopt(mnt, log)
    return r.returncode, time.monotonic() - t0, r.stderr


def test_mount_of_a_silent_store_fails_within_timeout_naming_it(s3, proxy, tmp_path, mount):
    _, fs = s3
    put_v3(fs, tmp_path, "startsilent.zarr", 1, 1, consolidated=True)
    proxy.set_mode("silent")
    code, seconds, err = _mount_cli(mount, proxy, "startsilent.zarr", TIMEOUT_S)
    assert code != 0 and len(err.splitlines()) == 1 and "timed out" in err, err
    assert err.startswith(f"zarrfs: s3://{BUCKET}/startsilent.zarr: "), err
    assert seconds <= TIMEOUT_S + 2 * MARGIN_S, f"the mount command waited {seconds:.1f} s with timeout={TIMEOUT_S}"


def test_mount_of_a_refusing_store_names_it(s3, proxy, tmp_path, mount):
    _, fs = s3
    put_v3(fs, tmp_path, "startrefused.zarr", 1, 1, consolidated=True)
    proxy.set_mode("refuse")
    code, seconds, err = _mount_cli(mount, proxy, "startrefused.zarr", 30)
    assert code != 0 and len(err.splitlines()) == 1 and "connection refused" in err, err
    assert seconds <= 10, f"a refused connection took {seconds:.1f} s to report"  # the bound


def test_mount_of_a_store_that_denies_access_names_it(s3, proxy, tmp_path, mount):
    """S3's 403 AccessDenied (the proxy answers it as a bucket policy would): one line that says so."""
    _, fs = s3
    put_v3(fs, tmp_path, "startdenied.zarr", 1, 1, consolidated=True)
    proxy.set_mode("deny")
    code, seconds, err = _mount_cli(mount, proxy, "startdenied.zarr", 30)
    assert code != 0 and len(err.splitlines()) == 1 and "access denied" in err, err
    assert err.startswith(f"zarrfs: s3://{BUCKET}/startdenied.zarr: "), err


def test_access_denied_during_a_read_is_eio_naming_the_key(s3, proxy, tmp_path, mount):
    _, fs = s3
    mnt, values = serving(fs, tmp_path, mount, proxy, "denied.zarr", 1, 2, TIMEOUT_S)
    proxy.set_mode("deny")
    code, _, err = run_reader(["cat", str(mnt / "g0" / "a1.npy")], 3 * TIMEOUT_S)
    assert code is not None and code != 0 and "Input/output error" in err, (code, err)
    lines = mounting.log_lines_naming(mount.log_text(), "g0/a1/c/")
    assert any("access denied" in line for line in lines), mount.log_text()[-3000:]
    proxy.set_mode("pass")  # allowed again: read again without a remount
    assert_recovers(mnt, values, "g0/a1")
