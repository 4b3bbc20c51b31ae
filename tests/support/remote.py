"""Remote mounts on moto's S3 server (through benchmarks/latency_proxy.py or not): hierarchies put in the bucket, mount options, readers run with a time limit."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import zarr

from support import mounting, oracles
from support.s3 import BUCKET, CREDENTIALS

# How long a reader may take to end after its SIGINT before wait_or_describe reads where it waits.
STUCK_AFTER_S = 2.0


def s3_options(port: int, *extra: str) -> list[str]:
    """Mount options reaching the bucket on 127.0.0.1:PORT (moto's, or the proxy's), then EXTRA."""
    so = {"client_kwargs": {"endpoint_url": f"http://127.0.0.1:{port}"}, **CREDENTIALS}
    return ["storage_options=" + json.dumps(so), *extra]


def put_v3(fs, tmp_path: Path, name: str, groups: int, arrays: int, consolidated: bool) -> dict[str, np.ndarray]:
    """A v3 hierarchy written by zarr-python into the bucket: GROUPS groups of ARRAYS small arrays."""
    local = tmp_path / name
    root = zarr.open_group(str(local), mode="w", zarr_format=3)
    values = {}
    for g in range(groups):
        grp = root.create_group(f"g{g}")
        for a in range(arrays):
            x = np.arange(12, dtype="<i4").reshape(3, 4) + 100 * g + a
            arr = grp.create_array(f"a{a}", shape=x.shape, chunks=(2, 2), dtype=x.dtype)
            arr[:] = x
            values[f"g{g}/a{a}"] = x
    if consolidated:
        zarr.consolidate_metadata(str(local))
    fs.put(str(local), f"{BUCKET}/{name}", recursive=True)
    return values


def run_reader(cmd: list[str], limit_s: float, sigint_after_s: float | None = None) -> tuple[int | None, float, str]:
    """Run a reader: (exit code or None if still running after `limit_s`, then killed; seconds from
    its start or from the SIGINT sent `sigint_after_s` after it; stderr)."""
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    stuck = ""
    if sigint_after_s is not None:
        time.sleep(sigint_after_s)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        stuck = wait_or_describe(proc, STUCK_AFTER_S)
    try:
        _, err = proc.communicate(timeout=limit_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return None, time.monotonic() - t0, stuck
    return proc.returncode, time.monotonic() - t0, err.decode() + stuck


def wait_or_describe(proc: subprocess.Popen, seconds: float) -> str:
    """ "" if PROC ends within SECONDS, else where each of its tasks (and of the group it leads)
    waits in the kernel (/proc: its stack, wchan and pending signals), read while it still waits:
    what a test that failed on a reader ending late shows (a wait in the daemon, or in the kernel)."""
    try:
        proc.wait(seconds)
        return ""
    except subprocess.TimeoutExpired:
        pass
    lines = [f"\nstill running {seconds:g} s after the signal:"]
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            if int(d.name) != proc.pid and os.getpgid(int(d.name)) != proc.pid:  # it, or the group it leads
                continue
            for task in (d / "task").iterdir():
                status = dict(line.split(":", 1) for line in (task / "status").read_text().splitlines() if ":" in line)
                lines.append(
                    f"task {d.name}/{task.name} {(d / 'comm').read_text().strip()}: state{status['State']}, "
                    f"SigPnd{status['SigPnd']}, ShdPnd{status['ShdPnd']}, "
                    f"syscall {(task / 'syscall').read_text().strip()}, wchan {(task / 'wchan').read_text()}"
                )
                lines.append((task / "stack").read_text().rstrip())
        except (OSError, KeyError):
            continue
    return "\n".join(lines)


def read_in_child(path: Path, limit_s: float) -> tuple[int | None, float, str]:
    """Read a file whole in a Python child process (see run_reader)."""
    return run_reader([sys.executable, "-c", f"open({str(path)!r}, 'rb').read()"], limit_s)


def serving(fs, tmp_path, mount, proxy, name: str, groups: int, arrays: int, timeout_s: float):
    """A consolidated hierarchy (see put_v3) in the bucket, mounted through the proxy with
    `timeout`, its g0/a0 read: (mount point, values). Later errors are expected."""
    values = put_v3(fs, tmp_path, name, groups, arrays, consolidated=True)
    mnt = mount(f"s3://{BUCKET}/{name}", *s3_options(proxy.port, f"timeout={timeout_s}"))
    mount.expect_errors()
    assert (mnt / "g0" / "a0.npy").read_bytes() == oracles.npy_bytes(values["g0/a0"])
    return mnt, values


def assert_recovers(mnt: Path, values: dict, path: str) -> None:
    """Without a remount, PATH is read again (within 5 s: once the store answered the request
    that timed out) and holds its values."""
    assert mounting.wait_until(lambda: read_in_child(mnt / f"{path}.npy", 30)[0] == 0, 5)
    assert (mnt / f"{path}.npy").read_bytes() == oracles.npy_bytes(values[path])
