#!/usr/bin/env bash
# MySQL/MariaDB benchmarks (issue 14), on a private MariaDB and nats-server (JetStream, file
# storage) started here on free ports:
#
#   - backlog drain, `outbox bench backlog`: the relay into JetStream and into the null sink,
#     `on_delivered` mark and delete, median of --repeat runs, a fresh database per run;
#   - the hand-written seed-style relay (scripts/bench/handwritten_relay_mysql.py) draining
#     the same backlog into the same JetStream: the baseline of the ratio;
#   - commit -> ack latency at 1,000 events/s, `outbox bench steady` (4 producers, one event
#     per transaction, 30 s) into JetStream;
#   - the same drain and latency with the binlog CDC source (`mode = "cdc"`).
#
# MariaDB runs with production durability: `innodb_flush_log_at_trx_commit = 1`, binlog on
# (ROW). Usage: scripts/bench/mysql.sh [--rows N] [--repeat K] [--build] [--only REGEX]
# (--only runs the scenarios whose key matches REGEX, e.g. `--only steady`).
# Needs: mariadb-server, nats-server, python3 (a venv with PyMySQL and nats-py is made in
# scripts/bench/.venv-mysql). Writes scripts/bench/results/mysql-<UTC date>.json.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
ROWS=100000
REPEAT=3
BUILD=0
ONLY=.
while [ $# -gt 0 ]; do
    case "$1" in
    --only) ONLY=$2; shift 2 ;;
    --rows) ROWS=$2; shift 2 ;;
    --repeat) REPEAT=$2; shift 2 ;;
    --build) BUILD=1; shift ;;
    -h | --help) sed -n 2,18p "$0"; exit 0 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
    esac
done
[ "$BUILD" = 1 ] && (cd "$ROOT" && cargo build --release -p outbox-cli)
BIN=${OUTBOX_BIN:-$ROOT/target/release/outbox}
[ -x "$BIN" ] || { echo "no relay binary at $BIN (use --build)" >&2; exit 1; }

VENV=$HERE/.venv-mysql
if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q PyMySQL nats-py
fi

# shellcheck source=../services.sh
source "$ROOT/scripts/services.sh"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/outbox-bench-mysql.XXXXXX")
trap 'services_stop "$WORK"; rm -rf "$WORK"' EXIT
SERVICES_MARIADB_FLUSH=1 services_start_mariadb "$WORK"
services_start_nats "$WORK"
MYSQL_URL=$OUTBOX_TEST_MYSQL_URL
NATS_URL=$OUTBOX_TEST_NATS_URL
RESULTS=$WORK/results.jsonl
: >"$RESULTS"

n=0
# Sets DB_URL to a new database and n to its number (no subshell: n must persist).
fresh_db() {
    n=$((n + 1))
    local db="bench_$n"
    "$VENV/bin/python" - "$MYSQL_URL" "$db" <<'PY'
import sys
from urllib.parse import urlparse
import pymysql
u = urlparse(sys.argv[1])
c = pymysql.connect(host=u.hostname, port=u.port, user=u.username or "root", password=u.password or "")
c.cursor().execute(f"CREATE DATABASE {sys.argv[2]}")
c.close()
PY
    DB_URL="$MYSQL_URL/$db"
}

config() { # URL SINK ON_DELIVERED STREAM [MODE]
    cat <<TOML
[source]
kind = "mysql"
url = "$1"
on_delivered = "$3"
mode = "${5:-poll}"
[relay]
batch_size = 500
[sink]
kind = "nats"
url = "$NATS_URL"
stream = "$4"
destination = "$4.{aggregate_type}"
TOML
}

record() { # KEY JSON_FILE
    "$VENV/bin/python" - "$1" "$2" >>"$RESULTS" <<'PY'
import json, sys
r = json.load(open(sys.argv[2]))
r["scenario"] = sys.argv[1]
print(json.dumps(r))
PY
}

backlog() { # KEY SINK ON_DELIVERED [MODE]
    local i url
    for i in $(seq 1 "$REPEAT"); do
        fresh_db
        url=$DB_URL
        config "$url" "$2" "$3" "B$n" "${4:-poll}" >"$WORK/b$n.toml"
        "$BIN" migrate -c "$WORK/b$n.toml" >/dev/null
        "$BIN" bench backlog -c "$WORK/b$n.toml" --events "$ROWS" --sink "$2" --json \
            >"$WORK/b$n.json" 2>>"$WORK/bench.log"
        record "$1" "$WORK/b$n.json"
        echo "bench: $1 run $i done" >&2
    done
}

