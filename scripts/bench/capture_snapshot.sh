#!/usr/bin/env bash
# What `outbox capture snapshot` does and costs (docs/capture.md, "Snapshot"; figures in
# docs/benchmarks.md, "Capture snapshot (issue 39)"):
#
#   scripts/bench/capture_snapshot.sh [--rows 1000000] [--seconds 15] [--clients 4] [--rate 1000]
#   scripts/bench/capture_snapshot.sh --kind sqlite|mariadb [--rows 1000000]
#
# Starts its own PostgreSQL on a free port of 127.0.0.1 (default durability), runs `outbox
# migrate`, fills `items` (id bigint primary key, v, note) with --rows rows by generate_series
# and installs a capture on it (on insert and update, payload = "row"), then:
#   1. the application alone: pgbench, --clients clients, one `UPDATE items SET v = v + 1` of a
#      random row per transaction, for --seconds: transactions/s without a snapshot;
#   2. the same pgbench while `outbox capture snapshot --rate R` runs: transactions/s with it,
#      and the snapshot's rows/s (it is stopped when pgbench ends);
#   3. the whole table snapshotted unthrottled (--rate 1000000: chunks of 2,000 rows), no
#      other load: rows/s.
# --kind sqlite (a file in the temporary directory, WAL) or --kind mariadb (its own mariadbd
# on a free port, default durability: innodb_flush_log_at_trx_commit = 1): the same table and
# capture, and step 3 only (no pgbench there): the unthrottled snapshot's rows/s.
# Needs pgbench (PostgreSQL), sqlite3 or mariadbd, and an `outbox` binary
# (target/release/outbox, or OUTBOX_BIN). Everything lives in a temporary directory that is
# removed at exit.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
# shellcheck source=scripts/services.sh
source scripts/services.sh

rows=1000000
seconds=15
clients=4
rate=1000
kind=postgres
while [ $# -gt 0 ]; do
    case "$1" in
    --rows) rows=$2; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    --clients) clients=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    --kind) kind=$2; shift 2 ;;
    -h | --help) sed -n '2,24p' "$0"; exit 0 ;;
    *) echo "unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
done
case "$rows$seconds$clients$rate" in *[!0-9]*) echo "options take whole numbers" >&2; exit 2 ;; esac
bin=${OUTBOX_BIN:-target/release/outbox}
[ -x "$bin" ] || { echo "no binary at $bin: cargo build --release -p outbox-cli (or set OUTBOX_BIN)" >&2; exit 1; }
bin=$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")

capture='[[capture]]
table = "items"
aggregate_type = "Item"
aggregate_id = "id"
event_type = "item.changed"
on = ["insert", "update"]'

# Step 3 on SQLite or MariaDB: `$1` runs SQL read from stdin; the source section is in
# $work/outbox.toml already.
unthrottled() {
    local sql=$1 events
    "$bin" migrate --config "$work/outbox.toml" >/dev/null
    printf '%s\n' "$fill" | $sql
    "$bin" capture install --config "$work/outbox.toml" >&2
    local start end
    start=$(date +%s.%N)
    "$bin" capture snapshot --config "$work/outbox.toml" --rate 1000000 >"$work/full.out" 2>&1
    end=$(date +%s.%N)
    grep 'snapshot finished' "$work/full.out" >&2
    events=$(echo "SELECT COUNT(*) FROM outbox WHERE $snapshot_op = 'snapshot';" | $sql)
    [ "$events" = "$rows" ] || { echo "snapshot events $events, rows $rows" >&2; exit 1; }
    awk -v n="$rows" -v s="$start" -v e="$end" -v k="$kind" 'BEGIN {
        printf "| %s: %d rows | snapshot rows/s unthrottled (--rate 1000000, chunks of 2,000), no other load |\n| --- | ---: |\n| whole command | %.0f |\n", k, n, n / (e - s)
    }'
}

