#!/usr/bin/env bash
# Drain rate of a backlog into each broker (issue 4's figure):
#
#   scripts/bench/drain_brokers.sh [--events N] [--cloud-events N] [--batch B]
#       [--sinks "file http http-batched nats redis rabbitmq kafka sqs sns kinesis pubsub"]
#
# Starts PostgreSQL, nats-server, tansu (Kafka protocol), redis-server and RabbitMQ on free
# ports of 127.0.0.1 (scripts/services.sh: PostgreSQL with fsync=off, as the tests run it),
# then for each sink: a fresh database, `outbox migrate`, N events (default 100,000; 1,000
# aggregates, ~40-byte JSON bodies) written with one INSERT ... SELECT, then one
# `outbox relay` (release build: target/release/outbox, or OUTBOX_BIN) timed from its start
# until no row is pending, then SIGTERM. Reports events/s and the relay's CPU seconds.
# `file` is the JSON-lines file sink on /dev/null: the database + relay reference, no broker.
# `http` posts each event to a local receiver that answers 200 and keeps nothing
# (examples/discard_receiver.rs, release build; target/release/examples/discard_receiver or
# DISCARD_RECEIVER_BIN), with the sink's default `max_concurrency` (64); `http-batched` is
# the same with `events_per_request = 100` (JSON lines, many events per POST).
# With rabbitmq, a third-party client (aio-pika, scripts/bench/rabbitmq_client.py) then
# publishes as many messages the same way to the same broker: the broker's own ceiling.
# The cloud sinks publish to local stand-ins: sqs (a standard queue), sns (a standard topic)
# and kinesis (4 shards) to one moto server, pubsub to the Cloud SDK's emulator (skipped when
# it is not installed); they drain --cloud-events (default 1,000) events. Their events/s
# measure those Python and Java servers, not AWS or Google: moto serves a few hundred requests
# a second at best, and its FIFO queues slow down with every message they hold (seconds per
# call past a few hundred), so FIFO is not benchmarked here. The relay's CPU per event is the
# figure that carries over.
#
# Everything lives in a temporary directory removed at exit. Results: a Markdown table on
# stdout and scripts/bench/results/brokers-<date>.json.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
# shellcheck source=scripts/services.sh
source scripts/services.sh

events=100000
batch=500
cloud_events=1000
sinks="file http nats redis rabbitmq kafka sqs sns kinesis pubsub"
while [ $# -gt 0 ]; do
    case "$1" in
    --events) events=$2; shift 2 ;;
    --cloud-events) cloud_events=$2; shift 2 ;;
    --batch) batch=$2; shift 2 ;;
    --sinks) sinks=$2; shift 2 ;;
    -h | --help) sed -n '2,25p' "$0"; exit 0 ;;
    *) echo "unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
done
case "$events$cloud_events$batch" in *[!0-9]*) echo "--events and --batch take whole numbers" >&2; exit 2 ;; esac

