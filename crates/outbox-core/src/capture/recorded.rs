//! SQLite and MySQL, which record each capture as a row of `<outbox>_capture`: what the
//! commands say and `list` shows, from the recorded rows and the triggers found.

use super::{CaptureEntry, CaptureError, CaptureOp, CaptureRecord, InstalledCapture};
use crate::Identifier;

/// `DROP TRIGGER IF EXISTS` of capture `name`'s trigger for `op`, its name quoted.
pub fn drop_trigger(name: &Identifier, op: CaptureOp) -> String {
    crate::migration::render_sql(
        &format!(
            "DROP TRIGGER IF EXISTS {{{{name:{}}}}}",
            op.trigger_suffix()
        ),
        None,
        name,
        &[],
    )
}

/// The error for a trigger of a capture's name that no record claims.
pub fn name_clash(entry: CaptureEntry<'_>, trigger: &str, outbox: &str) -> CaptureError {
    CaptureError::invalid(
        entry.key("name"),
        format!(
            "a trigger {trigger} exists and is not an outbox capture into {outbox}; set another `name`"
        ),
    )
}

/// What `remove` says for capture `name`: removed from `table`, or not installed.
pub fn removed_line(name: &Identifier, table: Option<&str>, outbox: &str) -> String {
    match table {
        Some(table) => {
            format!("capture {name}: removed triggers {name}_outbox_capture_* from {table}")
        }
        None => {
            format!("capture {name}: not installed (no row in {outbox}_capture); nothing to remove")
        }
    }
}

/// ` (its triggers on <before> were removed)` when a reinstall moved the capture from
/// table `before` to `table`.
pub fn moved(before: Option<&str>, table: &str) -> String {
    match before {
        Some(old) if old != table => format!(" (its triggers on {old} were removed)"),
        _ => String::new(),
    }
}

/// The capture recorded as `name` with `record`, whose triggers were `found` (per op,
/// the table it is on).
pub fn installed(
    outbox: &str,
    name: String,
    record: &str,
    found: &[(CaptureOp, String)],
) -> InstalledCapture {
    InstalledCapture {
        function: format!("{outbox}_capture row `{name}`"),
        trigger: (!found.is_empty()).then(|| {
            found
                .iter()
                .map(|(op, _)| format!("{name}{}", op.trigger_suffix()))
                .collect::<Vec<_>>()
                .join(", ")
        }),
        name,
        table: found.last().map(|(_, t)| t.clone()),
        on: found.iter().map(|(op, _)| *op).collect(),
        enabled: true,
        config: CaptureRecord::parse(Some(record)).map(|r| r.config),
    }
}

/// Checks that the capture of `entry` is installed as configured before a snapshot: its
/// `recorded` row of `<outbox>_capture` (table, record) names `table`, `outbox` and this
/// very entry. Otherwise live changes would not follow the snapshot.
pub fn check_recorded(
    entry: CaptureEntry<'_>,
    outbox: &str,
    table: &str,
    recorded: Option<(String, Option<CaptureRecord>)>,
) -> Result<(), CaptureError> {
    match recorded {
        None => Err(super::snapshot::not_installed(entry, "is not installed")),
        Some((t, Some(r))) if t == table && r.outbox == outbox && r.config == *entry.config => {
            Ok(())
        }
        Some(_) => Err(super::snapshot::not_installed(
            entry,
            "is installed differently from this [[capture]] entry",
        )),
    }
}

/// Checks that the capture's trigger for `op` is on `table`; `on` is the table the trigger
/// of that name is on, if there is one.
pub fn check_trigger(
    entry: CaptureEntry<'_>,
    op: CaptureOp,
    table: &str,
    on: Option<&str>,
) -> Result<(), CaptureError> {
    if on == Some(table) {
        return Ok(());
    }
    Err(super::snapshot::not_installed(
        entry,
        &format!("has no {op} trigger on {table}"),
    ))
}
