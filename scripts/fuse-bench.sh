#!/usr/bin/env bash
# Micro-benchmark of the FUSE layer: no-op getattr and a 1 MiB read through a mounted no-op
# filesystem. Builds in release mode in its own scratch directory; needs /dev/fuse and root
# (or fusermount3). Usage: scripts/fuse-bench.sh [rounds]
set -euo pipefail
cd "$(dirname "$0")/.."
scratch=.build-fuse-bench
swift build -c release --scratch-path "$scratch" --product FUSEBench >&2
exec "$scratch/release/FUSEBench" "${1:-7}"
