//! `outbox capture snapshot` (docs/capture.md, "Snapshot"): the rows already in a captured
//! table become events (`capture_op: snapshot`), chunk by chunk in primary-key order, while
//! the application keeps writing.
//!
//! The contract each backend keeps ([`SnapshotRun::chunk`]):
//! - one chunk is **one transaction**: it reads the next rows after the recorded key with a
//!   share lock (a row being written waits, or is waited for), inserts their snapshot events
//!   into the outbox, and records the chunk's last key and row count in
//!   `<outbox>_capture_snapshots`, so a killed snapshot resumes after its last committed
//!   chunk and never writes a chunk twice;
//! - the event has the shape of the capture trigger's (same aggregate, event type and
//!   payload expressions), only its `capture_op` header says `snapshot`.
//!
//! The command ([`crate::capture::Capture::snapshot`]) drives the chunks, throttles them, and
//! shows progress.

use serde::Serialize;

use super::{CaptureEntry, CaptureError};
use crate::sink::BoxFuture;

/// The `capture_op` header of a snapshot event.
pub const SNAPSHOT_OP: &str = "snapshot";

/// Where a snapshot stands when it starts, as recorded in `<outbox>_capture_snapshots`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SnapshotStart {
    /// The capture's name.
    pub name: String,
    /// The captured table, as the `capture_table` header names it.
    pub table: String,
    /// The primary-key column the chunks follow.
    pub key: String,
    /// True when an unfinished snapshot of this capture was found and is continued.
    pub resumed: bool,
    /// Rows already snapshotted by the run(s) being resumed (0 for a new snapshot).
    pub rows_done: u64,
    /// Rows after the recorded key when the run started (for progress; the table may grow
    /// or shrink while it runs).
    pub rows_left: u64,
}

/// What one chunk did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SnapshotChunk {
    /// Rows read, and snapshot events written, by this chunk.
    pub rows: u64,
    /// True when the table has no row after this chunk's last key: the snapshot is recorded
    /// as finished.
    pub finished: bool,
}

/// A started (or resumed) snapshot of one capture.
pub trait SnapshotRun: Send {
    /// Where the snapshot stood when this run started.
    fn start(&self) -> &SnapshotStart;
    /// Snapshots up to `limit` rows after the recorded key, in one transaction (see the
    /// module docs). A chunk of another run of the same capture waits for this one and
    /// continues after it. Retries itself on a deadlock or serialization failure.
    fn chunk(&mut self, limit: u32) -> BoxFuture<'_, Result<SnapshotChunk, CaptureError>>;
}

/// Why a table cannot be snapshotted by primary key: the message the command prints.
pub fn no_primary_key(entry: CaptureEntry<'_>, table: &str) -> CaptureError {
    CaptureError::invalid(
        entry.key("table"),
        format!(
            "table {table} has no primary key: a snapshot reads the table in key order, one chunk per transaction, and resumes after the last key it recorded; add a primary key (or a single-column unique NOT NULL key made primary) and run it again"
        ),
    )
}

/// Why a table with a composite primary key is refused.
pub fn composite_key(entry: CaptureEntry<'_>, table: &str, columns: &[String]) -> CaptureError {
    CaptureError::invalid(
        entry.key("table"),
        format!(
            "table {table} has a composite primary key ({}): a snapshot follows a single-column primary key only",
            columns.join(", ")
        ),
    )
}

/// Why a capture that is configured but not installed (or installed differently) cannot be
/// snapshotted: live changes would not become events, so the snapshot could not be kept
/// current.
pub fn not_installed(entry: CaptureEntry<'_>, why: &str) -> CaptureError {
    CaptureError::invalid(
        entry.key("name"),
        format!(
            "capture `{}` {why}; run `outbox capture install` first (a snapshot is only kept current by the installed trigger)",
            entry.config.name()
        ),
    )
}

/// The error for a snapshot row whose aggregate id, event type or payload is NULL.
pub fn null_in_row(table: &str) -> String {
    format!(
        "snapshot of {table}: a row's aggregate_id column, event_type column or payload is NULL, so it cannot become an event; this chunk wrote nothing (fix the row, then run the snapshot again: it resumes)"
    )
}

/// The chunk size for `rate` rows per second: about ten chunks a second, between 1 and
/// 2,000 rows, so each transaction (and the share locks it holds) stays short.
pub fn chunk_rows(rate: u32) -> u32 {
    (rate / 10).clamp(1, 2_000)
}

#[cfg(test)]
mod tests {
    use super::chunk_rows;

    #[test]
    fn chunks_stay_short() {
        assert_eq!(chunk_rows(1), 1);
        assert_eq!(chunk_rows(5_000), 500);
        assert_eq!(chunk_rows(u32::MAX), 2_000);
    }
}
