#!/usr/bin/env bash
# Install zarrfs for the whole system (run as root; idempotent, run it again to upgrade):
#   - apt packages: fuse3 (mount.fuse3, fusermount3) and what building pyfuse3 needs;
#   - a venv under $ZARRFS_PREFIX (/opt/zarrfs) holding zarrfs with the extras in
#     $ZARRFS_EXTRAS (http,s3,gcs: every remote backend; empty for local stores only;
#     add references for Parquet reference sets, icechunk for Icechunk repositories;
#     $PYTHON, a path or a command, makes the venv: icechunk 2.x needs Python >= 3.12);
#   - $ZARRFS_BINDIR/zarrfs (/usr/local/bin) linked to it: mount -t fuse.zarrfs, /etc/fstab
#     and systemd find it there (mount.fuse3 runs the program without PATH);
#   - the manual page zarrfs(1), the template unit zarrfs@.service in
#     /usr/local/lib/systemd/system, and the .mount/.automount examples with README.md and
#     docs/ (which zarrfs(1) and --help cite) in /usr/local/share/doc/zarrfs.
# The dependencies are installed again only when pyproject.toml or the extras change; the
# package alone when its sources change. Prints one line saying what it did.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
prefix="${ZARRFS_PREFIX:-/opt/zarrfs}"
bindir="${ZARRFS_BINDIR:-/usr/local/bin}"
extras="${ZARRFS_EXTRAS-http,s3,gcs}"
python="$(command -v "${PYTHON:-/usr/bin/python3}" || true)"  # a path or a command name (python3.12)
if [ -z "$python" ] && [ -n "${PYTHON:-}" ]; then
    echo "install.sh: PYTHON=$PYTHON: no such program" >&2
    exit 1
fi
[ -n "$python" ] || python="$(command -v python3)"
mandir=/usr/local/share/man/man1
unitdir=/usr/local/lib/systemd/system
docdir=/usr/local/share/doc/zarrfs

if [ "$(id -u)" -ne 0 ]; then
    echo "install.sh: run as root (sudo $0)" >&2
    exit 1
fi

need_apt=()
for pkg in fuse3 libfuse3-dev pkg-config python3-venv python3-dev; do
    dpkg -s "$pkg" >/dev/null 2>&1 || need_apt+=("$pkg")
done
if [ ${#need_apt[@]} -gt 0 ] && command -v apt-get >/dev/null; then
    echo "install.sh: installing ${need_apt[*]}" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

mkdir -p "$(dirname "$prefix")"
exec 9>"$prefix.lock"
flock 9   # two installs at once would build one venv twice

files=(pyproject.toml README.md)
while IFS= read -r f; do files+=("$f"); done < <(cd "$repo" && find zarrfs -type f ! -path '*/__pycache__/*' | LC_ALL=C sort)
deps_hash="$(cd "$repo" && { sha256sum pyproject.toml; echo "extras=$extras python=$python"; } | sha256sum | cut -d' ' -f1)"
src_hash="$(cd "$repo" && sha256sum "${files[@]}" | sha256sum | cut -d' ' -f1)"

pip_install() {  # from a copy of the sources: a build in the clone would leave build/ behind
    local tmp log
    tmp="$(mktemp -d)"; log="$(mktemp)"
    (cd "$repo" && cp --parents "${files[@]}" "$tmp/")
    local spec="$tmp"; [ -n "$extras" ] && spec="$tmp[$extras]"
    if ! "$prefix/bin/python" -m pip install -q --disable-pip-version-check "$@" "$spec" >"$log" 2>&1; then
        cat "$log" >&2; rm -rf "$tmp" "$log"; exit 1
    fi
    rm -rf "$tmp" "$log"
}

did="up to date"
if [ "$(cat "$prefix/.zarrfs-deps" 2>/dev/null)" != "$deps_hash" ]; then
    rm -rf "$prefix"
    "$python" -m venv "$prefix"
    pip_install
    echo "$src_hash" > "$prefix/.zarrfs-source"
    echo "$deps_hash" > "$prefix/.zarrfs-deps"
    did="installed"
elif [ "$(cat "$prefix/.zarrfs-source" 2>/dev/null)" != "$src_hash" ]; then
    rm -f "$prefix/.zarrfs-source"
    pip_install --no-deps --force-reinstall
    echo "$src_hash" > "$prefix/.zarrfs-source"
    did="updated"
fi

mkdir -p "$bindir" "$mandir" "$unitdir" "$docdir"
[ "$(readlink "$bindir/zarrfs" 2>/dev/null)" = "$prefix/bin/zarrfs" ] || ln -sfn "$prefix/bin/zarrfs" "$bindir/zarrfs"
"$prefix/bin/zarrfs" --man > "$mandir/zarrfs.1.new" && mv "$mandir/zarrfs.1.new" "$mandir/zarrfs.1"
install -m 0644 "$repo/systemd/zarrfs@.service" "$unitdir/zarrfs@.service"
install -m 0644 "$repo/systemd/mnt-zarr.mount" "$repo/systemd/mnt-zarr.automount" "$docdir/"
install -m 0644 -D "$repo/README.md" "$docdir/README.md"
install -m 0644 -D -t "$docdir/docs" "$repo"/docs/*.md
if [ -d /run/systemd/system ]; then systemctl daemon-reload || true; fi
echo "install.sh: zarrfs $did in $prefix (extras: ${extras:-none}); $bindir/zarrfs -> $prefix/bin/zarrfs"
