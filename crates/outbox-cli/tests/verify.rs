//! `outbox verify` through the binary, against real servers: a real relay delivers a set of
//! events, then each fault is injected with the destination's own client (or, for the file
//! sink, by editing the file) and `verify --json` must name it by its event id:
//!
//! - a duplicate: counted, exit 0 when it is the only finding;
//! - a phantom (a message under an id the table does not have): exit 1;
//! - two events of one aggregate swapped: an order break on the earlier one, exit 1;
//! - a message deleted from the destination: lost, exit 1 (on Kafka, which cannot delete a
//!   record, a row is marked delivered without ever being published).
//!
//! A clean run exits 0. The faults accumulate within a test: each step checks that the new
//! finding is there with its id and that the earlier ones are still reported. Plus the file
//! sink on SQLite, PostgreSQL CDC and MariaDB, and the bad input: an unreachable broker (exit
//! 2, the URL named, the password not), a destination that cannot be read back, rows deleted
//! on delivery.

mod support;

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, ensure};
use outbox_testkit::services::{MariaDb, Nats, Postgres, Redis};
use serde_json::Value;
use support::verify::{WAIT, events, expect, ids, insert_pg, pair_of, relay_pg, scope, verify};
use support::{Workdir, terminate, wait_drained};
use uuid::Uuid;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_catches_each_fault_on_jetstream() -> anyhow::Result<()> {
    use async_nats::jetstream;
    let url = Postgres::shared().await?.fresh_database().await?;
    let nats = Nats::shared().await?;
    let scope = scope();
    let work = Workdir::new()?;
    let config = work.write_config(
        "outbox.toml",
        &format!(
            "[source]\nkind = \"postgres\"\nurl = \"{url}\"\n[sink]\nkind = \"nats\"\nurl = \"{}\"\ndestination = \"{scope}.{{aggregate_type}}\"\nstream = \"{}\"\n",
            nats.url(),
            scope.to_uppercase()
        ),
    )?;
    work.run_ok(&["migrate", "--config", config.to_str().context("path")?])
        .await?;
    let pool = sqlx::PgPool::connect(&url).await?;
    let events = events(12);
    insert_pg(&pool, &events).await?;
    relay_pg(&work, &config, &pool).await?;

    let (code, report) = verify(&work, &config).await?;
    expect(code, &report, (0, 0, 0, 0), 0)?;
    ensure!(
        report["matched"] == 12 && report["source"]["delivered"] == 12,
        "{report:#}"
    );

    let client = nats.connect().await?;
    let js = jetstream::new(client);
    let mut stream = js.get_stream(scope.to_uppercase()).await?;
    let messages = stored_messages(&mut stream).await?;
    let find = |id: Uuid| {
        messages
            .iter()
            .find(|m| m.id == id.to_string())
            .cloned()
            .context("message not in the stream")
    };
    // A copy without Nats-Msg-Id (JetStream would drop it as a duplicate within its window).
    let republish = |m: Stored| {
        let js = js.clone();
        async move {
            let mut headers = async_nats::HeaderMap::new();
            for (name, values) in m.headers.iter() {
                if name.to_string() != "Nats-Msg-Id" {
                    for v in values {
                        headers.append(name.clone(), v.clone());
                    }
                }
            }
            js.publish_with_headers(m.subject, headers, m.payload.into())
                .await?
                .await?;
            anyhow::Ok(())
        }
    };

    // A duplicate: counted, nothing else wrong.
    let copied = events[4].0;
    republish(find(copied)?).await?;
    let (code, report) = verify(&work, &config).await?;
    expect(code, &report, (0, 0, 1, 0), 0)?;
    ensure!(
        ids(&report, "duplicates") == [copied.to_string()],
        "{report:#}"
    );

    // A phantom under a foreign id.
    let phantom = Uuid::now_v7();
    let mut headers = async_nats::HeaderMap::new();
    headers.insert("id", phantom.to_string().as_str());
    headers.insert("aggregate_type", "Order");
    headers.insert("aggregate_id", "a1");
    js.publish_with_headers(format!("{scope}.Order"), headers, "{}".into())
        .await?
        .await?;
    let (code, report) = verify(&work, &config).await?;
    expect(code, &report, (0, 1, 1, 0), 1)?;
    ensure!(
        ids(&report, "phantom") == [phantom.to_string()],
        "{report:#}"
    );

    // Two events of one aggregate swapped: both deleted, then stored again later one first.
    let (earlier, later) = pair_of(&events, "a2");
    let (e, l) = (find(earlier)?, find(later)?);
    stream.delete_message(e.sequence).await?;
    stream.delete_message(l.sequence).await?;
    republish(l).await?;
    republish(e).await?;
    let (code, report) = verify(&work, &config).await?;
    expect(code, &report, (0, 1, 1, 1), 1)?;
    ensure!(
        ids(&report, "order_breaks") == [earlier.to_string()],
        "{report:#}"
    );
    ensure!(
        report["order_break_details"][0]["after"] == later.to_string(),
        "{report:#}"
    );

    // A message deleted from the stream: lost.
    let gone = events[7].0;
    stream.delete_message(find(gone)?.sequence).await?;
    let (code, report) = verify(&work, &config).await?;
    expect(code, &report, (1, 1, 1, 1), 1)?;
    ensure!(ids(&report, "lost") == [gone.to_string()], "{report:#}");

    // The human report names them too.
    let out = work
        .run(&[
            "verify",
            "--config",
            config.to_str().context("path")?,
            "--since",
            "10m",
        ])
        .await?;
    ensure!(out.code == Some(1), "{out:?}");
    for id in [gone, phantom, earlier] {
        ensure!(
            out.stdout.contains(&id.to_string()),
            "{id} not named: {}",
            out.stdout
        );
    }
    ensure!(
        out.stdout
            .contains("FAIL: 1 lost, 1 phantom, 1 order break"),
        "{}",
        out.stdout
    );
    Ok(())
}

