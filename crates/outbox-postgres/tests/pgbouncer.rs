//! Through PgBouncer in transaction pooling mode (Debian's 1.18: no prepared statements
//! across transactions), with fewer server connections than clients so that clients really
//! share them: `outbox migrate`, the producer and the polling relay's replicas pass the whole
//! source conformance suite (no loss, no phantom, per-aggregate order under concurrent
//! commits, retries, dead letters). With the producer's statements named (sqlx's default,
//! `PgOutbox::transaction_pooling(false)`), the same suite fails at its first check.
#![allow(clippy::disallowed_methods)] // tests talk to PostgreSQL directly, never through a pooler

mod support;

use outbox_core::{DeadLetterPolicy, NewEvent, Ordering, Source};
use outbox_postgres::{MigrateOptions, OnDelivered, PgOutbox, PostgresConfig};
use outbox_testkit::conformance::Harness;
use outbox_testkit::services::{PgBouncer, Postgres};
use sqlx::PgPool;
use support::PgHarness;

/// A fresh outbox behind its own PgBouncer: the producer writes and the replicas claim
/// through it; the suite checks directly.
async fn bounced() -> anyhow::Result<(PgHarness, PgPool)> {
    outbox_testkit::init_tracing();
    let pg = Postgres::shared().await?;
    let url = pg.fresh_database().await?;
    // Four server connections for up to 3 claiming replicas, the producers and the suite.
    let bouncer = PgBouncer::start(&url, 4).await?;
    let mut config = PostgresConfig::new(bouncer.url());
    config.transaction_pooling = true;
    config.on_delivered = OnDelivered::Mark;
    config.validate().map_err(anyhow::Error::msg)?;
    // Schema changes go to PostgreSQL itself (docs/operations.md, "Through PgBouncer"): the
    // pooled pool ends a transaction when its connection goes back, a moment later.
    let direct = PgPool::connect(&url).await?;
    outbox_postgres::migrate_with(
        &direct,
        &config.qualified_table(),
        MigrateOptions::from_config(&config),
    )
    .await?;
    let pooled = outbox_postgres::connect(&config, 16).await?;
    let claims = outbox_postgres::connect_claims(&config, &pooled, 4).await?;
    let harness = PgHarness {
        pool: direct,
        writes: claims.clone(),
        claims,
        outbox: PgOutbox::new(config.qualified_table()).transaction_pooling(true),
        config,
        keep: Some(Box::new(bouncer)),
    };
    Ok((harness, pooled))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_polling_relay_and_the_producer_pass_the_conformance_suite_through_pgbouncer()
-> anyhow::Result<()> {
    outbox_testkit::conformance::run_all(|| async { Ok(bounced().await?.0) }).await
}

/// The statement pool (everything but claims) keeps working when many short uses interleave
/// over few server connections: every use is its own transaction, so nothing prepared in one
/// is looked for in another.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn interleaved_reads_and_writes_through_pgbouncer_never_miss_a_statement()
-> anyhow::Result<()> {
    let (h, pooled) = bounced().await?;
    let mut tasks = Vec::new();
    for t in 0..8 {
        let writes = h.writes.clone();
        let outbox = h.outbox.clone();
        let inspector = outbox_postgres::PgInspector::new(pooled.clone(), &h.config);
        tasks.push(tokio::spawn(async move {
            for i in 0..25 {
                // Real transactions (committed when commit returns) on pooled server
                // connections, as an application writes.
                let mut tx = writes.begin().await?;
                outbox
                    .enqueue(
                        &mut *tx,
                        &NewEvent::new("Order", format!("t{t}"), "order.step", i.to_string()),
                    )
                    .await?;
                tx.commit().await?;
                // A read outside any explicit transaction, between other clients' writes.
                let backlog = inspector
                    .backlog_at(time::OffsetDateTime::now_utc())
                    .await?;
                anyhow::ensure!(backlog.pending >= 1, "{backlog:?}");
            }
            anyhow::Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    let total: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox")
        .fetch_one(&h.pool)
        .await?;
    anyhow::ensure!(total == 200, "{total} rows for 200 enqueued");
    // The relay's claims drain them through PgBouncer.
    let mut source = h
        .source(Ordering::PerAggregate, DeadLetterPolicy::HoldAggregate)
        .await?;
    let fetched = source.fetch(500, time::OffsetDateTime::now_utc()).await?;
    anyhow::ensure!(fetched.events.len() == 200, "{}", fetched.events.len());
    Ok(())
}
