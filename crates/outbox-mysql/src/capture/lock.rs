//! One install or remove at a time per outbox table (`GET_LOCK`), and how long they wait
//! for a table's metadata lock before saying so.

use outbox_core::capture::CaptureError;
use sqlx::pool::PoolConnection;
use sqlx::{Executor, MySql};

use super::{MySqlCapture, db};

/// How long install and remove wait for a table's metadata lock: `LOCK TABLES` and
/// `CREATE TRIGGER` wait for the transactions using the table, and later writers wait behind
/// them.
pub(super) const LOCK_WAIT_SECONDS: u32 = 10;

impl MySqlCapture {
    /// A connection holding the capture lock of this outbox table (one install or remove at
    /// a time) and waiting at most [`LOCK_WAIT_SECONDS`] for table locks.
    pub(super) async fn locked(
        &self,
        context: &str,
    ) -> Result<PoolConnection<MySql>, CaptureError> {
        let mut conn = self.pool.acquire().await.map_err(db(context))?;
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "SET SESSION lock_wait_timeout = {LOCK_WAIT_SECONDS}"
        )))
        .execute(&mut *conn)
        .await
        .map_err(db(context))?;
        // Lock names are limited to 64 characters: the database and table as a SHA-1.
        let got: Option<i64> = sqlx::query_scalar(
            "SELECT GET_LOCK(CONCAT('outbox capture ', SHA1(CONCAT(DATABASE(), '.', ?))), ?)",
        )
        .bind(self.outbox.as_str())
        .bind(LOCK_WAIT_SECONDS)
        .fetch_one(&mut *conn)
        .await
        .map_err(db(context))?;
        if got != Some(1) {
            return Err(CaptureError::Database {
                context: format!(
                    "{context}: another `outbox capture install` or `remove` is running (its lock was not granted within {LOCK_WAIT_SECONDS}s); nothing was changed, run it again"
                ),
                source: "GET_LOCK timed out".into(),
            });
        }
        Ok(conn)
    }

    /// Ends the table locks and the capture lock before the connection goes back to the
    /// pool. Best effort: both are the session's, and end with it.
    pub(super) async fn unlock(&self, conn: &mut PoolConnection<MySql>) {
        let _ = conn.execute("UNLOCK TABLES").await;
        let _ = sqlx::query(
            "DO RELEASE_LOCK(CONCAT('outbox capture ', SHA1(CONCAT(DATABASE(), '.', ?))))",
        )
        .bind(self.outbox.as_str())
        .execute(&mut **conn)
        .await;
    }
}

/// [`db`], saying so when the statement gave up waiting for a table's metadata lock
/// (`ER_LOCK_WAIT_TIMEOUT`, 1205).
pub(super) fn lock_or_db(context: String) -> impl FnOnce(sqlx::Error) -> CaptureError {
    move |e| {
        let lock =
            matches!(&e, sqlx::Error::Database(d) if d.message().contains("Lock wait timeout"));
        let context = if lock {
            format!(
                "{context}: the table's lock was not granted within {LOCK_WAIT_SECONDS}s (a long transaction uses the table); nothing was changed, run it again"
            )
        } else {
            context
        };
        CaptureError::database(context)(e)
    }
}
