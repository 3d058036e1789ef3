#!/usr/bin/env bash
# Power-loss test of the mount: scripts/power-loss.sh [ROUNDS] [SEED] [--postgres] [--kill-only]
#
# The store's files live under lossyfs (Tests/LossyFS), a FUSE file system that keeps every
# write and name change nobody made durable in memory and drops them all at a power cut:
# SQLite's store file and everything beside it in a folder on it, or, with --postgres, the data
# folder of a PostgreSQL server this script starts on a private port. Each round mounts the
# store with the real daemon (`docfs mount -f`), runs WRITERS (default 3) writer processes
# (scripts/reliability/power_loss.py) at the mount root and in a package, and at a seeded
# moment SIGKILLs the daemon (and the server), cuts lossyfs's power, mounts lossyfs again on the
# same backing folder (a reboot), restarts the server, and checks: `docfs fsck` is clean; a
# sample of new versions read with `docfs export --at` is whole; then, through a new mount,
# every acknowledged write and name is there, and every new version under `.docfs/versions` is
# whole (power_loss.py check). Every round prints its seed: `scripts/power-loss.sh 1 SEED`
# runs that round again (on a fresh store). Exits non-zero when anything was lost.
# --kill-only: SIGKILL only, no power cut (lossyfs unmounts cleanly, keeping every write: the
# page cache survives), to tell the losses a kill causes from those only a power cut does.
#
# DOCFS_BIN, LOSSYFS_BIN: the programs (default: .build/debug/…, built if missing). KEEP=1 keeps
# the work folder. LOSSYFS_OPTIONS: more lossyfs options (-o names=posix).
set -euo pipefail
cd "$(dirname "$0")/.."
postgres=
kill_only=
positional=()
for argument in "$@"; do
    case $argument in
    --postgres) postgres=1 ;;
    --kill-only) kill_only=1 ;;
    *) positional+=("$argument") ;;
    esac
done
rounds=${positional[0]:-20}
seed=${positional[1]:-$(( $(date +%s) % 100000 ))}
writers=${WRITERS:-3}
kind=SQLite
[ -z "$postgres" ] || kind=PostgreSQL
echo "power-loss: $rounds rounds, seed $seed, $writers writers, store on $kind${kill_only:+, kill only (no power cut)}"

source scripts/reliability/common.sh powerloss
lossyfs=${LOSSYFS_BIN:-}
if [ -z "$lossyfs" ]; then
    lossyfs=.build/debug/lossyfs
    [ -x "$lossyfs" ] || swift build --product lossyfs >&2
fi
lossyfs=$(readlink -f "$lossyfs")
driver=$(readlink -f scripts/reliability/power_loss.py)
backing=$work/backing
lossy=$work/lossy
mkdir "$backing" "$lossy" "$work/logs"
chmod 755 "$work"
lossy_pid=
pg_pid=
writer_pids=()
pgbin=/usr/lib/postgresql/15/bin

as_postgres() { runuser -u postgres -- "$@"; }

mounted() { grep -q " $1 " /proc/self/mounts; }

wait_mounted() {
    for _ in $(seq 200); do
        mounted "$1" && return 0
        sleep 0.05
    done
    echo "$1 never came up" >&2
    return 1
}

start_lossyfs() {
    # shellcheck disable=SC2086
    "$lossyfs" "$backing" "$lossy" ${LOSSYFS_OPTIONS:-} 2>>"$work/lossyfs.log" &
    lossy_pid=$!
    wait_mounted "$lossy"
}

start_postgres() {
    # After a crash pg_ctl warns that the old lock file is still there: only its failure is news.
    if ! as_postgres "$pgbin/pg_ctl" -D "$lossy/pg/data" -l "$work/pg/server.log" -w -t 120 start -o \
        "-p $port -k $work/pg -c listen_addresses=127.0.0.1 -c max_connections=40 -c shared_buffers=32MB" \
        >"$work/pg/pg_ctl.log" 2>&1; then
        cat "$work/pg/pg_ctl.log" >&2
        tail -20 "$work/pg/server.log" >&2
        return 1
    fi
    pg_pid=$(head -1 "$lossy/pg/data/postmaster.pid")
}

