//! [`PgCdcSource`]: the outbox as a logical-replication stream.
//!
//! One source streams from the slot; the server refuses a second `START_REPLICATION` on an
//! active slot, and that refusal is the standby mechanism: other relays' sources find the
//! slot busy, return no events, and try again every [`STANDBY_RETRY`]. When the active relay
//! dies its connection closes, the server releases the slot, and a standby starts streaming at
//! its next try.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use outbox_core::aggregate_seq::StreamPositions;
use outbox_core::change_stream::{self, ChangeStream};
use outbox_core::source::{Fetched, Settlement};
use outbox_core::spill::SpillSettings;
use outbox_core::{DeadLetterPolicy, Ordering, Source, SourceError};
use sqlx::PgPool;
use time::OffsetDateTime;
use tokio::sync::watch;
use tokio::time::Instant;
use uuid::Uuid;

use super::decode::{Decoder, Step};
use super::inspect::PgCdcInspector;
use super::ledger::Meta;
use super::offset::SavedOffset;
use super::queries::CdcQueries;
use super::recovery::Snapshot;
use super::standby::StandbyGate;
use super::stream::{Endpoint, Stream};
use crate::config::PostgresConfig;
use crate::error::source_error;

mod dead;
mod open;
mod recover;
mod wal;

use wal::Wal;

/// How often a standby tries to take the slot over.
pub const STANDBY_RETRY: Duration = change_stream::STANDBY_RETRY;

/// The silence limit when the server's `wal_sender_timeout` is 0 (no keepalives promised).
const DEFAULT_SILENCE_LIMIT: Duration = Duration::from_secs(120);

/// Longest wait for a streamed transaction to become visible to queries.
const VISIBILITY_TIMEOUT: Duration = Duration::from_secs(5);

/// Reads the outbox over logical replication (`source.mode = "cdc"`).
///
/// Delivery contract (the [`Source`] contract, plus):
/// - Events come in commit (WAL) order; `ordering = "total"` holds with one active relay.
/// - An event's [`outbox_core::Position`] is a counter this source assigns; the source maps
///   it to its transaction's commit LSN.
/// - The slot's confirmed position advances only over the contiguous prefix of transactions
///   whose every event was delivered or dead-lettered. After a crash (`kill -9`) the stream
///   resumes there: nothing is lost, the unconfirmed tail is published again.
/// - Retried and released events wait in memory and come back in order; retry counts live
///   in memory too and restart from zero after a restart.
/// - Every event carries `aggregate_seq`, its aggregate's next number in commit order, given
///   when the stream brings it and kept across retries; the heads are saved with the
///   acknowledged position and the slot is confirmed only over saved heads, so the tail a
///   restart streams again gets the same numbers (`outbox_core::aggregate_seq`, "Change
///   streams"). A dead-lettered event (or one parked behind a dead letter) uses its number
///   up; put back in line by `outbox dead retry` or `outbox replay` it is a new delivery,
///   with the aggregate's next number.
/// - A clean shutdown (dropping the source) sends a final standby status update; wait for it
///   with [`PgCdcSource::closed`].
pub struct PgCdcSource {
    pool: PgPool,
    config: PostgresConfig,
    endpoint: Endpoint,
    queries: Arc<CdcQueries>,
    table: String,
    /// The shared change-stream state: ledger, dead-letter checks, the claim.
    cs: ChangeStream<Meta>,
    stream: Option<Stream>,
    decoder: Decoder,
    /// When an open transaction goes to a scratch file (`source.spill_*`).
    spill: Arc<SpillSettings>,
    /// Confirmed LSN last handed to the stream.
    reported: u64,
    /// Put-back rows delivered whose mark is not cleared in the table yet.
    unmarked: HashSet<Uuid>,
    /// Events this source streamed again (once each: see `resolve_put_back`).
    restreamed: HashSet<Uuid>,
    /// The acknowledged position saved in `<table>_cdc_offsets`.
    offset: SavedOffset,
    /// The `aggregate_seq` numbering, saved with `offset`.
    positions: StreamPositions,
    /// Whether events are numbered (the position table exists).
    numbering: bool,
    /// After (re)starting: transactions ending at or before this LSN were acknowledged
    /// before (saved position) and are dropped from the replay.
    skip_through: u64,
    /// Events dropped that way since the stream started.
    skipped: u64,
    /// A recovery of a lost slot under way (see `recovery.rs`).
    recovery: Option<Recovering>,
    /// Committed transactions waiting for the synchronous standbys (`standby.rs`).
    standby: StandbyGate<Step>,
    /// When the stream last said anything (an event or a keepalive).
    last_heard: Instant,
    /// Silence after which the server is taken for gone: a walsender sends a keepalive at
    /// least every `wal_sender_timeout / 2` while idle, so two missed ones and a heartbeat.
    silence_limit: Duration,
    closed_tx: Option<watch::Sender<()>>,
    closed_rx: watch::Receiver<()>,
}

