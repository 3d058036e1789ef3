#!/usr/bin/env bash
# Mounts the demo store: installs what is missing, builds docfs (release), creates the default
# store with the demo documents if there is none, and mounts it in the background.
# Running it again says it is already mounted.
# Usage: scripts/demo.sh [MOUNTPOINT]      (default: ~/DocFS)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
mountpoint=${1:-$HOME/DocFS}

./scripts/install-deps.sh
if ! command -v swift >/dev/null 2>&1; then
    echo "error: swift is missing; install Swift 6 (https://www.swift.org/install/linux/)" >&2
    exit 1
fi
echo "building docfs (release)..." >&2
swift build -c release --product docfs >&2
docfs="$root/.build/release/docfs"

# The default store, where docfs looks for it: $XDG_DATA_HOME only counts when absolute.
data=${XDG_DATA_HOME:-}
[[ $data == /* ]] || data="$HOME/.local/share"
store="$data/docfs/Documents/Default.docstore"
# Only a missing store gets the demo documents: an existing one may be the user's own.
[ -e "$store" ] || "$docfs" create --demo

mkdir -p "$mountpoint"
# The mount table names the folder with links resolved and spaces as \040.
mountpoint=$(realpath "$mountpoint")
if awk -v m="$mountpoint" '{ gsub(/\\040/, " ", $2) } $2 == m && $3 == "fuse.docfs" { found = 1 } END { exit !found }' /proc/self/mounts; then
    echo "already mounted at $mountpoint"
else
    "$docfs" mount "$mountpoint"
    echo "mounted $store at $mountpoint"
fi

state=${XDG_STATE_HOME:-}
[[ $state == /* ]] || state="$HOME/.local/state"
m=$(printf '%q' "$mountpoint")
d=$(printf '%q' "$docfs")
log=$(printf '%q' "$state/docfs/docfs.log")
cat <<TRY

Try:
  # the documents (a package document is a folder) and one package's wrappers
  ls -l $m
  ls -l $m/Things\ I\ Own.mystuff
  cat $m/README.txt
  # edit a text document: every save is a new version in the store
  vim $m/Shopping\ List.txt
  # a package's wrappers are ordinary files
  cp -a $m/Trip\ Notes.imagenote /tmp/ && ls -l /tmp/Trip\ Notes.imagenote
  # the store's side: its documents, and every saved version of one
  $d ls
  $d versions "Shopping List.txt"
  # the daemon's log
  tail $log

Unmount:
  $d unmount $m
TRY
