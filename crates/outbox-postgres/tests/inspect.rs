//! What `outbox status` shows: the backlog, aggregates held back, and producers waiting on an
//! aggregate's ordering lock (with the holder's pid and transaction age).
#![allow(clippy::disallowed_methods)] // tests talk to PostgreSQL directly, never through a pooler

mod support;

use std::time::Duration;

use anyhow::{Context, ensure};
use outbox_core::NewEvent;
use outbox_postgres::{OnDelivered, PgInspector};
use support::PgHarness;
use time::OffsetDateTime;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_producer_transaction_is_named_with_its_pid_and_the_waiter() -> anyhow::Result<()> {
    let h = PgHarness::new(OnDelivered::Mark).await?;
    let inspector = PgInspector::new(h.pool.clone(), &h.config);
    let mut holder = h.pool.begin().await?;
    h.outbox
        .enqueue(&mut *holder, &NewEvent::new("Order", "hot", "a", "1"))
        .await?;
    let holder_pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut *holder)
        .await?;
    let waiter = {
        let pool = h.pool.clone();
        let outbox = h.outbox.clone();
        tokio::spawn(async move {
            let mut tx = pool.begin().await?;
            outbox
                .enqueue(&mut *tx, &NewEvent::new("Order", "hot", "b", "2"))
                .await?;
            tx.commit().await?;
            anyhow::Ok(())
        })
    };
    outbox_testkit::wait::eventually(Duration::from_secs(10), || async {
        inspector.lock_waits(10).await.is_ok_and(|w| !w.is_empty())
    })
    .await
    .context("the waiting producer never showed up")?;
    let waits = inspector.lock_waits(10).await?;
    ensure!(waits[0].holder_pid == holder_pid, "{waits:?}");
    ensure!(
        waits[0].holder_state.as_deref() == Some("idle in transaction"),
        "{waits:?}"
    );
    holder.commit().await?;
    waiter.await??;
    ensure!(inspector.lock_waits(10).await?.is_empty());
    Ok(())
}

#[tokio::test]
async fn backlog_and_held_aggregates_reflect_the_table() -> anyhow::Result<()> {
    let h = PgHarness::new(OnDelivered::Mark).await?;
    let inspector = PgInspector::new(h.pool.clone(), &h.config);
    outbox_testkit::conformance::Harness::write(
        &h,
        vec![
            NewEvent::new("Order", "a", "x", "1"),
            NewEvent::new("Order", "a", "x", "2"),
            NewEvent::new("Order", "b", "x", "3"),
        ],
        true,
    )
    .await?;
    sqlx::query(
        "UPDATE outbox SET state = 'dead', attempts = 3, last_error = 'boom' WHERE payload = '1'",
    )
    .execute(&h.pool)
    .await?;
    sqlx::query("UPDATE outbox SET attempts = 1, next_attempt_at = now() + interval '1 hour', last_error = 'later' WHERE payload = '3'")
        .execute(&h.pool)
        .await?;
    let now = OffsetDateTime::now_utc();
    let b = inspector.backlog_at(now).await?;
    ensure!(b.pending == 2 && b.dead == 1 && b.retrying == 1, "{b:?}");
    let held = inspector.held_aggregates(now, 10).await?;
    ensure!(held.len() == 2, "{held:?}");
    let a = held.iter().find(|x| x.aggregate_id == "a").context("a")?;
    ensure!(
        a.state == "dead" && a.waiting == 1 && a.last_error.as_deref() == Some("boom"),
        "{a:?}"
    );
    let bb = held.iter().find(|x| x.aggregate_id == "b").context("b")?;
    ensure!(
        bb.state == "pending" && bb.next_attempt_at.is_some() && bb.waiting == 0,
        "{bb:?}"
    );
    Ok(())
}