bin=${OUTBOX_BIN:-target/release/outbox}
[ -x "$bin" ] || { echo "no relay binary at $bin: cargo build --release -p outbox-cli" >&2; exit 1; }
venv=scripts/bench/.venv
if [[ " $sinks " == *" rabbitmq "* ]]; then
    [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
    "$venv/bin/python" -c 'import pika, aio_pika' 2>/dev/null || "$venv/bin/pip" install -q pika aio-pika
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/outbox-drain-brokers.XXXXXX")
relay_pid=
receiver_pid=
moto_pid=
pubsub_pid=
cleanup() {
    [ -n "$relay_pid" ] && kill -TERM "$relay_pid" 2>/dev/null || true
    [ -n "$moto_pid" ] && kill -TERM "$moto_pid" 2>/dev/null || true
    [ -n "$receiver_pid" ] && kill -TERM "$receiver_pid" 2>/dev/null || true
    [ -n "$pubsub_pid" ] && kill -TERM -- "-$pubsub_pid" 2>/dev/null || true
    services_stop "$work"
    rm -rf "$work"
}
trap cleanup EXIT
services_install
services_start_all "$work"
pg=$OUTBOX_TEST_DATABASE_URL
ticks=$(getconf CLK_TCK)

# The consumer side RabbitMQ needs (mandatory publishing: a queue must be bound).
rabbit_queue() {
    "$venv/bin/python" - "$OUTBOX_TEST_AMQP_URL" <<'PY'
import sys, pika
c = pika.BlockingConnection(pika.URLParameters(sys.argv[1]))
ch = c.channel()
ch.exchange_declare("bench", "topic", durable=True)
ch.queue_declare("bench", durable=True)
ch.queue_purge("bench")
ch.queue_bind("bench", "bench", "bench.#")
c.close()
PY
}

# moto's server for the AWS sinks, and the resources they publish to (created with boto3).
export AWS_ACCESS_KEY_ID=bench AWS_SECRET_ACCESS_KEY=bench AWS_REGION=us-east-1 \
    AWS_DEFAULT_REGION=us-east-1 AWS_EC2_METADATA_DISABLED=true
moto_url=
start_moto() {
    [ -n "$moto_url" ] && return 0
    local port
    port=$(services_free_port)
    "$(services_moto_bin)" -H 127.0.0.1 -p "$port" >"$work/moto.log" 2>&1 &
    moto_pid=$!
    for _i in $(seq 1 200); do
        if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
            moto_url="http://127.0.0.1:$port"
            return 0
        fi
        sleep 0.05
    done
    echo "moto did not start" >&2
    return 1
}
aws_setup() {
    python3 - "$moto_url" "$1" <<'PY'
import sys, boto3
endpoint, what = sys.argv[1:]
if what == "sqs":
    print(boto3.client("sqs", endpoint_url=endpoint).create_queue(QueueName="bench")["QueueUrl"])
elif what == "sns":
    print(boto3.client("sns", endpoint_url=endpoint).create_topic(Name="bench")["TopicArn"])
else:
    k = boto3.client("kinesis", endpoint_url=endpoint)
    k.create_stream(StreamName="bench", ShardCount=4)
    print("bench")
PY
}
# The Pub/Sub emulator (Cloud SDK), when installed.
pubsub_host=
start_pubsub() {
    [ -n "$pubsub_host" ] && return 0
    local emulator port
    emulator=${OUTBOX_TEST_PUBSUB_EMULATOR:-/usr/lib/google-cloud-sdk/platform/pubsub-emulator/bin/cloud-pubsub-emulator}
    [ -x "$emulator" ] || { echo "pubsub: no emulator at $emulator; skipped" >&2; return 1; }
    port=$(services_free_port)
    setsid "$emulator" --host=127.0.0.1 --port="$port" >"$work/pubsub.log" 2>&1 &
    pubsub_pid=$!
    for _i in $(seq 1 1200); do
        if curl -sf -X PUT "http://127.0.0.1:$port/v1/projects/proj-bench/topics/bench" >/dev/null 2>&1 ||
            curl -s "http://127.0.0.1:$port/v1/projects/proj-bench/topics/bench" | grep -q '"name"'; then
            pubsub_host="127.0.0.1:$port"
            return 0
        fi
        sleep 0.05
    done
    echo "the Pub/Sub emulator did not start" >&2
    return 1
}

# The webhook receiver for the http sink.
receiver_url=
start_receiver() {
    [ -n "$receiver_url" ] && return 0
    local receiver port
    receiver=${DISCARD_RECEIVER_BIN:-target/release/examples/discard_receiver}
    [ -x "$receiver" ] || {
        echo "http: no receiver at $receiver: cargo build --release -p outbox-cli --example discard_receiver" >&2
        return 1
    }
    port=$(services_free_port)
    "$receiver" "127.0.0.1:$port" >"$work/receiver.log" 2>&1 &
    receiver_pid=$!
    for _i in $(seq 1 200); do
        if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
            receiver_url="http://127.0.0.1:$port/hooks/{aggregate_type}"
            return 0
        fi
        sleep 0.05
    done
    echo "the discard receiver did not start" >&2
    return 1
}

sink_toml() {
    case "$1" in
    file) printf '[sink]\nkind = "file"\npath = "/dev/null"\n' ;;
    http) printf '[sink]\nkind = "http"\nurl = "%s"\n' "$receiver_url" ;;
    http-batched) printf '[sink]\nkind = "http"\nurl = "%s"\nevents_per_request = 100\n' "$receiver_url" ;;
    nats) printf '[sink]\nkind = "nats"\nurl = "%s"\nstream = "BENCH"\ndestination = "bench.{aggregate_type}"\n' "$OUTBOX_TEST_NATS_URL" ;;
    redis) printf '[sink]\nkind = "redis"\nurl = "%s"\ndestination = "bench.{aggregate_type}"\n' "$OUTBOX_TEST_REDIS_URL" ;;
    rabbitmq) printf '[sink]\nkind = "rabbitmq"\nurl = "%s"\nexchange = "bench"\ndestination = "bench.{aggregate_type}"\n' "$OUTBOX_TEST_AMQP_URL" ;;
    kafka) printf '[sink]\nkind = "kafka"\nbrokers = "%s"\ndestination = "bench-{aggregate_type}"\ncreate_topics = true\ntopic_partitions = 4\n' "$OUTBOX_TEST_KAFKA_BROKERS" ;;
    sqs) printf '[sink]\nkind = "sqs"\nqueue_url = "%s"\nendpoint_url = "%s"\n' "$(aws_setup sqs)" "$moto_url" ;;
    sns) printf '[sink]\nkind = "sns"\ntopic_arn = "%s"\nendpoint_url = "%s"\n' "$(aws_setup sns)" "$moto_url" ;;
    kinesis) printf '[sink]\nkind = "kinesis"\nstream = "%s"\nendpoint_url = "%s"\n' "$(aws_setup kinesis)" "$moto_url" ;;
    pubsub) printf '[sink]\nkind = "pubsub"\nproject = "proj-bench"\ntopic = "bench"\nendpoint = "%s"\n' "$pubsub_host" ;;
    *) echo "unknown sink $1" >&2; return 1 ;;
    esac
}

