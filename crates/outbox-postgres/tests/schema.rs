//! The schema and the producer: idempotent and concurrent `migrate`, defaults for plain-SQL
//! producers, custom schema and table names, the optional wake-up trigger, `enqueue`.
#![allow(clippy::disallowed_methods)] // tests talk to PostgreSQL directly, never through a pooler

mod support;

use std::time::Duration;

use anyhow::ensure;
use outbox_core::{Identifier, NewEvent, QualifiedTable};
use outbox_postgres::{PgOutbox, PostgresConfig};
use outbox_testkit::services::Postgres;

async fn fresh_pool() -> anyhow::Result<(sqlx::PgPool, String)> {
    let url = Postgres::shared().await?.fresh_database().await?;
    Ok((sqlx::PgPool::connect(&url).await?, url))
}

fn table(schema: &str, name: &str) -> QualifiedTable {
    QualifiedTable::new(
        Some(Identifier::new(schema).expect("valid")),
        Identifier::new(name).expect("valid"),
    )
}

#[tokio::test]
async fn concurrent_migrations_apply_once_and_a_rerun_is_a_no_op() -> anyhow::Result<()> {
    let (pool, _) = fresh_pool().await?;
    let t = table("public", "outbox");
    let runs =
        futures::future::join_all((0..4).map(|_| outbox_postgres::migrate(&pool, &t, false))).await;
    let mut applied = 0;
    for r in runs {
        applied += r?.applied.len();
    }
    let expected = outbox_postgres::SCHEMA_VERSION as usize;
    ensure!(
        applied == expected,
        "{expected} migrations applied {applied} times"
    );
    let again = outbox_postgres::migrate(&pool, &t, false).await?;
    ensure!(
        again.applied.is_empty() && again.version == outbox_postgres::SCHEMA_VERSION,
        "{again:?}"
    );
    let recorded: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox_migrations")
        .fetch_one(&pool)
        .await?;
    ensure!(
        recorded == i64::from(outbox_postgres::SCHEMA_VERSION),
        "{recorded} bookkeeping rows"
    );
    ensure!(
        outbox_postgres::schema_version(&pool, &t).await? == Some(outbox_postgres::SCHEMA_VERSION)
    );
    // Migration 0006: the delivery-position heads, updated once per aggregate and batch, keep
    // half of each page free for their next versions (heap-only updates).
    let options: Option<Vec<String>> = sqlx::query_scalar(
        "SELECT reloptions FROM pg_class WHERE oid = 'public.outbox_aggregate_positions'::regclass",
    )
    .fetch_one(&pool)
    .await?;
    ensure!(
        options.as_deref() == Some(&["fillfactor=50".to_owned()][..]),
        "reloptions {options:?}"
    );
    Ok(())
}

#[tokio::test]
async fn plain_sql_insert_gets_a_uuid_v7_id_a_timestamp_and_a_seq() -> anyhow::Result<()> {
    let (pool, _) = fresh_pool().await?;
    outbox_postgres::migrate(&pool, &table("public", "outbox"), false).await?;
    sqlx::query("INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('Order', 'o_91f2', 'order.placed', '{\"order_id\":\"o_91f2\"}')")
        .execute(&pool)
        .await?;
    let (id, seq, state, headers): (uuid::Uuid, i64, String, serde_json::Value) =
        sqlx::query_as("SELECT id, seq, state, headers FROM outbox")
            .fetch_one(&pool)
            .await?;
    ensure!(id.get_version_num() == 7, "default id {id} is not a UUIDv7");
    ensure!(seq > 0 && state == "pending" && headers == serde_json::json!({}));
    let bad = sqlx::query("INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, headers) VALUES ('a', 'b', 'c', 'd', '[1]')")
        .execute(&pool)
        .await;
    ensure!(
        bad.is_err(),
        "headers that are not a JSON object were accepted"
    );
    Ok(())
}

