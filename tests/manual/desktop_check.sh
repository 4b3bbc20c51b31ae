#!/usr/bin/env bash
# Desktop check of .zarrfs/preview/ (by hand, not in the test suite): a file manager (pcmanfm)
# under Xvfb opens the preview directory of a small hierarchy; the screenshot is written to
# OUT (default desktop_check.png). Needs root for apt and FUSE. Usage: tests/manual/desktop_check.sh [OUT]
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=$(realpath -m "${1:-desktop_check.png}")
PY=${PYTHON:-.venv/bin/python}
for tool in pcmanfm:pcmanfm Xvfb:xvfb import:imagemagick; do
    command -v "${tool%%:*}" >/dev/null || { apt-get update -qq && apt-get install -y -qq "${tool#*:}" >/dev/null; }
done
work=$(mktemp -d)
mnt="$work/mnt"; mkdir "$mnt"
cleanup() {
    [ -n "${fm:-}" ] && kill "$fm" 2>/dev/null || true
    [ -n "${xvfb:-}" ] && kill "$xvfb" 2>/dev/null || true
    fusermount3 -u "$mnt" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT
"$PY" - "$work/demo.zarr" <<'PYEOF'
import sys
import numpy as np
import zarr
g = zarr.open_group(sys.argv[1], mode="w")
y, x = np.mgrid[-1:1:300j, -1:1:400j]
pics = {
    "rings": np.sin(12 * np.hypot(x, y)).astype("f4"),
    "gradient": (x * 1000).astype("i2"),
    "gaussian": np.exp(-(x ** 2 + y ** 2) * 4).astype("f8"),
    "checker": ((np.floor(x * 4) + np.floor(y * 4)) % 2 == 0),
}
holes = np.sin(6 * x) * np.cos(6 * y)
holes[np.hypot(x, y) < 0.4] = np.nan
pics["with_nan_hole"] = holes.astype("f4")
pics["stack_3d"] = np.stack([np.sin(k * x) * np.cos(k * y) for k in range(1, 8)]).astype("f4")
for name, value in pics.items():
    a = g.create_array(f"pictures/{name}", shape=value.shape, dtype=value.dtype, chunks=(100,) * value.ndim)
    a[...] = value
PYEOF
PYTHONPATH=$PWD "$PY" -m zarrfs "$work/demo.zarr" "$mnt" -o "log_file=$work/zarrfs.log"
Xvfb :77 -screen 0 1024x700x24 >/dev/null 2>&1 & xvfb=$!
sleep 2
HOME="$work" DISPLAY=:77 pcmanfm "$mnt/.zarrfs/preview/pictures" >/dev/null 2>&1 & fm=$!
sleep 8
DISPLAY=:77 import -window root "$OUT"
echo "screenshot: $OUT"
grep -E "WARNING|ERROR" "$work/zarrfs.log" || true
