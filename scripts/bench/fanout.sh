#!/usr/bin/env bash
# Cost of fan-out (`[[subscription]]`, docs/subscriptions.md): drain rate of one backlog with
# 0 (a plain `[sink]`), 1, 2 and 4 subscriptions.
#
#   scripts/bench/fanout.sh [--events N] [--batch B] [--subscriptions "0 1 2 4"] [--rounds R]
#
# Starts PostgreSQL on a free port of 127.0.0.1 (scripts/services.sh, fsync=off as the tests
# run it). For each subscription count and round: a fresh database, `outbox migrate`, N events
# (default 50,000; 1,000 aggregates) written with one INSERT ... SELECT, then one
# `outbox relay` (release build: target/release/outbox, or OUTBOX_BIN), timed from its start
# until no row is pending in the outbox nor in any subscription table, then SIGTERM. Every
# sink is the JSON-lines file sink on /dev/null, so the figure is the database + relay cost of
# fanning out: each subscription adds one copy of every event (one INSERT per batch) and one
# more claim/settle pipeline. Reports the median of the rounds: events/s (events of the
# outbox, whatever the number of copies), deliveries/s (all subscriptions together) and the
# relay's CPU per event. Results: a Markdown table on stdout and
# scripts/bench/results/fanout-<date>.json.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
# shellcheck source=scripts/services.sh
source scripts/services.sh

events=50000
batch=500
counts="0 1 2 4"
rounds=3
while [ $# -gt 0 ]; do
    case "$1" in
    --events) events=$2; shift 2 ;;
    --batch) batch=$2; shift 2 ;;
    --subscriptions) counts=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    -h | --help) sed -n '2,18p' "$0"; exit 0 ;;
    *) echo "unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
done
case "$events$batch$rounds${counts// /}" in *[!0-9]*) echo "options take whole numbers" >&2; exit 2 ;; esac

bin=${OUTBOX_BIN:-target/release/outbox}
[ -x "$bin" ] || { echo "no relay binary at $bin: cargo build --release -p outbox-cli" >&2; exit 1; }
work=$(mktemp -d "${TMPDIR:-/tmp}/outbox-fanout.XXXXXX")
relay_pid=
cleanup() {
    [ -n "$relay_pid" ] && kill -TERM "$relay_pid" 2>/dev/null || true
    services_stop "$work"
    rm -rf "$work"
}
trap cleanup EXIT
services_install
services_start_postgres "$work"
pg=$OUTBOX_TEST_DATABASE_URL
ticks=$(getconf CLK_TCK)

config_toml() {
    local url=$1 subs=$2
    printf '[source]\nkind = "postgres"\nurl = "%s"\non_delivered = "mark"\n' "$url"
    printf '[relay]\nbatch_size = %s\n' "$batch"
    if [ "$subs" = 0 ]; then
        printf '[sink]\nkind = "file"\npath = "/dev/null"\n'
        return
    fi
    printf '[sinks.null]\nkind = "file"\npath = "/dev/null"\n'
    for i in $(seq 1 "$subs"); do
        printf '[[subscription]]\nname = "s%s"\nsink = "null"\n' "$i"
    done
}

pending_sql() {
    local subs=$1 sql="SELECT (SELECT count(*) FROM outbox WHERE state = 'pending')"
    for i in $(seq 1 "$subs"); do
        sql="$sql + (SELECT count(*) FROM outbox_sub_s$i WHERE state = 'pending')"
    done
    echo "$sql"
}

median() { sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }

results=()
printf '| subscriptions | events | median s | events/s | deliveries/s | relay CPU µs/event |\n| ---: | ---: | ---: | ---: | ---: | ---: |\n'
for subs in $counts; do
    secs_all=()
    cpu_all=()
    for round in $(seq 1 "$rounds"); do
        db="fanout_${subs}_${round}_$$"
        psql -q "$pg" -c "CREATE DATABASE $db" >/dev/null
        url="${pg%/*}/$db"
        config="$work/fanout-$subs.toml"
        config_toml "$url" "$subs" >"$config"
        "$bin" migrate --config "$config" >/dev/null 2>"$work/migrate.log"
        psql -q "$url" -c "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
            SELECT 'Order', 'o_' || (g % 1000), 'order.placed',
                   convert_to('{\"order_id\":\"o_' || (g % 1000) || '\",\"n\":' || g || '}', 'UTF8')
            FROM generate_series(1, $events) AS g" >/dev/null
        psql -q "$url" -c "VACUUM ANALYZE" >/dev/null
        sql=$(pending_sql "$subs")
        start=$(date +%s.%N)
        OUTBOX_LOG=warn "$bin" relay --config "$config" 2>"$work/relay.log" &
        relay_pid=$!
        # The subscription tables fill while the outbox drains: wait for the outbox to be
        # empty and then for every subscription table.
        while :; do
            pending=$(psql -qtA "$url" -c "$sql")
            if [ "$pending" = 0 ] && [ "$(psql -qtA "$url" -c "SELECT count(*) FROM outbox WHERE state = 'delivered'")" = "$events" ]; then
                break
            fi
            if ! kill -0 "$relay_pid" 2>/dev/null; then
                echo "relay died:" >&2
                tail -n 20 "$work/relay.log" >&2
                exit 1
            fi
            sleep 0.02
        done
        end=$(date +%s.%N)
        read -r utime stime < <(awk '{print $14, $15}' "/proc/$relay_pid/stat")
        kill -TERM "$relay_pid"
        wait "$relay_pid" || { echo "relay exited non-zero" >&2; tail -n 20 "$work/relay.log" >&2; }
        relay_pid=
        secs_all+=("$(awk -v s="$start" -v e="$end" 'BEGIN { printf "%.3f", e - s }')")
        cpu_all+=("$(awk -v u="$utime" -v k="$stime" -v t="$ticks" 'BEGIN { printf "%.3f", (u + k) / t }')")
        psql -q "$pg" -c "DROP DATABASE $db" >/dev/null
    done
    secs=$(printf '%s\n' "${secs_all[@]}" | median)
    cpu=$(printf '%s\n' "${cpu_all[@]}" | median)
    copies=$((subs == 0 ? 1 : subs))
    read -r rate deliveries per_event < <(awk -v d="$secs" -v n="$events" -v c="$cpu" -v k="$copies" \
        'BEGIN { printf "%.0f %.0f %.1f\n", n / d, n * k / d, c * 1e6 / n }')
    printf '| %s | %s | %s | %s | %s | %s |\n' "$subs" "$events" "$secs" "$rate" "$deliveries" "$per_event"
    results+=("{\"subscriptions\":$subs,\"events\":$events,\"batch\":$batch,\"rounds\":$rounds,\"median_seconds\":$secs,\"events_per_second\":$rate,\"deliveries_per_second\":$deliveries,\"relay_cpu_seconds\":$cpu}")
done

mkdir -p scripts/bench/results
out="scripts/bench/results/fanout-$(date +%Y-%m-%d-%H%M).json"
{
    printf '{"machine":"%s, %s cores","results":[' "$(uname -r)" "$(nproc)"
    (IFS=,; printf '%s' "${results[*]}")
    printf ']}\n'
} >"$out"
echo "results: $out" >&2
