//! Retention for SQLite: deletes delivered events older than a window in bounded batches
//! (one short write transaction each, oldest first), pausing between batches so the relay's
//! settle transactions (SQLite runs one writer at a time) get their turn. Pending and dead
//! rows are never touched. With `on_delivered = "delete"` there is nothing to delete.

use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::Duration;

use outbox_core::Identifier;
use outbox_core::admin::RetentionReport;
use outbox_core::retention_batches::delete_in_batches;
use sqlx::SqlitePool;
use time::OffsetDateTime;

use crate::sql::{render, stmt};
use crate::timestamp::{from_micros, to_micros};

/// Why a retention run failed.
#[derive(Debug, thiserror::Error)]
#[error("retention on outbox table {table} failed while {doing}")]
pub struct SqliteRetentionError {
    table: String,
    doing: &'static str,
    #[source]
    source: sqlx::Error,
}

/// Retention for one SQLite outbox table.
#[derive(Debug, Clone)]
pub struct SqliteRetention {
    pool: SqlitePool,
    table: Identifier,
    delete_batch: Arc<str>,
    count: Arc<str>,
}

impl SqliteRetention {
    /// Retention over `table` using `pool` (see [`crate::connect`]).
    pub fn new(pool: SqlitePool, table: &Identifier) -> Self {
        Self {
            pool,
            table: table.clone(),
            delete_batch: render(include_str!("../queries/retention_delete_batch.sql"), table)
                .into(),
            count: render(include_str!("../queries/retention_count.sql"), table).into(),
        }
    }

    fn err(&self, doing: &'static str) -> impl Fn(sqlx::Error) -> SqliteRetentionError + '_ {
        move |source| SqliteRetentionError {
            table: self.table.to_string(),
            doing,
            source,
        }
    }

    /// How many rows a run at `now` keeping `keep` would delete, and the oldest delivery time
    /// among them.
    pub async fn preview(
        &self,
        now: OffsetDateTime,
        keep: Duration,
    ) -> Result<(u64, Option<OffsetDateTime>), SqliteRetentionError> {
        let (n, oldest): (i64, Option<i64>) = sqlx::query_as(stmt(&self.count))
            .bind(to_micros(now - keep))
            .fetch_one(&self.pool)
            .await
            .map_err(self.err("counting delivered rows"))?;
        Ok((u64::try_from(n).unwrap_or(0), oldest.map(from_micros)))
    }

    /// Deletes delivered rows delivered before `now - keep`, `batch` rows per statement,
    /// sleeping `pause` between statements. `progress` gets the rows deleted so far after
    /// each full batch; `Break` stops the run.
    pub async fn run(
        &self,
        now: OffsetDateTime,
        keep: Duration,
        batch: u32,
        pause: Duration,
        progress: &mut (dyn FnMut(u64) -> ControlFlow<()> + Send),
    ) -> Result<RetentionReport, SqliteRetentionError> {
        let cutoff = to_micros(now - keep);
        let mut report = RetentionReport::default();
        delete_in_batches(batch, pause, progress, &mut report, |batch| async move {
            let done = sqlx::query(stmt(&self.delete_batch))
                .bind(cutoff)
                .bind(i64::from(batch))
                .execute(&self.pool)
                .await
                .map_err(self.err("deleting a batch of delivered rows"))?;
            Ok(done.rows_affected())
        })
        .await?;
        Ok(report)
    }
}
