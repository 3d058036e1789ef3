#!/usr/bin/env bash
# DocFS against the native file system, measured in the same run.
#
#   scripts/bench.sh [--quick]
#
# Creates fresh stores (SQLite files, or databases on PostgreSQL), mounts them with the real
# `docfs mount`, and runs every figure (B1–B7, B8 with a second mount of the same store, B9, B10
# and the FUSE layer's micro-benchmark) on the mount and on a native folder holding the same
# files, interleaved, BENCH_ROUNDS times (default 3). Prints a table (median with min–max, native
# median, ratio, target, met or not) and writes a JSON file with every sample.
#
# The figures (their function names, for BENCH_ONLY):
#   b1   `ls -l` of a package of many wrappers and of a root of many documents, cold and warm,
#        also on the peer (copies of both folders under it)
#   b2   incremental saves (an append, an image replaced, vim): time and bytes the store grew
#   b3   sequential write and read of a big wrapper, with the daemon's peak RSS (B7)
#   b4   4 KiB random reads and writes (fio), also on the peer (a copy of the file under it),
#        with the daemon's peak RSS through both (B7)
#   b5   create, stat and delete many small files; with passthrough_ll as the peer, also on a
#        second passthrough_ll mounted with the kernel options DocFS mounts with
#        (default_permissions, writeback cache), as info: what those options cost any FUSE file
#        system (with them the kernel asks for the folder's attributes before each unlink, and
#        writes an unlinked file's change time back)
#   b6   the engine: Document.open and a one-wrapper save, store vs folder
#   b7   the daemon's peak RSS with many documents open
#   b8   a save and a new document through one mount, seen through a second mount of the store
#   b9   whole-file save of a small edit: `sed -i '1i …'` (a new file renamed over the old one)
#        on a 64 MiB text wrapper (16 MiB small) + fsync: the bytes the store grew by (SQLite:
#        DB + WAL after an emptied WAL; PostgreSQL: the WAL records, as B2), target ≤ 2 MiB;
#        the content bytes the store wrote and the time of the sed run (also on the native copy)
#        as info
#   b10  history thins and space comes back: in a store of its own, fsx (scripts/reliability/
#        fsx.py) runs 20,000 operations (5,000 small) in a package through a mount; then
#        unmounted, `docfs gc --keep-last 1 --keep-for 0`, and the store's size after it (SQLite:
#        the file + -wal + -shm + its packs; PostgreSQL: pg_database_size, the gc VACUUMs), target ≤ 20 MiB;
#        the size before the gc and the fsx and gc times as info. One round whatever
#        BENCH_ROUNDS is; no native side
#   b11  copy offload: `cp` of the 1 GiB wrapper (64 MiB small) to a new name beside it and
#        `sync` of the copy; the time (target ≤ 0.2 s; native ext4 copies the bytes) and the
#        bytes the store grew by (as B2), target ≤ 1 MiB; the content bytes it wrote as info
#   b12  safe-save (a temporary file, 4 KiB, fsync, rename over a file, fsync of the folder) and
#        unlink + create + write + fsync of a name, in a folder of BENCH_FILES files: medians of
#        30 each, on the mount (in a package), natively and on the peer
#   b13  fsx: 20,000 random operations on one file (xfstests' `ltp/fsx -N 20000 -S ROUND` when
#        BENCH_FSX names that program, built by hand outside the checkout; otherwise
#        scripts/reliability/fsx.py with the same count and seed), its time in seconds on the
#        mount (in a package), natively and on the peer; target ≤ 1.5× the peer.
#        The seed is the round's: with one seed for all rounds, every round after the first
#        wrote the bytes the first had stored, and the store kept none of them again (about
#        250 MB of versions in the first round, under 1 MB in the next).
#        fsx.py fails on passthrough_ll, which refuses fallocate; xfstests' fsx turns off what
#        a file system refuses, so with that peer only BENCH_FSX gives the row a peer figure
#   b14  two writers (concurrency): a writer replaces its own document's 32 MiB file
#        (8 MiB small) with new bytes 6 times (O_TRUNC, write, fsync); the time of one writer
#        alone, then of two at once in two documents, and 2 × alone ÷ together: how much of
#        the second core the mount lets two writers use (target ≥ 1.7). Also natively and on
#        the peer, as info
#   b15  locks between two mounts of a store of its own, both mounted with no_writeback_cache
#        (scripts/bench-locks.py): an uncontended flock + unlock (median of 200), also natively;
#        the same through the second mount right after one through the first; the handover
#        from an unlock on one mount to a flock blocked on the other (median of 30, target
#        ≤ 20 ms); two processes through two mounts running 1,000 SQLite transactions each
#        (200 small; journal_mode=DELETE, BEGIN IMMEDIATE, one INSERT) in a package: their
#        transactions per second, against the same two processes on one mount and natively, and
#        the rows missing (target 0, integrity_check counted); a counter incremented 1,000
#        times from each mount under flock: the increments missing (target 0)
#   fuse_layer  the FUSE layer's micro-benchmark (scripts/fuse-bench.sh)
#
# The peer: B1, B4, B5, B12, B13 and B14 also run on a FUSE passthrough file system beside the native
# folder, so that the table's "DocFS ÷ peer" shows what is FUSE's cost and what is DocFS's.
# BENCH_PEER chooses it: libfuse's own `passthrough_ll` (the default), compiled from the examples
# folder of Debian's libfuse3-dev (its default options: no writeback cache, its own timeouts), or
# `mergerfs` (Debian's package, installed if missing) over one branch with the options its
# documentation gives for performance (listed where it is mounted). The table's header, the
# report's first lines and the JSON's meta (peer, peer_options, peer_version) name the peer that
# ran, or "none" when it could not be built, installed or mounted (the run goes on without it).
#
# A benchmark, not a test: missed targets never make it fail, and scripts/test.sh does not
# run it. Needs root (or sudo) to drop the page cache for the cold figures; without it the
# "cold" figures are only as cold as the page cache happens to be, and it says so.
#
# Settings (environment):
#   BENCH_SIZE=full|small  full: 1 GiB wrappers, 10,000 files, 1,000 documents (the README's
#                          figures); small (or --quick): 64 MiB, 1,000 files, 100 documents,
#                          a smoke test of a few minutes
#   BENCH_ROUNDS=N         rounds per figure (default 3; B10 runs once)
#   BENCH_TRANSACTIONS=N   B15's SQLite transactions and counter increments per process
#                          (default 1,000, small 200)
#   BENCH_ONLY=LIST        only these figures, a comma list of the names above (default all:
#                          b1,…,b15,fuse_layer); the data and stores are made as for a whole run
#   BENCH_STORE=sqlite|postgres|both
#                          the store the mounts serve (default sqlite): an SQLite file beside the
#                          native folder, or databases on a PostgreSQL server (both: one run each,
#                          SQLite first); B2's "bytes written" are then the WAL PostgreSQL wrote
#                          (records, and full-page images apart where pg_walinspect can be made)
#   BENCH_POSTGRES_URL=URL the server for BENCH_STORE=postgres, any database on it (default: the
#                          loopback server of scripts/postgres.sh, started if it is not running);
#                          the run creates its own databases there and drops them afterwards
#   BENCH_DIR=PATH         where the native folder and the store go (default /var/tmp/docfsbench;
#                          a local disk: the native figures are that file system's)
#   BENCH_OUT=PATH         the JSON file (default bench-results/bench-DATE.json)
#   BENCH_PEER=passthrough_ll|mergerfs
#                          the FUSE passthrough peer of B4, B5, B12, B13 and B14 (default
#                          passthrough_ll; see "The peer" above)
#   BENCH_KEEP=1           keep the data and the daemon logs afterwards
set -uo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)

size=${BENCH_SIZE:-full}
for argument in "$@"; do
    case $argument in
    --quick) size=small ;;
    -h | --help)
        sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'
        exit 0
        ;;
    *)
        echo "bench: unknown argument $argument (try --help)" >&2
        exit 2
        ;;
    esac
