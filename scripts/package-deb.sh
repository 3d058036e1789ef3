#!/usr/bin/env bash
# Builds a Debian package of docfs: docfs_VERSION_ARCH.deb in the repository's folder.
#
# Usage: scripts/package-deb.sh [--test]
#   --test  then installs it with `apt install ./docfs_….deb`, checks that docfs runs, that
#           `man docfs` and mount(8)'s helper work, removes it with `apt remove docfs`, and checks
#           that every file it brought is gone (needs root; docfs must not be installed already)
#
# The package holds what scripts/install.sh installs, with PREFIX /usr: /usr/bin/docfs, the helper
# /sbin/mount.fuse.docfs, the manual pages and the bash, zsh and fish completions. Its binary is a
# release build with the Swift runtime linked in (--static-swift-stdlib, in .build-deb), so the
# package needs no Swift toolchain; its dependencies are the shared libraries that binary uses,
# found with dpkg. A whole release build: several minutes on two cores.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

version=$(sed -n 's/.*public static let version = "\(.*\)".*/\1/p' Sources/DocumentFS/DocumentFS.swift)
arch=$(dpkg --print-architecture)
deb="$root/docfs_${version}_${arch}.deb"

./scripts/install-deps.sh --build
echo "package-deb: building docfs $version with the Swift runtime linked in..." >&2
swift build -c release --product docfs --static-swift-stdlib --scratch-path .build-deb >&2
binary=.build-deb/release/docfs

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
DESTDIR="$stage" DOCFS_BINARY="$binary" DOCFS_HELPER_DIR=/sbin ./scripts/install.sh /usr >&2
# dpkg keeps its own list of the package's files.
rm -f "$stage/usr/share/docfs/install-manifest"
rmdir "$stage/usr/share/docfs" 2>/dev/null || true
gzip -9n "$stage"/usr/share/man/man*/*
# As Debian's packages are: without the symbols a debugger wants (a fifth of the size).
strip --strip-unneeded "$stage/usr/bin/docfs"

# The packages of the shared libraries the binary needs.
depends=()
for lib in $(objdump -p "$binary" | awk '$1 == "NEEDED" { print $2 }'); do
    path=$(ldconfig -p | awk -v l="$lib" '$1 == l { print $NF; exit }')
    [ -n "$path" ] || { echo "error: $binary needs $lib, which ldconfig does not know" >&2; exit 1; }
    package=$(dpkg -S "$(realpath "$path")" 2>/dev/null | head -1 | cut -d: -f1) \
        || package=$(dpkg -S "$path" | head -1 | cut -d: -f1)
    depends+=("$package")
done
# fuse3: fusermount3 and mount.fuse3, which mount(8)'s helper runs.
depends+=(fuse3)
depends_line=$(printf '%s\n' "${depends[@]}" | sort -u | paste -sd, | sed 's/,/, /g')

# The maintainer: the repository's committer, as git knows them.
maintainer="$(git config user.name 2>/dev/null || echo DocFS maintainers) <$(git config user.email 2>/dev/null || echo root@localhost)>"
mkdir -p "$stage/DEBIAN"
installed_size=$(du -sk --exclude=DEBIAN "$stage" | cut -f1)
cat >"$stage/DEBIAN/control" <<EOF
Package: docfs
Version: $version
Architecture: $arch
Maintainer: $maintainer
Installed-Size: $installed_size
Depends: $depends_line
Section: utils
Priority: optional
Description: document stores as file systems
 DocFS keeps documents and every saved version of them in a store (an SQLite
 file, or a PostgreSQL database several machines share) and mounts it with
 FUSE: a package document is a folder, a flat document a file, and the history
 and the Trash show in file managers. This package has the docfs command, its
 manual pages and shell completions, and mount(8)'s helper for fuse.docfs.
EOF
rm -f "$deb"
dpkg-deb --root-owner-group --build "$stage" "$deb" >&2
echo "$deb"

[ "${1:-}" = "--test" ] || exit 0

# The real thing: apt installs it (and what it depends on), then removes it.
[ "$(id -u)" -eq 0 ] || { echo "error: --test needs root" >&2; exit 1; }
if dpkg-query -W -f='${Status}' docfs 2>/dev/null | grep -q "install ok installed"; then
    echo "error: a docfs package is installed already" >&2
    exit 1
fi
files=$(dpkg-deb -c "$deb" | awk '$1 !~ /^d/ { sub(/^\./, "", $6); print $6 }')
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$deb" >&2
fail() { echo "package-deb --test: $*" >&2; exit 1; }
[ "$(/usr/bin/docfs --version)" = "$version" ] || fail "docfs --version is not $version"
MANPAGER=cat man docfs | grep -q "document stores as file systems" || fail "man docfs shows no page"
MANPAGER=cat man 8 mount.fuse.docfs | grep -q "fuse.docfs" || fail "man mount.fuse.docfs shows no page"
for file in $files; do [ -e "$file" ] || fail "$file is not installed"; done
# mount(8) through the helper, on a store of its own.
work=$(mktemp -d)
XDG_DATA_HOME="$work" /usr/bin/docfs create "$work/t.docstore" --demo >/dev/null
mkdir "$work/m"
mount -t fuse.docfs "$work/t.docstore" "$work/m" -o ro || fail "mount -t fuse.docfs failed"
ls "$work/m" | grep -q "README.txt" || { /usr/bin/docfs unmount "$work/m"; fail "the mount shows no documents"; }
/usr/bin/docfs unmount "$work/m"
rm -rf "$work"
DEBIAN_FRONTEND=noninteractive apt-get remove -y -qq docfs >&2
for file in $files; do [ ! -e "$file" ] || fail "$file is still there after apt remove"; done
echo "package-deb --test: installed, used and removed $(echo "$files" | wc -l) files: OK" >&2
