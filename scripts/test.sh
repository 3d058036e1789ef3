#!/usr/bin/env bash
# Runs every DocFS test: installs what is missing, builds, runs the whole suite, then the
# power-loss suite's short form, and builds DocumentEngine's DocC documentation with warnings
# as errors. Exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."

./scripts/install-deps.sh --test

# The PostgreSQL store's tests need a server: a local one on loopback unless one is given.
if [ -z "${DOCFS_TEST_POSTGRES_URL:-}" ]; then
    DOCFS_TEST_POSTGRES_URL=$(./scripts/postgres.sh start)
fi
export DOCFS_TEST_POSTGRES_URL

swift build --build-tests
# A hung test (a FUSE mount that never answers) must fail this run, not stall it: give the
# whole suite a generous limit, then unmount anything the tests left behind.
status=0
timeout --signal=INT --kill-after=60 "${DOCFS_TEST_TIMEOUT:-1500}" swift test --skip-build "$@" || status=$?
# Only mounts whose server is gone (this run's test process has exited, so its mounts answer
# ENOTCONN at once): test runs of other checkouts on the same machine are still serving theirs.
leftover=$(awk '$3 ~ /^fuse/ && $2 ~ /docfs-/ {print $2}' /proc/self/mounts)
for mountpoint in $leftover; do
    if timeout -k 1 5 stat -c %i "$mountpoint" >/dev/null 2>&1; then continue; fi
    echo "unmounting a mount the tests left behind: $mountpoint" >&2
    fusermount3 -u -z "$mountpoint" 2>/dev/null || umount -l "$mountpoint" 2>/dev/null || true
done
if [ "$status" -eq 124 ]; then echo "error: the test suite did not finish within its time limit" >&2; fi

# The power-loss suite's short form: the checker's self-test, then rounds on SQLite with the
# store under lossyfs (scripts/power-loss.sh; about 10 s a round; DOCFS_POWER_LOSS_ROUNDS=0
# skips it). Its seed is printed; `scripts/power-loss.sh 1 SEED` replays a failing round.
python3 scripts/reliability/power_loss.py selftest || status=1
rounds=${DOCFS_POWER_LOSS_ROUNDS:-5}
if [ "$rounds" -gt 0 ]; then
    DOCFS_BIN=.build/debug/docfs LOSSYFS_BIN=.build/debug/lossyfs timeout -k 30 600 \
        scripts/power-loss.sh "$rounds" || status=1
fi
# Two mounts and a PostgreSQL server on hosts of their own (network namespaces): a partition
# while a lock is held, healing, a killed daemon, a server restart (about a minute;
# DOCFS_PARTITION_TEST=0 skips it).
if [ "${DOCFS_PARTITION_TEST:-1}" != 0 ]; then
    DOCFS_BIN=.build/debug/docfs scripts/partition-test.sh || status=1
fi
# DocumentEngine's DocC documentation must build with no warnings (about half a minute).
if ! ./scripts/docs.sh docc; then
    echo "error: DocumentEngine's documentation has warnings (scripts/docs.sh docc)" >&2
    [ "$status" -ne 0 ] || status=1
fi
exit "$status"
