"""The zarrfs command line: daemon and foreground modes, signals, and every user error (one line, no traceback)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time

import numpy as np
import pytest

from support import builders, mounting, oracles


@pytest.fixture(scope="module")
def small_store(tmp_path_factory):
    """A small v3 hierarchy: (store path, Expected of its array ``g/x``)."""
    root = tmp_path_factory.mktemp("cli") / "small.zarr"
    import zarr

    zarr.open_group(os.fspath(root), mode="w", zarr_format=3)
    builders.create_array(
        root, builders.ArraySpec("g/x", "int16", (30, 10), (8, 8), "zstd"), 3, np.random.default_rng(3)
    )
    return root, oracles.expected_for(root, "g/x")


@pytest.fixture(scope="module")
def small_store_v2(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli-v2") / "small.zarr"
    import zarr

    zarr.open_group(os.fspath(root), mode="w", zarr_format=2)
    builders.create_array(root, builders.ArraySpec("x", "int16", (30, 10), (8, 8), "zstd"), 2, np.random.default_rng(3))
    return root


# --------------------------------------------------------------------------- daemon mode


def test_daemon_mode_returns_only_once_live(mount, small_store):
    """Without -f the command exits 0 with the mount already usable; it does not hold our pipes."""
    store, expected = small_store
    mnt, log = mount.new_mountpoint()
    cmd = mount.command(store, mnt, log)
    mount.adopt(mnt, log)
    try:
        r = subprocess.run(cmd, capture_output=True, timeout=mounting.MOUNT_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        pytest.fail(
            "zarrfs without -f did not return (a daemon still holding the stdout/stderr pipes "
            "of its parent keeps subprocess.run waiting too)"
        )
    assert r.returncode == 0, r.stderr
    # no polling: the mount must be live the moment the command has returned
    assert mounting.is_mounted(mnt)
    assert os.listdir(mnt) == ["g"]
    assert (mnt / "g" / "x.npy").read_bytes() == expected.npy
    assert b"Traceback" not in r.stderr + r.stdout
    assert mounting.pids_serving(mnt), "no background daemon process found"


def test_daemon_exits_after_fusermount_u(mount, small_store):
    store, _ = small_store
    mnt = mount(store)
    pids = mounting.pids_serving(mnt)
    assert pids
    r = mounting.user_unmount(mnt)
    assert r.returncode == 0, r.stderr
    assert not mounting.is_mounted(mnt)
    assert mounting.wait_until(lambda: not any(mounting.pid_alive(p) for p in pids), 10), "daemon outlived its mount"


@pytest.mark.parametrize("form", ["-o format=v3", "--format=v3"])
def test_format_option_forms(mount, small_store, form):
    """``--option=value`` and ``-o option=value`` are the same option."""
    store, expected = small_store
    mnt, log = mount.new_mountpoint()
    cmd = mount.command(store, mnt, log) + form.split()
    mount.adopt(mnt, log)
    r = subprocess.run(
        cmd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        timeout=mounting.MOUNT_TIMEOUT_S,
    )
    assert r.returncode == 0, r.stderr
    assert (mnt / "g" / "x.npy").read_bytes() == expected.npy


def test_two_mounts_of_one_store(mount, small_store):
    store, expected = small_store
    a = mount(store)
    b = mount(store)
    assert (a / "g" / "x.npy").read_bytes() == (b / "g" / "x.npy").read_bytes() == expected.npy


def test_relative_source_shows_as_absolute_path(mount, small_store):
    """mount(8) and df name the store by its absolute path, whatever directory SOURCE was typed in."""
    store, expected = small_store
    mnt, log = mount.new_mountpoint()
    mount.adopt(mnt, log)
    cmd = mount.command(store.name, mnt, log)
    r = subprocess.run(
        cmd,
        cwd=store.parent,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=mounting.MOUNT_TIMEOUT_S,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert (mnt / "g" / "x.npy").read_bytes() == expected.npy
    source = next(row[0] for row in mounting.mount_table() if row[1] == os.fspath(mnt))
    assert source == os.fspath(store)


# --------------------------------------------------------------------------- foreground mode


def _start_foreground(mount, store):
    mnt = mount(store, foreground=True)
    rec = mount.records[-1]
    assert rec.proc is not None and rec.proc.poll() is None
    return mnt, rec.proc


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_foreground_signal_unmounts_and_exits_0(mount, small_store, sig):
    store, expected = small_store
    mnt, proc = _start_foreground(mount, store)
    assert (mnt / "g" / "x.npy").read_bytes() == expected.npy
    proc.send_signal(sig)
    try:
        code = proc.wait(mounting.EXIT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"zarrfs -f still running {mounting.EXIT_TIMEOUT_S}s after {sig.name}")
    assert code == 0, f"exit code {code} after {sig.name}:\n{mount.log_text(mnt)[-2000:]}"
    assert not mounting.is_mounted(mnt), f"{mnt} still mounted after {sig.name}"


def test_foreground_signal_while_file_open(mount, small_store):
    """SIGTERM while a reader holds a file open still ends the process; the mount is gone or lazily detached."""
    store, _ = small_store
    mnt, proc = _start_foreground(mount, store)
    f = open(mnt / "g" / "x.npy", "rb")
    try:
        f.read(10)
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(mounting.EXIT_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pytest.fail("zarrfs -f ignored SIGTERM while a file was open")
        assert code == 0
    finally:
        try:
            f.close()
        except OSError:
            pass
    mounting.unmount(mnt)
    assert not mounting.is_mounted(mnt)


def test_foreground_exits_0_after_fusermount_u(mount, small_store):
    store, _ = small_store
    mnt, proc = _start_foreground(mount, store)
    r = mounting.user_unmount(mnt)
    assert r.returncode == 0, r.stderr
    try:
        assert proc.wait(mounting.EXIT_TIMEOUT_S) == 0
    except subprocess.TimeoutExpired:
        pytest.fail("zarrfs -f still running after fusermount3 -u")


def test_foreground_keeps_running(mount, small_store):
    """With -f the command does not return while mounted."""
    store, _ = small_store
    mnt, proc = _start_foreground(mount, store)
    time.sleep(0.5)
    assert proc.poll() is None
    assert mounting.is_mounted(mnt)


# --------------------------------------------------------------------------- user errors


def _error_case(tmp_path, small_store, small_store_v2, case):
    """(argv after the program, mountpoint to check) for the user error named CASE."""
    store, _ = small_store
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    notzarr = tmp_path / "notzarr"
    notzarr.mkdir()
    (notzarr / "readme.txt").write_text("hello\n")
    empty = tmp_path / "emptydir"
    empty.mkdir()
    textfile = tmp_path / "file.txt"
    textfile.write_text("not zarr\n")
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "something").write_text("x")
    s, m = str(store), str(mnt)
    return {
        "source_missing": ([str(tmp_path / "no_such.zarr"), m], mnt),
        "source_not_zarr_dir": ([str(notzarr), m], mnt),
        "source_empty_dir": ([str(empty), m], mnt),
        "source_plain_file": ([str(textfile), m], mnt),
        "mountpoint_missing": ([s, str(tmp_path / "no_such_mnt")], None),
        "mountpoint_not_empty": ([s, str(busy)], busy),
        "mountpoint_is_file": ([s, str(textfile)], None),
        "unknown_o_option": ([s, m, "-o", "no_such_option"], mnt),
        "unknown_o_option_value": ([s, m, "-o", "no_such_option=1"], mnt),
        "unknown_long_option": ([s, m, "--no_such_option"], mnt),
        "bad_cache_size": ([s, m, "-o", "cache_size=abc"], mnt),
        "bad_format": ([s, m, "-o", "format=v9"], mnt),
        "bad_format_long": ([s, m, "--format=v9"], mnt),
        "format_mismatch": ([str(small_store_v2), m, "-o", "format=v3"], mnt),
        "unknown_codec": ([s, m, "-o", "writable,codec=nosuch"], mnt),
    }[case]


ERROR_CASES = [
    "source_missing",
    "source_not_zarr_dir",
    "source_empty_dir",
    "source_plain_file",
    "mountpoint_missing",
    "mountpoint_not_empty",
    "mountpoint_is_file",
    "unknown_o_option",
    "unknown_o_option_value",
    "unknown_long_option",
    "bad_cache_size",
    "bad_format",
    "bad_format_long",
    "format_mismatch",
    "unknown_codec",
]


@pytest.mark.parametrize("foreground", [False, True], ids=["daemon", "foreground"])
@pytest.mark.parametrize("case", ERROR_CASES)
def test_user_error(tmp_path, small_store, small_store_v2, case, foreground):
    args, mnt = _error_case(tmp_path, small_store, small_store_v2, case)
    cmd = [*mounting.ZARRFS, *args] + (["-f"] if foreground else [])
    code, stdout, stderr, was_mounted = mounting.run_expecting_failure(cmd, mnt, tmp_path)
    assert not was_mounted, f"{case}: zarrfs mounted {mnt} instead of failing (exit {code}, stderr {stderr!r})"
    lines = stderr.splitlines()
    assert code != 0, f"exit 0 for {case}; stderr: {stderr!r}"
    assert "Traceback" not in stderr + stdout, stderr
    assert len(lines) == 1, f"want exactly one stderr line, got {len(lines)}: {stderr!r}"
    assert lines[0].startswith("zarrfs: "), lines[0]
    assert len(lines[0]) > len("zarrfs: ") + 5, lines[0]
    if case == "unknown_codec":
        assert "nosuch" in lines[0], lines[0]


@pytest.mark.parametrize("with_crc32c", [False, True], ids=["plain", "plus_crc32c"])
def test_user_error_one_line_from_plain_install(plain_venv, tmp_path, with_crc32c):
    """The venv's own `zarrfs` of a plain install prints one line for a user error, also when the
    user has the `crc32c` package too (the README once advised it; numcodecs >= 0.16.4 warns at
    import when it is the only checksum library)."""
    extra = plain_venv.crc32c_dir() if with_crc32c else None
    if extra is not None:
        r = subprocess.run(
            plain_venv.python_command(["-c", "import crc32c"], pythonpath=extra),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert r.returncode == 0, f"crc32c not importable in the plain venv: {r.stderr}"
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    cmd = plain_venv.command([tmp_path / "no_such.zarr", mnt], pythonpath=extra)
    code, stdout, stderr, was_mounted = mounting.run_expecting_failure(cmd, mnt, tmp_path)
    assert not was_mounted
    assert code == 1, stderr
    assert stdout == ""
    assert stderr.splitlines() == [f"zarrfs: {tmp_path / 'no_such.zarr'}: no such file, directory or store"], stderr


# --------------------------------------------------------------------------- logging options


LOG_LINE = re.compile(r"^\S.*? (DEBUG|INFO|WARNING|ERROR|CRITICAL) [\w.]+: ")


@pytest.mark.parametrize(
    "level,allowed",
    [
        ("debug", {"DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"}),
        ("info", {"INFO", "WARNING", "ERROR", "CRITICAL"}),
        ("warning", {"WARNING", "ERROR", "CRITICAL"}),
    ],
)
def test_log_file_format_and_level(mount, small_store, level, allowed):
    """``-o log_file=PATH,log_level=LEVEL``: every line is ``<time> <LEVEL> <logger>: <message>``, none below LEVEL
    but the mount and unmount lines of ``zarrfs.lifecycle``, written at every level (the first says where the log
    goes)."""
    store, expected = small_store
    mnt = mount(store, f"log_level={level}")
    assert (mnt / "g" / "x.npy").read_bytes() == expected.npy
    os.listdir(mnt / "g")
    mounting.unmount(mnt)
    mounting.wait_until(lambda: not mounting.pids_serving(mnt), 5)
    text = mount.log_text(mnt)
    lifecycle = [ln for ln in text.splitlines() if " INFO zarrfs.lifecycle: " in ln]
    assert len(lifecycle) == 2 and f"mounted {store} on {mnt}; log: " in lifecycle[0], text
    for line in text.splitlines():
        m = LOG_LINE.match(line)
        assert m, f"log line not in '<time> <LEVEL> <logger>: <message>' form: {line!r}"
        assert m.group(1) in allowed or line in lifecycle, f"{m.group(1)} line with log_level={level}: {line!r}"


def test_log_escapes_names(mount, tmp_path):
    """Names with a newline or undecodable bytes stay in one log line each, escaped; no record is lost.

    A v2 group (zarr-python 3 writes it and its one good array) holds directories so named
    with a broken `.zarray`, which zarrfs logs a WARNING about when it lists the group.
    """
    import zarr

    root = tmp_path / "names.zarr"
    zarr.open_group(os.fspath(root), mode="w", zarr_format=2)
    builders.create_array(
        root, builders.ArraySpec("good", "int16", (6, 5), (4, 4), "zstd"), 2, np.random.default_rng(5)
    )
    bad_names = {b"new\nline": "new\\nline", b"bad\xffutf8": "bad\\xffutf8", b"cr\rtab\tesc\x1b": "cr\\rtab\\tesc\\x1b"}
    for name in bad_names:
        os.mkdir(os.fsencode(root) + b"/" + name)
        with open(os.fsencode(root) + b"/" + name + b"/.zarray", "wb") as f:
            f.write(b"{not json")
    mnt = mount(root, foreground=True)
    listed = set(os.listdir(os.fsencode(mnt)))
    assert listed == {b"good.npy"} | {n + b".npy" for n in bad_names}, listed
    assert (mnt / "good.npy").read_bytes() == oracles.expected_for(root, "good").npy
    for name in bad_names:
        with pytest.raises(OSError):
            open(os.fsencode(mnt) + b"/" + name + b".npy", "rb").read()
    for missing in (b"no\nsuch", b"no\xfesuch.npy", b"x\ny/z"):
        with pytest.raises(FileNotFoundError):
            os.stat(os.fsencode(mnt) + b"/" + missing)
    mounting.unmount_and_wait(mount, mnt)
    raw = mount.records[-1].log_file.read_bytes()
    text = raw.decode("utf-8")  # strict: every record was written in full
    for line in text.splitlines():
        assert LOG_LINE.match(line), f"log line not in '<time> <LEVEL> <logger>: <message>' form: {line!r}"
    for escaped in bad_names.values():
        assert mounting.log_lines_naming(text, f"{escaped}/.zarray", ("WARNING",)), (
            f"no WARNING naming {escaped}:\n{text}"
        )
    output = (mount.workdir / f"{mnt.name}.cli-output").read_text(errors="replace")
    assert "Logging error" not in output, output
