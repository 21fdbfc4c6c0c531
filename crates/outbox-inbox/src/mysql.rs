//! [`MySqlInbox`]: the inbox on MySQL or MariaDB ([`SqlInbox`] over `sqlx::MySql`), with
//! its migrations and their own bookkeeping table (`<table>_migrations`, next to the inbox
//! table in the connection's database).
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

use futures::future::BoxFuture;
use outbox_core::migration::Migration;
use outbox_core::{Identifier, QualifiedTable};
use sqlx::mysql::MySqlDatabaseError;
use sqlx::{MySql, MySqlConnection};
use time::OffsetDateTime;
use uuid::Uuid;

use crate::sql::{MYSQL_MIGRATIONS, render_mysql};
use crate::sql_inbox::{SqlInbox, engine::Engine};

/// Longest wait for another `migrate` of the same table to finish.
const LOCK_TIMEOUT_SECONDS: i32 = 60;

/// `ER_DUP_ENTRY`: the primary key already holds this `(consumer, event_id)`.
const DUPLICATE_KEY: u16 = 1062;

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
pub type MySqlInbox = SqlInbox<MySql>;

impl SqlInbox<MySql> {
    /// The inbox on `table`, in the database of the pool's connections.
    pub fn new(table: Identifier) -> Self {
        Self::on(QualifiedTable::new(None, table))
    }

    /// The inbox table.
    pub fn table(&self) -> &Identifier {
        &self.table.table
    }
}

impl Engine for MySql {
    const INBOX: &'static str = "MySqlInbox";
    const DEFAULT_SCHEMA: Option<&'static str> = None;
    const MIGRATIONS: &'static [Migration] = MYSQL_MIGRATIONS;
    const INSERT: &'static str = include_str!("../queries/mysql/processed_events_insert.sql");
    const PURGE: &'static str = include_str!("../queries/mysql/processed_events_purge.sql");
    const CONTAINS: &'static str = include_str!("../queries/mysql/processed_events_contains.sql");
    const POSITIONS_ADVANCE: &'static str = include_str!("../queries/mysql/positions_advance.sql");
    const POSITIONS_READ: &'static str = include_str!("../queries/mysql/positions_read.sql");
    const MIGRATIONS_PREPARE: &'static str =
        include_str!("../queries/mysql/migrations_prepare.sql");
    const MIGRATIONS_APPLIED: &'static str =
        include_str!("../queries/mysql/migrations_applied.sql");
    const MIGRATIONS_RECORD: &'static str = include_str!("../queries/mysql/migrations_record.sql");
    const MIGRATE_IN_TRANSACTION: bool = false;
    const INSERT_RETURNS: bool = false;
    const ADVANCE_SEQ_TWICE: bool = true;

    type Id = uuid::fmt::Hyphenated;
    type Time = OffsetDateTime;

    fn id(id: Uuid) -> uuid::fmt::Hyphenated {
        id.hyphenated()
    }

    fn time(at: OffsetDateTime) -> OffsetDateTime {
        at
    }

    fn rows_affected(result: &sqlx::mysql::MySqlQueryResult) -> u64 {
        result.rows_affected()
    }

    fn render(template: &str, table: &QualifiedTable) -> String {
        render_mysql(template, &table.table)
    }

    fn is_duplicate_key(e: &sqlx::Error) -> bool {
        match e {
            sqlx::Error::Database(db) => db
                .try_downcast_ref::<MySqlDatabaseError>()
                .is_some_and(|e| e.number() == DUPLICATE_KEY),
            _ => false,
        }
    }

    /// `GET_LOCK` on the session, per database and table; waits up to 60 s.
    fn lock_migrate<'c>(
        conn: &'c mut MySqlConnection,
        name: &'c str,
        _persistent: bool,
    ) -> BoxFuture<'c, Result<Option<String>, sqlx::Error>> {
        Box::pin(async move {
            let lock: String =
                sqlx::query_scalar(include_str!("../queries/mysql/migrate_lock_name.sql"))
                    .bind(name)
                    .fetch_one(&mut *conn)
                    .await?;
            let got: Option<i64> =
                sqlx::query_scalar(include_str!("../queries/mysql/migrate_lock.sql"))
                    .bind(&lock)
                    .bind(LOCK_TIMEOUT_SECONDS)
                    .fetch_one(&mut *conn)
                    .await?;
            if got != Some(1) {
                return Err(sqlx::Error::Protocol(format!(
                    "another `migrate` of inbox table `{name}` held the lock for {LOCK_TIMEOUT_SECONDS} s"
                )));
            }
            Ok(Some(lock))
        })
    }

    fn unlock_migrate(conn: &mut MySqlConnection, lock: String) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            let _ = sqlx::query(include_str!("../queries/mysql/migrate_unlock.sql"))
                .bind(lock)
                .execute(conn)
                .await;
        })
    }
}
