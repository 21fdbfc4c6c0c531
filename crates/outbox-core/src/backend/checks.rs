//! Checks of `outbox doctor` that every backend keeping delivery in its rows runs the same
//! way: the schema version of the outbox table, and the backlog.

use std::fmt::Display;
use std::time::Duration;

use crate::admin::{DoctorCheck, backlog_checks};
use crate::source::Backlog;

/// What to do about a failed `schema` check ([`schema_check`]).
#[derive(Debug, Clone, Copy)]
pub struct SchemaFixes {
    /// When the table's schema is older than this build's, or absent.
    pub migrate: &'static str,
    /// When the version could not be read.
    pub unreadable: &'static str,
}

/// Pushes the `schema` check of outbox table `table` onto `out`: green when `found` is
/// `expected` or later; red when it is older or absent, or when the version could not be
/// read (`found` is then the error, as the message should show it). Returns whether it is
/// green: the checks that need the schema cannot run otherwise.
pub fn schema_check(
    out: &mut Vec<DoctorCheck>,
    table: &dyn Display,
    found: Result<Option<i32>, String>,
    expected: i32,
    fixes: SchemaFixes,
) -> bool {
    out.push(match found {
        Ok(Some(v)) if v >= expected => return push_ok(out, v),
        Ok(found) => DoctorCheck::red(
            "schema",
            format!(
                "outbox table {table} has schema version {}, this build expects {expected}",
                found.map_or("none".to_owned(), |v| v.to_string()),
            ),
            fixes.migrate,
        ),
        Err(e) => DoctorCheck::red(
            "schema",
            format!("cannot read the schema version: {e}"),
            fixes.unreadable,
        ),
    });
    false
}

fn push_ok(out: &mut Vec<DoctorCheck>, version: i32) -> bool {
    out.push(DoctorCheck::ok("schema", format!("version {version}")));
    true
}

/// The backlog checks ([`backlog_checks`], with `stuck_hint`) of `backlog`, or one red
/// `oldest_pending` check with `fix` when it could not be read.
pub fn backlog_or_red<E: std::error::Error + 'static>(
    backlog: Result<Backlog, E>,
    stuck_after: Duration,
    stuck_hint: &str,
    fix: &str,
) -> Vec<DoctorCheck> {
    match backlog {
        Ok(b) => backlog_checks(&b, stuck_after, stuck_hint),
        Err(e) => vec![DoctorCheck::red(
            "oldest_pending",
            format!("cannot read the backlog: {}", crate::relay::ErrorChain(&e)),
            fix,
        )],
    }
}
