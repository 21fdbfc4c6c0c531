//! [`PgCdcInspector`]: the CDC backlog and the slot's health, for metrics, the watchdog and
//! `outbox status`.
//!
//! In CDC mode undelivered events are WAL, not row state: the slot's retained WAL is the
//! backlog measure that survives restarts, and the running source adds its in-memory counts.

use std::sync::Arc;

use outbox_core::SourceError;
use outbox_core::metrics as m;
use outbox_core::source::{Backlog, Inspect};
use sqlx::PgPool;
use time::OffsetDateTime;

use super::queries::CdcQueries;
use super::slot::{SlotStatus, slot_status};
use crate::config::PostgresConfig;
use crate::error::source_error;
use crate::sql::stmt;

/// Counters a running [`super::PgCdcSource`] shares with its inspector.
pub(crate) type CdcStats = outbox_core::stream_ledger::LedgerStats;

/// Reads the CDC backlog and the slot of one outbox. Cheap to clone.
#[derive(Debug, Clone)]
pub struct PgCdcInspector {
    pool: PgPool,
    slot: String,
    table: String,
    warn_bytes: u64,
    queries: Arc<CdcQueries>,
    stats: Option<Arc<CdcStats>>,
}

impl PgCdcInspector {
    /// An inspector without a running source (for `outbox status`): pending counts come only
    /// from the slot.
    pub fn new(pool: PgPool, config: &PostgresConfig) -> Self {
        let table = config.qualified_table();
        Self {
            pool,
            slot: config.slot.as_str().to_owned(),
            table: table.to_string(),
            warn_bytes: config.slot_lag_warn_bytes,
            queries: Arc::new(CdcQueries::new(&table, &config.publication)),
            stats: None,
        }
    }

    pub(crate) fn with_stats(pool: PgPool, config: &PostgresConfig, stats: Arc<CdcStats>) -> Self {
        Self {
            stats: Some(stats),
            ..Self::new(pool, config)
        }
    }

    /// Large transactions the running source took from scratch files (`source.spill_*`), as
    /// of its last fetch or settle; `None` without a running source.
    pub fn spilled(&self) -> Option<outbox_core::stream_ledger::Spilled> {
        self.stats.as_ref().map(|s| s.spilled())
    }

    /// The slot's status; `None` when it does not exist.
    pub async fn slot(&self) -> Result<Option<SlotStatus>, SourceError> {
        slot_status(&self.pool, &self.slot)
            .await
            .map_err(|e| source_error("reading the replication slot", &self.table, e))
    }

    /// Reads the slot, sets `outbox_replication_slot_retained_wal_bytes`, and warns when
    /// the slot retains more than `source.slot_lag_warn_bytes`, is invalidated or missing.
    pub async fn check_slot(&self) -> Result<Option<SlotStatus>, SourceError> {
        let status = self.slot().await?;
        match &status {
            None => tracing::error!(
                slot = %self.slot,
                "the replication slot does not exist: CDC cannot stream; see docs/cdc.md#failover"
            ),
            Some(s) if s.is_lost() => tracing::error!(
                slot = %self.slot,
                confirmed_flush_lsn = s.confirmed_flush_lsn.as_deref().unwrap_or("?"),
                "the replication slot was invalidated (wal_status = lost); see docs/cdc.md#failover"
            ),
            Some(s) => {
                let retained = s.retained_wal_bytes.unwrap_or(0).max(0);
                metrics::gauge!(m::REPLICATION_SLOT_RETAINED_WAL_BYTES).set(retained as f64);
                if retained as u64 > self.warn_bytes {
                    tracing::warn!(
                        slot = %self.slot,
                        retained_wal_bytes = retained,
                        threshold = self.warn_bytes,
                        active = s.active,
                        safe_wal_size = s.safe_wal_size,
                        "the replication slot retains more WAL than source.slot_lag_warn_bytes: is the relay running and keeping up?"
                    );
                }
            }
        }
        Ok(status)
    }

    /// The backlog at `now`.
    pub async fn backlog_at(&self, now: OffsetDateTime) -> Result<Backlog, SourceError> {
        self.check_slot().await?;
        let dead: i64 = crate::sql::query_scalar(stmt(&self.queries.backlog))
            .fetch_one(&self.pool)
            .await
            .map_err(|e| source_error("reading the backlog", &self.table, e))?;
        Ok(CdcStats::backlog(self.stats.as_deref(), dead, now))
    }
}

impl Inspect for PgCdcInspector {
    async fn backlog(&self) -> Result<Backlog, SourceError> {
        self.backlog_at(OffsetDateTime::now_utc()).await
    }
}
