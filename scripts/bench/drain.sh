#!/usr/bin/env bash
# Drain benchmarks for `outbox relay` (issue 2), all measured in one run on this machine:
#
#   1. Drain of a prefilled backlog into NATS JetStream, events/s:
#        `outbox relay` (on_delivered = delete, then mark)  vs  the hand-written relay
#        (scripts/bench/handwritten_relay.py, the documented baseline).
#   2. Null-sink drain (`[sink] kind = "file"`, path = /dev/null, sync = false) vs pgbench
#      running the relay's own claim + delete/mark statements in one transaction, at the same
#      batch sizes: how close the relay gets to PostgreSQL's ceiling for its statements.
#      Plus pgbench of the hand-written relay's statements (LIMIT 100, UPDATE by id), and
#      1 relay worker against 1 pgbench client (the same work without two claimers colliding).
#   3. commit -> ack latency at a steady producer rate (relay's Prometheus histogram).
#
# Everything runs against a private PostgreSQL 15 and a private nats-server -js, on free
# ports in a temporary directory that is removed at exit. Every scenario starts from a freshly
# created database with a freshly prefilled backlog (scripts/bench/prefill.sql).
#
# Usage: scripts/bench/drain.sh [options]
#   --rows N            backlog of the JetStream drains (default 100000)
#   --ceiling-rows N    backlog of the null-sink / pgbench runs (default 200000)
#   --batches "A B"     batch sizes of the null-sink / pgbench comparison (default "500 1000")
#   --workers N         relay.workers, and pgbench clients (default 2)
#   --latency-rate R    producer rate of the latency run, events/s (default 1000)
#   --latency-seconds S duration of the latency run (default 30)
#   --repeat N          run every drain scenario N times, round by round; the results
#                       report the median run and keep all (default 3)
#   --quiet-max S       before each measurement, wait up to S seconds for the machine to be
#                       idle (other sessions share it); 0: do not wait (default 60)
#   --no-latency        skip the latency run
#   --no-nats           skip the JetStream drains
#   --no-ceiling        skip the null-sink / pgbench comparison
#   --no-extras         skip the context runs: JetStream drain with 1 and 4 workers and with
#                       ordering = "none"; null-sink drain without ANALYZE after the prefill
#   --build             cargo build --release -p outbox-cli first
#   --out FILE          results file (default scripts/bench/results/<date>.json)
#   --keep              keep the temporary directory (logs, configs, pgbench scripts)
# Environment: OUTBOX_BIN (default target/release/outbox), PGBIN (default
# /usr/lib/postgresql/15/bin).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
PGBIN=${PGBIN:-/usr/lib/postgresql/15/bin}
OUTBOX_BIN=${OUTBOX_BIN:-$ROOT/target/release/outbox}

ROWS=100000
CEILING_ROWS=200000
BATCHES="500 1000"
WORKERS=2
LAT_RATE=1000
LAT_SECONDS=30
DO_LATENCY=1
DO_NATS=1
DO_CEILING=1
DO_EXTRAS=1
REPEAT=3
QUIET_MAX=60
BUILD=0
KEEP=0
OUT=""

while [[ $# -gt 0 ]]; do
    case "$1" in
        --rows) ROWS=$2; shift 2 ;;
        --ceiling-rows) CEILING_ROWS=$2; shift 2 ;;
        --batches) BATCHES=$2; shift 2 ;;
        --workers) WORKERS=$2; shift 2 ;;
        --latency-rate) LAT_RATE=$2; shift 2 ;;
        --latency-seconds) LAT_SECONDS=$2; shift 2 ;;
        --no-latency) DO_LATENCY=0; shift ;;
        --no-nats) DO_NATS=0; shift ;;
        --no-ceiling) DO_CEILING=0; shift ;;
        --no-extras) DO_EXTRAS=0; shift ;;
        --repeat) REPEAT=$2; shift 2 ;;
        --quiet-max) QUIET_MAX=$2; shift 2 ;;
        --build) BUILD=1; shift ;;
        --out) OUT=$2; shift 2 ;;
        --keep) KEEP=1; shift ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed 's/^# \{0,1\}//; /^set -euo/d'; exit 0 ;;
        *) echo "unknown option: $1 (see --help)" >&2; exit 2 ;;
    esac