done
rounds=${BENCH_ROUNDS:-3}
all_figures="b1 b2 b3 b4 b5 b6 b7 b8 b9 b10 b11 b12 b13 b14 b15 fuse_layer"
only=${BENCH_ONLY:-}
for figure in ${only//,/ }; do
    case " $all_figures " in
    *" $figure "*) ;;
    *)
        echo "bench: BENCH_ONLY: no figure $figure (the figures: ${all_figures// /,})" >&2
        exit 2
        ;;
    esac
done
# Whether BENCH_ONLY selects the figure function $1.
selected() { [ -z "$only" ] || [[ ",${only// /}," == *",$1,"* ]]; }
store_kind=${BENCH_STORE:-sqlite}
case $store_kind in
sqlite | postgres) ;;
both)
    # One whole run per store, each with its own native figures measured beside it.
    status=0
    BENCH_STORE=sqlite "$0" "$@" || status=$?
    BENCH_STORE=postgres "$0" "$@" || status=$?
    exit "$status"
    ;;
*)
    echo "bench: BENCH_STORE must be sqlite, postgres or both" >&2
    exit 2
    ;;
esac
export BENCH_STORE=$store_kind
peer_kind=${BENCH_PEER:-passthrough_ll}
case $peer_kind in
passthrough_ll | mergerfs) ;;
*)
    echo "bench: BENCH_PEER must be passthrough_ll or mergerfs" >&2
    exit 2
    ;;
esac
if [ "$rounds" -lt 3 ]; then echo "bench: note: BENCH_ROUNDS=$rounds; figures for the README need at least 3" >&2; fi

MiB=$((1 << 20))
case $size in
full)
    big=$((1024 * MiB)) rand=$((256 * MiB)) files=10000 documents=1000 images=100
    save=$((64 * MiB)) fsx_ops=20000 two=$((32 * MiB)) transactions=1000
    ;;
small)
    big=$((64 * MiB)) rand=$((32 * MiB)) files=1000 documents=100 images=20
    save=$((16 * MiB)) fsx_ops=5000 two=$((8 * MiB)) transactions=200
    ;;
*)
    echo "bench: BENCH_SIZE must be full or small" >&2
    exit 2
    ;;
esac
transactions=${BENCH_TRANSACTIONS:-$transactions}
chunk_size=262144 # `docfs create`'s default; the B2 targets are "one chunk + metadata"

log() { printf '%s bench: %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

# --- What it needs ------------------------------------------------------------------------

# fio (random I/O), vim (B2's editor), sqlite3 (WAL checkpoints between B2 samples).
./scripts/install-deps.sh fio vim sqlite3 || exit 1
if [ "$store_kind" = postgres ]; then
    postgres_url=${BENCH_POSTGRES_URL:-$(./scripts/postgres.sh start)} || exit 1
    command -v psql >/dev/null || ./scripts/install-deps.sh postgresql || exit 1
fi

log "building docfs and the benchmark helper (release)"
swift build -c release --product docfs >&2 || exit 1
swift build -c release --package-path Benchmarks --scratch-path .build-bench >&2 || exit 1
docfs=$repo/.build/release/docfs
helper=$repo/.build-bench/release/docfs-bench

# Not "docfs-…": scripts/test.sh detaches every FUSE mount whose path contains that, machine-wide,
# when it finishes, and a test run elsewhere on the machine would end this one's mounts.
base=${BENCH_DIR:-/var/tmp/docfsbench}
mkdir -p "$base" || exit 1
work=$(mktemp -d "$base/run.XXXXXX") || exit 1
native=$work/native
native_roots=$work/native-roots
if [ "$store_kind" = postgres ]; then
    # Databases of this run's own, named after its folder, on the server of postgres_url.
    database_prefix=docfsbench_$(basename "$work" | tr -c 'A-Za-z0-9\n' _ | tr 'A-Z' 'a-z')
    postgres_base=${postgres_url%%\?*} # postgres://user@host:port/database, then ?options
    postgres_query=${postgres_url#"$postgres_base"}
    database_url() { echo "${postgres_base%/*}/$1$postgres_query"; } # NAME
    store=$(database_url "${database_prefix}_main")
    roots_store=$(database_url "${database_prefix}_roots")
    engine_store=$(database_url "${database_prefix}_engine")
    history_store=$(database_url "${database_prefix}_history") # B10's, made by b10
    locks_store=$(database_url "${database_prefix}_locks")     # B15's, made by b15
    # psql reads no postgres:// password from the PG* variables the daemon takes: the URL carries it.
    psql_admin() { psql -X -q -v ON_ERROR_STOP=1 -At -d "$postgres_url" "$@"; }
else
    store=$work/store/bench.docstore
    roots_store=$work/store/roots.docstore
    engine_store=$work/store/engine.docstore
    history_store=$work/store/history.docstore
    locks_store=$work/store/locks.docstore
fi
mnt=$work/mnt
mnt_roots=$work/mnt-roots
mnt_second=$work/mnt-second
mnt_history=$work/mnt-history
mnt_locks_a=$work/mnt-locks-a
mnt_locks_b=$work/mnt-locks-b
samples=$work/samples.tsv
# The daemons' log and pid files stay with this run.
export XDG_STATE_HOME=$work/state
daemon_log=$XDG_STATE_HOME/docfs/docfs.log
mkdir -p "$native" "$native_roots" "$work/store" "$mnt" "$mnt_roots" "$mnt_second" "$mnt_history" \
    "$work/engine-native" "$XDG_STATE_HOME"
: >"$samples"

# The FUSE passthrough peer (BENCH_PEER), over a folder beside the native one (so both use the
# same disk), mounted for B1, B4, B5, B12, B13 and B14 once the data is made (below, "The peer").
# peer_name, peer_options and peer_version say which ran, for the report ("none" when none did).
peer_src=$work/peer-source
mnt_peer=$work/mnt-peer
# B5's second passthrough_ll, with DocFS's kernel options.
peerlike_src=$work/peerlike-source
mnt_peerlike=$work/mnt-peerlike
peer=""
peer_name=none peer_options="" peer_version=""

stamp=$(date +%Y%m%d-%H%M%S)
# The machine may be shared: the load around the run says how much to trust its figures.
load_start=$(cut -d' ' -f1-3 /proc/loadavg)
out=${BENCH_OUT:-$repo/bench-results/bench-$stamp-$store_kind.json}
mkdir -p "$(dirname "$out")"

fs_type=$(findmnt -n -o FSTYPE -T "$work" 2>/dev/null || stat -f -c %T "$work")
fs_source=$(findmnt -n -o SOURCE -T "$work" 2>/dev/null || echo "?")
log "native folder: $native ($fs_type on $fs_source); store: $store"
if [ "$store_kind" = postgres ]; then
    postgres_version=$(psql_admin -c "SHOW server_version") || exit 1
    postgres_data=$(psql_admin -c "SHOW data_directory" 2>/dev/null || echo "?")
    postgres_fs=$(findmnt -n -o FSTYPE,SOURCE -T "$postgres_data" 2>/dev/null | tr -s ' ' || echo "?")
    log "PostgreSQL $postgres_version at ${postgres_base%/*}, data in $postgres_data ($postgres_fs)"
fi

need=$((big * 8 + rand * 4 + save * 6 + 2048 * MiB))
avail=$(($(df -P -B1 "$work" | awk 'NR==2 {print $4}')))
if [ "$avail" -lt "$need" ]; then
    echo "bench: $work has $((avail / MiB)) MiB free; this run needs about $((need / MiB)) MiB" >&2
    rm -rf "$work"
    exit 1
fi

can_drop=0
if [ -w /proc/sys/vm/drop_caches ]; then
    can_drop=1
elif sudo -n true 2>/dev/null; then
    can_drop=2
else
    log "warning: cannot drop the page cache (not root, no sudo): the cold figures are not cold"
fi
drop_caches() {
    sync
    case $can_drop in
    1) echo 3 >/proc/sys/vm/drop_caches ;;
    2) echo 3 | sudo -n tee /proc/sys/vm/drop_caches >/dev/null ;;
    esac
}

