#!/usr/bin/env bash
# Screenshots of DocFS in a real file manager: runs PCManFM on a virtual X server (Xvfb)
# against a mounted demo store, browses a package, then the Trash and a document's history,
# and saves each view as a small PNG, so the docs can show what a desktop user sees (docs/user-guide/desktop.md).
# Nothing of the user's own desktop is touched: HOME, the D-Bus session, the X display and
# the store are all private to this run and removed at the end.
# Usage: scripts/desktop.sh [OUTPUT_DIR]      (default: docs/images)
set -euo pipefail
# The output folder is relative to where the script is run from, not to the repository.
out=$(realpath -m "${1:-$(dirname "$0")/../docs/images}")
cd "$(dirname "$0")/.."

# What DocFS and its tests need (FUSE, GIO and its trash backend on a session bus), and the
# desktop: PCManFM (GTK 2), an X server without a screen, xdotool to type into it, ImageMagick
# to capture it, and pngquant for small palette PNGs. libfm-modules has the Trash's Restore and
# Empty Trash menu entries; lxde-icon-theme (nuoveXT2) is the icon theme libfm recommends.
./scripts/install-deps.sh --test pcmanfm libfm-modules lxde-icon-theme xvfb xdotool imagemagick pngquant

command -v swift >/dev/null || { echo "error: swift is missing (https://www.swift.org/install/linux/)" >&2; exit 1; }
echo "building docfs..." >&2
swift build --product docfs >&2
docfs="$(swift build --show-bin-path)/docfs"