/// A slot recovery this source runs: the events it published from the table, and the
/// snapshot whose transactions the new slot's stream must not publish again.
#[derive(Debug)]
struct Recovering {
    after: Snapshot,
    after_lsn: u64,
    /// The ledger position of the last event published from the table (0: none).
    last_position: i64,
    published: u64,
    /// Rows the stream carried that the table had already given.
    covered: u64,
}

impl std::fmt::Debug for PgCdcSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgCdcSource")
            .field("table", &self.table)
            .field("slot", &self.config.slot.as_str())
            .field("streaming", &self.stream.is_some())
            .field("confirmed", &self.cs.ledger.confirmed())
            .finish_non_exhaustive()
    }
}

/// Resolves when a dropped [`PgCdcSource`] has closed its replication session (after the
/// final standby status update).
#[derive(Debug, Clone)]
pub struct CdcClosed(watch::Receiver<()>);

impl CdcClosed {
    /// Waits until the source is dropped and its session closed.
    pub async fn wait(mut self) {
        while self.0.changed().await.is_ok() {}
    }
}

impl PgCdcSource {
    /// A source over `config`'s table, slot and publication. `pool` serves dead-lettering
    /// and slot checks; the replication session opens on the first `fetch`.
    pub fn new(
        pool: PgPool,
        config: &PostgresConfig,
        ordering: Ordering,
        dead_letter: DeadLetterPolicy,
    ) -> Result<Self, SourceError> {
        let endpoint = Endpoint::new(config).map_err(SourceError::fatal)?;
        let table = config.qualified_table();
        let (closed_tx, closed_rx) = watch::channel(());
        let queries = Arc::new(CdcQueries::new(&table, &config.publication));
        Ok(Self {
            pool,
            config: config.clone(),
            endpoint,
            offset: SavedOffset::new(queries.clone(), config.slot.as_str()),
            positions: StreamPositions::default(),
            numbering: false,
            skip_through: 0,
            skipped: 0,
            recovery: None,
            standby: StandbyGate::new(false),
            last_heard: Instant::now(),
            silence_limit: DEFAULT_SILENCE_LIMIT,
            queries,
            table: table.to_string(),
            cs: ChangeStream::new(ordering, dead_letter),
            stream: None,
            decoder: Decoder::new(
                config.schema.as_str(),
                config.table.as_str(),
                &config.message_prefix,
            ),
            spill: Arc::new(config.spill_settings()),
            reported: 0,
            unmarked: HashSet::new(),
            restreamed: HashSet::new(),
            closed_tx: Some(closed_tx),
            closed_rx,
        })
    }

    /// An inspector that reports this source's in-memory backlog along with the slot.
    pub fn inspector(&self) -> PgCdcInspector {
        PgCdcInspector::with_stats(self.pool.clone(), &self.config, self.cs.stats.clone())
    }

    /// A handle that resolves once this source, after being dropped, closed its session.
    pub fn closed(&self) -> CdcClosed {
        CdcClosed(self.closed_rx.clone())
    }

    /// Events of committed transactions held until the synchronous standbys have them
    /// (`source.wait_for_standby`).
    pub fn held_for_standby(&self) -> usize {
        self.standby.held_events()
    }

