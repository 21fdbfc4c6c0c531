//! Schema migrations for one outbox table, with their own bookkeeping table
//! (`<table>_migrations`, next to the outbox table; never the application's).
//!
//! MySQL commits every DDL statement on its own, so a migration is not one transaction.
//! Instead `migrate` holds a named lock (`GET_LOCK`) on one connection for its whole run, so
//! two `migrate`s never interleave, and every statement is idempotent (`IF NOT EXISTS`, a
//! trigger dropped before it is created): a run cut off half-way is finished by the next.

use outbox_core::Identifier;
pub use outbox_core::migration::MigrateError;
use outbox_core::migration::Migration;
use sqlx::{Acquire as _, Executor as _, MySqlPool};

use crate::sql::{render, statements};

/// Every migration, in order. Append only; never edit one that has shipped.
pub(crate) const MIGRATIONS: &[Migration] =
    outbox_core::migrations!("migrations": "0001_outbox_table");

/// The schema version this build of the library expects.
pub const SCHEMA_VERSION: i32 = 1;

/// Longest wait for another `migrate` of the same table to finish.
const LOCK_TIMEOUT_SECONDS: i32 = 60;

/// What `migrate` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigrationReport {
    /// Migrations applied by this call (version, name).
    pub applied: Vec<(i32, &'static str)>,
    /// The schema version after the call.
    pub version: i32,
}

/// Creates or upgrades the outbox schema for `table` in the connection's database: the
/// outbox table, the per-aggregate head rows, the numbering trigger and the bookkeeping
/// table. Idempotent; concurrent calls wait for each other.
pub async fn migrate(
    pool: &MySqlPool,
    table: &Identifier,
) -> Result<MigrationReport, MigrateError> {
    let name = table.to_string();
    let db = |source| MigrateError::database("outbox", &name, source);
    let mut pooled = pool.acquire().await.map_err(db)?;
    let conn = pooled.acquire().await.map_err(db)?;
    let lock = format!("outbox_migrate.{name}");
    let got: Option<i32> = sqlx::query_scalar("SELECT GET_LOCK(?, ?)")
        .bind(&lock)
        .bind(LOCK_TIMEOUT_SECONDS)
        .fetch_one(&mut *conn)
        .await
        .map_err(db)?;
    if got != Some(1) {
        return Err(db(sqlx::Error::Protocol(format!(
            "another `migrate` of `{name}` held the lock for {LOCK_TIMEOUT_SECONDS} s"
        ))));
    }
    let result = async {
        let book = outbox_sql::bookkeeping!("outbox", &name, |sql| render(sql, table));
        let mut run = book.on(&mut *conn);
        let plan = run.pending(MIGRATIONS).await?;
        let mut report = MigrationReport {
            applied: Vec::new(),
            version: plan.current,
        };
        for (m, checksum) in plan.to_apply {
            let sql = render(m.sql, table);
            for statement in statements(&sql) {
                (&mut *run.conn)
                    .execute(sqlx::raw_sql(sqlx::AssertSqlSafe(statement.to_owned())))
                    .await
                    .map_err(|e| trigger_privilege(&name, e).unwrap_or_else(db))?;
            }
            run.record(m, &checksum).await?;
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

/// The schema version recorded for `table`, or `None` when it was never migrated.
pub async fn schema_version(
    pool: &MySqlPool,
    table: &Identifier,
) -> Result<Option<i32>, sqlx::Error> {
    let result = sqlx::query_scalar(sqlx::AssertSqlSafe(render(
        "SELECT MAX(version) FROM {{name:_migrations}}",
        table,
    )))
    .fetch_one(pool)
    .await;
    match result {
        Ok(v) => Ok(v),
        Err(sqlx::Error::Database(db))
            if db
                .try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
                .is_some_and(|e| e.number() == 1146) =>
        {
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

/// The server refused to create the trigger (`ER_BINLOG_CREATE_ROUTINE_NEED_SUPER`, 1419):
/// with binary logging on, MySQL and MariaDB want `SUPER` (or
/// `log_bin_trust_function_creators = 1`) for it. Says so and what to do.
fn trigger_privilege(table: &str, e: sqlx::Error) -> Result<MigrateError, sqlx::Error> {
    match &e {
        sqlx::Error::Database(db)
            if db
                .try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
                .is_some_and(|m| m.number() == 1419) =>
        {
            Ok(MigrateError::Layout(format!(
                "creating the trigger of outbox table {table} needs the SUPER privilege while the \
                 server's binary logging is on (MySQL error 1419): run `outbox migrate` once as an \
                 administrator, or set log_bin_trust_function_creators = 1 on the server \
                 (docs/mysql.md, \"What a DBA grants and sets\")"
            )))
        }
        _ => Err(e),
    }
}
