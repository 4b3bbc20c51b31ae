#!/usr/bin/env bash
# Set up (apt FUSE packages and ncdump, .venv, zarrfs), write a small sample hierarchy, mount it,
# show the tree and one array read back with numpy.load, and leave it mounted.
# Usage: scripts/demo.sh [WORKDIR]   (default /tmp/zarrfs-demo)
set -euo pipefail
cd "$(dirname "$0")/.."
ZARRFS_EXTRAS="http" source scripts/setup.sh
# The README's session prints the netCDF view's header with ncdump (Debian's netcdf-bin).
if ! command -v ncdump >/dev/null; then
    sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
    echo "setup: installing netcdf-bin (ncdump, for the README's session)" >&2
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq netcdf-bin >/dev/null 2>&1 ||
        { $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq netcdf-bin >/dev/null; }
fi

work="${1:-/tmp/zarrfs-demo}"
store="$work/sample.zarr"
mnt="$work/mnt"
mkdir -p "$work" "$mnt"
if mountpoint -q "$mnt"; then
    fusermount3 -u "$mnt"
fi
.venv/bin/python scripts/make_sample.py "$store"
.venv/bin/zarrfs "$store" "$mnt" -o "log_file=$work/zarrfs.log,log_level=info"

echo "== the tree of $mnt"
(cd "$mnt" && find . -print | sort | while read -r p; do
    if [ -d "$mnt/$p" ]; then echo "$p/"; else printf '%s  (%s bytes)\n' "$p" "$(stat -c %s "$mnt/$p")"; fi
done)
echo "== numpy.load('$mnt/climate/temperature.npy')"
.venv/bin/python - "$mnt/climate/temperature.npy" <<'PY'
import sys
import numpy as np
a = np.load(sys.argv[1], mmap_mode="r")
print(f"shape {a.shape}, dtype {a.dtype}, mean {float(a.mean()):.3f}")
print(a[:3, :6])
PY
echo "== attributes: getfattr -n user.zarr.attributes $mnt/climate"
.venv/bin/python -c "import os,sys; print(os.getxattr(sys.argv[1], 'user.zarr.attributes').decode())" "$mnt/climate"
echo
echo "Mounted at $mnt (log: $work/zarrfs.log). Unmount with: fusermount3 -u $mnt"
