//! End to end through the binary for the AWS sinks, on moto's server: plain-SQL producers,
//! PostgreSQL, `outbox relay`, and a consumer written with boto3 (the AWS SDK for Python, as a
//! consuming team would write it; `tests/support/aws_consumer.py`). Checks that every event
//! arrives with its exact bytes and headers, that each aggregate keeps its order, and the
//! FIFO group ids (the aggregate id, or the documented digest of one SQS cannot take).

mod support;

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, ensure};
use base64::Engine as _;
use outbox_testkit::services::{Moto, Postgres};
use sha2::Digest as _;
use support::{Workdir, terminate, wait_drained};

/// Aggregates the producers write to; the last is not a legal SQS group id (non-ASCII, space).
const AGGREGATES: [&str; 4] = ["o_1", "o_2", "o_3", "\u{5ba2}\u{6237} 7"];
/// Events per aggregate.
const PER_AGGREGATE: usize = 6;

fn unique() -> String {
    format!("t{}", &uuid::Uuid::now_v7().simple().to_string()[20..])
}

/// One event as the database holds it.
#[derive(Debug, Clone)]
struct Row {
    id: String,
    aggregate_id: String,
    payload: Vec<u8>,
    /// The four contract headers, `aggregate_seq` and the row's own.
    headers: HashMap<String, String>,
}

/// Migrates a fresh database for `sink` and writes the events, interleaving aggregates, each
/// in its own transaction: JSON text, one binary payload, one empty payload, one event with
/// twelve headers (more than SQS' ten attributes). Returns the rows in per-aggregate order.
async fn produce(work: &Workdir, sink: &str) -> anyhow::Result<(sqlx::PgPool, Vec<Row>, PathBuf)> {
    let url = Postgres::shared().await?.fresh_database().await?;
    let config = work.write_config(
        "outbox.toml",
        &format!("[source]\nkind = \"postgres\"\nurl = \"{url}\"\n{sink}"),
    )?;
    let out = work
        .run(&["migrate", "--config", config.to_str().context("utf-8")?])
        .await?;
    ensure!(out.code == Some(0), "{out:?}");
    let pool = sqlx::PgPool::connect(&url).await?;
    let many: serde_json::Map<String, serde_json::Value> = (0..12)
        .map(|i| {
            (
                format!("h-{i:02}"),
                serde_json::Value::from(format!("v{i}")),
            )
        })
        .collect();
    for round in 0..PER_AGGREGATE {
        for (a, aggregate) in AGGREGATES.iter().enumerate() {
            let (payload, headers): (Vec<u8>, serde_json::Value) = match (round, a) {
                (1, 1) => (b"\x00\xffbinary\x07".to_vec(), serde_json::json!({})),
                (2, 2) => (Vec::new(), serde_json::json!({"tenant": "acme"})),
                (3, 0) => (
                    b"{\"many\":true}".to_vec(),
                    serde_json::Value::Object(many.clone()),
                ),
                _ => (
                    format!("{{\"aggregate\":\"{aggregate}\",\"n\":{round}}}").into_bytes(),
                    serde_json::json!({"tenant": "acme", "trace-id": format!("tr{round}")}),
                ),
            };
            sqlx::query(
                "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, headers) \
                 VALUES ('Order', $1, 'order.changed', $2, $3)",
            )
            .bind(aggregate)
            .bind(payload)
            .bind(headers)
            .execute(&pool)
            .await?;
        }
    }
    let rows: Vec<(String, String, Vec<u8>, serde_json::Value, i64)> = sqlx::query_as(
        "SELECT id::text, aggregate_id, payload, headers, \
         row_number() OVER (PARTITION BY aggregate_id ORDER BY seq) \
         FROM outbox ORDER BY aggregate_id, seq",
    )
    .fetch_all(&pool)
    .await?;
    let rows = rows
        .into_iter()
        .map(|(id, aggregate_id, payload, headers, seq)| {
            let mut all: HashMap<String, String> = headers
                .as_object()
                .into_iter()
                .flatten()
                .map(|(n, v)| (n.clone(), v.as_str().unwrap_or_default().to_owned()))
                .collect();
            all.insert("id".into(), id.clone());
            all.insert("event_type".into(), "order.changed".into());
            all.insert("aggregate_type".into(), "Order".into());
            all.insert("aggregate_id".into(), aggregate_id.clone());
            // Polling numbers each aggregate's events 1, 2, ... (`aggregate_seq`,
            // docs/contract.md).
            all.insert("aggregate_seq".into(), seq.to_string());
            Row {
                id,
                aggregate_id,
                payload,
                headers: all,
            }
        })
        .collect();
    Ok((pool, rows, config))
}

/// Runs the boto3 script (`tests/support/aws_consumer.py`) with `args`; its stdout.
async fn aws_consumer(moto: &Moto, args: &[&str]) -> anyhow::Result<String> {
    let mut all = vec![moto.url()];
    all.extend_from_slice(args);
    support::python_consumer("aws_consumer.py", &all).await
}

