#!/usr/bin/env bash
# A PostgreSQL 15 server on loopback for DocFS's tests and for trying the PostgreSQL store.
#
# Usage: scripts/postgres.sh start   installs PostgreSQL if missing, starts the server unless it
#                                    runs already, and prints its URL (postgres://…) on stdout
#        scripts/postgres.sh url     prints the URL
#        scripts/postgres.sh stop    stops the server
#
# The server has its own data folder (DOCFS_PG_DIR, default /tmp/docfs-postgres-$UID) and port
# (DOCFS_PG_PORT, default 55432), listens on 127.0.0.1 only and trusts every local connection:
# for tests, never for data that matters. Tests create one database each and drop it.
set -euo pipefail

dir=${DOCFS_PG_DIR:-/tmp/docfs-postgres-$(id -u)}
port=${DOCFS_PG_PORT:-55432}
bin=/usr/lib/postgresql/15/bin
url="postgres://postgres@127.0.0.1:$port/postgres"

# As the postgres user when root (initdb and the server refuse to run as root), else as oneself.
as_owner() {
    if [ "$(id -u)" -eq 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

running() {
    "$bin/pg_isready" -q -h 127.0.0.1 -p "$port" -t 2
}

case "${1:-start}" in
start)
    if [ ! -x "$bin/postgres" ]; then
        "$(dirname "$0")/install-deps.sh" postgresql >&2
    fi
    if running; then
        echo "$url"
        exit 0
    fi
    if [ ! -f "$dir/data/PG_VERSION" ]; then
        rm -rf "$dir"
        mkdir -p "$dir"
        if [ "$(id -u)" -eq 0 ]; then chown postgres:postgres "$dir"; fi
        chmod 700 "$dir"
        as_owner "$bin/initdb" -D "$dir/data" -U postgres --auth=trust --no-sync -E UTF8 >"$dir/initdb.log" 2>&1 \
            || { cat "$dir/initdb.log" >&2; exit 1; }
    fi
    # A server that died left its pid file; pg_ctl removes a stale one itself.
    # Every test opens a few connections to a database of its own: allow plenty.
    if ! as_owner "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 start \
        -o "-p $port -k $dir -c listen_addresses=127.0.0.1 -c max_connections=300 -c shared_buffers=64MB" >&2; then
        tail -20 "$dir/server.log" >&2 || true
        exit 1
    fi
    for _ in $(seq 1 60); do
        if running; then
            echo "$url"
            exit 0
        fi
        sleep 0.5
    done
    echo "error: PostgreSQL did not start on 127.0.0.1:$port; see $dir/server.log" >&2
    exit 1
    ;;
url)
    echo "$url"
    ;;
stop)
    if [ -f "$dir/data/postmaster.pid" ]; then
        as_owner "$bin/pg_ctl" -D "$dir/data" -m fast -w -t 60 stop >&2
    fi
    ;;
*)
    echo "usage: $0 start|url|stop" >&2
    exit 2
    ;;
esac