results=()
printf '| sink | events | seconds | events/s | relay CPU s | CPU µs/event |\n| --- | ---: | ---: | ---: | ---: | ---: |\n'
for sink in $sinks; do
    n=$events
    case "$sink" in
    sqs | sns | kinesis) start_moto; n=$cloud_events ;;
    pubsub) start_pubsub || continue; n=$cloud_events ;;
    http | http-batched) start_receiver || continue ;;
    esac
    db="drain_${sink//-/_}_$$"
    psql -q "$pg" -c "CREATE DATABASE $db" >/dev/null
    url="${pg%/*}/$db"
    [ "$sink" = rabbitmq ] && rabbit_queue
    config="$work/$sink.toml"
    {
        printf '[source]\nkind = "postgres"\nurl = "%s"\non_delivered = "mark"\n' "$url"
        printf '[relay]\nbatch_size = %s\n' "$batch"
        sink_toml "$sink"
    } >"$config"
    "$bin" migrate --config "$config" >/dev/null 2>"$work/$sink.migrate.log"
    psql -q "$url" -c "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
        SELECT 'Order', 'o_' || (g % 1000), 'order.placed',
               convert_to('{\"order_id\":\"o_' || (g % 1000) || '\",\"n\":' || g || '}', 'UTF8')
        FROM generate_series(1, $n) AS g" >/dev/null
    psql -q "$url" -c "VACUUM ANALYZE outbox" >/dev/null

    start=$(date +%s.%N)
    OUTBOX_LOG=warn "$bin" relay --config "$config" 2>"$work/$sink.relay.log" &
    relay_pid=$!
    while :; do
        pending=$(psql -qtA "$url" -c "SELECT count(*) FROM outbox WHERE state = 'pending'")
        [ "$pending" = 0 ] && break
        if ! kill -0 "$relay_pid" 2>/dev/null; then
            echo "relay for $sink died:" >&2
            tail -n 20 "$work/$sink.relay.log" >&2
            exit 1
        fi
        sleep 0.02
    done
    end=$(date +%s.%N)
    read -r utime stime < <(awk '{print $14, $15}' "/proc/$relay_pid/stat")
    kill -TERM "$relay_pid"
    wait "$relay_pid" || { echo "relay for $sink exited non-zero" >&2; tail -n 20 "$work/$sink.relay.log" >&2; }
    relay_pid=
    read -r secs rate cpu per_event < <(awk -v s="$start" -v e="$end" -v n="$n" \
        -v u="$utime" -v k="$stime" -v t="$ticks" \
        'BEGIN { d = e - s; c = (u + k) / t; printf "%.2f %.0f %.2f %.1f\n", d, n / d, c, c * 1e6 / n }')
    printf '| %s | %s | %s | %s | %s | %s |\n' "$sink" "$n" "$secs" "$rate" "$cpu" "$per_event"
    results+=("{\"sink\":\"$sink\",\"events\":$n,\"batch\":$batch,\"seconds\":$secs,\"events_per_second\":$rate,\"relay_cpu_seconds\":$cpu}")
    psql -q "$pg" -c "DROP DATABASE $db" >/dev/null
    if [ "$sink" = rabbitmq ]; then
        # The broker's side of the figure: a third-party client (aio-pika) publishing the
        # same kind of messages the same way, no database, no relay.
        rabbit_queue
        client_rate=$("$venv/bin/python" scripts/bench/rabbitmq_client.py "$OUTBOX_TEST_AMQP_URL" "$n" "$batch")
        printf '| (aio-pika client, no relay) | %s | | %s | | |\n' "$n" "$client_rate"
        results+=("{\"sink\":\"rabbitmq-aio-pika-client\",\"events\":$n,\"events_per_second\":$client_rate}")
    fi
done

mkdir -p scripts/bench/results
out="scripts/bench/results/brokers-$(date +%Y-%m-%d-%H%M).json"
{
    printf '{"machine":"%s, %s cores","results":[' "$(uname -r)" "$(nproc)"
    (IFS=,; printf '%s' "${results[*]}")
    printf ']}\n'
} >"$out"
echo "results: $out" >&2
