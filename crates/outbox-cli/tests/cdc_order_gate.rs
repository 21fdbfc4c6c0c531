//! The consumer's order gate (`outbox-inbox`, docs/inbox.md "Order at the consumer") on the
//! messages of a PostgreSQL CDC relay: the relay publishes three aggregates' versions,
//! written by interleaved transactions, to JetStream; the test then hands those exact messages
//! (headers and all) to a second stream in reverse order per aggregate, as a broker
//! redelivering out of order would, and a JetStream consumer with the gate applies them. Each
//! aggregate must be applied 1, 2, 3, … : the gate holds every early message until its
//! predecessor is applied, which it can only do because the CDC relay numbered them
//! (`aggregate_seq`); messages without a number pass unheld and would be applied backwards.

mod support;

use std::time::Duration;

use anyhow::{Context, ensure};
use futures::FutureExt as _;
use outbox_core::NewEvent;
use outbox_inbox::{InboxMessage, PgInbox};
use outbox_postgres::PgOutbox;
use outbox_testkit::services::{Nats, Postgres};
use support::{Workdir, read_stream};
use tokio_util::sync::CancellationToken;

const AGGREGATES: usize = 3;
const VERSIONS: usize = 8;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_order_gate_applies_a_cdc_relays_events_in_order_when_redelivered_out_of_order()
-> anyhow::Result<()> {
    outbox_testkit::init_tracing();
    let pg = Postgres::shared().await?;
    let url = pg.fresh_database().await?;
    let nats = Nats::shared().await?;
    let tag = format!("gate{}", uuid::Uuid::new_v4().simple());
    let work = Workdir::new()?;
    let config = work.write_config(
        "outbox.toml",
        &format!(
            r#"
[source]
kind = "postgres"
url = "{url}"
mode = "cdc"
slot = "s_{tag}"
publication = "p_{tag}"
[relay]
batch_size = 5
[sink]
kind = "nats"
url = "{nats}"
destination = "{tag}.{{aggregate_id}}"
stream = "{tag}"
"#,
            nats = nats.url()
        ),
    )?;
    let migrate = work
        .run(&["migrate", "--config", config.to_str().context("path")?])
        .await?;
    ensure!(migrate.code == Some(0), "migrate failed: {migrate:?}");
    let mut relay = work.spawn_relay(&config, "relay.log")?;

    // Interleaved transactions: each writes the next version of two aggregates.
    let pool = sqlx::PgPool::connect(&url).await?;
    let outbox = PgOutbox::default();
    let mut next = [1usize; AGGREGATES];
    for t in 0..AGGREGATES * VERSIONS / 2 {
        let mut events = Vec::new();
        for a in [t % AGGREGATES, (t + 1) % AGGREGATES] {
            events.push(NewEvent::new(
                "Account",
                format!("a{a}"),
                "account.changed",
                next[a].to_string(),
            ));
            next[a] += 1;
        }
        let mut tx = pool.begin().await?;
        outbox.enqueue_batch(&mut *tx, &events).await?;
        tx.commit().await?;
    }
    let total = AGGREGATES * VERSIONS;
    let client = nats.connect().await?;
    outbox_testkit::wait::eventually(Duration::from_secs(60), || async {
        read_stream(&client, &tag)
            .await
            .is_ok_and(|got| got.len() >= total)
    })
    .await
    .with_context(|| {
        format!(
            "the relay did not publish everything:\n{}",
            work.read_log("relay.log")
        )
    })?;
    relay.start_kill()?;
    relay.wait().await?;
    let mut received = read_stream(&client, &tag).await?;

    // The "redelivery": every aggregate's messages, last first, into a second stream.
    received.reverse();
    let js = async_nats::jetstream::new(client.clone());
    let again = format!("{}_AGAIN", tag.to_uppercase());
    js.create_stream(async_nats::jetstream::stream::Config {
        name: again.clone(),
        subjects: vec![format!("{tag}_again.>")],
        ..Default::default()
    })
    .await?;
    for m in &received {
        let mut headers = async_nats::HeaderMap::new();
        for (k, v) in &m.headers {
            headers.insert(k.as_str(), v.as_str());
        }
        js.publish_with_headers(
            format!("{tag}_again.{}", m.aggregate_id),
            headers,
            m.payload.clone().into(),
        )
        .await?
        .await?;
    }

    let inbox = PgInbox::default();
    inbox.migrate(&pool).await?;
    sqlx::raw_sql("CREATE TABLE applied (n serial PRIMARY KEY, aggregate text, version int)")
        .execute(&pool)
        .await?;
    let mut consumer = outbox_inbox::nats::JetStreamConsumer::new(nats.url(), &again, "gate");
    consumer.ordered = Some(inbox.order_gate(pool.clone(), "gate"));
    let handler = {
        let (pool, inbox) = (pool.clone(), inbox.clone());
        move |m: InboxMessage| {
            let (pool, inbox) = (pool.clone(), inbox.clone());
            async move {
                if let Some(mut tx) = inbox.begin_message(&pool, "gate", &m).await? {
                    let version: i32 = std::str::from_utf8(&m.payload)?.parse()?;
                    sqlx::query("INSERT INTO applied (aggregate, version) VALUES ($1, $2)")
                        .bind(&m.aggregate_id)
                        .bind(version)
                        .execute(&mut *tx)
                        .await?;
                    tx.commit().await?;
                }
                anyhow::Ok(())
            }
            .boxed()
        }
    };
    let stop = CancellationToken::new();
    let run = tokio::spawn({
        let stop = stop.clone();
        async move { consumer.run(handler, stop).await }
    });
    let applied_all = outbox_testkit::wait::eventually(Duration::from_secs(60), || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM applied")
            .fetch_one(&pool)
            .await
            .is_ok_and(|n| n >= total as i64)
    })
    .await;
    stop.cancel();
    run.await??;
    let rows: Vec<(String, i32)> =
        sqlx::query_as("SELECT aggregate, version FROM applied ORDER BY n")
            .fetch_all(&pool)
            .await?;
    applied_all.with_context(|| format!("applied only {rows:?}"))?;
    for a in 0..AGGREGATES {
        let got: Vec<i32> = rows
            .iter()
            .filter(|(agg, _)| *agg == format!("a{a}"))
            .map(|(_, v)| *v)
            .collect();
        let want: Vec<i32> = (1..=VERSIONS as i32).collect();
        ensure!(got == want, "aggregate a{a} applied in the order {got:?}");
    }
    Ok(())
}
