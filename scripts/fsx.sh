#!/usr/bin/env bash
# Random-operation model test, long form: scripts/fsx.sh [SEED] [OPS]
#
# Mounts a fresh store with `docfs mount -f`, runs scripts/reliability/fsx.py for OPS operations
# in a package (seed SEED) and OPS/4 at the mount root (flat documents, seed SEED+1), each result
# checked against the model; then unmounts and checks that the store (`docfs export`) holds
# exactly the model's final files and that `docfs fsck` is clean. Prints the seed; exits non-zero
# on a failure (fsx prints the operation log).
# DOCFS_BIN: the docfs program (default: .build/debug/docfs, built if missing).
set -euo pipefail
cd "$(dirname "$0")/.."
seed=${1:-$(( $(date +%s) % 100000 ))}
ops=${2:-20000}
echo "fsx: seed $seed, $ops operations"
source scripts/reliability/common.sh fsx
fsx=$(readlink -f scripts/reliability/fsx.py)
timeout 30 "$docfs" create "$store" >/dev/null
limit=$(( 120 + ops / 20 ))
timeout -k 5 $((limit * 2)) "$docfs" mount -f "$store" "$mnt" 2>"$work/daemon.log" &
timer=$!
for _ in $(seq 200); do grep -q " $mnt " /proc/self/mounts && break; sleep 0.05; done
mkdir "$mnt/F.pkg"
status=0
timeout -k 5 "$limit" python3 "$fsx" "$mnt/F.pkg" "$seed" "$ops" --model-out "$work/model-pkg" >"$work/fsx-pkg.out" || status=1
head -1 "$work/fsx-pkg.out"
timeout -k 5 "$limit" python3 "$fsx" "$mnt" "$((seed + 1))" "$((ops / 4))" --model-out "$work/model-root" >"$work/fsx-root.out" || status=1
head -1 "$work/fsx-root.out"
timeout 60 "$docfs" unmount "$mnt" || status=1
wait "$timer" || { echo "the daemon exited with $?"; status=1; }
timer=
timeout 120 "$docfs" fsck "$store" || { echo "PROBLEM: fsck is not clean"; status=1; }
mkdir "$work/export"
timeout 120 "$docfs" export "$store" F.pkg "$work/export/F.pkg" >/dev/null
diff -r "$work/model-pkg" "$work/export/F.pkg" || { echo "PROBLEM: the store's F.pkg differs from the model"; status=1; }
mkdir "$work/export/root"
for f in "$work"/model-root/*; do
    name=$(basename "$f")
    timeout 30 "$docfs" export "$store" "$name" "$work/export/root/$name" >/dev/null || status=1
done
diff -r "$work/model-root" "$work/export/root" || { echo "PROBLEM: the store's flat documents differ from the model"; status=1; }
if [ "$status" -eq 0 ]; then echo "fsx: OK (seed $seed, $ops operations)"; else echo "fsx: FAILED (seed $seed, $ops operations)"; fi
exit "$status"
