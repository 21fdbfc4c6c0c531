//! `[[capture]]`: a business table as an event source (`outbox capture`, docs/capture.md).
//!
//! Each entry names a table whose inserts (and optionally updates) must each produce one
//! outbox event *in the same transaction*, without any change to the application. A backend
//! that supports it ([`Capture`]: PostgreSQL, SQLite, MySQL/MariaDB) installs a row trigger on the table that writes
//! the event into the outbox table; from there the relay publishes it like any other, with
//! every guarantee: a rolled-back write leaves no event, a committed one is never lost, and
//! per-aggregate order is the outbox's own (its ordering trigger serializes the writers of
//! one aggregate).
//!
//! ```toml
//! [[capture]]
//! table = "app.bookings"          # the business table (`schema.table`, or `table` in `public`)
//! aggregate_type = "Customer"     # fixed text
//! aggregate_id = "customer_id"    # a column, cast to text
//! event_type = "booking.created"  # fixed text, or event_type_column = "status"
//! payload = "row"                 # the new row as JSON (default), or a column
//! on = ["insert", "update"]       # default ["insert"]
//! # name = "bookings"             # default: the table's name; names the trigger and function
//! ```
//!
//! Names reach SQL only as validated [`Identifier`]s; the literal values (`aggregate_type`, a
//! fixed `event_type`) only through [`quote_literal`], as trigger arguments.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::identifier::{Identifier, QualifiedTable};
use crate::sink::BoxFuture;

mod dialect;
mod error;
mod install;
pub mod recorded;
pub mod rows;
pub mod snapshot;
mod trigger;

pub use dialect::{Dialect, LiteralError, quote_literal};
pub use error::CaptureError;
pub use install::{TableKind, check_table, trigger_identifiers};
pub use snapshot::{SnapshotChunk, SnapshotRun, SnapshotStart};
pub use trigger::{OpTrigger, op_trigger_name, row_object, splice, splice_literals};

/// One `[[capture]]` entry: which table, and how each of its rows becomes an event.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct CaptureConfig {
    /// Names the capture's trigger and function (`<name>_outbox_capture`), and selects it in
    /// `outbox capture install|remove --name`. Default: the table's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<Identifier>,
    /// The business table: `schema.table`, or `table` for one in the `public` schema.
    #[serde(with = "table_name")]
    pub table: QualifiedTable,
    /// The events' `aggregate_type`: fixed text.
    pub aggregate_type: String,
    /// The column whose value, cast to text, is the events' `aggregate_id`.
    pub aggregate_id: Identifier,
    /// The events' `event_type`, fixed. Exactly one of this and `event_type_column`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event_type: Option<String>,
    /// The column whose value, cast to text, is the event's `event_type`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event_type_column: Option<Identifier>,
    /// The payload: `"row"` (the new row as JSON) or a column.
    #[serde(default)]
    pub payload: CapturePayload,
    /// Which writes produce an event. Default `["insert"]`.
    #[serde(default = "default_on")]
    pub on: Vec<CaptureOp>,
}

fn default_on() -> Vec<CaptureOp> {
    vec![CaptureOp::Insert]
}

/// What a captured row's event carries as its payload bytes.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum CapturePayload {
    /// `"row"`: the whole new row as a JSON object (PostgreSQL `to_jsonb(NEW)`), its UTF-8
    /// text.
    #[default]
    Row,
    /// A column: `json`, `jsonb` or text columns give their text as UTF-8, `bytea` its
    /// bytes as they are.
    Column(Identifier),
}

impl CapturePayload {
    /// The column, unless the payload is the whole row.
    pub fn column(&self) -> Option<&Identifier> {
        match self {
            Self::Row => None,
            Self::Column(c) => Some(c),
        }
    }
}

impl fmt::Display for CapturePayload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Row => f.write_str("row"),
            Self::Column(c) => write!(f, "{c}"),
        }
    }
}

impl<'de> Deserialize<'de> for CapturePayload {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        if s == "row" {
            return Ok(Self::Row);
        }
        Identifier::new(s)
            .map(Self::Column)
            .map_err(|e| serde::de::Error::custom(format!("expected \"row\" or a column: {e}")))
    }
}

impl Serialize for CapturePayload {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// A write that produces an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CaptureOp {
    /// `INSERT` (also `COPY`, and the insert branch of `INSERT ... ON CONFLICT`).
    Insert,
    /// `UPDATE` (also the update branch of `INSERT ... ON CONFLICT DO UPDATE`).
    Update,
}

impl CaptureOp {
    /// `insert` or `update`: the `capture_op` header.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Insert => "insert",
            Self::Update => "update",
        }
    }
}

