#!/usr/bin/env bash
# Installs the Debian packages DocFS needs, only those that are missing.
#
# Usage: scripts/install-deps.sh [--build | --test] [extra-package ...]
#   --build (the default)  what building and running docfs need: scripts/demo.sh and
#                          scripts/install.sh ask for these only
#   --test                 those, and the tools the tests drive: scripts/test.sh asks for these
#
# Building and running: libfuse3-dev and pkg-config (the FUSE binding), fuse3 (fusermount3 and
# mount.fuse3), libsqlite3-dev (GRDB links the system's SQLite), libssl-dev (the store hashes
# chunks with libcrypto's SHA-256), libpq-dev (the PostgreSQL store speaks to its server through
# libpq).
#
# Testing, besides: the store tests inspect and damage store files with the sqlite3 command; the
# DocumentFS write tests drive real editors and tools on a mount: vim, nano, emacs-nox, rsync, gio
# (libglib2.0-bin), getfattr/setfattr (attr), getfacl/setfacl (acl), perl -pi, tar, runuser
# (util-linux) and script (bsdutils, a pty for nano). postgresql: the PostgreSQL store's tests run
# against a real server on loopback (scripts/postgres.sh). The desktop tests run GIO's trash
# through its real backend: gvfsd-trash (gvfs-daemons) on a session bus of their own
# (dbus-run-session, dbus-daemon), reached through GIO's gvfs module (gvfs: without it, and with
# --no-install-recommends nothing pulls it in, `gio trash --list` answers "Operation not
# supported").
set -euo pipefail

build=(libfuse3-dev fuse3 pkg-config libsqlite3-dev libpq-dev libssl-dev)
test=(sqlite3 python3 attr acl vim nano emacs-nox rsync libglib2.0-bin perl tar util-linux bsdutils postgresql
    gvfs gvfs-daemons dbus-daemon nftables iproute2)

packages=("${build[@]}")
case "${1:-}" in
--test)
    packages+=("${test[@]}")
    shift
    ;;
--build) shift ;;
esac
packages+=("$@")

missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
    echo "installing: ${missing[*]}" >&2
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    # Try the local package lists first; refresh them only when they are missing or stale.
    if ! DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2; then
        $SUDO apt-get update -qq
        DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
    fi
fi

if [ ! -c /dev/fuse ]; then
    echo "error: /dev/fuse is missing; load the fuse kernel module (modprobe fuse)" >&2
    exit 1
fi