/// What a boto3 consumer command read: one JSON object per line.
async fn boto3(moto: &Moto, args: &[&str]) -> anyhow::Result<Vec<serde_json::Value>> {
    aws_consumer(moto, args)
        .await?
        .lines()
        .map(|l| serde_json::from_str(l).with_context(|| format!("not JSON: {l}")))
        .collect()
}

/// What a boto3 setup command printed (a queue URL, a topic ARN).
async fn boto3_line(moto: &Moto, args: &[&str]) -> anyhow::Result<String> {
    Ok(aws_consumer(moto, args).await?.trim().to_owned())
}

/// The `[sink]` section of an AWS sink `kind` sending to `key = value` on moto.
fn aws_sink(moto: &Moto, kind: &str, key: &str, value: &str) -> String {
    format!(
        "[sink]\nkind = \"{kind}\"\n{key} = \"{value}\"\nendpoint_url = \"{}\"\nregion = \"{}\"\n",
        moto.url(),
        Moto::REGION
    )
}

/// Relays everything in the outbox with the config at `config` and waits until it is drained.
async fn relay(
    work: &Workdir,
    pool: &sqlx::PgPool,
    config: &std::path::Path,
) -> anyhow::Result<()> {
    let mut relay = work.spawn_relay(config, "relay.log")?;
    let drained = wait_drained(pool, Duration::from_secs(60)).await;
    terminate(&mut relay, Duration::from_secs(30)).await?;
    drained.with_context(|| work.read_log("relay.log"))
}

/// The FIFO group id the docs promise for `aggregate_id`.
fn expected_group(aggregate_id: &str) -> String {
    let legal = !aggregate_id.is_empty()
        && aggregate_id.len() <= 128
        && aggregate_id.chars().all(|c| c.is_ascii_graphic());
    if legal {
        aggregate_id.to_owned()
    } else {
        let hash = sha2::Sha256::digest(aggregate_id.as_bytes());
        let hex: String = hash.iter().map(|b| format!("{b:02x}")).collect();
        format!("sha256:{hex}")
    }
}

/// Each aggregate's event ids arrived (`order`) in the order they were written.
fn check_order(order: &HashMap<String, Vec<String>>, rows: &[Row]) -> anyhow::Result<()> {
    for aggregate in AGGREGATES {
        let written: Vec<String> = rows
            .iter()
            .filter(|r| r.aggregate_id == aggregate)
            .map(|r| r.id.clone())
            .collect();
        ensure!(
            order.get(aggregate) == Some(&written),
            "aggregate {aggregate:?} arrived as {:?}, written as {written:?}",
            order.get(aggregate)
        );
    }
    Ok(())
}

