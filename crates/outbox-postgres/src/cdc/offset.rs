//! The CDC relay's acknowledged position, saved durably in `<table>_cdc_offsets`.
//!
//! A slot keeps its confirmed position in memory and writes it to disk only at checkpoints;
//! after a database crash it comes back older, and the stream replays everything acknowledged
//! since. The source saves the confirmed position it reached through *settled* events here
//! (at most every [`SAVE_EVERY`], and once more on a clean stop) and, after a restart, drops
//! the replayed transactions that end at or before the saved position instead of publishing
//! them again. Saving is best effort: when it fails, the slot's own position still holds, so
//! the cost is duplicates (as before), never loss.
//!
//! Each save also writes, in the same transaction, the `aggregate_seq` heads of the events
//! settled up to the saved position ([`StreamPositions::to_save`]), and the source confirms
//! the slot past a numbered transaction only once its heads are saved
//! ([`StreamPositions::bound`]): a stream resumed after the saved position starts from the
//! heads saved with it and gives its tail the numbers it had (`outbox_core::aggregate_seq`,
//! "Change streams"). A save that keeps failing therefore holds the slot back (WAL is kept),
//! never the numbering.
//!
//! Saves are fenced by the slot's owner (migration 0008): a relay that takes the slot over
//! [`claims`](SavedOffset::claim) the row with a new id before it reads the position, and a
//! save writes only while the row still carries the saver's id. Without it, the last save of a
//! relay killed mid-save (its COMMIT already sent) or frozen past `wal_sender_timeout` could
//! commit after the new owner read the position, and move the heads past it: the new owner
//! would number the stretch it streams again past the numbers it had.

use std::sync::Arc;
use std::time::Duration;

use outbox_core::SourceError;
use outbox_core::aggregate_seq::StreamPositions;
use sqlx::PgPool;
use tokio::time::Instant;
use uuid::Uuid;

use super::queries::CdcQueries;
use super::recovery::OffsetState;
use crate::sql::stmt;

/// Longest time between two saves while events are settled: the bound on what a database
/// crash can make the relay publish twice, beyond the batches in flight.
pub(crate) const SAVE_EVERY: Duration = Duration::from_millis(100);

/// See the module docs.
#[derive(Debug)]
pub(crate) struct SavedOffset {
    queries: Arc<CdcQueries>,
    slot: String,
    /// This relay's id in the row while it owns the slot (a new one per claim).
    owner: Uuid,
    /// Last position written.
    saved: u64,
    /// Position reached through settled events, to be written.
    due: u64,
    last_save: Option<Instant>,
    /// The pending snapshot's position after the last save (migration 0007).
    pending_lsn: Option<u64>,
    /// Events were settled since the last save that could promote the pending snapshot.
    unpromoted: bool,
    /// The table is missing (schema from before version 3): warned once, not tried again.
    unavailable: bool,
}

impl SavedOffset {
    pub(crate) fn new(queries: Arc<CdcQueries>, slot: &str) -> Self {
        Self {
            queries,
            slot: slot.to_owned(),
            owner: Uuid::nil(),
            saved: 0,
            due: 0,
            last_save: None,
            pending_lsn: None,
            unpromoted: false,
            unavailable: false,
        }
    }

    /// Makes this relay, which just took the slot, the only one that can save its position
    /// (see the module docs); call before [`load`](Self::load). Waits for a save of the
    /// previous owner still running.
    pub(crate) async fn claim(&mut self, pool: &PgPool) -> Result<(), SourceError> {
        if self.unavailable {
            return Ok(());
        }
        self.owner = Uuid::new_v4();
        let claimed = crate::sql::query(stmt(&self.queries.offset_claim))
            .bind(&self.slot)
            .bind(self.owner)
            .execute(pool)
            .await;
        match claimed {
            Ok(_) => Ok(()),
            Err(e) if undefined_table(&e) => {
                self.missing();
                Ok(())
            }
            Err(e) => Err(crate::error::source_error(
                "taking over the saved CDC position",
                &self.slot,
                e,
            )),
        }
    }

    /// Reads what is saved for the slot (the default: nothing).
    pub(crate) async fn load(&mut self, pool: &PgPool) -> Result<OffsetState, SourceError> {
        if self.unavailable {
            return Ok(OffsetState::default());
        }
        match super::recovery::read_state(pool, &self.queries, &self.slot).await {
            Ok(state) => {
                // The table is authoritative (read with the slot held): after a slot recovery
                // it is lower than what this process saved for the lost slot.
                let state = state.unwrap_or_default();
                self.saved = state.confirmed_lsn;
                self.due = state.confirmed_lsn;
                self.last_save = None;
                Ok(state)
            }
            Err(e) if undefined_table(&e) => {
                self.missing();
                Ok(OffsetState::default())
            }
            Err(e) => Err(crate::error::source_error(
                "reading the saved CDC position",
                &self.slot,
                e,
            )),
        }
    }

    /// The last position written (0: none yet).
    pub(crate) fn saved(&self) -> u64 {
        self.saved
    }

