//! `outbox verify` through the binary on the cloud sinks: Kinesis on moto's server, Pub/Sub on
//! the Cloud SDK's emulator. As in tests/verify.rs, a real relay delivers a set of events,
//! then each fault is injected with the destination's own API and `verify --json` must name
//! it by its event id:
//!
//! - a duplicate (a copy of a delivered message): counted, exit 0 when it is the only finding;
//! - a phantom (a message under an id the table does not have): exit 1;
//! - two events of one aggregate swapped: neither service can delete a message, so copies of
//!   two new events reach the destination later one first, before the relay publishes both
//!   in order: an order break on the earlier one, exit 1;
//! - lost: a row marked delivered that was never published, exit 1.
//!
//! A clean run exits 0. Plus the refusals: a Kinesis stream in the plain format (no event id
//! in a record), a Pub/Sub topic without message retention (a new subscription cannot be
//! sought back); and a Kinesis stream resharded in the middle of the window.

mod support;

use std::path::PathBuf;
use std::process::Stdio;

use anyhow::{Context, ensure};
use base64::Engine as _;
use outbox_testkit::services::{Moto, Postgres};
use serde_json::{Value, json};
use support::Workdir;
use support::verify::{events, expect, expect_finding, insert_pg, relay_pg, scope, verify};
use uuid::Uuid;

/// Runs `python3 ARGS...` (boto3 comes with moto's server); its stdout.
async fn python(args: &[&str]) -> anyhow::Result<String> {
    let out = tokio::process::Command::new("python3")
        .args(args)
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output()
        .await
        .context("running python3")?;
    ensure!(
        out.status.success(),
        "python3 {:?}: {}",
        &args[..args.len().min(3)],
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8(out.stdout)?)
}

/// The boto3 consumer of tests/cloud.rs (`tests/support/aws_consumer.py`) with `args`.
async fn aws_consumer(moto: &Moto, args: &[&str]) -> anyhow::Result<String> {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/support/aws_consumer.py");
    let script = script.to_str().context("utf-8 path")?;
    let mut all = vec![script, moto.url()];
    all.extend_from_slice(args);
    python(&all).await
}

/// Kinesis calls with boto3 that the consumer script does not make.
const KINESIS: &str = r#"
import base64, json, sys, boto3
endpoint, command, stream, *args = sys.argv[1:]
kinesis = boto3.client("kinesis", endpoint_url=endpoint)
if command == "put":
    key, data = args
    kinesis.put_record(StreamName=stream, PartitionKey=key, Data=base64.b64decode(data))
