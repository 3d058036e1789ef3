#!/usr/bin/env bash
# Profiles the docfs daemon while a command runs: mounts STORE at MOUNTPOINT with the release
# `docfs mount`, samples the daemon's CPU with perf (cpu-clock, DWARF call graphs) for as long
# as COMMAND runs, unmounts, and prints where the time went by function and by source line
# (scripts/perf-lines.py). The command runs in MOUNTPOINT's parent folder.
#
#   scripts/profile-daemon.sh STORE MOUNTPOINT -- COMMAND [ARGUMENTS…]
#   e.g. scripts/profile-daemon.sh /var/tmp/p/s.docstore /var/tmp/p/mnt -- \
#            .build-bench/release/docfs-bench seqread /var/tmp/p/mnt/big.pkg/stream.bin
#
# Why not callgrind: valgrind 3.19 cannot read the DWARF 5 that Swift 6.3 emits and crashes on
# the async main's dispatch_main; and perf's hardware counters are not available on a VM like
# ours. The software clock samples wall-clock CPU use, which is what a benchmark figure costs.
# Settings: PERF_FREQUENCY (default 999 Hz), PROFILE_OUT (the perf data; default in /tmp).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
if [ $# -lt 4 ] || [ "$3" != "--" ]; then
    sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
    exit 2
fi
store=$1 mountpoint=$2
shift 3
command -v perf >/dev/null || ./scripts/install-deps.sh linux-perf
swift build -c release --product docfs >&2
docfs=$repo/.build/release/docfs
out=${PROFILE_OUT:-$(mktemp /tmp/docfs-profile.XXXXXX.data)}
export XDG_STATE_HOME=${XDG_STATE_HOME:-$(mktemp -d /tmp/docfs-profile-state.XXXXXX)}

"$docfs" mount "$store" "$mountpoint"
name=${mountpoint//%/%25}
pid=$(awk 'NR==1 {print $1}' "$XDG_STATE_HOME/docfs/mounts/${name//\//%2F}.pid")
perf record -e cpu-clock -F "${PERF_FREQUENCY:-999}" --call-graph dwarf -o "$out" -p "$pid" 2>/dev/null &
recorder=$!
sleep 0.5
status=0
start=$EPOCHREALTIME
"$@" || status=$?
end=$EPOCHREALTIME
kill -INT "$recorder"
wait "$recorder" || true
"$docfs" unmount "$mountpoint"
echo "the command took $(awk -v a="$start" -v b="$end" 'BEGIN {printf "%.3f", b - a}') s (status $status); profile: $out" >&2
python3 "$repo/scripts/perf-lines.py" "$out" "$repo/.build/x86_64-unknown-linux-gnu/release/docfs" "${PROFILE_TOP:-30}"
