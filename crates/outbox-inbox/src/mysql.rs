//! [`MySqlInbox`]: the inbox on MySQL or MariaDB, with its migrations and their own
//! bookkeeping table (`<table>_migrations`, next to the inbox table in the connection's
//! database).
//!
//! Differences from PostgreSQL:
//! - `event_id` is lower-case hyphenated UUID text (`CHAR(36)` ascii, as the MySQL outbox
//!   table's `id`), `processed_at` a UTC `DATETIME(6)`; consumer names and aggregate ids are
//!   `VARCHAR(255)` in `utf8mb4_bin`.
//! - A duplicate is the insert's duplicate-key error (1062), caught: InnoDB undoes only that
//!   statement, so the transaction goes on (see `queries/mysql/processed_events_insert.sql`
//!   for why not `INSERT IGNORE` or `ON DUPLICATE KEY UPDATE`).
//! - MySQL commits DDL on its own, so `migrate` is not one transaction: it holds a named lock
//!   (`GET_LOCK`) on one connection for its whole run, and every migration is idempotent
//!   (`CREATE TABLE IF NOT EXISTS`), so a run cut off half-way is finished by the next.

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use outbox_core::Identifier;
use sqlx::mysql::MySqlDatabaseError;
use sqlx::{Executor, MySql, MySqlConnection, MySqlExecutor, MySqlPool, Transaction};
use time::OffsetDateTime;
use uuid::Uuid;

use crate::error::{InboxError, MigrateError, MigrationReport};
use crate::lane::{ConsumerOrder, OrderGate};
use crate::sql::{MYSQL_MIGRATIONS, Queries, finish, render_mysql, stmt};
use crate::{DEFAULT_TABLE, InboxMessage, Outcome, PURGE_BATCH};

const BOOKKEEPING: &str = "CREATE TABLE IF NOT EXISTS {{name:_migrations}} (
    version    INT          NOT NULL PRIMARY KEY,
    name       VARCHAR(100) NOT NULL,
    checksum   VARCHAR(64)  NOT NULL,
    applied_at DATETIME(6)  NOT NULL DEFAULT CURRENT_TIMESTAMP(6)
) ENGINE = InnoDB";

/// The name of `migrate`'s lock for table `?`: per database and table (locks are
/// server-wide), hashed so that it stays within MySQL's 64 characters for lock names
/// whatever the database's name.
const LOCK_NAME: &str =
    "SELECT CONCAT('outbox_inbox_migrate.', SHA1(CONCAT(COALESCE(DATABASE(), ''), '.', ?)))";

/// Longest wait for another `migrate` of the same table to finish.
const LOCK_TIMEOUT_SECONDS: i32 = 60;

/// `ER_DUP_ENTRY`: the primary key already holds this `(consumer, event_id)`.
const DUPLICATE_KEY: u16 = 1062;

fn id_text(id: Uuid) -> uuid::fmt::Hyphenated {
    id.hyphenated()
}

fn is_duplicate_key(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Database(db) => db
            .try_downcast_ref::<MySqlDatabaseError>()
            .is_some_and(|e| e.number() == DUPLICATE_KEY),
        _ => false,
    }
}

/// The inbox on one MySQL / MariaDB table, in the connection's database; same API as
/// [`PgInbox`](crate::PgInbox). Cheap to clone; create it once.
///
/// ```no_run
/// # async fn example(pool: sqlx::MySqlPool, id: uuid::Uuid) -> Result<(), Box<dyn std::error::Error>> {
/// use futures::FutureExt as _;
/// use outbox_inbox::{MySqlInbox, Outcome};
///
/// let inbox = MySqlInbox::default(); // processed_events
/// inbox.migrate(&pool).await?;
///
/// // 1. The open transaction, or None for a duplicate.
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
pub struct MySqlInbox {
    table: Identifier,
    queries: Arc<Queries>,
}

impl Default for MySqlInbox {
    /// The table `processed_events`.
    fn default() -> Self {
        Self::new(Identifier::new(DEFAULT_TABLE).expect("a valid identifier"))
    }
}