elif command == "split":
    shard = kinesis.list_shards(StreamName=stream)["Shards"][0]
    low = int(shard["HashKeyRange"]["StartingHashKey"])
    high = int(shard["HashKeyRange"]["EndingHashKey"])
    kinesis.split_shard(StreamName=stream, ShardToSplit=shard["ShardId"],
                        NewStartingHashKey=str((low + high) // 2))
"#;

async fn kinesis(moto: &Moto, args: &[&str]) -> anyhow::Result<()> {
    let mut all = vec!["-c", KINESIS, moto.url()];
    all.extend_from_slice(args);
    python(&all).await.map(drop)
}

/// A CloudEvents structured envelope as the relay writes it into a Kinesis record.
fn envelope(id: Uuid, aggregate: &str, seq: Option<u64>) -> String {
    let mut e = json!({
        "specversion": "1.0",
        "id": id.to_string(),
        "source": "urn:outbox:Order",
        "type": "order.changed",
        "subject": aggregate,
        "aggregatetype": "Order",
        "datacontenttype": "application/json",
        "data": {},
    });
    if let Some(seq) = seq {
        e["aggregateseq"] = seq.to_string().into();
    }
    base64::engine::general_purpose::STANDARD.encode(e.to_string())
}

/// A Kinesis sink on moto for `stream`.
fn kinesis_sink(moto: &Moto, stream: &str, format: &str) -> String {
    format!(
        "[sink]\nkind = \"kinesis\"\nstream = \"{stream}\"\nendpoint_url = \"{}\"\nregion = \"{}\"\nformat = \"{format}\"\n",
        moto.url(),
        Moto::REGION
    )
}

/// Where in its aggregate (1, 2, ...) event `id` is.
fn seq_of(events: &[(Uuid, String)], id: Uuid) -> Option<u64> {
    let aggregate = &events.iter().find(|(e, _)| *e == id)?.1;
    events
        .iter()
        .filter(|(_, a)| a == aggregate)
        .position(|(e, _)| *e == id)
        .map(|p| p as u64 + 1)
}

/// A fresh PostgreSQL database with the outbox migrated, for `sink`.
async fn setup(work: &Workdir, sink: &str) -> anyhow::Result<(PathBuf, sqlx::PgPool)> {
    let url = Postgres::shared().await?.fresh_database().await?;
    let config = work.write_config(
        "outbox.toml",
        &format!("[source]\nkind = \"postgres\"\nurl = \"{url}\"\n{sink}"),
    )?;
    work.run_ok(&["migrate", "--config", config.to_str().context("path")?])
        .await?;
    Ok((config, sqlx::PgPool::connect(&url).await?))
}

/// The last two faults, where `copy(id, seq)` stores a message of event `id` of aggregate
/// `s1` at the destination: two new events of `s1` whose copies arrive later one first,
/// before the relay publishes both in order (an order break on the earlier; the copies are
/// duplicates); then a row marked delivered that was never published (lost). The report
/// holds one phantom and one duplicate from the earlier steps.
async fn swapped_then_lost(
    work: &Workdir,
    config: &std::path::Path,
    pool: &sqlx::PgPool,
    copy: impl AsyncFn(Uuid, u64) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let swapped = [Uuid::now_v7(), Uuid::now_v7()];
    insert_pg(pool, &swapped.map(|id| (id, "s1".to_owned()))).await?;
    copy(swapped[1], 2).await?;
    copy(swapped[0], 1).await?;
    relay_pg(work, config, pool).await?;
    expect_finding(work, config, (0, 1, 3, 1), 1, "order_breaks", swapped[0]).await?;
    let gone = Uuid::now_v7();
    insert_pg(pool, &[(gone, "a0".to_owned())]).await?;
    sqlx::query("UPDATE outbox SET state = 'delivered', delivered_at = now() WHERE id = $1")
        .bind(gone)
        .execute(pool)
        .await?;
    expect_finding(work, config, (1, 1, 3, 1), 1, "lost", gone).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_catches_each_fault_on_kinesis() -> anyhow::Result<()> {
    Moto::set_aws_env();
    let moto = Moto::shared().await?;
    let stream = scope();
    aws_consumer(moto, &["create-stream", &stream, "2"]).await?;
    let work = Workdir::new()?;
    let sink = kinesis_sink(moto, &stream, "cloudevents-structured");
    let (config, pool) = setup(&work, &sink).await?;
    let events = events(12);
    insert_pg(&pool, &events).await?;
    relay_pg(&work, &config, &pool).await?;

    let (code, report) = verify(&work, &config).await?;
    expect(code, &report, (0, 0, 0, 0), 0)?;
    ensure!(
        report["matched"] == 12 && report["destination"]["read"] == 12,
        "{report:#}"
    );
    ensure!(
        report["destination"]["lanes"].as_array().map(Vec::len) == Some(2),
        "one lane per shard: {report:#}"
    );
    // A window older than the stream's retention (24 hours): what is older may have expired,
    // and nothing of this window is.
    let path = config.to_str().context("path")?;
    let out = work
        .run(&["verify", "--config", path, "--since", "25h", "--json"])
        .await?;
    let report: Value = serde_json::from_str(&out.stdout).context("a JSON report")?;
    expect(out.code.unwrap_or(-1), &report, (0, 0, 0, 0), 0)?;
    ensure!(
        report["destination"]["trimmed"][0]["destination"] == stream.as_str()
            && report["expired_at_destination"]["count"] == 0,
        "{report:#}"
    );

    // A duplicate: a copy of a delivered record, as boto3 reads it.
    let copied = events[4].0;
    let records = aws_consumer(moto, &["kinesis", &stream, "12"]).await?;
    let record: Value = records
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|r| {
            r["payload_b64"]
                .as_str()
                .and_then(|b| base64::engine::general_purpose::STANDARD.decode(b).ok())
                .is_some_and(|d| String::from_utf8_lossy(&d).contains(&copied.to_string()))
        })
        .context("the record of the copied event")?;
    let key = record["partition_key"].as_str().context("partition key")?;
    let data = record["payload_b64"].as_str().context("data")?;
    kinesis(moto, &["put", &stream, key, data]).await?;
    expect_finding(&work, &config, (0, 0, 1, 0), 0, "duplicates", copied).await?;

    // A phantom under a foreign id.
    let phantom = Uuid::now_v7();
    kinesis(
        moto,
        &["put", &stream, "a1", &envelope(phantom, "a1", None)],
    )
    .await?;
    expect_finding(&work, &config, (0, 1, 1, 0), 1, "phantom", phantom).await?;

    swapped_then_lost(&work, &config, &pool, async |id, seq| {
        let data = envelope(id, "s1", Some(seq));
        kinesis(moto, &["put", &stream, "s1", &data]).await
    })
    .await?;

    // The human report names the shards and the verdict.
    let path = config.to_str().context("path")?;
    let out = work.run(&["verify", "--config", path]).await?;
    ensure!(
        out.code == Some(1)
            && out
                .stdout
                .contains(&format!("stream `{stream}` shard shardId-"))
            && out
                .stdout
                .contains("FAIL: 1 lost, 1 phantom, 1 order break"),
        "{}",
        out.stdout
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_reads_the_closed_and_child_shards_of_a_resharded_kinesis_stream()
-> anyhow::Result<()> {
    Moto::set_aws_env();
    let moto = Moto::shared().await?;
    // A template: the streams are found with ListStreams too (paged on a shared server).
    let scope = scope();
    let stream = format!("{scope}.Order");
    aws_consumer(moto, &["create-stream", &stream, "1"]).await?;
    let work = Workdir::new()?;
    let template = format!("{scope}.{{aggregate_type}}");
    let sink = kinesis_sink(moto, &template, "cloudevents-structured");
    let (config, pool) = setup(&work, &sink).await?;
    let before = events(6);
    insert_pg(&pool, &before).await?;
    relay_pg(&work, &config, &pool).await?;
    kinesis(moto, &["split", &stream]).await?;
    let after = events(6);
    insert_pg(&pool, &after).await?;
    relay_pg(&work, &config, &pool).await?;

    let (code, report) = verify(&work, &config).await?;
    expect(code, &report, (0, 0, 0, 0), 0)?;
    ensure!(report["matched"] == 12, "{report:#}");
    let lanes: Vec<String> = report["destination"]["lanes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|l| l["name"].as_str().map(str::to_owned))
        .collect();
    ensure!(
        lanes.len() == 3 && lanes.iter().filter(|l| l.ends_with("(closed)")).count() == 1,
        "the parent (closed) and its two children: {lanes:?}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_refuses_a_kinesis_stream_whose_records_carry_no_event_id() -> anyhow::Result<()> {
    Moto::set_aws_env();
    let moto = Moto::shared().await?;
    let work = Workdir::new()?;
    let db = work.path().join("outbox.db");
    let config = work.write_config(
        "outbox.toml",
        &format!(
            "[source]\nkind = \"sqlite\"\npath = \"{}\"\n{}",
            db.display(),
            kinesis_sink(moto, &scope(), "plain")
        ),
    )?;
    let path = config.to_str().context("path")?;
    work.run_ok(&["migrate", "--config", path]).await?;
    let out = work.run(&["verify", "--config", path]).await?;
    ensure!(out.code == Some(2), "{out:?}");
    out.assert_clear_error("set sink.format = \"cloudevents-structured\"")?;
    ensure!(!out.stdout.contains("0 lost"), "{out:?}");
    Ok(())
}

/// The Pub/Sub emulator, or `None` (with why, printed) when it is not installed.
async fn emulator(
    test: &str,
) -> anyhow::Result<Option<&'static outbox_testkit::services::PubSubEmulator>> {
    use outbox_testkit::services::{PubSubEmulator, find_emulator};
    if let Err(why) = find_emulator() {
        eprintln!("SKIPPED {test}: {why:#}");
        return Ok(None);
    }
    Ok(Some(PubSubEmulator::shared().await?))
}

const PROJECT: &str = "proj-outbox";

/// Creates `topic`, with message retention when `retention` is given (`"600s"`).
async fn create_topic(
    emulator: &outbox_testkit::services::PubSubEmulator,
    topic: &str,
    retention: Option<&str>,
) -> anyhow::Result<()> {
    let body = match retention {
        Some(r) => json!({ "messageRetentionDuration": r }),
        None => json!({}),
    };
    let (status, answer) = emulator
        .call(
            "PUT",
            &format!("/v1/projects/{PROJECT}/topics/{topic}"),
            Some(&body),
        )
        .await?;
    ensure!(
        status == 200,
        "creating {topic}: {}",
        String::from_utf8_lossy(&answer)
    );
    Ok(())
}

/// Publishes one plain message of event `id` to `topic`, as the relay would.
async fn publish(
    emulator: &outbox_testkit::services::PubSubEmulator,
    topic: &str,
    id: Uuid,
    aggregate: &str,
    seq: Option<u64>,
) -> anyhow::Result<()> {
    let mut attributes = json!({
        "id": id.to_string(),
        "event_type": "order.changed",
        "aggregate_type": "Order",
        "aggregate_id": aggregate,
    });
    if let Some(seq) = seq {
        attributes["aggregate_seq"] = seq.to_string().into();
    }
    let body = json!({ "messages": [{
        "data": base64::engine::general_purpose::STANDARD.encode("{}"),
        "attributes": attributes,
        "orderingKey": aggregate,
    }]});
    let (status, answer) = emulator
        .call(
            "POST",
            &format!("/v1/projects/{PROJECT}/topics/{topic}:publish"),
            Some(&body),
        )
        .await?;
    ensure!(
        status == 200,
        "publishing to {topic}: {}",
        String::from_utf8_lossy(&answer)
    );
    // Distinct publish times: the lane is in publish-time order.
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_catches_each_fault_on_pubsub() -> anyhow::Result<()> {
    let Some(emulator) = emulator("verify_catches_each_fault_on_pubsub").await? else {
        return Ok(());
    };
    let scope = scope();
    let topic = format!("{scope}.Order");
    create_topic(emulator, &topic, Some("600s")).await?;
    let work = Workdir::new()?;
    let sink = format!(
        "[sink]\nkind = \"pubsub\"\nproject = \"{PROJECT}\"\ntopic = \"{scope}.{{aggregate_type}}\"\nendpoint = \"{}\"\n",
        emulator.host()
    );
    let (config, pool) = setup(&work, &sink).await?;
    let events = events(12);
    insert_pg(&pool, &events).await?;
    relay_pg(&work, &config, &pool).await?;

    let (code, report) = verify(&work, &config).await?;
    expect(code, &report, (0, 0, 0, 0), 0)?;
    ensure!(
        report["matched"] == 12 && report["destination"]["read"] == 12,
        "{report:#}"
    );
    // The topic keeps 10 minutes, the window (with verify's margin) starts 11 minutes ago.
    ensure!(
        report["destination"]["trimmed"][0]["destination"] == topic.as_str(),
        "{report:#}"
    );

    let copied = events[4].0;
    publish(
        emulator,
        &topic,
        copied,
        &events[4].1,
        seq_of(&events, copied),
    )
    .await?;
    expect_finding(&work, &config, (0, 0, 1, 0), 0, "duplicates", copied).await?;

    let phantom = Uuid::now_v7();
    publish(emulator, &topic, phantom, "a1", None).await?;
    expect_finding(&work, &config, (0, 1, 1, 0), 1, "phantom", phantom).await?;

    swapped_then_lost(&work, &config, &pool, async |id, seq| {
        publish(emulator, &topic, id, "s1", Some(seq)).await
    })
    .await?;

    // Every temporary subscription is gone.
    let (status, body) = emulator
        .call(
            "GET",
            &format!("/v1/projects/{PROJECT}/topics/{topic}/subscriptions"),
            None,
        )
        .await?;
    let left: Value = serde_json::from_slice(&body)?;
    ensure!(
        status == 200 && left["subscriptions"].as_array().is_none_or(Vec::is_empty),
        "subscriptions left on the topic: {left:#}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_refuses_a_pubsub_topic_without_message_retention() -> anyhow::Result<()> {
    let test = "verify_refuses_a_pubsub_topic_without_message_retention";
    let Some(emulator) = emulator(test).await? else {
        return Ok(());
    };
    let topic = scope();
    create_topic(emulator, &topic, None).await?;
    let work = Workdir::new()?;
    let sink = format!(
        "[sink]\nkind = \"pubsub\"\nproject = \"{PROJECT}\"\ntopic = \"{topic}\"\nendpoint = \"{}\"\n",
        emulator.host()
    );
    let (config, pool) = setup(&work, &sink).await?;
    let events = events(3);
    insert_pg(&pool, &events).await?;
    relay_pg(&work, &config, &pool).await?;
    let path = config.to_str().context("path")?;
    let out = work.run(&["verify", "--config", path]).await?;
    ensure!(out.code == Some(2), "{out:?}");
    out.assert_clear_error("keeps no messages (no message retention on the topic)")?;
    ensure!(
        out.stderr.contains("--message-retention-duration") && !out.stdout.contains("0 lost"),
        "{out:?}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_cannot_reach_kinesis_or_pubsub_and_says_where() -> anyhow::Result<()> {
    Moto::set_aws_env();
    let work = Workdir::new()?;
    let db = work.path().join("outbox.db");
    // A port nothing listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let sinks = [
        (
            format!(
                "[sink]\nkind = \"kinesis\"\nstream = \"orders\"\nendpoint_url = \"http://127.0.0.1:{port}\"\nregion = \"{}\"\nformat = \"cloudevents-structured\"\nconnect_timeout = \"1s\"\n",
                Moto::REGION
            ),
            format!("Kinesis at http://127.0.0.1:{port}"),
        ),
        (
            format!(
                "[sink]\nkind = \"pubsub\"\nproject = \"{PROJECT}\"\ntopic = \"orders\"\nendpoint = \"127.0.0.1:{port}\"\n"
            ),
            format!("Pub/Sub emulator at 127.0.0.1:{port}"),
        ),
    ];
    for (sink, place) in sinks {
        let config = work.write_config(
            "outbox.toml",
            &format!(
                "[source]\nkind = \"sqlite\"\npath = \"{}\"\n{sink}",
                db.display()
            ),
        )?;
        let path = config.to_str().context("path")?;
        work.run_ok(&["migrate", "--config", path]).await?;
        let out = work.run(&["verify", "--config", path]).await?;
        ensure!(out.code == Some(2), "{out:?}");
        out.assert_clear_error("the destination cannot be reached")?;
        out.assert_clear_error(&place)?;
        ensure!(!out.stdout.contains("0 lost"), "{out:?}");
    }
    Ok(())
}
