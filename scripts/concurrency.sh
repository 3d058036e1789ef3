#!/usr/bin/env bash
# Concurrency test, long form: scripts/concurrency.sh [SEED] [PROCESSES] [THREADS] [ITERATIONS]
#
# Mounts a fresh store with `docfs mount -f`, runs scripts/reliability/concurrency.py (PROCESSES
# processes of THREADS threads rewriting their own byte ranges of one shared file, their own
# files in a shared package, their own packages and flat documents, and reading each other's),
# checks through the mount that no update was lost, unmounts and checks the same in the store
# (`docfs export`) and with `docfs fsck`. Everything runs under `timeout`: a deadlock fails it.
set -euo pipefail
cd "$(dirname "$0")/.."
seed=${1:-$(( $(date +%s) % 100000 ))}
processes=${2:-4}
threads=${3:-8}
iterations=${4:-200}
echo "concurrency: seed $seed, $processes processes x $threads threads x $iterations iterations"
source scripts/reliability/common.sh conc
script=$(readlink -f scripts/reliability/concurrency.py)
timeout 30 "$docfs" create "$store" >/dev/null
limit=$(( 120 + processes * threads * iterations / 20 ))
timeout -k 5 $((limit * 2)) "$docfs" mount -f "$store" "$mnt" 2>"$work/daemon.log" &
timer=$!
for _ in $(seq 200); do grep -q " $mnt " /proc/self/mounts && break; sleep 0.05; done
status=0
timeout -k 5 "$limit" python3 "$script" "$mnt" "$seed" "$processes" "$threads" "$iterations" --expect "$work/expected" || status=1
timeout 60 "$docfs" unmount "$mnt" || status=1
wait "$timer" || { echo "the daemon exited with $?"; status=1; }
timer=
timeout 120 "$docfs" fsck "$store" || { echo "PROBLEM: fsck is not clean"; status=1; }
mkdir "$work/export"
for item in "$work"/expected/*; do
    timeout 60 "$docfs" export "$store" "$(basename "$item")" "$work/export/" >/dev/null || status=1
done
diff -r "$work/expected" "$work/export" || { echo "PROBLEM: the store differs from the writers' last records"; status=1; }
if [ "$status" -eq 0 ]; then echo "concurrency: OK (seed $seed)"; else echo "concurrency: FAILED (seed $seed)"; fi
exit "$status"
