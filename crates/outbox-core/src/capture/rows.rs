//! The steps SQLite and MySQL share over captures recorded as rows of `<outbox>_capture`
//! with one trigger per op: reading a record, checking a capture's trigger names are free,
//! removing captures, listing them. Each database answers the questions of [`RowCatalog`]
//! in its own SQL, over one connection or transaction.

use std::future::Future;

use super::{CaptureConfig, CaptureEntry, CaptureError, CaptureOp, CaptureRecord};
use super::{InstalledCapture, install_line, op_trigger_name, recorded};
use crate::Identifier;

/// The catalog of one outbox table's captures, as a database answers it.
pub trait RowCatalog: Send {
    /// The outbox table.
    fn outbox(&self) -> &str;
    /// Whether `<outbox>_capture` exists.
    fn has_records(&mut self) -> impl Future<Output = Result<bool, CaptureError>> + Send;
    /// The recorded table and record text of capture `name`, if it has a row.
    fn record(
        &mut self,
        name: &Identifier,
    ) -> impl Future<Output = Result<Option<(String, String)>, CaptureError>> + Send;
    /// Every recorded capture's name and record text, by name.
    fn records(
        &mut self,
    ) -> impl Future<Output = Result<Vec<(String, String)>, CaptureError>> + Send;
    /// The table the trigger named `trigger` is on, if there is one.
    fn trigger_table(
        &mut self,
        trigger: &str,
    ) -> impl Future<Output = Result<Option<String>, CaptureError>> + Send;
    /// Runs one statement of bundled SQL (identifiers double-quoted: MySQL backquotes
    /// them); `what` says what it does, for its error.
    fn execute(
        &mut self,
        sql: String,
        what: &str,
    ) -> impl Future<Output = Result<(), CaptureError>> + Send;
    /// Deletes the record of capture `name`.
    fn delete_record(
        &mut self,
        name: &Identifier,
    ) -> impl Future<Output = Result<(), CaptureError>> + Send;
}

/// The recorded table and record of capture `name`, if installed.
pub async fn recorded_row(
    catalog: &mut impl RowCatalog,
    name: &Identifier,
) -> Result<Option<(String, Option<CaptureRecord>)>, CaptureError> {
    if !catalog.has_records().await? {
        return Ok(None);
    }
    let row = catalog.record(name).await?;
    Ok(row.map(|(table, record)| (table, CaptureRecord::parse(Some(&record)))))
}

/// Refuses a trigger of `entry`'s names that no record claims (`ours` is `false`: the
/// capture is not installed).
pub async fn check_names_free(
    catalog: &mut impl RowCatalog,
    entry: CaptureEntry<'_>,
    ours: bool,
) -> Result<(), CaptureError> {
    let name = entry.config.name();
    for op in [CaptureOp::Insert, CaptureOp::Update] {
        let trigger = op_trigger_name(&name, op);
        if catalog.trigger_table(&trigger).await?.is_some() && !ours {
            return Err(recorded::name_clash(entry, &trigger, catalog.outbox()));
        }
    }
    Ok(())
}

/// Removes the captures named `names`, one after the other: each one's triggers, then its
/// record; a name not installed is reported. Returns what was done, one line each.
pub async fn remove(
    catalog: &mut impl RowCatalog,
    names: &[Identifier],
) -> Result<Vec<String>, CaptureError> {
    let mut lines = Vec::with_capacity(names.len());
    for name in names {
        let Some((table, _)) = recorded_row(catalog, name).await? else {
            lines.push(recorded::removed_line(name, None, catalog.outbox()));
            continue;
        };
        drop_triggers(catalog, name).await?;
        catalog.delete_record(name).await?;
        lines.push(recorded::removed_line(name, Some(&table), catalog.outbox()));
    }
    Ok(lines)
}

/// Drops both possible triggers of capture `name`.
pub async fn drop_triggers(
    catalog: &mut impl RowCatalog,
    name: &Identifier,
) -> Result<(), CaptureError> {
    for op in [CaptureOp::Insert, CaptureOp::Update] {
        let what = format!("dropping trigger {}", op_trigger_name(name, op));
        catalog
            .execute(recorded::drop_trigger(name, op), &what)
            .await?;
    }
    Ok(())
}

/// The captures recorded for the outbox table, by name, with the triggers present.
pub async fn list(catalog: &mut impl RowCatalog) -> Result<Vec<InstalledCapture>, CaptureError> {
    if !catalog.has_records().await? {
        return Ok(Vec::new());
    }
    let rows = catalog.records().await?;
    let mut out = Vec::with_capacity(rows.len());
    for (name, record) in rows {
        let mut found = Vec::new();
        for op in [CaptureOp::Insert, CaptureOp::Update] {
            let table = catalog
                .trigger_table(&format!("{name}{}", op.trigger_suffix()))
                .await?;
            found.extend(table.map(|t| (op, t)));
        }
        out.push(recorded::installed(catalog.outbox(), name, &record, &found));
    }
    Ok(out)
}

/// What `install` says for the capture of `config` on `table` with `triggers`; `before` is
/// the table it was recorded on, if it was installed already (and maybe moved).
pub fn installed_line(
    config: &CaptureConfig,
    before: Option<&str>,
    triggers: &[String],
    table: &str,
    outbox: &str,
) -> String {
    let mut line = install_line(
        config,
        before.is_some(),
        &triggers.join(", "),
        table,
        outbox,
    );
    line.push_str(&recorded::moved(before, table));
    line
}
