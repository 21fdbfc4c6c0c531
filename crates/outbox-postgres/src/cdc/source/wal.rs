//! The replication stream as the shared change-stream machinery reads it ([`Wal`]):
//! decoded steps into the ledger, the synchronous-standby gate, the slot's confirmed position
//! and the saved offset with its `aggregate_seq` heads.

use std::future::Future;
use std::time::Duration;

use outbox_core::SourceError;
use outbox_core::change_stream::{ChangeStream, LogReader};
use tokio::time::Instant;

use super::super::decode::Step;
use super::super::ledger::{Meta, Origin, with_meta};
use super::super::standby;
use super::super::stream::{Stream, wire_error};
use super::PgCdcSource;
use crate::sql::stmt;

impl PgCdcSource {
    /// Interprets one replication event. Returns true when a transaction committed.
    pub(super) fn apply(
        &mut self,
        event: pgwire_replication::ReplicationEvent,
    ) -> Result<bool, SourceError> {
        let step = self
            .decoder
            .apply(event, &self.spill)
            .map_err(|e| e.into_source_error(&self.table))?;
        let step = match (step, self.recovery.as_mut()) {
            (
                Step::Committed {
                    mut events,
                    end_lsn,
                    xid,
                },
                Some(r),
            ) if r.after.sees(xid) => {
                // Committed before the recovery's snapshot: its rows were published from the
                // table. Table-less events are in no table: they stay.
                let before = events.len();
                events.retain(|(_, origin)| matches!(origin, Origin::Message));
                r.covered += (before - events.len()) as u64;
                Step::Committed {
                    events,
                    end_lsn,
                    xid,
                }
            }
            (step, _) => step,
        };
        let ends = match &step {
            Step::Committed {
                events, end_lsn, ..
            } => Some((*end_lsn, events.len())),
            Step::Spilled { end_lsn, .. } => Some((*end_lsn, 0)),
            _ => None,
        };
        let (committed, reached) = match ends {
            Some((end_lsn, events)) if !self.standby.passes(end_lsn) => {
                self.standby.hold(end_lsn, events, step);
                metrics::gauge!(outbox_core::metrics::CDC_WAITING_FOR_STANDBY)
                    .set(self.standby.held_events() as f64);
                (false, Some(end_lsn))
            }
            _ => self.commit_step(step),
        };
        if let Some(reached) = reached {
            self.cs.reached(reached);
        }
        self.report_confirmed();
        Ok(committed)
    }

    /// Lets the held transactions the synchronous standbys now have into the ledger.
    pub(super) async fn release_replicated(&mut self) -> Result<(), SourceError> {
        if self.standby.is_empty() {
            return Ok(());
        }
        self.standby.poll(&self.pool).await?;
        for step in self.standby.release() {
            self.commit_step(step);
        }
        metrics::gauge!(outbox_core::metrics::CDC_WAITING_FOR_STANDBY)
            .set(self.standby.held_events() as f64);
        self.report_confirmed();
        Ok(())
    }

    /// Hands a decoded step to the ledger. Returns whether a transaction with events
    /// committed, and the position reached.
    pub(super) fn commit_step(&mut self, step: Step) -> (bool, Option<u64>) {
        match step {
            Step::Nothing => (false, None),
            Step::Committed {
                events, end_lsn, ..
            } if end_lsn <= self.skip_through => {
                // The broker acknowledged these before the database lost the slot's newer
                // position (a crash): confirm the transaction, publish nothing.
                self.skipped += events.len() as u64;
                self.cs.ledger.commit(Vec::new(), end_lsn);
                (false, Some(end_lsn))
            }
            Step::Committed {
                events,
                end_lsn,
                xid,
            } => {
                if self.skipped > 0 {
                    tracing::info!(
                        skipped = self.skipped,
                        "the slot replayed events the broker had already acknowledged (saved CDC position); not published again"
                    );
                    self.skipped = 0;
                }
                self.cs.ledger.commit(with_meta(events, xid), end_lsn);
                (true, Some(end_lsn))
            }
            Step::Spilled { events, end_lsn } if end_lsn <= self.skip_through => {
                self.skipped += events.len() as u64;
                self.cs.ledger.commit(Vec::new(), end_lsn);
                (false, Some(end_lsn))
            }
            Step::Spilled { events, end_lsn } => {
                // Loaded in batches by `pump`; the stream waits until all of it is loaded.
                self.cs.ledger.commit_spilled(events, end_lsn);
                (true, Some(end_lsn))
            }
            Step::KeepAlive { wal_end } => {
                // Nothing in flight on the stream, and nothing waiting for the standbys.
                if !self.decoder.in_transaction() && self.standby.is_empty() {
                    self.cs.ledger.idle_confirm(wal_end);
                }
                (false, Some(wal_end))
            }
        }
    }

    /// How far the slot may be confirmed: the ledger's position, but not past a transaction
    /// whose `aggregate_seq` heads are not saved yet.
    pub(super) fn confirmable(&self) -> u64 {
        let confirmed = self.cs.ledger.confirmed();
        if self.numbering {
            self.positions.bound(confirmed, self.offset.saved())
        } else {
            confirmed
        }
    }

