"""A venv holding zarrfs as a plain `pip install zarrfs` gives it (its own dependencies, no extras), cached across runs.

The venv is made by the system python (``$PYTHON`` or ``python3``, as scripts/setup.sh does),
never from the test venv, under ``$XDG_CACHE_HOME/zarrfs-tests/venv-plain-<hash>`` where
<hash> is the sha256 of pyproject.toml: the dependencies are installed once per
pyproject.toml, and later runs (fresh clones included) cost nothing. The zarrfs package
itself is reinstalled (without touching the dependencies) whenever its sources differ from
what the venv holds. A stamp written after a complete install marks a venv usable, so an
install that was killed is done again. Run this file to build the venv ahead of the tests.

Nothing here imports zarrfs, and nothing from the test venv leaks into the commands it
builds: PYTHONPATH and friends are removed, so the installed copy is what runs.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]  # run as a script too, so not from support
CACHE_DIR = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "zarrfs-tests"
# Another pyproject.toml's venv is removed once unused this long: old enough that a
# worktree or branch still in use has touched its own venv since, young enough that the
# cache does not grow with every dependency change.
STALE_AFTER_S = 7 * 24 * 3600
# A first install compiles pyfuse3 from its sdist (about a minute here); more than that
# means pip is stuck.
INSTALL_TIMEOUT_S = 900
# What a package user may have next to zarrfs: the README once told users to install it.
CRC32C_PACKAGE = "crc32c"
# Variables of the test run that would make the venv's python import something else than
# what the venv holds (the test command sets PYTHONPATH to the work tree).
LEAKY_ENV = ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONUSERBASE", "VIRTUAL_ENV")


def _sha256(*paths: Path) -> str:
    h = hashlib.sha256()
    for p in paths:
        h.update(os.fspath(p.relative_to(REPO)).encode() + b"\0")
        h.update(p.read_bytes() + b"\0")
    return h.hexdigest()


def deps_key() -> str:
    return _sha256(REPO / "pyproject.toml")[:12]


def _package_files() -> list[Path]:
    files = [REPO / "pyproject.toml", REPO / "README.md"]
    files += sorted(p for p in (REPO / "zarrfs").rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    return files


def source_hash() -> str:
    return _sha256(*_package_files())


def clean_env_prefix(pythonpath: Path | None = None) -> list[str]:
    """``env`` arguments that drop the test run's Python variables (and set PYTHONPATH when given)."""
    prefix = ["env"]
    for name in LEAKY_ENV:
        prefix += ["-u", name]
    if pythonpath is not None:
        prefix.append(f"PYTHONPATH={pythonpath}")
    return prefix


