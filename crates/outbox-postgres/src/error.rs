//! Errors of the PostgreSQL crate, and the mapping of database errors to the core's kinds.

use outbox_core::table_error::{TableFault, table_error};
use outbox_core::{SourceError, SourceErrorKind};

pub use outbox_core::EnqueueError;

/// Maps a database error to what the relay should do: wait and retry, or stop.
pub(crate) fn source_error(context: &str, table: &str, e: sqlx::Error) -> SourceError {
    let fault = match &e {
        sqlx::Error::Database(db) => match db.code().as_deref() {
            Some("42P01") => Some(TableFault::Missing),
            Some("42501") => Some(TableFault::Denied),
            _ => None,
        },
        _ => None,
    };
    table_error(context, table, fault, classify(&e), e)
}

/// Unavailable: anything that may pass (connection lost, server restarting, timeouts,
/// serialization failures). Fatal: errors in the SQL's meaning (missing table or column,
/// permissions: SQLSTATE class 42) and configuration.
pub(crate) fn classify(e: &sqlx::Error) -> SourceErrorKind {
    outbox_sql::error::classify(e, outbox_sql::error::sqlstate_class_42_or_28)
}
