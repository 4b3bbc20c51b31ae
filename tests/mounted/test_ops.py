"""Operations, for real: the system install (scripts/install.sh) run by `env -i mount -t fuse.zarrfs` and
an fstab line, the shipped systemd units, Type=notify readiness, logging destinations, SIGUSR1, secrets
kept out of logs, start-up errors that name their cause, fsname/df, store times under rsync, dead mounts.
"""

from __future__ import annotations

import errno
import os
import re
import signal
import socket
import stat
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from support import REPO, builders, mounting, oracles

INSTALL = REPO / "scripts" / "install.sh"
PREFIX = Path("/opt/zarrfs")
BIN = Path("/usr/local/bin/zarrfs")
UNITS = sorted((REPO / "systemd").glob("*.*"))
# What systemd-analyze security scored the template unit once hardened (9.6 UNSAFE before).
SECURITY_SCORE_MAX = 5.0


def _need_fuse() -> None:
    problem = mounting.check_fuse_available()
    if problem:
        pytest.fail(f"mounted tests need FUSE: {problem}", pytrace=False)


@pytest.fixture(scope="module")
def installed():
    """scripts/install.sh run (without extras: local stores only); cached by its own stamps."""
    r = subprocess.run(
        ["bash", os.fspath(INSTALL)],
        capture_output=True,
        text=True,
        timeout=900,
        env={**{k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}, "ZARRFS_EXTRAS": ""},
        stdin=subprocess.DEVNULL,
    )
    assert r.returncode == 0, f"install.sh failed:\n{r.stdout}\n{r.stderr}"
    return r.stdout


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    import zarr

    root = tmp_path_factory.mktemp("ops") / "ops.zarr"
    zarr.open_group(os.fspath(root), mode="w", zarr_format=3)
    builders.create_array(
        root, builders.ArraySpec("g/x", "float64", (200, 150), (64, 64), "zstd"), 3, np.random.default_rng(11)
    )
    builders.create_array(root, builders.ArraySpec("y", "int32", (1000,), (128,), "none"), 3, np.random.default_rng(12))
    return root


def _env_i(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["env", "-i", *args], capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
    )


def _mount_row(mnt: Path) -> tuple[str, str, str] | None:
    return next((row for row in mounting.mount_table() if row[1] == os.fspath(mnt)), None)


def _unmount_all(*mnts: Path) -> None:
    for m in mnts:
        mounting.unmount(m)


# --------------------------------------------------------------------------- install and mount(8)


def test_install_is_idempotent(installed):
    assert BIN.is_symlink() and os.readlink(BIN) == os.fspath(PREFIX / "bin" / "zarrfs")
    r = subprocess.run(
        ["bash", os.fspath(INSTALL)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "ZARRFS_EXTRAS": ""},
        stdin=subprocess.DEVNULL,
    )
    assert r.returncode == 0, r.stderr
    assert "up to date" in r.stdout, r.stdout
    man = Path("/usr/local/share/man/man1/zarrfs.1").read_text()
    assert man.startswith(".TH ZARRFS 1")
    cited = set(re.findall(r"docs/[A-Z]+\.md", man))  # what the manual sends its reader to is installed
    assert cited and all((Path("/usr/local/share/doc/zarrfs") / c).is_file() for c in cited), cited
    # the installed copy is this work tree's
    r = _env_i(os.fspath(BIN), "--help")
    assert r.returncode == 0 and "storage_options_file=PATH" in r.stdout, r.stderr


def test_env_i_mount_and_umount(installed, store, tmp_path):
    """`mount -t fuse.zarrfs` with an empty environment (mount.fuse3 runs the program without PATH)."""
    _need_fuse()
    mnt, log = tmp_path / "mnt", tmp_path / "zarrfs.log"
    mnt.mkdir()
    try:
        r = _env_i(
            "/usr/bin/mount",
            "-t",
            "fuse.zarrfs",
            os.fspath(store),
            os.fspath(mnt),
            "-o",
            f"log_file={log},log_level=info",
        )
        assert r.returncode == 0, f"{r.stderr}\n{log.read_text() if log.exists() else ''}"
        assert (mnt / "g" / "x.npy").read_bytes() == oracles.expected_for(store, "g/x").npy
        source, _, fstype = _mount_row(mnt)
        assert (source, fstype) == (os.fspath(store), "fuse.zarrfs"), "mount must show SOURCE, not 'zarrfs'"
        st = os.statvfs(mnt)
        stored = sum(p.stat().st_size for p in store.rglob("*") if p.is_file())
        assert st.f_blocks * st.f_frsize >= stored > 0, "df must show the stored bytes as used"
        pids = mounting.pids_serving(mnt)
        r = _env_i("/usr/bin/umount", os.fspath(mnt))
        assert r.returncode == 0, r.stderr
        assert not mounting.is_mounted(mnt)
        assert mounting.wait_exit(pids), "daemon outlived umount"
    finally:
        _unmount_all(mnt)
    assert "Traceback" not in log.read_text()