    /// Saves the acknowledged position (with the heads up to it), then confirms what that
    /// allows.
    pub(super) async fn save_offset(&mut self) {
        let confirmed = self.cs.ledger.confirmed();
        if self.confirmable() < confirmed {
            // Settled transactions whose heads wait for a save (settled without a batch, say
            // all parked): due now, or they would hold the slot back until the next batch.
            self.offset.reached(confirmed);
        }
        let positions = self.numbering.then_some(&mut self.positions);
        self.offset.save(&self.pool, false, positions).await;
        self.report_confirmed();
    }

    /// Numbers the events the stream brought since the last fetch (`aggregate_seq`), reading
    /// the heads of aggregates not in memory. Runs before anything can drop or hand out an
    /// event, so every event is numbered, in commit order.
    pub(super) async fn number_events(&mut self) -> Result<(), SourceError> {
        if !self.numbering {
            return Ok(());
        }
        let unknown = self.positions.unknown(&self.cs.ledger);
        if !unknown.is_empty() {
            let types: Vec<&str> = unknown.iter().map(|(t, _)| t.as_str()).collect();
            let ids: Vec<&str> = unknown.iter().map(|(_, i)| i.as_str()).collect();
            let found: Vec<(String, String, i64)> =
                crate::sql::query_as(stmt(&self.queries.positions_read))
                    .bind(&types)
                    .bind(&ids)
                    .fetch_all(&self.pool)
                    .await
                    .map_err(|e| self.db_err("reading delivery positions", e))?;
            self.positions.load(unknown, found);
        }
        self.positions.assign(&mut self.cs.ledger);
        Ok(())
    }

    pub(super) fn report_confirmed(&mut self) {
        let confirmed = self.confirmable();
        if confirmed > self.reported
            && let Some(stream) = &self.stream
        {
            stream.confirm(confirmed);
            self.reported = confirmed;
        }
    }

    /// Applies one item of the replication stream; a failure ends the session.
    pub(super) fn receive(&mut self, received: WireItem) -> Result<bool, SourceError> {
        match received {
            Ok(Some(event)) => {
                self.last_heard = Instant::now();
                self.apply(event).map_err(|e| self.lost(e))
            }
            Ok(None) => Err(self.lost(SourceError::unavailable(
                "the server ended the replication stream",
            ))),
            Err(e) => {
                let e = wire_error("reading the replication stream", &e);
                Err(self.lost(e))
            }
        }
    }

    /// Ends the session after a failure; the next `fetch` reconnects and the stream resends
    /// everything unconfirmed.
    pub(super) fn lost(&mut self, error: SourceError) -> SourceError {
        self.stream = None;
        self.cs.set_streaming(false);
        self.cs.ledger.reset(self.cs.ledger.confirmed());
        self.standby.clear();
        self.cs.claim.retry_now();
        tracing::warn!(error = %outbox_core::relay::ErrorChain(&error), "replication stream lost; unconfirmed events will be streamed again");
        error
    }
}

/// One item of the replication stream.
type WireItem =
    Result<Option<pgwire_replication::ReplicationEvent>, pgwire_replication::PgWireError>;

/// The source as the shared machinery reads its log ([`LogReader`]).
pub(super) struct Wal<'a>(pub(super) &'a mut PgCdcSource);

impl LogReader for Wal<'_> {
    type Meta = Meta;
    type Item = WireItem;

    fn stream(&self) -> &ChangeStream<Meta> {
        &self.0.cs
    }

    fn stream_mut(&mut self) -> &mut ChangeStream<Meta> {
        &mut self.0.cs
    }

    fn is_open(&self) -> bool {
        self.0.stream.is_some()
    }

    fn next_item(&mut self) -> Option<impl Future<Output = WireItem> + Send + '_> {
        self.0.stream.as_mut().map(Stream::recv)
    }

    fn receive(&mut self, received: WireItem) -> Result<bool, SourceError> {
        self.0.receive(received)
    }

    fn lost(&mut self, error: SourceError) -> SourceError {
        self.0.lost(error)
    }

    fn mid_transaction(&self) -> bool {
        self.0.decoder.in_transaction()
    }

    fn held(&self) -> usize {
        self.0.standby.held_events()
    }

    fn wake_within(&self) -> Option<Duration> {
        // Held for the standbys: `fetch` asks them again soon.
        (!self.0.standby.is_empty()).then_some(standby::POLL_EVERY)
    }

    fn silent(&mut self) -> Option<SourceError> {
        // A primary gone without closing the connection (a dead VM: no FIN, no RST) sends
        // nothing, not even keepalives.
        let silent = self.0.last_heard.elapsed();
        (silent > self.0.silence_limit).then(|| {
            SourceError::unavailable(format!(
                "the replication stream has been silent for {silent:?}, past wal_sender_timeout and a heartbeat: the server is unreachable; reconnecting"
            ))
        })
    }
}
