"""Mount control of the mounted (black-box) tests: run the zarrfs CLI, watch the mount table, unmount, check logs.

Nothing here imports zarrfs: the package is only ever reached through its command line.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ZARRFS = [sys.executable, "-m", "zarrfs"]

# How long the CLI may take to report a live mount: a cold Python start that imports numpy,
# trio and fsspec, on a machine busy with other tests.
MOUNT_TIMEOUT_S = 30.0
# How long a daemon may take to exit after its mount is gone.
EXIT_TIMEOUT_S = 15.0


# --------------------------------------------------------------------------- mount table


def _unescape_mount_field(text: str) -> str:
    """Undo the octal escapes of /proc/mounts (``\\040`` for a space, ...)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), text)


def mount_table() -> list[tuple[str, str, str]]:
    """(source, mountpoint, fstype) of every mount, read from /proc/mounts (no syscall on a mountpoint)."""
    rows = []
    with open("/proc/mounts", encoding="utf-8", errors="surrogateescape") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 3:
                rows.append((_unescape_mount_field(parts[0]), _unescape_mount_field(parts[1]), parts[2]))
    return rows


def is_mounted(path: os.PathLike | str) -> bool:
    target = os.path.abspath(os.fspath(path))
    return any(mp == target for _, mp, _ in mount_table())


def mounts_under(base: os.PathLike | str) -> list[str]:
    base = os.path.abspath(os.fspath(base)).rstrip("/") + "/"
    return [mp for _, mp, _ in mount_table() if mp.startswith(base)]


def wait_until(predicate, timeout_s: float, interval_s: float = 0.02) -> bool:
    deadline = time.monotonic() + timeout_s
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval_s)


def user_unmount(path: os.PathLike | str, busy_for_s: float = 3.0) -> subprocess.CompletedProcess:
    """``fusermount3 -u PATH`` as a user runs it, again while it says the mount is busy for at
    most BUSY_FOR_S: a mount or unmount of another FUSE file system at the same moment (an
    earlier test's daemon unmounted by its auto_unmount helper) can make it fail with EBUSY."""
    deadline = time.monotonic() + busy_for_s
    while True:
        r = subprocess.run(["fusermount3", "-u", os.fspath(path)], capture_output=True, text=True, timeout=30)
        if r.returncode == 0 or "busy" not in r.stderr or time.monotonic() > deadline:
            return r
        time.sleep(0.2)


def unmount(path: os.PathLike | str) -> str:
    """Unmount PATH if mounted: ``fusermount3 -u``, lazily (``-uz``) when busy. Returns what was done."""
    path = os.path.abspath(os.fspath(path))
    if not is_mounted(path):
        return "not mounted"
    r = subprocess.run(["fusermount3", "-u", path], capture_output=True, text=True, timeout=30)
    if r.returncode == 0 and wait_until(lambda: not is_mounted(path), 5):
        return "unmounted"
    subprocess.run(["fusermount3", "-uz", path], capture_output=True, text=True, timeout=30)
    if wait_until(lambda: not is_mounted(path), 5):
        return f"lazily unmounted (fusermount3 -u said: {r.stderr.strip()!r})"
    subprocess.run(["umount", "-l", path], capture_output=True, text=True, timeout=30)
    return "forced with umount -l"


def pids_serving(mountpoint: os.PathLike | str) -> list[int]:
    """Pids of zarrfs processes whose command line names MOUNTPOINT (the daemons the tests started)."""
    target = os.path.abspath(os.fspath(mountpoint))
    found = []
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        args = [a.decode("utf-8", "surrogateescape") for a in argv if a]
        if "zarrfs" in " ".join(args) and any(os.path.abspath(a) == target for a in args if a.startswith("/")):
            found.append(int(entry))
    return found


