#!/usr/bin/env bash
# The servers the test suite talks to, on free ports of 127.0.0.1: PostgreSQL (logical WAL, for
# the CDC tests) and nats-server with JetStream. No Docker, no systemd: installed binaries, data
# and logs in one directory.
#
# scripts/test.sh sources this file and uses the functions below. It also runs on its own, to
# point `cargo test` / `cargo nextest run` at long-lived servers while developing:
#
#   eval "$(scripts/services.sh start .tmp/services)"   # prints the `export OUTBOX_TEST_...` lines
#   cargo nextest run -p outbox-postgres
#   scripts/services.sh stop .tmp/services
#
# Without these variables the tests start private servers themselves (see outbox-testkit).

# Installs PostgreSQL and nats-server from Debian packages when their binaries are missing.
services_install() {
    local missing=()
    services_pg_bindir >/dev/null 2>&1 || missing+=(postgresql)
    services_nats_bin >/dev/null 2>&1 || missing+=(nats-server)
    [ ${#missing[@]} -eq 0 ] && return 0
    local sudo=()
    if [ "$(id -u)" != 0 ]; then
        command -v sudo >/dev/null || {
            echo "services: missing ${missing[*]} and not root (no sudo): install them first" >&2
            return 1
        }
        sudo=(sudo)
    fi
    echo "services: installing ${missing[*]}" >&2
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" </dev/null >&2
    services_pg_bindir >/dev/null && services_nats_bin >/dev/null
}

# The directory holding initdb, pg_ctl and postgres (Debian keeps them out of PATH).
services_pg_bindir() {
    local dir
    if dir=$(pg_config --bindir 2>/dev/null) && [ -x "$dir/initdb" ] && [ -x "$dir/pg_ctl" ]; then
        echo "$dir"
        return 0
    fi
    dir=$(printf '%s\n' /usr/lib/postgresql/*/bin | sort -V | tail -n 1)
    if [ -n "$dir" ] && [ -x "$dir/initdb" ] && [ -x "$dir/pg_ctl" ]; then
        echo "$dir"
        return 0
    fi
    dir=$(dirname "$(command -v initdb 2>/dev/null || echo /nonexistent/initdb)")
    [ -x "$dir/initdb" ] && [ -x "$dir/pg_ctl" ] && echo "$dir"
}

# nats-server (Debian installs it in /usr/sbin, outside a normal user's PATH).
services_nats_bin() {
    command -v nats-server 2>/dev/null && return 0
    [ -x /usr/sbin/nats-server ] && echo /usr/sbin/nats-server
}

# A port nobody listens on, below the ephemeral range (where the tests' own servers bind).
services_free_port() {
    local port _i
    for _i in $(seq 1 200); do
        port=$((15000 + RANDOM % 17000))
        if ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
            echo "$port"
            return 0
        fi
    done
    echo "services: no free port found" >&2
    return 1
}

# Prints the last lines of a log file, headed by its name.
services_log_tail() {
    [ -f "$1" ] || return 0
    echo "--- last lines of $1 ---" >&2
    tail -n "${2:-40}" "$1" >&2
}

# Runs a command as the `postgres` user when we are root (PostgreSQL refuses to run as root).
_services_as_postgres() {
    if [ "$(id -u)" = 0 ]; then
        runuser -u postgres -- "$@"
    else
        "$@"
    fi
}

# services_start_postgres DIR: initdb + start in DIR/postgres; exports OUTBOX_TEST_DATABASE_URL.
services_start_postgres() {
    local root=$1/postgres bindir port _attempt
    bindir=$(services_pg_bindir) || {
        echo "services: PostgreSQL binaries not found" >&2
        return 1
    }
    mkdir -p "$root"
    chmod 755 "$1"
    [ "$(id -u)" = 0 ] && chown postgres: "$root"
    if ! _services_as_postgres "$bindir/initdb" -D "$root/data" -U postgres -A trust --no-sync \
        -E UTF8 --locale=C >"$root/initdb.log" 2>&1; then
        echo "services: initdb failed" >&2
        services_log_tail "$root/initdb.log"
        return 1
    fi
    for _attempt in 1 2 3; do
        port=$(services_free_port)
        if _services_as_postgres "$bindir/pg_ctl" -D "$root/data" -l "$root/postgres.log" -w -t 60 -s \
            -o "-p $port -k $root -c listen_addresses=127.0.0.1 -c wal_level=logical \
                -c max_replication_slots=50 -c max_wal_senders=50 -c fsync=off \
                -c full_page_writes=off -c max_connections=400 -c shared_buffers=256MB" \
            start >>"$root/pg_ctl.log" 2>&1; then
            echo "$bindir" >"$root/bindir"
            export OUTBOX_TEST_DATABASE_URL="postgres://postgres@127.0.0.1:$port/postgres"
            echo "services: PostgreSQL ready at $OUTBOX_TEST_DATABASE_URL" >&2
            return 0
        fi
        grep -qi "address already in use" "$root/postgres.log" 2>/dev/null || break
    done
    echo "services: PostgreSQL did not start" >&2
    services_log_tail "$root/pg_ctl.log" 10
    services_log_tail "$root/postgres.log"
    return 1
}

# services_start_nats DIR: nats-server -js in DIR/nats; exports OUTBOX_TEST_NATS_URL.
services_start_nats() {
    local root=$1/nats bin port _attempt pid _i
    bin=$(services_nats_bin) || {
        echo "services: nats-server not found" >&2
        return 1
    }
    mkdir -p "$root"
    for _attempt in 1 2 3; do
        port=$(services_free_port)
        : >"$root/nats-server.log"
        "$bin" -a 127.0.0.1 -p "$port" -js -sd "$root/jetstream" -P "$root/nats-server.pid" \
            </dev/null >>"$root/nats-server.log" 2>&1 &
        pid=$!
        echo "$pid" >"$root/nats-server.pid"
        for _i in $(seq 1 300); do
            if grep -q "Server is ready" "$root/nats-server.log"; then
                export OUTBOX_TEST_NATS_URL="nats://127.0.0.1:$port"
                echo "services: NATS ready at $OUTBOX_TEST_NATS_URL" >&2
                return 0
            fi
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        kill "$pid" 2>/dev/null || true
        grep -qi "address already in use" "$root/nats-server.log" || break
    done
    echo "services: nats-server did not start" >&2
    services_log_tail "$root/nats-server.log"
    return 1
}

# services_stop DIR: stops whatever services_start_* started in DIR (safe to call twice).
services_stop() {
    local dir=$1 pid _i
    if [ -f "$dir/postgres/bindir" ] && [ -f "$dir/postgres/data/postmaster.pid" ]; then
        _services_as_postgres "$(cat "$dir/postgres/bindir")/pg_ctl" -D "$dir/postgres/data" \
            -m fast -w -t 30 -s stop >/dev/null 2>&1 || true
    fi
    if [ -f "$dir/nats/nats-server.pid" ]; then
        pid=$(cat "$dir/nats/nats-server.pid")
        if kill -TERM "$pid" 2>/dev/null; then
            for _i in $(seq 1 100); do
                kill -0 "$pid" 2>/dev/null || break
                sleep 0.1
            done
            kill -KILL "$pid" 2>/dev/null || true
        fi
        rm -f "$dir/nats/nats-server.pid"
    fi
}

# services_start_all DIR: both servers; on failure stops whatever did start.
services_start_all() {
    if ! services_start_postgres "$1" || ! services_start_nats "$1"; then
        services_stop "$1"
        return 1
    fi
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    set -euo pipefail
    cmd=${1:-}
    dir=${2:-.tmp/services}
    case "$cmd" in
    start)
        services_install
        mkdir -p "$dir"
        dir=$(cd "$dir" && pwd)
        services_stop "$dir"
        services_start_all "$dir"
        echo "export OUTBOX_TEST_DATABASE_URL='$OUTBOX_TEST_DATABASE_URL'"
        echo "export OUTBOX_TEST_NATS_URL='$OUTBOX_TEST_NATS_URL'"
        ;;
    stop)
        services_stop "$dir"
        ;;
    *)
        echo "usage: $0 start|stop [DIR (default .tmp/services)]" >&2
        exit 2
        ;;
    esac
fi