    /// True while this source holds the slot and streams from it.
    pub fn is_streaming(&self) -> bool {
        self.stream.is_some()
    }

    /// Drops the source at once without the final standby status update and without ending
    /// the session cleanly, as a crash would (for fault-injection tests).
    pub fn abort(mut self) {
        if let Some(stream) = self.stream.take() {
            stream.abort();
        }
    }

    fn db_err(&self, context: &str, e: sqlx::Error) -> SourceError {
        source_error(context, &self.table, e)
    }
}

impl Source for PgCdcSource {
    async fn fetch(&mut self, limit: usize, now: OffsetDateTime) -> Result<Fetched, SourceError> {
        if let Some(e) = self.cs.failure.take() {
            return Err(e);
        }
        // A fetch without settle: the previous batch goes back untouched.
        self.cs.ledger.release_in_flight();
        self.save_offset().await;
        if !self.ensure_streaming().await? {
            return Ok(Fetched::default());
        }
        change_stream::pump(&mut Wal(self))?;
        if self.cs.catch_up.is_some() {
            let timeout = self.config.connect_timeout;
            change_stream::catch_up(&mut Wal(self), limit, timeout).await?;
        }
        if self.cs.ledger.unsettled() == 0 {
            self.offset.idle(self.cs.ledger.confirmed());
            self.save_offset().await;
        }
        self.release_replicated().await?;
        self.number_events().await?;
        self.resolve_dead(now).await?;
        self.finish_recovery().await;
        // One slot, one reader: the claim cannot pass to another relay mid-batch.
        let cs = &mut self.cs;
        Ok(cs.ledger.fetched(limit, now, cs.ordering, None, &cs.stats))
    }

    async fn settle(
        &mut self,
        settlements: &[Settlement],
        now: OffsetDateTime,
    ) -> Result<(), SourceError> {
        // Dead letters first: the only part that can fail, and then nothing is recorded.
        let dead = self.cs.dead_letters(settlements);
        if !dead.is_empty() {
            let xids = dead.iter().map(|(e, _, _)| i64::from(e.meta.xid)).collect();
            let written = match self.wait_visible(xids).await {
                Ok(()) => self.write_dead(&dead, now).await,
                Err(e) => Err(e),
            };
            if let Err(e) = written {
                self.cs.ledger.release_in_flight();
                return Err(e);
            }
        }
        self.unmarked.extend(self.cs.apply(settlements));
        self.unmark_delivered().await;
        self.offset.reached(self.cs.ledger.confirmed());
        self.save_offset().await;
        self.finish_recovery().await;
        self.cs.publish_stats();
        Ok(())
    }

    async fn wait_for_events(&mut self, max: Duration) {
        change_stream::wait_for_events(&mut Wal(self), max).await;
    }
}

impl Drop for PgCdcSource {
    fn drop(&mut self) {
        self.cs.set_streaming(false);
        let closed = self.closed_tx.take();
        if let Some(stream) = self.stream.take()
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            let confirmed = self.cs.ledger.confirmed();
            // Unsaved, the heads up to `confirmed` hold the slot back (`confirmable`).
            let fallback = self.confirmable();
            self.offset.reached(confirmed);
            let (pool, slot) = (self.pool.clone(), self.config.slot.as_str().to_owned());
            let unsaved = self.offset.pending();
            let heads = match &unsaved {
                Some((_, _, _, lsn)) if self.numbering => self.positions.to_save(*lsn),
                _ => Vec::new(),
            };
            runtime.spawn(async move {
                let mut close_at = confirmed;
                if let Some((queries, slot, owner, lsn)) = unsaved {
                    match super::offset::save(&pool, &queries, &slot, owner, lsn, &heads).await {
                        Ok(super::offset::Saved::Written { .. }) => {}
                        Ok(super::offset::Saved::Fenced) => {
                            tracing::warn!("another relay took the CDC slot over: the position was not saved at shutdown");
                            close_at = fallback;
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "could not save the CDC position at shutdown");
                            close_at = fallback;
                        }
                    }
                }
                stream.close(close_at, pool, slot).await;
                drop(closed);
            });
        }
    }
}
