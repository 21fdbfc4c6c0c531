#!/usr/bin/env bash
# What `outbox capture` costs the business write (docs/capture.md, "What it costs"):
#
#   scripts/bench/capture_overhead.sh [--seconds 15] [--clients 4] [--repeat 3] [--async-commit]
#
# Starts its own PostgreSQL on a free port of 127.0.0.1 with the server's default durability
# (fsync on, synchronous_commit on: a commit waits for its WAL flush; with --async-commit,
# synchronous_commit = off, which leaves the CPU and WAL volume of the rows, not the flush,
# as the cost), runs `outbox migrate`,
# creates two identical `bookings` tables and installs a capture (payload = "row") on one of
# them with `outbox capture install`, then alternates three pgbench scripts, `--repeat` times
# each, one booking per transaction:
#   plain:     BEGIN; INSERT the booking; COMMIT                        (no event)
#   captured:  the same INSERT into the captured table                  (the trigger writes the event)
#   by hand:   the same INSERT, then the application's own INSERT of the event into the
#              outbox, with a JSON payload of the same size             (what capture replaces)
# and prints transactions/s of each. Needs pgbench and an `outbox` binary (target/release/outbox,
# or OUTBOX_BIN; only migrate and capture install run it). Everything lives in a temporary
# directory that is removed at exit.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
# shellcheck source=scripts/services.sh
source scripts/services.sh

seconds=15
clients=4
repeat=3
sync=on
while [ $# -gt 0 ]; do
    case "$1" in
    --seconds) seconds=$2; shift 2 ;;
    --clients) clients=$2; shift 2 ;;
    --repeat) repeat=$2; shift 2 ;;
    --async-commit) sync=off; shift ;;
    -h | --help) sed -n '2,19p' "$0"; exit 0 ;;
    *) echo "unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
done
case "$seconds$clients$repeat" in *[!0-9]*) echo "options take whole numbers" >&2; exit 2 ;; esac
bin=${OUTBOX_BIN:-target/release/outbox}
[ -x "$bin" ] || { echo "no binary at $bin: cargo build --release -p outbox-cli (or set OUTBOX_BIN)" >&2; exit 1; }
bin=$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")
command -v pgbench >/dev/null || { echo "pgbench not found (Debian: postgresql-client)" >&2; exit 1; }

work=$(mktemp -d "${TMPDIR:-/tmp}/outbox-capture.XXXXXX")
chmod 755 "$work"
bindir=$(services_pg_bindir)
cleanup() {
    _services_as_postgres "$bindir/pg_ctl" -D "$work/data" -m immediate stop >/dev/null 2>&1 || true
    rm -rf "$work"
}
trap cleanup EXIT
[ "$(id -u)" = 0 ] && chown postgres: "$work"
_services_as_postgres "$bindir/initdb" -D "$work/data" -U postgres -A trust -E UTF8 --locale=C >/dev/null
port=$(services_free_port)
_services_as_postgres "$bindir/pg_ctl" -D "$work/data" -l "$work/postgres.log" -w -s \
    -o "-p $port -k $work -c listen_addresses=127.0.0.1 -c shared_buffers=256MB -c synchronous_commit=$sync" start
url="postgres://postgres@127.0.0.1:$port/postgres"
psql -qX "$url" -c "SHOW fsync" -tA | grep -qx on || { echo "fsync is off" >&2; exit 1; }

psql -qX "$url" <<'SQL'
CREATE TABLE bookings (
    id          uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
    customer_id text        NOT NULL,
    seats       integer     NOT NULL,
    note        text,
    booked_at   timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE bookings_captured (LIKE bookings INCLUDING ALL);
SQL
cat >"$work/outbox.toml" <<TOML
[source]
kind = "postgres"
url = "$url"

[[capture]]
table = "bookings_captured"
aggregate_type = "Customer"
aggregate_id = "customer_id"
event_type = "booking.created"
TOML
"$bin" migrate --config "$work/outbox.toml" >/dev/null
"$bin" capture install --config "$work/outbox.toml" >&2

cat >"$work/plain.sql" <<'SQL'
\set c random(1, 10000)
BEGIN;
INSERT INTO bookings (customer_id, seats, note) VALUES ('c' || :c, 2, 'window seat');
COMMIT;
SQL
cat >"$work/captured.sql" <<'SQL'
\set c random(1, 10000)
BEGIN;
INSERT INTO bookings_captured (customer_id, seats, note) VALUES ('c' || :c, 2, 'window seat');
COMMIT;
SQL
# The payload the trigger makes for one of these rows is ~150 bytes of JSON; this one is the
# same size, built by the "application".
cat >"$work/by_hand.sql" <<'SQL'
\set c random(1, 10000)
BEGIN;
INSERT INTO bookings (customer_id, seats, note) VALUES ('c' || :c, 2, 'window seat');
INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
VALUES ('Customer', 'c' || :c, 'booking.created',
        convert_to('{"id": "' || gen_random_uuid() || '", "note": "window seat", "seats": 2, "booked_at": "' || now() || '", "customer_id": "c' || :c || '"}', 'UTF8'));
COMMIT;
SQL

tps() { pgbench -n -M prepared -c "$clients" -j 2 -T "$seconds" -f "$1" "$url" 2>/dev/null | awk '/^tps/ {print $3; exit}'; }
declare -a plain=() captured=() by_hand=()
for i in $(seq 1 "$repeat"); do
    plain+=("$(tps "$work/plain.sql")")
    captured+=("$(tps "$work/captured.sql")")
    by_hand+=("$(tps "$work/by_hand.sql")")
    echo "round $i: plain ${plain[-1]} tps, captured ${captured[-1]}, event by hand ${by_hand[-1]}" >&2
done
events=$(psql -qXtA "$url" -c "SELECT count(*) FROM outbox WHERE headers ? 'capture_op'")
rows=$(psql -qXtA "$url" -c "SELECT count(*) FROM bookings_captured")
[ "$events" = "$rows" ] || { echo "captured rows $rows, events $events" >&2; exit 1; }
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
p=$(median "${plain[@]}")
c=$(median "${captured[@]}")
h=$(median "${by_hand[@]}")
# The machine may get busier or quieter between rounds: the three runs of one round are
# compared with each other, and the median of those per-round ratios is the overhead.
declare -a rc=() rh=()
for i in "${!plain[@]}"; do
    rc+=("$(awk -v a="${captured[$i]}" -v b="${plain[$i]}" 'BEGIN {print a / b}')")
    rh+=("$(awk -v a="${by_hand[$i]}" -v b="${plain[$i]}" 'BEGIN {print a / b}')")
done
mc=$(median "${rc[@]}")
mh=$(median "${rh[@]}")
awk -v sc="$sync" -v p="$p" -v c="$c" -v h="$h" -v mc="$mc" -v mh="$mh" -v n="$clients" -v s="$seconds" -v r="$repeat" 'BEGIN {
    printf "| transaction (one booking), synchronous_commit = %s | tps (median of %d x %d s, %d clients) | vs plain (median of the per-round ratios) |\n| --- | ---: | ---: |\n", sc, r, s, n
    printf "| INSERT the booking | %.0f | |\n", p
    printf "| INSERT the booking, captured (the trigger writes the event) | %.0f | %+.1f %% |\n", c, 100 * (mc - 1)
    printf "| INSERT the booking + INSERT the event by hand | %.0f | %+.1f %% |\n", h, 100 * (mh - 1)
    printf "\ncapture vs no event: %.3f ms more per transaction at %d clients (from the medians)\n", 1000 * n * (1 / c - 1 / p), n
}'
