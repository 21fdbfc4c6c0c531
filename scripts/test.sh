#!/usr/bin/env bash
# The project's test command (CI runs exactly this through .ci/run):
#
#   scripts/test.sh [extra cargo-nextest arguments, e.g. -p outbox-postgres or a test filter]
#
# 1. installs PostgreSQL, nats-server, redis-server and rabbitmq-server from Debian packages
#    when they are missing (and tansu, a Kafka-protocol broker, with `cargo install` when no
#    binary is found: see services.sh), and moto's server (PyPI `moto[server]`) for the AWS
#    sinks, which the tests start themselves;
# 2. checks formatting, runs clippy with warnings as errors, and builds the API docs
#    (`cargo doc --no-deps`, rustdoc warnings as errors);
# 3. starts ONE PostgreSQL, ONE nats-server and ONE tansu for the run on free ports of 127.0.0.1
#    (data and logs in a temporary directory, stopped and removed on exit) and passes them to the
#    tests as OUTBOX_TEST_DATABASE_URL, OUTBOX_TEST_NATS_URL and OUTBOX_TEST_KAFKA_BROKERS;
#    likewise ONE redis-server and ONE RabbitMQ node (OUTBOX_TEST_REDIS_URL, OUTBOX_TEST_AMQP_URL;
#    RabbitMQ boots in 3-8 s, so it is shared by the whole run);
# 4. builds the `outbox` binary with the `fault-injection` feature as
#    target/debug/outbox-fault-injection (OUTBOX_FAULT_BIN: a relay that breaks order on
#    purpose, for crash-test's own test) when outbox-cli is tested;
# 5. runs the whole test suite with cargo-nextest (falls back to `cargo test` without it), then
#    the doc tests.
#
# Environment: OUTBOX_TEST_THREADS (parallel tests, default 4: the tests mostly wait on servers),
# OUTBOX_SKIP_LINT=1 to skip fmt and clippy while iterating.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=scripts/services.sh
source scripts/services.sh

step() { printf '\n==> %s\n' "$*" >&2; }

started=$(date +%s)
# A fresh clone builds once: incremental caches only cost disk there.
if [ "${CI:-}" = true ]; then export CARGO_INCREMENTAL=0; fi
step "tools"
cargo --version >&2
if cargo nextest --version >/dev/null 2>&1; then
    have_nextest=1
    cargo nextest --version 2>/dev/null | head -n 1 >&2
else
    have_nextest=0
    echo "cargo-nextest not installed: falling back to cargo test" >&2
fi
services_install

if [ "${OUTBOX_SKIP_LINT:-0}" != 1 ]; then
    step "cargo fmt --all --check"
    cargo fmt --all --check

    step "cargo clippy --workspace --all-targets -- -D warnings"
    cargo clippy --workspace --all-targets -- -D warnings

    step "cargo doc --no-deps --workspace (rustdoc warnings are errors)"
    RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --workspace

    step "outbox-inbox: a PostgreSQL-only consumer builds no SQLite"
    if cargo tree -p outbox-inbox --no-default-features --features postgres,nats -e normal |
        grep -q sqlite; then
        echo "outbox-inbox with features postgres,nats depends on SQLite" >&2
        exit 1
    fi
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/outbox-test.XXXXXX")
cleanup() {
    local status=$?
    services_stop "$work"
    rm -rf "$work"
    exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

step "services"
services_start_all "$work"
export OUTBOX_TEST_DATABASE_URL OUTBOX_TEST_NATS_URL
export OUTBOX_TEST_KAFKA_BROKERS
export OUTBOX_TEST_REDIS_URL OUTBOX_TEST_AMQP_URL OUTBOX_TEST_MYSQL_URL

# On failure, show what the servers said: a crash there explains many test failures at once.
show_service_logs() {
    services_log_tail "$work/postgres/postgres.log" 30
    services_log_tail "$work/nats/nats-server.log" 30
    services_log_tail "$work/kafka/tansu.log" 30
    services_log_tail "$work/redis/redis-server.log" 30
    services_log_tail "$work/rabbitmq/rabbitmq-server.log" 30
    services_log_tail "$work/mariadb/mariadb.log" 30
}

# `-p NAME` arguments narrow the run (nextest and doc tests) instead of --workspace.
scope=()
prev=
for arg in "$@"; do
    case "$prev" in -p | --package) scope+=(-p "$arg") ;; esac
    case "$arg" in -p?*) scope+=(-p "${arg#-p}") ;; --package=*) scope+=(-p "${arg#--package=}") ;; esac
    prev=$arg