impl fmt::Display for CaptureOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl CaptureConfig {
    /// The capture's name: `name`, or the table's name.
    pub fn name(&self) -> Identifier {
        self.name
            .clone()
            .unwrap_or_else(|| self.table.table.clone())
    }

    /// The table with its schema filled in (`public` when the config gives none): the value
    /// of the `capture_table` header.
    pub fn qualified_table(&self) -> QualifiedTable {
        let schema = self
            .table
            .schema
            .clone()
            .unwrap_or_else(|| Identifier::new("public").expect("a valid identifier"));
        QualifiedTable::new(Some(schema), self.table.table.clone())
    }

    /// Checks what serde cannot, for the entry at `index` of `[[capture]]`; the message names
    /// the key (`capture[0].event_type: ...`).
    pub fn validate(&self, index: usize) -> Result<(), String> {
        let key = |field: &str| format!("capture[{index}].{field}");
        let text = |field: &str, value: &str| -> Result<(), String> {
            if value.trim().is_empty() {
                return Err(format!("{}: must not be empty", key(field)));
            }
            quote_literal(value)
                .map(drop)
                .map_err(|e| format!("{}: {e}", key(field)))
        };
        text("aggregate_type", &self.aggregate_type)?;
        match (&self.event_type, &self.event_type_column) {
            (Some(_), Some(_)) => {
                return Err(format!(
                    "{}: set either event_type or event_type_column, not both",
                    key("event_type")
                ));
            }
            (None, None) => {
                return Err(format!(
                    "{}: set event_type (a fixed text) or event_type_column (a column of {})",
                    key("event_type"),
                    self.table
                ));
            }
            (Some(t), None) => text("event_type", t)?,
            (None, Some(_)) => {}
        }
        if self.on.is_empty() {
            return Err(format!(
                "{}: must list at least one of \"insert\", \"update\"",
                key("on")
            ));
        }
        let mut seen = Vec::new();
        for op in &self.on {
            if seen.contains(op) {
                return Err(format!("{}: \"{op}\" is listed twice", key("on")));
            }
            seen.push(*op);
        }
        Ok(())
    }

    /// The operations in a fixed order (insert, update), whatever order the config lists.
    pub fn ops(&self) -> Vec<CaptureOp> {
        let mut ops = self.on.clone();
        ops.sort();
        ops.dedup();
        ops
    }
}

/// Validates every `[[capture]]` entry ([`CaptureConfig::validate`]) and that their names
/// (which name the triggers) are distinct.
pub fn validate_all(entries: &[CaptureConfig]) -> Result<(), String> {
    for (i, entry) in entries.iter().enumerate() {
        entry.validate(i)?;
        let name = entry.name();
        if let Some(first) = entries[..i].iter().position(|e| e.name() == name) {
            return Err(format!(
                "capture[{i}].name: `{name}` is already the name of capture[{first}] (names default to the table's name); set a distinct `name`"
            ));
        }
    }
    Ok(())
}

/// `serde(with)` for `table`: `schema.table` or `table`, each part a valid identifier.
mod table_name {
    use super::QualifiedTable;
    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<QualifiedTable, D::Error> {
        let s = String::deserialize(d)?;
        super::parse_table(&s).map_err(serde::de::Error::custom)
    }

    pub(super) fn serialize<S: Serializer>(t: &QualifiedTable, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(t)
    }
}

/// Parses `schema.table` or `table` (each part a plain identifier).
pub fn parse_table(s: &str) -> Result<QualifiedTable, String> {
    let (schema, table) = match s.split_once('.') {
        Some((schema, table)) => (Some(schema), table),
        None => (None, s),
    };
    let schema = schema
        .map(Identifier::new)
        .transpose()
        .map_err(|e| format!("`{s}`: schema {e}"))?;
    let table = Identifier::new(table).map_err(|e| format!("`{s}`: table {e}"))?;
    Ok(QualifiedTable::new(schema, table))
}

/// One `[[capture]]` entry with its position in the config, so that messages name the key
/// (`capture[2].aggregate_id`) even when only some entries are acted on.
#[derive(Debug, Clone, Copy)]
pub struct CaptureEntry<'a> {
    /// Position in `[[capture]]`.
    pub index: usize,
    /// The entry.
    pub config: &'a CaptureConfig,
}

impl CaptureEntry<'_> {
    /// `capture[<index>].<field>`.
    pub fn key(&self, field: &str) -> String {
        format!("capture[{}].{field}", self.index)
    }
}

