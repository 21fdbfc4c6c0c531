//! Read-only views of the outbox for `status`, metrics and the watchdog: the backlog and who
//! holds the relay lease.

use std::sync::Arc;

use outbox_core::SourceError;
use outbox_core::source::{Backlog, Inspect};
use sqlx::{Row, SqlitePool};
use time::OffsetDateTime;

use crate::config::{OnDelivered, SqliteConfig};
use crate::error::source_error;
use crate::sql::{Queries, stmt};
use crate::timestamp::{from_micros, to_micros};

/// The relay lease as stored: which relay publishes from this file.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct RelayLease {
    /// The holding source's id (a UUID and the process id).
    pub holder: String,
    /// When the holder took the lease.
    #[serde(with = "time::serde::rfc3339")]
    pub acquired_at: OffsetDateTime,
    /// When the lease expires unless renewed; past it, any relay may take over.
    #[serde(with = "time::serde::rfc3339")]
    pub expires_at: OffsetDateTime,
}

/// Reads the backlog and the relay lease of one outbox table.
#[derive(Debug, Clone)]
pub struct SqliteInspector {
    pool: SqlitePool,
    queries: Arc<Queries>,
    table: String,
    keeps_delivered: bool,
}

impl SqliteInspector {
    /// An inspector over `config`'s table.
    pub fn new(pool: SqlitePool, config: &SqliteConfig) -> Self {
        Self {
            pool,
            queries: Arc::new(Queries::new(&config.table)),
            table: config.table.to_string(),
            keeps_delivered: config.on_delivered == OnDelivered::Mark,
        }
    }

    fn err(&self, context: &str, e: sqlx::Error) -> SourceError {
        source_error(context, &self.table, e)
    }

    /// Backlog counters at `now`. `delivered_last_minute` is `None` when delivered rows are
    /// deleted (`on_delivered = "delete"`).
    pub async fn backlog_at(&self, now: OffsetDateTime) -> Result<Backlog, SourceError> {
        let row = sqlx::query(stmt(&self.queries.backlog))
            .bind(to_micros(now))
            .fetch_one(&self.pool)
            .await
            .map_err(|e| self.err("reading the backlog", e))?;
        let count = |i: usize| -> Result<u64, SourceError> {
            row.try_get::<i64, _>(i)
                .map(|n| u64::try_from(n).unwrap_or(0))
                .map_err(|e| self.err("reading the backlog", e))
        };
        let oldest: Option<f64> = row
            .try_get(3)
            .map_err(|e| self.err("reading the backlog", e))?;
        Ok(Backlog {
            pending: count(0)?,
            retrying: count(1)?,
            dead: count(2)?,
            oldest_pending_age_seconds: oldest.unwrap_or(0.0).max(0.0),
            delivered_last_minute: if self.keeps_delivered {
                Some(count(4)?)
            } else {
                None
            },
        })
    }

    /// The relay lease, or `None` when no relay holds it (never started, or released).
    /// An expired lease is still returned: compare `expires_at` with the time.
    pub async fn relay_lease(&self) -> Result<Option<RelayLease>, SourceError> {
        let row = sqlx::query(stmt(&self.queries.lease_read))
            .fetch_optional(&self.pool)
            .await
            .map_err(|e| self.err("reading the relay lease", e))?;
        row.map(|r| {
            Ok(RelayLease {
                holder: r.try_get(0)?,
                acquired_at: from_micros(r.try_get(1)?),
                expires_at: from_micros(r.try_get(2)?),
            })
        })
        .transpose()
        .map_err(|e: sqlx::Error| self.err("reading the relay lease", e))
    }
}

impl Inspect for SqliteInspector {
    async fn backlog(&self) -> Result<Backlog, SourceError> {
        self.backlog_at(OffsetDateTime::now_utc()).await
    }
}
