#!/usr/bin/env bash
# Backfill speed (`outbox backfill`, docs/subscriptions.md "Backfill"): retained events copied
# into a new subscription's table per second.
#
#   scripts/bench/backfill.sh [--kind postgres|sqlite|mariadb] [--events N] [--aggregates A] [--rounds R]
#
# --kind postgres (default): PostgreSQL on a free port of 127.0.0.1 (scripts/services.sh,
# fsync=off as the tests run it); sqlite: a file in the temporary directory (needs sqlite3);
# mariadb: its own mariadbd (scripts/services.sh). For each round: a fresh database, `outbox migrate` with a plain file sink, N events
# (default 100,000 on 1,000 aggregates, half `order.paid`) written with one INSERT ... SELECT
# and marked delivered (retained, fanned out before the subscription existed), then
# `outbox migrate` with a file that adds subscription `paid` (`event_type = "*.paid"`, sink
# /dev/null), then `outbox backfill --subscription paid --all` (release build:
# target/release/outbox, or OUTBOX_BIN), timed from start to exit, no relay running. Reports
# the median of the rounds: events read per second (all retained events, filter included) and
# events copied per second. Results: a Markdown table on stdout and
# scripts/bench/results/backfill-<date>.json.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
# shellcheck source=scripts/services.sh
source scripts/services.sh

events=100000
aggregates=1000
rounds=3
kind=postgres
while [ $# -gt 0 ]; do
    case "$1" in
    --kind) kind=$2; shift 2 ;;
    --events) events=$2; shift 2 ;;
    --aggregates) aggregates=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    -h | --help) sed -n '2,18p' "$0"; exit 0 ;;
    *) echo "unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
done
case "$events$aggregates$rounds" in *[!0-9]*) echo "options take whole numbers" >&2; exit 2 ;; esac
case "$kind" in postgres | sqlite | mariadb) ;; *) echo "--kind: postgres, sqlite or mariadb" >&2; exit 2 ;; esac

bin=${OUTBOX_BIN:-target/release/outbox}
[ -x "$bin" ] || { echo "no binary at $bin: cargo build --release -p outbox-cli" >&2; exit 1; }
work=$(mktemp -d "${TMPDIR:-/tmp}/outbox-backfill.XXXXXX")
cleanup() {
    services_stop "$work"
    rm -rf "$work"
}
trap cleanup EXIT
services_install
case "$kind" in
postgres) services_start_postgres "$work"; pg=$OUTBOX_TEST_DATABASE_URL ;;
mariadb) services_start_mariadb "$work"; my="mariadb --no-defaults -uroot --socket=$work/mariadb/mariadb.sock" ;;
esac

median() { sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }

# configs SOURCE: before.toml (a plain sink) and after.toml (adds subscription `paid`).
configs() {
    printf '[source]\n%s\n[sink]\nkind = "file"\npath = "/dev/null"\n' "$1" >"$work/before.toml"
    printf '[source]\n%s\n[sinks.null]\nkind = "file"\npath = "/dev/null"\n[[subscription]]\nname = "paid"\nsink = "null"\nevent_type = "*.paid"\n' \
        "$1" >"$work/after.toml"
}

# Per round: a fresh outbox of N retained (delivered) events; sets `count_paid` to the
# command that prints how many rows subscription `paid` holds.
prepare() {
    local round=$1
    case "$kind" in
    postgres)
        db="backfill_${round}_$$"
        psql -q "$pg" -c "CREATE DATABASE $db" >/dev/null
        url="${pg%/*}/$db"
        configs "kind = \"postgres\"
url = \"$url\""
        "$bin" migrate --config "$work/before.toml" >/dev/null 2>"$work/migrate.log"
        psql -q "$url" -c "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
            SELECT 'Order', 'o_' || (g % $aggregates),
                   CASE WHEN g % 2 = 1 THEN 'order.paid' ELSE 'order.placed' END,
                   convert_to('{\"order_id\":\"o_' || (g % $aggregates) || '\",\"n\":' || g || '}', 'UTF8')
            FROM generate_series(1, $events) AS g" >/dev/null
        psql -q "$url" -c "UPDATE outbox SET state = 'delivered', delivered_at = now(), next_attempt_at = '-infinity'" >/dev/null
        psql -q "$url" -c "VACUUM ANALYZE" >/dev/null
        count_paid=(psql -qtA "$url" -c "SELECT count(*) FROM outbox_sub_paid")
        ;;
    sqlite)
        file="$work/backfill_$round.db"
        configs "kind = \"sqlite\"
