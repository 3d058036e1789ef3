#!/usr/bin/env bash
# Makes `mount -t fuse.docfs STORE MOUNTPOINT` and fstab lines of type fuse.docfs work.
#
# mount(8) runs mount.fuse3 (package fuse3), which runs `docfs STORE MOUNTPOINT -o OPTIONS`
# through /bin/sh. mount(8) drops the caller's PATH, so /bin/sh looks in its default one
# (/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin): docfs must be there. docfs
# itself recognises that argument shape as `docfs mount`, so no other helper is needed.
#
# Installs a copy of the release build as /usr/local/bin/docfs (a copy, not a link: root runs
# it from mount(8), and must not run a file in a user's writable build folder).
# Usage: scripts/install-mount-helper.sh [--uninstall]
set -euo pipefail
cd "$(dirname "$0")/.."
target=/usr/local/bin/docfs
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"

if [ "${1:-}" = "--uninstall" ]; then
    $SUDO rm -f "$target"
    echo "removed $target"
    exit 0
fi

./scripts/install-deps.sh
swift build -c release --product docfs >&2
$SUDO install -m 0755 .build/release/docfs "$target"
echo "installed $target; now: sudo mount -t fuse.docfs /path/to/Store.docstore /mnt/docs"
