#!/usr/bin/env bash
# Builds DocFS's generated documentation.
#
# Usage: scripts/docs.sh [man] [completions] [docc] [all]      (default: man completions)
#   man          the manual pages: docfs(1) and one page per command (docfs.mount(1), …),
#                generated from the code by swift-argument-parser's generate-manual plugin, and
#                the hand-written mount.fuse.docfs(8) (docs/man/), into .build/docs/man
#   completions  bash, zsh and fish completion scripts from `docfs --generate-completion-script`,
#                into .build/docs/completions
#   docc         DocumentEngine's DocC documentation (catalog:
#                Sources/DocumentEngine/DocumentEngine.docc) with swift-docc-plugin, warnings as
#                errors, into .build/plugins/Swift-DocC/outputs/DocumentEngine.doccarchive
#   all          all three
#
# DOCS_CONFIGURATION=release|debug (default release): the build the pages and completions are
# made from; the manual plugin builds every product of the package in it first, so a release
# run also leaves .build/release/docfs for scripts/install.sh. Works offline (the plugins come
# with the package's dependencies).
set -euo pipefail
cd "$(dirname "$0")/.."
configuration=${DOCS_CONFIGURATION:-release}
out=.build/docs

parts=("$@")
[ ${#parts[@]} -gt 0 ] || parts=(man completions)
want() {
    local part
    for part in "${parts[@]}"; do [ "$part" = "$1" ] || [ "$part" = all ] && return 0; done
    return 1
}
for part in "${parts[@]}"; do
    case "$part" in man | completions | docc | all) ;; *)
        echo "usage: scripts/docs.sh [man] [completions] [docc] [all]" >&2
        exit 2
        ;;
    esac
done

# The pages' date: the last commit's, so that the same sources make the same pages.
date=$(git log -1 --format=%cd --date=format:%Y-%m-%d 2>/dev/null || date +%Y-%m-%d)

if want man; then
    echo "docs: manual pages ($configuration build)..." >&2
    swift package plugin generate-manual --configuration "$configuration" --multi-page --date "$date" >&2
    rm -rf "$out/man"
    mkdir -p "$out/man"
    cp .build/plugins/GenerateManual/outputs/docfs/*.1 "$out/man/"
    # generate-manual leaves the help's blank lines between paragraphs, which mdoc warns about
    # on every `man docfs`; a paragraph break is `.Pp`.
    sed -i 's/^$/.Pp/' "$out"/man/*.1
    cp docs/man/*.8 "$out/man/"
    echo "docs: $(ls "$out/man" | wc -l) pages in $out/man" >&2
fi

if want completions; then
    docfs=.build/$configuration/docfs
    if [ ! -x "$docfs" ]; then
        echo "docs: building docfs ($configuration)..." >&2
        swift build -c "$configuration" --product docfs >&2
    fi
    rm -rf "$out/completions"
    mkdir -p "$out/completions"
    "$docfs" --generate-completion-script bash >"$out/completions/docfs.bash"
    "$docfs" --generate-completion-script zsh >"$out/completions/_docfs"
    "$docfs" --generate-completion-script fish >"$out/completions/docfs.fish"
    echo "docs: bash, zsh and fish completions in $out/completions" >&2
fi

if want docc; then
    echo "docs: DocumentEngine's DocC documentation..." >&2
    swift package generate-documentation --target DocumentEngine --warnings-as-errors >&2
    echo "docs: .build/plugins/Swift-DocC/outputs/DocumentEngine.doccarchive" >&2
fi
