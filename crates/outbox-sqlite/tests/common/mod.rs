//! Shared helpers of the SQLite integration tests: a fresh database file per test, a
//! scripted recording sink, and a bounded wait for a condition.

#![allow(dead_code, unreachable_pub)]

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use outbox_core::sink::Delivery;
use outbox_core::{Event, NewEvent, Sink, SinkError};
use outbox_sqlite::{SqliteConfig, SqliteOutbox, connect, migrate};
use sqlx::SqlitePool;

/// A migrated database in its own temporary directory (removed on drop).
pub struct TestDb {
    pub dir: tempfile::TempDir,
    pub config: SqliteConfig,
    pub pool: SqlitePool,
}

impl TestDb {
    /// A fresh database file with the outbox migrated.
    pub async fn new() -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let config = SqliteConfig::new(dir.path().join("outbox.db"));
        let pool = connect(&config).await.expect("open database");
        migrate(&pool, &config.table).await.expect("migrate");
        Self { dir, config, pool }
    }

    /// A second, independent pool on the same file (another "process").
    pub async fn other_pool(&self) -> SqlitePool {
        connect(&self.config).await.expect("open database again")
    }

    /// Commits one event per `(aggregate_id, n)` in its own transaction, in order.
    pub async fn commit_events(&self, events: &[(&str, u32)]) {
        let outbox = SqliteOutbox::new(self.config.table.clone());
        for (aggregate, n) in events {
            let mut tx = self
                .pool
                .begin_with("BEGIN IMMEDIATE")
                .await
                .expect("begin");
            outbox
                .enqueue(&mut *tx, &event(aggregate, *n))
                .await
                .expect("enqueue");
            tx.commit().await.expect("commit");
        }
    }

    /// `(state, attempts, next_attempt_at, last_error)` of the event with `seq`.
    pub async fn row(&self, seq: i64) -> (String, i64, i64, Option<String>) {
        sqlx::query_as(
            "SELECT state, attempts, next_attempt_at, last_error FROM outbox WHERE seq = ?1",
        )
        .bind(seq)
        .fetch_one(&self.pool)
        .await
        .expect("row")
    }

    /// Number of outbox rows in `state`.
    pub async fn count(&self, state: &str) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM outbox WHERE state = ?1")
            .bind(state)
            .fetch_one(&self.pool)
            .await
            .expect("count")
    }
}

/// Event `n` of order `aggregate`; the payload says which, so order can be checked.
pub fn event(aggregate: &str, n: u32) -> NewEvent {
    NewEvent::json(
        "Order",
        aggregate,
        "order.updated",
        &serde_json::json!({ "order": aggregate, "n": n }),
    )
    .expect("json payload")
}

/// The `n` in an event's payload.
pub fn n_of(e: &Event) -> u64 {
    let v: serde_json::Value = serde_json::from_slice(&e.payload).expect("json payload");
    v["n"].as_u64().expect("n")
}

/// What the scripted sink does with an aggregate's events.
#[derive(Debug, Clone)]
pub enum Script {
    /// Reject every event (dead-lettered at once).
    Reject,
    /// Fail this many attempts transiently, then accept.
    FailTimes(u32),
}

/// A sink that records what it acknowledged, in order, and fails aggregates as scripted.
#[derive(Debug, Default)]
pub struct RecordingSink {
    script: Mutex<HashMap<String, Script>>,
    published: Mutex<Vec<Event>>,
    failures: Mutex<Vec<(String, u32)>>,
}

impl RecordingSink {
    /// A sink with `script` per aggregate id; other aggregates are acknowledged.
    pub fn new(script: impl IntoIterator<Item = (&'static str, Script)>) -> Arc<Self> {
        Arc::new(Self {
            script: Mutex::new(script.into_iter().map(|(a, s)| (a.to_owned(), s)).collect()),
            ..Self::default()
        })
    }

    /// Every acknowledged event, in acknowledgement order.
    pub fn published(&self) -> Vec<Event> {
        self.published
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Every failed attempt: (aggregate id, attempts recorded before it).
    pub fn failures(&self) -> Vec<(String, u32)> {
        self.failures
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl Sink for RecordingSink {
    fn name(&self) -> &'static str {
        "recording"
    }

    async fn publish(&self, batch: &[Event]) -> Result<Vec<Delivery>, SinkError> {
        let mut script = self.script.lock().unwrap_or_else(PoisonError::into_inner);
        let mut out = Vec::with_capacity(batch.len());
        for e in batch {
            let result = match script.get_mut(&e.aggregate_id) {
                Some(Script::Reject) => Err(SinkError::rejected("poison event")),
                Some(Script::FailTimes(n)) if *n > 0 => {
                    *n -= 1;
                    Err(SinkError::transient("broker busy"))
                }
                _ => Ok(()),
            };
            match &result {
                Ok(()) => self
                    .published
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(e.clone()),
                Err(_) => self
                    .failures
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push((e.aggregate_id.clone(), e.attempts)),
            }
            out.push(result);
        }
        Ok(out)
    }

    async fn healthcheck(&self) -> Result<(), SinkError> {
        Ok(())
    }
}

/// Waits until `check` returns true, checking every few milliseconds, at most `limit`.
pub async fn wait_until<F, Fut>(limit: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if check().await {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