done

log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 1; }

# ------------------------------------------------------------------------ prerequisites

[[ -x $PGBIN/initdb ]] || die "PostgreSQL binaries not found in $PGBIN (set PGBIN)"
command -v pgbench >/dev/null || die "pgbench not on PATH"
command -v nats-server >/dev/null || die "nats-server not on PATH (apt-get install nats-server)"

VENV=$HERE/.venv
if [[ ! -x $VENV/bin/python ]] || ! "$VENV/bin/python" -c 'import psycopg, nats' 2>/dev/null; then
    log "creating $VENV (psycopg[binary], nats-py)"
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q 'psycopg[binary]' nats-py
fi
PY=$VENV/bin/python

if [[ $BUILD == 1 ]]; then
    log "building the relay (cargo build --release -p outbox-cli)"
    (cd "$ROOT" && cargo build --release -p outbox-cli)
fi
HAVE_RELAY=0
if [[ -x $OUTBOX_BIN ]]; then
    HAVE_RELAY=1
    RELAY_SHA=$(sha256sum "$OUTBOX_BIN" | cut -c1-16)
    RELAY_BUILT=$(date -u -r "$OUTBOX_BIN" +%Y-%m-%dT%H:%M:%SZ)
else
    log "WARNING: $OUTBOX_BIN not found: relay scenarios are skipped (use --build)"
fi

# ----------------------------------------------------------------------------- services

WORK=$(mktemp -d /tmp/outbox-bench.XXXXXX)
chmod 755 "$WORK"
mkdir -p "$WORK/scenarios" "$WORK/logs" "$WORK/conf"
if [[ $HAVE_RELAY == 1 ]]; then
    # A private copy: a rebuild by someone else during the run must not swap the binary.
    cp "$OUTBOX_BIN" "$WORK/outbox"
    OUTBOX_BIN=$WORK/outbox
fi
PG_DATA=$WORK/pg
NATS_PID=""