/// Checks the entries of one `install` before anything changes: each entry on its own
/// ([`CaptureConfig::validate`]) and that no two share a name (which names their triggers).
pub fn check_entries(entries: &[CaptureEntry<'_>]) -> Result<(), CaptureError> {
    for (i, entry) in entries.iter().enumerate() {
        entry.config.validate(entry.index).map_err(keyed)?;
        let name = entry.config.name();
        if let Some(other) = entries[..i].iter().find(|e| e.config.name() == name) {
            return Err(CaptureError::invalid(
                entry.key("name"),
                format!(
                    "`{name}` is already the name of capture[{}]; set a distinct `name`",
                    other.index
                ),
            ));
        }
    }
    Ok(())
}

/// A [`CaptureConfig::validate`] message (`capture[0].event_type: ...`) as an error with its
/// key.
pub fn keyed(message: String) -> CaptureError {
    match message.split_once(": ") {
        Some((key, rest)) => CaptureError::invalid(key, rest),
        None => CaptureError::invalid("capture", message),
    }
}

/// A column of a captured table, as the database's catalog lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableColumn {
    /// Its name.
    pub name: String,
    /// Its declared type, as the catalog spells it (for messages and the payload check).
    pub type_name: String,
}

/// Checks that every column `entry` names (aggregate_id, event_type_column, payload) exists
/// in `columns` of `table`; returns the payload column, if the payload is one, for the
/// dialect to check its type ([`payload_type_error`]).
pub fn check_columns<'c>(
    entry: CaptureEntry<'_>,
    table: &str,
    columns: &'c [TableColumn],
) -> Result<Option<&'c TableColumn>, CaptureError> {
    let column = |field: &str, wanted: &Identifier| {
        columns
            .iter()
            .find(|c| c.name == wanted.as_str())
            .ok_or_else(|| {
                CaptureError::invalid(
                    entry.key(field),
                    format!(
                        "column `{wanted}` does not exist in table {table} (its columns: {})",
                        columns
                            .iter()
                            .map(|c| c.name.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                )
            })
    };
    let config = entry.config;
    column("aggregate_id", &config.aggregate_id)?;
    if let Some(c) = &config.event_type_column {
        column("event_type_column", c)?;
    }
    config
        .payload
        .column()
        .map(|c| column("payload", c))
        .transpose()
}

/// The error for a payload column of an unusable type; `allowed` lists the usable ones.
pub fn payload_type_error(
    entry: CaptureEntry<'_>,
    table: &str,
    column: &TableColumn,
    allowed: &str,
) -> CaptureError {
    CaptureError::invalid(
        entry.key("payload"),
        format!(
            "column `{}` of table {table} is of type {}; a payload column must be {allowed} (or use payload = \"row\")",
            column.name, column.type_name
        ),
    )
}

/// What is recorded next to an installed capture (PostgreSQL: the function's comment;
/// SQLite and MySQL: a row of the `<outbox>_capture` table): which outbox table it writes
/// into, and the entry it was installed from. Stored as JSON.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CaptureRecord {
    /// Format version (1).
    pub outbox_capture: u32,
    /// The outbox table it writes into.
    pub outbox: String,
    /// The entry it was installed from.
    pub config: CaptureConfig,
}

impl CaptureRecord {
    /// The record of `config` writing into `outbox`.
    pub fn new(outbox: impl Into<String>, config: &CaptureConfig) -> Self {
        Self {
            outbox_capture: 1,
            outbox: outbox.into(),
            config: config.clone(),
        }
    }

    /// The record as stored.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a capture record serializes")
    }

    /// A stored record; `None` when absent or unreadable.
    pub fn parse(text: Option<&str>) -> Option<Self> {
        serde_json::from_str(text?).ok()
    }
}

/// The line `install` prints for one capture.
pub fn install_line(
    config: &CaptureConfig,
    replaced: bool,
    triggers: &str,
    table: &str,
    outbox: &str,
) -> String {
    let ops = config
        .ops()
        .iter()
        .map(|o| o.as_str())
        .collect::<Vec<_>>()
        .join(", ");
    let event_type = match (&config.event_type, &config.event_type_column) {
        (Some(t), _) => format!("event_type {t:?}"),
        (None, Some(c)) => format!("event_type from column {c}"),
        (None, None) => String::new(),
    };
    format!(
        "capture {}: {} trigger {triggers} on {table} ({ops}) -> outbox table {outbox}: aggregate {:?} / column {}, {event_type}, payload {}",
        config.name(),
        if replaced { "replaced" } else { "installed" },
        config.aggregate_type,
        config.aggregate_id,
        config.payload,
    )
}