def test_fstab_line(installed, store, tmp_path):
    """An /etc/fstab line with the usual network-mount options, mounted by `mount MOUNTPOINT` alone."""
    _need_fuse()
    mnt, log = tmp_path / "mnt", tmp_path / "zarrfs.log"
    mnt.mkdir()
    fstab = tmp_path / "fstab"
    fstab.write_text(
        f"{store} {mnt} fuse.zarrfs _netdev,nofail,allow_other,uid=1234,gid=2345,umask=027,"
        f"x-systemd.automount,x-systemd.idle-timeout=600,cache_size=64M,log_file={log} 0 0\n"
    )
    try:
        r = _env_i("/usr/bin/mount", "-T", os.fspath(fstab), os.fspath(mnt))
        assert r.returncode == 0, f"{r.stderr}\n{log.read_text() if log.exists() else ''}"
        st = os.stat(mnt / "g" / "x.npy")
        assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (1234, 2345, 0o440)
        assert "allow_other" in next(ln for ln in Path("/proc/mounts").read_text().splitlines() if f" {mnt} " in ln)
        r = _env_i("/usr/bin/umount", os.fspath(mnt))
        assert r.returncode == 0, r.stderr
    finally:
        _unmount_all(mnt)


# --------------------------------------------------------------------------- systemd