done
[ ${#scope[@]} -eq 0 ] && scope=(--workspace)

# `outbox crash-test`'s own test (crates/outbox-cli/tests/crash_test.rs) needs a relay that
# breaks per-aggregate order on purpose: the `fault-injection` feature, never in a default
# build. It is built here and copied aside as outbox-fault-injection; then the default binary
# is linked again over target/debug/outbox (its artifacts stay cached under another hash, so
# that is a relink). Cost: outbox-runtime and the outbox binary compiled once more with the
# feature, 1-2 min on 2 cores after a change to them (measured: 46-76 s), 10-15 s when nothing
# changed; the test itself runs about 25 s (8 s runs).
case " ${scope[*]} " in
*" --workspace "* | *" outbox-cli "*)
    step "outbox with --features fault-injection, for crash-test's own test"
    target_dir=${CARGO_TARGET_DIR:-target}
    cargo build -p outbox-cli --features fault-injection
    cp "$target_dir/debug/outbox" "$target_dir/debug/outbox-fault-injection"
    cargo build -p outbox-cli
    OUTBOX_FAULT_BIN="$(cd "$target_dir/debug" && pwd)/outbox-fault-injection"
    export OUTBOX_FAULT_BIN
    ;;
esac

threads=${OUTBOX_TEST_THREADS:-4}
status=0
if [ "$have_nextest" = 1 ]; then
    args=(--no-fail-fast)
    [ "${scope[0]}" = --workspace ] && args+=(--workspace)
    case " $* " in
    *" -j"* | *" --test-threads"*) ;;
    *) args+=(--test-threads "$threads") ;;
    esac
    # A hung test must not hang CI: unless the project has its own nextest config, give each
    # test 60 s before it is reported slow and kill it after 5 minutes.
    if [ ! -f .config/nextest.toml ]; then
        cat >"$work/nextest.toml" <<'TOML'
[profile.default]
slow-timeout = { period = "60s", terminate-after = 5 }
TOML
        args+=(--config-file "$work/nextest.toml")
    fi
    step "cargo nextest run ${args[*]} $*"
    cargo nextest run "${args[@]}" "$@" || status=$?

    # Doc tests exist only for library targets: `-p outbox-cli` (a binary) has none.
    doc_scope=()
    for ((i = 0; i < ${#scope[@]}; i++)); do
        case "${scope[$i]}" in
        -p)
            i=$((i + 1))
            name=${scope[$i]}
            if [ -f "crates/$name/src/lib.rs" ]; then doc_scope+=(-p "$name"); fi
            ;;
        *) doc_scope+=("${scope[$i]}") ;;
        esac
    done
    if [ "$status" = 0 ] && [ ${#doc_scope[@]} -gt 0 ]; then
        step "cargo test --doc ${doc_scope[*]}"
        cargo test --doc "${doc_scope[@]}" || status=$?
    fi
else
    args=()
    [ "${scope[0]}" = --workspace ] && args+=(--workspace)
    step "cargo test ${args[*]} $*"
    cargo test "${args[@]}" "$@" -- --test-threads "$threads" || status=$?
fi

if [ "$status" != 0 ]; then
    show_service_logs
    step "FAILED after $(($(date +%s) - started)) s"
    exit "$status"
fi
step "all checks passed in $(($(date +%s) - started)) s"
