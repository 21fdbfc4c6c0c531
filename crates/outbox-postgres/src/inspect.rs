//! Read-only views of the outbox for `status`, metrics and the watchdog: the backlog, what
//! holds aggregates back, and producers waiting on an aggregate's ordering lock.

use std::sync::Arc;

use outbox_core::SourceError;
use outbox_core::source::{Backlog, Inspect};
use sqlx::{PgPool, Row};
use time::OffsetDateTime;
use uuid::Uuid;

use crate::config::PostgresConfig;
use crate::error::source_error;
use crate::sql::{Queries, stmt};

/// An aggregate whose oldest undelivered event is retrying or dead-lettered.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct HeldAggregate {
    /// Aggregate type.
    pub aggregate_type: String,
    /// Aggregate id.
    pub aggregate_id: String,
    /// The event at the head of the aggregate.
    pub head_id: Uuid,
    /// `pending` (retrying) or `dead`.
    pub state: String,
    /// Failed attempts of the head event.
    pub attempts: i32,
    /// When the head event is tried again (retrying only).
    #[serde(with = "time::serde::rfc3339::option")]
    pub next_attempt_at: Option<OffsetDateTime>,
    /// The head event's latest error.
    pub last_error: Option<String>,
    /// Pending events of the aggregate waiting behind the head.
    pub waiting: i64,
}

/// A producer transaction holding an aggregate's ordering lock while others wait for it.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct LockWait {
    /// Backend pid of a waiting producer.
    pub waiting_pid: i32,
    /// Backend pid of the transaction holding the lock.
    pub holder_pid: i32,
    /// Age of the holder's transaction, seconds.
    pub holder_xact_age_seconds: Option<f64>,
    /// The holder's state (`active`, `idle in transaction`, ...).
    pub holder_state: Option<String>,
    /// Start of the holder's current or last query.
    pub holder_query: Option<String>,
}

/// Reads backlog and blockers of one outbox table.
#[derive(Debug, Clone)]
pub struct PgInspector {
    pool: PgPool,
    queries: Arc<Queries>,
    table: String,
}

impl PgInspector {
    /// An inspector over `config`'s table.
    pub fn new(pool: PgPool, config: &PostgresConfig) -> Self {
        let table = config.qualified_table();
        Self {
            pool,
            queries: Arc::new(Queries::new(&table)),
            table: table.to_string(),
        }
    }

    fn err(&self, context: &str, e: sqlx::Error) -> SourceError {
        source_error(context, &self.table, e)
    }

    /// Backlog counters at `now`.
    pub async fn backlog_at(&self, now: OffsetDateTime) -> Result<Backlog, SourceError> {
        let row = sqlx::query(stmt(&self.queries.backlog))
            .bind(now)
            .fetch_one(&self.pool)
            .await
            .map_err(|e| self.err("reading the backlog", e))?;
        let get = |i: usize| -> Result<i64, SourceError> {
            row.try_get::<i64, _>(i)
                .map_err(|e| self.err("reading the backlog", e))
        };
        let pending = get(0)?;
        let held = get(1)?;
        let dead = get(2)?;
        let oldest: Option<f64> = row
            .try_get(3)
            .map_err(|e| self.err("reading the backlog", e))?;
        Ok(Backlog {
            pending: pending as u64,
            retrying: (held - dead).max(0) as u64,
            dead: dead as u64,
            oldest_pending_age_seconds: oldest.unwrap_or(0.0).max(0.0),
            delivered_last_minute: Some(get(4)? as u64),
        })
    }

    /// Aggregates held back by a retrying or dead head event, oldest first.
    pub async fn held_aggregates(
        &self,
        now: OffsetDateTime,
        limit: i64,
    ) -> Result<Vec<HeldAggregate>, SourceError> {
        let rows = sqlx::query(stmt(&self.queries.held_aggregates))
            .bind(now)
            .bind(limit)
            .fetch_all(&self.pool)
            .await
            .map_err(|e| self.err("reading held aggregates", e))?;
        rows.iter()
            .map(|r| {
                Ok(HeldAggregate {
                    aggregate_type: r.try_get(0)?,
                    aggregate_id: r.try_get(1)?,
                    head_id: r.try_get(2)?,
                    state: r.try_get(3)?,
                    attempts: r.try_get(4)?,
                    next_attempt_at: r.try_get(5)?,
                    last_error: r.try_get(6)?,
                    waiting: r.try_get(7)?,
                })
            })
            .collect::<Result<_, sqlx::Error>>()
            .map_err(|e| self.err("reading held aggregates", e))
    }

    /// Producers waiting for an aggregate lock, with the transactions holding them.
    pub async fn lock_waits(&self, limit: i64) -> Result<Vec<LockWait>, SourceError> {
        let rows = sqlx::query(stmt(&self.queries.lock_waits))
            .bind(limit)
            .fetch_all(&self.pool)
            .await
            .map_err(|e| self.err("reading lock waits", e))?;
        rows.iter()
            .map(|r| {
                Ok(LockWait {
                    waiting_pid: r.try_get(0)?,
                    holder_pid: r.try_get(1)?,
                    holder_xact_age_seconds: r.try_get(2)?,
                    holder_state: r.try_get(3)?,
                    holder_query: r.try_get(4)?,
                })
            })
            .collect::<Result<_, sqlx::Error>>()
            .map_err(|e| self.err("reading lock waits", e))
    }
}

impl Inspect for PgInspector {
    async fn backlog(&self) -> Result<Backlog, SourceError> {
        self.backlog_at(OffsetDateTime::now_utc()).await
    }
}
