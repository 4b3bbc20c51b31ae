#!/usr/bin/env bash
# Set up everything (apt FUSE packages, .venv, zarrfs with its test extra) and run the tests.
# Extra arguments go to pytest, e.g. scripts/test.sh -k http -x
set -euo pipefail
cd "$(dirname "$0")/.."
ZARRFS_EXTRAS="test,http" source scripts/setup.sh
# tests/mounted/test_ops.py copies a mount with rsync (file times across remounts); the image views'
# tests open files with GDAL (gdalinfo) and ImageMagick (identify); tests/mounted/test_mount_netcdf.py
# asks file(1) what the netCDF view is.
for tool in rsync:rsync gdalinfo:gdal-bin identify:imagemagick file:file; do
    if ! command -v "${tool%%:*}" >/dev/null; then
        sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
        pkg="${tool#*:}"
        $sudo apt-get install -y -qq "$pkg" >/dev/null 2>&1 || { $sudo apt-get update -qq && $sudo apt-get install -y -qq "$pkg" >/dev/null; }
    fi
done

# tests/mounted/test_mount_netcdf.py prints the netCDF view's headers with ncdump.
if ! command -v ncdump >/dev/null; then
    sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get install -y -qq netcdf-bin >/dev/null 2>&1 || { $sudo apt-get update -qq && $sudo apt-get install -y -qq netcdf-bin >/dev/null; }
fi

# The oracle for the v3 drafts' experimental layout: zarr-python 2.18, which needs numpy<2
# and so lives in a venv of its own (tests find it at .venv-zarr218).
if ! .venv-zarr218/bin/python -c "import zarr, pytest; assert zarr.__version__.startswith('2.18')" 2>/dev/null; then
    echo "setup: installing the zarr 2.18 oracle into .venv-zarr218" >&2
    "${PYTHON:-python3}" -m venv .venv-zarr218
    .venv-zarr218/bin/python -m pip install -q 'zarr==2.18.*' 'numpy<2' pytest
fi
# zarrfs as a plain `pip install` gives it (no extras), for tests/mounted/test_install.py: built here so
# that the first test does not spend a minute compiling pyfuse3; cached outside the clone.
.venv/bin/python tests/support/plain_venv.py
# Lint and format check of the whole repository before the tests (configuration in pyproject.toml).
.venv/bin/python -m ruff check .
.venv/bin/python -m ruff format --check .
exec .venv/bin/python -m pytest "$@"