def pid_alive(pid: int) -> bool:
    """Whether PID runs (a zombie does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        return state != "Z"
    except OSError:
        return False


def check_fuse_available() -> str | None:
    """None when FUSE mounts can work here, else the reason."""
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse is missing"
    if shutil.which("fusermount3") is None:
        return "fusermount3 is not installed (apt install fuse3)"
    return None


# --------------------------------------------------------------------------- the mounter


@dataclass
class MountRecord:
    mountpoint: Path
    log_file: Path
    proc: subprocess.Popen | None = None  # set in foreground mode
    daemon_pids: list[int] = field(default_factory=list)


class Mounter:
    """Mounts SOURCEs with the zarrfs CLI into fresh mountpoints; ``close()`` undoes everything.

    Calling it: ``mounter(source, *opts, foreground=False) -> mountpoint``; each of ``opts``
    is one ``-o`` option (``"cache_size=1M"``). Every mount logs at info level to its
    own file; ``close()`` unmounts, waits for the daemons to exit and returns the
    problems found (daemons that outlived their mount, ERROR lines or tracebacks in
    a log when none were expected).
    """

    def __init__(self, workdir: Path, *, errors_expected: bool = False, tracebacks_expected: bool = False):
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.records: list[MountRecord] = []
        self.errors_expected = errors_expected
        self.tracebacks_expected = tracebacks_expected
        self._count = 0

    def expect_errors(self, tracebacks: bool = False) -> None:
        """Allow ERROR lines (and with ``tracebacks=True`` also tracebacks) in the daemons' logs."""
        self.errors_expected = True
        self.tracebacks_expected = self.tracebacks_expected or tracebacks

    def new_mountpoint(self) -> tuple[Path, Path]:
        """A fresh empty mountpoint and a log file path beside it."""
        n = self._count
        self._count += 1
        suffix = "" if n == 0 else f"-{n}"
        mnt = self.workdir / f"mnt{suffix}"
        mnt.mkdir()
        return mnt, self.workdir / f"zarrfs{suffix}.log"

    def adopt(self, mountpoint: Path, log_file: Path, proc: subprocess.Popen | None = None) -> MountRecord:
        """Register a mount made elsewhere so that ``close()`` cleans it up and checks its log."""
        rec = MountRecord(Path(mountpoint), Path(log_file), proc)
        self.records.append(rec)
        return rec

    def command(self, source, mountpoint: Path, log_file: Path, opts=(), foreground=False) -> list[str]:
        log_level = "info"
        extra = []
        for opt in opts:
            if opt.startswith("log_level="):
                log_level = opt.split("=", 1)[1]
            else:
                extra.append(opt)
        o = ",".join([f"log_file={log_file}", f"log_level={log_level}", *extra])
        cmd = [*ZARRFS, os.fspath(source), os.fspath(mountpoint), "-o", o]
        if foreground:
            cmd.append("-f")
        return cmd

    def __call__(self, source, *opts: str, foreground: bool = False) -> Path:
        import pytest

        problem = check_fuse_available()
        if problem:
            pytest.fail(f"cannot run mounted tests: {problem}")
        mnt, log = self.new_mountpoint()
        cmd = self.command(source, mnt, log, opts, foreground)
        rec = self.adopt(mnt, log)
        out_path = self.workdir / f"{mnt.name}.cli-output"
        with open(out_path, "wb") as out:
            # Files, not pipes: a daemon that kept inherited pipes open would hang us here.
            if foreground:
                rec.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
                ok = wait_until(lambda: is_mounted(mnt) or rec.proc.poll() is not None, MOUNT_TIMEOUT_S)
                if not is_mounted(mnt):
                    pytest.fail(
                        f"zarrfs -f did not mount {source} within {MOUNT_TIMEOUT_S}s "
                        f"(timed out: {not ok}, exit code {rec.proc.poll()})\n"
                        f"{_tail(out_path)}\nlog:\n{_tail(log)}"
                    )
                return mnt
            try:
                r = subprocess.run(
                    cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, timeout=MOUNT_TIMEOUT_S
                )
            except subprocess.TimeoutExpired:
                pytest.fail(
                    f"zarrfs did not return within {MOUNT_TIMEOUT_S}s: {cmd}\n{_tail(out_path)}\nlog:\n{_tail(log)}"
                )
        if r.returncode != 0:
            pytest.fail(f"zarrfs exited {r.returncode}: {cmd}\n{_tail(out_path)}\nlog:\n{_tail(log)}")
        if not wait_until(lambda: is_mounted(mnt), 10):
            pytest.fail(f"zarrfs exited 0 but {mnt} is not mounted\n{_tail(out_path)}\nlog:\n{_tail(log)}")
        rec.daemon_pids = pids_serving(mnt)
        return mnt

    def log_text(self, mountpoint: Path | None = None) -> str:
        rec = (
            self.records[-1]
            if mountpoint is None
            else next(r for r in self.records if r.mountpoint == Path(mountpoint))
        )
        try:
            return rec.log_file.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def close(self) -> list[str]:
        problems: list[str] = []
        for rec in self.records:
            how = unmount(rec.mountpoint)
            if rec.proc is not None:
                try:
                    code = rec.proc.wait(EXIT_TIMEOUT_S)
                    if code != 0:
                        problems.append(f"{rec.mountpoint}: foreground zarrfs exited {code} after fusermount3 -u")
                except subprocess.TimeoutExpired:
                    rec.proc.kill()
                    rec.proc.wait()
                    problems.append(
                        f"{rec.mountpoint}: foreground zarrfs still running {EXIT_TIMEOUT_S}s after unmount ({how})"
                    )
            pids = set(rec.daemon_pids) | set(pids_serving(rec.mountpoint))
            if pids and not wait_until(lambda: not any(pid_alive(p) for p in pids), EXIT_TIMEOUT_S, 0.05):  # noqa: B023
                alive = [p for p in pids if pid_alive(p)]
                for p in alive:
                    try:
                        os.kill(p, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                problems.append(
                    f"{rec.mountpoint}: daemon pid(s) {alive} still running {EXIT_TIMEOUT_S}s after unmount "
                    f"({how}); killed"
                )
            problems.extend(self._log_problems(rec))
        self.records.clear()
        return problems

    def _log_problems(self, rec: MountRecord) -> list[str]:
        try:
            text = rec.log_file.read_text(errors="replace")
        except FileNotFoundError:
            return []
        problems = []
        if "Traceback" in text and not self.tracebacks_expected:
            problems.append(f"{rec.log_file}: unexpected Traceback in the daemon log:\n{_excerpt(text, 'Traceback')}")
        if not self.errors_expected:
            errors = [ln for ln in text.splitlines() if " ERROR " in ln or " CRITICAL " in ln]
            if errors:
                problems.append(f"{rec.log_file}: unexpected ERROR lines in the daemon log:\n" + "\n".join(errors[:20]))
        return problems


def _tail(path: Path, n: int = 4000) -> str:
    try:
        return Path(path).read_text(errors="replace")[-n:]
    except FileNotFoundError:
        return f"({path} missing)"


def _excerpt(text: str, needle: str, n: int = 3000) -> str:
    i = text.find(needle)
    return text[max(0, i - 500) : i + n]


def log_lines_naming(log_text: str, key: str, levels=("WARNING", "ERROR", "CRITICAL")) -> list[str]:
    """Log lines at one of LEVELS that mention KEY (format ``<time> <LEVEL> <logger>: <message>``)."""
    return [ln for ln in log_text.splitlines() if key in ln and any(f" {lv} " in ln for lv in levels)]


def run_expecting_failure(cmd, mnt, workdir, timeout_s=20.0):
    """Run CMD to completion; if it mounts MNT instead of failing, unmount it and stop waiting.

    Returns (exit code, stdout, stderr, was mounted). Output goes through files so that a
    daemon wrongly left running cannot hold our pipes open.
    """
    out_p, err_p = workdir / "cli.stdout", workdir / "cli.stderr"
    with open(out_p, "wb") as out, open(err_p, "wb") as err:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=err)
    was_mounted = False
    try:
        deadline = time.monotonic() + timeout_s
        while proc.poll() is None and time.monotonic() < deadline:
            if mnt is not None and is_mounted(mnt):
                was_mounted = True
                break
            time.sleep(0.02)
        if mnt is not None and is_mounted(mnt):
            was_mounted = True
    finally:
        for mp in mounts_under(workdir):
            unmount(mp)
        try:
            code = proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait()
    return code, out_p.read_text(errors="replace"), err_p.read_text(errors="replace"), was_mounted


