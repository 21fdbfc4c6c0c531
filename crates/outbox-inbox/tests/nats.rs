//! The JetStream consumer loop against a real `nats-server -js`, fed by the relay's
//! `NatsSink`, with the PostgreSQL inbox. Unique subjects and streams per test.

#![cfg(feature = "nats")]

use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream::{self, consumer::pull};
use futures::{FutureExt as _, StreamExt as _};
use outbox_core::{Destination, Event, Position, Sink};
use outbox_inbox::nats::JetStreamConsumer;
use outbox_inbox::{Outcome, PgInbox};
use outbox_sinks::{NatsConfig, NatsSink};
use outbox_testkit::services::{Nats, Postgres};
use outbox_testkit::wait::eventually;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

fn unique() -> String {
    format!("t{}", &Uuid::now_v7().simple().to_string()[20..])
}

async fn sink(nats: &Nats, prefix: &str) -> NatsSink {
    NatsConfig {
        url: nats.url().to_owned(),
        destination: Destination::parse(&format!("{prefix}.event.{{aggregate_type}}"))
            .expect("valid"),
        stream: prefix.to_uppercase(),
        ..NatsConfig::default()
    }
    .build()
    .await
    .expect("builds")
}

fn event(aggregate_id: &str, seq: usize) -> Event {
    Event {
        id: Uuid::now_v7(),
        position: Position(seq as i64),
        aggregate_type: "Order".to_owned(),
        aggregate_id: aggregate_id.to_owned(),
        event_type: "order.placed".to_owned(),
        payload: seq.to_string().into_bytes().into(),
        headers: vec![],
        created_at: time::OffsetDateTime::now_utc(),
        attempts: 0,
    }
}

async fn database() -> PgPool {
    let pg = Postgres::shared().await.expect("postgres starts");
    let pool = PgPool::connect(&pg.fresh_database().await.expect("db"))
        .await
        .expect("connects");
    sqlx::query("CREATE TABLE points (order_id text PRIMARY KEY, n bigint NOT NULL)")
        .execute(&pool)
        .await
        .expect("points");
    PgInbox::default().migrate(&pool).await.expect("migrates");
    pool
}

async fn add_points(
    pool: &PgPool,
    id: Uuid,
    order: String,
) -> Result<Outcome<()>, outbox_inbox::InboxError<sqlx::Error>> {
    PgInbox::default()
        .process(pool, "loyalty", id, |conn| {
            async move {
                sqlx::query("INSERT INTO points VALUES ($1, 10)")
                    .bind(order)
                    .execute(conn)
                    .await?;
                Ok(())
            }
            .boxed()
        })
        .await
}

#[tokio::test]
async fn a_message_redelivered_after_a_crash_between_commit_and_ack_is_a_duplicate() {
    let nats = Nats::shared().await.expect("nats starts");
    let prefix = unique();
    let pool = database().await;
    let e = event("o_1", 1);
    sink(nats, &prefix)
        .await
        .publish(std::slice::from_ref(&e))
        .await
        .expect("published");

    // First run: process and commit, then "crash" (drop the message without an ack).
    let js = jetstream::new(nats.connect().await.expect("connects"));
    let stream = js.get_stream(prefix.to_uppercase()).await.expect("stream");
    let consumer = stream
        .get_or_create_consumer(
            "loyalty",
            pull::Config {
                durable_name: Some("loyalty".to_owned()),
                ack_wait: Duration::from_secs(1),
                ..Default::default()
            },
        )
        .await
        .expect("consumer");
    let mut batch = consumer
        .fetch()
        .max_messages(1)
        .messages()
        .await
        .expect("fetch");
    let first = batch.next().await.expect("a message").expect("ok");
    assert_eq!(
        add_points(&pool, e.id, "o_1".into()).await.expect("first"),
        Outcome::Processed(())
    );
    drop(first);

    // Restart: the loop gets the redelivery, the inbox says duplicate, the loop acks.
    let outcomes = Arc::new(Mutex::new(Vec::new()));
    let shutdown = CancellationToken::new();
    let mut config = JetStreamConsumer::new(nats.url(), prefix.to_uppercase(), "loyalty");
    config.ack_wait = Duration::from_secs(1);
    let run = tokio::spawn({
        let (pool, outcomes, shutdown) = (pool.clone(), outcomes.clone(), shutdown.clone());
        async move {
            config
                .run(
                    move |m| {
                        let (pool, outcomes) = (pool.clone(), outcomes.clone());
                        async move {
                            let o = add_points(&pool, m.id, m.aggregate_id).await?;
                            outcomes.lock().expect("lock").push(o);
                            Ok::<_, outbox_inbox::InboxError<sqlx::Error>>(())
                        }
                    },
                    shutdown,
                )
                .await
        }
    });
    eventually(Duration::from_secs(15), || {
        std::future::ready(!outcomes.lock().expect("lock").is_empty())
    })
    .await
    .expect("redelivered");
    shutdown.cancel();
    let report = run.await.expect("task").expect("runs");
    assert_eq!(report.acked, 1);
    assert_eq!(*outcomes.lock().expect("lock"), vec![Outcome::Duplicate]);
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM points")
        .fetch_one(&pool)
        .await
        .expect("count");
    assert_eq!(n, 1, "exactly one side effect");
}

#[tokio::test]
async fn per_key_order_is_kept_with_four_lanes() {
    let nats = Nats::shared().await.expect("nats starts");
    let prefix = unique();
    let keys = ["a", "b", "c", "d", "e", "f"];
    let events: Vec<Event> = (0..20)
        .flat_map(|seq| keys.iter().map(move |k| event(k, seq)))
        .collect();
    sink(nats, &prefix)
        .await
        .publish(&events)
        .await
        .expect("published");

    let seen = Arc::new(Mutex::new(Vec::<(String, usize)>::new()));
    let shutdown = CancellationToken::new();
    let mut config = JetStreamConsumer::new(nats.url(), prefix.to_uppercase(), "order");
    config.lanes = NonZeroUsize::new(4).expect("not zero");
    let run = tokio::spawn({
        let (seen, shutdown) = (seen.clone(), shutdown.clone());
        async move {
            config
                .run(
                    move |m| {
                        let seen = seen.clone();
                        async move {
                            let seq: usize = std::str::from_utf8(&m.payload)
                                .expect("utf8")
                                .parse()
                                .expect("number");
                            // Uneven handler times, so lanes interleave.
                            tokio::time::sleep(Duration::from_millis((seq % 3) as u64)).await;
                            seen.lock().expect("lock").push((m.aggregate_id, seq));
                            Ok::<_, std::convert::Infallible>(())
                        }
                    },
                    shutdown,
                )
                .await
        }
    });
    eventually(Duration::from_secs(15), || {
        std::future::ready(seen.lock().expect("lock").len() == events.len())
    })
    .await
    .expect("all handled");
    shutdown.cancel();
    let report = run.await.expect("task").expect("runs");
    assert_eq!(report.acked, events.len() as u64);
    let seen = seen.lock().expect("lock");
    for k in keys {
        let seqs: Vec<usize> = seen
            .iter()
            .filter(|(a, _)| a == k)
            .map(|(_, s)| *s)
            .collect();
        assert_eq!(seqs, (0..20).collect::<Vec<_>>(), "order of key {k}");
    }
}