/// Every row arrived exactly once with its payload, headers and group id, and each aggregate's
/// messages came in order.
fn check_sqs_messages(messages: &[serde_json::Value], rows: &[Row]) -> anyhow::Result<()> {
    ensure!(
        messages.len() == rows.len(),
        "{} messages for {} events",
        messages.len(),
        rows.len()
    );
    let mut order: HashMap<String, Vec<String>> = HashMap::new();
    for message in messages {
        let headers: HashMap<String, String> =
            serde_json::from_value(message["headers"].clone())
                .map(|pairs: Vec<(String, String)>| pairs.into_iter().collect())?;
        let id = headers.get("id").context("a message without an id")?;
        let row = rows
            .iter()
            .find(|r| &r.id == id)
            .with_context(|| format!("message {id} is no event of the outbox"))?;
        let payload = base64::engine::general_purpose::STANDARD
            .decode(message["payload_b64"].as_str().unwrap_or_default())?;
        ensure!(
            payload == row.payload,
            "event {id}: payload {payload:?}, written {:?}",
            row.payload
        );
        ensure!(
            headers == row.headers,
            "event {id}: headers {headers:?}, written {:?}",
            row.headers
        );
        ensure!(
            message["group_id"].as_str() == Some(expected_group(&row.aggregate_id).as_str()),
            "event {id} of {:?}: MessageGroupId {}",
            row.aggregate_id,
            message["group_id"]
        );
        ensure!(
            message["dedup_id"].as_str() == Some(id.as_str()),
            "event {id}: MessageDeduplicationId {}",
            message["dedup_id"]
        );
        order
            .entry(row.aggregate_id.clone())
            .or_default()
            .push(id.clone());
    }
    check_order(&order, rows)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_relay_sends_events_to_an_sqs_fifo_queue_that_boto3_reads_back() -> anyhow::Result<()> {
    Moto::set_aws_env();
    let moto = Moto::shared().await?;
    let queue = format!("{}.fifo", unique());
    let queue_url = boto3_line(moto, &["create-queue", &queue]).await?;
    let work = Workdir::new()?;
    let sink = aws_sink(moto, "sqs", "queue_url", &queue_url);
    let (pool, rows, config) = produce(&work, &sink).await?;
    relay(&work, &pool, &config).await?;
    let count = rows.len().to_string();
    let messages = boto3(moto, &["sqs", &queue_url, &count]).await?;
    check_sqs_messages(&messages, &rows)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_relay_publishes_to_an_sns_fifo_topic_whose_subscriber_boto3_reads()
-> anyhow::Result<()> {
    Moto::set_aws_env();
    let moto = Moto::shared().await?;
    let name = format!("{}.fifo", unique());
    let queue_url = boto3_line(moto, &["create-queue", &name]).await?;
    let topic_arn = boto3_line(moto, &["create-topic", &name, &queue_url]).await?;
    let work = Workdir::new()?;
    let sink = aws_sink(moto, "sns", "topic_arn", &topic_arn);
    let (pool, rows, config) = produce(&work, &sink).await?;
    relay(&work, &pool, &config).await?;
    let count = rows.len().to_string();
    let messages = boto3(moto, &["sqs", &queue_url, &count]).await?;
    check_sqs_messages(&messages, &rows)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_relay_writes_to_a_kinesis_stream_that_boto3_reads_back_per_shard() -> anyhow::Result<()>
{
    Moto::set_aws_env();
    let moto = Moto::shared().await?;
    let stream = unique();
    boto3_line(moto, &["create-stream", &stream, "4"]).await?;
    let work = Workdir::new()?;
    let sink = aws_sink(moto, "kinesis", "stream", &stream);
    let (pool, rows, config) = produce(&work, &sink).await?;
    relay(&work, &pool, &config).await?;
    let count = rows.len().to_string();
    let records = boto3(moto, &["kinesis", &stream, &count]).await?;
    ensure!(
        records.len() == rows.len(),
        "{} records for {} events",
        records.len(),
        rows.len()
    );
    // Per partition key: the payloads in the order they were written, all on one shard.
    let mut by_key: HashMap<String, (Vec<Vec<u8>>, Vec<String>)> = HashMap::new();
    for record in &records {
        let key = record["partition_key"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let payload = base64::engine::general_purpose::STANDARD
            .decode(record["payload_b64"].as_str().unwrap_or_default())?;
        let entry = by_key.entry(key).or_default();
        entry.0.push(payload);
        entry
            .1
            .push(record["shard"].as_str().unwrap_or_default().to_owned());
    }
    for aggregate in AGGREGATES {
        let written: Vec<Vec<u8>> = rows
            .iter()
            .filter(|r| r.aggregate_id == aggregate)
            .map(|r| r.payload.clone())
            .collect();
        let (got, shards) = by_key
            .get(aggregate)
            .with_context(|| format!("no records with partition key {aggregate:?}"))?;
        ensure!(
            got == &written,
            "aggregate {aggregate:?}: records {got:?}, written {written:?}"
        );
        ensure!(
            shards.iter().all(|s| s == &shards[0]),
            "aggregate {aggregate:?} spread over shards {shards:?}"
        );
    }
    Ok(())
}

/// Pub/Sub, through the binary to the Cloud SDK's emulator, read back by a subscriber with
/// message ordering over the REST API (Pub/Sub's own API; no Rust client library involved).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_relay_publishes_to_pubsub_and_an_ordered_subscriber_reads_it_back()
-> anyhow::Result<()> {
    use outbox_testkit::services::{PubSubEmulator, find_emulator};

    if let Err(why) = find_emulator() {
        eprintln!(
            "SKIPPED the_relay_publishes_to_pubsub_and_an_ordered_subscriber_reads_it_back: {why:#}"
        );
        return Ok(());
    }
    let emulator = PubSubEmulator::shared().await?;
    let project = "proj-outbox";
    let topic = unique();
    emulator.create_topic(project, &topic).await?;
    emulator
        .create_subscription(project, &topic, &topic, true)
        .await?;
    let work = Workdir::new()?;
    let sink = format!(
        "[sink]\nkind = \"pubsub\"\nproject = \"{project}\"\ntopic = \"{topic}\"\nendpoint = \"{}\"\n",
        emulator.host()
    );
    let (pool, rows, config) = produce(&work, &sink).await?;
    relay(&work, &pool, &config).await?;

    let mut messages = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while messages.len() < rows.len() {
        ensure!(
            tokio::time::Instant::now() < deadline,
            "only {} of {} messages arrived",
            messages.len(),
            rows.len()
        );
        let got = emulator.pull(project, &topic, 100).await?;
        if got.is_empty() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        messages.extend(got);
    }
    let mut order: HashMap<String, Vec<String>> = HashMap::new();
    for message in &messages {
        let id = message
            .attributes
            .get("id")
            .context("a message without id")?;
        let row = rows
            .iter()
            .find(|r| &r.id == id)
            .with_context(|| format!("message {id} is no event of the outbox"))?;
        ensure!(
            message.data[..] == row.payload[..],
            "event {id}: data {:?}",
            message.data
        );
        let attributes: HashMap<String, String> = message.attributes.clone().into_iter().collect();
        ensure!(
            attributes == row.headers,
            "event {id}: attributes {attributes:?}"
        );
        ensure!(
            message.ordering_key.as_deref() == Some(row.aggregate_id.as_str()),
            "event {id}: ordering key {:?}",
            message.ordering_key
        );
        order
            .entry(row.aggregate_id.clone())
            .or_default()
            .push(id.clone());
    }
    check_order(&order, &rows)
}
