//! [`PgInbox`]: the inbox on PostgreSQL, with its migration and its own bookkeeping table
//! (`<table>_migrations`, next to the inbox table).

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use outbox_core::{Identifier, QualifiedTable};
use sqlx::postgres::PgArguments;
use sqlx::query::{Query, QueryAs, QueryScalar};
use sqlx::{Executor, PgConnection, PgExecutor, PgPool, Postgres, SqlSafeStr, Transaction};
use time::OffsetDateTime;
use uuid::Uuid;

use crate::error::{InboxError, MigrateError, MigrationReport};
use crate::lane::{ConsumerOrder, OrderGate};
use crate::sql::{PG_MIGRATIONS, Queries, finish, render, stmt};
use crate::{DEFAULT_TABLE, InboxMessage, Outcome, PURGE_BATCH};

const BOOKKEEPING: &str = "CREATE TABLE IF NOT EXISTS {{qname:_migrations}} (
    version    integer     PRIMARY KEY,
    name       text        NOT NULL,
    checksum   text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)";

/// The inbox on one PostgreSQL table. Cheap to clone; create it once.
///
/// Two ways to use it, both with the side effect and the dedup record in one transaction:
///
/// ```no_run
/// # async fn example(pool: sqlx::PgPool, id: uuid::Uuid) -> Result<(), Box<dyn std::error::Error>> {
/// use futures::FutureExt as _;
/// use outbox_inbox::{Outcome, PgInbox};
///
/// let inbox = PgInbox::default(); // public.processed_events
/// inbox.migrate(&pool).await?;
///
/// // 1. The open transaction, or None for a duplicate: the simplest, and any code fits.
/// if let Some(mut tx) = inbox.begin(&pool, "loyalty", id).await? {
///     sqlx::query("UPDATE points SET n = n + 10 WHERE customer = 'c1'")
///         .execute(&mut *tx).await?;
///     tx.commit().await?; // dedup record and side effect, both or neither
/// }
///
/// // 2. A handler run in the transaction; commit on Ok, roll back on Err.
/// let outcome = inbox
///     .process(&pool, "loyalty", id, |conn| {
///         async move {
///             sqlx::query("UPDATE points SET n = n + 10 WHERE customer = 'c1'")
///                 .execute(conn).await?;
///             Ok::<_, sqlx::Error>(())
///         }
///         .boxed()
///     })
///     .await?;
/// assert!(matches!(outcome, Outcome::Processed(()) | Outcome::Duplicate));
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct PgInbox {
    table: QualifiedTable,
    queries: Arc<Queries>,
    /// False through a transaction pooler: see [`PgInbox::transaction_pooling`].
    named: bool,
}

impl Default for PgInbox {
    /// The table `public.processed_events`.
    fn default() -> Self {
        Self::new(QualifiedTable::new(
            None,
            Identifier::new(DEFAULT_TABLE).expect("a valid identifier"),
        ))
    }
}

impl PgInbox {
    /// The inbox on `table`; a table without schema lives in `public`.
    pub fn new(table: QualifiedTable) -> Self {
        let schema = table
            .schema
            .clone()
            .unwrap_or_else(|| Identifier::new("public").expect("a valid identifier"));
        let table = QualifiedTable::new(Some(schema), table.table);
        let queries = Arc::new(Queries::postgres(
            table.schema.as_ref().expect("set above"),
            &table.table,
        ));
        Self {
            table,
            queries,
            named: true,
        }
    }

    /// For a pool that reaches PostgreSQL through a transaction pooler (PgBouncer
    /// `pool_mode = transaction`): every statement of the inbox is unnamed, so none outlives
    /// its transaction, and every statement it runs on the pool runs in an explicit
    /// transaction (they always do). A named statement through such a pooler can meet another
    /// client's statement of the same name on a shared server connection.
    #[must_use]
    pub fn transaction_pooling(mut self, on: bool) -> Self {
        self.named = !on;
        self
    }

    /// `sqlx::query`, unnamed through a transaction pooler.
    fn query<'q>(&self, sql: impl SqlSafeStr) -> Query<'q, Postgres, PgArguments> {
        sqlx::query(sql).persistent(self.named)
    }

