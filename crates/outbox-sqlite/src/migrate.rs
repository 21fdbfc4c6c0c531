//! Schema migrations for one outbox table, with their own bookkeeping table
//! (`<table>_migrations`, next to the outbox table; never the application's).
//!
//! `migrate` is idempotent and safe to run concurrently: everything happens in one
//! `BEGIN IMMEDIATE` transaction, which takes SQLite's write lock before reading the
//! bookkeeping table, so a second `migrate` waits (up to `busy_timeout`) and then finds
//! nothing to do. SQLite DDL is transactional, so a failed migration leaves nothing half-done.

use outbox_core::Identifier;
pub use outbox_core::migration::MigrateError;
use outbox_core::migration::Migration;
use sqlx::SqlitePool;

use crate::sql::render;

/// Every migration, in order. Append only; never edit one that has shipped.
pub(crate) const MIGRATIONS: &[Migration] = outbox_core::migrations!("migrations":
    "0001_outbox_table", "0002_aggregate_positions",
);

/// The schema version this build of the library expects.
pub const SCHEMA_VERSION: i32 = 2;

/// What `migrate` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigrationReport {
    /// Migrations applied by this call (version, name).
    pub applied: Vec<(i32, &'static str)>,
    /// The schema version after the call.
    pub version: i32,
}

/// Creates or upgrades the outbox schema for `table` (the outbox table, its indexes, the
/// relay lease table and the bookkeeping table).
pub async fn migrate(
    pool: &SqlitePool,
    table: &Identifier,
) -> Result<MigrationReport, MigrateError> {
    let name = table.to_string();
    let book = outbox_sql::bookkeeping!("outbox", &name, |sql| render(sql, table));
    let mut tx = pool
        .begin_with("BEGIN IMMEDIATE")
        .await
        .map_err(|e| book.error(e))?;
    let mut run = book.on(&mut *tx);
    let plan = run.pending(MIGRATIONS).await?;
    let mut report = MigrationReport {
        applied: Vec::new(),
        version: plan.current,
    };
    for (m, checksum) in plan.to_apply {
        run.run_script(render(m.sql, table)).await?;
        run.record(m, &checksum).await?;
        report.applied.push((m.version, m.name));
        report.version = m.version;
    }
    tx.commit().await.map_err(|e| book.error(e))?;
    Ok(report)
}

/// The schema version recorded for `table`, or `None` when it was never migrated.
pub async fn schema_version(
    pool: &SqlitePool,
    table: &Identifier,
) -> Result<Option<i32>, sqlx::Error> {
    let bookkeeping = format!("{}_migrations", table.as_str());
    let exists: Option<i64> =
        sqlx::query_scalar("SELECT 1 FROM sqlite_schema WHERE type = 'table' AND name = ?1")
            .bind(bookkeeping)
            .fetch_optional(pool)
            .await?;
    if exists.is_none() {
        return Ok(None);
    }
    sqlx::query_scalar(sqlx::AssertSqlSafe(render(
        "SELECT max(version) FROM {{name:_migrations}}",
        table,
    )))
    .fetch_one(pool)
    .await
}
