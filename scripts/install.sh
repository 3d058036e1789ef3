#!/usr/bin/env bash
# Installs docfs: the release binary, mount(8)'s helper, the manual pages and the completions.
#
# Usage: scripts/install.sh [PREFIX]               (default PREFIX: /usr/local)
#        scripts/install.sh --uninstall [PREFIX]
#
# Installs
#   PREFIX/bin/docfs                                      the release build (a copy: root runs it
#                                                         from mount(8), and must not run a file
#                                                         in a user's writable build folder)
#   HELPER_DIR/mount.fuse.docfs                           mount(8)'s helper for type fuse.docfs
#                                                         (HELPER_DIR: /sbin, where mount(8)
#                                                         looks; DOCFS_HELPER_DIR changes it)
#   PREFIX/share/man/man1/docfs.1, docfs.COMMAND.1        generated from the code (scripts/docs.sh)
#   PREFIX/share/man/man8/mount.fuse.docfs.8
#   PREFIX/share/bash-completion/completions/docfs
#   PREFIX/share/zsh/site-functions/_docfs
#   PREFIX/share/fish/vendor_completions.d/docfs.fish
# and lists every file and folder it made in PREFIX/share/docfs/install-manifest, which
# --uninstall reads to remove exactly those (folders only when empty), and nothing else.
#
# DESTDIR stages the files under another root (for packaging): they are installed at
# DESTDIR/PREFIX/…, and the manifest and the helper name the final paths.
#
# Builds as the calling user and installs with sudo when not root. Installs only what building
# and running need (scripts/install-deps.sh), not the test tools.
set -euo pipefail
cd "$(dirname "$0")/.."

uninstall=false
if [ "${1:-}" = "--uninstall" ]; then
    uninstall=true
    shift
fi
prefix=${1:-/usr/local}
case "$prefix" in /*) ;; *) echo "error: PREFIX must be an absolute path: $prefix" >&2; exit 2 ;; esac
prefix=${prefix%/}
[ -n "$prefix" ] || prefix=/
helper_dir=${DOCFS_HELPER_DIR:-/sbin}
destdir=${DESTDIR:-}
manifest=$prefix/share/docfs/install-manifest

SUDO=""
if [ "$(id -u)" -ne 0 ] && [ -z "$destdir" ]; then SUDO="sudo"; fi

if $uninstall; then
    if [ ! -f "$destdir$manifest" ]; then
        echo "error: $manifest is missing: nothing was installed with PREFIX $prefix" >&2
        exit 1
    fi
    # Files first, then folders, deepest first, each only if empty.
    mapfile -t entries <"$destdir$manifest"
    for entry in "${entries[@]}"; do
        case "$entry" in file\ *) $SUDO rm -f -- "$destdir${entry#file }" ;; esac
    done
    for ((i = ${#entries[@]} - 1; i >= 0; i--)); do
        case "${entries[i]}" in dir\ *) $SUDO rmdir -- "$destdir${entries[i]#dir }" 2>/dev/null || true ;; esac
    done
    echo "removed what $manifest listed"
    exit 0
fi

./scripts/install-deps.sh --build
DOCS_CONFIGURATION=release ./scripts/docs.sh man completions
# DOCFS_BINARY: another build to install (scripts/package-deb.sh's, with the Swift runtime
# linked in); by default the release build the manual pages were made from, which uses the
# Swift toolchain's runtime libraries where the toolchain is installed.
binary=${DOCFS_BINARY:-.build/release/docfs}
[ -x "$binary" ] || { echo "error: $binary was not built" >&2; exit 1; }

# What an earlier install made stays listed, so that --uninstall removes it too.
declare -a listed=()
if [ -f "$destdir$manifest" ]; then mapfile -t listed <"$destdir$manifest"; fi
remember() {
    local entry
    for entry in "${listed[@]}"; do [ "$entry" = "$1" ] && return 0; done
    listed+=("$1")
}
# Makes FOLDER and its missing parents, remembering the ones it made.
folder() {
    local path=$1 missing=()
    while [ ! -d "$destdir$path" ]; do
        missing=("$path" "${missing[@]}")
        path=$(dirname "$path")
    done
    for path in "${missing[@]}"; do
        $SUDO install -d -m 0755 "$destdir$path"
        remember "dir $path"
    done
}
# put MODE SOURCE TARGET: installs SOURCE as TARGET (a final path).
put() {
    folder "$(dirname "$3")"
    $SUDO install -m "$1" "$2" "$destdir$3"
    remember "file $3"
}

put 0755 "$binary" "$prefix/bin/docfs"

# mount(8) runs HELPER_DIR/mount.fuse.docfs SOURCE MOUNTPOINT [-o OPTIONS]; mount.fuse3 (package
# fuse3) then runs `docfs SOURCE MOUNTPOINT -o OPTIONS` through /bin/sh, which must find this
# docfs: mount(8) passes no PATH of the caller's.
helper=$(mktemp)
trap 'rm -f "$helper"' EXIT
cat >"$helper" <<EOF
#!/bin/sh
# mount(8)'s helper for file systems of type fuse.docfs, installed by DocFS's scripts/install.sh.
# mount.fuse3 runs \`docfs SOURCE MOUNTPOINT -o OPTIONS\`, which docfs takes as \`docfs mount\`.
PATH="$prefix/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
export PATH
exec mount.fuse3 "\$@" -t fuse.docfs
EOF
put 0755 "$helper" "$helper_dir/mount.fuse.docfs"

for page in .build/docs/man/*.1; do put 0644 "$page" "$prefix/share/man/man1/$(basename "$page")"; done
for page in .build/docs/man/*.8; do put 0644 "$page" "$prefix/share/man/man8/$(basename "$page")"; done
put 0644 .build/docs/completions/docfs.bash "$prefix/share/bash-completion/completions/docfs"
put 0644 .build/docs/completions/_docfs "$prefix/share/zsh/site-functions/_docfs"
put 0644 .build/docs/completions/docfs.fish "$prefix/share/fish/vendor_completions.d/docfs.fish"

folder "$(dirname "$manifest")"
remember "file $manifest"
list=$(mktemp)
printf '%s\n' "${listed[@]}" >"$list"
$SUDO install -m 0644 "$list" "$destdir$manifest"
rm -f "$list"

echo "installed docfs in $destdir$prefix ($(grep -c '^file ' "$destdir$manifest") files, listed in $manifest)"
echo "now: man docfs; mount -t fuse.docfs /path/to/Store.docstore /mnt/docs"