def pwrite_all(fd: int, data: bytes, offset: int) -> None:
    """os.pwrite until all of DATA is written (FUSE may take less than asked)."""
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        assert n > 0, f"pwrite at {offset} wrote {n} bytes"
        view, offset = view[n:], offset + n


def wait_exit(pids, timeout_s: float = EXIT_TIMEOUT_S) -> bool:
    """Wait until none of PIDS is alive."""
    return wait_until(lambda: not any(pid_alive(p) for p in pids), timeout_s, 0.05)


def unmount_and_wait(mounter: Mounter, mnt: Path) -> None:
    """Unmount a mount of MOUNTER and wait for its daemon to exit (so the store is final)."""
    rec = next(r for r in mounter.records if r.mountpoint == Path(mnt))
    pids = set(rec.daemon_pids) | set(pids_serving(mnt))
    r = subprocess.run(["fusermount3", "-u", os.fspath(mnt)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, f"fusermount3 -u {mnt}: {r.stderr.strip()}"
    assert wait_until(lambda: not is_mounted(mnt), 10), f"{mnt} still mounted after fusermount3 -u"
    if rec.proc is not None:
        rec.proc.wait(EXIT_TIMEOUT_S)
    assert wait_exit(pids), f"zarrfs daemon(s) {sorted(pids)} still running after unmounting {mnt}"


# --------------------------------------------------------------------------- failing store

# zarrfs's command line over a store whose writes fail when asked (see its docstring).
FAILING_STORE = Path(__file__).resolve().parent / "failing_store.py"


def mount_failing(mounter: Mounter, source: Path, env: dict[str, str], *opts: str):
    """Mount SOURCE through failing_store.py in the foreground; returns (mountpoint, process, log file)."""
    import pytest

    mnt, log = mounter.new_mountpoint()
    o = ",".join(["writable", f"log_file={log}", "log_level=info", *opts])
    cmd = [sys.executable, os.fspath(FAILING_STORE), os.fspath(source), os.fspath(mnt), "-f", "-o", o]
    out = open(mounter.workdir / f"{mnt.name}.cli-output", "wb")
    proc = subprocess.Popen(
        cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **env}
    )
    out.close()
    mounter.adopt(mnt, log, proc)
    if not wait_until(lambda: is_mounted(mnt) or proc.poll() is not None, MOUNT_TIMEOUT_S):
        pytest.fail(f"failing_store.py did not mount {source}")
    assert is_mounted(mnt), f"failing_store.py exited {proc.poll()}: {log.read_text() if log.exists() else ''}"
    return mnt, proc, log
