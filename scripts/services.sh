#!/usr/bin/env bash
# The servers the test suite talks to, on free ports of 127.0.0.1: PostgreSQL (logical WAL, for
# the CDC tests), nats-server with JetStream, and tansu (a Kafka-protocol broker, memory
# storage), redis-server, RabbitMQ and MariaDB. No Docker, no systemd: installed binaries, data and logs
# in one directory.
#
# scripts/test.sh sources this file and uses the functions below. It also runs on its own, to
# point `cargo test` / `cargo nextest run` at long-lived servers while developing:
#
#   eval "$(scripts/services.sh start .tmp/services)"   # prints the `export OUTBOX_TEST_...` lines
#   cargo nextest run -p outbox-postgres
#   scripts/services.sh stop .tmp/services
#
# Without these variables the tests start private servers themselves (see outbox-testkit).

# Installs PostgreSQL and nats-server from Debian packages when their binaries are missing
# (and tansu with cargo, see services_install_tansu).
services_install() {
    services_tansu_bin >/dev/null 2>&1 || services_install_tansu || return 1
    services_moto_bin >/dev/null 2>&1 || services_install_moto || return 1
    services_cloudevents_sdk || services_install_cloudevents || return 1
    services_install_promtool || return 1
    services_pubsub_emulator >/dev/null 2>&1 || services_install_pubsub_emulator
    services_install_browser || return 1
    local missing=()
    services_pg_bindir >/dev/null 2>&1 || missing+=(postgresql)
    # The failover tests make a standby with pg_basebackup (Debian: postgresql-client, which
    # the server package depends on) and promote it with pg_ctl.
    [ -x "$(services_pg_bindir 2>/dev/null)/pg_basebackup" ] || missing+=(postgresql)
    services_nats_bin >/dev/null 2>&1 || missing+=(nats-server)
    services_redis_bin >/dev/null 2>&1 || missing+=(redis-server)
    services_rabbitmq_bin >/dev/null 2>&1 || missing+=(rabbitmq-server)
    services_pgbouncer_bin >/dev/null 2>&1 || missing+=(pgbouncer)
    command -v mariadbd >/dev/null 2>&1 || [ -x /usr/sbin/mariadbd ] || missing+=(mariadb-server)
    # Each test server (and the failover tests' primary and replica) gets its own data directory.
    command -v mariadb-install-db >/dev/null 2>&1 || missing+=(mariadb-server)
    # The TLS tests make their certificates with the openssl command line tool.
    command -v openssl >/dev/null 2>&1 || missing+=(openssl)
    # The build: librdkafka's TLS and SASL/SCRAM link the system's OpenSSL (rdkafka's `ssl`).
    command -v pkg-config >/dev/null 2>&1 || missing+=(pkg-config)
    pkg-config --exists openssl 2>/dev/null || missing+=(libssl-dev)
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
    services_pg_bindir >/dev/null && services_nats_bin >/dev/null && services_redis_bin >/dev/null &&
        services_rabbitmq_bin >/dev/null && services_pgbouncer_bin >/dev/null
}

# moto's server, the local stand-in for SQS, SNS, Kinesis and DynamoDB (PyPI `moto[server]`,
# which brings boto3 for the tests' consumers too); the tests start their own.
services_moto_bin() {
    if [ -n "${OUTBOX_TEST_MOTO_SERVER:-}" ]; then
        echo "$OUTBOX_TEST_MOTO_SERVER"
        return 0
    fi
    command -v moto_server 2>/dev/null
}

services_install_moto() {
    echo "services: installing moto[server] from PyPI" >&2
    python3 -m pip install --quiet --disable-pip-version-check 'moto[server]>=5.1,<6' >&2 || {
        echo "services: could not install moto[server] (pip install 'moto[server]')" >&2
        return 1
    }
    command -v pyenv >/dev/null 2>&1 && pyenv rehash >/dev/null 2>&1
    services_moto_bin >/dev/null
}