# The daemon, the server and lossyfs, as they would go at a power cut (SIGKILL, then the cut).
crash() {
    if [ -n "$daemon_pid" ]; then kill -KILL "$daemon_pid" 2>/dev/null || true; fi
    # pg_ctl starts the server in a session of its own: its backends are in the group.
    local pg_group=$pg_pid
    if [ -n "$pg_pid" ]; then kill -KILL -- "-$pg_pid" 2>/dev/null || kill -KILL "$pg_pid" 2>/dev/null || true; fi
    pg_pid=
    if [ -n "$lossy_pid" ]; then
        if [ -n "$kill_only" ]; then kill -TERM "$lossy_pid"; else kill -USR1 "$lossy_pid"; fi
        wait "$lossy_pid" || echo "lossyfs exited with $? at the cut" >&2
    fi
    lossy_pid=
    if mounted "$lossy"; then fusermount3 -u -z "$lossy"; fi
    # A killed process waiting on the file system ends once the cut fails its request; a new
    # server refuses to start while the old one's processes hold its shared memory.
    if [ -n "$pg_group" ]; then
        for _ in $(seq 200); do pgrep -g "$pg_group" >/dev/null || break; sleep 0.05; done
    fi
    # A killed daemon waiting in the kernel for a page lock never ends: abort its connection
    # (see crash-test.sh).
    for _ in $(seq 60); do kill -0 "$timer" 2>/dev/null || break; sleep 0.05; done
    if kill -0 "$timer" 2>/dev/null && [ -w "/sys/fs/fuse/connections/$connection/abort" ]; then
        echo 1 >"/sys/fs/fuse/connections/$connection/abort"
    fi
    wait "$timer" 2>/dev/null || true
    daemon_pid=
    timer=
    if mounted "$mnt"; then timeout 20 fusermount3 -u -z "$mnt"; fi
    for pid in "${writer_pids[@]}"; do wait "$pid" || echo "writer $pid exited with $?" >&2; done
    writer_pids=()
}

shutdown_all() {
    # timeout passes SIGTERM on to its writer.
    for pid in "${writer_pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    for pid in "${writer_pids[@]}"; do wait "$pid" 2>/dev/null || true; done
    writer_pids=()
    if [ -n "$daemon_pid" ]; then
        timeout 60 "$docfs" unmount "$mnt" || kill -KILL "$daemon_pid" 2>/dev/null || true
        wait "$timer" 2>/dev/null || true
        daemon_pid=
        timer=
    fi
    if mounted "$mnt"; then fusermount3 -u -z "$mnt" || true; fi
    if [ -n "$pg_pid" ]; then
        as_postgres "$pgbin/pg_ctl" -D "$lossy/pg/data" -m fast -w -t 60 stop >/dev/null \
            || kill -KILL -- "-$pg_pid" 2>/dev/null || true
        pg_pid=
    fi
    if [ -n "$lossy_pid" ]; then
        kill -TERM "$lossy_pid" 2>/dev/null || true
        wait "$lossy_pid" 2>/dev/null || true
        lossy_pid=
    fi
    if mounted "$lossy"; then fusermount3 -u -z "$lossy" || true; fi
}
trap 'shutdown_all; cleanup' EXIT

# The store, made durable before the first round: on the backing folder directly.
if [ -n "$postgres" ]; then
    [ "$(id -u)" -eq 0 ] || { echo "--postgres needs root (the server runs as the postgres user)" >&2; exit 2; }
    [ -x "$pgbin/postgres" ] || scripts/install-deps.sh postgresql >&2
    port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    mkdir -p "$backing/pg" "$work/pg"
    chown postgres:postgres "$backing/pg" "$work/pg"
    chmod 700 "$backing/pg"
    as_postgres "$pgbin/initdb" -D "$backing/pg/data" -U postgres --auth=trust --no-sync -E UTF8 \
        >"$work/pg/initdb.log" 2>&1 || { cat "$work/pg/initdb.log" >&2; exit 1; }
    store="postgres://postgres@127.0.0.1:$port/docfs_powerloss"
    start_lossyfs
    start_postgres
    timeout 60 "$docfs" create "$store" >/dev/null
    kill -USR2 "$lossy_pid"  # everything durable, as after a sync: the store exists
else
    mkdir "$backing/store"
    timeout 30 "$docfs" create "$backing/store/S.docstore" >/dev/null
    store=$lossy/store/S.docstore
    start_lossyfs
fi
sync

