# Sourced by the reliability scripts (crash-test.sh, fsx.sh, concurrency.sh):
#   source scripts/reliability/common.sh NAME
# Sets `docfs` (DOCFS_BIN, else .build/debug/docfs, built if missing), a work folder
# /tmp/docfs-NAME.XXXXXX with `store` (its store path, or DOCFS_STORE when set: a
# postgres:// URL, say) and `mnt` (an empty mount point), and an
# exit trap that SIGKILLs `daemon_pid`, ends `timer`, detaches the mount and removes the work
# folder when `status` is 0 (KEEP=1 keeps it). `status` starts at 1.
docfs=${DOCFS_BIN:-}
if [ -z "$docfs" ]; then
    docfs=.build/debug/docfs
    [ -x "$docfs" ] || swift build --product docfs >&2
fi
docfs=$(readlink -f "$docfs")
work=$(mktemp -d "/tmp/docfs-$1.XXXXXX")
store=${DOCFS_STORE:-$work/S.docstore}
mnt=$work/mnt
mkdir "$mnt"
status=1
daemon_pid=
timer=
cleanup() {
    if [ -n "$daemon_pid" ]; then kill -KILL "$daemon_pid" 2>/dev/null || true; fi
    if [ -n "$timer" ]; then kill "$timer" 2>/dev/null || true; fi
    if grep -q " $mnt " /proc/self/mounts; then fusermount3 -u -z "$mnt" 2>/dev/null || true; fi
    if [ "$status" -eq 0 ] && [ -z "${KEEP:-}" ]; then rm -rf "$work"; else echo "kept $work" >&2; fi
}
trap cleanup EXIT
