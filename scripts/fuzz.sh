#!/usr/bin/env bash
# Runs one libFuzzer target for a given time: scripts/fuzz.sh wrapper|archive|plist|store [SECONDS] [libFuzzer options]
#   wrapper  FileWrapper(validatingSerializedRepresentation:)
#   archive  KeyedArchive.validate / unarchivedObject on arbitrary bytes
#   plist    the property-list codec (XML and binary) and PropertyListText.compile
#   store    the store's xattr blob decoder and its decoding of nodes/documents/versions rows
# The targets live in the package Fuzz/ (never part of the main build) and are built with
# -sanitize=fuzzer in .build-fuzz. The seed corpus is Tests/FuzzCorpus/TARGET (read only); what the
# fuzzer adds goes to .build-fuzz/corpus/TARGET, crashes to .build-fuzz/crashes/TARGET/ (not artifacts/: SwiftPM empties that).
# Reproduce a crash: .build-fuzz/debug/fuzz-TARGET path/to/crash-file
set -euo pipefail
cd "$(dirname "$0")/.."
target=${1:?usage: scripts/fuzz.sh wrapper|archive|plist|store [SECONDS] [libFuzzer options]}
seconds=${2:-60}
shift $(( $# >= 2 ? 2 : 1 ))
case "$target" in wrapper|archive|plist|store) ;; *) echo "error: unknown fuzz target '$target'" >&2; exit 2 ;; esac
scratch=$PWD/.build-fuzz
swift build --package-path Fuzz --scratch-path "$scratch" -Xswiftc -sanitize=fuzzer >&2
# Swift's own crash handler would take the signal before libFuzzer could save the input.
export SWIFT_BACKTRACE=enable=no
mkdir -p "$scratch/corpus/$target" "$scratch/crashes/$target"
exec "$scratch/debug/fuzz-$target" -max_total_time="$seconds" -max_len=4096 -timeout=10 -rss_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="$scratch/crashes/$target/" "$@" \
    "$scratch/corpus/$target" "Tests/FuzzCorpus/$target"