@contextmanager
def _locked(lock_path: Path):
    """An exclusive lock on LOCK_PATH: two test runs never build the same venv at once."""
    with open(lock_path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _run(cmd: list, what: str) -> None:
    r = subprocess.run(
        [os.fspath(c) for c in cmd],
        capture_output=True,
        text=True,
        timeout=INSTALL_TIMEOUT_S,
        stdin=subprocess.DEVNULL,
        env={k: v for k, v in os.environ.items() if k not in LEAKY_ENV},
    )
    if r.returncode != 0:
        raise RuntimeError(f"{what} failed (exit {r.returncode}): {cmd}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")


def _pip_install_package(venv: Path, *pip_args: str) -> None:
    """pip install of a copy of the package's sources (a build in the work tree would leave build/ there)."""
    with tempfile.TemporaryDirectory(prefix="zarrfs-src-") as tmp:
        src = Path(tmp) / "zarrfs-src"
        for f in _package_files():
            dest = src / f.relative_to(REPO)
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(f, dest)
        _run(
            [venv / "bin" / "python", "-m", "pip", "install", "-q", "--disable-pip-version-check", *pip_args, src],
            f"pip install {' '.join(pip_args)} zarrfs into {venv}",
        )


@dataclass(frozen=True)
class PlainVenv:
    path: Path

    @property
    def zarrfs(self) -> Path:
        return self.path / "bin" / "zarrfs"

    @property
    def python(self) -> Path:
        return self.path / "bin" / "python"

    def command(self, args: list[str], pythonpath: Path | None = None) -> list[str]:
        """The venv's own ``zarrfs`` console script with ARGS, in an environment free of the test run's."""
        return [*clean_env_prefix(pythonpath), os.fspath(self.zarrfs), *map(os.fspath, args)]

    def python_command(self, args: list[str], pythonpath: Path | None = None) -> list[str]:
        return [*clean_env_prefix(pythonpath), os.fspath(self.python), *map(os.fspath, args)]

    def crc32c_dir(self) -> Path:
        """A directory holding only the `crc32c` package, for PYTHONPATH (a user's extra install)."""
        target = CACHE_DIR / f"pkg-{CRC32C_PACKAGE}"
        stamp = target / ".complete"
        with _locked(CACHE_DIR / f"pkg-{CRC32C_PACKAGE}.lock"):
            if not stamp.exists():
                shutil.rmtree(target, ignore_errors=True)
                _run(
                    [
                        self.python,
                        "-m",
                        "pip",
                        "install",
                        "-q",
                        "--disable-pip-version-check",
                        "--target",
                        target,
                        CRC32C_PACKAGE,
                    ],
                    f"pip install --target {target} {CRC32C_PACKAGE}",
                )
                stamp.write_text(CRC32C_PACKAGE + "\n")
        return target


def _remove_stale(keep: Path) -> None:
    for other in CACHE_DIR.glob("venv-plain-*"):
        if other == keep or not other.is_dir():
            continue
        stamp = other / ".zarrfs-deps-installed"
        try:
            age_s = time.time() - (stamp if stamp.exists() else other).stat().st_mtime
        except FileNotFoundError:
            continue
        if age_s < STALE_AFTER_S:
            continue
        with open(CACHE_DIR / f"{other.name}.lock", "a") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # being built or updated right now
            shutil.rmtree(other, ignore_errors=True)
        (CACHE_DIR / f"{other.name}.lock").unlink(missing_ok=True)


def plain_venv() -> PlainVenv:
    """The cached plain venv, built or brought up to date first when needed."""
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    venv = CACHE_DIR / f"venv-plain-{deps_key()}"
    deps_stamp = venv / ".zarrfs-deps-installed"
    code_stamp = venv / ".zarrfs-source-hash"
    want = source_hash()
    with _locked(CACHE_DIR / f"{venv.name}.lock"):
        if not deps_stamp.exists():
            shutil.rmtree(venv, ignore_errors=True)
            _run([os.environ.get("PYTHON", "python3"), "-m", "venv", venv], f"creating {venv}")
            _pip_install_package(venv)
            code_stamp.write_text(want)
            deps_stamp.write_text(deps_key() + "\n")
        elif not code_stamp.exists() or code_stamp.read_text() != want:
            code_stamp.unlink(missing_ok=True)
            _pip_install_package(venv, "--no-deps", "--force-reinstall")
            code_stamp.write_text(want)
        os.utime(deps_stamp)  # in use: not stale
    _remove_stale(venv)
    return PlainVenv(venv)


def is_current() -> bool:
    """True when the cached venv exists and holds the work tree's sources (nothing to build)."""
    venv = CACHE_DIR / f"venv-plain-{deps_key()}"
    code_stamp = venv / ".zarrfs-source-hash"
    return (
        (venv / ".zarrfs-deps-installed").exists() and code_stamp.exists() and code_stamp.read_text() == source_hash()
    )


if __name__ == "__main__":  # scripts/test.sh builds it ahead of the tests
    if not is_current():
        print("setup: installing zarrfs without extras into a venv for tests/mounted/test_install.py", file=sys.stderr)
        t0 = time.monotonic()
        v = plain_venv()
        print(f"setup: {v.path} ready in {time.monotonic() - t0:.0f}s", file=sys.stderr)
