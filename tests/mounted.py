"""Helpers for the mounted (black-box) tests: run the zarrfs CLI, watch the mount table, build Zarr stores, compute oracles.

Nothing here imports zarrfs: the package is only ever reached through its command
line, and every expected value comes from zarr-python 3 and ``numpy.save``.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ZARRFS = [sys.executable, "-m", "zarrfs"]

# How long the CLI may take to report a live mount; a cold Python start with
# numpy, trio and fsspec imports takes about a second on these machines.
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


def _pid_alive(pid: int) -> bool:
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
                r = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                   timeout=MOUNT_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                pytest.fail(f"zarrfs did not return within {MOUNT_TIMEOUT_S}s: {cmd}\n{_tail(out_path)}\nlog:\n{_tail(log)}")
        if r.returncode != 0:
            pytest.fail(f"zarrfs exited {r.returncode}: {cmd}\n{_tail(out_path)}\nlog:\n{_tail(log)}")
        if not wait_until(lambda: is_mounted(mnt), 10):
            pytest.fail(f"zarrfs exited 0 but {mnt} is not mounted\n{_tail(out_path)}\nlog:\n{_tail(log)}")
        rec.daemon_pids = pids_serving(mnt)
        return mnt

    def log_text(self, mountpoint: Path | None = None) -> str:
        rec = self.records[-1] if mountpoint is None else next(r for r in self.records if r.mountpoint == Path(mountpoint))
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
                    problems.append(f"{rec.mountpoint}: foreground zarrfs still running {EXIT_TIMEOUT_S}s after unmount ({how})")
            pids = set(rec.daemon_pids) | set(pids_serving(rec.mountpoint))
            if pids and not wait_until(lambda: not any(_pid_alive(p) for p in pids), EXIT_TIMEOUT_S, 0.05):
                alive = [p for p in pids if _pid_alive(p)]
                for p in alive:
                    try:
                        os.kill(p, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                problems.append(f"{rec.mountpoint}: daemon pid(s) {alive} still running {EXIT_TIMEOUT_S}s after unmount ({how}); killed")
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
    return text[max(0, i - 500): i + n]


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


# --------------------------------------------------------------------------- oracles


def npy_bytes(value: np.ndarray) -> bytes:
    """What ``np.save`` writes for VALUE laid out in C order (the contract's ``.npy`` file)."""
    buf = io.BytesIO()
    np.save(buf, np.array(value, order="C", copy=True), allow_pickle=False)
    return buf.getvalue()


def open_zarr_array(store_root: Path, path: str):
    import zarr

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return zarr.open_array(os.fspath(store_root / path) if path else os.fspath(store_root), mode="r")


def descr_json(dtype: np.dtype) -> Any:
    """``dtype_to_descr`` as it reads back from JSON (tuples become lists)."""
    return json.loads(json.dumps(np.lib.format.dtype_to_descr(dtype)))


@dataclass
class Expected:
    npy: bytes
    value: np.ndarray
    attributes: dict
    shape: list
    descr: Any
    chunks: list


def expected_for(store_root: Path, path: str) -> Expected:
    arr = open_zarr_array(store_root, path)
    value = arr[...]
    if not isinstance(value, np.ndarray):
        value = np.asarray(value)
    meta = arr.metadata
    if meta.zarr_format == 2:
        chunks = list(meta.chunks)
    else:
        chunks = list(meta.chunk_grid.chunk_shape)  # the shard shape for sharded arrays
    return Expected(
        npy=npy_bytes(value),
        value=value,
        attributes=dict(arr.attrs.asdict()),
        shape=list(arr.shape),
        descr=descr_json(value.dtype),
        chunks=chunks,
    )


# --------------------------------------------------------------------------- the test hierarchy


@dataclass(frozen=True)
class ArraySpec:
    path: str
    dtype: Any
    shape: tuple
    chunks: tuple
    codec: str = "none"
    fill_value: Any = None
    write: Any = "all"  # "all", "none", or a tuple of slices
    kwargs: dict = field(default_factory=dict, hash=False, compare=False)
    attributes: dict | None = field(default=None, hash=False, compare=False)


ARRAY_ATTRS = {"units": "m/s", "scale": 0.5, "tags": ["a", "b"], "nested": {"x": None, "ok": True}, "label": "µm – 中文"}
ROOT_ATTRS = {"title": "zarrfs test hierarchy", "version": 1, "nested": {"list": [1, 2.5, None, "é"]}}
GROUP_ATTRS = {
    "dtypes": {"kind": "dtypes"},
    "codecs": {"kind": "codecs", "n": 6},
    "fill": {"kind": "fill"},
    "edge": {},
    "names": {"kind": "names"},
    "empty_group": {"empty": True},
    "implied/b": {"level": 2},
}
# Groups whose metadata documents are deleted after building, so only a descendant implies them.
IMPLIED_GROUPS = ["implied", "deep", "deep/x", "deep/x/y"]

# Shape of the per-codec arrays: several FUSE requests long, edge chunks on both axes.
CODEC_SHAPE = (300, 257)
CODEC_CHUNKS = (64, 50)


def _dtype_cases(zarr_format: int) -> list[tuple[str, Any]]:
    cases = [
        ("bool", "bool"), ("int8", "int8"), ("uint16", "uint16"), ("int32", "int32"), ("int64", "int64"),
        ("uint64", "uint64"), ("float16", "float16"), ("float32", "float32"), ("float64", "float64"),
        ("complex64", "complex64"), ("complex128", "complex128"), ("bytes_S5", "S5"), ("unicode_U3", "<U3"),
        ("datetime64_ns", "datetime64[ns]"),
    ]
    if zarr_format == 2:
        cases += [("int32_be", ">i4"), ("float64_be", ">f8"), ("structured", [("a", "<i4"), ("b", "<f8")])]
    return cases


def array_specs(zarr_format: int, *, implied: bool = True) -> list[ArraySpec]:
    """Every array of the test hierarchy for ZARR_FORMAT (static, so tests can be parametrized on it)."""
    specs: list[ArraySpec] = []
    codecs = ["none", "blosc", "zstd", "gzip"]
    for i, (name, dt) in enumerate(_dtype_cases(zarr_format)):
        specs.append(ArraySpec(f"dtypes/{name}", dt, (37, 23), (10, 7), codecs[i % 4]))

    for codec in codecs + (["crc32c", "zstd_crc32c"] if zarr_format == 3 else []):
        specs.append(ArraySpec(f"codecs/{codec}", "float64", CODEC_SHAPE, CODEC_CHUNKS, codec))
    if zarr_format == 2:
        specs += [
            ArraySpec("codecs/order_f_blosc", "int32", (37, 23), (10, 7), "blosc", kwargs={"order": "F"}),
            ArraySpec("codecs/order_f_none", "float32", (37, 23), (10, 7), "none", kwargs={"order": "F"}),
            ArraySpec("codecs/order_f_3d", "int16", (5, 6, 7), (2, 4, 3), "zstd", kwargs={"order": "F"}),
            ArraySpec("codecs/sep_slash", "int16", (37, 23), (10, 7), "gzip",
                      kwargs={"chunk_key_encoding": {"name": "v2", "separator": "/"}}),
            ArraySpec("codecs/sep_dot", "int16", (37, 23), (10, 7), "zstd",
                      kwargs={"chunk_key_encoding": {"name": "v2", "separator": "."}}),
        ]
    else:
        specs += [
            # Shards of 20x14 holding 5x7 inner chunks; only two regions written, so some
            # inner chunks of written shards and whole shards are missing.
            ArraySpec("codecs/sharded", "float32", (37, 23), (5, 7), "zstd", fill_value=-1.5,
                      write=(slice(0, 10), slice(0, 7)), kwargs={"shards": (20, 14)}),
            ArraySpec("codecs/sharded_blosc", "int32", (60, 45), (5, 7), "blosc", fill_value=3,
                      write=(slice(22, 60), slice(0, 45)), kwargs={"shards": (20, 14)}),
            ArraySpec("codecs/sharded_index_start", "int16", (37, 23), (20, 14), "none",
                      write=(slice(0, 37), slice(0, 9)), kwargs={"sharding_index_start": (5, 7)}),
            ArraySpec("codecs/bytes_big_endian", "int32", (37, 23), (10, 7), "gzip", kwargs={"big_endian": True}),
            ArraySpec("codecs/transpose", "float32", (37, 23), (10, 7), "zstd", kwargs={"transpose": (1, 0)}),
            ArraySpec("codecs/key_v2_dot", "int16", (37, 23), (10, 7), "gzip",
                      kwargs={"chunk_key_encoding": {"name": "v2", "separator": "."}}),
            ArraySpec("codecs/key_default_dot", "int16", (37, 23), (10, 7), "zstd",
                      kwargs={"chunk_key_encoding": {"name": "default", "separator": "."}}),
            ArraySpec("codecs/dimension_names", "uint8", (37, 23), (10, 7), "none",
                      kwargs={"dimension_names": ["y", "x"]}),
        ]

    specs += [
        ArraySpec("fill/nan", "float64", (37, 23), (10, 7), "zstd", fill_value=float("nan"),
                  write=(slice(0, 10), slice(0, 14))),
        ArraySpec("fill/neg_inf", "float32", (37, 23), (10, 7), "none", fill_value=float("-inf"),
                  write=(slice(10, 30), slice(7, 23))),
        ArraySpec("fill/int_nonzero", "int32", (37, 23), (10, 7), "blosc", fill_value=-7,
                  write=(slice(0, 10), slice(0, 7))),
        ArraySpec("fill/bool_true", "bool", (37, 23), (10, 7), "none", fill_value=True,
                  write=(slice(20, 37), slice(0, 23))),
        ArraySpec("fill/never_written", "float32", (37, 23), (10, 7), "gzip", fill_value=2.25, write="none"),
        ArraySpec("fill/scalar_0d", "float64", (), (), "none", fill_value=0.0),
        ArraySpec("fill/scalar_0d_unwritten", "int16", (), (), "zstd", fill_value=12, write="none"),
        ArraySpec("edge/vector", "float64", (1001,), (100,), "blosc"),
        ArraySpec("edge/chunk_bigger_than_shape", "int64", (5, 3), (10, 10), "zstd"),
        ArraySpec("edge/tiny_chunks", "uint16", (3, 4), (1, 1), "none"),
        ArraySpec("edge/nd4", "float32", (3, 4, 5, 6), (2, 3, 2, 4), "gzip"),
        ArraySpec("edge/zero_size", "float64", (0, 5), (2, 2), "none"),
        ArraySpec("edge/one_element", "complex128", (1,), (1,), "none"),
        ArraySpec("names/with space", "int8", (4, 4), (2, 2), "none"),
        ArraySpec("names/ünïcode_名前", "int8", (4, 4), (2, 2), "none"),
        ArraySpec("top", "float64", (17, 5), (4, 4), "zstd", attributes={"where": "root level"}),
    ]
    if implied:
        specs += [
            ArraySpec("implied/b/c", "int32", (12, 7), (5, 5), "zstd", attributes={"implied": "parent"}),
            ArraySpec("deep/x/y/arr", "float32", (9,), (4,), "none"),
        ]
    return specs


def sample_data(dtype: np.dtype, shape: tuple, rng: np.random.Generator) -> np.ndarray:
    """Deterministic, non-trivial values of DTYPE (native byte order converted at the end)."""
    dtype = np.dtype(dtype)
    n = int(np.prod(shape, dtype=np.int64))
    if dtype.names:
        x = np.zeros(shape, dtype)
        for name in dtype.names:
            x[name] = sample_data(dtype[name], shape, rng)
        return x
    kind = dtype.kind
    native = dtype.newbyteorder("=")
    if kind == "b":
        x = rng.random(shape) > 0.5
    elif kind in "iu":
        info = np.iinfo(native)
        x = rng.integers(info.min, info.max, shape, dtype=native, endpoint=True)
    elif kind == "f":
        x = (rng.standard_normal(shape) * 100).astype(native)
    elif kind == "c":
        x = (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(native)
    elif kind == "S":
        words = [b"ab", b"hello", b"", b"x\x00y", b"\xff\x01"]
        x = np.array([words[i % len(words)] for i in range(n)], dtype=dtype).reshape(shape)
    elif kind == "U":
        words = ["ab", "é中\U0001f600", "", "xyz", "q"]
        x = np.array([words[i % len(words)] for i in range(n)], dtype=dtype).reshape(shape)
    elif kind == "M":
        x = rng.integers(-(2**62), 2**62, shape).astype(native)
    else:
        raise ValueError(f"no sample data for {dtype}")
    return np.asarray(x).astype(dtype)


def _compressors(codec: str, zarr_format: int):
    if codec == "none":
        return None
    if zarr_format == 2:
        import numcodecs

        return {
            "blosc": numcodecs.Blosc(cname="lz4", clevel=5, shuffle=numcodecs.Blosc.SHUFFLE),
            "zstd": numcodecs.Zstd(level=1),
            "gzip": numcodecs.GZip(level=1),
        }[codec]
    from zarr.codecs import BloscCodec, Crc32cCodec, GzipCodec, ZstdCodec

    return {
        "blosc": [BloscCodec(cname="lz4", clevel=5, shuffle="shuffle")],
        "zstd": [ZstdCodec(level=1)],
        "gzip": [GzipCodec(level=1)],
        "crc32c": [Crc32cCodec()],
        "zstd_crc32c": [ZstdCodec(level=1), Crc32cCodec()],
    }[codec]


def create_array(root: Path, spec: ArraySpec, zarr_format: int, rng: np.random.Generator):
    import zarr
    from zarr.codecs import BytesCodec, ShardingCodec, TransposeCodec

    kw = dict(spec.kwargs)
    args: dict[str, Any] = dict(
        store=os.fspath(root),
        name=spec.path or None,
        shape=spec.shape,
        dtype=spec.dtype,
        zarr_format=zarr_format,
        compressors=_compressors(spec.codec, zarr_format),
        attributes=spec.attributes if spec.attributes is not None else ARRAY_ATTRS,
    )
    if spec.fill_value is not None:
        args["fill_value"] = spec.fill_value
    if kw.pop("big_endian", False):
        args["serializer"] = BytesCodec(endian="big")
    if "transpose" in kw:
        args["filters"] = [TransposeCodec(order=kw.pop("transpose"))]
    if "sharding_index_start" in kw:
        inner = kw.pop("sharding_index_start")
        args["serializer"] = ShardingCodec(chunk_shape=inner, codecs=[BytesCodec()], index_location="start")
    args["chunks"] = spec.chunks if spec.shape else ()
    args.update(kw)
    if not spec.shape:
        args.pop("chunks")
    arr = zarr.create_array(**args)
    data = sample_data(np.dtype(spec.dtype), spec.shape, rng)
    if spec.write == "all":
        arr[...] = data
    elif spec.write != "none":
        arr[spec.write] = data[spec.write]
    return arr


@dataclass
class Hierarchy:
    root: Path
    zarr_format: int
    arrays: list[str]  # hierarchy paths of arrays
    groups: dict[str, dict]  # explicit groups (path, "" for the root) -> attributes
    implied_groups: list[str]
    _expected: dict = field(default_factory=dict, repr=False)

    def expected(self, path: str) -> Expected:
        if path not in self._expected:
            self._expected[path] = expected_for(self.root, path)
        return self._expected[path]

    def all_groups(self) -> list[str]:
        return sorted(set(self.groups) | set(self.implied_groups))

    def listing(self, group: str) -> list[str]:
        """The names a mount lists in GROUP's directory."""
        prefix = group + "/" if group else ""
        names = set()
        for g in self.all_groups():
            if g and g.startswith(prefix) and "/" not in g[len(prefix):]:
                names.add(g[len(prefix):])
        for a in self.arrays:
            if a.startswith(prefix) and "/" not in a[len(prefix):]:
                names.add(a[len(prefix):] + ".npy")
        return sorted(names)


def build_hierarchy(root: Path, zarr_format: int, *, implied: bool = True, seed: int = 20240601) -> Hierarchy:
    """Write the varied test hierarchy with zarr-python 3 into ROOT."""
    import zarr

    rng = np.random.default_rng(seed + zarr_format)
    specs = array_specs(zarr_format, implied=implied)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zarr's "no v3 specification" warnings for S/U dtypes
        root_group = zarr.open_group(os.fspath(root), mode="w", zarr_format=zarr_format, attributes=ROOT_ATTRS)
        groups = {"": dict(ROOT_ATTRS)}
        for name, attrs in GROUP_ATTRS.items():
            if name.startswith("implied") and not implied:
                continue
            root_group.create_group(name, attributes=attrs)
            groups[name] = dict(attrs)
        for spec in specs:
            create_array(root, spec, zarr_format, rng)
    implied_groups = []
    if implied:
        for g in IMPLIED_GROUPS:
            for doc in ("zarr.json", ".zgroup", ".zattrs"):
                p = root / g / doc
                if p.exists():
                    p.unlink()
            groups.pop(g, None)
            implied_groups.append(g)
    # every other intermediate group zarr created for us is explicit, with empty attributes
    for spec in specs:
        parts = spec.path.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            g = "/".join(parts[:i])
            if g not in groups and g not in implied_groups:
                groups[g] = {}
    return Hierarchy(root, zarr_format, [s.path for s in specs], groups, implied_groups)


def build_root_array(root: Path, zarr_format: int, seed: int = 7) -> np.ndarray:
    """A store whose root node is an array."""
    spec = ArraySpec("", "float32", (19, 11), (8, 4), "zstd", attributes={"root": "array"})
    create_array(root, spec, zarr_format, np.random.default_rng(seed))
    return expected_for(root, "").value


def write_vlen_string_array(root: Path, name: str, zarr_format: int):
    import zarr

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a = zarr.create_array(store=os.fspath(root), name=name, shape=(6,), chunks=(4,), dtype=str,
                              zarr_format=zarr_format)
        a[...] = np.array(["a", "bb", "", "dddd", "é", "xyz"], dtype=object)
    return a


def consolidate(root: Path, zarr_format: int) -> None:
    import zarr

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        zarr.consolidate_metadata(os.fspath(root), zarr_format=zarr_format)


# --------------------------------------------------------------------------- writes (issue 5)

# Names of metadata documents in every format: every other key under an array is a chunk.
METADATA_DOCS = frozenset({".zarray", ".zattrs", ".zgroup", ".zmetadata", "zarr.json", "meta", "attrs"})
# The NPY views of an array (view name -> element order); raw views have no header.
NPY_VIEWS = {"npy": "C", "npy-f": "F"}
RAW_VIEWS = {"raw": "C", "raw-f": "F"}


def store_keys(root: Path, prefix: str = "") -> list[str]:
    """Every file under ROOT/PREFIX (read from the disk, not through a mount), relative to it, sorted."""
    base = Path(root) / prefix if prefix else Path(root)
    if not base.is_dir():
        return []
    return sorted(p.relative_to(base).as_posix() for p in base.rglob("*") if p.is_file() or p.is_symlink())


def chunk_keys(root: Path, prefix: str) -> list[str]:
    """The keys under PREFIX that are not metadata documents (an array's chunks), relative to PREFIX."""
    return [k for k in store_keys(root, prefix) if k.rsplit("/", 1)[-1] not in METADATA_DOCS]


def leftover_temp_files(root: Path) -> list[str]:
    """Files that look like an unfinished atomic write (``*.tmp``, ``*.partial``) anywhere in the store."""
    return [k for k in store_keys(root) if k.endswith((".tmp", ".partial"))]


def zarr_value(store_root: Path, path: str) -> np.ndarray:
    """What zarr-python 3 reads for the whole array at PATH, opened afresh (no cache shared with earlier reads)."""
    arr = open_zarr_array(store_root, path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return np.asarray(arr[...])


def zarr_chunk_key(store_root: Path, path: str, idx: tuple[int, ...]) -> str:
    """The store key (relative to the array) of grid position IDX, as zarr-python 3 encodes it."""
    return open_zarr_array(store_root, path).metadata.encode_chunk_key(tuple(idx))


def zarr_chunk_shape(store_root: Path, path: str) -> tuple[int, ...]:
    """The chunk grid's chunk shape (a shard for sharded v3 arrays), from zarr-python 3."""
    meta = open_zarr_array(store_root, path).metadata
    if meta.zarr_format == 2:
        return tuple(meta.chunks)
    return tuple(meta.chunk_grid.chunk_shape)


def tensorstore_value(store_root: Path, path: str, zarr_format: int) -> np.ndarray:
    """What tensorstore reads for the array at PATH (a second oracle; structured types field by field)."""
    import tensorstore as ts

    spec = {"driver": "zarr" if zarr_format == 2 else "zarr3",
            "kvstore": {"driver": "file", "path": os.fspath(Path(store_root) / path) + "/"}}
    meta_dtype = zarr_value(store_root, path).dtype if zarr_format == 2 else None
    if meta_dtype is not None and meta_dtype.names:
        out = None
        for name in meta_dtype.names:
            field_value = ts.open({**spec, "field": name}, read=True).result().read().result()
            if out is None:
                out = np.zeros(field_value.shape, meta_dtype)
            out[name] = field_value
        return out
    return np.asarray(ts.open(spec, read=True).result().read().result())


def npy_f_bytes(value: np.ndarray) -> bytes:
    """What numpy writes for VALUE as a Fortran-order NPY file (``fortran_order`` True even for 0-d/1-d)."""
    d = {"descr": np.lib.format.dtype_to_descr(value.dtype), "fortran_order": True, "shape": value.shape}
    buf = io.BytesIO()
    try:
        np.lib.format.write_array_header_1_0(buf, d)
    except ValueError:
        buf = io.BytesIO()
        np.lib.format.write_array_header_2_0(buf, d)
    return buf.getvalue() + value.tobytes(order="F")


def view_bytes(value: np.ndarray, view: str) -> bytes:
    """The bytes a view file shows for VALUE: ``npy`` (np.save), ``npy-f``, ``raw`` or ``raw-f``."""
    if view == "npy":
        return npy_bytes(value)
    if view == "npy-f":
        return npy_f_bytes(value)
    return np.asarray(value).tobytes(order=RAW_VIEWS[view])


def view_header_len(value: np.ndarray, view: str) -> int:
    return len(view_bytes(value, view)) - value.nbytes


def value_from_view_bytes(data: bytes, view: str, like: np.ndarray) -> np.ndarray:
    """The array a view file's bytes describe (the inverse of ``view_bytes``), as a C-contiguous copy."""
    if view in NPY_VIEWS:
        out = np.load(io.BytesIO(data), allow_pickle=False)
    else:
        out = np.frombuffer(data, dtype=like.dtype).reshape(like.shape, order=RAW_VIEWS[view])
    return np.array(out, order="C", copy=True)  # ascontiguousarray would make 0-d 1-d


def patched(value: np.ndarray, view: str, offset: int, data: bytes) -> np.ndarray:
    """VALUE after DATA is written at OFFSET into its VIEW file (numpy's own reading of the patched bytes)."""
    b = bytearray(view_bytes(value, view))
    assert offset + len(data) <= len(b), "the oracle patch runs past the file"
    b[offset:offset + len(data)] = data
    return value_from_view_bytes(bytes(b), view, value)


def chunk_slices(idx: tuple[int, ...], chunks: tuple[int, ...], shape: tuple[int, ...]) -> tuple[slice, ...]:
    """The region of grid position IDX, clipped at the array's edge."""
    return tuple(slice(i * c, min((i + 1) * c, s)) for i, c, s in zip(idx, chunks, shape))


def chunk_file(mnt: Path, path: str, idx: tuple[int, ...]) -> Path:
    name = (".".join(map(str, idx)) or "0") + ".npy"
    return Path(mnt) / ".zarrfs" / "chunks" / path / name


def view_file(mnt: Path, path: str, view: str) -> Path:
    """The file of VIEW (``npy``, ``npy-f``, ``raw``, ``raw-f``) of the array at PATH."""
    if view == "npy":
        return Path(mnt) / (path + ".npy")
    suffix = ".npy" if view in NPY_VIEWS else ".raw"
    return Path(mnt) / ".zarrfs" / view / (path + suffix)


def element_diff(got: np.ndarray, want: np.ndarray) -> str | None:
    """None when GOT and WANT have the same shape, dtype and bytes; else a description of the first difference."""
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape or got.dtype != want.dtype:
        return f"shape/dtype {got.shape} {got.dtype} != {want.shape} {want.dtype}"
    if got.size == 0:
        return None
    g = np.ascontiguousarray(got).reshape(-1).view(np.uint8).reshape(got.size, -1)
    w = np.ascontiguousarray(want).reshape(-1).view(np.uint8).reshape(want.size, -1)
    bad = np.flatnonzero((g != w).any(axis=1))
    if bad.size == 0:
        return None
    first = np.unravel_index(bad[0], got.shape) if got.shape else ()
    return (f"{bad.size} of {got.size} elements differ; first at {tuple(int(i) for i in first)}: "
            f"got {got.reshape(-1)[bad[0]]!r}, want {want.reshape(-1)[bad[0]]!r}")


def assert_same_array(got: np.ndarray, want: np.ndarray, what: str) -> None:
    """Byte equality of two arrays element by element (NaN payloads and -0.0 included)."""
    problem = element_diff(got, want)
    assert problem is None, f"{what}: {problem}"


def pwrite_all(fd: int, data: bytes, offset: int) -> None:
    """os.pwrite until all of DATA is written (FUSE may take less than asked)."""
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        assert n > 0, f"pwrite at {offset} wrote {n} bytes"
        view, offset = view[n:], offset + n


def metadata_docs(root: Path, path: str) -> dict[str, bytes]:
    """The metadata documents directly under ROOT/PATH, byte for byte."""
    base = Path(root) / path if path else Path(root)
    return {n: (base / n).read_bytes() for n in sorted(METADATA_DOCS) if (base / n).is_file()}


def wait_exit(pids, timeout_s: float = EXIT_TIMEOUT_S) -> bool:
    """Wait until none of PIDS is alive."""
    return wait_until(lambda: not any(_pid_alive(p) for p in pids), timeout_s, 0.05)


def unmount_and_wait(mounter: "Mounter", mnt: Path) -> None:
    """Unmount a mount of MOUNTER and wait for its daemon to exit (so the store is final)."""
    rec = next(r for r in mounter.records if r.mountpoint == Path(mnt))
    pids = set(rec.daemon_pids) | set(pids_serving(mnt))
    r = subprocess.run(["fusermount3", "-u", os.fspath(mnt)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, f"fusermount3 -u {mnt}: {r.stderr.strip()}"
    assert wait_until(lambda: not is_mounted(mnt), 10), f"{mnt} still mounted after fusermount3 -u"
    if rec.proc is not None:
        rec.proc.wait(EXIT_TIMEOUT_S)
    assert wait_exit(pids), f"zarrfs daemon(s) {sorted(pids)} still running after unmounting {mnt}"
