#!/usr/bin/env bash
# Runs the same `outbox bench` workloads with two builds of the relay, alternating, so a
# refactor can be checked for speed: the backlog drain (SQLite and PostgreSQL polling, null
# sink) and a steady rate with latency (PostgreSQL polling, null sink).
#
#   scripts/bench/compare_binaries.sh OLD_BINARY NEW_BINARY [ROUNDS]
#
# Starts its own PostgreSQL (scripts/services.sh) in a temporary directory; each run gets a
# fresh database or SQLite file. Prints one line per run: binary, workload, events/s,
# p50/p99 latency where measured.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
# shellcheck source=scripts/services.sh
source scripts/services.sh

old=$1 new=$2 rounds=${3:-2}
work=$(mktemp -d "${TMPDIR:-/tmp}/outbox-compare.XXXXXX")
trap 'services_stop "$work" >/dev/null 2>&1; rm -rf "$work"' EXIT
services_start_postgres "$work" 2>/dev/null
base=${OUTBOX_TEST_DATABASE_URL%/postgres}
psql=$(cat "$work/postgres/bindir")/psql

run() { # run LABEL BINARY WORKLOAD N
    local label=$1 bin=$2 workload=$3 n=$4 cfg db
    cfg="$work/$label-$workload-$n.toml"
    case $workload in
    sqlite-backlog)
        printf '[source]\nkind = "sqlite"\npath = "%s/%s-%s.db"\n' "$work" "$label" "$n" >"$cfg"
        "$bin" -c "$cfg" bench backlog --events 50000 --sink null --json ;;
    pg-backlog | pg-steady)
        db="b_${label}_${workload//-/_}_$n"
        "$psql" -q "$base/postgres" -c "CREATE DATABASE $db" >/dev/null
        printf '[source]\nkind = "postgres"\nurl = "%s/%s"\n' "$base" "$db" >"$cfg"
        if [ "$workload" = pg-backlog ]; then
            "$bin" -c "$cfg" bench backlog --events 100000 --sink null --json
        else
            "$bin" -c "$cfg" bench steady --rate 1000 --duration 10s --sink null --json
        fi ;;
    esac 2>/dev/null | python3 -c '
import json, sys
r = json.load(sys.stdin)
lat = r.get("latency_ms") or {}
eps, p50, p99 = r["events_per_second"], lat.get("p50", "-"), lat.get("p99", "-")
print(f"{sys.argv[1]:4} {sys.argv[2]:15} {eps:10.0f} ev/s  p50 {p50} ms  p99 {p99} ms")
' "$label" "$workload"
}

for n in $(seq 1 "$rounds"); do
    for workload in sqlite-backlog pg-backlog pg-steady; do
        run old "$old" "$workload" "$n"
        run new "$new" "$workload" "$n"
    done
done
