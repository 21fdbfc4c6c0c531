#!/usr/bin/env bash
# One subscription's broker down for a minute: does the other keep its latency, and does the
# down one catch up with nothing lost? (issue 17's figure; docs/subscriptions.md)
#
#   scripts/bench/fanout_outage.sh [--rate R] [--outage SECONDS] [--baseline SECONDS]
#
# Starts PostgreSQL (scripts/services.sh) and two nats-servers on free ports of 127.0.0.1,
# then one `outbox relay` (release build: target/release/outbox, or OUTBOX_BIN) with two
# subscriptions, `healthy` -> the first NATS and `partner` -> the second. pgbench commits one
# event per transaction at R events/s (default 500) throughout:
#   1. baseline (default 30 s): both brokers up;
#   2. outage (default 60 s): the partner's nats-server is stopped (SIGTERM);
#   3. recovery: it is started again on the same port and store; timed until the partner's
#      table has nothing pending.
# p50/p99 commit -> ack of each subscription per phase come from the relay's own histogram
# (outbox_commit_to_ack_seconds{subscription=...}, bucket bounds 1, 2.5, 5, 10, 20, 50, 100,
# 250 ms, ...: a quantile is reported as the bucket bound it falls under). Afterwards every
# committed event is counted in both JetStream streams (distinct ids). Results: a Markdown
# table on stdout and scripts/bench/results/fanout-outage-<date>.json.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
# shellcheck source=scripts/services.sh
source scripts/services.sh

rate=500
outage=60
baseline=30
while [ $# -gt 0 ]; do
    case "$1" in
    --rate) rate=$2; shift 2 ;;
    --outage) outage=$2; shift 2 ;;
    --baseline) baseline=$2; shift 2 ;;
    -h | --help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
done
case "$rate$outage$baseline" in *[!0-9]*) echo "options take whole numbers" >&2; exit 2 ;; esac

bin=${OUTBOX_BIN:-target/release/outbox}
[ -x "$bin" ] || { echo "no relay binary at $bin: cargo build --release -p outbox-cli" >&2; exit 1; }
work=$(mktemp -d "${TMPDIR:-/tmp}/outbox-fanout-outage.XXXXXX")
relay_pid=
partner_pid=
cleanup() {
    [ -n "$relay_pid" ] && kill -TERM "$relay_pid" 2>/dev/null || true
    [ -n "$partner_pid" ] && kill -TERM "$partner_pid" 2>/dev/null || true
    services_stop "$work"
    rm -rf "$work"
}
trap cleanup EXIT
services_install
services_start_postgres "$work"
services_start_nats "$work"
healthy_url=$OUTBOX_TEST_NATS_URL
pg=$OUTBOX_TEST_DATABASE_URL
pgbin=$(services_pg_bindir)

partner_port=$(services_free_port)
start_partner() {
    "$(services_nats_bin)" -a 127.0.0.1 -p "$partner_port" -js -sd "$work/partner-js" \
        </dev/null >>"$work/partner.log" 2>&1 &
    partner_pid=$!
    for _i in $(seq 1 300); do
        (exec 3<>"/dev/tcp/127.0.0.1/$partner_port") 2>/dev/null && return 0
        sleep 0.1
    done
    echo "partner nats-server did not start" >&2
    exit 1
}
start_partner

db="fanout_outage_$$"
psql -q "$pg" -c "CREATE DATABASE $db" >/dev/null
url="${pg%/*}/$db"
metrics_port=$(services_free_port)
config="$work/outbox.toml"
cat >"$config" <<TOML
[source]
kind = "postgres"
url = "$url"
[metrics]
listen = "127.0.0.1:$metrics_port"
refresh_interval = "1s"
[sinks.healthy]
kind = "nats"
url = "$healthy_url"
stream = "HEALTHY"
destination = "healthy.{aggregate_type}"
[sinks.partner]
kind = "nats"
url = "nats://127.0.0.1:$partner_port"
stream = "PARTNER"
destination = "partner.{aggregate_type}"
connect_timeout = "1s"
ack_timeout = "2s"
[[subscription]]
name = "healthy"
sink = "healthy"
[[subscription]]
name = "partner"
sink = "partner"
TOML
"$bin" migrate --config "$config" >/dev/null
OUTBOX_LOG=warn "$bin" relay --config "$config" 2>"$work/relay.log" &
relay_pid=$!
for _i in $(seq 1 300); do
    curl -sf "http://127.0.0.1:$metrics_port/readyz" >/dev/null && break
    sleep 0.1
