//! Errors of the MySQL crate, and the mapping of database errors to the core's kinds.

use outbox_core::table_error::{TableFault, table_error};
use outbox_core::{SourceError, SourceErrorKind};
use sqlx::mysql::MySqlDatabaseError;

pub use outbox_core::EnqueueError;

/// `ER_NO_SUCH_TABLE`.
const NO_SUCH_TABLE: u16 = 1146;
/// `ER_TABLEACCESS_DENIED_ERROR`, `ER_DBACCESS_DENIED_ERROR`, `ER_ACCESS_DENIED_ERROR`.
const ACCESS_DENIED: [u16; 3] = [1142, 1044, 1045];

fn number(e: &sqlx::Error) -> Option<u16> {
    match e {
        sqlx::Error::Database(db) => db
            .try_downcast_ref::<MySqlDatabaseError>()
            .map(MySqlDatabaseError::number),
        _ => None,
    }
}

/// Maps a database error to what the relay should do: wait and retry, or stop.
pub(crate) fn source_error(context: &str, table: &str, e: sqlx::Error) -> SourceError {
    let fault = match number(&e) {
        Some(NO_SUCH_TABLE) => Some(TableFault::Missing),
        Some(n) if ACCESS_DENIED.contains(&n) => Some(TableFault::Denied),
        _ => None,
    };
    table_error(context, table, fault, classify(&e), e)
}

/// Unavailable: anything that may pass (connection lost, server restarting, lock wait
/// timeouts, deadlocks). Fatal: errors in the SQL's meaning (missing table or column, syntax,
/// permissions: SQLSTATE classes 42 and 28) and configuration.
pub(crate) fn classify(e: &sqlx::Error) -> SourceErrorKind {
    outbox_sql::error::classify(e, outbox_sql::error::sqlstate_class_42_or_28)
}
