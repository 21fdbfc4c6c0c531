//! End to end through the binary for the Kafka sink: plain-SQL producers, PostgreSQL,
//! `outbox relay` with `kind = "kafka"`, and a real librdkafka consumer reading tansu.
//! Checks that the `[sink]` kind and `[sink.settings]` are wired in, that `create_topics`
//! works through the binary, per-aggregate order, exact bytes, key and event id, and that
//! SIGTERM drains and exits cleanly.

#![cfg(feature = "kafka")]

mod support;

use std::time::Duration;

use anyhow::{Context, ensure};
use outbox_testkit::services::{Kafka, Postgres};
use rdkafka::Message as _;
use rdkafka::message::Headers as _;
use support::{Workdir, terminate, wait_drained};

const WAIT: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_relay_publishes_events_to_kafka_in_commit_order() -> anyhow::Result<()> {
    let url = Postgres::shared().await?.fresh_database().await?;
    let kafka = Kafka::shared().await?;
    let scope = format!("t{}", &uuid::Uuid::now_v7().simple().to_string()[20..]);
    let work = Workdir::new()?;
    let config = work.write_config(
        "outbox.toml",
        &format!(
            r#"
[source]
kind = "postgres"
url = "{url}"
[sink]
kind = "kafka"
brokers = "{brokers}"
destination = "{scope}.{{aggregate_type}}"
create_topics = true
topic_partitions = 2
delivery_timeout = "10s"
[sink.settings]
"linger.ms" = 2
"client.id" = "outbox-e2e"
"#,
            brokers = kafka.brokers()
        ),
    )?;
    let config = config.to_str().context("utf-8 path")?;
    let out = work.run(&["migrate", "--config", config]).await?;
    ensure!(out.code == Some(0), "{out:?}");

    let pool = sqlx::PgPool::connect(&url).await?;
    for (aggregate_type, aggregate_id, event_type, payload) in [
        ("Order", "o_1", "order.placed", "{\"n\":1}"),
        ("Invoice", "i_1", "invoice.sent", "{\"n\":2}"),
        ("Order", "o_1", "order.paid", "{\"n\":3}"),
    ] {
        sqlx::query(
            "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, headers) \
             VALUES ($1, $2, $3, convert_to($4, 'UTF8'), '{\"tenant\":\"acme\"}')",
        )
        .bind(aggregate_type)
        .bind(aggregate_id)
        .bind(event_type)
        .bind(payload)
        .execute(&pool)
        .await?;
    }
    let ids = sqlx::query_scalar::<_, String>("SELECT id::text FROM outbox ORDER BY created_at")
        .fetch_all(&pool)
        .await?;

    let mut relay = work.spawn_relay(std::path::Path::new(config), "relay.log")?;
    wait_drained(&pool, WAIT)
        .await
        .with_context(|| work.read_log("relay.log"))?;

    let orders = kafka
        .consume(&[&format!("{scope}.Order")], 2, Duration::from_secs(10))
        .await?;
    let invoices = kafka
        .consume(&[&format!("{scope}.Invoice")], 1, Duration::from_secs(10))
        .await?;
    let header = |m: &rdkafka::message::OwnedMessage, name: &str| {
        m.headers().and_then(|hs| {
            hs.iter()
                .find(|h| h.key == name)
                .and_then(|h| h.value)
                .map(|v| String::from_utf8_lossy(v).into_owned())
        })
    };
    let order_ids: Vec<Option<String>> = orders.iter().map(|m| header(m, "id")).collect();
    ensure!(
        order_ids == [Some(ids[0].clone()), Some(ids[2].clone())],
        "o_1 in commit order: {order_ids:?} vs {ids:?}"
    );
    ensure!(orders[1].payload() == Some(&b"{\"n\":3}"[..]));
    ensure!(orders[1].key() == Some(&b"o_1"[..]));
    ensure!(header(&orders[1], "tenant").as_deref() == Some("acme"));
    ensure!(header(&orders[1], "event_type").as_deref() == Some("order.paid"));
    ensure!(invoices.len() == 1 && header(&invoices[0], "id").as_deref() == Some(ids[1].as_str()));

    let code = terminate(&mut relay, WAIT).await?;
    ensure!(
        code == Some(0),
        "relay exit {code:?}: {}",
        work.read_log("relay.log")
    );
    Ok(())
}
