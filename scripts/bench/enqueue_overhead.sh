#!/usr/bin/env bash
# What writing the event costs a business transaction (issue 7's "enqueue adds <= 15 % to a
# one-row business transaction"):
#
#   scripts/bench/enqueue_overhead.sh [--seconds 20] [--clients 4] [--repeat 3]
#
# Starts its own PostgreSQL on a free port of 127.0.0.1 with the server's default durability
# (fsync on, synchronous_commit on: a commit waits for its WAL flush), runs `outbox migrate`,
# then alternates two pgbench scripts, `--repeat` times each:
#   business: BEGIN; UPDATE one account row; COMMIT
#   with event: BEGIN; the same UPDATE; INSERT the event into the outbox (the statement a
#               plain-SQL producer writes; the library's enqueue sends the same INSERT); COMMIT
#   with a plain insert: the same, into a table of the same columns with only a primary key,
#               no trigger: what any second row in the transaction costs, for attribution
# With --breakdown, two more steps between the plain row and the outbox row attribute the rest:
#   outbox columns: the outbox's exact columns, defaults and checks (UUIDv7 id, jsonb headers,
#               state check, seq from a sequence default), primary key only, no trigger
#   + indexes:  the same plus the outbox's three partial indexes (pending by seq, pending by
#               aggregate, held), still no trigger: what remains to the outbox row is the
#               ordering trigger (the aggregate's advisory lock, then nextval)
# and prints transactions/s of each and the overhead. Needs pgbench and the release binary
# (target/release/outbox or OUTBOX_BIN). Everything lives in a temporary directory.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
# shellcheck source=scripts/services.sh
source scripts/services.sh

seconds=20
clients=4
repeat=3
breakdown=0
while [ $# -gt 0 ]; do
    case "$1" in
    --seconds) seconds=$2; shift 2 ;;
    --clients) clients=$2; shift 2 ;;
    --repeat) repeat=$2; shift 2 ;;
    --breakdown) breakdown=1; shift ;;
    -h | --help) sed -n '2,21p' "$0"; exit 0 ;;
    *) echo "unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
done
case "$seconds$clients$repeat" in *[!0-9]*) echo "options take whole numbers" >&2; exit 2 ;; esac
bin=${OUTBOX_BIN:-target/release/outbox}
[ -x "$bin" ] || { echo "no binary at $bin: cargo build --release -p outbox-cli" >&2; exit 1; }
command -v pgbench >/dev/null || { echo "pgbench not found (Debian: postgresql-client)" >&2; exit 1; }

work=$(mktemp -d "${TMPDIR:-/tmp}/outbox-enqueue.XXXXXX")
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
    -o "-p $port -k $work -c listen_addresses=127.0.0.1 -c shared_buffers=256MB" start
url="postgres://postgres@127.0.0.1:$port/postgres"
psql -qX "$url" -c "SHOW fsync" -tA | grep -qx on || { echo "fsync is off" >&2; exit 1; }

printf '[source]\nkind = "postgres"\nurl = "%s"\n' "$url" >"$work/outbox.toml"
"$bin" migrate --config "$work/outbox.toml" >/dev/null 2>&1
psql -qX "$url" <<'SQL'
CREATE TABLE accounts (id int PRIMARY KEY, balance bigint NOT NULL);
INSERT INTO accounts SELECT g, 0 FROM generate_series(1, 100000) AS g;
VACUUM ANALYZE accounts;
CREATE TABLE plain_events (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), aggregate_type text,
    aggregate_id text, event_type text, payload bytea, created_at timestamptz DEFAULT now());