    /// Whether positions can be saved (the table exists).
    pub(crate) fn available(&self) -> bool {
        !self.unavailable
    }

    /// Forgets the positions in memory: they belong to a slot that is gone, and the new
    /// slot's positions may be lower.
    pub(crate) fn reset(&mut self) {
        self.saved = 0;
        self.due = 0;
        self.last_save = None;
        self.pending_lsn = None;
        self.unpromoted = false;
    }

    /// The confirmed position moved to `lsn` through settled events.
    pub(crate) fn reached(&mut self, lsn: u64) {
        if lsn > self.due {
            self.due = lsn;
            self.unpromoted = true;
        }
    }

    /// Nothing is outstanding and the stream is confirmed up to `lsn`: once that passes the
    /// pending snapshot of the last save, one more save promotes it, so that the
    /// acknowledged snapshot covers the last events settled before a quiet spell (what a
    /// slot recovery would otherwise publish again). Once per burst of events: a save
    /// writes WAL, which moves the stream again.
    pub(crate) fn idle(&mut self, lsn: u64) {
        if self.unpromoted && self.pending_lsn.is_some_and(|p| lsn >= p) && lsn > self.due {
            self.due = lsn;
            self.unpromoted = false;
        }
    }

    /// Writes the due position when it moved and `SAVE_EVERY` has passed (or `force`), with
    /// the heads of `positions` up to it.
    pub(crate) async fn save(
        &mut self,
        pool: &PgPool,
        force: bool,
        positions: Option<&mut StreamPositions>,
    ) {
        if self.unavailable || self.due <= self.saved {
            return;
        }
        if !force && self.last_save.is_some_and(|t| t.elapsed() < SAVE_EVERY) {
            return;
        }
        self.last_save = Some(Instant::now());
        let due = self.due;
        let heads = positions
            .as_deref()
            .map(|p| p.to_save(due))
            .unwrap_or_default();
        match save(pool, &self.queries, &self.slot, self.owner, due, &heads).await {
            Ok(Saved::Fenced) => tracing::warn!(
                slot = self.slot.as_str(),
                "another relay took the CDC slot over: this relay's position was not saved"
            ),
            Ok(Saved::Written { pending }) => {
                self.saved = due;
                self.pending_lsn = pending;
                if let Some(p) = positions {
                    p.saved(due);
                }
            }
            Err(e) if undefined_table(&e) => self.missing(),
            Err(e) => tracing::warn!(
                error = %e,
                "could not save the CDC position; a database crash now means more duplicates"
            ),
        }
    }

    /// What a clean stop must still write: `(queries, slot, owner, lsn)`, if anything.
    pub(crate) fn pending(&self) -> Option<(Arc<CdcQueries>, String, Uuid, u64)> {
        (!self.unavailable && self.due > self.saved).then(|| {
            (
                self.queries.clone(),
                self.slot.clone(),
                self.owner,
                self.due,
            )
        })
    }

    fn missing(&mut self) {
        self.unavailable = true;
        tracing::warn!(
            "the outbox schema has no CDC position table (run `outbox migrate`); after a database crash the relay republishes what the slot had not checkpointed"
        );
    }
}

/// What [`save`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Saved {
    /// Written; the pending snapshot's position after it (migration 0007).
    Written { pending: Option<u64> },
    /// Nothing written: another relay owns the slot's row now.
    Fenced,
}

/// One save by `owner`: the position and the `aggregate_seq` heads up to it, in one
/// transaction, or nothing when `owner` no longer owns the slot (the position's row is
/// updated first, so the heads are never written without it).
pub(crate) async fn save(
    pool: &PgPool,
    queries: &CdcQueries,
    slot: &str,
    owner: Uuid,
    lsn: u64,
    heads: &[(String, String, i64)],
) -> Result<Saved, sqlx::Error> {
    let mut tx = pool.begin().await?;
    let written: Option<Option<i64>> = crate::sql::query_scalar(stmt(&queries.offset_save))
        .bind(slot)
        .bind(i64::try_from(lsn).unwrap_or(i64::MAX))
        .bind(owner)
        .fetch_optional(&mut *tx)
        .await?;
    let Some(pending) = written else {
        tx.rollback().await?;
        return Ok(Saved::Fenced);
    };
    if !heads.is_empty() {
        let mut types = Vec::with_capacity(heads.len());
        let mut ids = Vec::with_capacity(heads.len());
        let mut last = Vec::with_capacity(heads.len());
        for (t, id, n) in heads {
            types.push(t.as_str());
            ids.push(id.as_str());
            last.push(*n);
        }
        crate::sql::query(stmt(&queries.positions_advance))
            .bind(&types)
            .bind(&ids)
            .bind(&last)
            .execute(&mut *tx)
            .await?;
    }
    tx.commit().await?;
    Ok(Saved::Written {
        pending: pending.map(|p| p.max(0) as u64),
    })
}

fn undefined_table(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(db) if db.code().as_deref() == Some("42P01"))
}
