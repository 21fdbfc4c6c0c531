#!/usr/bin/env bash
# Cost of the payload options (docs/payloads.md): drain rate with encryption off and on, and
# the commit -> ack latency that a claim-check store write adds.
#
#   scripts/bench/payload.sh [--events N] [--rounds R]
#
# Starts moto (S3 and KMS) on a free port of 127.0.0.1, makes a KMS key and a bucket. Then,
# with `outbox bench` (release build: target/release/outbox, or OUTBOX_BIN), SQLite outbox and
# the null sink (acknowledges at once: the figure is the relay's own cost):
# - drain: N events (default 50,000) of 200 bytes, with no payload option, `encryption` with a
#   file key (whole payload), with one `fields` entry, and with an `aws-kms:` key;
# - latency: 50 events/s for 20 s of 64 KiB payloads, with no option, `claim_check` to a
#   file store and to S3 (moto), `above = "1KiB"` so every event is offloaded.
# Prints one JSON object per run on stdout; a summary table (medians) on stderr.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
# shellcheck source=scripts/services.sh
source scripts/services.sh

events=50000
rounds=3
while [ $# -gt 0 ]; do
    case "$1" in
    --events) events=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
    esac
done
bin=${OUTBOX_BIN:-$PWD/target/release/outbox}
[ -x "$bin" ] || { echo "build it first: cargo build --release -p outbox-cli" >&2; exit 2; }
moto=$(services_moto_bin) || { echo "moto_server not found (scripts/services.sh installs it)" >&2; exit 2; }
work=$(mktemp -d)
port=$(services_free_port)
"$moto" -H 127.0.0.1 -p "$port" >"$work/moto.log" 2>&1 &
moto_pid=$!
trap 'kill $moto_pid 2>/dev/null; rm -rf "$work"' EXIT
export AWS_ACCESS_KEY_ID=testing AWS_SECRET_ACCESS_KEY=testing AWS_REGION=us-east-1 \
    AWS_DEFAULT_REGION=us-east-1 AWS_EC2_METADATA_DISABLED=true
endpoint="http://127.0.0.1:$port"
key=""
for _ in $(seq 1 100); do
    key=$(python3 - "$endpoint" <<'PY' 2>/dev/null
import sys, boto3
e = sys.argv[1]
boto3.client("s3", endpoint_url=e).create_bucket(Bucket="bench-claims")
print(boto3.client("kms", endpoint_url=e).create_key()["KeyMetadata"]["KeyId"])
PY
) && break
    sleep 0.2
done
[ -n "$key" ] || { echo "moto did not answer: $(cat "$work/moto.log")" >&2; exit 1; }
head -c 32 /dev/urandom >"$work/key"
cd "$work"
cfg() { printf '[source]\nkind = "sqlite"\npath = "%s.db"\n[sink]\nkind = "stdout"\n%s\n' "$1" "$2" >"$1.toml"; }
cfg off ""
cfg enc_file "encryption = { key = \"file:$work/key\" }"
cfg enc_fields "encryption = { key = \"file:$work/key\", fields = [\"order_id\"] }"
cfg enc_kms "encryption = { key = \"aws-kms:$key\", endpoint_url = \"$endpoint\", region = \"us-east-1\" }"
cfg cc_file "claim_check = { store = \"file://$work/claims\", above = \"1KiB\" }"
cfg cc_s3 "claim_check = { store = \"s3://bench-claims/bench\", above = \"1KiB\", endpoint_url = \"$endpoint\", region = \"us-east-1\" }"
run() { # config, then the bench arguments
    local c=$1; shift
    rm -f "$c.db"*
    "$bin" migrate --config "$c.toml" >/dev/null
    printf '{"config":"%s","report":%s}\n' "$c" "$("$bin" bench "$@" --config "$c.toml" --sink null --json 2>/dev/null | tr -d '\n')"
}
for _ in $(seq 1 "$rounds"); do
    for c in off enc_file enc_fields enc_kms; do
        run "$c" backlog --events "$events" --payload-bytes 200
    done
    for c in off cc_file cc_s3; do
        run "$c" steady --rate 50 --duration 20s --payload-bytes 65536
    done
done | tee "$work/results.jsonl"
python3 - "$work/results.jsonl" >&2 <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
med = lambda xs: statistics.median(xs)
print("| config | events/s | relay CPU µs/event | commit->ack p50 ms | p99 ms |")
print("| --- | ---: | ---: | ---: | ---: |")
for c in ["off", "enc_file", "enc_fields", "enc_kms"]:
    rs = [r["report"] for r in rows if r["config"] == c and r["report"]["mode"] == "backlog"]
    print(f"| drain {c} | {med([r['events_per_second'] for r in rs]):,.0f} | {med([r['relay_cpu_us_per_event'] for r in rs]):.1f} | | |")
for c in ["off", "cc_file", "cc_s3"]:
    rs = [r["report"] for r in rows if r["config"] == c and r["report"]["mode"] == "steady"]
    print(f"| 64 KiB at 50/s, {c} | | | {med([r['latency_ms']['p50'] for r in rs]):.1f} | {med([r['latency_ms']['p99'] for r in rs]):.1f} |")
PY
