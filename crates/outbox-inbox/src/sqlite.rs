//! [`SqliteInbox`]: the inbox on SQLite, with its migration and its own bookkeeping table
//! (`<table>_migrations`).
//!
//! Differences from PostgreSQL: `event_id` is UUID text and `processed_at` Unix microseconds
//! (as in the SQLite outbox), and the inbox transaction starts with `BEGIN IMMEDIATE`, so it
//! holds SQLite's one write lock from the start: concurrent deliveries queue (up to
//! `busy_timeout`) instead of failing when a read transaction tries to become a write one.

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use outbox_core::Identifier;
use sqlx::{Executor, Sqlite, SqliteConnection, SqliteExecutor, SqlitePool, Transaction};
use time::OffsetDateTime;
use uuid::Uuid;

use crate::error::{InboxError, MigrateError, MigrationReport};
use crate::lane::{ConsumerOrder, OrderGate};
use crate::sql::{Queries, SQLITE_MIGRATIONS, finish, render, stmt};
use crate::{DEFAULT_TABLE, InboxMessage, Outcome, PURGE_BATCH};

const BOOKKEEPING: &str = "CREATE TABLE IF NOT EXISTS {{name:_migrations}} (
    version    INTEGER PRIMARY KEY,
    name       TEXT    NOT NULL,
    checksum   TEXT    NOT NULL,
    applied_at INTEGER NOT NULL
)";

/// Unix microseconds, the SQLite outbox's timestamp representation.
fn micros(at: OffsetDateTime) -> i64 {
    i64::try_from(at.unix_timestamp_nanos() / 1_000).unwrap_or(i64::MAX)
}

fn id_text(id: Uuid) -> String {
    id.hyphenated().to_string()
}

/// The inbox on one SQLite table; same API as [`PgInbox`](crate::PgInbox). Cheap to clone.
#[derive(Debug, Clone)]
pub struct SqliteInbox {
    table: Identifier,
    queries: Arc<Queries>,
}

impl Default for SqliteInbox {
    /// The table `processed_events`.
    fn default() -> Self {
        Self::new(Identifier::new(DEFAULT_TABLE).expect("a valid identifier"))
    }
}

impl SqliteInbox {
    /// The inbox on `table`.
    pub fn new(table: Identifier) -> Self {
        let queries = Arc::new(Queries::sqlite(&table));
        Self { table, queries }
    }

    /// The inbox table.
    pub fn table(&self) -> &Identifier {
        &self.table
    }

    fn render(&self, template: &str) -> String {
        render(template, None, &self.table)
    }

    /// Creates or upgrades the inbox table. Idempotent and safe to run concurrently: one
    /// `BEGIN IMMEDIATE` transaction, so a second `migrate` waits and finds nothing to do.
    pub async fn migrate(&self, pool: &SqlitePool) -> Result<MigrationReport, MigrateError> {
        let name = self.table.to_string();
        let db = |source| MigrateError::database("inbox", &name, source);
        let mut tx = pool.begin_with("BEGIN IMMEDIATE").await.map_err(db)?;
        tx.execute(sqlx::AssertSqlSafe(self.render(BOOKKEEPING)))
            .await
            .map_err(db)?;
        let applied: Vec<(i32, String)> = sqlx::query_as(sqlx::AssertSqlSafe(
            self.render("SELECT version, checksum FROM {{name:_migrations}} ORDER BY version"),
        ))
        .fetch_all(&mut *tx)
        .await
        .map_err(db)?;
        let plan = outbox_core::migration::plan(SQLITE_MIGRATIONS, &applied)
            .map_err(|c| MigrateError::conflict("inbox", &name, c))?;
        let mut report = MigrationReport {
            applied: Vec::new(),
            version: plan.current,
        };
        for (m, checksum) in plan.to_apply {
            tx.execute(sqlx::raw_sql(sqlx::AssertSqlSafe(self.render(m.sql))))
                .await
                .map_err(db)?;
            sqlx::query(sqlx::AssertSqlSafe(self.render(
                "INSERT INTO {{name:_migrations}} (version, name, checksum, applied_at) VALUES (?1, ?2, ?3, ?4)",
            )))
            .bind(m.version)
            .bind(m.name)
            .bind(&checksum)
            .bind(micros(OffsetDateTime::now_utc()))
            .execute(&mut *tx)
            .await
            .map_err(db)?;
            tracing::info!(table = %name, version = m.version, migration = m.name, "applied inbox migration");
            report.applied.push((m.version, m.name));
            report.version = m.version;
        }
        tx.commit().await.map_err(db)?;
        Ok(report)
    }

