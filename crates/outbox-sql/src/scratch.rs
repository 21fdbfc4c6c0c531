//! The sqlx step of `outbox crash-test`'s scratch outbox
//! ([`Scratch::remove`](outbox_core::backend::Scratch::remove)): dropping the scratch table
//! with the database's own drop script. (The rolled-back write is
//! [`outbox_core::scratch::write_and_roll_back`], which takes the pool's `begin` as an
//! argument: a generic version here over `sqlx::Pool` trips the compiler's higher-ranked
//! `Send` check on the boxed future.)

use std::fmt::Display;

use outbox_core::SourceError;
use outbox_core::relay::ErrorChain;
use sqlx::{Database, Executor, Pool};

/// Runs `statements` (the database's rendered drop script, one statement or several) in turn
/// on `pool`, each as raw SQL. A failure is fatal and names `table`.
///
/// Every statement must come from a bundled script rendered with validated identifiers only.
pub async fn drop_table<DB>(
    pool: &Pool<DB>,
    statements: impl IntoIterator<Item = String>,
    table: impl Display,
) -> Result<(), SourceError>
where
    DB: Database,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    for statement in statements {
        pool.execute(sqlx::raw_sql(sqlx::AssertSqlSafe(statement)))
            .await
            .map_err(|e| {
                SourceError::fatal(format!(
                    "dropping the scratch outbox table {table}: {}",
                    ErrorChain(&e)
                ))
            })?;
    }
    Ok(())
}