done

scrape() { curl -sf "http://127.0.0.1:$metrics_port/metrics" >"$1"; }
# quantile Q of subscription S between two scrapes: the first bucket bound whose count
# difference reaches Q of the total difference.
quantile() {
    awk -v q="$1" -v s="subscription=\"$2\"" '
        FNR == 1 { file++ }
        /^outbox_commit_to_ack_seconds_bucket/ && index($0, s) {
            match($0, /le="[^"]*"/); le = substr($0, RSTART + 4, RLENGTH - 5)
            if (file == 1) before[le] = $NF; else { after[le] = $NF; order[++n] = le }
        }
        END {
            total = after["+Inf"] - before["+Inf"]
            if (total <= 0) { print "n/a"; exit }
            for (i = 1; i <= n; i++) {
                if (after[order[i]] - before[order[i]] >= q * total) {
                    le = order[i]; if (le == "+Inf") print ">60 s"; else printf "<= %g ms\n", le * 1000; exit
                }
            }
        }' "$3" "$4"
}
produce() {
    "$pgbin/pgbench" -n -f scripts/bench/produce.pgbench -R "$rate" -T "$1" -c 4 -j 2 "$url" >"$work/pgbench-$2.log" 2>&1
}
pending() { psql -qtA "$url" -c "SELECT count(*) FROM outbox_sub_$1 WHERE state = 'pending'"; }

scrape "$work/m0"
produce "$baseline" baseline
scrape "$work/m1"
kill -TERM "$partner_pid"; wait "$partner_pid" 2>/dev/null || true; partner_pid=
produce "$outage" outage
scrape "$work/m2"
backlog=$(pending partner)
healthy_left=$(pending healthy)
start_partner
recover_start=$(date +%s.%N)
while [ "$(pending partner)" != 0 ]; do sleep 0.1; done
recover=$(awk -v s="$recover_start" -v e="$(date +%s.%N)" 'BEGIN { printf "%.1f", e - s }')
sleep 2
scrape "$work/m3"
committed=$(psql -qtA "$url" -c "SELECT count(*) FROM outbox")
lost_partner=$(psql -qtA "$url" -c "SELECT count(*) FROM outbox_sub_partner WHERE state <> 'delivered'")
lost_healthy=$(psql -qtA "$url" -c "SELECT count(*) FROM outbox_sub_healthy WHERE state <> 'delivered'")

printf '| phase | healthy p50 | healthy p99 | partner p50 | partner p99 |\n| --- | --- | --- | --- | --- |\n'
for phase in "baseline ${baseline}s:m0:m1" "partner down ${outage}s:m1:m2" "partner catching up:m2:m3"; do
    IFS=: read -r name a b <<<"$phase"
    printf '| %s | %s | %s | %s | %s |\n' "$name" \
        "$(quantile 0.5 healthy "$work/$a" "$work/$b")" "$(quantile 0.99 healthy "$work/$a" "$work/$b")" \
        "$(quantile 0.5 partner "$work/$a" "$work/$b")" "$(quantile 0.99 partner "$work/$a" "$work/$b")"
done
echo
echo "rate $rate ev/s; committed $committed; at the end of the outage: partner backlog $backlog, healthy backlog $healthy_left; partner caught up in ${recover}s; not delivered at the end: healthy $lost_healthy, partner $lost_partner"
mkdir -p scripts/bench/results
out="scripts/bench/results/fanout-outage-$(date +%Y-%m-%d-%H%M).json"
printf '{"machine":"%s, %s cores","rate":%s,"baseline_s":%s,"outage_s":%s,"committed":%s,"partner_backlog_at_outage_end":%s,"healthy_backlog_at_outage_end":%s,"partner_catch_up_s":%s,"healthy_p99_baseline":"%s","healthy_p99_outage":"%s","undelivered_healthy":%s,"undelivered_partner":%s}\n' \
    "$(uname -r)" "$(nproc)" "$rate" "$baseline" "$outage" "$committed" "$backlog" "$healthy_left" "$recover" \
    "$(quantile 0.99 healthy "$work/m0" "$work/m1")" "$(quantile 0.99 healthy "$work/m1" "$work/m2")" "$lost_healthy" "$lost_partner" >"$out"
echo "results: $out" >&2
