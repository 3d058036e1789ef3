#!/usr/bin/env bash
# Crash test of the mount: scripts/crash-test.sh [ROUNDS] [SEED] [WRITERS]
#
# Each round mounts a store with the real daemon (`docfs mount -f`), runs WRITERS writer
# processes (scripts/reliability/crash.py) that rewrite files at the root and in a package, some
# with fsync (logged outside the mount once fsync returned 0), kills the daemon with SIGKILL at a
# seeded random moment, lazily unmounts the dead mount and starts again. At the end, through the
# store alone: `docfs fsck` is clean, and every file exported from the store is one complete
# record, at least as new as the last acknowledged fsync (crash.py check). Exits non-zero on a
# problem; prints the seed.
#
# DOCFS_BIN: the docfs program (default: .build/debug/docfs, built if missing).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-20}
seed=${2:-$(( $(date +%s) % 100000 ))}
writers=${3:-3}
echo "crash-test: $rounds rounds, seed $seed, $writers writers"

source scripts/reliability/common.sh crash
crash=$(readlink -f scripts/reliability/crash.py)

timeout 30 "$docfs" create "$store" >/dev/null
RANDOM=$seed
kills=0
for ((round = 1; round <= rounds; round++)); do
    timeout -k 5 300 "$docfs" mount -f "$store" "$mnt" 2>>"$work/daemon.log" &
    timer=$!
    for _ in $(seq 200); do
        grep -q " $mnt " /proc/self/mounts && break
        sleep 0.05
    done
    grep -q " $mnt " /proc/self/mounts || { echo "round $round: the mount never came up" >&2; status=1; exit 1; }
    daemon_pid=$(pgrep -P "$timer" | head -1)
    # The FUSE connection's number (the mount's device minor), to abort it if the kill hangs.
    connection=$(mountpoint -d "$mnt" | cut -d: -f2)
    [ -d "$mnt/Crash.pkg" ] || timeout 10 mkdir "$mnt/Crash.pkg"
    pids=()
    for ((w = 0; w < writers; w++)); do
        timeout -k 5 60 python3 "$crash" writer "$mnt" "$w" "$round" "$seed" "$work/writer$w.log" 30 &
        pids+=($!)
    done
    # Kill between 0.3 and 3 s into the load (seeded).
    delay=$(( 300 + RANDOM % 2700 ))
    sleep "$(printf '%d.%03d' $((delay / 1000)) $((delay % 1000)))"
    kill -KILL "$daemon_pid"
    kills=$((kills + 1))
    # A kill can catch the daemon's notification thread invalidating a file's cached pages
    # while a read of one of them waits for an answer the dead daemon will never give: the
    # thread waits for the page lock in the kernel, uninterruptibly, so the process never
    # ends and the connection is never closed. Aborting the connection (fusectl) fails the
    # pending requests and lets it end; the writers then see ENOTCONN, as after any kill.
    for _ in $(seq 60); do kill -0 "$timer" 2>/dev/null || break; sleep 0.05; done
    if kill -0 "$timer" 2>/dev/null && [ -w "/sys/fs/fuse/connections/$connection/abort" ]; then
        echo "round $round: the killed daemon did not end; aborting FUSE connection $connection" >&2
        echo 1 >"/sys/fs/fuse/connections/$connection/abort"
    fi
    wait "$timer" 2>/dev/null || true
    daemon_pid=
    for pid in "${pids[@]}"; do wait "$pid" || echo "round $round: writer $pid exited with $?" >&2; done
    timeout 20 fusermount3 -u -z "$mnt"
    printf 'round %d: killed after %d ms, %d writes begun so far\n' "$round" "$delay" \
        "$(cat "$work"/writer*.log | grep -c '^begin')"
done

echo "checking the store after $kills kills"
status=0
timeout 120 "$docfs" fsck "$store" || { echo "PROBLEM: fsck is not clean"; status=1; }
mkdir "$work/export"
timeout 120 "$docfs" export "$store" Crash.pkg "$work/export/Crash.pkg" >/dev/null
for ((w = 0; w < writers; w++)); do
    for k in 0 1; do
        if timeout 30 "$docfs" ls "$store" | grep -q "W$w-$k.txt"; then
            timeout 30 "$docfs" export "$store" "W$w-$k.txt" "$work/export/W$w-$k.txt" >/dev/null
        fi
    done
done
python3 "$crash" check "$work/export" "$work"/writer*.log || status=1
# The store must mount again and show the same files.
timeout -k 5 60 "$docfs" mount -f "$store" "$mnt" 2>>"$work/daemon.log" &
timer=$!
for _ in $(seq 200); do grep -q " $mnt " /proc/self/mounts && break; sleep 0.05; done
if ! timeout 60 diff -r "$work/export/Crash.pkg" "$mnt/Crash.pkg" >/dev/null; then
    echo "PROBLEM: the remounted Crash.pkg differs from the store's export"; status=1
fi
timeout 30 "$docfs" unmount "$mnt" || status=1
wait "$timer" || { echo "PROBLEM: the last daemon exited with $?"; status=1; }
timer=
if [ "$status" -eq 0 ]; then echo "crash-test: OK (seed $seed, $rounds rounds)"; else echo "crash-test: FAILED (seed $seed)"; fi
exit "$status"
