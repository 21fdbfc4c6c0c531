//! [`PgInbox`]: the inbox on PostgreSQL ([`SqlInbox`] over `sqlx::Postgres`), with its
//! migration and its own bookkeeping table (`<table>_migrations`, next to the inbox table).
//!
//! What PostgreSQL supplies: its `.sql` files, `uuid` and `timestamptz` values, a duplicate
//! as `ON CONFLICT DO NOTHING RETURNING 1` returning no row, single reads and writes in an
//! explicit transaction (transaction poolers), `migrate` serialized by an advisory lock in
//! its transaction.

use futures::future::BoxFuture;
use outbox_core::QualifiedTable;
use outbox_core::migration::Migration;
use sqlx::{PgConnection, Postgres};
use time::OffsetDateTime;
use uuid::Uuid;

use crate::sql::{PG_MIGRATIONS, render};
use crate::sql_inbox::{SqlInbox, engine::Engine};

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
pub type PgInbox = SqlInbox<Postgres>;

impl SqlInbox<Postgres> {
    /// The inbox on `table`; a table without schema lives in `public`.
    pub fn new(table: QualifiedTable) -> Self {
        Self::on(table)
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

    /// The inbox table (always schema-qualified).
    pub fn table(&self) -> &QualifiedTable {
        &self.table
    }
}

impl Engine for Postgres {
    const INBOX: &'static str = "PgInbox";
    const DEFAULT_SCHEMA: Option<&'static str> = Some("public");
    const MIGRATIONS: &'static [Migration] = PG_MIGRATIONS;
    const INSERT: &'static str = include_str!("../queries/postgres/processed_events_insert.sql");
    const PURGE: &'static str = include_str!("../queries/postgres/processed_events_purge.sql");
    const CONTAINS: &'static str =
        include_str!("../queries/postgres/processed_events_contains.sql");
    const POSITIONS_ADVANCE: &'static str =
        include_str!("../queries/postgres/positions_advance.sql");
    const POSITIONS_READ: &'static str = include_str!("../queries/postgres/positions_read.sql");
    const MIGRATIONS_PREPARE: &'static str =
        include_str!("../queries/postgres/migrations_prepare.sql");
    const MIGRATIONS_APPLIED: &'static str =
        include_str!("../queries/postgres/migrations_applied.sql");
    const MIGRATIONS_RECORD: &'static str =
        include_str!("../queries/postgres/migrations_record.sql");
    const TRANSACTION_PER_CALL: bool = true;

    type Id = Uuid;
    type Time = OffsetDateTime;

    fn id(id: Uuid) -> Uuid {
        id
    }

    fn time(at: OffsetDateTime) -> OffsetDateTime {
        at
    }

    fn rows_affected(result: &sqlx::postgres::PgQueryResult) -> u64 {
        result.rows_affected()
    }

    fn render(template: &str, table: &QualifiedTable) -> String {
        render(template, table.schema.as_ref(), &table.table)
    }

    fn lock_migrate<'c>(
        conn: &'c mut PgConnection,
        name: &'c str,
        persistent: bool,
    ) -> BoxFuture<'c, Result<Option<String>, sqlx::Error>> {
        Box::pin(async move {
            sqlx::query(include_str!("../queries/postgres/migrate_lock.sql"))
                .persistent(persistent)
                .bind(format!("outbox inbox migrate {name}"))
                .execute(conn)
                .await?;
            Ok(None)
        })
    }
}