case "$kind" in
postgres) ;;
sqlite)
    command -v sqlite3 >/dev/null || { echo "sqlite3 not found" >&2; exit 1; }
    work=$(mktemp -d "${TMPDIR:-/tmp}/outbox-snapshot.XXXXXX")
    trap 'rm -rf "$work"' EXIT
    printf '[source]\nkind = "sqlite"\npath = "%s/outbox.db"\n\n%s\n' "$work" "$capture" >"$work/outbox.toml"
    fill="CREATE TABLE items (id INTEGER PRIMARY KEY, v INTEGER NOT NULL DEFAULT 0, note TEXT);
WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < $rows)
INSERT INTO items (id, note) SELECT n, 'row ' || n FROM g;"
    snapshot_op="json_extract(headers, '\$.capture_op')"
    unthrottled "sqlite3 -batch $work/outbox.db"
    exit 0
    ;;
mariadb)
    command -v mariadb-install-db >/dev/null || { echo "mariadb-install-db not found (mariadb-server)" >&2; exit 1; }
    work=$(mktemp -d "${TMPDIR:-/tmp}/outbox-snapshot.XXXXXX")
    mkdir "$work/data" "$work/tmp"
    user=$(id -un)
    mariadb-install-db --no-defaults --user="$user" --datadir="$work/data" --tmpdir="$work/tmp" \
        --auth-root-authentication-method=normal --skip-test-db >/dev/null
    port=$(services_free_port)
    mariadbd=$(command -v mariadbd || echo /usr/sbin/mariadbd)
    "$mariadbd" --no-defaults --user="$user" --bind-address=127.0.0.1 --port="$port" \
        --skip-name-resolve --datadir="$work/data" --socket="$work/mariadb.sock" \
        --pid-file="$work/mariadb.pid" --tmpdir="$work/tmp" >"$work/mariadb.log" 2>&1 &
    server=$!
    trap 'kill "$server" 2>/dev/null; wait "$server" 2>/dev/null; rm -rf "$work"' EXIT
    for _ in $(seq 1 100); do
        mariadb --no-defaults -uroot --socket="$work/mariadb.sock" -e 'SELECT 1' >/dev/null 2>&1 && break
        sleep 0.2
    done
    mariadb --no-defaults -uroot --socket="$work/mariadb.sock" -e 'CREATE DATABASE bench'
    printf '[source]\nkind = "mysql"\nurl = "mysql://root@127.0.0.1:%s/bench"\n\n%s\n' "$port" "$capture" >"$work/outbox.toml"
    fill="SET SESSION max_recursive_iterations = $rows;
CREATE TABLE items (id BIGINT PRIMARY KEY, v BIGINT NOT NULL DEFAULT 0, note TEXT);
INSERT INTO items (id, note) WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < $rows)
SELECT n, CONCAT('row ', n) FROM g;"
    snapshot_op="JSON_VALUE(headers, '\$.capture_op')"
    unthrottled "mariadb --no-defaults -uroot --socket=$work/mariadb.sock -N -B bench"
    exit 0
    ;;
*) echo "--kind: postgres, sqlite or mariadb" >&2; exit 2 ;;
esac

command -v pgbench >/dev/null || { echo "pgbench not found (Debian: postgresql-client)" >&2; exit 1; }

work=$(mktemp -d "${TMPDIR:-/tmp}/outbox-snapshot.XXXXXX")
chmod 755 "$work"
bindir=$(services_pg_bindir)
snap=
cleanup() {
    [ -n "$snap" ] && kill "$snap" 2>/dev/null || true
    _services_as_postgres "$bindir/pg_ctl" -D "$work/data" -m immediate stop >/dev/null 2>&1 || true
    rm -rf "$work"
}
trap cleanup EXIT
[ "$(id -u)" = 0 ] && chown postgres: "$work"
_services_as_postgres "$bindir/initdb" -D "$work/data" -U postgres -A trust -E UTF8 --locale=C >/dev/null
port=$(services_free_port)
_services_as_postgres "$bindir/pg_ctl" -D "$work/data" -l "$work/postgres.log" -w -s \
    -o "-p $port -k $work -c listen_addresses=127.0.0.1 -c shared_buffers=256MB" start
