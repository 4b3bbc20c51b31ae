#!/usr/bin/env bash
# Set up everything (apt FUSE packages, .venv, zarrfs with its test extra) and run the tests.
# Extra arguments go to pytest, e.g. scripts/test.sh -k http -x
set -euo pipefail
cd "$(dirname "$0")/.."
ZARRFS_EXTRAS="test,http" source scripts/setup.sh
# Commands the tests run, as command:Debian package: rsync (test_ops copies a mount, file times
# across remounts), gdalinfo and identify (the image views), file and ncdump (the netCDF view),
# setfattr (attributes set as a user would, test_mount_write_tools).
for tool in rsync:rsync gdalinfo:gdal-bin identify:imagemagick file:file ncdump:netcdf-bin setfattr:attr; do
    if ! command -v "${tool%%:*}" >/dev/null; then
        sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
        pkg="${tool#*:}"
        echo "setup: installing $pkg (for ${tool%%:*})" >&2
        DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "$pkg" >/dev/null 2>&1 ||
            { $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "$pkg" >/dev/null; }
    fi
done

# The oracle for the v3 drafts' experimental layout: zarr-python 2.18, which needs numpy<2
# and so lives in a venv of its own (tests find it at .venv-zarr218).
if ! .venv-zarr218/bin/python -c "import zarr, pytest; assert zarr.__version__.startswith('2.18')" 2>/dev/null; then
    echo "setup: installing the zarr 2.18 oracle into .venv-zarr218" >&2
    "${PYTHON:-python3}" -m venv .venv-zarr218
    .venv-zarr218/bin/python -m pip install -q 'zarr==2.18.*' 'numpy<2' pytest
fi
# Icechunk 2.x needs Python >= 3.12 (these machines' python3 is 3.11, which takes 1.1.x): where a
# python3.12 or newer is found, the Icechunk tests run once more, after the suite, in a venv of
# its own with the test extra and the newest icechunk (.venv-icechunk2).
icechunk2_python=""
pyenv_root="$(pyenv root 2>/dev/null || true)"
for candidate in python3.12 python3.13 ${pyenv_root:+"$pyenv_root"/versions/3.1[2-9]*/bin/python}; do
    if "$candidate" -c 'import sys, venv; assert sys.version_info >= (3, 12)' 2>/dev/null; then
        icechunk2_python="$candidate"
        break
    fi
done
# Why the second Icechunk pass does not run, if it does not (said again after the suite).
icechunk2_skipped=""
if [ -z "$icechunk2_python" ]; then
    icechunk2_skipped="no Python >= 3.12 here (python3.12, python3.13 or pyenv's): the Icechunk tests ran with icechunk 1.x only"
elif ! .venv-icechunk2/bin/python -c "import icechunk, pytest_trio, moto, netCDF4, zarrfs; assert int(icechunk.__version__.split('.')[0]) >= 2" 2>/dev/null; then
    echo "setup: installing icechunk 2.x into .venv-icechunk2 ($("$icechunk2_python" --version))" >&2
    rm -rf .venv-icechunk2
    log="$(mktemp)"
    if ! { "$icechunk2_python" -m venv .venv-icechunk2 &&
        .venv-icechunk2/bin/python -m pip install -q -e '.[test]' 'icechunk>=2'; } >"$log" 2>&1; then
        icechunk2_skipped="installing icechunk 2.x into .venv-icechunk2 failed: $(grep -m1 -iE 'error' "$log" || tail -n1 "$log")"
    fi
    rm -f "$log"
fi
# zarrfs as a plain `pip install` gives it (no extras), for tests/mounted/test_install.py: built here so
# that the first test does not spend a minute compiling pyfuse3; cached outside the clone.
.venv/bin/python tests/support/plain_venv.py
# Lint and format check of the whole repository before the tests (configuration in pyproject.toml).
.venv/bin/python -m ruff check .
.venv/bin/python -m ruff format --check .
# Type check of the package (configuration under [tool.mypy] in pyproject.toml).
.venv/bin/python -m mypy
# Both passes run whatever the other did; the exit status is the first failure's.
status=0
.venv/bin/python -m pytest "$@" || status=$?
if [ $# -eq 0 ]; then
    if [ -z "$icechunk2_skipped" ]; then
        echo "tests: the Icechunk tests again with icechunk $(.venv-icechunk2/bin/python -c 'import icechunk; print(icechunk.__version__)') on $(.venv-icechunk2/bin/python --version)" >&2
        icechunk2_status=0
        .venv-icechunk2/bin/python -m pytest tests/unit/test_icechunkstore.py tests/unit/test_chunkfiles.py tests/mounted/test_mount_icechunk*.py || icechunk2_status=$?
        [ "$status" -ne 0 ] || status=$icechunk2_status
        [ "$icechunk2_status" -eq 0 ] || echo "tests: the icechunk 2.x pass failed (exit $icechunk2_status)" >&2
    else
        echo "tests: the icechunk 2.x pass did not run: $icechunk2_skipped" >&2
    fi
fi
exit "$status"