/// A capture found in the database (`outbox capture list`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct InstalledCapture {
    /// The capture's name.
    pub name: String,
    /// PostgreSQL: the trigger function, `schema.function`. SQLite and MySQL, which have no
    /// trigger functions: where the capture is recorded (its row of `<outbox>_capture`).
    pub function: String,
    /// The captured table, `schema.table`; `None` when the function has no trigger left.
    pub table: Option<String>,
    /// The trigger's name.
    pub trigger: Option<String>,
    /// The writes that produce an event, as the trigger says.
    pub on: Vec<CaptureOp>,
    /// False when the trigger is disabled (`ALTER TABLE ... DISABLE TRIGGER`): writes then
    /// produce no event.
    pub enabled: bool,
    /// The entry it was installed from, as recorded with the function (absent if that
    /// record is unreadable).
    pub config: Option<CaptureConfig>,
}

/// Implements [`Capture`] for a type with inherent `async fn install`, `remove` and `list`
/// of the trait's signatures (each backend's capture module); `impl_capture!(T, snapshot)`
/// also forwards [`Capture::snapshot`] to an inherent `async fn snapshot(&self, entry) ->
/// Result<impl SnapshotRun, CaptureError>`.
#[macro_export]
macro_rules! impl_capture {
    (@snapshot $ty:ty) => {};
    (@snapshot $ty:ty, snapshot) => {
        fn snapshot<'a>(
            &'a self,
            entry: $crate::capture::CaptureEntry<'a>,
        ) -> $crate::sink::BoxFuture<
            'a,
            Result<Box<dyn $crate::capture::SnapshotRun + 'a>, $crate::capture::CaptureError>,
        > {
            Box::pin(async move {
                let run = <$ty>::snapshot(self, entry).await?;
                Ok(Box::new(run) as Box<dyn $crate::capture::SnapshotRun + 'a>)
            })
        }
    };
    ($ty:ty $(, $snapshot:ident)?) => {
        impl $crate::capture::Capture for $ty {
            fn install<'a>(
                &'a self,
                entries: &'a [$crate::capture::CaptureEntry<'a>],
            ) -> $crate::sink::BoxFuture<'a, Result<Vec<String>, $crate::capture::CaptureError>>
            {
                Box::pin(<$ty>::install(self, entries))
            }
            fn remove<'a>(
                &'a self,
                names: &'a [$crate::Identifier],
            ) -> $crate::sink::BoxFuture<'a, Result<Vec<String>, $crate::capture::CaptureError>>
            {
                Box::pin(<$ty>::remove(self, names))
            }
            fn list(
                &self,
            ) -> $crate::sink::BoxFuture<
                '_,
                Result<Vec<$crate::capture::InstalledCapture>, $crate::capture::CaptureError>,
            > {
                Box::pin(<$ty>::list(self))
            }
            $crate::impl_capture!(@snapshot $ty $(, $snapshot)?);
        }
    };
}

/// `outbox capture`: installs, removes and lists captures (row triggers, and on PostgreSQL a
/// function, per capture). PostgreSQL and SQLite run install and remove in one transaction
/// each: all given entries, or nothing. MySQL commits each trigger statement on its own: its
/// install checks every entry first and undoes its changes on a failure (docs/capture.md).
pub trait Capture: Send + Sync {
    /// Installs (or replaces) the captures of `entries`, after checking each against the
    /// database; returns what it did, one line each.
    fn install<'a>(
        &'a self,
        entries: &'a [CaptureEntry<'a>],
    ) -> BoxFuture<'a, Result<Vec<String>, CaptureError>>;
    /// Removes the captures named `names` (a name not installed is reported, not an error);
    /// returns what it did, one line each.
    fn remove<'a>(
        &'a self,
        names: &'a [Identifier],
    ) -> BoxFuture<'a, Result<Vec<String>, CaptureError>>;
    /// The captures writing into this backend's outbox table.
    fn list(&self) -> BoxFuture<'_, Result<Vec<InstalledCapture>, CaptureError>>;
    /// Starts a snapshot of the installed capture `entry`, or resumes its unfinished one
    /// (docs/capture.md, "Snapshot"): checks the capture is installed as configured, that
    /// its table and columns are there, and that the table has a single-column primary key,
    /// before anything is written.
    fn snapshot<'a>(
        &'a self,
        entry: CaptureEntry<'a>,
    ) -> BoxFuture<'a, Result<Box<dyn SnapshotRun + 'a>, CaptureError>> {
        Box::pin(async move {
            Err(CaptureError::invalid(
                entry.key("table"),
                "`outbox capture snapshot` is not supported by this database yet",
            ))
        })
    }
}

#[cfg(test)]
mod tests;