# --- Mounts and the daemons ---------------------------------------------------------------

is_mounted() { findmnt -n "$1" >/dev/null 2>&1; }

mount_store() { # STORE MOUNTPOINT
    "$docfs" mount "$1" "$2" >&2
}

unmount_store() { # MOUNTPOINT
    is_mounted "$1" || return 0
    "$docfs" unmount "$1" >&2 && return 0
    # Still busy or hung: end the daemon this script started (by its pid), then detach.
    local pid
    pid=$(daemon_pid "$1")
    [ -n "$pid" ] && kill "$pid" 2>/dev/null
    sleep 2
    # A daemon stuck in its teardown ignores SIGTERM; left running, it would hold memory and the
    # store through the figures that follow.
    [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null
    fusermount3 -u -z "$1" 2>/dev/null || umount -l "$1" 2>/dev/null || true
}

# A fresh daemon: nothing in its memory, and (with the page cache dropped) nothing cached.
remount() { # STORE MOUNTPOINT
    unmount_store "$2"
    drop_caches
    mount_store "$1" "$2"
}

# The serving daemon's pid, from the pid file `docfs mount` keeps for `docfs unmount`.
daemon_pid() { # MOUNTPOINT
    local name=${1//%/%25}
    name=${name//\//%2F}
    local file=$XDG_STATE_HOME/docfs/mounts/$name.pid
    [ -f "$file" ] && awk 'NR==1 {print $1}' "$file"
}

# The daemon's store statistics (`kill -USR1` makes it log them): prints
# "chunksRead bytesRead chunksWritten bytesWritten nodesWritten".
daemon_statistics() { # MOUNTPOINT
    local pid before i line
    pid=$(daemon_pid "$1")
    [ -n "$pid" ] || return 1
    before=$(grep -c "pid=$pid .*store statistics:" "$daemon_log" 2>/dev/null || true)
    kill -USR1 "$pid" || return 1
    for i in $(seq 100); do
        line=$(grep "pid=$pid .*store statistics:" "$daemon_log" 2>/dev/null | tail -n 1 || true)
        if [ "$(grep -c "pid=$pid .*store statistics:" "$daemon_log" || true)" -gt "${before:-0}" ]; then
            echo "$line" | sed -E 's/.*chunksRead=([0-9]+) bytesRead=([0-9]+) chunksWritten=([0-9]+) bytesWritten=([0-9]+) nodesWritten=([0-9]+).*/\1 \2 \3 \4 \5/'
            return 0
        fi
        sleep 0.05
    done
    return 1
}
bytes_read() { daemon_statistics "$1" | awk '{print $2}'; }
bytes_written() { daemon_statistics "$1" | awk '{print $4}'; }

proc_io() { awk -v f="$2:" '$1 == f {print $2}' "/proc/$1/io"; }  # PID FIELD
peak_rss_reset() { echo 5 >"/proc/$1/clear_refs"; }                # PID
peak_rss_mib() { awk '/^VmHWM:/ {printf "%.1f", $2 / 1024}' "/proc/$1/status"; }

# Waits until process $1 has used no CPU for 0.3 s (at most 60 s): the saves an `fsync` left to
# the committer (the store's intent log) run after fio returns, and must neither be left out of
# the daemon's peak memory nor run into the next side's measurement.
wait_idle() { # PID
    local last now i
    last=$(awk '{print $14 + $15}' "/proc/$1/stat" 2>/dev/null) || return 0
    for i in $(seq 200); do
        sleep 0.3
        now=$(awk '{print $14 + $15}' "/proc/$1/stat" 2>/dev/null) || return 0
        [ "$now" = "$last" ] && return 0
        last=$now
    done
}

# --- The store's bytes on disk (B2) -------------------------------------------------------

# Moves the WAL into the database and empties it, so that what the next save writes is the
# WAL's size afterwards (plus any growth of the database file).
checkpoint() { # STORE
    local result i
    for i in $(seq 50); do
        result=$(sqlite3 -cmd ".timeout 5000" "$1" "PRAGMA wal_checkpoint(TRUNCATE);" 2>/dev/null)
        if [ "${result%%|*}" = "0" ] && [ "$(file_size "$1-wal")" -eq 0 ]; then return 0; fi
        sleep 0.1
    done
    log "warning: could not empty the WAL of $1 ($result)"
    return 1
}
file_size() { stat -c %s "$1" 2>/dev/null || echo 0; }
# The bytes of an SQLite store's packs (large chunks' bytes, in the folder beside it).
packs_size() {
    local total=0 pack
    for pack in "$1"-packs/*.pack; do
        if [ -f "$pack" ]; then total=$((total + $(file_size "$pack"))); fi
    done
    echo "$total"
}
store_bytes() { echo $(($(file_size "$1") + $(file_size "$1-wal") + $(packs_size "$1"))); }
# store_mark STORE prints a mark; store_written STORE MARK prints the bytes written since it, and
# for PostgreSQL the full-page images among them.
store_mark() { store_bytes "$1"; }
store_written() { echo $(($(store_bytes "$1") - $2)); }

# PostgreSQL: what a save writes is the WAL it generates (the data pages follow at the server's
# next checkpoint, as SQLite's WAL frames follow into the database file). The WAL position is the
# server's, so this counts every database on it: the run's own server should be otherwise idle.
# No checkpoint is forced between samples. The first change of a page after a checkpoint also
# logs the whole 8 KiB page (a full-page image), so the total depends on when the server last
# checkpointed; with pg_walinspect (a superuser can create it) the records and the images are
# counted apart, and the figure is the records (what follows the change), the images an info row.
if [ "$store_kind" = postgres ]; then
    checkpoint() { :; }
    if psql_admin -c "CREATE EXTENSION IF NOT EXISTS pg_walinspect" >/dev/null 2>&1; then
        export BENCH_WAL_SPLIT=1
        store_mark() { psql_admin -c "SELECT pg_current_wal_insert_lsn()"; }
        store_written() {
            psql_admin -F ' ' -c "SELECT COALESCE(sum(record_size), 0), COALESCE(sum(fpi_size), 0)
                FROM pg_get_wal_stats('$2', pg_current_wal_flush_lsn())"
        }
    else
        log "no pg_walinspect on the server: B2 counts the whole WAL, full-page images included"
        store_bytes() { psql_admin -c "SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')::bigint"; }
    fi
fi

# --- Samples --------------------------------------------------------------------------------

sample() { printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" >>"$samples"; } # FIGURE SIDE ROUND VALUE
milliseconds() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.3f", (b - a) * 1000}'; }
median() { sort -g | awk '{v[NR] = $1} END {if (NR % 2) print v[(NR + 1) / 2]; else printf "%.3f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }

# The sides in the order of round $1: DocFS first in odd rounds, native first in even ones.
sides() { if (($1 % 2)); then echo "docfs native"; else echo "native docfs"; fi; }

time_ls() { # DIR: milliseconds of one `ls -l`
    local start end
    start=$EPOCHREALTIME
    LC_ALL=C ls -l --color=never "$1" >/dev/null
    end=$EPOCHREALTIME
    milliseconds "$start" "$end"
}

# Runs one figure in a subshell with errexit, so that a failing command ends that figure
# (with its line) and the run goes on to the next.
run_figure() { # NAME FUNCTION
    selected "$2" || return 0
    log "$1"
    (
        set -eE
        trap 'echo "bench: $1 failed at line $LINENO: $BASH_COMMAND" >&2' ERR
        "$2"
    )
    local status=$?
    if [ "$status" -ne 0 ]; then
        log "$1: failed (status $status); its samples are incomplete"
        failed+=("$1")
    fi
    is_mounted "$mnt" || mount_store "$store" "$mnt"
    is_mounted "$mnt_roots" || mount_store "$roots_store" "$mnt_roots"
}
failed=()

cleanup() {
    # Either peer: fusermount3 detaches any FUSE mount (passthrough_ll's, mergerfs's), and its
    # daemon ends when its mount does.
    if [ -n "${peer:-}" ] || is_mounted "$mnt_peer"; then
        fusermount3 -u "$mnt_peer" 2>/dev/null || fusermount3 -u -z "$mnt_peer" 2>/dev/null
    fi
    if is_mounted "$mnt_peerlike"; then
        fusermount3 -u "$mnt_peerlike" 2>/dev/null || fusermount3 -u -z "$mnt_peerlike" 2>/dev/null
    fi
    unmount_store "$mnt"
    unmount_store "$mnt_roots"
    unmount_store "$mnt_second"
    unmount_store "$mnt_history"
    unmount_store "$mnt_locks_a"
    unmount_store "$mnt_locks_b"
    if [ "${BENCH_KEEP:-0}" = 1 ]; then
        log "kept $work"
    else
        rm -rf "$work"
        if [ "$store_kind" = postgres ]; then
            for database in "${database_prefix}_main" "${database_prefix}_roots" "${database_prefix}_engine" \
                "${database_prefix}_history" "${database_prefix}_locks"; do
                psql_admin -c "SET client_min_messages = warning" \
                    -c "DROP DATABASE IF EXISTS \"$database\" WITH (FORCE)" || true
            done
        fi
        # The engine's file coordination leaves its lock file beside the run's folder.
        rm -f "$base/.${work##*/}.docfs-lock"
    fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# --- The data -------------------------------------------------------------------------------

# B9's wrapper: lines of prose from a fixed vocabulary in a fixed pseudo-random order (the same
# bytes every run, text as an editor sees it, not random bytes), cut to exactly BYTES.
make_prose() { # FILE BYTES
    LC_ALL=C awk -v bytes="$2" 'BEGIN {
        n = split("the a of and to in is was that for on with as by at from it this be are or an his " \
            "her their which one all were we when there can more if no out so up said what its about " \
            "into than them only other new some could time these two may then do first any my now such " \
            "like our over man me even most made after also did many before must through back years " \
            "where much your way well down should because each just those people how too little state " \
            "good very make world still own see men work long get here between both life being under " \
            "never day same another know while last might us great old year off come since against go " \
            "came right used take three river garden window letter morning evening station winter " \
            "summer harbour kitchen mountain library market village candle bridge orchard lantern", word, " ")
        x = 15; written = 0
        while (written < bytes) {
            x = (x * 16807) % 2147483647 # Park–Miller: exact in awk'"'"'s doubles
            target = 30 + x % 70
            x = (x * 16807) % 2147483647
            text = toupper(substr(word[1 + x % n], 1, 1)) substr(word[1 + x % n], 2)
            while (length(text) < target) {
                x = (x * 16807) % 2147483647
                text = text " " word[1 + x % n]
            }
            print text "."
            written += length(text) + 2
        }
    }' >"$1" && truncate -s "$2" "$1"
}

log "making the native files ($size: $((big / MiB)) MiB, $files files, $documents documents)"
mkdir -p "$native/pkg.pkg" "$native/big.pkg" "$native/rand.pkg" "$native/images.pkg" "$native/edit.pkg" \
    "$native/scratch.pkg" "$native/save.pkg"
"$helper" mkfiles "$native/pkg.pkg" "$files" 4096 || exit 1
"$helper" mktext "$native/big.pkg/notes.txt" 16384 || exit 1
"$helper" mkfile "$native/big.pkg/stream.bin" "$big" || exit 1
"$helper" mkfile "$native/rand.pkg/rand.bin" "$rand" || exit 1
for i in $(seq 0 $((images - 1))); do
    "$helper" mkfile "$native/images.pkg/$(printf 'image-%03d.png' "$i")" 1000000 || exit 1
done
"$helper" mktext "$native/edit.pkg/text.txt" 1000000 || exit 1
make_prose "$native/save.pkg/wrapper.txt" "$save" || exit 1
for r in $(seq "$rounds"); do
    "$helper" mkfile "$work/new-image-$r.png" 1000000 || exit 1
done

log "creating the stores with docfs create and docfs import"
"$docfs" create "$store" >&2 || exit 1
for document in pkg.pkg big.pkg rand.pkg images.pkg edit.pkg scratch.pkg save.pkg; do
    "$docfs" import "$store" "$native/$document" >&2 || exit 1
done
"$docfs" create "$roots_store" >&2 || exit 1
"$helper" mkroots "$roots_store" "$native_roots" "$documents" || exit 1
"$docfs" create "$engine_store" >&2 || exit 1
"$docfs" import "$engine_store" "$native/pkg.pkg" >&2 || exit 1
cp -a "$native/pkg.pkg" "$work/engine-native/pkg.pkg" || exit 1
if [ "$store_kind" = postgres ]; then
    # Vacuum what the import wrote now, as autovacuum would later: its WAL is the server's and
    # would otherwise land in whichever figure runs then (B2's WAL bytes first of all).
    log "vacuuming the imported databases"
    for database in "$store" "$roots_store" "$engine_store"; do
        psql -X -q -v ON_ERROR_STOP=1 -d "$database" -c "VACUUM (FREEZE, ANALYZE)" || exit 1
    done
fi

# --- The peer --------------------------------------------------------------------------------

# libfuse's passthrough_ll from Debian's libfuse3-dev examples, with its default options.
mount_passthrough_ll() {
    local examples=/usr/share/doc/libfuse3-dev/examples
    peer_options="source=$peer_src (its defaults)"
    peer_version="libfuse3-dev $(dpkg-query -W -f='${Version}' libfuse3-dev 2>/dev/null)"
    [ -f "$examples/passthrough_ll.c" ] &&
        cc -O2 -Wall -I"$examples" "$examples/passthrough_ll.c" $(pkg-config fuse3 --cflags --libs) \
            -o "$work/passthrough_ll" >&2 &&
        "$work/passthrough_ll" -o source="$peer_src" "$mnt_peer" >&2
}

# mergerfs over one branch, peer_src, with the options of its documentation's PERFORMANCE and
# CACHING sections (mergerfs 2.33, /usr/share/doc/mergerfs/README.md.gz, as quoted):
#   cache.files=auto-full   "enable (or disable) page caching (`cache.files`)"; auto-full: "mergerfs
#                           files cached across opens if mtime and size are unchanged since
#                           previous open" (and `mergerfs --help` on cache.writeback: "cache.files
#                           must be enabled as well")
#   cache.writeback=true    "enable `cache.writeback`": "small writes may be aggregated by the
#                           kernel and then sent to mergerfs as one larger request"
#   dropcacheonclose=true   "If you do enable file page caching, `cache.files=partial|full|auto-full`,
#                           you should also enable `dropcacheonclose`" (against double caching)
#   cache.attr=120, cache.entry=120, cache.negative_entry=120
#                           "increase cache timeouts `cache.attr`, `cache.entry`,
#                           `cache.negative_entry`" (defaults 1, 1, 0 s); nothing else touches the
#                           branch while it is mounted (B4's copy is made before the mount)
#   cache.statfs=10         "enable `cache.statfs`": "Of the syscalls used by mergerfs in policies
#                           the `statfs` / `statvfs` call is perhaps the most expensive" (every
#                           create checks minfreespace with it)
#   cache.readdir=true      "enable `cache.readdir`": "can have a significant impact on directory
#                           traversal"
#   security_capability=false
#                           "disable `security_capability` and/or `xattr`": the kernel asks for
#                           security.capability before writes; xattrs themselves stay on
#   category.create=ff      "When benchmarking through mergerfs ensure you only use 1 branch to
#                           remove any possibility of the policies complicating the situation";
#                           with one branch ff ("act on the first one found") is the least work
#   use_ino                 "While not a default it is recommended it be enabled so that linked
#                           files share the same inode value" (every option set the README gives
#                           has it)
# Left at their defaults: threads (0: one per core; "higher number of threads increases
# parallelism but usually decreases throughput"), fuse_msg_size (256, the most), async_read
# (true), posix_acl (false), moveonenospc (false), splice_* ("enable (or disable)": no
# direction), cache.open ("really only useful in cases where you have a large number of
# branches"), func.getattr=newest (a choice between branches: there is one). Not in 2.33:
# parallel-direct-writes. The readahead tip (/sys/class/bdi) changes the machine: not taken.
mergerfs_options=cache.files=auto-full,cache.writeback=true,dropcacheonclose=true
mergerfs_options+=,cache.attr=120,cache.entry=120,cache.negative_entry=120,cache.statfs=10
mergerfs_options+=,cache.readdir=true,security_capability=false,category.create=ff,use_ino
mount_mergerfs() {
    peer_options="$mergerfs_options; one branch, $peer_src"
    if ! command -v mergerfs >/dev/null; then
        ./scripts/install-deps.sh mergerfs >&2 || { log "mergerfs could not be installed"; return 1; }
    fi
    peer_version="mergerfs $(dpkg-query -W -f='${Version}' mergerfs 2>/dev/null)"
    mergerfs -o "$mergerfs_options" "$peer_src" "$mnt_peer" >&2 &&
        is_mounted "$mnt_peer"
}

if selected b1 || selected b4 || selected b5 || selected b12 || selected b13 || selected b14; then
    mkdir -p "$peer_src" "$mnt_peer"
    # B1's folders and B4's file under the peer, copied before the mount: the peer's caches
    # never saw them absent.
    if selected b1; then
        cp -a "$native/pkg.pkg" "$peer_src/pkg.pkg"
        cp -a "$native_roots" "$peer_src/roots"
    fi
    if selected b4; then
        mkdir -p "$peer_src/rand.pkg"
        cp "$native/rand.pkg/rand.bin" "$peer_src/rand.pkg/rand.bin"
    fi
    if "mount_$peer_kind"; then
        peer=$mnt_peer peer_name=$peer_kind
        log "the peer: $peer_version at $mnt_peer ($peer_options)"
    else
        log "the $peer_kind peer could not be built, installed or mounted; B1, B4, B5, B12, B13 and B14 run without a peer"
        rm -rf "$peer_src/rand.pkg/rand.bin" "$peer_src/pkg.pkg" "$peer_src/roots"
        peer_options="$peer_kind could not be built, installed or mounted" peer_version=""
    fi
fi

mount_store "$store" "$mnt" || exit 1
mount_store "$roots_store" "$mnt_roots" || exit 1

# --- B1: listing ----------------------------------------------------------------------------

b1() {
    local r side pkg root read_before read_after rchar_before pid runs i
    for r in $(seq "$rounds"); do
        local content=0
        for side in $(sides_with_peer "$r"); do
            case $side in
            docfs)
                pkg=$mnt/pkg.pkg root=$mnt_roots
                remount "$store" "$mnt"
                pid=$(daemon_pid "$mnt")
                read_before=$(bytes_read "$mnt")
                rchar_before=$(proc_io "$pid" rchar)
                ;;
            native)
                pkg=$native/pkg.pkg root=$native_roots
                drop_caches
                ;;
            peer)
                # Cold as the kernel can make it: dropping the caches forgets the peer's inodes
                # too, so it opens each file again.
                pkg=$peer/pkg.pkg root=$peer/roots
                drop_caches
                ;;
            esac
            sample b1.ls.pkg.cold "$side" "$r" "$(time_ls "$pkg")"
            if [ "$side" = docfs ]; then sample b1.daemon.rchar docfs "$r" $(($(proc_io "$pid" rchar) - rchar_before)); fi
            runs=$(for i in 1 2 3 4 5; do time_ls "$pkg"; echo; done | median)
            sample b1.ls.pkg.warm "$side" "$r" "$runs"
            if [ "$side" = docfs ]; then
                read_after=$(bytes_read "$mnt")
                content=$((content + read_after - read_before))
                remount "$roots_store" "$mnt_roots"
                read_before=$(bytes_read "$mnt_roots")
            else
                drop_caches
            fi
            sample b1.ls.root.cold "$side" "$r" "$(time_ls "$root")"
            runs=$(for i in 1 2 3 4 5; do time_ls "$root"; echo; done | median)
            sample b1.ls.root.warm "$side" "$r" "$runs"
            if [ "$side" = docfs ]; then
                read_after=$(bytes_read "$mnt_roots")
                content=$((content + read_after - read_before))
            fi
        done
        sample b1.bytes docfs "$r" "$content"
    done
}

