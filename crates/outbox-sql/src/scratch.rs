//! The sqlx steps of `outbox crash-test`'s scratch outbox ([`Scratch`](outbox_core::backend::Scratch)):
//! a write in a transaction that is rolled back, and the removal of the scratch table. The
//! database crate brings its enqueue and its drop script.

use std::fmt::Display;

use outbox_core::SourceError;
use outbox_core::relay::ErrorChain;
use sqlx::{Database, Executor, Pool, Transaction};

/// [`Scratch::roll_back`](outbox_core::backend::Scratch::roll_back) on `pool`: in a new
/// transaction, `write` the events, then roll the transaction back
/// ([`outbox_core::scratch::write_and_roll_back`] names a failed step).
pub async fn write_and_roll_back<DB, O, W>(
    pool: &Pool<DB>,
    write: impl AsyncFnOnce(&mut Transaction<'static, DB>) -> Result<O, W>,
) -> Result<(), SourceError>
where
    DB: Database,
    W: std::error::Error + 'static,
{
    outbox_core::scratch::write_and_roll_back(pool.begin(), write, async |tx| tx.rollback().await)
        .await
}

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