#[tokio::test]
async fn a_custom_schema_and_table_work_end_to_end() -> anyhow::Result<()> {
    let (pool, url) = fresh_pool().await?;
    let t = table("events", "order_outbox");
    outbox_postgres::migrate(&pool, &t, false).await?;
    let outbox = PgOutbox::new(t.clone());
    let mut tx = pool.begin().await?;
    let id = outbox
        .enqueue(
            &mut *tx,
            &NewEvent::json("Order", "o1", "order.placed", &serde_json::json!({"n": 1}))?
                .with_header("tenant", "acme"),
        )
        .await?;
    tx.commit().await?;
    let (payload, headers): (Vec<u8>, serde_json::Value) =
        sqlx::query_as("SELECT payload, headers FROM events.order_outbox WHERE id = $1")
            .bind(id)
            .fetch_one(&pool)
            .await?;
    ensure!(payload == br#"{"n":1}"#, "payload bytes changed");
    ensure!(headers == serde_json::json!({"tenant": "acme"}));
    let mut config = PostgresConfig::new(url);
    config.schema = Identifier::new("events")?;
    config.table = Identifier::new("order_outbox")?;
    let mut source = outbox_postgres::PgPollSource::new(
        pool.clone(),
        &config,
        outbox_core::Ordering::PerAggregate,
        outbox_core::DeadLetterPolicy::HoldAggregate,
    );
    let fetched =
        outbox_core::Source::fetch(&mut source, 10, time::OffsetDateTime::now_utc()).await?;
    ensure!(fetched.events.len() == 1 && fetched.events[0].id == id);
    ensure!(
        fetched.events[0].headers
            == vec![
                ("tenant".to_owned(), "acme".to_owned()),
                ("aggregate_seq".to_owned(), "1".to_owned())
            ]
    );
    Ok(())
}

#[tokio::test]
async fn enqueue_refuses_an_event_without_an_aggregate_id() -> anyhow::Result<()> {
    let (pool, _) = fresh_pool().await?;
    outbox_postgres::migrate(&pool, &table("public", "outbox"), false).await?;
    let err =
        outbox_postgres::enqueue(&pool, &NewEvent::new("Order", "", "order.placed", "x")).await;
    ensure!(
        matches!(err, Err(outbox_postgres::EnqueueError::Invalid(_))),
        "{err:?}"
    );
    Ok(())
}

#[tokio::test]
async fn listen_notify_installs_the_trigger_and_wakes_a_waiting_relay() -> anyhow::Result<()> {
    let (pool, url) = fresh_pool().await?;
    let t = table("public", "outbox");
    outbox_postgres::migrate(&pool, &t, true).await?;
    let triggers: i64 =
        sqlx::query_scalar("SELECT count(*) FROM pg_trigger WHERE tgname = 'outbox_wakeup'")
            .fetch_one(&pool)
            .await?;
    ensure!(triggers == 1, "wake-up trigger not installed");
    let mut config = PostgresConfig::new(url);
    config.listen_notify = true;
    let mut source = outbox_postgres::PgPollSource::new(
        pool.clone(),
        &config,
        outbox_core::Ordering::PerAggregate,
        outbox_core::DeadLetterPolicy::HoldAggregate,
    );
    // First wait opens the LISTEN connection (and times out: nothing was inserted).
    outbox_core::Source::wait_for_events(&mut source, Duration::from_millis(50)).await;
    let producer = {
        let pool = pool.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(100)).await;
            outbox_postgres::enqueue(&pool, &NewEvent::new("Order", "o1", "x", "y")).await
        })
    };
    let woke = tokio::time::timeout(
        Duration::from_secs(20),
        outbox_core::Source::wait_for_events(&mut source, Duration::from_secs(60)),
    )
    .await;
    producer.await??;
    ensure!(woke.is_ok(), "the relay was not woken by the insert");
    outbox_postgres::migrate(&pool, &t, false).await?;
    let triggers: i64 =
        sqlx::query_scalar("SELECT count(*) FROM pg_trigger WHERE tgname = 'outbox_wakeup'")
            .fetch_one(&pool)
            .await?;
    ensure!(triggers == 0, "wake-up trigger not removed");
    Ok(())
}