    /// `sqlx::query_as`, unnamed through a transaction pooler.
    fn query_as<'q, O>(&self, sql: impl SqlSafeStr) -> QueryAs<'q, Postgres, O, PgArguments>
    where
        O: for<'r> sqlx::FromRow<'r, sqlx::postgres::PgRow>,
    {
        sqlx::query_as(sql).persistent(self.named)
    }

    /// `sqlx::query_scalar`, unnamed through a transaction pooler.
    fn query_scalar<'q, O>(&self, sql: impl SqlSafeStr) -> QueryScalar<'q, Postgres, O, PgArguments>
    where
        (O,): for<'r> sqlx::FromRow<'r, sqlx::postgres::PgRow>,
    {
        sqlx::query_scalar(sql).persistent(self.named)
    }

    /// The inbox table (always schema-qualified).
    pub fn table(&self) -> &QualifiedTable {
        &self.table
    }

    fn render(&self, template: &str) -> String {
        render(template, self.table.schema.as_ref(), &self.table.table)
    }

    /// Creates or upgrades the inbox table. Idempotent and safe to run concurrently: one
    /// transaction that first takes an advisory lock named after the table.
    pub async fn migrate(&self, pool: &PgPool) -> Result<MigrationReport, MigrateError> {
        let name = self.table.to_string();
        let db = |source| MigrateError::database("inbox", &name, source);
        let mut tx = pool.begin().await.map_err(db)?;
        self.query("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))")
            .bind(format!("outbox inbox migrate {name}"))
            .execute(&mut *tx)
            .await
            .map_err(db)?;
        tx.execute(sqlx::AssertSqlSafe(
            self.render("CREATE SCHEMA IF NOT EXISTS {{schema}}"),
        ))
        .await
        .map_err(db)?;
        tx.execute(sqlx::AssertSqlSafe(self.render(BOOKKEEPING)))
            .await
            .map_err(db)?;
        let applied: Vec<(i32, String)> = self
            .query_as(sqlx::AssertSqlSafe(self.render(
                "SELECT version, checksum FROM {{qname:_migrations}} ORDER BY version",
            )))
            .fetch_all(&mut *tx)
            .await
            .map_err(db)?;
        let plan = outbox_core::migration::plan(PG_MIGRATIONS, &applied)
            .map_err(|c| MigrateError::conflict("inbox", &name, c))?;
        let mut report = MigrationReport {
            applied: Vec::new(),
            version: plan.current,
        };
        for (m, checksum) in plan.to_apply {
            tx.execute(sqlx::raw_sql(sqlx::AssertSqlSafe(self.render(m.sql))))
                .await
                .map_err(db)?;
            self.query(sqlx::AssertSqlSafe(self.render(
                "INSERT INTO {{qname:_migrations}} (version, name, checksum) VALUES ($1, $2, $3)",
            )))
            .bind(m.version)
            .bind(m.name)
            .bind(&checksum)
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

    /// Records `(consumer, event_id)` using `executor` (pass `&mut *tx` to use your own
    /// transaction). `true` when recorded now, `false` for a duplicate, in which case the
    /// caller must skip the side effect. Waits while another open transaction holds the
    /// same key.
    pub async fn record<'e, X: PgExecutor<'e>>(
        &self,
        executor: X,
        consumer: &str,
        event_id: Uuid,
    ) -> Result<bool, sqlx::Error> {
        let inserted = self
            .query(stmt(&self.queries.insert))
            .bind(consumer)
            .bind(event_id)
            .bind(OffsetDateTime::now_utc())
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
        pool: &PgPool,
        consumer: &str,
        event_id: Uuid,
    ) -> Result<Option<Transaction<'static, Postgres>>, InboxError> {
        self.begin_at(pool, consumer, event_id, None).await
    }

    /// [`begin`](Self::begin) for a delivered message: also records, in the same
    /// transaction, that `consumer` applied the message's delivery position
    /// (`aggregate_seq`), which the loops' order gate ([`order_gate`](Self::order_gate))
    /// reads. A duplicate still records its position (then commits and returns `None`).
    pub async fn begin_message(
        &self,
        pool: &PgPool,
        consumer: &str,
        message: &InboxMessage,
    ) -> Result<Option<Transaction<'static, Postgres>>, InboxError> {
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
        pool: &PgPool,
        consumer: &str,
        event_id: Uuid,
        position: Option<(&str, &str, u64)>,
    ) -> Result<Option<Transaction<'static, Postgres>>, InboxError> {
        let mut tx = pool.begin().await.map_err(InboxError::Database)?;
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
        conn: &mut PgConnection,
        consumer: &str,
        aggregate_type: &str,
        aggregate_id: &str,
        seq: u64,
    ) -> Result<(), sqlx::Error> {
        self.query(stmt(&self.queries.positions_advance))
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
        pool: &PgPool,
        consumer: &str,
        aggregate_type: &str,
        aggregate_id: &str,
    ) -> Result<u64, InboxError> {
        let mut tx = pool.begin().await.map_err(InboxError::Database)?;
        let seq: Option<i64> = self
            .query_scalar(stmt(&self.queries.positions_read))
            .bind(consumer)
            .bind(aggregate_type)
            .bind(aggregate_id)
            .fetch_optional(&mut *tx)
            .await
            .map_err(InboxError::Database)?;
        tx.commit().await.map_err(InboxError::Database)?;
        Ok(seq.map_or(0, |n| u64::try_from(n).unwrap_or(0)))
    }

    /// The order gate of a consumer loop whose handler records through this inbox with
    /// [`begin_message`](Self::begin_message) or [`process_message`](Self::process_message)
    /// as `consumer`: pass it to the loop's `ordered` setting.
    pub fn order_gate(&self, pool: PgPool, consumer: impl Into<String>) -> ConsumerOrder {
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
        pool: &PgPool,
        consumer: &str,
        event_id: Uuid,
        handler: F,
    ) -> Result<Outcome<T>, InboxError<E>>
    where
        F: for<'c> FnOnce(&'c mut PgConnection) -> BoxFuture<'c, Result<T, E>>,
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
        pool: &PgPool,
        consumer: &str,
        message: &InboxMessage,
        handler: F,
    ) -> Result<Outcome<T>, InboxError<E>>
    where
        F: for<'c> FnOnce(&'c mut PgConnection) -> BoxFuture<'c, Result<T, E>>,
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
        pool: &PgPool,
        consumer: &str,
        event_id: Uuid,
    ) -> Result<bool, InboxError> {
        let mut tx = pool.begin().await.map_err(InboxError::Database)?;
        let found = self
            .query_scalar(stmt(&self.queries.contains))
            .bind(consumer)
            .bind(event_id)
            .fetch_one(&mut *tx)
            .await
            .map_err(InboxError::Database)?;
        tx.commit().await.map_err(InboxError::Database)?;
        Ok(found)
    }

    /// Deletes the ids processed more than `age` ago, in batches; returns how many.
    ///
    /// Keep `age` well above the broker's redelivery window (the longest time a message can
    /// come back: JetStream `ack_wait × max_deliver` plus backoff, the relay's retry horizon,
    /// Kafka retention for a replay): an id purged before its last redelivery is processed
    /// again.
    pub async fn purge_older_than(&self, pool: &PgPool, age: Duration) -> Result<u64, InboxError> {
        self.purge_before(pool, OffsetDateTime::now_utc() - age)
            .await
    }

    /// Deletes the ids processed before `cutoff` (the clock as a parameter), in batches of
    /// [`PURGE_BATCH`]; returns how many.
    pub async fn purge_before(
        &self,
        pool: &PgPool,
        cutoff: OffsetDateTime,
    ) -> Result<u64, InboxError> {
        let mut total = 0;
        loop {
            let mut tx = pool.begin().await.map_err(InboxError::Database)?;
            let n = self
                .query(stmt(&self.queries.purge))
                .bind(cutoff)
                .bind(PURGE_BATCH)
                .execute(&mut *tx)
                .await
                .map_err(InboxError::Database)?
                .rows_affected();
            tx.commit().await.map_err(InboxError::Database)?;
            total += n;
            if n < PURGE_BATCH as u64 {
                return Ok(total);
            }
        }
    }
}

/// The order gate over one inbox, for one consumer.
struct InboxGate {
    inbox: PgInbox,
    pool: PgPool,
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
            let mut tx = self.pool.begin().await.map_err(InboxError::Database)?;
            self.inbox
                .advance(&mut tx, &self.consumer, aggregate_type, aggregate_id, seq)
                .await
                .map_err(InboxError::Database)?;
            tx.commit().await.map_err(InboxError::Database)
        })
    }
}