    /// Records `(consumer, event_id)` using `executor` (your own write transaction).
    /// `true` when recorded now, `false` for a duplicate: skip the side effect.
    pub async fn record<'e, X: SqliteExecutor<'e>>(
        &self,
        executor: X,
        consumer: &str,
        event_id: Uuid,
    ) -> Result<bool, sqlx::Error> {
        let inserted = sqlx::query(stmt(&self.queries.insert))
            .bind(consumer)
            .bind(id_text(event_id))
            .bind(micros(OffsetDateTime::now_utc()))
            .fetch_optional(executor)
            .await?;
        Ok(inserted.is_some())
    }

    /// Begins a transaction and records `(consumer, event_id)` in it. `Some(tx)`: first
    /// delivery; run the side effect in `tx` and commit it (dropping it rolls back both).
    /// `None`: a duplicate; nothing is left open.
    ///
    /// Consumer loops with an order gate use [`begin_message`](Self::begin_message) instead,
    /// which also records the message's delivery position.
    pub async fn begin(
        &self,
        pool: &SqlitePool,
        consumer: &str,
        event_id: Uuid,
    ) -> Result<Option<Transaction<'static, Sqlite>>, InboxError> {
        self.begin_at(pool, consumer, event_id, None).await
    }

    /// [`begin`](Self::begin) for a delivered message: also records, in the same
    /// transaction, that `consumer` applied the message's delivery position
    /// (`aggregate_seq`), which the loops' order gate ([`order_gate`](Self::order_gate))
    /// reads. A duplicate still records its position (then commits and returns `None`).
    pub async fn begin_message(
        &self,
        pool: &SqlitePool,
        consumer: &str,
        message: &InboxMessage,
    ) -> Result<Option<Transaction<'static, Sqlite>>, InboxError> {
        let position = message.aggregate_seq.map(|seq| {
            (
                message.aggregate_type.as_str(),
                message.aggregate_id.as_str(),
                seq,
            )
        });
        self.begin_at(pool, consumer, message.id, position).await
    }

    async fn begin_at(
        &self,
        pool: &SqlitePool,
        consumer: &str,
        event_id: Uuid,
        position: Option<(&str, &str, u64)>,
    ) -> Result<Option<Transaction<'static, Sqlite>>, InboxError> {
        let mut tx = pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(InboxError::Database)?;
        let first = self
            .record(&mut *tx, consumer, event_id)
            .await
            .map_err(InboxError::Database)?;
        if let Some((aggregate_type, aggregate_id, seq)) = position {
            self.advance(&mut tx, consumer, aggregate_type, aggregate_id, seq)
                .await
                .map_err(InboxError::Database)?;
        }
        if first {
            Ok(Some(tx))
        } else if position.is_some() {
            tx.commit().await.map_err(InboxError::Database)?;
            Ok(None)
        } else {
            tx.rollback().await.map_err(InboxError::Database)?;
            Ok(None)
        }
    }

    /// Records that `consumer` applied (or deliberately passed) position `seq` of an
    /// aggregate, using `conn` (your transaction). Never moves back.
    pub async fn advance(
        &self,
        conn: &mut SqliteConnection,
        consumer: &str,
        aggregate_type: &str,
        aggregate_id: &str,
        seq: u64,
    ) -> Result<(), sqlx::Error> {
        sqlx::query(stmt(&self.queries.positions_advance))
            .bind(consumer)
            .bind(aggregate_type)
            .bind(aggregate_id)
            .bind(i64::try_from(seq).unwrap_or(i64::MAX))
            .execute(conn)
            .await?;
        Ok(())
    }

    /// The highest delivery position of an aggregate that `consumer` applied; 0 when none.
    pub async fn applied_position(
        &self,
        pool: &SqlitePool,
        consumer: &str,
        aggregate_type: &str,
        aggregate_id: &str,
    ) -> Result<u64, InboxError> {
        let seq: Option<i64> = sqlx::query_scalar(stmt(&self.queries.positions_read))
            .bind(consumer)
            .bind(aggregate_type)
            .bind(aggregate_id)
            .fetch_optional(pool)
            .await
            .map_err(InboxError::Database)?;
        Ok(seq.map_or(0, |n| u64::try_from(n).unwrap_or(0)))
    }

    /// The order gate of a consumer loop whose handler records through this inbox with
    /// [`begin_message`](Self::begin_message) or [`process_message`](Self::process_message)
    /// as `consumer`: pass it to the loop's `ordered` setting.
    pub fn order_gate(&self, pool: SqlitePool, consumer: impl Into<String>) -> ConsumerOrder {
        ConsumerOrder::new(InboxGate {
            inbox: self.clone(),
            pool,
            consumer: consumer.into(),
        })
    }

    /// [`begin`](Self::begin), then `handler` on the transaction's connection, then commit.
    /// A duplicate returns [`Outcome::Duplicate`] without calling `handler`; a handler error
    /// rolls back the side effect and the dedup record together.
    pub async fn process<T, E, F>(
        &self,
        pool: &SqlitePool,
        consumer: &str,
        event_id: Uuid,
        handler: F,
    ) -> Result<Outcome<T>, InboxError<E>>
    where
        F: for<'c> FnOnce(&'c mut SqliteConnection) -> BoxFuture<'c, Result<T, E>>,
    {
        let tx = self
            .begin_at(pool, consumer, event_id, None)
            .await
            .map_err(InboxError::widen)?;
        finish(tx, handler).await
    }

    /// [`process`](Self::process) for a delivered message, recording its delivery position
    /// with the side effect (see [`begin_message`](Self::begin_message)).
    pub async fn process_message<T, E, F>(
        &self,
        pool: &SqlitePool,
        consumer: &str,
        message: &InboxMessage,
        handler: F,
    ) -> Result<Outcome<T>, InboxError<E>>
    where
        F: for<'c> FnOnce(&'c mut SqliteConnection) -> BoxFuture<'c, Result<T, E>>,
    {
        let tx = self
            .begin_message(pool, consumer, message)
            .await
            .map_err(InboxError::widen)?;
        finish(tx, handler).await
    }

    /// Whether `consumer` has processed `event_id` (committed). For inspection (tests,
    /// support), **not** as a dedup gate: between this check and your side effect another
    /// instance may apply the same event. Deduplicate with `begin`/`process`, which record
    /// the id in the side effect's own transaction.
    pub async fn contains(
        &self,
        pool: &SqlitePool,
        consumer: &str,
        event_id: Uuid,
    ) -> Result<bool, InboxError> {
        sqlx::query_scalar(stmt(&self.queries.contains))
            .bind(consumer)
            .bind(id_text(event_id))
            .fetch_one(pool)
            .await
            .map_err(InboxError::Database)
    }

    /// Deletes the ids processed more than `age` ago, in batches; returns how many. Keep
    /// `age` well above the broker's redelivery window (see `docs/inbox.md`).
    pub async fn purge_older_than(
        &self,
        pool: &SqlitePool,
        age: Duration,
    ) -> Result<u64, InboxError> {
        self.purge_before(pool, OffsetDateTime::now_utc() - age)
            .await
    }

    /// Deletes the ids processed before `cutoff` (the clock as a parameter), in batches of
    /// [`PURGE_BATCH`]; returns how many.
    pub async fn purge_before(
        &self,
        pool: &SqlitePool,
        cutoff: OffsetDateTime,
    ) -> Result<u64, InboxError> {
        let mut total = 0;
        loop {
            let n = sqlx::query(stmt(&self.queries.purge))
                .bind(micros(cutoff))
                .bind(PURGE_BATCH)
                .execute(pool)
                .await
                .map_err(InboxError::Database)?
                .rows_affected();
            total += n;
            if n < PURGE_BATCH as u64 {
                return Ok(total);
            }
        }
    }
}

/// The order gate over one inbox, for one consumer.
struct InboxGate {
    inbox: SqliteInbox,
    pool: SqlitePool,
    consumer: String,
}

impl OrderGate for InboxGate {
    fn applied<'a>(
        &'a self,
        aggregate_type: &'a str,
        aggregate_id: &'a str,
    ) -> BoxFuture<'a, Result<u64, InboxError>> {
        Box::pin(self.inbox.applied_position(
            &self.pool,
            &self.consumer,
            aggregate_type,
            aggregate_id,
        ))
    }

    fn pass<'a>(
        &'a self,
        aggregate_type: &'a str,
        aggregate_id: &'a str,
        seq: u64,
    ) -> BoxFuture<'a, Result<(), InboxError>> {
        Box::pin(async move {
            let mut conn = self.pool.acquire().await.map_err(InboxError::Database)?;
            self.inbox
                .advance(&mut conn, &self.consumer, aggregate_type, aggregate_id, seq)
                .await
                .map_err(InboxError::Database)
        })
    }
}
