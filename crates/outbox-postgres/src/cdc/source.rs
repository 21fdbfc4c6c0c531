//! [`PgCdcSource`]: the outbox as a logical-replication stream.
//!
//! One source streams from the slot; the server refuses a second `START_REPLICATION` on an
//! active slot, and that refusal is the standby mechanism: other relays' sources find the
//! slot busy, return no events, and try again every [`STANDBY_RETRY`]. When the active relay
//! dies its connection closes, the server releases the slot, and a standby starts streaming at
//! its next try.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::Ordering as AtomicOrdering;
use std::time::Duration;

use futures::FutureExt;
use outbox_core::aggregate_seq::StreamPositions;
use outbox_core::source::{Fetched, Outcome, Settlement};
use outbox_core::spill::SpillSettings;
use outbox_core::stream_ledger::PUMP_BUDGET;
use outbox_core::{DeadLetterPolicy, Ordering, Source, SourceError};
use sqlx::types::Json;
use sqlx::{PgPool, Row};
use time::OffsetDateTime;
use tokio::sync::watch;
use tokio::time::Instant;
use uuid::Uuid;

use super::decode::{Decoder, Step};
use super::inspect::{CdcStats, PgCdcInspector};
use super::ledger::{Entry, Ledger, Origin, with_meta};
use super::offset::SavedOffset;
use super::queries::{CdcQueries, KEEP_SEQ, TRANSACTION_VISIBLE};
use super::recovery::{self, RecoveryStatus, Snapshot};
use super::slot;
use super::standby::{self, StandbyGate};
use super::stream::{Endpoint, OpenError, Stream, wire_error};
use crate::config::{OnSlotLoss, PostgresConfig};
use crate::error::source_error;
use crate::sql::stmt;

/// How often a standby tries to take the slot over.
pub const STANDBY_RETRY: Duration = Duration::from_secs(1);

