#!/usr/bin/env bash
# Shared set-up for demo.sh and test.sh (sourced): apt packages for FUSE, a venv in .venv,
# the package installed editable with the extras given as $ZARRFS_EXTRAS. Idempotent.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"

need_apt=()
for pkg in fuse3 libfuse3-dev pkg-config; do
    dpkg -s "$pkg" >/dev/null 2>&1 || need_apt+=("$pkg")
done
if [ ${#need_apt[@]} -gt 0 ]; then
    sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
    echo "setup: installing ${need_apt[*]}" >&2
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

python="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
    echo "setup: creating .venv" >&2
    "$python" -m venv .venv
fi
extras="${ZARRFS_EXTRAS:-http}"
# Reinstall only when pyproject.toml or the extras changed since the last install.
stamp=".venv/.zarrfs-installed"
want="$(sha256sum pyproject.toml | cut -d' ' -f1) $extras"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    echo "setup: installing zarrfs[$extras] into .venv" >&2
    .venv/bin/python -m pip install -q --upgrade pip >/dev/null
    .venv/bin/python -m pip install -q -e ".[$extras]"
    echo "$want" > "$stamp"
fi