def test_units_verify(installed):
    """Every shipped unit passes `systemd-analyze verify` (with zarrfs and its man page installed)."""
    assert {u.name for u in UNITS} >= {"zarrfs@.service", "mnt-zarr.mount", "mnt-zarr.automount"}
    r = subprocess.run(
        ["systemd-analyze", "verify", *map(os.fspath, UNITS)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO / "systemd",
    )
    assert r.returncode == 0 and not r.stderr.strip(), r.stderr
    unit = (REPO / "systemd" / "zarrfs@.service").read_text()
    assert re.search(r"^Type=notify$", unit, re.M) and re.search(r"^WantedBy=remote-fs.target$", unit, re.M)
    for u in UNITS:
        if u.suffix in (".mount", ".automount"):
            assert "WantedBy=remote-fs.target" in u.read_text(), u


def test_unit_security_score():
    r = subprocess.run(
        [
            "systemd-analyze",
            "security",
            "--offline=true",
            "--no-pager",
            os.fspath(REPO / "systemd" / "zarrfs@.service"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    m = re.search(r"Overall exposure level for \S+: ([\d.]+)", r.stdout + r.stderr)
    assert m, r.stdout[-2000:] + r.stderr
    assert float(m.group(1)) <= SECURITY_SCORE_MAX, m.group(0)


def _notify_socket(tmp_path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(os.fspath(tmp_path / "notify.sock"))
    sock.settimeout(mounting.MOUNT_TIMEOUT_S)
    return sock


def test_notify_ready_then_stopping(store, tmp_path):
    """Type=notify: READY=1 arrives once the mount answers; STOPPING=1 on SIGTERM, then exit 0."""
    _need_fuse()
    mnt, log = tmp_path / "mnt", tmp_path / "zarrfs.log"
    mnt.mkdir()
    sock = _notify_socket(tmp_path)
    env = {**os.environ, "NOTIFY_SOCKET": os.fspath(tmp_path / "notify.sock")}
    proc = subprocess.Popen(
        [*mounting.ZARRFS, os.fspath(store), os.fspath(mnt), "-f", "-o", f"log_file={log}"],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        try:
            first = sock.recv(4096).decode()
        except TimeoutError:
            pytest.fail(f"no READY=1 within {mounting.MOUNT_TIMEOUT_S}s:\n{log.read_text()}")
        assert "READY=1" in first.split("\n"), first
        assert f"MAINPID={proc.pid}" in first.split("\n"), first
        # no polling: the mount answers the moment READY=1 is there
        assert mounting.is_mounted(mnt) and sorted(os.listdir(mnt)) == ["g", "y.npy"]
        proc.send_signal(signal.SIGTERM)
        assert "STOPPING=1" in sock.recv(4096).decode().split("\n")
        assert proc.wait(mounting.EXIT_TIMEOUT_S) == 0
        assert not mounting.is_mounted(mnt)
    finally:
        sock.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        _unmount_all(mnt)


# --------------------------------------------------------------------------- logging


def test_daemon_logs_to_default_file_without_dev_log(store, tmp_path):
    """Daemonized, no log_file, no /dev/log: the log is a file the start-up line names (root: /var/log/zarrfs.log)."""
    _need_fuse()
    assert not os.path.exists("/dev/log"), "this test needs a machine without a syslog socket"
    assert os.geteuid() == 0
    default = Path("/var/log/zarrfs.log")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    try:
        r = subprocess.run(
            [*mounting.ZARRFS, os.fspath(store), os.fspath(mnt)],
            capture_output=True,
            text=True,
            timeout=mounting.MOUNT_TIMEOUT_S,
            stdin=subprocess.DEVNULL,
        )
        assert r.returncode == 0, r.stderr
        assert r.stderr == ""
        lines = [ln for ln in default.read_text(errors="replace").splitlines() if f" on {mnt};" in ln]
        assert lines and f"log: {default}" in lines[-1], lines
    finally:
        _unmount_all(mnt)


@pytest.mark.parametrize("foreground", [False, True], ids=["daemon", "foreground"])
def test_bad_log_file_is_one_line(store, tmp_path, foreground):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    bad = "/nonexistent/dir/x.log"
    cmd = [*mounting.ZARRFS, os.fspath(store), os.fspath(mnt), "-o", f"log_file={bad}"] + (["-f"] if foreground else [])
    code, out, err, was_mounted = mounting.run_expecting_failure(cmd, mnt, tmp_path)
    assert not was_mounted and code == 1
    assert err.splitlines() == [f"zarrfs: log_file={bad}: No such file or directory"], err


def test_sigusr1_toggles_debug(mount, store):
    _need_fuse()
    mnt = mount(store, "log_level=warning")
    pid = mounting.pids_serving(mnt)[0]

    def debug_lines() -> list[str]:
        return [ln for ln in mount.log_text(mnt).splitlines() if " DEBUG " in ln]

    assert not (mnt / "nosuch1").exists()
    assert debug_lines() == []
    os.kill(pid, signal.SIGUSR1)
    assert mounting.wait_until(lambda: "log level now debug" in mount.log_text(mnt), 10)
    assert not (mnt / "nosuch2").exists()
    assert mounting.wait_until(lambda: any("nosuch2" in ln for ln in debug_lines()), 10), mount.log_text(mnt)
    os.kill(pid, signal.SIGUSR1)
    assert mounting.wait_until(lambda: "log level now warning" in mount.log_text(mnt), 10)
    n = len(debug_lines())
    assert not (mnt / "nosuch3").exists()
    time.sleep(0.3)
    assert len(debug_lines()) == n


# --------------------------------------------------------------------------- credentials and errors


def test_storage_options_file_readable_by_others_is_refused(store, tmp_path):
    opts = tmp_path / "so.json"
    opts.write_text("{}")
    opts.chmod(0o644)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    cmd = [*mounting.ZARRFS, os.fspath(store), os.fspath(mnt), "-o", f"storage_options_file={opts}"]
    code, _, err, was_mounted = mounting.run_expecting_failure(cmd, mnt, tmp_path)
    assert not was_mounted and code == 1
    assert len(err.splitlines()) == 1 and "chmod 600" in err and "0644" in err, err


def _fail(tmp_path: Path, source: str, *opts: str, env: dict | None = None) -> str:
    mnt = tmp_path / "mnt"
    mnt.mkdir(exist_ok=True)
    cmd = [*mounting.ZARRFS, source, os.fspath(mnt)] + (["-o", ",".join(opts)] if opts else [])
    out_p, err_p = tmp_path / "out", tmp_path / "err"
    with open(out_p, "wb") as out, open(err_p, "wb") as err:
        code = subprocess.run(
            cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=err, timeout=60, env={**os.environ, **(env or {})}
        ).returncode
    _unmount_all(mnt)
    text = err_p.read_text()
    assert code == 1, text
    assert len(text.splitlines()) == 1 and "Traceback" not in text, text
    return text


def test_connection_refused_names_the_cause(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the block ends: nothing listens there
    err = _fail(tmp_path, f"http://127.0.0.1:{port}/x.zarr")
    assert err.lower().count("connection refused") == 1, err  # the cause, said once
    assert "StoreError" not in err and "failed" not in err.split("(", 1)[0], err


def test_name_not_resolved_names_the_cause(tmp_path):
    err = _fail(tmp_path, "http://no-such-host.invalid/x.zarr")
    assert "not resolved" in err, err


def test_writable_http_is_refused_without_a_tuple(tmp_path, served_dir):
    err = _fail(tmp_path, served_dir, "writable")
    assert "cannot be written" in err and "(" not in err.split(":", 1)[1].split("cannot")[0], err
    assert "'http'" not in err, err


@pytest.fixture(scope="module")
def served_dir(tmp_path_factory, store):
    """An http.server serving the store's parent; yields the store's URL."""
    from support.http_server import HttpServer

    server = HttpServer(store.parent, tmp_path_factory.mktemp("http") / "http.log")
    server.start()
    try:
        yield server.url(store.name)
    finally:
        server.stop()


# --------------------------------------------------------------------------- times, dead mounts


def test_rsync_twice_transfers_nothing_after_remount(mount, store, tmp_path):
    """File times come from the store: a copy made through one mount is current through the next."""
    _need_fuse()
    copy = tmp_path / "copy"
    mnt = mount(store)
    xnpy = mnt / "g" / "x.npy"
    assert os.stat(xnpy).st_mtime_ns == os.stat(store / "g" / "x" / "zarr.json").st_mtime_ns
    r = subprocess.run(["rsync", "-a", "--stats", f"{mnt}/", f"{copy}/"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert re.search(r"Number of regular files transferred: 2\b", r.stdout), r.stdout
    mounting.unmount_and_wait(mount, mnt)
    time.sleep(1.1)  # a new mount a second later: mount-time stamps would differ
    mnt2 = mount(store)
    r = subprocess.run(["rsync", "-a", "--stats", f"{mnt2}/", f"{copy}/"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert re.search(r"Number of regular files transferred: 0\b", r.stdout), r.stdout
    assert re.search(r"Total bytes received: \d", r.stdout)


def test_dead_mount_is_named_with_its_fix(mount, store, tmp_path):
    """A daemon killed with -9 (no auto_unmount) leaves ENOTCONN; the next mount says fusermount3 -uz."""
    _need_fuse()
    mnt = mount(store)
    for pid in mounting.pids_serving(mnt):
        os.kill(pid, signal.SIGKILL)
    with pytest.raises(OSError) as e:
        assert mounting.wait_until(lambda: not os.listdir(mnt), 5)
    assert e.value.errno in (errno.ENOTCONN, errno.ECONNABORTED)
    r = subprocess.run(
        [*mounting.ZARRFS, os.fspath(store), os.fspath(mnt)],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert r.returncode == 1
    assert r.stderr.splitlines() == [
        f"zarrfs: mountpoint {mnt} is a dead FUSE mount (its daemon is gone): run fusermount3 -uz {mnt} and mount again"
    ], r.stderr
    subprocess.run(["fusermount3", "-uz", os.fspath(mnt)], check=True, timeout=30)
    assert not mounting.is_mounted(mnt)


AUTO_UNMOUNT_TRIES = 20


def _daemon_pid(mnt: Path) -> int:
    """The zarrfs daemon itself, not the fusermount3 helper that auto_unmount leaves beside it."""
    pids = [p for p in mounting.pids_serving(mnt) if b"fusermount" not in Path(f"/proc/{p}/cmdline").read_bytes()]
    assert len(pids) == 1, pids
    return pids[0]


def test_auto_unmount_after_kill_9_every_time(store, tmp_path):
    _need_fuse()
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    failures = []
    try:
        for i in range(AUTO_UNMOUNT_TRIES):
            r = subprocess.run(
                [
                    *mounting.ZARRFS,
                    os.fspath(store),
                    os.fspath(mnt),
                    "-o",
                    f"auto_unmount,log_file={tmp_path / 'zarrfs.log'}",
                ],
                capture_output=True,
                text=True,
                timeout=mounting.MOUNT_TIMEOUT_S,
                stdin=subprocess.DEVNULL,
            )
            assert r.returncode == 0, r.stderr
            os.kill(_daemon_pid(mnt), signal.SIGKILL)
            # fusermount3's helper unmounts once it sees the daemon's end of the FUSE socket
            # close; on a loaded two-core machine that can take seconds.
            if not mounting.wait_until(lambda: not mounting.is_mounted(mnt), 30):
                failures.append((i, mounting.pids_serving(mnt)))
                _unmount_all(mnt)
    finally:
        _unmount_all(mnt)
    assert not failures, (
        f"a dead mount stayed after kill -9 in (try, processes left) {failures} of {AUTO_UNMOUNT_TRIES}"
    )
