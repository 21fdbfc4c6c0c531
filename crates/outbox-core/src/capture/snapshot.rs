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
//! Each backend gives its statements as a [`SnapshotTx`]; [`Chunked`] runs them as one
//! chunk's transaction, retries a chunk that lost a deadlock, and words the errors, for all of
//! them (PostgreSQL, SQLite, MySQL/MariaDB). The start's shared steps are [`starting`],
//! [`single_key`], [`resume_or_begin`] and [`entry_names`].
//!
//! The command ([`crate::capture::Capture::snapshot`]) drives the chunks, throttles them, and
//! shows progress.

use serde::Serialize;

use super::{CaptureConfig, CaptureEntry, CaptureError};
use crate::Identifier;
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

/// The table's single primary-key column among `columns` (the key's columns in order), or
/// why there is none to follow.
pub fn single_key(
    entry: CaptureEntry<'_>,
    table: &str,
    columns: &[String],
) -> Result<Identifier, CaptureError> {
    match columns {
        [] => Err(no_primary_key(entry, table)),
        [one] => Identifier::new(one.as_str()).map_err(|e| {
            CaptureError::invalid(
                entry.key("table"),
                format!("the primary-key column of {table} cannot be followed: {e}"),
            )
        }),
        more => Err(composite_key(entry, table, more)),
    }
}

/// The identifiers of the entry that a snapshot's statements name: `aggregate_id`,
/// `key_column`, and `event_type_column` and `payload_column` where the entry has them (the
/// backend adds its tables).
pub fn entry_names<'a>(
    config: &'a CaptureConfig,
    key: &'a Identifier,
) -> Vec<(&'static str, &'a Identifier)> {
    let mut named: Vec<(&str, &Identifier)> =
        vec![("aggregate_id", &config.aggregate_id), ("key_column", key)];
    if let Some(c) = &config.event_type_column {
        named.push(("event_type_column", c));
    }
    if let Some(c) = config.payload.column() {
        named.push(("payload_column", c));
    }
    named
}

/// A capture's row of `<outbox>_capture_snapshots` as a run finds it at its start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recorded<K> {
    /// `table_name`: the table it followed.
    pub table: String,
    /// `key_column`: the key it followed.
    pub key: String,
    /// `last_key`: the last snapshotted row's key; `None` before the first chunk.
    pub last_key: Option<K>,
    /// `rows`: rows snapshotted so far.
    pub rows: i64,
    /// Whether `finished_at` is set.
    pub finished: bool,
}

impl<K> From<(String, String, Option<K>, i64, bool)> for Recorded<K> {
    /// From a row `(table_name, key_column, last_key, rows, finished)`.
    fn from(
        (table, key, last_key, rows, finished): (String, String, Option<K>, i64, bool),
    ) -> Self {
        Self {
            table,
            key,
            last_key,
            rows,
            finished,
        }
    }
}

/// Where a run starts: the recorded snapshot's last key and rows when it is unfinished and
/// follows the same table and key column (the run resumes it); `None` when a new snapshot
/// starts (nothing recorded, the last one finished, or the entry now follows another table
/// or key): the caller then resets the row.
pub fn resumes<K>(
    recorded: Option<Recorded<K>>,
    table: &str,
    key: &str,
) -> Option<(Option<K>, u64)> {
    recorded
        .filter(|r| !r.finished && r.table == table && r.key == key)
        .map(|r| (r.last_key, r.rows.max(0) as u64))
}

/// Where a run starts ([`resume_or_begin`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resume<K> {
    /// True when the run continues an unfinished snapshot.
    pub resumed: bool,
    /// The key it continues after (`None`: from the start).
    pub last_key: Option<K>,
    /// Rows snapshotted before this run.
    pub rows_done: u64,
}

impl<K> Resume<K> {
    /// The [`SnapshotStart`] of capture `name` on `table` by `key`, `rows_left` rows to go.
    pub fn start(
        &self,
        name: &Identifier,
        table: &str,
        key: &Identifier,
        rows_left: i64,
    ) -> SnapshotStart {
        SnapshotStart {
            name: name.to_string(),
            table: table.to_owned(),
            key: key.to_string(),
            resumed: self.resumed,
            rows_done: self.rows_done,
            rows_left: rows_left.max(0) as u64,
        }
    }
}

/// Resumes the `recorded` snapshot ([`resumes`]), or starts a new one by running `begin`
/// (which resets the capture's progress row).
pub async fn resume_or_begin<K, E>(
    recorded: Option<Recorded<K>>,
    table: &str,
    key: &Identifier,
    begin: impl AsyncFnOnce() -> Result<(), E>,
) -> Result<Resume<K>, E> {
    Ok(match resumes(recorded, table, key.as_str()) {
        Some((last_key, rows_done)) => Resume {
            resumed: true,
            last_key,
            rows_done,
        },
        None => {
            begin().await?;
            Resume {
                resumed: false,
                last_key: None,
                rows_done: 0,
            }
        }
    })
}

/// Checks `entry` on its own before a snapshot starts; returns the context of the start's
/// errors (`starting the snapshot of capture `name``).
pub fn starting(entry: CaptureEntry<'_>) -> Result<String, CaptureError> {
    entry.config.validate(entry.index).map_err(super::keyed)?;
    Ok(format!(
        "starting the snapshot of capture `{}`",
        entry.config.name()
    ))
}