impl MySqlInbox {
    /// The inbox on `table`, in the database of the pool's connections.
    pub fn new(table: Identifier) -> Self {
        let queries = Arc::new(Queries::mysql(&table));
        Self { table, queries }
    }

    /// The inbox table.
    pub fn table(&self) -> &Identifier {
        &self.table
    }

    fn render(&self, template: &str) -> String {
        render_mysql(template, &self.table)
    }

    /// Creates or upgrades the inbox tables. Idempotent and safe to run concurrently: it
    /// holds a named lock (`GET_LOCK`, per database and table) for its whole run, so a
    /// second `migrate` waits (up to 60 s) and finds nothing to do. Each migration is
    /// idempotent DDL (MySQL commits DDL on its own), recorded in `<table>_migrations` once
    /// it succeeded.
    pub async fn migrate(&self, pool: &MySqlPool) -> Result<MigrationReport, MigrateError> {
        let name = self.table.to_string();
        let db = |source| MigrateError::database("inbox", &name, source);
        let mut conn = pool.acquire().await.map_err(db)?;
        // A migrate dropped half-way must not leave the lock held by a pooled connection:
        // closing the session releases it.
        conn.close_on_drop();
        let lock: String = sqlx::query_scalar(LOCK_NAME)
            .bind(&name)
            .fetch_one(&mut *conn)
            .await
            .map_err(db)?;
        let got: Option<i64> = sqlx::query_scalar("SELECT GET_LOCK(?, ?)")
            .bind(&lock)
            .bind(LOCK_TIMEOUT_SECONDS)
            .fetch_one(&mut *conn)
            .await
            .map_err(db)?;
        if got != Some(1) {
            return Err(db(sqlx::Error::Protocol(format!(
                "another `migrate` of inbox table `{name}` held the lock for {LOCK_TIMEOUT_SECONDS} s"
            ))));
        }
        let result = async {
            conn.execute(sqlx::AssertSqlSafe(self.render(BOOKKEEPING)))
                .await
                .map_err(db)?;
            let applied: Vec<(i32, String)> = sqlx::query_as(sqlx::AssertSqlSafe(
                self.render("SELECT version, checksum FROM {{name:_migrations}} ORDER BY version"),
            ))
            .fetch_all(&mut *conn)
            .await
            .map_err(db)?;
            let plan = outbox_core::migration::plan(MYSQL_MIGRATIONS, &applied)
                .map_err(|c| MigrateError::conflict("inbox", &name, c))?;
            let mut report = MigrationReport {
                applied: Vec::new(),
                version: plan.current,
            };
            for (m, checksum) in plan.to_apply {
                conn.execute(sqlx::raw_sql(sqlx::AssertSqlSafe(self.render(m.sql))))
                    .await
                    .map_err(db)?;
                sqlx::query(sqlx::AssertSqlSafe(self.render(
                    "INSERT INTO {{name:_migrations}} (version, name, checksum) VALUES (?, ?, ?)",
                )))
                .bind(m.version)
                .bind(m.name)
                .bind(&checksum)
                .execute(&mut *conn)
                .await
                .map_err(db)?;
                tracing::info!(table = %name, version = m.version, migration = m.name, "applied inbox migration");
                report.applied.push((m.version, m.name));
                report.version = m.version;
            }
            Ok(report)
        }
        .await;
        let _ = sqlx::query("SELECT RELEASE_LOCK(?)")
            .bind(&lock)
            .execute(&mut *conn)
            .await;
        result
    }