handwritten() {
    local i url
    for i in $(seq 1 "$REPEAT"); do
        fresh_db
        url=$DB_URL
        config "$url" config mark "H$n" >"$WORK/h$n.toml"
        "$BIN" migrate -c "$WORK/h$n.toml" >/dev/null
        # The same backlog as `outbox bench backlog`: ROWS events over 1,000 aggregates,
        # ~200-byte payloads, written with the producer library (the relay is not started).
        "$VENV/bin/python" - "$url" "$ROWS" <<'PY'
import sys
from urllib.parse import urlparse
import pymysql
u = urlparse(sys.argv[1]); rows = int(sys.argv[2])
c = pymysql.connect(host=u.hostname, port=u.port, user=u.username or "root", password=u.password or "", database=u.path.lstrip("/"))
cur = c.cursor()
pad = "x" * 180
for start in range(0, rows, 1000):
    vals = [("Order", f"o_{i % 1000}", "order.changed", f'{{"n":{i},"pad":"{pad}"}}') for i in range(start, min(rows, start + 1000))]
    cur.executemany("INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES (%s, %s, %s, %s)", vals)
    c.commit()
c.close()
PY
        "$VENV/bin/python" - "$NATS_URL" "H$n" <<'PY'
import asyncio, sys, nats
async def main():
    nc = await nats.connect(sys.argv[1]); js = nc.jetstream()
    await js.add_stream(name=sys.argv[2], subjects=[f"{sys.argv[2]}.>"])
    await nc.drain()
asyncio.run(main())
PY
        "$VENV/bin/python" "$HERE/handwritten_relay_mysql.py" --db-url "$url" --nats-url "$NATS_URL" \
            --subject-prefix "H$n" --until-empty >"$WORK/h$n.out" 2>>"$WORK/bench.log"
        read -r delivered elapsed rate <"$WORK/h$n.out"
        echo "{\"scenario\":\"nats.handwritten\",\"events\":$delivered,\"elapsed_seconds\":$elapsed,\"events_per_second\":$rate}" >>"$RESULTS"
        echo "bench: nats.handwritten run $i done ($rate ev/s)" >&2
    done
}

steady() { # KEY [MODE]
    local url
    fresh_db
    url=$DB_URL
    config "$url" config mark "S$n" "${2:-poll}" >"$WORK/s$n.toml"
    "$BIN" migrate -c "$WORK/s$n.toml" >/dev/null
    "$BIN" bench steady -c "$WORK/s$n.toml" --rate 1000 --duration 30s --json \
        >"$WORK/s$n.json" 2>>"$WORK/bench.log"
    record "$1" "$WORK/s$n.json"
    echo "bench: $1 done" >&2
}

want() { echo "$1" | grep -Eq -- "$ONLY"; }
want nats.relay.mark && backlog nats.relay.mark config mark
want nats.relay.delete && backlog nats.relay.delete config delete
want null.relay.mark && backlog null.relay.mark null mark
want null.relay.delete && backlog null.relay.delete null delete
want nats.cdc && backlog nats.cdc config mark cdc
want null.cdc && backlog null.cdc null mark cdc
want nats.handwritten && handwritten
want nats.steady.1000 && steady nats.steady.1000
want nats.steady.cdc.1000 && steady nats.steady.cdc.1000 cdc

mkdir -p "$HERE/results"
OUT=$HERE/results/mysql-$(date -u +%Y-%m-%d-%H%M).json
"$VENV/bin/python" - "$RESULTS" "$OUT" "$ROWS" "$(git -C "$ROOT" rev-parse --short HEAD)" <<'PY'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
out = {"rows": int(sys.argv[3]), "commit": sys.argv[4], "runs": runs, "median": {}}
for key in sorted({r["scenario"] for r in runs}):
    rs = [r for r in runs if r["scenario"] == key]
    out["median"][key] = statistics.median(r["events_per_second"] for r in rs)
json.dump(out, open(sys.argv[2], "w"), indent=1)
print("| scenario | median events/s | each run |")
print("| --- | ---: | --- |")
for key, med in out["median"].items():
    each = " · ".join(f"{r['events_per_second']/1000:.1f}k" for r in runs if r["scenario"] == key)
    print(f"| `{key}` | {med:,.0f} | {each} |")
m = out["median"]
if "nats.handwritten" in m:
    for k in ("nats.relay.mark", "nats.relay.delete", "nats.cdc"):
        if k in m:
            print(f"ratio {k} / handwritten: {m[k] / m['nats.handwritten']:.1f}x")
for r in runs:
    if r["scenario"].startswith("nats.steady"):
        lat = r.get("latency_ms", {})
        print(f"{r['scenario']}: commit -> ack at 1,000 ev/s: p50 {lat.get('p50')} / p90 {lat.get('p90')} / p99 {lat.get('p99')} ms")
print(f"results: {sys.argv[2]}")
PY