/// One database's statements of a chunk's transaction (see the module docs), which
/// [`Chunked`] runs in order: [`begin`](Self::begin), [`lock`](Self::lock) the progress row,
/// [`write`](Self::write) the chunk's events, [`advance`](Self::advance) the progress,
/// [`commit`](Self::commit). A transaction dropped without `commit` rolls back.
pub trait SnapshotTx: Send + Sync {
    /// An open transaction.
    type Tx: Send;
    /// A primary-key value as the progress row keeps it.
    type Key: Send + Sync;
    /// The database's error.
    type Error: std::error::Error + Send + Sync + 'static;

    /// Begins a chunk's transaction.
    fn begin(&self) -> impl Future<Output = Result<Self::Tx, Self::Error>> + Send;
    /// Locks the capture's unfinished progress row until the transaction ends and reads its
    /// last key; `None` when there is none (the snapshot finished in another run).
    fn lock(
        &self,
        tx: &mut Self::Tx,
    ) -> impl Future<Output = Result<Option<Option<Self::Key>>, Self::Error>> + Send;
    /// Reads up to `limit` rows after `last` (from the start when `None`) in key order,
    /// share-locked, and inserts their snapshot events; returns how many and the last key
    /// (`None` when there was no row).
    fn write(
        &self,
        tx: &mut Self::Tx,
        last: Option<&Self::Key>,
        limit: u32,
    ) -> impl Future<Output = Result<(u64, Option<Self::Key>), Self::Error>> + Send;
    /// Records the chunk: the new last key (`None`: unchanged), `rows` more, and whether the
    /// snapshot finished.
    fn advance(
        &self,
        tx: &mut Self::Tx,
        last: Option<&Self::Key>,
        rows: u64,
        finished: bool,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send;
    /// Commits.
    fn commit(&self, tx: Self::Tx) -> impl Future<Output = Result<(), Self::Error>> + Send;
    /// A deadlock, lock timeout or serialization failure: the chunk was rolled back and can
    /// run again.
    fn retryable(e: &Self::Error) -> bool;
    /// A NULL aggregate id, event type or payload refused by the outbox table.
    fn null_in_row(e: &Self::Error) -> bool;
}

/// How often a chunk that lost a deadlock (or a lock wait, or a serialization failure) is
/// tried again.
pub const RETRIES: u32 = 10;

/// A running snapshot driven chunk by chunk through one database's [`SnapshotTx`]: the
/// [`SnapshotRun`] of every backend.
pub struct Chunked<T> {
    start: SnapshotStart,
    tx: T,
}

impl<T: SnapshotTx> Chunked<T> {
    /// The run that started as `start`, with the statements of `tx`.
    pub fn new(start: SnapshotStart, tx: T) -> Self {
        Self { start, tx }
    }

    /// One chunk's transaction; `Err` as the database gave it.
    async fn try_chunk(&self, limit: u32) -> Result<SnapshotChunk, T::Error> {
        let mut tx = self.tx.begin().await?;
        let Some(last) = self.tx.lock(&mut tx).await? else {
            return Ok(SnapshotChunk {
                rows: 0,
                finished: true,
            });
        };
        let (rows, new_last) = self.tx.write(&mut tx, last.as_ref(), limit).await?;
        let finished = rows < u64::from(limit);
        self.tx
            .advance(&mut tx, new_last.as_ref(), rows, finished)
            .await?;
        self.tx.commit(tx).await?;
        Ok(SnapshotChunk { rows, finished })
    }
}

impl<T: SnapshotTx> SnapshotRun for Chunked<T> {
    fn start(&self) -> &SnapshotStart {
        &self.start
    }

    fn chunk(&mut self, limit: u32) -> BoxFuture<'_, Result<SnapshotChunk, CaptureError>> {
        Box::pin(async move {
            let mut attempt = 0;
            loop {
                match self.try_chunk(limit).await {
                    Ok(done) => return Ok(done),
                    Err(e) if T::retryable(&e) && attempt < RETRIES => attempt += 1,
                    Err(e) => {
                        let context = if T::null_in_row(&e) {
                            null_in_row(&self.start.table)
                        } else {
                            format!(
                                "snapshot of {}: a chunk failed and wrote nothing (run the snapshot again: it resumes after the last chunk that committed)",
                                self.start.table
                            )
                        };
                        return Err(CaptureError::Database {
                            context,
                            source: Box::new(e),
                        });
                    }
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::{Recorded, chunk_rows, resumes};

    #[test]
    fn a_run_resumes_only_an_unfinished_snapshot_of_the_same_table_and_key() {
        let recorded = |table: &str, finished| Recorded {
            table: table.into(),
            key: "id".into(),
            last_key: Some(7),
            rows: 7,
            finished,
        };
        assert_eq!(
            resumes(Some(recorded("t", false)), "t", "id"),
            Some((Some(7), 7))
        );
        assert_eq!(resumes(Some(recorded("t", true)), "t", "id"), None);
        assert_eq!(resumes(Some(recorded("u", false)), "t", "id"), None);
        assert_eq!(resumes(Some(recorded("t", false)), "t", "k"), None);
        assert_eq!(resumes::<i64>(None, "t", "id"), None);
    }

    #[test]
    fn chunks_stay_short() {
        assert_eq!(chunk_rows(1), 1);
        assert_eq!(chunk_rows(5_000), 500);
        assert_eq!(chunk_rows(u32::MAX), 2_000);
    }
}