# --- B2: incremental saves ------------------------------------------------------------------

# Runs an operation on the mount and records its time, the bytes the store's files grew by
# (after an emptied WAL) and the content bytes the store wrote, as FIGURE.ms, FIGURE.bytes (and
# FIGURE.fpi) and FIGURE.content. The wait lets the quiet-interval save (1 s) run, so that every
# save the operation caused is counted.
save_figure() { # FIGURE ROUND COMMAND…
    local name=$1 r=$2
    shift 2
    local before written_before ms pid written
    checkpoint "$store"
    before=$(store_mark "$store")
    pid=$(daemon_pid "$mnt")
    written_before=$(bytes_written "$mnt")
    ms=$("$@")
    sleep 2
    # The statistics are the daemon's since it started: another daemon's are no delta.
    if [ "$(daemon_pid "$mnt")" != "$pid" ]; then
        log "the daemon serving $mnt changed during $name (was it unmounted from outside?)"
        return 1
    fi
    sample "$name.ms" docfs "$r" "$ms"
    read -r -a written <<<"$(store_written "$store" "$before")"
    sample "$name.bytes" docfs "$r" "${written[0]}"
    if [ -n "${written[1]:-}" ]; then sample "$name.fpi" docfs "$r" "${written[1]}"; fi
    sample "$name.content" docfs "$r" $(($(bytes_written "$mnt") - written_before))
}
b2_docfs() { save_figure "b2.$1" "${@:2}"; } # NAME ROUND COMMAND…

