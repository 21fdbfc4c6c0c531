//! Errors of the SQLite crate, and the mapping of database errors to the core's kinds.

use outbox_core::table_error::{TableFault, table_error};
use outbox_core::{SourceError, SourceErrorKind};

pub use outbox_core::EnqueueError;

// Primary SQLite result codes (https://www.sqlite.org/rescode.html). sqlx reports the
// extended code; its low byte is the primary one.
const SQLITE_ERROR: i32 = 1;
const SQLITE_PERM: i32 = 3;
const SQLITE_READONLY: i32 = 8;
const SQLITE_CORRUPT: i32 = 11;
const SQLITE_CANTOPEN: i32 = 14;
const SQLITE_AUTH: i32 = 23;
const SQLITE_NOTADB: i32 = 26;

fn primary_code(db: &dyn sqlx::error::DatabaseError) -> Option<i32> {
    db.code()
        .and_then(|c| c.parse::<i32>().ok())
        .map(|c| c & 0xff)
}

/// Maps a database error to what the relay should do: wait and retry, or stop.
pub(crate) fn source_error(context: &str, table: &str, e: sqlx::Error) -> SourceError {
    let missing = match &e {
        sqlx::Error::Database(db) => db.message().starts_with("no such table"),
        _ => false,
    };
    let fault = missing.then_some(TableFault::Missing);
    table_error(context, table, fault, classify(&e), e)
}

/// Unavailable: anything that may pass (the write lock held past `busy_timeout`, I/O errors,
/// a full disk, a closed pool). Fatal: errors in the SQL's meaning (no such table or column:
/// `SQLITE_ERROR`), a read-only or corrupt file, a file that is not a database, permissions.
pub(crate) fn classify(e: &sqlx::Error) -> SourceErrorKind {
    outbox_sql::error::classify(e, |db| {
        matches!(
            primary_code(db),
            Some(
                SQLITE_ERROR
                    | SQLITE_PERM
                    | SQLITE_READONLY
                    | SQLITE_CORRUPT
                    | SQLITE_CANTOPEN
                    | SQLITE_AUTH
                    | SQLITE_NOTADB,
            )
        )
    })
}