CREATE SEQUENCE step_seq AS bigint;
CREATE TABLE step_columns (LIKE outbox INCLUDING DEFAULTS INCLUDING CONSTRAINTS);
ALTER TABLE step_columns ALTER COLUMN seq SET DEFAULT nextval('step_seq'), ADD PRIMARY KEY (id);
CREATE TABLE step_indexes (LIKE outbox INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING INDEXES);
ALTER TABLE step_indexes ALTER COLUMN seq SET DEFAULT nextval('step_seq');
SQL
cat >"$work/business.sql" <<'SQL'
\set id random(1, 100000)
BEGIN;
UPDATE accounts SET balance = balance + 1 WHERE id = :id;
COMMIT;
SQL
cat >"$work/with_event.sql" <<'SQL'
\set id random(1, 100000)
BEGIN;
UPDATE accounts SET balance = balance + 1 WHERE id = :id;
INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
VALUES ('Account', :id, 'account.credited', convert_to('{"account_id":' || :id || ',"amount":1}', 'UTF8'));
COMMIT;
SQL

for step in step_columns step_indexes; do
    sed "s/INSERT INTO outbox /INSERT INTO $step /" "$work/with_event.sql" >"$work/$step.sql"
done

cat >"$work/with_plain.sql" <<'SQL'
\set id random(1, 100000)
BEGIN;
UPDATE accounts SET balance = balance + 1 WHERE id = :id;
INSERT INTO plain_events (aggregate_type, aggregate_id, event_type, payload)
VALUES ('Account', :id, 'account.credited', convert_to('{"account_id":' || :id || ',"amount":1}', 'UTF8'));
COMMIT;
SQL

tps() { pgbench -n -M prepared -c "$clients" -j 2 -T "$seconds" -f "$1" "$url" 2>/dev/null | awk '/^tps/ {print $3; exit}'; }
declare -a plain=() event=() second=() columns=() indexes=()
for i in $(seq 1 "$repeat"); do
    plain+=("$(tps "$work/business.sql")")
    event+=("$(tps "$work/with_event.sql")")
    second+=("$(tps "$work/with_plain.sql")")
    echo "round $i: business ${plain[-1]} tps, with event ${event[-1]}, with a plain insert ${second[-1]}" >&2
    if [ "$breakdown" = 1 ]; then
        columns+=("$(tps "$work/step_columns.sql")")
        indexes+=("$(tps "$work/step_indexes.sql")")
        echo "round $i: outbox columns ${columns[-1]} tps, + indexes ${indexes[-1]}" >&2
    fi
done
median() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
p=$(median "${plain[@]}")
e=$(median "${event[@]}")
q=$(median "${second[@]}")
awk -v p="$p" -v e="$e" -v q="$q" -v c="$clients" -v s="$seconds" -v r="$repeat" 'BEGIN {
    printf "| transaction | tps (median of %d x %d s, %d clients) |\n| --- | ---: |\n", r, s, c
    printf "| UPDATE one row | %.0f |\n| UPDATE one row + INSERT the event | %.0f |\n", p, e
    printf "| UPDATE one row + INSERT into a plain table (primary key only) | %.0f |\n", q
    printf "\na plain second row: %.1f %% fewer transactions/s\n", 100 * (1 - q / p)
    printf "\nenqueue overhead: %.1f %% fewer transactions/s (%.3f ms more per transaction at %d clients)\n",
        100 * (1 - e / p), 1000 * c * (1 / e - 1 / p), c
}'
if [ "$breakdown" = 1 ]; then
    awk -v p="$p" -v q="$q" -v c="$(median "${columns[@]}")" -v i="$(median "${indexes[@]}")" -v e="$e" 'BEGIN {
        printf "\n| step (UPDATE one row + INSERT into ...) | tps | vs business | added by the step |\n| --- | ---: | ---: | ---: |\n"
        printf "| a plain table (primary key only) | %.0f | %.1f %% | %.1f %% |\n", q, 100 * (1 - q / p), 100 * (1 - q / p)
        printf "| the outbox columns and defaults, no trigger, primary key only | %.0f | %.1f %% | %.1f %% |\n", c, 100 * (1 - c / p), 100 * (q - c) / p
        printf "| + the three partial indexes | %.0f | %.1f %% | %.1f %% |\n", i, 100 * (1 - i / p), 100 * (c - i) / p
        printf "| + the ordering trigger (= the outbox) | %.0f | %.1f %% | %.1f %% |\n", e, 100 * (1 - e / p), 100 * (i - e) / p
    }'
fi