/// Events kept in memory (received, not yet settled for good) before the source stops reading
/// the stream; the server then waits (TCP backpressure). An open transaction is always read to
/// its commit (its events exist only then): past `source.spill_after_*` it goes to a scratch
/// file, and after its commit it is loaded from there in batches up to this bound.
const MAX_BUFFERED: usize = 50_000;

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
    ordering: Ordering,
    hold: bool,
    stream: Option<Stream>,
    decoder: Decoder,
    /// When an open transaction goes to a scratch file (`source.spill_*`).
    spill: Arc<SpillSettings>,
    ledger: Ledger,
    /// Confirmed LSN last handed to the stream.
    reported: u64,
    /// Aggregates known to have dead letters, or dead letters put back in line and not
    /// delivered since (checked against the table before use).
    dead: HashSet<(String, String)>,
    /// Put-back rows delivered whose mark is not cleared in the table yet.
    unmarked: HashSet<Uuid>,
    /// Events this source streamed again (once each: see `resolve_put_back`).
    restreamed: HashSet<Uuid>,
    next_attempt: Instant,
    standing_by: bool,
    /// A stream failure seen in `wait_for_events`, returned by the next `fetch`.
    failure: Option<SourceError>,
    /// After (re)starting: the server's flushed WAL position at the start. Until the stream
    /// has passed it, `fetch` waits for it, so the first batch holds what was committed
    /// before the start.
    catch_up: Option<u64>,
    stats: Arc<CdcStats>,
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
            .field("confirmed", &self.ledger.confirmed())
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
            ordering,
            hold: dead_letter == DeadLetterPolicy::HoldAggregate && ordering != Ordering::None,
            stream: None,
            decoder: Decoder::new(
                config.schema.as_str(),
                config.table.as_str(),
                &config.message_prefix,
            ),
            spill: Arc::new(config.spill_settings()),
            ledger: Ledger::new(0),
            reported: 0,
            dead: HashSet::new(),
            unmarked: HashSet::new(),
            restreamed: HashSet::new(),
            next_attempt: Instant::now(),
            standing_by: false,
            failure: None,
            catch_up: None,
            stats: Arc::new(CdcStats::default()),
            closed_tx: Some(closed_tx),
            closed_rx,
        })
    }

    /// An inspector that reports this source's in-memory backlog along with the slot.
    pub fn inspector(&self) -> PgCdcInspector {
        PgCdcInspector::with_stats(self.pool.clone(), &self.config, self.stats.clone())
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

    /// Opens the session if this source does not hold the slot yet. `Ok(false)`: standing by.
    async fn ensure_streaming(&mut self) -> Result<bool, SourceError> {
        if self.stream.is_some() {
            return Ok(true);
        }
        if Instant::now() < self.next_attempt {
            return Ok(false);
        }
        self.next_attempt = Instant::now() + STANDBY_RETRY;
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
        self.catch_up = Some(flushed.max(0) as u64);
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
        let state = self.offset.load(&self.pool).await?;
        let saved = state.confirmed_lsn;
        // The stream resumes after `saved`, whose heads are in the table: read them again.
        self.positions.reset();
        self.numbering = self.offset.available();
        self.skip_through = saved;
        self.skipped = 0;
        self.ledger.reset(confirmed);
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
            took_over = self.standing_by,
            "streaming the outbox from the replication slot"
        );
        self.standing_by = false;
        self.stream = Some(stream);
        self.stats.streaming.store(true, AtomicOrdering::Relaxed);
        Ok(true)
    }

    /// The slot is gone (or invalidated): with `on_slot_loss = "recover"`, records the
    /// recovery and creates the slot again. Another relay doing the same at the same moment
    /// is fine: one creates the slot, the other then finds it.
    async fn recreate_slot(&mut self, invalidated: bool) -> Result<(), SourceError> {
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
    async fn start_recovery(
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
            .map(|(event, origin, xid)| (event, super::ledger::Meta { origin, xid }))
            .collect();
        self.ledger.commit(events, confirmed);
        let last_position = self
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
    async fn finish_recovery(&mut self) {
        let Some(r) = &self.recovery else {
            return;
        };
        if self.ledger.confirmed() < r.after_lsn
            || self
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

    fn note_standby(&mut self) {
        if !self.standing_by {
            tracing::info!(
                slot = self.config.slot.as_str(),
                retry_every = ?STANDBY_RETRY,
                "another relay streams from the replication slot; standing by"
            );
            self.standing_by = true;
        }
    }

    async fn read_confirmed(&self) -> Result<u64, SourceError> {
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
    async fn load_dead(&mut self) -> Result<(), SourceError> {
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
        self.dead = dead;
        Ok(())
    }

    /// Ends the session after a failure; the next `fetch` reconnects and the stream resends
    /// everything unconfirmed.
    fn lost(&mut self, error: SourceError) -> SourceError {
        self.stream = None;
        self.stats.streaming.store(false, AtomicOrdering::Relaxed);
        self.ledger.reset(self.ledger.confirmed());
        self.standby.clear();
        self.next_attempt = Instant::now();
        tracing::warn!(error = %outbox_core::relay::ErrorChain(&error), "replication stream lost; unconfirmed events will be streamed again");
        error
    }

    /// Interprets one replication event. Returns true when a transaction committed.
    fn apply(&mut self, event: pgwire_replication::ReplicationEvent) -> Result<bool, SourceError> {
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
        if let (Some(barrier), Some(reached)) = (self.catch_up, reached)
            && reached >= barrier
        {
            self.catch_up = None;
        }
        self.report_confirmed();
        Ok(committed)
    }

    /// Lets the held transactions the synchronous standbys now have into the ledger.
    async fn release_replicated(&mut self) -> Result<(), SourceError> {
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
    fn commit_step(&mut self, step: Step) -> (bool, Option<u64>) {
        match step {
            Step::Nothing => (false, None),
            Step::Committed {
                events, end_lsn, ..
            } if end_lsn <= self.skip_through => {
                // The broker acknowledged these before the database lost the slot's newer
                // position (a crash): confirm the transaction, publish nothing.
                self.skipped += events.len() as u64;
                self.ledger.commit(Vec::new(), end_lsn);
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
                self.ledger.commit(with_meta(events, xid), end_lsn);
                (true, Some(end_lsn))
            }
            Step::Spilled { events, end_lsn } if end_lsn <= self.skip_through => {
                self.skipped += events.len() as u64;
                self.ledger.commit(Vec::new(), end_lsn);
                (false, Some(end_lsn))
            }
            Step::Spilled { events, end_lsn } => {
                // Loaded in batches by `pump`; the stream waits until all of it is loaded.
                self.ledger.commit_spilled(events, end_lsn);
                (true, Some(end_lsn))
            }
            Step::KeepAlive { wal_end } => {
                // Nothing in flight on the stream, and nothing waiting for the standbys.
                if !self.decoder.in_transaction() && self.standby.is_empty() {
                    self.ledger.idle_confirm(wal_end);
                }
                (false, Some(wal_end))
            }
        }
    }

    /// How far the slot may be confirmed: the ledger's position, but not past a transaction
    /// whose `aggregate_seq` heads are not saved yet.
    fn confirmable(&self) -> u64 {
        let confirmed = self.ledger.confirmed();
        if self.numbering {
            self.positions.bound(confirmed, self.offset.saved())
        } else {
            confirmed
        }
    }

    /// Saves the acknowledged position (with the heads up to it), then confirms what that
    /// allows.
    async fn save_offset(&mut self) {
        let confirmed = self.ledger.confirmed();
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
    async fn number_events(&mut self) -> Result<(), SourceError> {
        if !self.numbering {
            return Ok(());
        }
        let unknown = self.positions.unknown(&self.ledger);
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
        self.positions.assign(&mut self.ledger);
        Ok(())
    }

    fn report_confirmed(&mut self) {
        let confirmed = self.confirmable();
        if confirmed > self.reported
            && let Some(stream) = &self.stream
        {
            stream.confirm(confirmed);
            self.reported = confirmed;
        }
    }

    /// Reads what the stream has ready without waiting.
    fn pump(&mut self) -> Result<(), SourceError> {
        let until = Instant::now() + PUMP_BUDGET;
        loop {
            if self.ledger.draining() {
                // A large transaction loads from its scratch file first (commit order).
                return self.ledger.refill(MAX_BUFFERED).map_err(|e| self.lost(e));
            }
            if Instant::now() >= until {
                return Ok(()); // the rest at the next fetch
            }
            if self.ledger.unsettled() + self.standby.held_events() >= MAX_BUFFERED
                && !self.decoder.in_transaction()
            {
                return Ok(());
            }
            let Some(stream) = self.stream.as_mut() else {
                return Ok(());
            };
            match stream.recv().now_or_never() {
                None => return Ok(()),
                Some(received) => {
                    self.receive(received)?;
                }
            }
        }
    }

    /// Settles queued events of aggregates that have dead letters: an event that is itself
    /// already dead (re-streamed after a restart) is dropped; with `hold-aggregate`, the
    /// others are parked as dead letters behind it. An aggregate whose dead letters were
    /// retried or purged is released.
    async fn resolve_dead(&mut self, now: OffsetDateTime) -> Result<(), SourceError> {
        let suspects = self.ledger.suspects(&self.dead);
        if suspects.is_empty() {
            return Ok(());
        }
        let xids: Vec<i64> = suspects
            .iter()
            .filter_map(|p| self.ledger.queued_mut(*p).map(|e| i64::from(e.meta.xid)))
            .collect();
        self.wait_visible(xids).await?;
        let mut groups: Vec<((String, String), Vec<i64>)> = Vec::new();
        for position in suspects {
            let Some(entry) = self.ledger.queued_mut(position) else {
                continue;
            };
            let key = entry.aggregate();
            match groups.iter_mut().find(|(k, _)| *k == key) {
                Some((_, positions)) => positions.push(position),
                None => groups.push((key, vec![position])),
            }
        }
        for (key, positions) in groups {
            let dead: Vec<(Uuid, i64)> =
                crate::sql::query_as(stmt(&self.queries.dead_of_aggregate))
                    .bind(&key.0)
                    .bind(&key.1)
                    .fetch_all(&self.pool)
                    .await
                    .map_err(|e| self.db_err("reading the dead letters of an aggregate", e))?;
            if dead.is_empty() {
                self.resolve_put_back(key, positions, true).await?;
                continue;
            }
            let dead_ids: Vec<Uuid> = dead.iter().map(|(id, _)| *id).collect();
            // A row ahead of every dead letter of its aggregate (a retried one, say) is not
            // held by them: it goes as if the aggregate had none, and the aggregate stays
            // checked.
            let lowest = dead.iter().map(|(_, seq)| *seq).min().unwrap_or(i64::MAX);
            let (ahead, positions): (Vec<i64>, Vec<i64>) = positions.into_iter().partition(|p| {
                self.ledger.queued_mut(*p).is_some_and(|e| {
                    !dead_ids.contains(&e.event.id) && e.meta.seq().is_some_and(|s| s < lowest)
                })
            });
            if !ahead.is_empty() {
                self.resolve_put_back(key.clone(), ahead, false).await?;
            }
            let mut park = Vec::new();
            for p in positions {
                let Some(entry) = self.ledger.queued_mut(p) else {
                    continue;
                };
                if dead_ids.contains(&entry.event.id) {
                    if let Some(entry) = self.ledger.remove_queued(p) {
                        tracing::debug!(event_id = %entry.event.id, "skipping an event that is already dead-lettered");
                        self.ledger.finish(&entry);
                    }
                } else if self.hold {
                    let attempts = entry.event.attempts as i32;
                    let reason = format!(
                        "held: event {} of aggregate {}/{} is dead-lettered (dead_letter = \"hold-aggregate\"); retry them together, in order",
                        dead_ids[0], key.0, key.1
                    );
                    park.push((entry.clone(), attempts, reason));
                } else {
                    entry.checked = true;
                }
            }
            if !park.is_empty() {
                let parked = self.park(&key, &park, now).await?;
                for (entry, _, _) in &park {
                    let position = entry.event.position.0;
                    if parked.contains(&entry.event.id) {
                        if let Some(entry) = self.ledger.remove_queued(position) {
                            self.ledger.finish(&entry);
                        }
                    } else if let Some(e) = self.ledger.queued_mut(position) {
                        // Its dead letter was retried meanwhile: checked again next time.
                        e.checked = false;
                    }
                }
                tracing::warn!(
                    aggregate_type = %key.0,
                    held = parked.len(),
                    "events parked as dead letters behind a dead letter of their aggregate"
                );
            }
        }
        self.report_confirmed();
        Ok(())
    }

    /// The queued events at `positions` of an aggregate with no dead letter left (they were
    /// retried or purged). A retried dead letter is re-inserted and streams from where
    /// `dead retry` committed, keeping its seq (migration 0005); an event of the aggregate
    /// with a higher seq that streamed before it (the slot's unconfirmed tail, after a
    /// restart) must not overtake it, so it is streamed again, after it. An older copy of a
    /// put-back row is dropped: the put-back copy streams later.
    async fn resolve_put_back(
        &mut self,
        key: (String, String),
        positions: Vec<i64>,
        may_release: bool,
    ) -> Result<(), SourceError> {
        let put_back: Vec<(Uuid, i64)> = if self.hold {
            crate::sql::query_as(stmt(&self.queries.put_back_of_aggregate))
                .bind(&key.0)
                .bind(&key.1)
                .fetch_all(&self.pool)
                .await
                .map_err(|e| self.db_err("reading the retried events of an aggregate", e))?
        } else {
            Vec::new()
        };
        // Where the stream holds each put-back copy already (its ledger position); one
        // delivered but not yet unmarked counts as handed over.
        let held: HashMap<Uuid, i64> = self
            .ledger
            .entries()
            .filter(|e| e.meta.put_back())
            .map(|e| (e.event.id, e.event.position.0))
            .collect();
        let ahead = |id: &Uuid, at: i64| {
            self.unmarked.contains(id) || held.get(id).is_some_and(|p| *p < at)
        };
        let mut stale = Vec::new();
        let mut overtaking = Vec::new();
        for p in positions {
            let Some(e) = self.ledger.queued_mut(p) else {
                continue;
            };
            if !e.meta.put_back() && put_back.iter().any(|(id, _)| *id == e.event.id) {
                stale.push(p);
                continue;
            }
            let waits = e.meta.seq().is_some_and(|seq| {
                put_back
                    .iter()
                    .any(|(id, s)| *s < seq && *id != e.event.id && !ahead(id, p))
            });
            if waits && !self.restreamed.contains(&e.event.id) {
                overtaking.push(p);
            } else {
                e.checked = true;
            }
        }
        for p in stale {
            if let Some(entry) = self.ledger.remove_queued(p) {
                tracing::debug!(event_id = %entry.event.id, "skipping an older copy of a retried dead letter; the retried copy streams later");
                self.ledger.finish(&entry);
            }
        }
        if !overtaking.is_empty() {
            self.restream(&overtaking).await?;
        }
        // Checked again until every put-back row is handed over: events of the aggregate
        // still to come from the tail must wait too.
        if may_release
            && put_back
                .iter()
                .all(|(id, _)| self.unmarked.contains(id) || held.contains_key(id))
        {
            self.dead.remove(&key);
        }
        Ok(())
    }

    /// Streams the queued events at `positions` again, after everything committed so far,
    /// by re-inserting their rows unchanged (`queries/outbox_cdc_restream.sql`), and settles
    /// them here. An event whose row is gone is published as it is.
    async fn restream(&mut self, positions: &[i64]) -> Result<(), SourceError> {
        let ids: Vec<Uuid> = positions
            .iter()
            .filter_map(|p| self.ledger.queued_mut(*p).map(|e| e.event.id))
            .collect();
        let err = |e| source_error("streaming events again", &self.table, e);
        let mut tx = self.pool.begin().await.map_err(err)?;
        crate::sql::query(KEEP_SEQ)
            .execute(&mut *tx)
            .await
            .map_err(err)?;
        let again: Vec<Uuid> = crate::sql::query_scalar(stmt(&self.queries.restream))
            .bind(&ids)
            .fetch_all(&mut *tx)
            .await
            .map_err(err)?;
        tx.commit().await.map_err(err)?;
        for p in positions {
            let Some(entry) = self.ledger.queued_mut(*p) else {
                continue;
            };
            let id = entry.event.id;
            self.restreamed.insert(id);
            if !again.contains(&id) {
                entry.checked = true;
                continue;
            }
            if let Some(entry) = self.ledger.remove_queued(*p) {
                tracing::info!(event_id = %id, "streaming an event again after the retried dead letters of its aggregate");
                self.ledger.finish(&entry);
            }
        }
        Ok(())
    }

    /// Clears the put-back mark of delivered rows (see `resolve_put_back`); on failure they
    /// stay in `unmarked` and the next settle tries again.
    async fn unmark_delivered(&mut self) {
        if self.unmarked.is_empty() {
            return;
        }
        let ids: Vec<Uuid> = self.unmarked.iter().copied().collect();
        match crate::sql::query(stmt(&self.queries.put_back_delivered))
            .bind(&ids)
            .execute(&self.pool)
            .await
        {
            Ok(_) => self.unmarked.clear(),
            Err(e) => {
                tracing::warn!(error = %self.db_err("unmarking delivered retried events", e), "will try again at the next batch");
            }
        }
    }

    /// Parks `items` of aggregate `key` as dead letters behind its dead letter, under the
    /// aggregate's lock (shared with `dead retry`) and only while a dead letter with a lower
    /// seq still holds them; returns the ids parked. Table-less events are parked as rows.
    async fn park(
        &self,
        key: &(String, String),
        items: &[(Entry, i32, String)],
        now: OffsetDateTime,
    ) -> Result<HashSet<Uuid>, SourceError> {
        let (rows, messages): (Vec<_>, Vec<_>) = items
            .iter()
            .cloned()
            .partition(|(e, _, _)| matches!(e.meta.origin, Origin::Row { .. }));
        let mut parked: HashSet<Uuid> = messages.iter().map(|(e, _, _)| e.event.id).collect();
        if !messages.is_empty() {
            self.write_dead(&messages, now).await?;
        }
        if rows.is_empty() {
            return Ok(parked);
        }
        let err = |e| self.db_err("parking events behind a dead letter", e);
        let mut tx = self.pool.begin().await.map_err(err)?;
        crate::sql::query(stmt(&self.queries.aggregate_lock))
            .bind(vec![key.0.clone()])
            .bind(vec![key.1.clone()])
            .execute(&mut *tx)
            .await
            .map_err(err)?;
        let ids: Vec<Uuid> = rows.iter().map(|(e, _, _)| e.event.id).collect();
        let attempts: Vec<i32> = rows.iter().map(|(_, a, _)| *a).collect();
        let reasons: Vec<&str> = rows.iter().map(|(_, _, r)| r.as_str()).collect();
        let done: Vec<Uuid> = crate::sql::query_scalar(stmt(&self.queries.park))
            .bind(&ids)
            .bind(&attempts)
            .bind(&reasons)
            .bind(now)
            .fetch_all(&mut *tx)
            .await
            .map_err(err)?;
        tx.commit().await.map_err(err)?;
        parked.extend(done);
        Ok(parked)
    }

    /// Waits until the transactions `xids` are visible to new snapshots. The stream can
    /// deliver a commit a moment before the committing session has published it; deciding
    /// about dead letters on a snapshot without it could misjudge (or miss) its rows. Nothing
    /// announces that moment, so this polls; it almost never has to wait.
    async fn wait_visible(&self, mut xids: Vec<i64>) -> Result<(), SourceError> {
        xids.sort_unstable();
        xids.dedup();
        if xids.is_empty() {
            return Ok(());
        }
        let deadline = Instant::now() + VISIBILITY_TIMEOUT;
        loop {
            let visible: bool = crate::sql::query_scalar(TRANSACTION_VISIBLE)
                .bind(&xids)
                .fetch_one(&self.pool)
                .await
                .map_err(|e| self.db_err("checking transaction visibility", e))?;
            if visible {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(SourceError::unavailable(format!(
                    "streamed transactions {xids:?} are still not visible after {VISIBILITY_TIMEOUT:?}"
                )));
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    /// Records dead letters in one transaction: rows are updated, table-less events inserted.
    async fn write_dead(
        &self,
        items: &[(Entry, i32, String)],
        now: OffsetDateTime,
    ) -> Result<(), SourceError> {
        let (rows, messages): (Vec<_>, Vec<_>) = items
            .iter()
            .partition(|(e, _, _)| matches!(e.meta.origin, Origin::Row { .. }));
        let mut tx = self
            .pool
            .begin()
            .await
            .map_err(|e| self.db_err("dead-lettering events", e))?;
        if !rows.is_empty() {
            let ids: Vec<Uuid> = rows.iter().map(|(e, _, _)| e.event.id).collect();
            let attempts: Vec<i32> = rows.iter().map(|(_, a, _)| *a).collect();
            let reasons: Vec<&str> = rows.iter().map(|(_, _, r)| r.as_str()).collect();
            crate::sql::query(stmt(&self.queries.dead_letter))
                .bind(&ids)
                .bind(&attempts)
                .bind(&reasons)
                .bind(now)
                .execute(&mut *tx)
                .await
                .map_err(|e| self.db_err("dead-lettering events", e))?;
        }
        if !messages.is_empty() {
            let ev = |i: usize| &messages[i].0.event;
            let n = messages.len();
            let ids: Vec<Uuid> = (0..n).map(|i| ev(i).id).collect();
            let types: Vec<&str> = (0..n).map(|i| ev(i).aggregate_type.as_str()).collect();
            let agg_ids: Vec<&str> = (0..n).map(|i| ev(i).aggregate_id.as_str()).collect();
            let event_types: Vec<&str> = (0..n).map(|i| ev(i).event_type.as_str()).collect();
            let payloads: Vec<&[u8]> = (0..n).map(|i| &ev(i).payload[..]).collect();
            let headers: Vec<Json<serde_json::Map<String, serde_json::Value>>> = (0..n)
                .map(|i| {
                    Json(
                        ev(i)
                            .headers
                            .iter()
                            // The relay's own number is not the producer's: not stored.
                            .filter(|(k, _)| k != outbox_core::message::header::AGGREGATE_SEQ)
                            .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone())))
                            .collect(),
                    )
                })
                .collect();
            let created: Vec<OffsetDateTime> = (0..n).map(|i| ev(i).created_at).collect();
            let attempts: Vec<i32> = messages.iter().map(|(_, a, _)| *a).collect();
            let reasons: Vec<&str> = messages.iter().map(|(_, _, r)| r.as_str()).collect();
            crate::sql::query(stmt(&self.queries.dead_insert))
                .bind(&ids)
                .bind(&types)
                .bind(&agg_ids)
                .bind(&event_types)
                .bind(&payloads)
                .bind(&headers)
                .bind(&created)
                .bind(&attempts)
                .bind(&reasons)
                .bind(now)
                .execute(&mut *tx)
                .await
                .map_err(|e| self.db_err("dead-lettering table-less events", e))?;
        }
        tx.commit()
            .await
            .map_err(|e| self.db_err("committing dead letters", e))
    }

    /// Right after the start: reads the stream until it passed the WAL position of the start
    /// (everything committed before is then in memory), a batch is full, or
    /// `source.connect_timeout` passed.
    async fn wait_for_catch_up(&mut self, limit: usize) -> Result<(), SourceError> {
        let deadline = Instant::now() + self.config.connect_timeout;
        while self.catch_up.is_some()
            && self.ledger.unsettled() < MAX_BUFFERED
            && !self.ledger.draining()
            && self
                .ledger
                .selectable(limit, OffsetDateTime::now_utc(), self.ordering)
                .len()
                < limit
        {
            let Some(stream) = self.stream.as_mut() else {
                return Ok(());
            };
            let received = match tokio::time::timeout_at(deadline, stream.recv()).await {
                Err(_) => {
                    self.catch_up = None;
                    return Ok(());
                }
                Ok(r) => r,
            };
            self.receive(received)?;
        }
        Ok(())
    }

    /// Applies one `recv` result; a failure ends the session.
    fn receive(
        &mut self,
        received: Result<
            Option<pgwire_replication::ReplicationEvent>,
            pgwire_replication::PgWireError,
        >,
    ) -> Result<bool, SourceError> {
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

    fn publish_stats(&self) {
        self.stats.publish(&self.ledger);
    }
}

impl Source for PgCdcSource {
    async fn fetch(&mut self, limit: usize, now: OffsetDateTime) -> Result<Fetched, SourceError> {
        if let Some(e) = self.failure.take() {
            return Err(e);
        }
        // A fetch without settle: the previous batch goes back untouched.
        self.ledger.release_in_flight();
        self.save_offset().await;
        if !self.ensure_streaming().await? {
            return Ok(Fetched::default());
        }
        self.pump()?;
        if self.catch_up.is_some() {
            self.wait_for_catch_up(limit).await?;
        }
        if self.ledger.unsettled() == 0 {
            self.offset.idle(self.ledger.confirmed());
            self.save_offset().await;
        }
        self.release_replicated().await?;
        self.number_events().await?;
        self.resolve_dead(now).await?;
        self.finish_recovery().await;
        let events = self.ledger.take(limit, now, self.ordering);
        self.publish_stats();
        // One slot, one reader: the claim cannot pass to another relay mid-batch.
        Ok(Fetched {
            more: events.len() >= limit,
            events,
            valid_until: None,
        })
    }

    async fn settle(
        &mut self,
        settlements: &[Settlement],
        now: OffsetDateTime,
    ) -> Result<(), SourceError> {
        // Dead letters first: the only part that can fail, and then nothing is recorded.
        let dead: Vec<(Entry, i32, String)> = settlements
            .iter()
            .filter_map(|s| match &s.outcome {
                Outcome::DeadLetter { reason } => self.ledger.in_flight(s.position.0).map(|e| {
                    (
                        e.clone(),
                        i32::try_from(e.event.attempts + 1).unwrap_or(i32::MAX),
                        reason.clone(),
                    )
                }),
                _ => None,
            })
            .collect();
        if !dead.is_empty() {
            let xids = dead.iter().map(|(e, _, _)| i64::from(e.meta.xid)).collect();
            let written = match self.wait_visible(xids).await {
                Ok(()) => self.write_dead(&dead, now).await,
                Err(e) => Err(e),
            };
            if let Err(e) = written {
                self.ledger.release_in_flight();
                return Err(e);
            }
        }
        for s in settlements {
            let Some(mut entry) = self.ledger.take_in_flight(s.position.0) else {
                continue; // settled already, or from before a reconnect
            };
            match &s.outcome {
                Outcome::Delivered => {
                    if entry.meta.put_back() {
                        self.unmarked.insert(entry.event.id);
                    }
                    self.ledger.finish(&entry);
                }
                Outcome::DeadLetter { .. } => {
                    if self.hold {
                        let key = entry.aggregate();
                        self.ledger.uncheck(&key);
                        self.dead.insert(key);
                    }
                    self.ledger.finish(&entry);
                }
                Outcome::Retry { not_before, .. } => {
                    entry.event.attempts += 1;
                    entry.not_before = Some(*not_before);
                    self.ledger.requeue(entry);
                }
                Outcome::Released => self.ledger.requeue(entry),
            }
        }
        self.ledger.release_in_flight();
        self.unmark_delivered().await;
        self.offset.reached(self.ledger.confirmed());
        self.save_offset().await;
        self.finish_recovery().await;
        self.publish_stats();
        Ok(())
    }

    async fn wait_for_events(&mut self, max: Duration) {
        let mut deadline = Instant::now() + max;
        if self.failure.is_some() {
            return;
        }
        if self.stream.is_none() {
            tokio::time::sleep_until(deadline.min(self.next_attempt)).await;
            return;
        }
        let now = OffsetDateTime::now_utc();
        if let Some(due) = self.ledger.next_due(now) {
            let wait = (due - now).try_into().unwrap_or(Duration::ZERO);
            deadline = deadline.min(Instant::now() + wait);
        }
        if !self.ledger.selectable(1, now, self.ordering).is_empty() {
            return;
        }
        loop {
            if !self.standby.is_empty() {
                // Held for the standbys: `fetch` asks them again soon.
                deadline = deadline.min(Instant::now() + standby::POLL_EVERY);
            }
            if self.ledger.draining() {
                let waited = self
                    .ledger
                    .wait_draining(MAX_BUFFERED, self.ordering, deadline);
                if let Err(e) = waited.await {
                    self.failure = Some(self.lost(e));
                }
                return;
            }
            let Some(stream) = self.stream.as_mut() else {
                return;
            };
            let received = match tokio::time::timeout_at(deadline, stream.recv()).await {
                Err(_) => {
                    if self.last_heard.elapsed() > self.silence_limit {
                        // A primary gone without closing the connection (a dead VM: no FIN,
                        // no RST) sends nothing, not even keepalives.
                        let silent = SourceError::unavailable(format!(
                            "the replication stream has been silent for {:?}, past wal_sender_timeout and a heartbeat: the server is unreachable; reconnecting",
                            self.last_heard.elapsed()
                        ));
                        self.failure = Some(self.lost(silent));
                    }
                    return;
                }
                Ok(r) => r,
            };
            match self.receive(received) {
                Ok(true) => {
                    let now = OffsetDateTime::now_utc();
                    if !self.ledger.selectable(1, now, self.ordering).is_empty() {
                        return;
                    }
                }
                Ok(false) => {}
                Err(e) => {
                    self.failure = Some(e);
                    return;
                }
            }
        }
    }
}

impl Drop for PgCdcSource {
    fn drop(&mut self) {
        self.stats.streaming.store(false, AtomicOrdering::Relaxed);
        let closed = self.closed_tx.take();
        if let Some(stream) = self.stream.take()
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            let confirmed = self.ledger.confirmed();
            // Unsaved, the heads up to `confirmed` hold the slot back (`confirmable`).
            let fallback = self.confirmable();
            self.offset.reached(confirmed);
            let (pool, slot) = (self.pool.clone(), self.config.slot.as_str().to_owned());
            let unsaved = self.offset.pending();
            let heads = match &unsaved {
                Some((_, _, lsn)) if self.numbering => self.positions.to_save(*lsn),
                _ => Vec::new(),
            };
            runtime.spawn(async move {
                let mut close_at = confirmed;
                if let Some((queries, slot, lsn)) = unsaved
                    && let Err(e) = super::offset::save(&pool, &queries, &slot, lsn, &heads).await
                {
                    tracing::warn!(error = %e, "could not save the CDC position at shutdown");
                    close_at = fallback;
                }
                stream.close(close_at, pool, slot).await;
                drop(closed);
            });
        }
    }
}