cleanup() {
    local rc=$?
    set +e
    if [[ -f $PG_DATA/postmaster.pid ]]; then
        as_pg "$PGBIN/pg_ctl" -D "$PG_DATA" -m immediate -w stop >/dev/null 2>&1
    fi
    if [[ -n $NATS_PID ]]; then
        kill "$NATS_PID" 2>/dev/null
        wait "$NATS_PID" 2>/dev/null
    fi
    if [[ $KEEP == 1 ]]; then
        log "kept $WORK"
    else
        rm -rf "$WORK"
    fi
    exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# PostgreSQL refuses to run as root: run its server binaries as `postgres` when we are root.
as_pg() {
    if [[ $(id -u) == 0 ]]; then
        runuser -u postgres -- "$@"
    else
        "$@"
    fi
}

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

PG_PORT=$(free_port)
NATS_PORT=$(free_port)
METRICS_PORT=$(free_port)

mkdir -p "$PG_DATA"
touch "$WORK/logs/postgres.log"
if [[ $(id -u) == 0 ]]; then chown postgres "$PG_DATA" "$WORK/logs/postgres.log"; fi
log "initdb in $PG_DATA"
as_pg "$PGBIN/initdb" -D "$PG_DATA" -U postgres -A trust --no-sync >"$WORK/logs/initdb.log" 2>&1
PG_OPTS="-c fsync=on -c synchronous_commit=on -c shared_buffers=256MB -c listen_addresses=127.0.0.1 -p $PG_PORT -k $PG_DATA"
as_pg "$PGBIN/pg_ctl" -D "$PG_DATA" -l "$WORK/logs/postgres.log" -w -o "$PG_OPTS" start >/dev/null
log "PostgreSQL on 127.0.0.1:$PG_PORT"

export PGHOST=127.0.0.1 PGPORT=$PG_PORT PGUSER=postgres
DB_URL="postgres://postgres@127.0.0.1:$PG_PORT/bench"
NATS_URL="nats://127.0.0.1:$NATS_PORT"

nats-server -js -a 127.0.0.1 -p "$NATS_PORT" -sd "$WORK/nats" >"$WORK/logs/nats.log" 2>&1 &
NATS_PID=$!
for _ in $(seq 100); do
    grep -q "Server is ready" "$WORK/logs/nats.log" 2>/dev/null && break
    kill -0 "$NATS_PID" 2>/dev/null || die "nats-server did not start: $(tail -3 "$WORK/logs/nats.log")"
    sleep 0.1
done
grep -q "Server is ready" "$WORK/logs/nats.log" || die "nats-server not ready"
log "nats-server (JetStream) on 127.0.0.1:$NATS_PORT"
# For the CPU accounting of each drain (postgres = postmaster and all its children).
PIDS="--pg-pid $(head -1 "$PG_DATA/postmaster.pid") --nats-pid $NATS_PID"

# --------------------------------------------------------------------- database helpers

# The relay's SQL templates rendered for "public"."outbox", as `sql::render` does.
render() {
    sed -e 's/{{schema}}/"public"/g' \
        -e 's/{{table}}/"public"."outbox"/g' \
        -e 's/{{name:\([a-z_]*\)}}/"outbox\1"/g' \
        -e 's/{{qname:\([a-z_]*\)}}/"public"."outbox\1"/g' \
        -e "s/{{regclass:\([a-z_]*\)}}/'\"public\".\"outbox\1\"'::regclass/g" "$@"
}

MIGRATED_BY=""
migrate() {
    if [[ $HAVE_RELAY == 1 ]]; then
        MIGRATED_BY="outbox migrate"
        "$OUTBOX_BIN" migrate --config "$WORK/conf/migrate.toml" >>"$WORK/logs/migrate.log" 2>&1 \
            || die "outbox migrate failed: $(tail -5 "$WORK/logs/migrate.log")"
    else
        # Without the binary: the bundled migration, rendered the same way.
        MIGRATED_BY="rendered 0001_outbox_table.sql (no binary)"
        render "$ROOT/crates/outbox-postgres/migrations/0001_outbox_table.sql" \
            | psql -q -v ON_ERROR_STOP=1 -d bench >>"$WORK/logs/migrate.log" 2>&1 \
            || die "migration failed: $(tail -5 "$WORK/logs/migrate.log")"
    fi
}

# fresh_db ROWS [ANALYZE=true|false]: a new `bench` database, migrated, with ROWS pending
# events.
fresh_db() {
    dropdb --if-exists --force bench 2>/dev/null
    createdb bench
    migrate
    if [[ $1 -gt 0 ]]; then
        psql -q -X -v rows="$1" -v analyze="${2:-true}" -d bench -f "$HERE/prefill.sql" >/dev/null
    fi
}

cat >"$WORK/conf/migrate.toml" <<EOF
[source]
kind = "postgres"
url = "$DB_URL"
EOF

# relay_config FILE ON_DELIVERED BATCH SINK(nats|null) [METRICS_PORT] [WORKERS] [ORDERING]
relay_config() {
    local file=$1 on_delivered=$2 batch=$3 sink=$4 metrics=${5:-} workers=${6:-$WORKERS} ordering=${7:-}
    {
        echo "[source]"
        echo "kind = \"postgres\""
        echo "url = \"$DB_URL\""
        echo "on_delivered = \"$on_delivered\""
        echo
        echo "[relay]"
        echo "batch_size = $batch"
        echo "workers = $workers"
        [[ -z $ordering ]] || echo "ordering = \"$ordering\""
        echo
        echo "[sink]"
        if [[ $sink == nats ]]; then
            echo "kind = \"nats\""
            echo "url = \"$NATS_URL\""
            echo "stream = \"OUTBOX\""
        else
            echo "kind = \"file\""
            echo "path = \"/dev/null\""
            echo "sync = false"
        fi
        if [[ -n $metrics ]]; then
            echo
            echo "[metrics]"
            echo "listen = \"127.0.0.1:$metrics\""
        fi
    } >"$file"
}

# ---------------------------------------------------------------------- pgbench scripts

# The statements pgbench runs must be the ones the relay binary under test runs. Snapshot the
# query files now (others may edit the tree during a long run) and check that the binary
# embeds exactly these files (they are compiled in with include_str!).
Q=$WORK/queries
mkdir -p "$Q"
cp "$ROOT"/crates/outbox-postgres/queries/*.sql "$Q/"
QUERIES_MATCH_BINARY=null
if [[ $HAVE_RELAY == 1 ]]; then
    if "$PY" - "$OUTBOX_BIN" "$Q/outbox_claim_batch.sql" "$Q/outbox_delete_delivered.sql" \
        "$Q/outbox_mark_delivered.sql" "$Q/outbox_positions_advance.sql" <<'EOF'
import sys
binary = open(sys.argv[1], "rb").read()
missing = [f for f in sys.argv[2:] if open(f, "rb").read() not in binary]
for f in missing:
    print(f"  {f.rsplit('/', 1)[-1]} differs from what the binary was built with", file=sys.stderr)
sys.exit(1 if missing else 0)
EOF
    then
        QUERIES_MATCH_BINARY=True
    else
        QUERIES_MATCH_BINARY=False
        if [[ $DO_CEILING == 1 ]]; then
            die "the relay binary was built from other query files than this tree's; the pgbench ceiling would run different SQL. Rebuild it (--build) or skip the ceiling (--no-ceiling)"
        fi
    fi
fi
# The relay's claim (outbox_claim_batch.sql, per-aggregate ordering, the default) exactly as
# bundled, rendered for "public"."outbox"; $1 (now) -> now(), $2 (limit) -> :batch,
# $3 (dead letters hold their aggregate, the default) -> :hold_dead. Comment lines dropped.
CLAIM_SQL=$(grep -v '^[[:space:]]*--' "$Q/outbox_claim_batch.sql" | render \
    | sed -e 's/\$1/now()/g' -e 's/\$2/:batch/g' -e 's/\$3/:hold_dead/g')

# pgbench_claim_script OUTCOME(delete|mark) BATCH > file
# One transaction = what a relay worker does per batch: the claim, its rows sent to the
# client, then the outcome statement over the claimed seqs the relay would deliver (those
# before the batch's gap, as the relay filters them), then the advance of the delivered
# aggregates' delivery positions (outbox_positions_advance.sql: the `aggregate_seq` heads, one
# row per aggregate of the batch, sorted by key as the relay sends them), then COMMIT. pgbench
# cannot carry a result set into the next statement, so the claim is wrapped in a CTE that
# also stores the seqs and the new heads in transaction-local settings; the later statements
# read them back as their parameters.
pgbench_claim_script() {
    local outcome=$1 batch=$2 stmt positions
    if [[ $outcome == delete ]]; then
        stmt=$(grep -v '^[[:space:]]*--' "$Q/outbox_delete_delivered.sql" | render \
            | sed -e "s/\\\$1/current_setting('bench.seqs')::bigint[]/g")
    else
        stmt=$(grep -v '^[[:space:]]*--' "$Q/outbox_mark_delivered.sql" | render \
            | sed -e "s/\\\$1/current_setting('bench.seqs')::bigint[]/g" -e 's/\$2/now()/g')
    fi
    positions=$(grep -v '^[[:space:]]*--' "$Q/outbox_positions_advance.sql" | render \
        | sed -e "s/\\\$1::text\[\]/current_setting('bench.types')::text[]/g" \
            -e "s/\\\$2::text\[\]/current_setting('bench.ids')::text[]/g" \
            -e "s/\\\$3::bigint\[\]/current_setting('bench.heads')::bigint[]/g")
    cat <<EOF
\\set batch $batch
\\set hold_dead 1
BEGIN;
WITH r AS (
$CLAIM_SQL
), d AS (
    SELECT * FROM r WHERE gap_seq IS NULL OR seq < gap_seq
), h AS (
    SELECT aggregate_type, aggregate_id, max(last_position) + count(*) AS head
    FROM d GROUP BY aggregate_type, aggregate_id
), s AS (
    SELECT set_config('bench.seqs', coalesce((SELECT array_agg(seq) FROM d), '{}')::text, true),
           set_config('bench.types', coalesce((SELECT array_agg(aggregate_type ORDER BY aggregate_type, aggregate_id) FROM h), '{}')::text, true),
           set_config('bench.ids', coalesce((SELECT array_agg(aggregate_id ORDER BY aggregate_type, aggregate_id) FROM h), '{}')::text, true),
           set_config('bench.heads', coalesce((SELECT array_agg(head ORDER BY aggregate_type, aggregate_id) FROM h), '{}')::text, true)
)
SELECT r.* FROM r CROSS JOIN s ORDER BY r.seq;
$stmt;
$positions;
COMMIT;
EOF
}

# The hand-written relay's statements (handwritten_relay.py), same shape.
pgbench_handwritten_script() {
    cat <<'EOF'
\set batch 100
BEGIN;
WITH r AS (
    SELECT id, aggregate_type, aggregate_id, event_type, payload
    FROM outbox
    WHERE state = 'pending'
    ORDER BY seq
    LIMIT :batch
    FOR UPDATE SKIP LOCKED
), s AS (
    SELECT set_config('bench.ids', coalesce(array_agg(id), '{}')::text, true) AS ids FROM r
)
SELECT r.* FROM r CROSS JOIN s;
UPDATE outbox SET state = 'delivered', delivered_at = now()
WHERE id = ANY(current_setting('bench.ids')::uuid[]);
COMMIT;
EOF
}

# ---------------------------------------------------------------------------- scenarios

N_SCENARIO=0
FAILED=0

# Waits (up to QUIET_MAX s) for the machine to be nearly idle before a measurement, and
# leaves what happened in $QW (JSON) for the scenario's record.
QW='null'
wait_quiet() {
    if [[ $QUIET_MAX == 0 ]]; then QW='null'; return; fi
    QW=$("$PY" "$HERE/bench.py" wait-quiet --max "$QUIET_MAX")
    if [[ $QW == *'"quiet": false'* ]]; then
        log "  machine still busy after ${QUIET_MAX}s ($QW); measuring anyway"
    fi
}

# Adds fields to a scenario's JSON: record KEY JSON_FILE key=value... (values are JSON)
record() {
    local key=$1 src=$2; shift 2
    N_SCENARIO=$((N_SCENARIO + 1))
    local dst
    dst=$WORK/scenarios/$(printf '%03d' "$N_SCENARIO")_$key@$ROUND.json
    "$PY" - "$src" "$dst" "$@" <<'EOF'
import json, sys
src, dst, *kv = sys.argv[1:]
try:
    with open(src) as f:
        d = json.loads(f.read().strip().splitlines()[-1])
except Exception as e:
    d = {"error": f"no result ({e})"}
for item in kv:
    k, v = item.split("=", 1)
    d[k] = json.loads(v)
with open(dst, "w") as f:
    json.dump(d, f, indent=2)
EOF
    local rate
    rate=$("$PY" - "$dst" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
r = d.get("rows_per_s")
print(f"{r:.0f} rows/s in {d['elapsed_s']}s" if r else f"ERROR {d.get('error')}")
EOF
)
    log "  $key (round $ROUND): $rate"
}

# Relay log: WARN/ERROR lines (counted, the first ones kept).
log_findings() {
    local logf=$1
    "$PY" - "$logf" <<'EOF'
import json, re, sys
lines = [l.rstrip("\n") for l in open(sys.argv[1], errors="replace")]
bad = [re.sub(r"\x1b\[[0-9;]*m", "", l) for l in lines if re.search(r"\b(WARN|ERROR)\b", re.sub(r"\x1b\[[0-9;]*m", "", l))]
print(json.dumps({"warn_error_lines": len(bad), "first": bad[:5]}))
EOF
}

# run_relay KEY ROWS ON_DELIVERED BATCH SINK [WORKERS] [ORDERING] [ANALYZE]
run_relay() {
    local key=$1 rows=$2 on_delivered=$3 batch=$4 sink=$5 workers=${6:-$WORKERS} ordering=${7:-}
    local analyze=${8:-true}
    if [[ $HAVE_RELAY == 0 ]]; then
        echo '{"error": "relay binary not built"}' >"$WORK/$key.out"
        record "$key" "$WORK/$key.out" "what=\"outbox relay\""
        return
    fi
    log "scenario $key: prefill $rows"
    fresh_db "$rows" "$analyze"
    local conf=$WORK/conf/$key.toml
    relay_config "$conf" "$on_delivered" "$batch" "$sink" "" "$workers" "$ordering"
    [[ $sink == nats ]] && "$PY" "$HERE/bench.py" reset-stream --nats-url "$NATS_URL"
    wait_quiet
    local logf=$WORK/logs/$key@$ROUND.log
    if ! "$PY" "$HERE/bench.py" drain $PIDS --db-url "$DB_URL" --log "$logf" -- \
        env OUTBOX_LOG="${OUTBOX_LOG:-info}" "$OUTBOX_BIN" relay --config "$conf" >"$WORK/$key.out"; then
        FAILED=1
    fi
    local extra=()
    if [[ $sink == nats ]]; then
        extra+=("stream_messages=$("$PY" "$HERE/bench.py" stream-count --nats-url "$NATS_URL")")
    fi
    record "$key" "$WORK/$key.out" "what=\"outbox relay\"" "sink=\"$sink\"" \
        "on_delivered=\"$on_delivered\"" "batch_size=$batch" "workers=$workers" \
        "ordering=\"${ordering:-per-aggregate (default)}\"" "analyzed_before=$analyze" \
        "config=$("$PY" -c 'import json,sys; print(json.dumps(open(sys.argv[1]).read()))' "$conf")" \
        "relay_log=$(log_findings "$logf")" "quiet_wait=$QW" "${extra[@]}"
}

run_handwritten() {
    local key=nats.handwritten
    log "scenario $key: prefill $ROWS"
    fresh_db "$ROWS"
    "$PY" "$HERE/bench.py" reset-stream --nats-url "$NATS_URL"
    wait_quiet
    if ! "$PY" "$HERE/bench.py" drain $PIDS --db-url "$DB_URL" --log "$WORK/logs/$key@$ROUND.log" -- \
        "$PY" "$HERE/handwritten_relay.py" --db-url "$DB_URL" --nats-url "$NATS_URL" --batch 100 \
        >"$WORK/$key.out"; then
        FAILED=1
    fi
    record "$key" "$WORK/$key.out" "what=\"scripts/bench/handwritten_relay.py (baseline)\"" \
        "batch_size=100" "workers=1" "quiet_wait=$QW" \
        "stream_messages=$("$PY" "$HERE/bench.py" stream-count --nats-url "$NATS_URL")"
}

# run_pgbench KEY ROWS SCRIPT_FILE [CLIENTS]
run_pgbench() {
    local key=$1 rows=$2 script=$3 clients=${4:-$WORKERS}
    log "scenario $key: prefill $rows"
    fresh_db "$rows"
    wait_quiet
    # -T is only an upper bound: like the relay runs, the clock stops when no row is pending.
    if ! "$PY" "$HERE/bench.py" drain $PIDS --db-url "$DB_URL" --log "$WORK/logs/$key@$ROUND.log" --stop-signal INT -- \
        pgbench -n -M prepared -c "$clients" -j "$clients" -T 900 -f "$script" bench >"$WORK/$key.out"; then
        FAILED=1
    fi
    record "$key" "$WORK/$key.out" "what=\"pgbench\"" "clients=$clients" "protocol=\"prepared\"" "quiet_wait=$QW" \
        "script=$("$PY" -c 'import json,sys; print(json.dumps(open(sys.argv[1]).read()))' "$script")"
}

# ------------------------------------------------------------------------------- run it

START=$(date -u +%Y-%m-%dT%H:%M:%SZ)
# The tree at the start (the binary may be older: see outbox_sha256_16 and --build).
GIT_REV=$(cd "$ROOT" && git rev-parse --short HEAD 2>/dev/null || echo unknown)
GIT_DIRTY=$(cd "$ROOT" && [[ -n $(git status --porcelain 2>/dev/null) ]] && echo True || echo False)
log "work directory $WORK"

# Every scenario runs REPEAT times, round by round (so slow drifts of a shared machine spread
# over all scenarios); the results file keeps every run and reports the median.
for ROUND in $(seq "$REPEAT"); do
log "round $ROUND of $REPEAT"

if [[ $DO_NATS == 1 ]]; then
    run_relay nats.relay.delete "$ROWS" delete 500 nats
    run_relay nats.relay.mark "$ROWS" mark 500 nats
    run_handwritten
fi

if [[ $DO_EXTRAS == 1 && $DO_NATS == 1 ]]; then
    # Not targets, context for docs/benchmarks.md: how the JetStream drain moves with the
    # number of workers, and what per-aggregate ordering costs (ordering = "none" gives it up).
    run_relay nats.relay.delete.w1 "$ROWS" delete 500 nats 1
    run_relay nats.relay.delete.w4 "$ROWS" delete 500 nats 4
    run_relay nats.relay.delete.unordered "$ROWS" delete 500 nats "$WORKERS" none
    run_relay nats.relay.delete.unordered.w4 "$ROWS" delete 500 nats 4 none
fi

if [[ $DO_CEILING == 1 ]]; then
    for b in $BATCHES; do
        for mode in delete mark; do
            run_relay "null.relay.$mode.b$b" "$CEILING_ROWS" "$mode" "$b" null
            pgbench_claim_script "$mode" "$b" >"$WORK/conf/claim_$mode.b$b.pgbench"
            run_pgbench "pgbench.claim_$mode.b$b" "$CEILING_ROWS" "$WORK/conf/claim_$mode.b$b.pgbench"
        done
    done
    pgbench_handwritten_script >"$WORK/conf/handwritten.pgbench"
    run_pgbench pgbench.handwritten.b100 "$CEILING_ROWS" "$WORK/conf/handwritten.pgbench"
    # One worker against one client: the same statements without two claimers colliding
    # (see docs/benchmarks.md), i.e. the relay's own per-batch overhead.
    for mode in delete mark; do
        run_relay "null.relay.$mode.b500.w1" "$CEILING_ROWS" "$mode" 500 null 1
        pgbench_claim_script "$mode" 500 >"$WORK/conf/claim_$mode.b500.pgbench"
        run_pgbench "pgbench.claim_$mode.b500.c1" "$CEILING_ROWS" "$WORK/conf/claim_$mode.b500.pgbench" 1
    done
fi

done

if [[ $DO_EXTRAS == 1 && $DO_CEILING == 1 ]]; then
    # Once, not repeated (slow by nature): the null-sink drain when the table has no planner
    # statistics yet (no ANALYZE after the backlog was written), until autovacuum catches up.
    ROUND=1
    run_relay null.relay.delete.b500.no_analyze "$ROWS" delete 500 null "$WORKERS" "" false
fi

if [[ $DO_LATENCY == 1 && $HAVE_RELAY == 1 ]]; then
    log "latency: relay (nats, delete, batch 500) with a producer at $LAT_RATE events/s for ${LAT_SECONDS}s"
    fresh_db 0
    "$PY" "$HERE/bench.py" reset-stream --nats-url "$NATS_URL"
    relay_config "$WORK/conf/latency.toml" delete 500 nats "$METRICS_PORT"
    OUTBOX_LOG="${OUTBOX_LOG:-info}" "$OUTBOX_BIN" relay --config "$WORK/conf/latency.toml" \
        >"$WORK/logs/latency-relay.log" 2>&1 &
    RELAY_PID=$!
    wait_quiet
    # Warm-up (connections, first polls), not measured.
    pgbench -n -c 4 -j 2 -R "$LAT_RATE" -T 3 -f "$HERE/produce.pgbench" bench >/dev/null 2>&1 || true
    if "$PY" "$HERE/bench.py" latency --db-url "$DB_URL" --metrics-url "http://127.0.0.1:$METRICS_PORT/metrics" \
        --rate "$LAT_RATE" -- pgbench -n -c 4 -j 2 -R "$LAT_RATE" -T "$LAT_SECONDS" -f "$HERE/produce.pgbench" bench \
        >"$WORK/latency.out"; then
        "$PY" - "$WORK/latency.out" "$WORK/latency.json" "$(log_findings "$WORK/logs/latency-relay.log")" "$QW" <<'EOF'
import json, sys
d = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
d["relay_log"] = json.loads(sys.argv[3])
d["quiet_wait"] = json.loads(sys.argv[4])
d["config"] = "relay: nats sink, on_delivered = delete, batch_size = 500, default poll/idle intervals"
json.dump(d, open(sys.argv[2], "w"), indent=2)
EOF
    else
        echo '{"error": "latency run failed"}' >"$WORK/latency.json"
        FAILED=1
    fi
    kill -TERM "$RELAY_PID" 2>/dev/null || true
    wait "$RELAY_PID" 2>/dev/null || true
fi

# ------------------------------------------------------------------------------ results

CPU=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')
MEM_KB=$(grep MemTotal /proc/meminfo | awk '{print $2}')
PG_VERSION=$(psql -XAtc 'SHOW server_version' -d postgres)
NATS_VERSION=$(nats-server --version | awk '{print $2}')
RELAY_VERSION=$([[ $HAVE_RELAY == 1 ]] && "$OUTBOX_BIN" --version 2>/dev/null | head -1 || echo "")
"$PY" - "$WORK/meta.json" <<EOF
import json, sys
meta = {
    "date": "$START",
    "command": "scripts/bench/drain.sh",
    "machine": {"nproc": $(nproc), "cpu": "$CPU", "mem_gib": round($MEM_KB / 1048576, 1),
                "kernel": "$(uname -r)"},
    "versions": {"postgres": "$PG_VERSION", "nats_server": "$NATS_VERSION",
                 "outbox": "$RELAY_VERSION", "outbox_sha256_16": "${RELAY_SHA:-}",
                 "outbox_built": "${RELAY_BUILT:-}", "git": "$GIT_REV", "git_dirty": $GIT_DIRTY},
    "params": {"rows": $ROWS, "ceiling_rows": $CEILING_ROWS, "ceiling_batches": [$(echo $BATCHES | sed 's/ /, /g')],
               "workers": $WORKERS, "repeat": $REPEAT, "quiet_max_s": $QUIET_MAX, "latency_rate": $LAT_RATE, "latency_seconds": $LAT_SECONDS,
               "poll_interval_s": 0.1, "migrated_by": "$MIGRATED_BY",
               "pgbench_queries_match_binary": $QUERIES_MATCH_BINARY,
               "postgres_settings": "$PG_OPTS"},
}
json.dump(meta, open(sys.argv[1], "w"), indent=2)
EOF

if [[ -z $OUT ]]; then
    mkdir -p "$HERE/results"
    OUT=$HERE/results/$(date +%Y-%m-%d).json
    n=2
    while [[ -e $OUT ]]; do
        OUT=$HERE/results/$(date +%Y-%m-%d)-$n.json
        n=$((n + 1))
    done
fi
"$PY" "$HERE/bench.py" assemble --work "$WORK" --out "$OUT"
"$PY" "$HERE/bench.py" report "$OUT"
log "results written to ${OUT#"$ROOT"/}"
[[ $FAILED == 0 ]] || { log "some scenarios failed (see the ERROR rows)"; exit 1; }