tmp=$(mktemp -d /tmp/docfs-desktop.XXXXXX)
mnt="$tmp/DocFS"          # the name shows in the location bar: keep it short and plain
pids=()                   # what this script started, stopped in reverse order
cleanup() {
    local status=$? i
    for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
        kill "${pids[i]}" 2>/dev/null || true
        wait "${pids[i]}" 2>/dev/null || true
    done
    if mountpoint -q "$mnt" 2>/dev/null; then
        "$docfs" unmount "$mnt" || fusermount3 -u "$mnt" || true
    fi
    if ((status)); then
        echo "failed; the end of the docfs log and of PCManFM's output:" >&2
        tail -n 20 "$tmp"/home/.local/state/docfs/docfs.log "$tmp/pcmanfm.log" >&2 2>/dev/null || true
    fi
    rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# A private home and runtime folder: PCManFM's and GTK's settings, the thumbnail cache, the
# docfs log and gvfs' sockets all go there. No gvfsd-fuse mount (it would need unmounting),
# no accessibility bus (only warnings without one).
mkdir -p "$tmp/home" "$tmp/run" "$mnt"
chmod 700 "$tmp/run"
unset XDG_CONFIG_HOME XDG_CACHE_HOME XDG_DATA_HOME XDG_STATE_HOME XDG_CONFIG_DIRS
export HOME="$tmp/home" XDG_RUNTIME_DIR="$tmp/run" GVFS_DISABLE_FUSE=1 NO_AT_BRIDGE=1
export LANG=C.UTF-8 TZ=UTC

"$docfs" create "$tmp/Demo.docstore" --demo >&2
"$docfs" mount "$tmp/Demo.docstore" "$mnt"
# Two more saves of README.txt, so its history lists several versions: an append, and a
# rewrite by sed -i (a new file renamed over the old one, as many editors save). docfs saves
# a changed document a second after its last change (quiet_interval), hence the pauses.
echo "Edited in the mount: every save is a new version." >>"$mnt/README.txt"
sleep 1.5
sed -i 's/a file/a plain file/' "$mnt/README.txt"
sleep 1.5

# PCManFM's window: 900x560 with no window manager (the window sits at 0,0, undecorated);
# icon view, and thumbnails for images (the package's are local files, as libfm wants).
mkdir -p "$HOME/.config/pcmanfm/default" "$HOME/.config/libfm"
cat >"$HOME/.config/pcmanfm/default/pcmanfm.conf" <<'EOF'
[ui]
win_width=900
win_height=560
maximized=0
view_mode=icon
show_hidden=0
side_pane_mode=places
show_statusbar=1
EOF
cat >"$HOME/.config/libfm/libfm.conf" <<'EOF'
[config]
thumbnail_local=1
[ui]
show_thumbnail=1
EOF
# GTK 2 reads its icon theme from ~/.gtkrc-2.0; name it rather than depend on the fallback.
echo 'gtk-icon-theme-name = "nuoveXT2"' >"$HOME/.gtkrc-2.0"

# X server: -displayfd picks a free display number and reports it once the server is ready.
Xvfb -displayfd 3 -screen 0 1024x700x24 -nolisten tcp 3>"$tmp/display" 2>"$tmp/xvfb.log" &
pids+=($!)
for _ in $(seq 100); do [ -s "$tmp/display" ] && break; sleep 0.1; done
export DISPLAY=":$(head -n1 "$tmp/display")"

# Session bus: GIO reaches gvfsd (and through it gvfsd-trash) on it; both exit with the bus.
dbus-daemon --session --nofork --print-address=3 3>"$tmp/bus" 2>"$tmp/bus.log" &
pids+=($!)
for _ in $(seq 100); do [ -s "$tmp/bus" ] && break; sleep 0.1; done
export DBUS_SESSION_BUS_ADDRESS=$(head -n1 "$tmp/bus")

# Waits until PCManFM's window title (the folder's name, or the URI for trash:///) is $1.
wait_title() {
    for _ in $(seq 100); do
        [ "$(xdotool getwindowname "$win" 2>/dev/null)" = "$1" ] && return 0
        sleep 0.1
    done
    echo "error: PCManFM's window never showed \"$1\" (it shows \"$(xdotool getwindowname "$win")\")" >&2
    return 1
}
# Types a path or URI into the location bar, as a user would after Ctrl+L.
go_to() {
    xdotool key --clearmodifiers ctrl+l
    sleep 0.3
    xdotool type --delay 10 "$1"
    xdotool key Return
}
# Captures PCManFM's window and reduces it to a 64-color palette PNG in $tmp/shots (moved to
# $out only once all are made and checked). The whole screen is captured, then cut to the
# window, so that a popup menu (a window of its own) is included.
shoot() {
    sleep 1   # let icons, thumbnails and the status bar settle
    local X Y WIDTH HEIGHT
    eval "$(xdotool getwindowgeometry --shell "$win" | grep -E '^(X|Y|WIDTH|HEIGHT)=[0-9]+$')"
    import -window root -crop "${WIDTH}x${HEIGHT}+${X}+${Y}" +repage "$tmp/shot.png"
    mkdir -p "$tmp/shots"
    pngquant --force --strip --output "$tmp/shots/$1" 64 -- "$tmp/shot.png"
}
# gvfsd-trash shows the trash of every mount on the machine, and `gio trash --empty` anywhere
# (the DocFS test suite runs it) empties ours too: the Trash must hold our two items, only.
check_trash() {
    local listed
    listed=$(gio list -a trash::orig-path trash:///)
    if [ "$(grep -c . <<<"$listed")" -ne 2 ] || [ "$(grep -cF "trash::orig-path=$mnt/" <<<"$listed")" -ne 2 ]; then
        printf 'error: the Trash changed under us (another process emptied or filled it); run again:\n%s\n' "$listed" >&2
        exit 1
    fi
}

# 1. The package: a document that is a folder of wrappers, images shown as thumbnails.
pcmanfm "$mnt/Things I Own.mystuff" >"$tmp/pcmanfm.log" 2>&1 &
pids+=($!)
win=""
for _ in $(seq 100); do
    win=$(xdotool search --onlyvisible --class pcmanfm 2>/dev/null | head -n1) && [ -n "$win" ] && break
    sleep 0.1
done
[ -n "$win" ] || { echo "error: no PCManFM window" >&2; exit 1; }
xdotool windowfocus --sync "$win"
wait_title "Things I Own.mystuff"
# Thumbnails are made in the background; wait for the four images' ones in the cache.
for _ in $(seq 100); do
    (($(find "$HOME/.cache/thumbnails" -name '*.png' 2>/dev/null | wc -l) >= 4)) && break
    sleep 0.1
done
shoot package.png

# 2. The Trash: one wrapper of the package and one whole document, trashed with GIO on the
# same bus as PCManFM; the items go to the mount's own .Trash-0, gvfsd-trash lists them.
# PCManFM's list view has no original-location or deletion-date column; its Restore entry,
# which uses the original location, is what shows the item knows where it came from.
gio trash "$mnt/Things I Own.mystuff/image.png" "$mnt/Shopping List.txt"
go_to "trash:///"
wait_title "trash:///"
xdotool key ctrl+4   # detailed list view
sleep 1
check_trash
# A right click on the second row (Shopping List.txt; rows are 28 px under a 28 px header at
# this config's font and icon sizes) selects it and opens its menu.
xdotool mousemove --window "$win" 300 133 click 3
shoot trash.png
check_trash
xdotool key Escape

# 3. The history of README.txt: one read-only file per saved version, in the hidden .docfs
# folder that is reachable by path.
go_to "$mnt/.docfs/versions/README.txt"
wait_title "README.txt"
xdotool key ctrl+4
shoot history.png

mkdir -p "$out"
for f in package.png trash.png history.png; do
    mv "$tmp/shots/$f" "$out/$f"
    echo "$out/$f: $(identify -format '%wx%h' "$out/$f"), $(stat -c %s "$out/$f") bytes" >&2
done
