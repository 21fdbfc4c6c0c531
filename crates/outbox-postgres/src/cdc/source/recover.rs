//! A lost slot (a failover, a drop, an invalidation): recreated, and what it had not
//! acknowledged published from the table before streaming resumes (docs/cdc.md#failover).

use outbox_core::SourceError;

use super::super::ledger::Meta;
use super::super::recovery::{self, RecoveryStatus, Snapshot};
use super::super::slot;
use super::{PgCdcSource, Recovering};
use crate::config::OnSlotLoss;
use crate::error::source_error;

impl PgCdcSource {
    /// The slot is gone (or invalidated): with `on_slot_loss = "recover"`, records the
    /// recovery and creates the slot again. Another relay doing the same at the same moment
    /// is fine: one creates the slot, the other then finds it.
    pub(super) async fn recreate_slot(&mut self, invalidated: bool) -> Result<(), SourceError> {
        let slot = self.config.slot.as_str();
        if self.config.on_slot_loss == OnSlotLoss::Stop {
            return Err(SourceError::fatal(format!(
                "replication slot `{slot}` does not exist and source.on_slot_loss = \"stop\"; on a first set-up run `outbox migrate` with source.mode = \"cdc\"; if it was lost (a failover, a drop), `outbox migrate` creates it again and records the recovery, which the next relay runs (docs/cdc.md#failover)"
            )));
        }
        let state = recovery::read_state(&self.pool, &self.queries, slot)
            .await
            .map_err(|e| self.db_err("reading the saved CDC position", e))?;
        if !state.is_some_and(|s| s.has_snapshot) {
            return Err(SourceError::fatal(format!(
                "replication slot `{slot}` does not exist, and {}_cdc_offsets holds no acknowledged snapshot of it, so what it had not delivered cannot be known exactly; on a first set-up run `outbox migrate` with source.mode = \"cdc\"; otherwise see docs/cdc.md#failover",
                self.table
            )));
        }
        if invalidated {
            tracing::warn!(
                slot,
                "the server invalidated the replication slot (wal_status = lost); dropping it to recover from the table"
            );
            match crate::sql::query("SELECT pg_drop_replication_slot($1)")
                .bind(slot)
                .execute(&self.pool)
                .await
            {
                Ok(_) => {}
                Err(sqlx::Error::Database(db)) if db.code().as_deref() == Some("42704") => {}
                Err(e) => return Err(self.db_err("dropping the invalidated replication slot", e)),
            }
        }
        let Some(lost_from) = recovery::begin(&self.pool, &self.queries, slot)
            .await
            .map_err(|e| self.db_err("recording the slot recovery", e))?
        else {
            return Ok(()); // created meanwhile by another relay (or `migrate`)
        };
        self.offset.reset();
        let created: Option<String> = match slot::create(&self.pool, &self.config).await {
            Ok(lsn) => Some(lsn),
            Err(sqlx::Error::Database(db)) if db.code().as_deref() == Some("42710") => None,
            Err(e) => return Err(self.db_err("creating the replication slot again", e)),
        };
        if let Some(start) = created {
            metrics::counter!(outbox_core::metrics::CDC_SLOT_RECOVERIES).increment(1);
            metrics::counter!(outbox_core::metrics::CDC_MESSAGE_LOSS_WINDOWS).increment(1);
            tracing::warn!(
                slot,
                lost_from = %pgwire_replication::Lsn::from_u64(lost_from),
                new_slot_from = %start,
                "replication slot `{slot}` was gone (a failover to a standby, or a drop); created it again. Every outbox row it had not acknowledged is published from the table before streaming resumes. Table-less events (pg_logical_emit_message) committed after {} and before {start} exist in no table: they may have been lost",
                pgwire_replication::Lsn::from_u64(lost_from)
            );
        }
        Ok(())
    }

    /// Publishes first, from the table, what the lost slot had not acknowledged.
    pub(super) async fn start_recovery(
        &mut self,
        mut lost: RecoveryStatus,
        confirmed: u64,
    ) -> Result<(), SourceError> {
        let slot = self.config.slot.as_str().to_owned();
        let err = |context: &str, e| source_error(context, &self.table, e);
        if lost.after_snapshot.is_none() {
            recovery::take_after(&self.pool, &self.queries, &slot)
                .await
                .map_err(|e| err("starting the slot recovery", e))?;
            lost = recovery::read_state(&self.pool, &self.queries, &slot)
                .await
                .map_err(|e| err("starting the slot recovery", e))?
                .and_then(|s| s.recovery)
                .filter(RecoveryStatus::in_progress)
                .ok_or_else(|| {
                    SourceError::unavailable("the slot recovery record changed under this relay")
                })?;
        }
        let after_text = lost.after_snapshot.clone().ok_or_else(|| {
            SourceError::unavailable("the slot recovery has no upper snapshot yet")
        })?;
        let after = Snapshot::parse(&after_text)?;
        let events = recovery::events(&self.pool, &self.queries, &lost.from_snapshot, &after_text)
            .await
            .map_err(|e| err("reading the events of the slot recovery", e))?;
        let published = events.len() as u64;
        let events = events
            .into_iter()
            .map(|(event, origin, xid)| (event, Meta { origin, xid }))
            .collect();
        self.cs.ledger.commit(events, confirmed);
        let last_position = self
            .cs
            .ledger
            .entries()
            .map(|e| e.event.position.0)
            .max()
            .unwrap_or(0);
        tracing::warn!(
            slot,
            events = published,
            lost_from = %pgwire_replication::Lsn::from_u64(lost.lost_from_lsn.unwrap_or(0)),
            "recovering a lost replication slot: publishing from the table the events it had not acknowledged, in commit order per aggregate, before streaming"
        );
        self.recovery = Some(Recovering {
            after,
            after_lsn: lost.after_lsn.unwrap_or(0),
            last_position,
            published,
            covered: 0,
        });
        Ok(())
    }

    /// Marks the recovery done once its events are settled and the stream has passed the
    /// point after which the table gave nothing the stream would repeat.
    pub(super) async fn finish_recovery(&mut self) {
        let Some(r) = &self.recovery else {
            return;
        };
        if self.cs.ledger.confirmed() < r.after_lsn
            || self
                .cs
                .ledger
                .entries()
                .any(|e| e.event.position.0 <= r.last_position)
        {
            return;
        }
        match recovery::finish(
            &self.pool,
            &self.queries,
            self.config.slot.as_str(),
            r.published,
        )
        .await
        {
            Ok(()) => {
                metrics::counter!(outbox_core::metrics::CDC_RECOVERED_EVENTS)
                    .increment(r.published);
                tracing::info!(
                    slot = self.config.slot.as_str(),
                    published = r.published,
                    streamed_rows_skipped = r.covered,
                    "slot recovery finished"
                );
                self.recovery = None;
            }
            Err(e) => tracing::warn!(
                error = %self.db_err("recording the end of the slot recovery", e),
                "will try again"
            ),
        }
    }
}
