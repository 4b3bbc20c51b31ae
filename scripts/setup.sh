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
# Reinstall only when pyproject.toml changed, or extras are wanted that are not there yet.
stamp=".venv/.zarrfs-installed"
hash="$(sha256sum pyproject.toml | cut -d' ' -f1)"
installed_hash=""; installed_extras=""
if [ -f "$stamp" ]; then read -r installed_hash installed_extras < "$stamp" || true; fi
missing=""
for e in ${extras//,/ }; do
    case ",$installed_extras," in *",$e,"*) ;; *) missing="$missing $e" ;; esac
done
if [ "$installed_hash" != "$hash" ] || [ -n "$missing" ]; then
    if [ "$installed_hash" = "$hash" ]; then all="$installed_extras,$extras"; else all="$extras"; fi
    all="$(echo "$all" | tr ',' '\n' | grep -v '^$' | sort -u | paste -sd, -)"
    echo "setup: installing zarrfs[$all] into .venv" >&2
    log="$(mktemp)"
    if ! { .venv/bin/python -m pip install -q --upgrade pip && .venv/bin/python -m pip install -q -e ".[$all]"; } >"$log" 2>&1; then
        cat "$log" >&2
        exit 1
    fi
    rm -f "$log"
    echo "$hash $all" > "$stamp"
fi
