//! The CDC relay's acknowledged position, saved durably in `<table>_cdc_offsets`.
//!
//! A slot keeps its confirmed position in memory and writes it to disk only at checkpoints;
//! after a database crash it comes back older, and the stream replays everything acknowledged
//! since. The source saves the confirmed position it reached through *settled* events here
//! (at most every [`SAVE_EVERY`], and once more on a clean stop) and, after a restart, drops
//! the replayed transactions that end at or before the saved position instead of publishing
//! them again. Saving is best effort: when it fails, the slot's own position still holds, so
//! the cost is duplicates (as before), never loss.

use std::sync::Arc;
use std::time::Duration;

use outbox_core::SourceError;
use sqlx::PgPool;
use tokio::time::Instant;

use super::queries::CdcQueries;
use crate::sql::stmt;

/// Longest time between two saves while events are settled: the bound on what a database
/// crash can make the relay publish twice, beyond the batches in flight.
pub(crate) const SAVE_EVERY: Duration = Duration::from_millis(100);

/// See the module docs.
#[derive(Debug)]
pub(crate) struct SavedOffset {
    queries: Arc<CdcQueries>,
    slot: String,
    /// Last position written.
    saved: u64,
    /// Position reached through settled events, to be written.
    due: u64,
    last_save: Option<Instant>,
    /// The table is missing (schema from before version 3): warned once, not tried again.
    unavailable: bool,
}

impl SavedOffset {
    pub(crate) fn new(queries: Arc<CdcQueries>, slot: &str) -> Self {
        Self {
            queries,
            slot: slot.to_owned(),
            saved: 0,
            due: 0,
            last_save: None,
            unavailable: false,
        }
    }

    /// Reads the saved position (0: none).
    pub(crate) async fn load(&mut self, pool: &PgPool) -> Result<u64, SourceError> {
        if self.unavailable {
            return Ok(0);
        }
        match crate::sql::query_scalar::<i64>(stmt(&self.queries.offset_read))
            .bind(&self.slot)
            .fetch_optional(pool)
            .await
        {
            Ok(lsn) => {
                let lsn = lsn.unwrap_or(0).max(0) as u64;
                self.saved = self.saved.max(lsn);
                self.due = self.due.max(lsn);
                Ok(lsn)
            }
            Err(e) if undefined_table(&e) => {
                self.missing();
                Ok(0)
            }
            Err(e) => Err(crate::error::source_error(
                "reading the saved CDC position",
                &self.slot,
                e,
            )),
        }
    }

    /// The confirmed position moved to `lsn` through settled events.
    pub(crate) fn reached(&mut self, lsn: u64) {
        self.due = self.due.max(lsn);
    }

    /// Writes the due position when it moved and `SAVE_EVERY` has passed (or `force`).
    pub(crate) async fn save(&mut self, pool: &PgPool, force: bool) {
        if self.unavailable || self.due <= self.saved {
            return;
        }
        if !force && self.last_save.is_some_and(|t| t.elapsed() < SAVE_EVERY) {
            return;
        }
        self.last_save = Some(Instant::now());
        let due = self.due;
        match save(pool, &self.queries, &self.slot, due).await {
            Ok(()) => self.saved = due,
            Err(e) if undefined_table(&e) => self.missing(),
            Err(e) => tracing::warn!(
                error = %e,
                "could not save the CDC position; a database crash now means more duplicates"
            ),
        }
    }

    /// What a clean stop must still write: `(queries, slot, lsn)`, if anything.
    pub(crate) fn pending(&self) -> Option<(Arc<CdcQueries>, String, u64)> {
        (!self.unavailable && self.due > self.saved)
            .then(|| (self.queries.clone(), self.slot.clone(), self.due))
    }

    fn missing(&mut self) {
        self.unavailable = true;
        tracing::warn!(
            "the outbox schema has no CDC position table (run `outbox migrate`); after a database crash the relay republishes what the slot had not checkpointed"
        );
    }
}

/// One save statement.
pub(crate) async fn save(
    pool: &PgPool,
    queries: &CdcQueries,
    slot: &str,
    lsn: u64,
) -> Result<(), sqlx::Error> {
    crate::sql::query(stmt(&queries.offset_save))
        .bind(slot)
        .bind(i64::try_from(lsn).unwrap_or(i64::MAX))
        .execute(pool)
        .await
        .map(drop)
}

fn undefined_table(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(db) if db.code().as_deref() == Some("42P01"))
}
