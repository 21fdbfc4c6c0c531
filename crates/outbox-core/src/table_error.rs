//! The [`SourceError`] of a failed statement on an outbox table, worded once for every SQL
//! database: each database crate says what its error means (a missing table, a refused
//! permission, anything else; fatal or unavailable) and [`table_error`] writes the message.

use std::error::Error as StdError;

use crate::source::{SourceError, SourceErrorKind};

/// What a database error says about the outbox table, where it says something.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TableFault {
    /// The table does not exist: `outbox migrate` has not run.
    Missing,
    /// The database user may not use the table.
    Denied,
}

/// The error of `e`, met while `context` on outbox table `table`: of `kind`, with `e` as its
/// source, and a message that says what to do when `fault` names the cause.
pub fn table_error(
    context: &str,
    table: &str,
    fault: Option<TableFault>,
    kind: SourceErrorKind,
    e: impl StdError + Send + Sync + 'static,
) -> SourceError {
    let message = match fault {
        Some(TableFault::Missing) => {
            format!("{context}: outbox table {table} does not exist; run `outbox migrate` first")
        }
        Some(TableFault::Denied) => {
            format!("{context}: permission denied on outbox table {table}")
        }
        None => context.to_owned(),
    };
    SourceError::new(kind, message).with_source(e)
}