vim_append() { # FILE LINE: milliseconds of a whole vim run that appends a line and saves
    local start end
    start=$EPOCHREALTIME
    vim -Nu NONE -i NONE -es "+\$put ='$2'" "+wq" "$1" </dev/null >/dev/null 2>&1
    end=$EPOCHREALTIME
    milliseconds "$start" "$end"
}

b2() {
    local r side dir line
    for r in $(seq "$rounds"); do
        line="appended in round $r at $(date +%s.%N)"
        for side in $(sides "$r"); do
            if [ "$side" = docfs ]; then
                b2_docfs append "$r" "$helper" append "$mnt/big.pkg/notes.txt" "$line"
                b2_docfs image "$r" "$helper" replace "$work/new-image-$r.png" "$mnt/images.pkg/image-042.png"
                b2_docfs vim "$r" vim_append "$mnt/edit.pkg/text.txt" "$line"
            else
                sample b2.append.ms native "$r" "$("$helper" append "$native/big.pkg/notes.txt" "$line")"
                sample b2.image.ms native "$r" \
                    "$("$helper" replace "$work/new-image-$r.png" "$native/images.pkg/image-042.png")"
                sample b2.vim.ms native "$r" "$(vim_append "$native/edit.pkg/text.txt" "$line")"
            fi
        done
    done
}

# --- B3 and B7 (streaming): sequential I/O of a 1 GiB wrapper -------------------------------

