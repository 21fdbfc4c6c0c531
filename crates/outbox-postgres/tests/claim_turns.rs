//! Replicas taking turns at claiming (`source.claim_turns`, docs/ordering.md): an ordered claim
//! holds the table's turn lock until its batch settles, and a turn held too long (a paused
//! relay) never stalls the other replicas: they claim beside it.
#![allow(clippy::disallowed_methods)] // tests talk to PostgreSQL directly, never through a pooler

mod support;

use std::collections::HashSet;

use anyhow::ensure;
use outbox_core::source::{Outcome, Settlement};
use outbox_core::{DeadLetterPolicy, NewEvent, Ordering, Source};
use outbox_postgres::{OnDelivered, PgPollSource, PostgresConfig};
use sqlx::PgPool;
use support::PgHarness;
use time::OffsetDateTime;

/// Claim-turn locks held right now (the two-key advisory locks of class "obtx").
async fn turn_locks(pool: &PgPool) -> anyhow::Result<i64> {
    Ok(sqlx::query_scalar(
        "SELECT count(*) FROM pg_locks
         WHERE locktype = 'advisory' AND granted AND objsubid = 2
           AND classid = x'6f627478'::int::oid
           AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
    )
    .fetch_one(pool)
    .await?)
}

fn source(h: &PgHarness, config: &PostgresConfig) -> PgPollSource {
    PgPollSource::new(
        h.pool.clone(),
        config,
        Ordering::PerAggregate,
        DeadLetterPolicy::HoldAggregate,
    )
}

fn delivered(events: &[outbox_core::Event]) -> Vec<Settlement> {
    events
        .iter()
        .map(|e| Settlement {
            position: e.position,
            outcome: Outcome::Delivered,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_holds_the_turn_until_it_settles_and_a_stuck_turn_stalls_nobody()
-> anyhow::Result<()> {
    let h = PgHarness::new(OnDelivered::Mark).await?;
    let events: Vec<NewEvent> = (0..10)
        .map(|i| NewEvent::new("Order", format!("o_{i}"), "order.placed", "{}"))
        .collect();
    let mut tx = h.pool.begin().await?;
    h.outbox.enqueue_batch(&mut *tx, &events).await?;
    tx.commit().await?;
    ensure!(turn_locks(&h.pool).await? == 0, "no turn taken yet");

    // Replica A claims half and keeps its batch open, as a relay paused mid-publish would.
    let mut a = source(&h, &h.config);
    let now = OffsetDateTime::now_utc();
    let first = a.fetch(5, now).await?;
    ensure!(first.events.len() == 5, "A claimed {}", first.events.len());
    ensure!(
        turn_locks(&h.pool).await? == 1,
        "an open ordered claim holds the turn"
    );

    // Replica B does not wait for A forever: it claims the other half beside it.
    let mut b = source(&h, &h.config);
    let second = b.fetch(10, now).await?;
    let a_ids: HashSet<_> = first.events.iter().map(|e| e.id).collect();
    ensure!(
        second.events.len() == 5 && second.events.iter().all(|e| !a_ids.contains(&e.id)),
        "B claimed {:?}",
        second
            .events
            .iter()
            .map(|e| &e.aggregate_id)
            .collect::<Vec<_>>()
    );

    // Settling A's batch hands the turn back.
    a.settle(&delivered(&first.events), now).await?;
    b.settle(&delivered(&second.events), now).await?;
    ensure!(turn_locks(&h.pool).await? == 0, "the turn was handed back");
    let pending: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox WHERE state = 'pending'")
        .fetch_one(&h.pool)
        .await?;
    ensure!(pending == 0, "{pending} events left pending");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_turns_a_claim_takes_no_turn_lock() -> anyhow::Result<()> {
    let h = PgHarness::new(OnDelivered::Mark).await?;
    let mut tx = h.pool.begin().await?;
    h.outbox
        .enqueue_batch(
            &mut *tx,
            &[NewEvent::new("Order", "o_1", "order.placed", "{}")],
        )
        .await?;
    tx.commit().await?;
    let mut config = h.config.clone();
    config.claim_turns = false;
    let mut a = source(&h, &config);
    let now = OffsetDateTime::now_utc();
    let fetched = a.fetch(5, now).await?;
    ensure!(fetched.events.len() == 1);
    ensure!(
        turn_locks(&h.pool).await? == 0,
        "claim_turns = false takes no lock"
    );
    a.settle(&delivered(&fetched.events), now).await?;
    Ok(())
}