path = \"$file\""
        "$bin" migrate --config "$work/before.toml" >/dev/null 2>"$work/migrate.log"
        sqlite3 "$file" "WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < $events)
            INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload, state, delivered_at)
            SELECT lower(hex(randomblob(4)) || '-' || hex(randomblob(2)) || '-7' || substr(hex(randomblob(2)), 2)
                         || '-8' || substr(hex(randomblob(2)), 2) || '-' || hex(randomblob(6))),
                   'Order', 'o_' || (n % $aggregates),
                   CASE WHEN n % 2 = 1 THEN 'order.paid' ELSE 'order.placed' END,
                   CAST('{\"order_id\":\"o_' || (n % $aggregates) || '\",\"n\":' || n || '}' AS BLOB),
                   'delivered', 1
            FROM g"
        count_paid=(sqlite3 "$file" "SELECT count(*) FROM outbox_sub_paid")
        ;;
    mariadb)
        db="backfill_${round}_$$"
        $my -e "CREATE DATABASE $db"
        configs "kind = \"mysql\"
url = \"$OUTBOX_TEST_MYSQL_URL/$db\""
        "$bin" migrate --config "$work/before.toml" >/dev/null 2>"$work/migrate.log"
        $my "$db" -e "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
            SELECT 'Order', CONCAT('o_', seq % $aggregates),
                   IF(seq % 2 = 1, 'order.paid', 'order.placed'),
                   CONCAT('{\"order_id\":\"o_', seq % $aggregates, '\",\"n\":', seq, '}')
            FROM seq_1_to_$events;
            UPDATE outbox SET state = 'delivered', delivered_at = NOW(6)"
        count_paid=($my -N -B "$db" -e "SELECT count(*) FROM outbox_sub_paid")
        ;;
    esac
    "$bin" migrate --config "$work/after.toml" >/dev/null 2>>"$work/migrate.log"
}

secs_all=()
copied=0
for round in $(seq 1 "$rounds"); do
    prepare "$round"
    start=$(date +%s.%N)
    OUTBOX_LOG=warn "$bin" backfill --subscription paid --all --config "$work/after.toml" \
        >"$work/backfill.out" 2>"$work/backfill.log" || {
        echo "backfill failed:" >&2; cat "$work/backfill.out" "$work/backfill.log" >&2; exit 1; }
    end=$(date +%s.%N)
    copied=$("${count_paid[@]}")
    secs_all+=("$(awk -v s="$start" -v e="$end" 'BEGIN { printf "%.3f", e - s }')")
    tail -n 1 "$work/backfill.out" >&2
    if [ "$kind" = postgres ]; then psql -q "$pg" -c "DROP DATABASE $db" >/dev/null; fi
done
secs=$(printf '%s\n' "${secs_all[@]}" | median)
read -r read_rate copy_rate < <(awk -v d="$secs" -v n="$events" -v c="$copied" \
    'BEGIN { printf "%.0f %.0f\n", n / d, c / d }')
printf '| database | retained events | aggregates | copied | median s | events read/s | events copied/s |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: |\n'
printf '| %s | %s | %s | %s | %s | %s | %s |\n' "$kind" "$events" "$aggregates" "$copied" "$secs" "$read_rate" "$copy_rate"
mkdir -p scripts/bench/results
out="scripts/bench/results/backfill-$kind-$(date +%Y-%m-%d-%H%M).json"
printf '{"kind":"%s","machine":"%s, %s cores","events":%s,"aggregates":%s,"copied":%s,"rounds":%s,"median_seconds":%s,"events_read_per_second":%s,"events_copied_per_second":%s}\n' \
    "$kind" "$(uname -r)" "$(nproc)" "$events" "$aggregates" "$copied" "$rounds" "$secs" "$read_rate" "$copy_rate" >"$out"
echo "results: $out" >&2