problems=0
failed_rounds=()
# Boots after a cut (or at the start): the server, the offline checks of the store, the mount,
# and the check of the round before (if any) through it.
boot() {
    local checked=$1 checked_seed=$2
    [ -n "$lossy_pid" ] || start_lossyfs
    if [ -n "$postgres" ] && [ -z "$pg_pid" ]; then start_postgres; fi
    local bad=
    if ((checked > 0)); then
        if ! timeout 300 "$docfs" fsck "$store" >"$work/fsck.log" 2>&1; then
            echo "LOSS fsck: docfs fsck is not clean:"
            sed 's/^/  /' "$work/fsck.log" | head -20
            bad=1
        fi
        timeout 600 python3 "$driver" versions "$docfs" "$store" "$work/state" "$checked_seed" || bad=1
    fi
    timeout -k 5 600 "$docfs" mount -f "$store" "$mnt" 2>>"$work/daemon.log" &
    timer=$!
    wait_mounted "$mnt"
    daemon_pid=$(pgrep -P "$timer" | head -1)
    connection=$(mountpoint -d "$mnt" | cut -d: -f2)
    if ((checked > 0)); then
        timeout 600 python3 "$driver" check "$mnt" "$work/state" "$checked" "$checked_seed" \
            "$work"/logs/r"$checked"-w*.log || bad=1
        if [ -n "$bad" ]; then
            diagnose "$checked"
            problems=$((problems + 1))
            failed_rounds+=("$checked_seed")
            echo "round $checked FAILED: replay with scripts/power-loss.sh 1 $checked_seed${postgres:+ --postgres}"
        fi
    fi
}

# What the store says happened, for a failed round: its documents and its last events (each
# save, rename and delete, with the version it made), beside the writers' logs in the kept folder.
diagnose() {
    local out=$work/diagnosis-r$1.txt
    local sql="SELECT id, name, current_version, deleted FROM documents ORDER BY id;
        SELECT sequence, kind, document, version, name, origin FROM events ORDER BY sequence DESC LIMIT 400;"
    if [ -n "$postgres" ]; then
        psql -X -q -h "$work/pg" -p "$port" -U postgres -d docfs_powerloss -c "$sql" >"$out" 2>&1 || true
    else
        sqlite3 -readonly "$store" "$sql" >"$out" 2>&1 || true
    fi
    echo "  the store's documents and last events: $out"
}

round_seed=$seed
previous_seed=0
for ((round = 1; round <= rounds; round++)); do
    boot $((round - 1)) "$previous_seed"
    if [ ! -d "$mnt/Crash.pkg" ]; then
        timeout 10 mkdir "$mnt/Crash.pkg"
        timeout 10 python3 -c 'import os, sys; fd = os.open(sys.argv[1], os.O_RDONLY); os.fsync(fd)' "$mnt"
    fi
    for ((w = 0; w < writers; w++)); do
        timeout -k 5 300 python3 "$driver" writer "$mnt" "$w" "$round" "$round_seed" "$work/logs/r$round-w$w.log" &
        writer_pids+=($!)
    done
    # The cut comes 0.2–3.2 s (seeded) after every writer has read and synced its files.
    for _ in $(seq 400); do
        [ "$(cat "$work"/logs/r"$round"-w*.log 2>/dev/null | grep -c '"started"')" -ge "$writers" ] && break
        sleep 0.05
    done
    RANDOM=$round_seed
    delay=$((200 + RANDOM % 3000))
    sleep "$(printf '%d.%03d' $((delay / 1000)) $((delay % 1000)))"
    crash
    printf 'round %d (seed %d): power cut %d ms into the work, %d calls logged\n' "$round" "$round_seed" "$delay" \
        "$(cat "$work"/logs/r"$round"-w*.log | wc -l)"
    previous_seed=$round_seed
    round_seed=$(((round_seed * 48271 + 12345) % 2147483647))
done
boot "$rounds" "$previous_seed"

python3 - "$work/state.stats" <<'EOF'
import collections, json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
kinds = collections.Counter(k for r in rows for k in r["problems"])
print(f"power-loss: {len(rows)} rounds checked, {sum(r['acked'] for r in rows)} acknowledged syncs "
      f"({sum(r['fsync'] for r in rows)} fsync, {sum(r['dir'] for r in rows)} of folders), "
      f"{sum(r['ops'] for r in rows)} writes and name changes, {sum(r['writer_errors'] for r in rows)} writer errors")
print("losses by kind: " + (", ".join(f"{k} {n}" for k, n in sorted(kinds.items())) or "none"))
EOF
if ((problems == 0)); then
    status=0
    echo "power-loss: OK (seed $seed, $rounds rounds)"
else
    echo "power-loss: FAILED in $problems of $rounds rounds (seed $seed); failing round seeds: ${failed_rounds[*]}"
fi
exit "$status"