b3() {
    local r side dir pid
    for r in $(seq "$rounds"); do
        for side in $(sides "$r"); do
            if [ "$side" = docfs ]; then dir=$mnt; else dir=$native; fi
            # Write + fsync + close (for DocFS, the save of every chunk), by a fresh daemon: one
            # that has just streamed a read still holds the store's chunk cache, which would count
            # in the write's peak RSS (B7).
            if [ "$side" = docfs ]; then
                remount "$store" "$mnt"
                pid=$(daemon_pid "$mnt")
                peak_rss_reset "$pid"
            else
                drop_caches
            fi
            sample b3.write "$side" "$r" "$("$helper" seqwrite "$dir/scratch.pkg/stream-w.bin" "$big")"
            if [ "$side" = docfs ]; then sample b7.rss.write docfs "$r" "$(peak_rss_mib "$pid")"; fi
            rm -f "$dir/scratch.pkg/stream-w.bin"
            # Cold read: a fresh daemon and an empty page cache; then warm, at once.
            if [ "$side" = docfs ]; then
                remount "$store" "$mnt"
                pid=$(daemon_pid "$mnt")
                peak_rss_reset "$pid"
            else
                drop_caches
            fi
            sample b3.read.cold "$side" "$r" "$("$helper" seqread "$dir/big.pkg/stream.bin")"
            if [ "$side" = docfs ]; then sample b7.rss.read docfs "$r" "$(peak_rss_mib "$pid")"; fi
            sample b3.read.warm "$side" "$r" "$("$helper" seqread "$dir/big.pkg/stream.bin")"
        done
    done
}

# --- B4: random I/O (fio) -------------------------------------------------------------------

# A quarter of the file in 4 KiB requests, one at a time; IOPS as fio reports them. The
# random write ends with an fsync (end_fsync), which for DocFS is the save of the dirty chunks.
fio_iops() { # randread|randwrite FILE
    local kind=$1 file=$2 field
    if [ "$kind" = randread ]; then field=8; else field=49; fi
    fio --name=b4 --filename="$file" --rw="$kind" --bs=4k --size="$rand" --io_size=$((rand / 4)) \
        --ioengine=psync --invalidate=0 --randrepeat=0 --fallocate=none --end_fsync=1 \
        --output-format=terse --terse-version=3 | awk -F';' -v f="$field" '{print $f}'
}

b4() {
    local r side dir
    # The peer serves its own copy of the file, from the folder under it.
    if [ -n "$peer" ] && [ ! -e "$peer_src/rand.pkg/rand.bin" ]; then
        mkdir -p "$peer_src/rand.pkg"
        cp "$native/rand.pkg/rand.bin" "$peer_src/rand.pkg/rand.bin"
    fi
    for r in $(seq "$rounds"); do
        for side in $(sides_with_peer "$r"); do
            case $side in
            docfs)
                dir=$mnt
                remount "$store" "$mnt"
                ;;
            native)
                dir=$native
                drop_caches
                ;;
            peer)
                dir=$peer
                drop_caches
                ;;
            esac
            sample b4.randread "$side" "$r" "$(fio_iops randread "$dir/rand.pkg/rand.bin")"
            sync
            sample b4.randwrite "$side" "$r" "$(fio_iops randwrite "$dir/rand.pkg/rand.bin")"
            # Issue 16 counts the daemon's memory in this run: the peak of a fresh daemon through
            # both (the random writes take most), their background save included.
            if [ "$side" = docfs ]; then
                wait_idle "$(daemon_pid "$mnt")"
                sample b7.rss.random docfs "$r" "$(peak_rss_mib "$(daemon_pid "$mnt")")"
            fi
        done
    done
}

# --- B5: small files ------------------------------------------------------------------------

# The sides of round $1 with the peer when there is one, in an order that turns with the round.
sides_with_peer() {
    if [ -z "$peer" ]; then sides "$1"; return; fi
    case $(($1 % 3)) in
    1) echo "docfs native peer" ;;
    2) echo "native peer docfs" ;;
    *) echo "peer docfs native" ;;
    esac
}

# The folder named $2 for side $1: a package document on the mount, a plain folder elsewhere.
side_folder() {
    case $1 in
    docfs) echo "$mnt/$2.pkg" ;;
    native) echo "$native/$2" ;;
    peer) echo "$peer/$2" ;;
    esac
}

b5() {
    local r side dir rates peerlike=""
    # passthrough_ll again, with the kernel options DocFS mounts with (mergerfs's have the
    # writeback cache already, and no second one is mounted).
    if [ "$peer_name" = passthrough_ll ]; then
        mkdir -p "$peerlike_src" "$mnt_peerlike"
        if "$work/passthrough_ll" -o source="$peerlike_src",default_permissions,writeback "$mnt_peerlike" >&2; then
            peerlike=$mnt_peerlike
        else
            log "B5: passthrough_ll with default_permissions and writeback would not mount; no such rows"
        fi
    fi
    for r in $(seq "$rounds"); do
        for side in $(sides_with_peer "$r") ${peerlike:+peerlike}; do
            case $side in
            docfs) dir=$mnt/small-$r.pkg ;;
            native) dir=$native/small-$r.pkg ;;
            peer) dir=$peer/small-$r.pkg ;;
            peerlike) dir=$peerlike/small-$r ;;
            esac
            sync
            mkdir "$dir"
            rates=$("$helper" smallfiles "$dir" "$files" 4096)
            if [ "$side" = peerlike ]; then
                # Rows of their own: the peer column holds this mount, beside DocFS's figures.
                sample b5.create.peerlike peer "$r" "$(echo "$rates" | awk '{print $1}')"
                sample b5.delete.peerlike peer "$r" "$(echo "$rates" | awk '{print $3}')"
            else
                sample b5.create "$side" "$r" "$(echo "$rates" | awk '{print $1}')"
                sample b5.stat "$side" "$r" "$(echo "$rates" | awk '{print $2}')"
                sample b5.delete "$side" "$r" "$(echo "$rates" | awk '{print $3}')"
                if [ "$side" = docfs ] && [ -n "$peerlike" ]; then
                    sample b5.create.peerlike docfs "$r" "$(echo "$rates" | awk '{print $1}')"
                    sample b5.delete.peerlike docfs "$r" "$(echo "$rates" | awk '{print $3}')"
                fi
            fi
            rmdir "$dir"
        done
    done
    if [ -n "$peerlike" ]; then
        fusermount3 -u "$mnt_peerlike" 2>/dev/null || fusermount3 -u -z "$mnt_peerlike" 2>/dev/null
    fi
}

# --- B6: the engine -------------------------------------------------------------------------

b6() {
    "$helper" engine "$engine_store" pkg.pkg "$work/engine-native/pkg.pkg" "$rounds" >>"$samples"
}

# --- B7: many documents open ------------------------------------------------------------------

b7() {
    local r pid result
    for r in $(seq "$rounds"); do
        remount "$roots_store" "$mnt_roots"
        pid=$(daemon_pid "$mnt_roots")
        peak_rss_reset "$pid"
        result=$("$helper" holdopen "$mnt_roots" "$documents" "$pid")
        sample b7.rss.docs docfs "$r" "$(echo "$result" | awk '{printf "%.1f", $1 / 1024}')"
    done
}

# --- B8: two mounts of one store ----------------------------------------------------------------

# A second daemon serves the same store, as a second machine would a PostgreSQL one; only for
# this figure, so that its following of every save does not weigh on the others. A save through
# the first mount is timed from the writer's fsync (which returns once it is saved), a new
# document from the writer's open(O_CREAT), until the second mount, whose kernel had the old
# state cached, shows it: the save, the store's notification, the other daemon's refresh and
# its kernel cache invalidation together.
b8() {
    local r
    mount_store "$store" "$mnt_second"
    printf 'first\n' >"$mnt/b8.txt"
    "$helper" propagate "$mnt/b8.txt" "$mnt_second/b8.txt" "first
" >/dev/null
    # Each round's sample is the median of five.
    for r in $(seq "$rounds"); do
        sample b8.save docfs "$r" "$(for i in 1 2 3 4 5; do
            "$helper" propagate "$mnt/b8.txt" "$mnt_second/b8.txt" "round $r, $i at $EPOCHREALTIME
"
        done | median)"
        sample b8.create docfs "$r" "$(for i in 1 2 3 4 5; do
            "$helper" propagate-create "$mnt/b8-new-$r-$i.txt" "$mnt_second/b8-new-$r-$i.txt"
        done | median)"
    done
    unmount_store "$mnt_second"
}