url="postgres://postgres@127.0.0.1:$port/postgres"

printf '[source]\nkind = "postgres"\nurl = "%s"\n\n%s\n' "$url" "$capture" >"$work/outbox.toml"
"$bin" migrate --config "$work/outbox.toml" >/dev/null
psql -qX "$url" -c "CREATE TABLE items (id bigint PRIMARY KEY, v bigint NOT NULL DEFAULT 0, note text)" \
    -c "INSERT INTO items (id, note) SELECT g, 'row ' || g FROM generate_series(1, $rows) AS g" \
    -c "VACUUM ANALYZE items"
"$bin" capture install --config "$work/outbox.toml" >&2
cat >"$work/update.sql" <<SQL
\set id random(1, $rows)
UPDATE items SET v = v + 1 WHERE id = :id;
SQL
tps() { pgbench -n -M prepared -c "$clients" -j 2 -T "$seconds" -f "$work/update.sql" "$url" 2>/dev/null | awk '/^tps/ {print $3; exit}'; }
# Rows snapshotted so far (0 before the first snapshot created its progress table).
snapshotted() { psql -qXtA "$url" -c "SELECT COALESCE((SELECT rows FROM outbox_capture_snapshots WHERE name = 'items'), 0)" 2>/dev/null || echo 0; }

alone=$(tps)
echo "1. the application alone: $alone tps" >&2

"$bin" capture snapshot --config "$work/outbox.toml" --rate "$rate" >"$work/throttled.out" 2>&1 &
snap=$!
before=$(snapshotted)
start=$(date +%s.%N)
with=$(tps)
after=$(snapshotted)
end=$(date +%s.%N)
kill "$snap" 2>/dev/null || true
wait "$snap" 2>/dev/null || true
cat "$work/throttled.out" >&2
snap=
throttled=$(awk -v a="$before" -v b="$after" -v s="$start" -v e="$end" 'BEGIN {printf "%.0f", (b - a) / (e - s)}')
echo "2. with the snapshot at --rate $rate: $with tps; the snapshot did $throttled rows/s" >&2

# A new snapshot (the throttled one was killed: this run resumes it; remove its progress so the
# measurement covers the whole table).
psql -qX "$url" -c "DELETE FROM outbox_capture_snapshots" -c "TRUNCATE outbox"
start=$(date +%s.%N)
"$bin" capture snapshot --config "$work/outbox.toml" --rate 1000000 >"$work/full.out" 2>&1
end=$(date +%s.%N)
grep 'snapshot finished' "$work/full.out" >&2
events=$(psql -qXtA "$url" -c "SELECT count(*) FROM outbox WHERE headers->>'capture_op' = 'snapshot'")
[ "$events" = "$rows" ] || { echo "snapshot events $events, rows $rows" >&2; exit 1; }
full=$(awk -v n="$rows" -v s="$start" -v e="$end" 'BEGIN {printf "%.0f", n / (e - s)}')
echo "3. unthrottled snapshot of $rows rows, nothing else running: $full rows/s (whole command)" >&2

awk -v a="$alone" -v w="$with" -v r="$rate" -v t="$throttled" -v f="$full" -v n="$rows" -v c="$clients" -v s="$seconds" 'BEGIN {
    printf "| %d rows; pgbench: %d clients, one UPDATE of a random row per transaction, %d s | value |\n| --- | ---: |\n", n, c, s
    printf "| application tps, no snapshot | %.0f |\n", a
    printf "| application tps, snapshot running at --rate %d | %.0f (%+.1f %%) |\n", r, w, 100 * (w / a - 1)
    printf "| snapshot rows/s during that (--rate %d) | %d |\n", r, t
    printf "| snapshot rows/s unthrottled (--rate 1000000, chunks of 2,000), no other load | %d |\n", f
}'
