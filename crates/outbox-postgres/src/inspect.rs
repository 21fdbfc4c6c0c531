//! Read-only views of the outbox for `status`, metrics, the watchdog and `outbox why`: the
//! backlog, what holds aggregates back, producers waiting on an aggregate's ordering lock,
//! open transactions (who holds the xmin horizon), and the story of one event.

use std::sync::Arc;

use outbox_core::SourceError;
use outbox_core::admin::{DeliveryModel, EventStory, HeldAggregate, StoredEventDetail, Verdict};
use outbox_core::admin_rows;
use outbox_core::source::{Backlog, Inspect};
use outbox_sql::rows::fetch_decoded;
use sqlx::{PgPool, Row};
use time::OffsetDateTime;
use uuid::Uuid;

use crate::config::PostgresConfig;
use crate::dead::PgDeadLetters;
use crate::error::source_error;
use crate::sql::{Cols, Queries, render, stmt};

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

/// A transaction open in the outbox's database (not the relay's own claims), from
/// `pg_stat_activity`.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct OpenTransaction {
    /// Backend pid (`SELECT pg_terminate_backend(pid)` ends it).
    pub pid: i32,
    /// Database user.
    pub user: Option<String>,
    /// The client's `application_name`.
    pub application_name: Option<String>,
    /// `active`, `idle in transaction`, ...
    pub state: Option<String>,
    /// Age of the transaction, seconds.
    pub xact_age_seconds: f64,
    /// When the transaction started.
    #[serde(with = "time::serde::rfc3339::option")]
    pub xact_start: Option<OffsetDateTime>,
    /// When its current (or last) query started.
    #[serde(with = "time::serde::rfc3339::option")]
    pub query_start: Option<OffsetDateTime>,
    /// The start of that query.
    pub query: Option<String>,
    /// It holds a snapshot or an xid, so vacuum cannot remove rows it may still see.
    pub pins_xmin: bool,
    /// How many transactions ago its xmin is (`age(backend_xmin)`).
    pub xmin_age_xids: Option<i64>,
}

/// What the watchdog and `outbox status` report beyond the backlog counters.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Watchdog {
    /// Pending events (backoff included) created longer ago than the threshold.
    pub stuck_events: i64,
    /// The oldest open transaction of the database, if any (the xmin horizon's holder).
    pub oldest_transaction: Option<OpenTransaction>,
}

/// Reads backlog and blockers of one outbox table.
#[derive(Debug, Clone)]
pub struct PgInspector {
    pool: crate::db::Db,
    queries: Arc<Queries>,
    extra: Arc<ExtraQueries>,
    table: String,
    dead: PgDeadLetters,
    cdc: bool,
}

/// Queries of `why`, `doctor` and the watchdog, rendered once. Kept out of `sql::Queries`,
/// which the relay's hot path shares.
#[derive(Debug)]
struct ExtraQueries {
    why_blocker: String,
    why_claimed: String,
    why_queue: String,
    why_writers: String,
    /// The table as a qualified, quoted name, bound as text where the catalog resolves it.
    table_name: String,
    transactions: String,
    stuck_events: String,
}

impl ExtraQueries {
    fn new(table: &outbox_core::QualifiedTable) -> Self {
        Self {
            why_blocker: render(include_str!("../queries/outbox_why_blocker.sql"), table),
            why_claimed: render(include_str!("../queries/outbox_why_claimed.sql"), table),
            why_queue: render(include_str!("../queries/outbox_why_queue.sql"), table),
            why_writers: render(include_str!("../queries/outbox_why_writers.sql"), table),
            table_name: render("{{table}}", table),
            transactions: render(include_str!("../queries/doctor_transactions.sql"), table),
            stuck_events: render(include_str!("../queries/doctor_stuck_events.sql"), table),
        }
    }
}

fn audited(sql: &str) -> sqlx::AssertSqlSafe<&str> {
    // Rendered by `sql::render` from validated identifiers only.
    sqlx::AssertSqlSafe(sql)
}

