#!/usr/bin/env bash
# Scaling, memory and the `outbox bench` series (issue 7), all in one run on this machine:
#
#   1. Replicas: a prefilled backlog drained by 1, 2 and 4 separate `outbox relay` processes
#      (one worker each, per-aggregate ordering) on one PostgreSQL, into JetStream and into a
#      null sink ([sink] kind = "file", path = /dev/null); rows/s, and the CPU of PostgreSQL
#      vs the relays (bench.py drain's /proc accounting). Ratios against 1 replica.
#   2. Memory: a 1M-event backlog drained by one `outbox relay` (peak RSS = VmHWM read from
#      /proc just before SIGTERM) and by `outbox bench backlog --events 1000000` (in-process).
#   3. Drain rate by batch size: `outbox bench backlog --sink null` and into JetStream.
#   4. Latency: `outbox bench steady` at 1,000 and 5,000 events/s into JetStream and null.
#
# Everything runs against a private PostgreSQL 15 and nats-server -js on free ports in a
# temporary directory removed at exit (as drain.sh). Results: one JSON file with every
# measurement (scripts/bench/results/scaling-<date>.json); charts from it with
#   cargo run -p outbox-cli --example bench_charts -- docs/img scripts/bench/results/scaling-<date>.json
#
# Usage: scripts/bench/scaling.sh [options]
#   --rows N          backlog of the replica runs (default 100000)
#   --big N           backlog of the memory run (default 1000000)
#   --bench-rows N    backlog of the batch-size series (default 100000)
#   --batches "A B"   batch sizes of the series (default "50 100 250 500 1000 2000")
#   --rates "A B"     producer rates of the latency runs (default "1000 5000")
#   --seconds S       duration of each latency run (default 20)
#   --only LIST       comma-separated subset of: replicas,memory,batches,latency
#   --quiet-max S     wait up to S s for an idle machine before each measurement (default 30)
#   --out FILE        results file
#   --keep            keep the temporary directory (logs of every run, configs)
# Environment: OUTBOX_BIN (default target/release/outbox), PGBIN, PG_EXTRA_OPTS (more
# server options, e.g. "-c session_preload_libraries=auto_explain
# -c auto_explain.log_min_duration=1s -c auto_explain.log_analyze=on" to log slow plans into
# logs/postgres.log; keep the directory with --keep).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
PGBIN=${PGBIN:-/usr/lib/postgresql/15/bin}
OUTBOX_BIN=${OUTBOX_BIN:-$ROOT/target/release/outbox}
ROWS=100000
BIG=1000000
BENCH_ROWS=100000
BATCHES="50 100 250 500 1000 2000"
RATES="1000 5000"
SECONDS_LAT=20
ONLY="replicas,memory,batches,latency"
QUIET_MAX=30
KEEP=0
OUT="$HERE/results/scaling-$(date -u +%Y-%m-%d-%H%M).json"

while [[ $# -gt 0 ]]; do
    case "$1" in
        --rows) ROWS=$2; shift 2 ;;
        --big) BIG=$2; shift 2 ;;
        --bench-rows) BENCH_ROWS=$2; shift 2 ;;
        --batches) BATCHES=$2; shift 2 ;;
        --rates) RATES=$2; shift 2 ;;
        --seconds) SECONDS_LAT=$2; shift 2 ;;
        --only) ONLY=$2; shift 2 ;;
        --quiet-max) QUIET_MAX=$2; shift 2 ;;
        --out) OUT=$2; shift 2 ;;
        --keep) KEEP=1; shift ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed 's/^# \{0,1\}//; /^set -euo/d'; exit 0 ;;
        *) echo "unknown option: $1 (see --help)" >&2; exit 2 ;;
    esac
done
want() { [[ ",$ONLY," == *",$1,"* ]]; }

log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 1; }

[[ -x $PGBIN/initdb ]] || die "PostgreSQL binaries not found in $PGBIN (set PGBIN)"
command -v nats-server >/dev/null || die "nats-server not on PATH"
[[ -x $OUTBOX_BIN ]] || die "$OUTBOX_BIN not found: cargo build --release -p outbox-cli"
PY=$HERE/.venv/bin/python
if [[ ! -x $PY ]] || ! "$PY" -c 'import psycopg, nats' 2>/dev/null; then
    log "creating $HERE/.venv (psycopg[binary], nats-py)"
    python3 -m venv "$HERE/.venv"
    "$HERE/.venv/bin/pip" install -q 'psycopg[binary]' nats-py
fi