/// A message stored in a JetStream stream.
#[derive(Clone)]
struct Stored {
    sequence: u64,
    id: String,
    subject: String,
    headers: async_nats::HeaderMap,
    payload: Vec<u8>,
}

/// Every message of `stream`, by sequence.
async fn stored_messages(
    stream: &mut async_nats::jetstream::stream::Stream,
) -> anyhow::Result<Vec<Stored>> {
    let last = stream.info().await?.state.last_sequence;
    let mut out = Vec::new();
    for sequence in 1..=last {
        if let Ok(m) = stream.get_raw_message(sequence).await {
            out.push(Stored {
                sequence,
                id: m
                    .headers
                    .get("id")
                    .map(|v| v.as_str().to_owned())
                    .unwrap_or_default(),
                subject: m.subject.to_string(),
                headers: m.headers,
                payload: m.payload.to_vec(),
            });
        }
    }
    Ok(out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_catches_each_fault_on_redis() -> anyhow::Result<()> {
    let url = Postgres::shared().await?.fresh_database().await?;
    let redis_url = Redis::shared().await?.url().to_owned();
    let scope = scope();
    let work = Workdir::new()?;
    let config = work.write_config(
        "outbox.toml",
        &format!(
            "[source]\nkind = \"postgres\"\nurl = \"{url}\"\n[sink]\nkind = \"redis\"\nurl = \"{redis_url}\"\ndestination = \"{scope}.{{aggregate_type}}\"\n"
        ),
    )?;
    work.run_ok(&["migrate", "--config", config.to_str().context("path")?])
        .await?;
    let pool = sqlx::PgPool::connect(&url).await?;
    let events = events(12);
    insert_pg(&pool, &events).await?;
    relay_pg(&work, &config, &pool).await?;
    let (code, report) = verify(&work, &config).await?;
    expect(code, &report, (0, 0, 0, 0), 0)?;

    let client = redis::Client::open(redis_url.as_str())?;
    let mut redis = client.get_multiplexed_async_connection().await?;
    let key = format!("{scope}.Order");
    // Every entry: (entry id, fields).
    type Entry = (String, Vec<(String, Vec<u8>)>);
    let entries: Vec<Entry> = redis::cmd("XRANGE")
        .arg(&key)
        .arg("-")
        .arg("+")
        .query_async(&mut redis)
        .await?;
    let find = |id: Uuid| {
        entries
            .iter()
            .find(|(_, fields)| {
                fields
                    .iter()
                    .any(|(k, v)| k == "id" && v.as_slice() == id.to_string().as_bytes())
            })
            .cloned()
            .context("entry not in the stream")
    };
    let add = |fields: Vec<(String, Vec<u8>)>| {
        let mut redis = redis.clone();
        let key = key.clone();
        async move {
            let mut cmd = redis::cmd("XADD");
            cmd.arg(&key).arg("*");
            for (k, v) in fields {
                cmd.arg(k).arg(v);
            }
            cmd.query_async::<String>(&mut redis).await?;
            anyhow::Ok(())
        }
    };
    let delete = |entry: &str| {
        let mut redis = redis.clone();
        let (key, entry) = (key.clone(), entry.to_owned());
        async move {
            redis::cmd("XDEL")
                .arg(&key)
                .arg(&entry)
                .query_async::<i64>(&mut redis)
                .await?;
            anyhow::Ok(())
        }
    };

    let copied = events[4].0;
    add(find(copied)?.1).await?;
    let (code, report) = verify(&work, &config).await?;
    expect(code, &report, (0, 0, 1, 0), 0)?;
    ensure!(
        ids(&report, "duplicates") == [copied.to_string()],
        "{report:#}"
    );

    let phantom = Uuid::now_v7();
    add(vec![
        ("id".into(), phantom.to_string().into_bytes()),
        ("event_type".into(), b"order.changed".to_vec()),
        ("aggregate_type".into(), b"Order".to_vec()),
        ("aggregate_id".into(), b"a1".to_vec()),
        ("payload".into(), b"{}".to_vec()),
    ])
    .await?;
    let (code, report) = verify(&work, &config).await?;
    expect(code, &report, (0, 1, 1, 0), 1)?;
    ensure!(
        ids(&report, "phantom") == [phantom.to_string()],
        "{report:#}"
    );

    let (earlier, later) = pair_of(&events, "a2");
    let (e, l) = (find(earlier)?, find(later)?);
    delete(&e.0).await?;
    delete(&l.0).await?;
    add(l.1).await?;
    add(e.1).await?;
    let (code, report) = verify(&work, &config).await?;
    expect(code, &report, (0, 1, 1, 1), 1)?;
    ensure!(
        ids(&report, "order_breaks") == [earlier.to_string()],
        "{report:#}"
    );

    let gone = events[7].0;
    delete(&find(gone)?.0).await?;
    let (code, report) = verify(&work, &config).await?;
    expect(code, &report, (1, 1, 1, 1), 1)?;
    ensure!(ids(&report, "lost") == [gone.to_string()], "{report:#}");
    Ok(())
}

#[cfg(feature = "kafka")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_catches_each_fault_on_kafka() -> anyhow::Result<()> {
    use outbox_testkit::services::Kafka;
    use rdkafka::message::{Header, OwnedHeaders};
    use rdkafka::producer::{FutureProducer, FutureRecord};

    let url = Postgres::shared().await?.fresh_database().await?;
    let kafka = Kafka::shared().await?;
    let scope = scope();
    let work = Workdir::new()?;
    let config = work.write_config(
        "outbox.toml",
        &format!(
            "[source]\nkind = \"postgres\"\nurl = \"{url}\"\n[sink]\nkind = \"kafka\"\nbrokers = \"{}\"\ndestination = \"{scope}.{{aggregate_type}}\"\ncreate_topics = true\ntopic_partitions = 2\ndelivery_timeout = \"10s\"\n",
            kafka.brokers()
        ),
    )?;
    work.run_ok(&["migrate", "--config", config.to_str().context("path")?])
        .await?;
    let pool = sqlx::PgPool::connect(&url).await?;
    let events = events(12);
    insert_pg(&pool, &events).await?;
    relay_pg(&work, &config, &pool).await?;
    let (code, report) = verify(&work, &config).await?;
    expect(code, &report, (0, 0, 0, 0), 0)?;
    ensure!(report["destination"]["read"] == 12, "{report:#}");

    let producer: FutureProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", kafka.brokers())
        .create()?;
    let topic = format!("{scope}.Order");
    let produce = |id: Uuid, aggregate: &str, seq: Option<u64>| {
        let (producer, topic, aggregate) = (producer.clone(), topic.clone(), aggregate.to_owned());
        async move {
            let id = id.to_string();
            let seq = seq.map(|s| s.to_string());
            let mut headers = OwnedHeaders::new()
                .insert(Header {
                    key: "id",
                    value: Some(id.as_str()),
                })
                .insert(Header {
                    key: "event_type",
                    value: Some("order.changed"),
                })
                .insert(Header {
                    key: "aggregate_type",
                    value: Some("Order"),
                })
                .insert(Header {
                    key: "aggregate_id",
                    value: Some(aggregate.as_str()),
                });
            if let Some(seq) = &seq {
                headers = headers.insert(Header {
                    key: "aggregate_seq",
                    value: Some(seq.as_str()),
                });
            }
            producer
                .send(
                    FutureRecord::to(&topic)
                        .key(aggregate.as_str())
                        .payload("{}")
                        .headers(headers),
                    Duration::from_secs(10),
                )
                .await
                .map_err(|(e, _)| anyhow::anyhow!("producing: {e}"))?;
            anyhow::Ok(())
        }
    };
    let seq_of = |id: Uuid| {
        let aggregate = &events.iter().find(|(e, _)| *e == id).expect("event").1;
        events
            .iter()
            .filter(|(_, a)| a == aggregate)
            .position(|(e, _)| *e == id)
            .map(|p| p as u64 + 1)
    };

    let copied = events[4].0;
    produce(copied, &events[4].1, seq_of(copied)).await?;
    let (code, report) = verify(&work, &config).await?;
    expect(code, &report, (0, 0, 1, 0), 0)?;
    ensure!(
        ids(&report, "duplicates") == [copied.to_string()],
        "{report:#}"
    );

    let phantom = Uuid::now_v7();
    produce(phantom, "a1", None).await?;
    let (code, report) = verify(&work, &config).await?;
    expect(code, &report, (0, 1, 1, 0), 1)?;
    ensure!(
        ids(&report, "phantom") == [phantom.to_string()],
        "{report:#}"
    );

    // Kafka cannot delete a record: the swap is two new events of a new aggregate whose
    // copies reach the topic later one first, before the relay publishes both in order.
    let swapped = vec![
        (Uuid::now_v7(), "s1".to_owned()),
        (Uuid::now_v7(), "s1".to_owned()),
    ];
    insert_pg(&pool, &swapped).await?;
    produce(swapped[1].0, "s1", Some(2)).await?;
    produce(swapped[0].0, "s1", Some(1)).await?;
    relay_pg(&work, &config, &pool).await?;
    let (code, report) = verify(&work, &config).await?;
    expect(code, &report, (0, 1, 3, 1), 1)?;
    ensure!(
        ids(&report, "order_breaks") == [swapped[0].0.to_string()],
        "{report:#}"
    );

    // Lost: a row marked delivered that was never published (a relay that settled without
    // an acknowledgement).
    let gone = Uuid::now_v7();
    insert_pg(&pool, &[(gone, "a0".to_owned())]).await?;
    sqlx::query("UPDATE outbox SET state = 'delivered', delivered_at = now() WHERE id = $1")
        .bind(gone)
        .execute(&pool)
        .await?;
    let (code, report) = verify(&work, &config).await?;
    expect(code, &report, (1, 1, 3, 1), 1)?;
    ensure!(ids(&report, "lost") == [gone.to_string()], "{report:#}");
    Ok(())
}

/// The lines of a file.
fn lines_of(path: &Path) -> anyhow::Result<Vec<String>> {
    Ok(std::fs::read_to_string(path)?
        .lines()
        .map(str::to_owned)
        .collect())
}

/// The file-sink faults on `events.jsonl` of `work`, step by step: duplicate, phantom,
/// swap, lost.
async fn file_faults(
    work: &Workdir,
    config: &Path,
    events: &[(Uuid, String)],
) -> anyhow::Result<()> {
    let path = work.path().join("events.jsonl");
    let original = lines_of(&path)?;
    ensure!(original.len() == events.len(), "{original:?}");
    let line_of = |id: Uuid| {
        original
            .iter()
            .position(|l| l.contains(&id.to_string()))
            .context("line missing")
    };
    let write = |lines: &[String]| std::fs::write(&path, lines.join("\n") + "\n");

    let mut lines = original.clone();
    let copied = events[4].0;
    lines.push(original[line_of(copied)?].clone());
    write(&lines)?;
    let (code, report) = verify(work, config).await?;
    expect(code, &report, (0, 0, 1, 0), 0)?;
    ensure!(
        ids(&report, "duplicates") == [copied.to_string()],
        "{report:#}"
    );

    let phantom = Uuid::now_v7();
    let mut line: Value = serde_json::from_str(&original[line_of(events[1].0)?])?;
    line["id"] = phantom.to_string().into();
    line["headers"]["id"] = phantom.to_string().into();
    line["headers"]
        .as_object_mut()
        .context("headers")?
        .remove("aggregate_seq");
    lines.push(line.to_string());
    write(&lines)?;
    let (code, report) = verify(work, config).await?;
    expect(code, &report, (0, 1, 1, 0), 1)?;
    ensure!(
        ids(&report, "phantom") == [phantom.to_string()],
        "{report:#}"
    );

    let (earlier, later) = pair_of(events, "a2");
    lines.swap(line_of(earlier)?, line_of(later)?);
    write(&lines)?;
    let (code, report) = verify(work, config).await?;
    expect(code, &report, (0, 1, 1, 1), 1)?;
    ensure!(
        ids(&report, "order_breaks") == [earlier.to_string()],
        "{report:#}"
    );

    let gone = events[7].0;
    lines.retain(|l| !l.contains(&gone.to_string()));
    write(&lines)?;
    let (code, report) = verify(work, config).await?;
    expect(code, &report, (1, 1, 1, 1), 1)?;
    ensure!(ids(&report, "lost") == [gone.to_string()], "{report:#}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_reads_the_file_sink_on_sqlite() -> anyhow::Result<()> {
    let work = Workdir::new()?;
    let db = work.path().join("outbox.db");
    let config = work.write_config(
        "outbox.toml",
        &format!(
            "[source]\nkind = \"sqlite\"\npath = \"{}\"\n[sink]\nkind = \"file\"\npath = \"events.jsonl\"\n",
            db.display()
        ),
    )?;
    work.run_ok(&["migrate", "--config", config.to_str().context("path")?])
        .await?;
    let pool = sqlx::SqlitePool::connect(&format!("sqlite:{}", db.display())).await?;
    let events = events(12);
    for (id, aggregate) in &events {
        sqlx::query("INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload) VALUES (?1, 'Order', ?2, 'order.changed', '{}')")
            .bind(id.to_string())
            .bind(aggregate)
            .execute(&pool)
            .await?;
    }
    let mut relay = work.spawn_relay(&config, "relay.log")?;
    outbox_testkit::wait::eventually(WAIT, || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM outbox WHERE state = 'pending'")
            .fetch_one(&pool)
            .await
            .is_ok_and(|n| n == 0)
    })
    .await
    .with_context(|| work.read_log("relay.log"))?;
    let code = terminate(&mut relay, WAIT).await?;
    ensure!(code == Some(0), "{}", work.read_log("relay.log"));
    let (code, report) = verify(&work, &config).await?;
    expect(code, &report, (0, 0, 0, 0), 0)?;
    file_faults(&work, &config, &events).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_reads_the_file_sink_on_postgres_cdc() -> anyhow::Result<()> {
    let url = Postgres::shared().await?.fresh_database().await?;
    let work = Workdir::new()?;
    let tag = format!("verify{}", Uuid::new_v4().simple());
    let config = work.write_config(
        "outbox.toml",
        &format!(
            "[source]\nkind = \"postgres\"\nurl = \"{url}\"\nmode = \"cdc\"\nslot = \"s_{tag}\"\npublication = \"p_{tag}\"\nheartbeat_interval = \"1s\"\n[sink]\nkind = \"file\"\npath = \"events.jsonl\"\n"
        ),
    )?;
    work.run_ok(&["migrate", "--config", config.to_str().context("path")?])
        .await?;
    let pool = sqlx::PgPool::connect(&url).await?;
    let mut relay = work.spawn_relay(&config, "relay.log")?;
    let events = events(12);
    insert_pg(&pool, &events).await?;
    let path = work.path().join("events.jsonl");
    outbox_testkit::wait::eventually(WAIT, || async {
        lines_of(&path).is_ok_and(|l| l.len() >= events.len())
    })
    .await
    .with_context(|| work.read_log("relay.log"))?;
    // The relay keeps running: verify waits for its slot to confirm what was committed
    // (other databases of the cluster move the WAL on, which a stopped relay never confirms).
    let (code, report) = verify(&work, &config).await?;
    expect(code, &report, (0, 0, 0, 0), 0)?;
    ensure!(report["source"]["basis"]["kind"] == "stream", "{report:#}");
    ensure!(report["matched"] == 12, "{report:#}");
    file_faults(&work, &config, &events).await?;
    let code = terminate(&mut relay, WAIT).await?;
    ensure!(code == Some(0), "{}", work.read_log("relay.log"));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_reads_the_file_sink_on_mariadb() -> anyhow::Result<()> {
    let url = MariaDb::shared().await?.fresh_database().await?;
    let work = Workdir::new()?;
    let config = work.write_config(
        "outbox.toml",
        &format!("[source]\nkind = \"mysql\"\nurl = \"{url}\"\n[sink]\nkind = \"file\"\npath = \"events.jsonl\"\n"),
    )?;
    work.run_ok(&["migrate", "--config", config.to_str().context("path")?])
        .await?;
    let pool = sqlx::MySqlPool::connect(&url).await?;
    let events = events(12);
    for (id, aggregate) in &events {
        sqlx::query("INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload) VALUES (?, 'Order', ?, 'order.changed', '{}')")
            .bind(id.to_string())
            .bind(aggregate)
            .execute(&pool)
            .await?;
    }
    let mut relay = work.spawn_relay(&config, "relay.log")?;
    outbox_testkit::wait::eventually(WAIT, || async {
        sqlx::query_scalar::<_, i64>("SELECT COUNT(*) FROM outbox WHERE state = 'pending'")
            .fetch_one(&pool)
            .await
            .is_ok_and(|n| n == 0)
    })
    .await
    .with_context(|| work.read_log("relay.log"))?;
    let code = terminate(&mut relay, WAIT).await?;
    ensure!(code == Some(0), "{}", work.read_log("relay.log"));
    let (code, report) = verify(&work, &config).await?;
    expect(code, &report, (0, 0, 0, 0), 0)?;
    file_faults(&work, &config, &events).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_cannot_verify_an_unreachable_broker_and_says_where() -> anyhow::Result<()> {
    let url = Postgres::shared().await?.fresh_database().await?;
    let work = Workdir::new()?;
    // A port nothing listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let config = work.write_config(
        "outbox.toml",
        &format!(
            "[source]\nkind = \"postgres\"\nurl = \"{url}\"\n[sink]\nkind = \"nats\"\nurl = \"nats://verifier:s3cr3t-pw@127.0.0.1:{port}\"\n"
        ),
    )?;
    work.run_ok(&["migrate", "--config", config.to_str().context("path")?])
        .await?;
    let out = work
        .run(&["verify", "--config", config.to_str().context("path")?])
        .await?;
    ensure!(out.code == Some(2), "{out:?}");
    out.assert_clear_error(&format!("nats://verifier:***@127.0.0.1:{port}"))?;
    ensure!(
        !out.stdout.contains("s3cr3t-pw") && !out.stderr.contains("s3cr3t-pw"),
        "password printed: {out:?}"
    );
    ensure!(
        !out.stdout.contains("0 lost") && !out.stdout.contains("PASS"),
        "{out:?}"
    );
    let (code, report) = verify(&work, &config).await?;
    ensure!(
        code == 2 && report["verdict"] == "cannot_verify",
        "{report:#}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_says_what_it_cannot_verify() -> anyhow::Result<()> {
    let work = Workdir::new()?;
    let db = work.path().join("outbox.db");
    // A queue: reading it back would take messages from its consumers.
    let sqs = work.write_config(
        "sqs.toml",
        &format!(
            "[source]\nkind = \"sqlite\"\npath = \"{}\"\n[sink]\nkind = \"sqs\"\nqueue_url = \"https://sqs.eu-west-1.amazonaws.com/123456789012/orders\"\nregion = \"eu-west-1\"\n",
            db.display()
        ),
    )?;
    work.run_ok(&["migrate", "--config", sqs.to_str().context("path")?])
        .await?;
    let out = work
        .run(&["verify", "--config", sqs.to_str().context("path")?])
        .await?;
    ensure!(out.code == Some(2), "{out:?}");
    out.assert_clear_error("cannot be read back without taking messages from its consumers")?;
    ensure!(out.stderr.contains("consumer-side canary"), "{out:?}");

    // Rows deleted on delivery: nothing in the table says what should be at the destination.
    let deleting = work.write_config(
        "delete.toml",
        &format!(
            "[source]\nkind = \"sqlite\"\npath = \"{}\"\non_delivered = \"delete\"\n[sink]\nkind = \"file\"\npath = \"events.jsonl\"\n",
            db.display()
        ),
    )?;
    std::fs::write(work.path().join("events.jsonl"), "")?;
    let (code, report) = verify(&work, &deleting).await?;
    ensure!(
        code == 2 && report["verdict"] == "cannot_verify",
        "{report:#}"
    );
    ensure!(
        report["cannot_verify"]
            .as_str()
            .is_some_and(|r| r.contains("on_delivered = \"delete\"")),
        "{report:#}"
    );
    Ok(())
}

/// The speed of `outbox verify` (docs/benchmarks.md, "`outbox verify`"): a real relay delivers
/// `OUTBOX_VERIFY_BENCH_EVENTS` events (default 100,000, over 1,000 aggregates), then the
/// binary named by `OUTBOX_VERIFY_BIN` (default: this build's) verifies the window three
/// times; prints the wall time and delivered events verified per second of each run.
///
/// ```sh
/// cargo build --release -p outbox-cli
/// OUTBOX_VERIFY_BIN=target/release/outbox cargo test -p outbox-cli --test verify -- --ignored --nocapture verify_speed
/// ```
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a benchmark: run with --ignored --nocapture"]
async fn verify_speed() -> anyhow::Result<()> {
    let n: i64 = std::env::var("OUTBOX_VERIFY_BENCH_EVENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000);
    let bin = std::env::var("OUTBOX_VERIFY_BIN").unwrap_or_else(|_| support::BIN.to_owned());
    let nats = Nats::shared().await?;
    let redis_url = Redis::shared().await?.url().to_owned();
    println!("verify_speed: {n} events, binary {bin}");
    for sink in ["nats", "redis", "file"] {
        let work = Workdir::new()?;
        let scope = scope();
        let sink_section = match sink {
            "nats" => format!(
                "kind = \"nats\"\nurl = \"{}\"\ndestination = \"{scope}.{{aggregate_type}}\"\nstream = \"{}\"",
                nats.url(),
                scope.to_uppercase()
            ),
            "redis" => format!(
                "kind = \"redis\"\nurl = \"{redis_url}\"\ndestination = \"{scope}.{{aggregate_type}}\""
            ),
            _ => "kind = \"file\"\npath = \"events.jsonl\"\nsync = false".to_owned(),
        };
        let (source, label) = if sink == "file" {
            (
                format!(
                    "kind = \"sqlite\"\npath = \"{}\"",
                    work.path().join("outbox.db").display()
                ),
                "SQLite + file",
            )
        } else {
            let url = Postgres::shared().await?.fresh_database().await?;
            (
                format!("kind = \"postgres\"\nurl = \"{url}\""),
                if sink == "nats" {
                    "PostgreSQL + NATS JetStream"
                } else {
                    "PostgreSQL + Redis Streams"
                },
            )
        };
        let config = work.write_config(
            "outbox.toml",
            &format!("[source]\n{source}\n[relay]\nbatch_size = 1000\n[sink]\n{sink_section}\n"),
        )?;
        let cfg = config.to_str().context("path")?;
        work.run_ok(&["migrate", "--config", cfg]).await?;
        let mut relay = work.spawn_relay(&config, "relay.log")?;
        if sink == "file" {
            let pool = sqlx::SqlitePool::connect(&format!(
                "sqlite:{}",
                work.path().join("outbox.db").display()
            ))
            .await?;
            sqlx::query(
                "WITH RECURSIVE g(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM g WHERE i < ?1) \
                 INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) \
                 SELECT 'Order', 'a' || (i % 1000), 'order.changed', '{\"n\":' || i || '}' FROM g",
            )
            .bind(n)
            .execute(&pool)
            .await?;
            outbox_testkit::wait::eventually(Duration::from_secs(600), || async {
                sqlx::query_scalar::<_, i64>("SELECT count(*) FROM outbox WHERE state = 'pending'")
                    .fetch_one(&pool)
                    .await
                    .is_ok_and(|p| p == 0)
            })
            .await
            .with_context(|| work.read_log("relay.log"))?;
        } else {
            let url = source
                .split('"')
                .nth(3)
                .context("the source url")?
                .to_owned();
            let pool = sqlx::PgPool::connect(&url).await?;
            sqlx::query(
                "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) \
                 SELECT 'Order', 'a' || (g % 1000), 'order.changed', \
                        convert_to('{\"n\":' || g || '}', 'UTF8') \
                 FROM generate_series(1, $1) AS g",
            )
            .bind(n)
            .execute(&pool)
            .await?;
            wait_drained(&pool, WAIT)
                .await
                .with_context(|| work.read_log("relay.log"))?;
        }
        let code = terminate(&mut relay, WAIT).await?;
        ensure!(code == Some(0), "{}", work.read_log("relay.log"));
        let mut runs = Vec::new();
        for _ in 0..3 {
            let out = tokio::process::Command::new(&bin)
                .args(["verify", "--config", cfg, "--since", "1h", "--json"])
                .current_dir(work.path())
                .output()
                .await?;
            let report: Value = serde_json::from_slice(&out.stdout)
                .with_context(|| format!("no report: {}", String::from_utf8_lossy(&out.stderr)))?;
            ensure!(
                out.status.code() == Some(0) && report["matched"] == n,
                "{report:#}"
            );
            runs.push(report["seconds"].as_f64().context("seconds")?);
        }
        runs.sort_by(f64::total_cmp);
        #[allow(clippy::cast_precision_loss)]
        let rate = |s: f64| n as f64 / s;
        println!(
            "verify_speed: {label}: {n} events, wall {:.2} s median (runs {:.2}-{:.2} s), {:.0} events/s median ({:.0}-{:.0})",
            runs[1],
            runs[0],
            runs[2],
            rate(runs[1]),
            rate(runs[2]),
            rate(runs[0])
        );
    }
    Ok(())
}
