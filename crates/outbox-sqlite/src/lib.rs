//! SQLite support for `outbox`, the embedded default: the schema ([`migrate`]), the producer
//! ([`SqliteOutbox`], [`enqueue`]) and the polling source ([`SqlitePollSource`]).
//!
//! Same shape as `outbox-postgres`: SQL lives in `queries/*.sql` (one statement per file,
//! named `<table>_<verb>`, the same names as PostgreSQL's where the operation exists) and
//! `migrations/*.sql`; a configured table name reaches SQL only through a validated
//! [`outbox_core::Identifier`] (see `sql.rs`). The column names are PostgreSQL's, so a
//! producer in any language writes the same four columns:
//!
//! ```sql
//! INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
//! VALUES ('Order', 'o_91f2', 'order.placed', '{"order_id":"o_91f2","total_cents":1250}');
//! -- optional: id (UUID text; default a new UUIDv7), headers (JSON object text of strings)
//! ```
//!
//! What differs from PostgreSQL, and why:
//!
//! - **Timestamps** are INTEGER Unix microseconds (UTC), not a timestamp type: SQLite has
//!   none, and integers compare correctly whatever language wrote them.
//! - **Ids** are UUID text. The library assigns UUIDv7 (`Uuid::now_v7`); for plain-SQL
//!   producers the column default builds a UUIDv7 from `julianday('now')` and `randomblob`.
//! - **Commit order** needs no trigger: SQLite runs one write transaction at a time, so the
//!   rowid `seq` is assigned in commit order (see the migration).
//! - **One relay per file**, enforced by a lease instead of row locks (see
//!   [`SqlitePollSource`]): a second relay is a standby that takes over when the first stops.
//! - **Durability** follows `PRAGMA synchronous` ([`Synchronous`]; `normal` by default).

mod backend;
mod backfill;
mod capture;
mod catalog;
mod config;
mod dead;
mod error;
mod inspect;
mod lease;
mod migrate;
mod poll;
mod producer;
mod replay;
mod retention;
mod scratch;
mod sql;
mod timestamp;
mod verify;
mod writer;

use std::time::Duration;

pub use backend::SqliteBackend;
pub use backfill::SqliteBackfill;
pub use capture::SqliteCapture;
pub use config::{OnDelivered, SqliteConfig, Synchronous};
pub use dead::SqliteDeadLetters;
pub use error::EnqueueError;
pub use inspect::{RelayLease, SqliteInspector};
pub use migrate::{MigrateError, MigrationReport, SCHEMA_VERSION, migrate, schema_version};
pub use poll::SqlitePollSource;
pub use producer::{SqliteOutbox, enqueue, enqueue_batch};
pub use retention::{SqliteRetention, SqliteRetentionError};
pub use verify::SqliteLedger;

use sqlx::SqlitePool;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};

/// Connections in the pool made by [`connect`]: the relay source's reads, the inspector and a
/// producer or two. SQLite runs one writer at a time, so more would only queue. (Each
/// [`SqlitePollSource`] also opens one connection of its own, outside the pool, for its
/// write transactions.)
pub const POOL_SIZE: u32 = 4;

/// Opens (and creates if missing) the database file of `config`, with the settings the
/// outbox relies on, set on every connection:
///
/// - `journal_mode = WAL`: readers (the relay's claim, `status`) never block the writer and
///   the writer never blocks them; producers and the relay may be separate processes;
/// - `busy_timeout = config.busy_timeout`: a writer waits for SQLite's one write lock instead
///   of failing at once with "database is locked". SQLite's busy handler sleeps up to 100 ms
///   between tries, and the relay's own writes try every millisecond: an application's pool
///   that writes beside a busy relay, a backfill or a snapshot should wait longer than the
///   relay's 5 s default (the backfill test's producers wait 60 s; 5 s ran out once on a
///   loaded CI machine);
/// - `synchronous` per [`Synchronous`] (`NORMAL` by default: a killed process loses nothing,
///   a power loss may undo the last commits);
/// - `foreign_keys = ON`, so the application's own constraints hold in its transactions.
pub async fn connect(config: &SqliteConfig) -> Result<SqlitePool, sqlx::Error> {
    let synchronous = match config.synchronous {
        Synchronous::Normal => SqliteSynchronous::Normal,
        Synchronous::Full => SqliteSynchronous::Full,
    };
    let options = SqliteConnectOptions::new()
        .filename(&config.path)
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .busy_timeout(config.busy_timeout)
        .synchronous(synchronous)
        .foreign_keys(true);
    SqlitePoolOptions::new()
        .max_connections(POOL_SIZE)
        .min_connections(0)
        .acquire_timeout(config.busy_timeout.max(Duration::from_secs(5)))
        .idle_timeout(Some(Duration::from_secs(300)))
        .connect_with(options)
        .await
}