WORK=$(mktemp -d /tmp/outbox-scaling.XXXXXX)
chmod 755 "$WORK"
mkdir -p "$WORK/r" "$WORK/logs" "$WORK/conf"
cp "$OUTBOX_BIN" "$WORK/outbox"   # a rebuild during the run must not swap the binary
BIN=$WORK/outbox
RELAY_SHA=$(sha256sum "$BIN" | cut -c1-16)
PG_DATA=$WORK/pg
NATS_PID=""
cleanup() {
    local rc=$?
    set +e
    [[ -f $PG_DATA/postmaster.pid ]] && as_pg "$PGBIN/pg_ctl" -D "$PG_DATA" -m immediate -w stop >/dev/null 2>&1
    [[ -n $NATS_PID ]] && { kill "$NATS_PID" 2>/dev/null; wait "$NATS_PID" 2>/dev/null; }
    if [[ $KEEP == 1 ]]; then log "kept $WORK"; else rm -rf "$WORK"; fi
    exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM
as_pg() { if [[ $(id -u) == 0 ]]; then runuser -u postgres -- "$@"; else "$@"; fi; }
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

PG_PORT=$(free_port)
NATS_PORT=$(free_port)
mkdir -p "$PG_DATA"
touch "$WORK/logs/postgres.log"
[[ $(id -u) == 0 ]] && chown postgres "$PG_DATA" "$WORK/logs/postgres.log"
as_pg "$PGBIN/initdb" -D "$PG_DATA" -U postgres -A trust --no-sync >"$WORK/logs/initdb.log" 2>&1
as_pg "$PGBIN/pg_ctl" -D "$PG_DATA" -l "$WORK/logs/postgres.log" -w -o "-c fsync=on -c synchronous_commit=on -c shared_buffers=256MB -c max_connections=200 -c listen_addresses=127.0.0.1 -p $PG_PORT -k $PG_DATA ${PG_EXTRA_OPTS:-}" start >/dev/null
export PGHOST=127.0.0.1 PGPORT=$PG_PORT PGUSER=postgres
nats-server -js -a 127.0.0.1 -p "$NATS_PORT" -sd "$WORK/nats" >"$WORK/logs/nats.log" 2>&1 &
NATS_PID=$!
for _ in $(seq 100); do grep -q "Server is ready" "$WORK/logs/nats.log" 2>/dev/null && break; sleep 0.1; done
NATS_URL="nats://127.0.0.1:$NATS_PORT"
PG_PID=$(head -1 "$PG_DATA/postmaster.pid")
log "PostgreSQL on $PG_PORT, nats-server on $NATS_PORT, relay $RELAY_SHA"

# A fresh database `bench`, migrated; prefilled with $1 rows when given.
fresh_db() {
    psql -q -d postgres -c "DROP DATABASE IF EXISTS bench" -c "CREATE DATABASE bench" >/dev/null
    OUTBOX_LOG=warn OUTBOX_DATABASE_URL="postgres://postgres@127.0.0.1:$PG_PORT/bench" "$BIN" migrate >/dev/null
    if [[ -n ${1:-} ]]; then psql -q -d bench -v rows="$1" -f "$HERE/prefill.sql" >/dev/null; fi
}
reset_stream() { "$PY" "$HERE/bench.py" reset-stream --nats-url "$NATS_URL"; }
quiet() { "$PY" "$HERE/bench.py" wait-quiet --max "$QUIET_MAX" 2>/dev/null || echo '{}'; }

# config NAME SINK(nats|null) BATCH WORKERS
config() {
    local f=$WORK/conf/$1.toml
    {
        printf '[source]\nkind = "postgres"\nurl = "postgres://postgres@127.0.0.1:%s/bench"\n' "$PG_PORT"
        printf '[relay]\nbatch_size = %s\nworkers = %s\n' "$3" "$4"
        if [[ $2 == nats ]]; then
            printf '[sink]\nkind = "nats"\nurl = "%s"\nstream = "OUTBOX"\n' "$NATS_URL"
        else
            printf '[sink]\nkind = "file"\npath = "/dev/null"\nsync = false\n'
        fi
    } >"$f"
    echo "$f"
}

# N separate relay processes under one shell: SIGTERM to the shell records each relay's
# peak RSS (VmHWM) and forwards SIGTERM to all of them.
replicas_cmd() {
    local n=$1 cfg=$2 rss=$3
    cat <<EOF
pids=""
for i in \$(seq $n); do OUTBOX_LOG=warn "$BIN" relay --config "$cfg" & pids="\$pids \$!"; done
stop() { for p in \$pids; do grep VmHWM /proc/\$p/status >> "$rss"; done; kill -TERM \$pids; wait; }
trap stop TERM
wait
EOF
}

drain() { # NAME ROWS REPLICAS SINK CFG
    local name=$1 rows=$2 n=$3 sink=$4 cfg=$5
    fresh_db "$rows"
    [[ $sink == nats ]] && reset_stream
    local q
    q=$(quiet)
    rm -f "$WORK/r/$name.rss"
    "$PY" "$HERE/bench.py" drain --db-url "postgres://postgres@127.0.0.1:$PG_PORT/bench" \
        --log "$WORK/logs/$name.log" --pg-pid "$PG_PID" --nats-pid "$NATS_PID" \
        -- sh -c "$(replicas_cmd "$n" "$cfg" "$WORK/r/$name.rss")" >"$WORK/r/$name.drain.json" || true
    "$PY" - "$name" "$n" "$sink" "$q" "$WORK/r/$name.drain.json" "$WORK/r/$name.rss" >"$WORK/r/$name.json" <<'PYEOF'
import json, sys
name, n, sink, quiet, drain, rss = sys.argv[1:]
d = json.load(open(drain))
kib = [int(l.split()[1]) for l in open(rss)] if __import__("os").path.exists(rss) else []
print(json.dumps({"kind": "drain", "name": name, "replicas": int(n), "sink": sink,
                  "quiet": json.loads(quiet), "peak_rss_kib": kib, **d}))
PYEOF
    log "$name: $(python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(d.get('rows_per_s'), 'rows/s, cpu', d.get('cpu_s'), 'rss KiB', d.get('peak_rss_kib'))" "$WORK/r/$name.json")"
}

