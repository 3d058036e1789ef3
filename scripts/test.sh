#!/usr/bin/env bash
# Runs every DocFS test: installs what is missing, builds, runs the whole suite.
# Exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."

./scripts/install-deps.sh

swift build --build-tests
swift test --skip-build "$@"