# --- B9: whole-file save of a small edit ------------------------------------------------------

# sed -i writes the whole edited file under a new name beside the old one and renames it over
# it: for DocFS a new wrapper of the same bytes but one line, saved at the rename, whose chunks
# the store should find it already holds. The fsync of the new file (and its folder) makes it
# durable, as B2's writers do.
sed_first_line() { # FILE LINE: milliseconds of `sed -i` inserting LINE first, and the fsync
    local start end
    start=$EPOCHREALTIME
    sed -i "1i $2" "$1"
    sync "$1" "${1%/*}"
    end=$EPOCHREALTIME
    milliseconds "$start" "$end"
}

b9() {
    local r side
    for r in $(seq "$rounds"); do
        for side in $(sides "$r"); do
            if [ "$side" = docfs ]; then
                save_figure b9 "$r" sed_first_line "$mnt/save.pkg/wrapper.txt" "a new first line"
            else
                sample b9.ms native "$r" "$(sed_first_line "$native/save.pkg/wrapper.txt" "a new first line")"
            fi
        done
    done
}

# --- B10: history thins and space comes back ---------------------------------------------------

# The store's size on disk: SQLite's file with its -wal, -shm and packs; a PostgreSQL database's
# pg_database_size.
store_size() { # STORE
    if [ "$store_kind" = postgres ]; then
        psql -X -q -v ON_ERROR_STOP=1 -At -d "$1" -c "SELECT pg_database_size(current_database())"
    else
        echo $(($(file_size "$1") + $(file_size "$1-wal") + $(file_size "$1-shm") + $(packs_size "$1")))
    fi
}

# In a store of its own, fsx's random writes, truncations, renames and unlinks leave thousands
# of versions (about 3,400 at full size) and a gigabyte of history; `docfs gc` keeping only the
# current one must give their space back. One round whatever BENCH_ROUNDS is: fsx and the gc
# are slow (fsx is the longest step of a small run, and slower on PostgreSQL), and the figure is
# a size that the fixed seed makes repeat. --keep-for 0: the versions are all seconds old, and
# the default (30 days) would keep them.
b10() {
    local seed=1510 start end result
    "$docfs" create "$history_store" >&2
    mount_store "$history_store" "$mnt_history"
    mkdir "$mnt_history/fsx.pkg"
    log "B10: fsx, $fsx_ops operations in a package (seed $seed)"
    start=$EPOCHREALTIME
    result=$(timeout -k 5 $((600 + fsx_ops / 10)) \
        python3 "$repo/scripts/reliability/fsx.py" "$mnt_history/fsx.pkg" "$seed" "$fsx_ops")
    end=$EPOCHREALTIME
    log "B10: $result"
    sample b10.fsx.s docfs 1 "$(awk -v a="$start" -v b="$end" 'BEGIN {printf "%.3f", b - a}')"
    unmount_store "$mnt_history"
    is_mounted "$mnt_history" && return 1
    sample b10.before.bytes docfs 1 "$(store_size "$history_store")"
    start=$EPOCHREALTIME
    result=$("$docfs" gc "$history_store" --keep-last 1 --keep-for 0)
    end=$EPOCHREALTIME
    log "B10: docfs gc: $result"
    sample b10.gc.s docfs 1 "$(awk -v a="$start" -v b="$end" 'BEGIN {printf "%.3f", b - a}')"
    sample b10.after.bytes docfs 1 "$(store_size "$history_store")"
    if [ "$store_kind" = postgres ]; then
        psql_admin -c "DROP DATABASE IF EXISTS \"${database_prefix}_history\" WITH (FORCE)"
    else
        rm -rf "$history_store" "$history_store-wal" "$history_store-shm" "$history_store-packs"
    fi
}

# --- B11: copy offload ------------------------------------------------------------------------

# cp (coreutils, copy_file_range) of the 1 GiB wrapper to a new name beside it, and sync of the
# copy: in the mount the copy shares the original's chunks, so the store should grow by records,
# not by a gigabyte. The copy is removed after each round.
cp_synced() { # FROM TO: milliseconds of cp and the sync of the copy
    local start end
    start=$EPOCHREALTIME
    cp "$1" "$2"
    sync "$2"
    end=$EPOCHREALTIME
    milliseconds "$start" "$end"
}

b11() {
    local r side
    for r in $(seq "$rounds"); do
        for side in $(sides "$r"); do
            if [ "$side" = docfs ]; then
                save_figure b11 "$r" cp_synced "$mnt/big.pkg/stream.bin" "$mnt/big.pkg/copy.bin"
                rm -f "$mnt/big.pkg/copy.bin"
            else
                drop_caches
                sample b11.ms native "$r" "$(cp_synced "$native/big.pkg/stream.bin" "$native/big.pkg/copy.bin")"
                rm -f "$native/big.pkg/copy.bin"
            fi
        done
    done
}

# --- B12: safe-save in a big folder ----------------------------------------------------------