bench() { # NAME -- outbox bench args...
    local name=$1; shift
    local q
    q=$(quiet)
    OUTBOX_LOG=warn "$BIN" --config "$CFG" bench "$@" --json >"$WORK/r/$name.bench.json" 2>"$WORK/logs/$name.log" || log "$name failed: $(tail -2 "$WORK/logs/$name.log")"
    python3 - "$name" "$q" "$WORK/r/$name.bench.json" >"$WORK/r/$name.json" <<'PYEOF'
import json, sys
name, quiet, path = sys.argv[1:]
try:
    d = json.load(open(path))
except Exception as e:
    d = {"error": str(e)}
print(json.dumps({"kind": "bench", "name": name, "quiet": json.loads(quiet), **d}))
PYEOF
    log "$name: $(python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(round(d.get('events_per_second') or 0), 'ev/s', d.get('latency_ms', {}) and {k: d['latency_ms'][k] for k in ('p50','p99','max')}, 'cpu us/ev', d.get('relay_cpu_us_per_event'), 'rss MiB', d.get('peak_rss_mib'))" "$WORK/r/$name.json")"
}

if want replicas; then
    for sink in null nats; do
        for n in 1 2 4; do
            drain "replicas.$sink.$n" "$ROWS" "$n" "$sink" "$(config "rep-$sink" "$sink" 500 1)"
        done
    done
fi

if want memory; then
    drain "memory.relay.1m" "$BIG" 1 null "$(config mem null 500 2)"
    fresh_db
    CFG=$(config mem null 500 2)
    bench "memory.bench.1m" backlog --events "$BIG" --sink null
fi

if want batches; then
    for sink in null nats; do
        for b in $BATCHES; do
            fresh_db
            [[ $sink == nats ]] && reset_stream
            CFG=$(config "batch-$sink" nats "$b" 2)
            if [[ $sink == null ]]; then
                bench "batch.$sink.$b" backlog --events "$BENCH_ROWS" --sink null --batch-size "$b"
            else
                bench "batch.$sink.$b" backlog --events "$BENCH_ROWS" --batch-size "$b"
            fi
        done
    done
fi

if want latency; then
    for sink in nats null; do
        for r in $RATES; do
            fresh_db
            [[ $sink == nats ]] && reset_stream
            CFG=$(config "lat" nats 500 2)
            if [[ $sink == null ]]; then
                bench "latency.$sink.$r" steady --rate "$r" --duration "${SECONDS_LAT}s" --producers 4 --sink null
            else
                bench "latency.$sink.$r" steady --rate "$r" --duration "${SECONDS_LAT}s" --producers 4
            fi
        done
    done
fi

mkdir -p "$(dirname "$OUT")"
python3 - "$WORK/r" "$OUT" "$RELAY_SHA" <<'PYEOF'
import glob, json, os, platform, sys
rdir, out, sha = sys.argv[1:]
runs = [json.load(open(p)) for p in sorted(glob.glob(os.path.join(rdir, "*.json")))
        if not p.endswith((".drain.json", ".bench.json"))]
meta = {"relay_sha256_16": sha, "nproc": os.cpu_count(), "kernel": platform.release()}
json.dump({"meta": meta, "runs": runs}, open(out, "w"), indent=1)
print(out)
PYEOF
log "results: $OUT"