/// Reads rows of `doctor_transactions.sql`.
pub(crate) async fn open_transactions(
    pool: &crate::db::Db,
    sql: &str,
    min_age: std::time::Duration,
    limit: i64,
) -> Result<Vec<OpenTransaction>, sqlx::Error> {
    let rows = crate::sql::query(audited(sql))
        .bind(min_age.as_secs_f64())
        .bind(limit)
        .fetch_all(pool)
        .await?;
    transactions(&rows)
}

fn transactions(rows: &[sqlx::postgres::PgRow]) -> Result<Vec<OpenTransaction>, sqlx::Error> {
    rows.iter()
        .map(|r| {
            Ok(OpenTransaction {
                pid: r.try_get(0)?,
                user: r.try_get(1)?,
                application_name: r.try_get(2)?,
                state: r.try_get(3)?,
                xact_age_seconds: r.try_get::<Option<f64>, _>(4)?.unwrap_or(0.0),
                xact_start: r.try_get(5)?,
                query_start: r.try_get(6)?,
                query: r.try_get(7)?,
                pins_xmin: r.try_get(8)?,
                xmin_age_xids: r.try_get(9)?,
            })
        })
        .collect()
}

impl PgInspector {
    /// An inspector over `config`'s table.
    pub fn new(pool: PgPool, config: &PostgresConfig) -> Self {
        let table = config.qualified_table();
        Self {
            dead: PgDeadLetters::new(pool.clone(), config),
            pool: crate::db::Db::new(pool, config.transaction_pooling),
            queries: Arc::new(Queries::new(&table)),
            extra: Arc::new(ExtraQueries::new(&table)),
            table: table.to_string(),
            cdc: config.mode == crate::Mode::Cdc,
        }
    }

    /// Transactions open in this database for at least `min_age`, oldest first (the relay's
    /// own claims and this session excluded).
    pub async fn open_transactions(
        &self,
        min_age: std::time::Duration,
        limit: i64,
    ) -> Result<Vec<OpenTransaction>, SourceError> {
        open_transactions(&self.pool, &self.extra.transactions, min_age, limit)
            .await
            .map_err(|e| self.err("reading open transactions", e))
    }

    /// Transactions that wrote to the outbox table and have not committed yet, oldest first
    /// (the relay's own sessions excluded): an event one of them wrote is not visible yet.
    pub async fn uncommitted_writers(
        &self,
        limit: i64,
    ) -> Result<Vec<OpenTransaction>, SourceError> {
        let e = |e| self.err("reading uncommitted writers", e);
        let rows = crate::sql::query(audited(&self.extra.why_writers))
            .bind(&self.extra.table_name)
            .bind(limit)
            .fetch_all(&self.pool)
            .await
            .map_err(e)?;
        transactions(&rows).map_err(e)
    }

    /// The watchdog's view at `now`: pending events older than `stuck_after`, and the
    /// oldest open transaction.
    pub async fn watchdog(
        &self,
        now: OffsetDateTime,
        stuck_after: std::time::Duration,
    ) -> Result<Watchdog, SourceError> {
        let stuck_events: i64 = crate::sql::query_scalar(audited(&self.extra.stuck_events))
            .bind(now - stuck_after)
            .fetch_one(&self.pool)
            .await
            .map_err(|e| self.err("counting stuck events", e))?;
        let oldest_transaction = self
            .open_transactions(std::time::Duration::ZERO, 1)
            .await?
            .into_iter()
            .next();
        Ok(Watchdog {
            stuck_events,
            oldest_transaction,
        })
    }

    /// The story of event `id` at `now`, or `None` when no committed row has this id.
    pub async fn why(
        &self,
        id: Uuid,
        now: OffsetDateTime,
    ) -> Result<Option<EventStory>, SourceError> {
        let Some(event) = self.dead.show_at(id, now).await? else {
            return Ok(None);
        };
        let verdict = match event.state.as_str() {
            "delivered" => Verdict::Delivered,
            "dead" => Verdict::Dead,
            // CDC rows stay `pending` after delivery: row state says nothing more.
            _ if self.cdc => Verdict::Streamed,
            _ => self.pending_verdict(&event, now).await?,
        };
        let model = if self.cdc {
            DeliveryModel::Stream
        } else {
            DeliveryModel::Claims
        };
        Ok(Some(EventStory {
            event,
            verdict,
            model,
        }))
    }