    /// Records `(consumer, event_id)` using `executor` (pass `&mut *tx` to use your own
    /// transaction). `true` when recorded now, `false` for a duplicate, in which case the
    /// caller must skip the side effect. Waits while another open transaction holds the
    /// same key (up to the server's `innodb_lock_wait_timeout`). A duplicate undoes only
    /// this statement: the transaction stays usable.
    pub async fn record<'e, X: MySqlExecutor<'e>>(
        &self,
        executor: X,
        consumer: &str,
        event_id: Uuid,
    ) -> Result<bool, sqlx::Error> {
        let inserted = sqlx::query(stmt(&self.queries.insert))
            .bind(consumer)
            .bind(id_text(event_id))
            .bind(OffsetDateTime::now_utc())
            .execute(executor)
            .await;
        match inserted {
            Ok(_) => Ok(true),
            Err(e) if is_duplicate_key(&e) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Begins a transaction and records `(consumer, event_id)` in it. `Some(tx)`: first
    /// delivery; run the side effect in `tx` and commit it (dropping it rolls back both).
    /// `None`: a duplicate; nothing is left open.
    ///
    /// Consumer loops with an order gate use [`begin_message`](Self::begin_message) instead,
    /// which also records the message's delivery position.
    pub async fn begin(
        &self,
        pool: &MySqlPool,
        consumer: &str,
        event_id: Uuid,
    ) -> Result<Option<Transaction<'static, MySql>>, InboxError> {
        self.begin_at(pool, consumer, event_id, None).await
    }

    /// [`begin`](Self::begin) for a delivered message: also records, in the same
    /// transaction, that `consumer` applied the message's delivery position
    /// (`aggregate_seq`), which the loops' order gate ([`order_gate`](Self::order_gate))
    /// reads. A duplicate still records its position (then commits and returns `None`).
    pub async fn begin_message(
        &self,
        pool: &MySqlPool,
        consumer: &str,
        message: &InboxMessage,
    ) -> Result<Option<Transaction<'static, MySql>>, InboxError> {
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
        pool: &MySqlPool,
        consumer: &str,
        event_id: Uuid,
        position: Option<(&str, &str, u64)>,
    ) -> Result<Option<Transaction<'static, MySql>>, InboxError> {
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
        conn: &mut MySqlConnection,
        consumer: &str,
        aggregate_type: &str,
        aggregate_id: &str,
        seq: u64,
    ) -> Result<(), sqlx::Error> {
        let seq = i64::try_from(seq).unwrap_or(i64::MAX);
        sqlx::query(stmt(&self.queries.positions_advance))
            .bind(consumer)
            .bind(aggregate_type)
            .bind(aggregate_id)
            .bind(seq)
            .bind(seq)
            .execute(conn)
            .await?;
        Ok(())
    }

    /// The highest delivery position of an aggregate that `consumer` applied; 0 when none.
    pub async fn applied_position(
        &self,
        pool: &MySqlPool,
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
    pub fn order_gate(&self, pool: MySqlPool, consumer: impl Into<String>) -> ConsumerOrder {
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
        pool: &MySqlPool,
        consumer: &str,
        event_id: Uuid,
        handler: F,
    ) -> Result<Outcome<T>, InboxError<E>>
    where
        F: for<'c> FnOnce(&'c mut MySqlConnection) -> BoxFuture<'c, Result<T, E>>,
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
        pool: &MySqlPool,
        consumer: &str,
        message: &InboxMessage,
        handler: F,
    ) -> Result<Outcome<T>, InboxError<E>>
    where
        F: for<'c> FnOnce(&'c mut MySqlConnection) -> BoxFuture<'c, Result<T, E>>,
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
        pool: &MySqlPool,
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
        pool: &MySqlPool,
        age: Duration,
    ) -> Result<u64, InboxError> {
        self.purge_before(pool, OffsetDateTime::now_utc() - age)
            .await
    }

    /// Deletes the ids processed before `cutoff` (the clock as a parameter), in batches of
    /// [`PURGE_BATCH`]; returns how many.
    pub async fn purge_before(
        &self,
        pool: &MySqlPool,
        cutoff: OffsetDateTime,
    ) -> Result<u64, InboxError> {
        let mut total = 0;
        loop {
            let n = sqlx::query(stmt(&self.queries.purge))
                .bind(cutoff)
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
    inbox: MySqlInbox,
    pool: MySqlPool,
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
