#!/usr/bin/env bash
# Set up everything (apt FUSE packages, .venv, zarrfs with its test extra) and run the tests.
# Extra arguments go to pytest, e.g. scripts/test.sh -k http -x
set -euo pipefail
cd "$(dirname "$0")/.."
ZARRFS_EXTRAS="test,http" source scripts/setup.sh
exec .venv/bin/python -m pytest "$@"
