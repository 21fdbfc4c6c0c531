//! What an install checks and names the same way on every database: the captured table's
//! kind ([`check_table`]) and the identifiers its trigger SQL is rendered with
//! ([`trigger_identifiers`]).

use super::{CaptureConfig, CaptureEntry, CaptureError};
use crate::Identifier;

/// What the catalog says a captured table is, as each database reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TableKind {
    /// No such table (or view).
    Missing,
    /// The outbox table itself.
    Outbox,
    /// An ordinary table: capturable.
    Table,
    /// Something else, with its article: `a view`, `a sequence`, ...
    Other(String),
}

/// Refuses a table that is not there, is the outbox table, or is not a table (its writes
/// cannot be captured); `database` names where it was looked for.
pub fn check_table(
    entry: CaptureEntry<'_>,
    table: &str,
    kind: TableKind,
    database: &str,
) -> Result<(), CaptureError> {
    let message = match kind {
        TableKind::Table => return Ok(()),
        TableKind::Missing => format!("table {table} does not exist in {database}"),
        TableKind::Outbox => {
            format!("{table} is the outbox table itself; capture a business table instead")
        }
        TableKind::Other(what) => {
            format!("{table} is {what}, not a table: only a table's writes can be captured")
        }
    };
    Err(CaptureError::invalid(entry.key("table"), message))
}

/// The identifiers a capture's trigger SQL names: `table` (its placeholders and the
/// captured table, e.g. `captured_table`), then `aggregate_id`, and the entry's
/// `event_type_column` and `payload_column` when it has them.
pub fn trigger_identifiers<'a>(
    config: &'a CaptureConfig,
    table: [(&'a str, &'a Identifier); 2],
) -> Vec<(&'a str, &'a Identifier)> {
    let mut named = table.to_vec();
    named.push(("aggregate_id", &config.aggregate_id));
    if let Some(c) = &config.event_type_column {
        named.push(("event_type_column", c));
    }
    if let Some(c) = config.payload.column() {
        named.push(("payload_column", c));
    }
    named
}
