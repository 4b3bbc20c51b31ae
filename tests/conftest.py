"""Fixtures for the mounted tests: real zarrfs mounts, Zarr hierarchies written by zarr-python 3, a mount safety net.

A mounted test fails on any ERROR line or Traceback in its daemon's log unless it says
it expects them: ``@pytest.mark.log_errors_expected`` (``tracebacks=True`` to allow
those too) or ``mount.expect_errors()``.
"""

from __future__ import annotations

import warnings

import pytest

from support import builders, mounting


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "log_errors_expected(tracebacks=False): the daemon log may hold ERROR lines "
        "(and tracebacks when tracebacks=True) without failing the test",
    )


def _require_fuse() -> None:
    problem = mounting.check_fuse_available()
    if problem:
        pytest.fail(f"mounted tests need FUSE: {problem}", pytrace=False)


def _marker_expectations(node) -> tuple[bool, bool]:
    marker = node.get_closest_marker("log_errors_expected")
    if marker is None:
        return False, False
    return True, bool(marker.kwargs.get("tracebacks", False))


def _finish(mounter: mounting.Mounter) -> None:
    problems = mounter.close()
    if problems:
        pytest.fail("\n\n".join(problems), pytrace=False)


@pytest.fixture(scope="session", autouse=True)
def _unmount_leftovers(tmp_path_factory):
    """Safety net: whatever is still mounted under this session's tmp dirs at the end gets unmounted."""
    base = tmp_path_factory.getbasetemp()
    yield
    leftovers = mounting.mounts_under(base)
    for mp in leftovers:
        how = mounting.unmount(mp)
        warnings.warn(f"zarrfs tests left {mp} mounted; {how}", stacklevel=2)


@pytest.fixture(autouse=True)
def _private_disk_cache(monkeypatch, tmp_path_factory):
    """Mounts of remote stores keep their disk cache in a directory of this test, never in the
    user's own cache (zarrfs puts it under XDG_CACHE_HOME when that is set, root included)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("xdg-cache")))


@pytest.fixture
def mount(request, tmp_path):
    """``mount(source, *opts, foreground=False) -> mountpoint``; unmounted and log-checked at teardown."""
    _require_fuse()
    errors, tracebacks = _marker_expectations(request.node)
    mounter = mounting.Mounter(tmp_path / "mounts", errors_expected=errors, tracebacks_expected=tracebacks)
    yield mounter
    _finish(mounter)


@pytest.fixture(scope="module")
def module_mount(request, tmp_path_factory):
    """Like ``mount`` but shared by a module's tests (one mount per source, unmounted at module end)."""
    _require_fuse()
    errors, tracebacks = _marker_expectations(request.node)  # the module's own pytestmark
    mounter = mounting.Mounter(
        tmp_path_factory.mktemp("module-mounts"), errors_expected=errors, tracebacks_expected=tracebacks
    )
    yield mounter
    _finish(mounter)


@pytest.fixture(scope="session")
def hierarchy_factory(tmp_path_factory):
    """``hierarchy_factory(zarr_format, implied=True) -> Hierarchy``, each built once per session."""
    built: dict = {}

    def get(zarr_format: int, implied: bool = True) -> builders.Hierarchy:
        key = (zarr_format, implied)
        if key not in built:
            base = tmp_path_factory.mktemp(f"hier-v{zarr_format}")
            built[key] = builders.build_hierarchy(base / f"tree_v{zarr_format}.zarr", zarr_format, implied=implied)
        return built[key]

    return get


@pytest.fixture(scope="session", params=[2, 3], ids=["v2", "v3"])
def hierarchy(request, hierarchy_factory) -> builders.Hierarchy:
    """The varied test hierarchy, once per format."""
    return hierarchy_factory(request.param)


@pytest.fixture(scope="module")
def hierarchy_mount(module_mount, hierarchy_factory):
    """``hierarchy_mount(zarr_format) -> (Hierarchy, mountpoint)``: mounted once per module and format."""
    cache: dict = {}

    def get(zarr_format: int):
        if zarr_format not in cache:
            h = hierarchy_factory(zarr_format)
            cache[zarr_format] = (h, module_mount(h.root))
        return cache[zarr_format]

    return get


@pytest.fixture(scope="session")
def plain_venv():
    """zarrfs as a plain ``pip install`` gives it (no extras), in a venv of the system python; cached across runs."""
    from support import plain_venv as pv

    try:
        return pv.plain_venv()
    except Exception as e:  # an install that fails is a failed test, never a skipped one
        pytest.fail(f"cannot build the plain zarrfs venv: {e}", pytrace=False)