# The web console's end-to-end test (crates/outbox-cli/tests/console.rs): Debian's Chromium,
# and playwright-core from npm in the test's own folder (pinned by its package-lock.json; its
# node_modules is git-ignored). Node.js and npm: the machine's, else Debian's.
services_install_browser() {
    local dir="$_services_repo/crates/outbox-cli/tests/console"
    local missing=()
    [ -x "${OUTBOX_CHROMIUM:-/usr/bin/chromium}" ] || missing+=(chromium)
    command -v node >/dev/null 2>&1 || missing+=(nodejs)
    command -v npm >/dev/null 2>&1 || missing+=(npm)
    if [ ${#missing[@]} -gt 0 ]; then
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
        "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" </dev/null >&2 ||
            return 1
    fi
    # `npm ci` again only when the lock file is newer than the last install.
    if [ ! -f "$dir/node_modules/playwright-core/package.json" ] ||
        [ "$dir/package-lock.json" -nt "$dir/node_modules/.package-lock.json" ]; then
        echo "services: installing playwright-core (npm ci in crates/outbox-cli/tests/console)" >&2
        (cd "$dir" && npm ci --no-audit --no-fund --loglevel=error) >&2 || {
            echo "services: npm ci failed in $dir" >&2
            return 1
        }
    fi
}

# promtool, which checks and unit-tests the Prometheus alert rules in deploy/prometheus/
# (crates/outbox-cli/tests/deploy.rs). It is taken out of Debian's `prometheus` package
# without installing the package: the package's scripts would create a user and start a
# Prometheus server (init script and systemd unit) on the machine.
services_install_promtool() {
    command -v promtool >/dev/null 2>&1 && return 0
    [ -x /usr/local/bin/promtool ] && return 0
    local sudo=() dir status
    if [ "$(id -u)" != 0 ]; then
        command -v sudo >/dev/null || {
            echo "services: promtool is missing and not root (no sudo): install it first" \
                "(Debian package prometheus) or set OUTBOX_TEST_PROMTOOL" >&2
            return 1
        }
        sudo=(sudo)
    fi
    echo "services: installing promtool (from Debian's prometheus package)" >&2
    dir=$(mktemp -d "${TMPDIR:-/tmp}/promtool.XXXXXX") || return 1
    chmod 0755 "$dir"
    (
        cd "$dir" &&
            { apt-get download prometheus >/dev/null 2>&1 || {
                "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2 &&
                    apt-get download prometheus >/dev/null 2>&1
            }; } &&
            dpkg-deb --fsys-tarfile prometheus_*.deb | tar -xOf - ./usr/bin/promtool >promtool &&
            "${sudo[@]}" install -m 0755 promtool /usr/local/bin/promtool
    )
    status=$?
    rm -rf "$dir"
    if [ $status -ne 0 ] || ! /usr/local/bin/promtool --version >/dev/null 2>&1; then
        echo "services: could not install promtool from Debian's prometheus package" >&2
        return 1
    fi
}

# The CloudEvents Python SDK (PyPI `cloudevents` 2.x): crates/outbox-cli/tests/cloudevents.rs
# reads what the relay published in the CloudEvents formats with it, as a Python consumer would.
services_cloudevents_sdk() {
    python3 -c 'import cloudevents.core.bindings.kafka' >/dev/null 2>&1
}

services_install_cloudevents() {
    echo "services: installing cloudevents from PyPI" >&2
    python3 -m pip install --quiet --disable-pip-version-check 'cloudevents>=2,<3' >&2 || {
        echo "services: could not install cloudevents (pip install 'cloudevents>=2,<3')" >&2
        return 1
    }
    services_cloudevents_sdk
}

# The Google Cloud Pub/Sub emulator (Debian package google-cloud-cli-pubsub-emulator, from
# Google's apt repository; needs Java 11+). The tests start their own.
services_pubsub_emulator() {
    local root
    if [ -n "${OUTBOX_TEST_PUBSUB_EMULATOR:-}" ]; then
        echo "$OUTBOX_TEST_PUBSUB_EMULATOR"
        return 0
    fi
    for root in /usr/lib/google-cloud-sdk /usr/share/google-cloud-sdk /opt/google-cloud-sdk; do
        if [ -x "$root/platform/pubsub-emulator/bin/cloud-pubsub-emulator" ]; then
            echo "$root/platform/pubsub-emulator/bin/cloud-pubsub-emulator"
            return 0
        fi
    done
    return 1
}

# Installs the emulator when its package is reachable; otherwise says so and goes on: the
# Pub/Sub tests then print that they were skipped and why.
services_install_pubsub_emulator() {
    local sudo=()
    [ "$(id -u)" != 0 ] && command -v sudo >/dev/null && sudo=(sudo)
    if [ "$(id -u)" = 0 ] || [ ${#sudo[@]} -gt 0 ]; then
        "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
            google-cloud-cli-pubsub-emulator default-jre-headless </dev/null >/dev/null 2>&1 &&
            services_pubsub_emulator >/dev/null && return 0
    fi
    echo "services: the Google Pub/Sub emulator is not installed and its package" \
        "(google-cloud-cli-pubsub-emulator, Google's apt repository) is not reachable:" \
        "the Pub/Sub tests will be skipped and say so" >&2
    return 0
}

# pgbouncer (Debian installs it in /usr/sbin); the tests start their own per test.
services_pgbouncer_bin() {
    command -v pgbouncer 2>/dev/null && return 0
    [ -x /usr/sbin/pgbouncer ] && echo /usr/sbin/pgbouncer
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

# redis-server.
services_redis_bin() {
    command -v redis-server 2>/dev/null && return 0
    [ -x /usr/bin/redis-server ] && echo /usr/bin/redis-server
}

# RabbitMQ's own start script (Debian's /usr/sbin wrapper would switch to the `rabbitmq` user
# and its fixed directories; the tests want a private node).
services_rabbitmq_bin() {
    [ -x /usr/lib/rabbitmq/bin/rabbitmq-server ] && [ -x /usr/lib/rabbitmq/bin/rabbitmqctl ] &&
        echo /usr/lib/rabbitmq/bin/rabbitmq-server
}

# The directory holding this repository (tansu's prebuilt copy may sit beside it).
_services_repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

# tansu, a Kafka-protocol broker (no Debian package): $TANSU_BIN, else `tansu` on PATH (or in
# cargo's bin directory), else the prebuilt copy in ../shared/tools beside the repository.
services_tansu_bin() {
    if [ -n "${TANSU_BIN:-}" ]; then
        [ -x "$TANSU_BIN" ] && echo "$TANSU_BIN"
        return
    fi
    command -v tansu 2>/dev/null && return 0
    local bin
    for bin in "${CARGO_HOME:-$HOME/.cargo}/bin/tansu" "$_services_repo/../shared/tools/tansu"; do
        if [ -x "$bin" ]; then
            echo "$bin"
            return 0
        fi
    done
    return 1
}

# Builds tansu from crates.io (about 20 minutes on 2 cores, once) when no binary is found.
# `libsql` is its SQL storage, the only one that keeps SCRAM users (the Kafka SASL tests).
services_install_tansu() {
    echo "services: tansu not found; building it with cargo install (about 20 minutes, once)" >&2
    cargo install tansu --version 0.6.0 --locked --no-default-features --features dynostore,libsql >&2 &&
        services_tansu_bin >/dev/null
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

# services_start_kafka DIR: tansu with memory storage in DIR/kafka; exports
# OUTBOX_TEST_KAFKA_BROKERS. tansu creates no topic on produce: the tests create their own.
services_start_kafka() {
    local root=$1/kafka bin port _attempt pid _i
    bin=$(services_tansu_bin) || {
        echo "services: tansu not found (set TANSU_BIN or run services_install)" >&2
        return 1
    }
    mkdir -p "$root"
    for _attempt in 1 2 3; do
        port=$(services_free_port)
        : >"$root/tansu.log"
        "$bin" broker --listener-url "tcp://127.0.0.1:$port" \
            --advertised-listener-url "tcp://127.0.0.1:$port" --storage-engine memory://tansu/ \
            </dev/null >>"$root/tansu.log" 2>&1 &
        pid=$!
        echo "$pid" >"$root/tansu.pid"
        for _i in $(seq 1 300); do
            if grep -q "ready in" "$root/tansu.log" && (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
                export OUTBOX_TEST_KAFKA_BROKERS="127.0.0.1:$port"
                echo "services: tansu (Kafka protocol) ready at $OUTBOX_TEST_KAFKA_BROKERS" >&2
                return 0
            fi
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        kill -KILL "$pid" 2>/dev/null || true
        rm -f "$root/tansu.pid"
        grep -qi "address already in use\|AddrInUse" "$root/tansu.log" || break
    done
    echo "services: tansu did not start" >&2
    services_log_tail "$root/tansu.log"
    return 1
}

# services_start_redis DIR: redis-server in DIR/redis; exports OUTBOX_TEST_REDIS_URL. Like the
# testkit's own: append-only file (streams survive a restart), arguments up to 1 MiB.
services_start_redis() {
    local root=$1/redis bin port _attempt _i reply
    bin=$(services_redis_bin) || {
        echo "services: redis-server not found" >&2
        return 1
    }
    mkdir -p "$root"
    for _attempt in 1 2 3; do
        port=$(services_free_port)
        : >"$root/redis-server.log"
        "$bin" --bind 127.0.0.1 --port "$port" --save "" --appendonly yes --appendfsync no \
            --dir "$root" --proto-max-bulk-len 1mb --daemonize yes \
            --pidfile "$root/redis-server.pid" --logfile "$root/redis-server.log" \
            </dev/null >>"$root/redis-server.out" 2>&1 || true
        for _i in $(seq 1 100); do
            reply=$( (exec 3<>"/dev/tcp/127.0.0.1/$port" && printf 'PING\r\n' >&3 &&
                read -r -t 1 line <&3 && echo "$line") 2>/dev/null || true)
            if [ "${reply%$'\r'}" = "+PONG" ]; then
                export OUTBOX_TEST_REDIS_URL="redis://127.0.0.1:$port"
                echo "services: Redis ready at $OUTBOX_TEST_REDIS_URL" >&2
                return 0
            fi
            sleep 0.05
        done
        grep -qi "address already in use" "$root/redis-server.log" || break
    done
    echo "services: redis-server did not start" >&2
    services_log_tail "$root/redis-server.out" 10
    services_log_tail "$root/redis-server.log"
    return 1
}

# services_start_rabbitmq DIR: a private RabbitMQ node in DIR/rabbitmq (its own node name,
# ports, epmd, Mnesia, logs, HOME and cookie; messages up to 1 MiB, like the testkit's own);
# exports OUTBOX_TEST_AMQP_URL. Boots in 3-8 s; readiness is `rabbitmqctl wait PIDFILE`.
services_start_rabbitmq() {
    local root=$1/rabbitmq bin ctl port dist epmd _attempt
    bin=$(services_rabbitmq_bin) || {
        echo "services: /usr/lib/rabbitmq/bin/rabbitmq-server not found" >&2
        return 1
    }
    ctl=$(dirname "$bin")/rabbitmqctl
    mkdir -p "$root/home"
    echo "[]." >"$root/enabled_plugins"
    printf 'max_message_size = 1048576\ndisk_free_limit.absolute = 1MB\n' >"$root/rabbitmq.conf"
    for _attempt in 1 2 3; do
        port=$(services_free_port)
        dist=$(services_free_port)
        epmd=$(services_free_port)
        if [ "$port" = "$dist" ] || [ "$port" = "$epmd" ] || [ "$dist" = "$epmd" ]; then
            continue
        fi
        cat >"$root/env" <<ENV
export RABBITMQ_NODENAME='outbox-$port@localhost' RABBITMQ_NODE_IP_ADDRESS=127.0.0.1
export RABBITMQ_NODE_PORT=$port RABBITMQ_DIST_PORT=$dist ERL_EPMD_PORT=$epmd
export RABBITMQ_MNESIA_BASE='$root/mnesia' RABBITMQ_LOG_BASE='$root/log'
export RABBITMQ_PID_FILE='$root/rabbitmq.pid' RABBITMQ_ENABLED_PLUGINS_FILE='$root/enabled_plugins'
export RABBITMQ_CONFIG_FILE='$root/rabbitmq' RABBITMQ_ADVANCED_CONFIG_FILE='$root/advanced.config'
export RABBITMQ_CONF_ENV_FILE='$root/rabbitmq-env.conf' HOME='$root/home'
ENV
        rm -f "$root/rabbitmq.pid"
        (
            # shellcheck source=/dev/null
            . "$root/env"
            exec "$bin"
        ) </dev/null >>"$root/rabbitmq-server.log" 2>&1 &
        if (
            # shellcheck source=/dev/null
            . "$root/env"
            "$ctl" -n "$RABBITMQ_NODENAME" wait "$RABBITMQ_PID_FILE" --timeout 60
        ) </dev/null >>"$root/rabbitmqctl.log" 2>&1; then
            export OUTBOX_TEST_AMQP_URL="amqp://guest:guest@127.0.0.1:$port/%2f"
            echo "services: RabbitMQ ready at $OUTBOX_TEST_AMQP_URL" >&2
            return 0
        fi
        _services_stop_rabbitmq "$1"
        grep -qi "eaddrinuse\|address already in use" "$root/rabbitmq-server.log" || break
    done
    echo "services: rabbitmq-server did not start" >&2
    services_log_tail "$root/rabbitmqctl.log" 10
    services_log_tail "$root/rabbitmq-server.log"
    return 1
}

# Stops the RabbitMQ node of DIR: `rabbitmqctl stop PIDFILE` (waits until the process is
# gone), then its epmd, which would outlive it.
_services_stop_rabbitmq() {
    local root=$1/rabbitmq ctl
    [ -f "$root/env" ] || return 0
    ctl=/usr/lib/rabbitmq/bin/rabbitmqctl
    (
        # shellcheck source=/dev/null
        . "$root/env"
        if [ -f "$RABBITMQ_PID_FILE" ]; then
            timeout 60 "$ctl" -n "$RABBITMQ_NODENAME" stop "$RABBITMQ_PID_FILE" >/dev/null 2>&1 ||
                kill -KILL "$(cat "$RABBITMQ_PID_FILE")" 2>/dev/null || true
        fi
        epmd -port "$ERL_EPMD_PORT" -kill >/dev/null 2>&1 || true
    )
    rm -f "$root/env" "$root/rabbitmq.pid"
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
    # tansu: its SIGTERM shutdown waits for connected clients to leave, so give it two
    # seconds, then kill it (memory storage: nothing to save).
    if [ -f "$dir/kafka/tansu.pid" ]; then
        pid=$(cat "$dir/kafka/tansu.pid")
        if kill -TERM "$pid" 2>/dev/null; then
            for _i in $(seq 1 20); do
                kill -0 "$pid" 2>/dev/null || break
                sleep 0.1
            done
            kill -KILL "$pid" 2>/dev/null || true
        fi
        rm -f "$dir/kafka/tansu.pid"
    fi
    if [ -f "$dir/redis/redis-server.pid" ]; then
        pid=$(cat "$dir/redis/redis-server.pid")
        if kill -TERM "$pid" 2>/dev/null; then
            for _i in $(seq 1 100); do
                kill -0 "$pid" 2>/dev/null || break
                sleep 0.1
            done
            kill -KILL "$pid" 2>/dev/null || true
        fi
        rm -f "$dir/redis/redis-server.pid"
    fi
    _services_stop_rabbitmq "$dir"
    if [ -f "$dir/mariadb/mariadbd.pid" ]; then
        pid=$(cat "$dir/mariadb/mariadbd.pid")
        if kill -TERM "$pid" 2>/dev/null; then
            for _i in $(seq 1 300); do
                kill -0 "$pid" 2>/dev/null || break
                sleep 0.1
            done
            kill -KILL "$pid" 2>/dev/null || true
        fi
        rm -f "$dir/mariadb/mariadbd.pid"
    fi
}

# services_start_mariadb DIR: mariadb-install-db + mariadbd in DIR/mariadb (row-based binlog
# on, for the CDC tests); exports OUTBOX_TEST_MYSQL_URL. Like the testkit's own MariaDb.
services_start_mariadb() {
    local root=$1/mariadb bin install user port _attempt pid _i
    bin=$(command -v mariadbd 2>/dev/null || echo /usr/sbin/mariadbd)
    install=$(command -v mariadb-install-db 2>/dev/null || echo /usr/bin/mariadb-install-db)
    [ -x "$bin" ] && [ -x "$install" ] || {
        echo "services: mariadbd / mariadb-install-db not found" >&2
        return 1
    }
    user=$(id -un)
    # Its own tmpdir: a bootstrap's temporary tables in a shared /tmp were seen vanishing.
    mkdir -p "$root/tmp"
    if ! "$install" --no-defaults --user="$user" --datadir="$root/data" --tmpdir="$root/tmp" \
        --auth-root-authentication-method=normal --skip-test-db >"$root/install.log" 2>&1; then
        echo "services: mariadb-install-db failed" >&2
        services_log_tail "$root/install.log"
        return 1
    fi
    for _attempt in 1 2 3; do
        port=$(services_free_port)
        : >"$root/mariadb.log"
        "$bin" --no-defaults --user="$user" --bind-address=127.0.0.1 --port="$port" \
            --skip-name-resolve --innodb-flush-log-at-trx-commit="${SERVICES_MARIADB_FLUSH:-2}" --max-connections=500 \
            --datadir="$root/data" --tmpdir="$root/tmp" --socket="$root/mariadb.sock" --pid-file="$root/mariadb.pid" \
            --log-bin="$root/data/binlog" --binlog-format=ROW --server-id=1 \
            --log-error="$root/mariadb.log" </dev/null >>"$root/mariadb.out" 2>&1 &
        pid=$!
        echo "$pid" >"$root/mariadbd.pid"
        for _i in $(seq 1 600); do
            if grep -q "ready for connections" "$root/mariadb.log" &&
                (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
                export OUTBOX_TEST_MYSQL_URL="mysql://root@127.0.0.1:$port"
                echo "services: MariaDB ready at $OUTBOX_TEST_MYSQL_URL" >&2
                return 0
            fi
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        kill -KILL "$pid" 2>/dev/null || true
        rm -f "$root/mariadbd.pid"
        grep -qi "address already in use" "$root/mariadb.log" || break
    done
    echo "services: mariadbd did not start" >&2
    services_log_tail "$root/mariadb.log"
    return 1
}

# services_start_all DIR: both servers; on failure stops whatever did start.
services_start_all() {
    if ! services_start_postgres "$1" || ! services_start_nats "$1" ||
        ! services_start_kafka "$1" || ! services_start_redis "$1" ||
        ! services_start_rabbitmq "$1" || ! services_start_mariadb "$1"; then
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
        echo "export OUTBOX_TEST_KAFKA_BROKERS='$OUTBOX_TEST_KAFKA_BROKERS'"
        echo "export OUTBOX_TEST_REDIS_URL='$OUTBOX_TEST_REDIS_URL'"
        echo "export OUTBOX_TEST_AMQP_URL='$OUTBOX_TEST_AMQP_URL'"
        echo "export OUTBOX_TEST_MYSQL_URL='$OUTBOX_TEST_MYSQL_URL'"
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
