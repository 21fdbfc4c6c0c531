//! Taking the slot: the start checks (a primary, the slot there or recreated), the
//! session, where the stream resumes, and the aggregates to check against dead letters.

use std::collections::HashSet;
use std::time::Duration;

use outbox_core::SourceError;
use sqlx::Row;
use tokio::time::Instant;

use super::super::decode::Decoder;
use super::super::recovery::RecoveryStatus;
use super::super::slot;
use super::super::standby::{self, StandbyGate};
use super::super::stream::{OpenError, Stream};
use super::{DEFAULT_SILENCE_LIMIT, PgCdcSource, STANDBY_RETRY};
use crate::sql::stmt;

impl PgCdcSource {
    /// Opens the session if this source does not hold the slot yet. `Ok(false)`: standing by.
    pub(super) async fn ensure_streaming(&mut self) -> Result<bool, SourceError> {
        if self.stream.is_some() {
            return Ok(true);
        }
        if !self.cs.claim.due() {
            return Ok(false);
        }
        let in_recovery: bool = crate::sql::query_scalar("SELECT pg_is_in_recovery()")
            .fetch_one(&self.pool)
            .await
            .map_err(|e| self.db_err("asking the server whether it is a standby", e))?;
        if in_recovery {
            return Err(SourceError::unavailable(format!(
                "{} is a standby in recovery (read-only): logical replication needs the primary; retrying until the address leads to one (docs/cdc.md#failover)",
                self.config.url
            )));
        }
        let mut readiness = slot::check(&self.pool, &self.config).await?;
        if readiness.missing || readiness.invalidated {
            self.recreate_slot(readiness.invalidated).await?;
            readiness = slot::check(&self.pool, &self.config).await?;
            if readiness.missing || readiness.invalidated {
                return Err(SourceError::unavailable(format!(
                    "replication slot `{}` is still missing right after it was created",
                    self.config.slot
                )));
            }
        }
        if readiness.busy {
            self.note_standby();
            return Ok(false);
        }
        let stream = match Stream::open(&self.endpoint, self.config.connect_timeout).await {
            Ok(s) => s,
            Err(OpenError::Busy) => {
                self.note_standby();
                return Ok(false);
            }
            Err(OpenError::Failed(e)) => return Err(e),
        };
        // The slot is ours now: nobody else can move it. Read where the stream resumes, and
        // how far the server's WAL reaches.
        let confirmed = self.read_confirmed().await?;
        let flushed: i64 =
            crate::sql::query_scalar("SELECT (pg_current_wal_flush_lsn() - '0/0'::pg_lsn)::bigint")
                .fetch_one(&self.pool)
                .await
                .map_err(|e| self.db_err("reading the WAL position", e))?;
        self.cs.catch_up = Some(flushed.max(0) as u64);
        let sender_timeout_ms: i64 = crate::sql::query_scalar(
            "SELECT setting::bigint FROM pg_settings WHERE name = 'wal_sender_timeout'",
        )
        .fetch_one(&self.pool)
        .await
        .map_err(|e| self.db_err("reading wal_sender_timeout", e))?;
        self.silence_limit = match u64::try_from(sender_timeout_ms) {
            Ok(ms) if ms > 0 => Duration::from_millis(ms) + self.config.heartbeat_interval,
            _ => DEFAULT_SILENCE_LIMIT,
        };
        self.last_heard = Instant::now();
        // Only this relay saves from now on; a late save of the last owner is in what
        // `load` reads, or refused.
        self.offset.claim(&self.pool).await?;
        let state = self.offset.load(&self.pool).await?;
        let saved = state.confirmed_lsn;
        // The stream resumes after `saved`, whose heads are in the table: read them again.
        self.positions.reset();
        self.numbering = self.offset.available();
        self.skip_through = saved;
        self.skipped = 0;
        self.cs.ledger.reset(confirmed);
        self.reported = confirmed;
        self.recovery = None;
        self.standby =
            StandbyGate::new(standby::required(&self.pool, self.config.wait_for_standby).await?);
        if self.standby.active() {
            tracing::info!(
                "synchronous standbys configured: a transaction is published once they have flushed it (source.wait_for_standby)"
            );
        }
        if let Some(lost) = state.recovery.filter(RecoveryStatus::in_progress) {
            self.start_recovery(lost, confirmed).await?;
        }
        self.decoder = Decoder::new(
            self.config.schema.as_str(),
            self.config.table.as_str(),
            &self.config.message_prefix,
        );
        self.load_dead().await?;
        tracing::info!(
            slot = self.config.slot.as_str(),
            publication = self.config.publication.as_str(),
            resume_at = %pgwire_replication::Lsn::from_u64(confirmed),
            acknowledged_through = %pgwire_replication::Lsn::from_u64(saved),
            took_over = self.cs.claim.took(),
            "streaming the outbox from the replication slot"
        );
        self.stream = Some(stream);
        self.cs.set_streaming(true);
        Ok(true)
    }

    pub(super) fn note_standby(&mut self) {
        if self.cs.claim.stand_by() {
            tracing::info!(
                slot = self.config.slot.as_str(),
                retry_every = ?STANDBY_RETRY,
                "another relay streams from the replication slot; standing by"
            );
        }
    }

    pub(super) async fn read_confirmed(&self) -> Result<u64, SourceError> {
        let status = slot::slot_status(&self.pool, self.config.slot.as_str())
            .await
            .map_err(|e| self.db_err("reading the replication slot", e))?
            .ok_or_else(|| SourceError::fatal("the replication slot vanished"))?;
        let lsn = status.confirmed_flush_lsn.unwrap_or_default();
        pgwire_replication::Lsn::parse(&lsn)
            .map(|l| l.as_u64())
            .map_err(|e| SourceError::fatal(format!("unreadable confirmed_flush_lsn `{lsn}`: {e}")))
    }

    /// The aggregates whose events are checked before they go out: those with dead letters,
    /// and those with dead letters put back in line and not delivered since.
    pub(super) async fn load_dead(&mut self) -> Result<(), SourceError> {
        let mut dead = HashSet::new();
        for sql in [
            &self.queries.dead_aggregates,
            &self.queries.put_back_aggregates,
        ] {
            let rows = crate::sql::query(stmt(sql))
                .fetch_all(&self.pool)
                .await
                .map_err(|e| self.db_err("reading dead-lettered aggregates", e))?;
            for r in &rows {
                let key = (|| Ok::<_, sqlx::Error>((r.try_get(0)?, r.try_get(1)?)))()
                    .map_err(|e| self.db_err("reading dead-lettered aggregates", e))?;
                dead.insert(key);
            }
        }
        self.cs.dead = dead;
        Ok(())
    }
}
