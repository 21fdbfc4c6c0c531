//! The relay's connection pool.

use std::str::FromStr as _;

use sqlx::mysql::{MySqlConnectOptions, MySqlPoolOptions};
use sqlx::{Executor as _, MySqlPool};

use crate::config::MySqlConfig;

/// Opens the relay's pool for `config`, waiting up to `connect_timeout` for a connection.
///
/// Every connection runs `READ COMMITTED` (the claim's plain reads must see rows committed
/// after the claim began, and `REPEATABLE READ`'s gap locks would block producers' inserts)
/// and ends a transaction left idle for `claim_timeout`: `idle_transaction_timeout` on
/// MariaDB, `wait_timeout` on MySQL, which has no per-transaction limit.
pub async fn connect(config: &MySqlConfig, max_connections: u32) -> Result<MySqlPool, sqlx::Error> {
    let options = MySqlConnectOptions::from_str(&config.connect_url())?;
    let timeout = config.claim_timeout_secs();
    MySqlPoolOptions::new()
        .max_connections(max_connections.max(1))
        .acquire_timeout(config.connect_timeout)
        .after_connect(move |conn, _| {
            Box::pin(async move {
                conn.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
                    .await?;
                let version: String = sqlx::query_scalar("SELECT VERSION()")
                    .fetch_one(&mut *conn)
                    .await?;
                let limit = if version.contains("MariaDB") {
                    "idle_transaction_timeout"
                } else {
                    "wait_timeout"
                };
                // Both names are constants; the value is a bound number.
                sqlx::query(sqlx::AssertSqlSafe(format!("SET SESSION {limit} = ?")))
                    .bind(timeout)
                    .execute(&mut *conn)
                    .await?;
                Ok(())
            })
        })
        .connect_with(options)
        .await
}