# A folder of $files files, then 30 safe-saves and 30 unlink + re-creates of one name in it,
# each timed whole; prints the two medians in ms.
safe_saves() { # DIR
    python3 - "$1" "$files" <<'PY'
import os, sys, time
d, n = sys.argv[1], int(sys.argv[2])
os.makedirs(d, exist_ok=True)
for i in range(n):
    with open(f"{d}/f{i:06d}", "w") as f:
        f.write("x" * 100)
def safe(r):
    tmp = f"{d}/.goutputstream-{r:06d}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.write(fd, b"y" * 4096); os.fsync(fd); os.close(fd)
    os.rename(tmp, f"{d}/f000005")
    dfd = os.open(d, os.O_RDONLY); os.fsync(dfd); os.close(dfd)
def recreate(r):
    p = f"{d}/f000007"
    os.unlink(p)
    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.write(fd, b"z" * 4096); os.fsync(fd); os.close(fd)
medians = []
for op in (safe, recreate):
    times = []
    for r in range(30):
        t = time.perf_counter(); op(r); times.append(time.perf_counter() - t)
    times.sort()
    medians.append(times[len(times) // 2] * 1000)
print(f"{medians[0]:.3f} {medians[1]:.3f}")
PY
}

b12() {
    local r side dir result
    for r in $(seq "$rounds"); do
        for side in $(sides_with_peer "$r"); do
            dir=$(side_folder "$side" "saves-$r")
            sync
            result=$(safe_saves "$dir")
            sample b12.safesave "$side" "$r" "$(echo "$result" | awk '{print $1}')"
            sample b12.recreate "$side" "$r" "$(echo "$result" | awk '{print $2}')"
            rm -rf "$dir"
        done
    done
}

# --- B13: fsx -------------------------------------------------------------------------------

b13() {
    local r side dir start status
    for r in $(seq "$rounds"); do
        for side in $(sides_with_peer "$r"); do
            dir=$(side_folder "$side" "fsx-$r")
            mkdir -p "$dir"
            sync
            status=0
            start=$EPOCHREALTIME
            if [ -n "${BENCH_FSX:-}" ]; then
                (cd "$dir" && "$BENCH_FSX" -q -N 20000 -S "$r" fsx.bin) >/dev/null 2>&1 || status=$?
            else
                python3 "$repo/scripts/reliability/fsx.py" "$dir" "$r" 20000 --quiet >/dev/null 2>&1 || status=$?
            fi
            if [ "$status" -ne 0 ]; then
                log "B13: fsx failed on $side (status $status): no sample"
            else
                sample b13.fsx "$side" "$r" "$(awk -v a="$start" -v b="$EPOCHREALTIME" 'BEGIN {printf "%.3f", b - a}')"
            fi
            rm -rf "$dir"
        done
    done
}

# --- B14: two writers ----------------------------------------------------------------------

b14_writer() { # SOURCE FOLDER: replaces FOLDER/f.bin with SOURCE's bytes 6 times
    local i
    for i in 1 2 3 4 5 6; do "$helper" replace "$1" "$2/f.bin" >/dev/null || return 1; done
}

b14() {
    local r side a b start alone together
    for name in a b; do
        [ -f "$work/two-$name.bin" ] || "$helper" mkfile "$work/two-$name.bin" "$two" || return 1
    done
    for r in $(seq "$rounds"); do
        for side in $(sides_with_peer "$r"); do
            a=$(side_folder "$side" "two-a-$r")
            b=$(side_folder "$side" "two-b-$r")
            mkdir -p "$a" "$b"
            : >"$a/f.bin"
            : >"$b/f.bin"
            sync
            start=$EPOCHREALTIME
            b14_writer "$work/two-a.bin" "$a" || return 1
            alone=$(awk -v a="$start" -v b="$EPOCHREALTIME" 'BEGIN {printf "%.3f", b - a}')
            start=$EPOCHREALTIME
            b14_writer "$work/two-a.bin" "$a" &
            local first=$!
            b14_writer "$work/two-b.bin" "$b" || return 1
            wait "$first" || return 1
            together=$(awk -v a="$start" -v b="$EPOCHREALTIME" 'BEGIN {printf "%.3f", b - a}')
            sample b14.alone "$side" "$r" "$alone"
            sample b14.together "$side" "$r" "$together"
            sample b14.speedup "$side" "$r" "$(awk -v a="$alone" -v t="$together" 'BEGIN {printf "%.3f", 2 * a / t}')"
            rm -rf "$a" "$b"
        done
    done
}

# --- B15: locks between two mounts ---------------------------------------------------------

# Two mounts of a store of their own, without the writeback cache (two mounts with databases
# kept open need that on a store file; a PostgreSQL store's default), as two machines would
# mount a shared store. The native side is one folder used by the same processes.
b15() {
    local r side a b out locks=$repo/scripts/bench-locks.py
    "$docfs" create "$locks_store" >/dev/null || return 1
    mkdir -p "$mnt_locks_a" "$mnt_locks_b" "$native/locks"
    "$docfs" mount "$locks_store" "$mnt_locks_a" -o no_writeback_cache >&2 || return 1
    mkdir "$mnt_locks_a/locks.pkg"
    printf '0\n' >"$mnt_locks_a/locks.pkg/lock"
    sync "$mnt_locks_a/locks.pkg/lock"
    "$docfs" mount "$locks_store" "$mnt_locks_b" -o no_writeback_cache >&2 || return 1
    for _ in $(seq 300); do [ -e "$mnt_locks_b/locks.pkg/lock" ] && break; sleep 0.1; done
    : >"$native/locks/lock"
    for r in $(seq "$rounds"); do
        for side in $(sides "$r"); do
            if [ "$side" = docfs ]; then
                a=$mnt_locks_a/locks.pkg b=$mnt_locks_b/locks.pkg
            else
                a=$native/locks b=$native/locks
            fi
            sample b15.lock "$side" "$r" "$(python3 "$locks" uncontended "$a/lock" 200)"
            out=$(python3 "$locks" sqlite "$a/two-$r.db" "$b/two-$r.db" "$transactions") || return 1
            sample b15.sqlite.two "$side" "$r" "${out% *}"
            sample b15.sqlite.lost "$side" "$r" "${out#* }"
            out=$(python3 "$locks" sqlite "$a/one-$r.db" "$a/one-$r.db" "$transactions") || return 1
            sample b15.sqlite.one "$side" "$r" "${out% *}"
            out=$(python3 "$locks" counter "$a/counter-$r" "$b/counter-$r" "$transactions") || return 1
            sample b15.counter.lost "$side" "$r" "${out#* }"
            sample b15.counter.s "$side" "$r" "${out% *}"
        done
        sample b15.across docfs "$r" "$(python3 "$locks" alternate "$mnt_locks_a/locks.pkg/lock" \
            "$mnt_locks_b/locks.pkg/lock" 200)"
        sample b15.handover docfs "$r" "$(python3 "$locks" handover "$mnt_locks_a/locks.pkg/lock" \
            "$mnt_locks_b/locks.pkg/lock" 30)"
    done
    unmount_store "$mnt_locks_b"
    unmount_store "$mnt_locks_a"
}

# --- The FUSE layer -------------------------------------------------------------------------

fuse_layer() {
    local json
    json=$(./scripts/fuse-bench.sh "$((rounds > 7 ? rounds : 7))" | tail -n 1)
    echo "$json" | sed -E 's/.*"getattr_us":\{"median":([0-9.]+),"min":([0-9.]+),"max":([0-9.]+)\}.*/fuse.getattr\tdocfs\tstats\t\1,\2,\3/' >>"$samples"
    echo "$json" | sed -E 's/.*"read_1mib_us":\{"median":([0-9.]+),"min":([0-9.]+),"max":([0-9.]+)\}.*/fuse.read1m\tdocfs\tstats\t\1,\2,\3/' >>"$samples"
}

run_figure "B1: ls -l" b1
run_figure "B2: incremental saves" b2
run_figure "B3 + B7: sequential I/O" b3
run_figure "B4: random I/O" b4
run_figure "B5: small files" b5
run_figure "B6: the engine" b6
run_figure "B7: 1,000 documents open" b7
run_figure "B8: two mounts of one store" b8
run_figure "B9: whole-file save of a small edit (sed -i)" b9
run_figure "B10: history thins and space comes back (fsx, then docfs gc)" b10
run_figure "B11: cp of a 1 GiB wrapper inside the mount (copy offload)" b11
run_figure "B12: safe-save in a big folder" b12
run_figure "B13: fsx, 20,000 operations" b13
run_figure "B14: two writers" b14
run_figure "B15: locks between two mounts" b15
run_figure "FUSE layer micro-benchmark" fuse_layer

# --- The report -----------------------------------------------------------------------------

export BENCH_DATE=$(date -u +%Y-%m-%dT%H:%M:%SZ)
export BENCH_MACHINE="$(nproc) cores ($(lscpu | sed -n 's/^Model name: *//p' | head -n 1)), $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo), Linux $(uname -r)"
export BENCH_NATIVE="$fs_type on $fs_source ($work)"
export BENCH_LOAD="load average $load_start at the start, $(cut -d' ' -f1-3 /proc/loadavg) at the end"
export BENCH_MODE=$size BENCH_ROUNDS=$rounds BENCH_CHUNK_SIZE=$chunk_size
export BENCH_BIG_BYTES=$big BENCH_RAND_BYTES=$rand BENCH_FILES=$files BENCH_DOCUMENTS=$documents BENCH_IMAGES=$images
export BENCH_SAVE_BYTES=$save BENCH_FSX_OPS=$fsx_ops BENCH_TWO_BYTES=$two BENCH_TRANSACTIONS=$transactions
export BENCH_FAILED="${failed[*]:-}"
# The peer that ran (the JSON's meta has every BENCH_ variable; the table's header names it).
export BENCH_PEER=$peer_name BENCH_PEER_OPTIONS=$peer_options BENCH_PEER_VERSION=$peer_version

echo
echo "DocFS benchmark, $BENCH_DATE, $BENCH_MACHINE"
if [ "$store_kind" = postgres ]; then
    export BENCH_POSTGRES="PostgreSQL $postgres_version at ${postgres_base%/*} (data: $postgres_data, $postgres_fs)"
    echo "mode $size, $rounds rounds; native: $BENCH_NATIVE; DocFS: docfs mount of fresh databases on $BENCH_POSTGRES"
else
    echo "mode $size, $rounds rounds; native: $BENCH_NATIVE; DocFS: docfs mount of a fresh store beside it"
fi
if [ -n "$peer" ]; then
    echo "peer: $peer_name ($peer_version): $peer_options"
else
    echo "peer: none${peer_options:+ ($peer_options)}"
fi
echo "$BENCH_LOAD"
echo
"$helper" report "$samples" "$out"
cp "$samples" "${out%.json}.tsv"
echo
echo "JSON: $out (samples: ${out%.json}.tsv)"
if ((${#failed[@]})); then echo "figures that failed: ${failed[*]}"; fi
exit 0
