#!/usr/bin/env bash
# Network test of a shared PostgreSQL store: scripts/partition-test.sh
#
# Starts a PostgreSQL server and two `docfs mount` daemons on hosts of their own (network
# namespaces joined by veth pairs; nothing reaches this machine's network), then cuts one host
# off while it holds a lock, heals the cut, SIGKILLs a daemon that holds a lock and restarts the
# server (scripts/reliability/partition.py says what each case checks). About a minute. Exits
# non-zero on a failed check; the work folder with the daemons' and the server's logs is kept
# then. Needs root.
#
# DOCFS_BIN: the docfs program (default: .build/debug/docfs, built if missing).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" -ne 0 ]; then
    echo "partition-test: needs root (network namespaces)" >&2
    exit 1
fi
./scripts/install-deps.sh postgresql nftables iproute2 util-linux >/dev/null
docfs=${DOCFS_BIN:-.build/debug/docfs}
[ -x "$docfs" ] || swift build --product docfs >&2
exec timeout -k 30 600 python3 scripts/reliability/partition.py "$docfs" "$@"