    async fn pending_verdict(
        &self,
        event: &StoredEventDetail,
        now: OffsetDateTime,
    ) -> Result<Verdict, SourceError> {
        let e = |e| self.err("explaining an event", e);
        if let Some(until) = event.backoff_until {
            return Ok(Verdict::Backoff { until });
        }
        let blocker = crate::sql::query(audited(&self.extra.why_blocker))
            .bind(&event.summary.aggregate_type)
            .bind(&event.summary.aggregate_id)
            .bind(event.seq)
            .bind(now)
            .fetch_optional(&self.pool)
            .await
            .map_err(e)?;
        if let Some(r) = blocker {
            let blocker = admin_rows::blocker(&Cols(&r)).map_err(e)?;
            return Ok(Verdict::BlockedByEarlier { blocker });
        }
        let mut tx = self.pool.begin().await.map_err(e)?;
        let free: Option<Uuid> = crate::sql::query_scalar(audited(&self.extra.why_claimed))
            .bind(event.summary.id)
            .fetch_optional(&mut *tx)
            .await
            .map_err(e)?;
        tx.rollback().await.map_err(e)?;
        if free.is_none() {
            return Ok(Verdict::Claimed);
        }
        let ahead: i64 = crate::sql::query_scalar(audited(&self.extra.why_queue))
            .bind(event.seq)
            .bind(now)
            .bind(100_000_i64)
            .fetch_one(&self.pool)
            .await
            .map_err(e)?;
        Ok(Verdict::Ready { ahead })
    }

    fn err(&self, context: &str, e: sqlx::Error) -> SourceError {
        source_error(context, &self.table, e)
    }

    /// Backlog counters at `now`.
    pub async fn backlog_at(&self, now: OffsetDateTime) -> Result<Backlog, SourceError> {
        let row = crate::sql::query(stmt(&self.queries.backlog))
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
        let query = crate::sql::query(stmt(&self.queries.held_aggregates))
            .bind(now)
            .bind(limit);
        fetch_decoded(query, &self.pool, |r| admin_rows::held_aggregate(&Cols(r)))
            .await
            .map_err(|e| self.err("reading held aggregates", e))
    }

    /// Producers waiting for an aggregate lock, with the transactions holding them.
    pub async fn lock_waits(&self, limit: i64) -> Result<Vec<LockWait>, SourceError> {
        let query = crate::sql::query(stmt(&self.queries.lock_waits)).bind(limit);
        fetch_decoded(query, &self.pool, |r| {
            Ok(LockWait {
                waiting_pid: r.try_get(0)?,
                holder_pid: r.try_get(1)?,
                holder_xact_age_seconds: r.try_get(2)?,
                holder_state: r.try_get(3)?,
                holder_query: r.try_get(4)?,
            })
        })
        .await
        .map_err(|e| self.err("reading lock waits", e))
    }
}

impl Inspect for PgInspector {
    async fn backlog(&self) -> Result<Backlog, SourceError> {
        self.backlog_at(OffsetDateTime::now_utc()).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use outbox_core::Identifier;

    #[test]
    fn extra_queries_render_without_leftover_placeholders() {
        let t = outbox_core::QualifiedTable::new(
            Some(Identifier::new("app").expect("valid")),
            Identifier::new("events").expect("valid"),
        );
        let q = ExtraQueries::new(&t);
        for sql in [
            &q.why_blocker,
            &q.why_claimed,
            &q.why_queue,
            &q.why_writers,
            &q.transactions,
            &q.stuck_events,
        ] {
            assert!(!sql.contains("{{"), "{sql}");
        }
    }
}
