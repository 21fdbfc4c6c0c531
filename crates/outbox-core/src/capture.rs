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

/// Why a text cannot become an SQL string literal.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LiteralError {
    /// PostgreSQL text cannot hold the NUL character.
    #[error("must not contain the NUL character")]
    Nul,
}

/// `value` as a PostgreSQL string literal ([`Dialect::Postgres`]).
pub fn quote_literal(value: &str) -> Result<String, LiteralError> {
    Dialect::Postgres.literal(value)
}

/// The SQL dialect a capture's statements are written in: decides how a text becomes a
/// literal ([`Dialect::literal`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    /// PostgreSQL.
    Postgres,
    /// SQLite.
    Sqlite,
    /// MySQL and MariaDB.
    MySql,
}

impl Dialect {
    /// `id` quoted as an identifier: double quotes, or backquotes on MySQL.
    pub fn quote(self, id: &Identifier) -> String {
        match self {
            Self::MySql => format!("`{id}`"),
            Self::Postgres | Self::Sqlite => id.quoted(),
        }
    }

    /// `value` as an SQL string literal that means exactly `value`; NUL is refused.
    ///
    /// - PostgreSQL: whatever `standard_conforming_strings` says: single quotes are doubled,
    ///   and a value with a backslash is written as an escape string (`E'...'`, backslashes
    ///   doubled), as PostgreSQL's own `quote_literal` does.
    /// - SQLite: single quotes doubled; a backslash is an ordinary character there.
    /// - MySQL/MariaDB: single quotes doubled (the same in every `sql_mode`); a value with a
    ///   backslash, whose meaning depends on `NO_BACKSLASH_ESCAPES`, is written as its UTF-8
    ///   bytes in hex instead, `CONVERT(X'...' USING utf8mb4)`, which reads the same in every
    ///   mode.
    pub fn literal(self, value: &str) -> Result<String, LiteralError> {
        if value.contains('\0') {
            return Err(LiteralError::Nul);
        }
        match self {
            Self::Postgres => Ok(quote_pg(value)),
            Self::Sqlite => Ok(format!("'{}'", value.replace('\'', "''"))),
            Self::MySql if value.contains('\\') => {
                let hex: String = value.bytes().map(|b| format!("{b:02X}")).collect();
                Ok(format!("CONVERT(X'{hex}' USING utf8mb4)"))
            }
            Self::MySql => Ok(format!("'{}'", value.replace('\'', "''"))),
        }
    }
}

fn quote_pg(value: &str) -> String {
    let mut out = String::with_capacity(value.len() + 3);
    if value.contains('\\') {
        out.push('E');
    }
    out.push('\'');
    for c in value.chars() {
        match c {
            '\'' => out.push_str("''"),
            '\\' => out.push_str("\\\\"),
            c => out.push(c),
        }
    }
    out.push('\'');
    out
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

/// The trigger of capture `name` for `op` where a trigger fires for one kind of write
/// (SQLite, MySQL): `<name>_outbox_capture_<op>`. In bundled SQL templates it is the
/// placeholder `{{name:<suffix>}}` with [`CaptureOp::trigger_suffix`], rendered for the
/// capture's name, so the name reaches SQL as a quoted identifier.
pub fn op_trigger_name(name: &Identifier, op: CaptureOp) -> String {
    format!("{name}{}", op.trigger_suffix())
}

impl CaptureOp {
    /// `_outbox_capture_insert` or `_outbox_capture_update`: see [`op_trigger_name`].
    pub fn trigger_suffix(self) -> &'static str {
        match self {
            Self::Insert => "_outbox_capture_insert",
            Self::Update => "_outbox_capture_update",
        }
    }

    /// `INSERT` or `UPDATE`, the trigger event.
    pub fn sql_event(self) -> &'static str {
        match self {
            Self::Insert => "INSERT",
            Self::Update => "UPDATE",
        }
    }
}

/// Replaces each `@KEY@` of `text` by its value in one pass, left to right: a value's own
/// text is never scanned, so a literal holding `@KEY@` stays as it is. Keys are the bundled
/// templates' own markers; values are quoted literals or constant SQL.
///
/// # Panics
/// On a marker of `text` that `values` lacks: a bug in the bundled SQL (covered by tests).
pub fn splice(text: &str, values: &[(&str, &str)]) -> String {
    let mut out = String::with_capacity(text.len() + 64);
    let mut rest = text;
    while let Some(start) = rest.find('@') {
        out.push_str(&rest[..start]);
        let after = &rest[start + 1..];
        match after.find('@').map(|end| &after[..end]) {
            Some(key)
                if !key.is_empty() && key.chars().all(|c| c.is_ascii_uppercase() || c == '_') =>
            {
                let value = values
                    .iter()
                    .find(|(k, _)| *k == key)
                    .map(|(_, v)| *v)
                    .unwrap_or_else(|| panic!("no value for @{key}@ in bundled SQL"));
                out.push_str(value);
                rest = &after[key.len() + 1..];
            }
            _ => {
                out.push('@');
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// One database's SQL for a capture's per-op trigger (SQLite, MySQL: a trigger fires for one
/// kind of write and holds its own body). [`OpTrigger::render`] fills `template` in three
/// steps: first the structure (`@TRIGGER@`, `@EVENT@`, `@CHECKS@`, `@EVENT_TYPE@`,
/// `@PAYLOAD@`) from these constants; then the identifiers (`{{captured_table}}`,
/// `{{outbox_table}}`, `{{aggregate_id}}`, `{{event_type_column}}`, `{{payload_column}}`
/// and whatever else `named` gives), quoted; last, in one pass never scanned again, the
/// literals (`@AGGREGATE_TYPE@`, `@FIXED_EVENT_TYPE@`, `@OP@`, `@CAPTURE_TABLE@`,
/// `@NULL_AGGREGATE_ID@`, `@NULL_EVENT_TYPE@`, `@NULL_PAYLOAD@`) and the row payload
/// (`@ROW@`).
#[derive(Debug, Clone, Copy)]
pub struct OpTrigger<'a> {
    /// How texts become literals.
    pub dialect: Dialect,
    /// The `CREATE TRIGGER` statement.
    pub template: &'a str,
    /// What precedes the trigger's own name (`{{name:<suffix>}}`), e.g. a schema.
    pub trigger_prefix: &'a str,
    /// The NULL checks of the aggregate_id column, the event_type column, the payload
    /// column (each raises the matching `@NULL_...@` message).
    pub checks: [&'a str; 3],
    /// `@EVENT_TYPE@` for an event_type column (a fixed one is `@FIXED_EVENT_TYPE@`).
    pub event_type_column: &'a str,
    /// `@PAYLOAD@` for a payload column (the row is `@ROW@`).
    pub payload_column: &'a str,
    /// Applied to the text once the identifiers are in (MySQL: `"` to backquote).
    pub quote: fn(String) -> String,
}

impl OpTrigger<'_> {
    /// The `CREATE TRIGGER` of `entry` for `op` on a table shown as `table` (messages and
    /// the `capture_table` header); `row` is the row payload expression (unused for a
    /// payload column); `named` the identifiers.
    pub fn render(
        &self,
        entry: CaptureEntry<'_>,
        op: CaptureOp,
        table: &str,
        row: Option<&str>,
        named: &[(&str, &Identifier)],
    ) -> Result<String, CaptureError> {
        let config = entry.config;
        let literal = |key: &str, value: &str| {
            self.dialect
                .literal(value)
                .map_err(|e| CaptureError::invalid(entry.key(key), e.to_string()))
        };
        let null = |what: &str| {
            literal(
                "table",
                &format!("outbox capture of {table}: the {what} of the written row is NULL"),
            )
        };
        let mut checks = self.checks[0].to_owned();
        if config.event_type_column.is_some() {
            checks.push_str(self.checks[1]);
        }
        if config.payload.column().is_some() {
            checks.push_str(self.checks[2]);
        }
        let trigger = format!(
            "{}{{{{name:{}}}}}",
            self.trigger_prefix,
            op.trigger_suffix()
        );
        let structure = splice(
            self.template,
            &[
                ("TRIGGER", &trigger),
                ("EVENT", op.sql_event()),
                ("CHECKS", &checks),
                (
                    "EVENT_TYPE",
                    if config.event_type_column.is_some() {
                        self.event_type_column
                    } else {
                        "@FIXED_EVENT_TYPE@"
                    },
                ),
                (
                    "PAYLOAD",
                    if config.payload.column().is_some() {
                        self.payload_column
                    } else {
                        "@ROW@"
                    },
                ),
                // Left for the last step.
                ("AGGREGATE_TYPE", "@AGGREGATE_TYPE@"),
                ("OP", "@OP@"),
                ("CAPTURE_TABLE", "@CAPTURE_TABLE@"),
            ],
        );
        let rendered = (self.quote)(crate::migration::render_sql(
            &structure,
            None,
            &config.name(),
            named,
        ));
        let fixed = match &config.event_type {
            Some(t) => literal("event_type", t)?,
            None => String::new(),
        };
        Ok(splice(
            &rendered,
            &[
                (
                    "AGGREGATE_TYPE",
                    &literal("aggregate_type", &config.aggregate_type)?,
                ),
                ("FIXED_EVENT_TYPE", &fixed),
                ("OP", &literal("on", op.as_str())?),
                ("CAPTURE_TABLE", &literal("table", table)?),
                ("NULL_AGGREGATE_ID", &null("aggregate_id column")?),
                ("NULL_EVENT_TYPE", &null("event_type column")?),
                ("NULL_PAYLOAD", &null("payload column")?),
                ("ROW", row.unwrap_or_default()),
            ],
        ))
    }
}

/// `<object>(<key>, <value>, ...)` over `columns`: the row as a JSON object for a row
/// payload (SQLite `json_object`, MySQL `JSON_OBJECT`); `value` gives each column's
/// expression from the column and its quoted `NEW.<column>`. Every column name must be a
/// plain identifier to reach SQL.
pub fn row_object(
    dialect: Dialect,
    function: &str,
    entry: CaptureEntry<'_>,
    table: &str,
    columns: &[TableColumn],
    value: impl Fn(&TableColumn, &str) -> String,
) -> Result<String, CaptureError> {
    let mut parts = Vec::with_capacity(columns.len());
    for c in columns {
        let id = Identifier::new(c.name.as_str()).map_err(|e| {
            CaptureError::invalid(
                entry.key("payload"),
                format!(
                    "payload = \"row\" needs every column of {table} to have a plain name, and {e}; use a payload column instead"
                ),
            )
        })?;
        let key = dialect.literal(id.as_str()).map_err(|e| {
            CaptureError::invalid(entry.key("payload"), format!("column {id}: {e}"))
        })?;
        parts.push(format!(
            "{key}, {}",
            value(c, &format!("NEW.{}", dialect.quote(&id)))
        ));
    }
    Ok(format!("{function}({})", parts.join(", ")))
}

/// SQLite and MySQL, which record each capture as a row of `<outbox>_capture`: what the
/// commands say and `list` shows, from the recorded rows and the triggers found.
pub mod recorded {
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
            None => format!(
                "capture {name}: not installed (no row in {outbox}_capture); nothing to remove"
            ),
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

/// Why a capture command failed.
#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    /// An entry cannot be installed as configured (a missing table or column, a column of an
    /// unusable type, a name taken): the message names the key.
    #[error("{key}: {message}")]
    Invalid {
        /// The config key, e.g. `capture[0].aggregate_id`.
        key: String,
        /// What is wrong, and what to do.
        message: String,
    },
    /// The outbox table does not exist.
    #[error("outbox table {table} does not exist in {database}; run `outbox migrate` first")]
    NotMigrated {
        /// The outbox table.
        table: String,
        /// The database, secrets redacted.
        database: String,
    },
    /// The database refused or could not be reached; nothing was changed.
    #[error("{context}")]
    Database {
        /// What was being done.
        context: String,
        /// The database error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

impl CaptureError {
    /// An [`Invalid`](Self::Invalid) error for `key`.
    pub fn invalid(key: impl Into<String>, message: impl Into<String>) -> Self {
        Self::Invalid {
            key: key.into(),
            message: message.into(),
        }
    }
}

impl CaptureError {
    /// Maps a database error to [`Database`](Self::Database) with `context`.
    pub fn database<E: std::error::Error + Send + Sync + 'static>(
        context: impl Into<String>,
    ) -> impl FnOnce(E) -> Self {
        let context = context.into();
        move |e| Self::Database {
            context,
            source: Box::new(e),
        }
    }
}

/// Implements [`Capture`] for a type with inherent `async fn install`, `remove` and `list`
/// of the trait's signatures (each backend's capture module).
#[macro_export]
macro_rules! impl_capture {
    ($ty:ty) => {
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
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(toml_text: &str) -> Result<CaptureConfig, String> {
        toml::from_str(toml_text).map_err(|e| e.to_string())
    }

    const MINIMAL: &str = r#"
table = "bookings"
aggregate_type = "Customer"
aggregate_id = "customer_id"
event_type = "booking.created"
"#;

    #[test]
    fn defaults_are_row_payload_on_insert_named_after_the_table() {
        let c = parse(MINIMAL).expect("valid");
        assert_eq!(c.payload, CapturePayload::Row);
        assert_eq!(c.on, vec![CaptureOp::Insert]);
        assert_eq!(c.name().as_str(), "bookings");
        assert_eq!(c.qualified_table().to_string(), "public.bookings");
        c.validate(0).expect("valid");
    }

    #[test]
    fn a_schema_and_a_payload_column_are_read() {
        let c = parse(
            r#"
table = "app.bookings"
name = "app_bookings"
aggregate_type = "Customer"
aggregate_id = "customer_id"
event_type_column = "status"
payload = "doc"
on = ["update", "insert"]
"#,
        )
        .expect("valid");
        assert_eq!(c.qualified_table().to_string(), "app.bookings");
        assert_eq!(
            c.payload,
            CapturePayload::Column(Identifier::new("doc").expect("valid"))
        );
        assert_eq!(c.ops(), vec![CaptureOp::Insert, CaptureOp::Update]);
        c.validate(3).expect("valid");
        let back = toml::to_string(&c).expect("serializes");
        assert_eq!(parse(&back).expect("round trip"), c);
    }

    #[test]
    fn names_that_could_carry_sql_and_unknown_keys_are_refused_by_serde() {
        for bad in [
            r#"table = "bookings; DROP TABLE x""#,
            r#"table = "a.b.c""#,
            r#"aggregate_id = "customer id""#,
            r#"payload = "doc\"""#,
            r#"on = ["delete"]"#,
            r#"colour = "blue""#,
        ] {
            let key = bad.split(' ').next().expect("a key");
            let text = MINIMAL
                .lines()
                .filter(|l| !l.starts_with(&format!("{key} ")))
                .collect::<Vec<_>>()
                .join("\n");
            assert!(parse(&format!("{text}\n{bad}")).is_err(), "{bad}");
        }
    }

    #[test]
    fn validate_names_the_key() {
        let mut c = parse(MINIMAL).expect("valid");
        c.event_type_column = Some(Identifier::new("status").expect("valid"));
        assert_eq!(
            c.validate(2).expect_err("both"),
            "capture[2].event_type: set either event_type or event_type_column, not both"
        );
        c.event_type = None;
        c.event_type_column = None;
        assert!(
            c.validate(0)
                .expect_err("neither")
                .starts_with("capture[0].event_type: set event_type")
        );
        let mut c = parse(MINIMAL).expect("valid");
        c.aggregate_type = " ".into();
        assert!(
            c.validate(1)
                .expect_err("empty")
                .starts_with("capture[1].aggregate_type:")
        );
        c.aggregate_type = "a\0b".into();
        assert!(c.validate(1).expect_err("nul").contains("NUL"));
        let mut c = parse(MINIMAL).expect("valid");
        c.on = vec![];
        assert!(
            c.validate(0)
                .expect_err("empty")
                .starts_with("capture[0].on:")
        );
        c.on = vec![CaptureOp::Insert, CaptureOp::Insert];
        assert!(c.validate(0).expect_err("twice").contains("twice"));
    }

    #[test]
    fn a_validation_message_keeps_its_own_key() {
        let e = keyed(
            "capture[1].event_type: set either event_type or event_type_column, not both".into(),
        );
        assert!(matches!(&e, CaptureError::Invalid { key, .. } if key == "capture[1].event_type"));
        assert_eq!(
            e.to_string(),
            "capture[1].event_type: set either event_type or event_type_column, not both"
        );
    }

    #[test]
    fn splice_never_scans_a_value() {
        let out = splice("a @X@ b @Y@ c@d e@", &[("X", "'@Y@'"), ("Y", "2")]);
        assert_eq!(out, "a '@Y@' b 2 c@d e@");
    }

    #[test]
    fn literals_per_dialect() {
        assert_eq!(Dialect::Sqlite.literal("O'B\\r").expect("ok"), "'O''B\\r'");
        assert_eq!(Dialect::MySql.literal("O'Br").expect("ok"), "'O''Br'");
        assert_eq!(
            Dialect::MySql.literal("a\\'").expect("ok"),
            "CONVERT(X'615C27' USING utf8mb4)"
        );
        assert_eq!(Dialect::MySql.literal("\0"), Err(LiteralError::Nul));
        assert_eq!(Dialect::Sqlite.literal("\0"), Err(LiteralError::Nul));
    }

    #[test]
    fn duplicate_names_are_refused() {
        let a = parse(MINIMAL).expect("valid");
        let mut b = a.clone();
        b.table = parse_table("other.bookings").expect("valid");
        let err = validate_all(&[a.clone(), b.clone()]).expect_err("same name");
        assert!(err.starts_with("capture[1].name:"), "{err}");
        b.name = Some(Identifier::new("other_bookings").expect("valid"));
        validate_all(&[a, b]).expect("distinct");
    }

    #[test]
    fn literals_are_quoted_whatever_they_contain() {
        assert_eq!(quote_literal("Customer").expect("ok"), "'Customer'");
        assert_eq!(quote_literal("O'Brien").expect("ok"), "'O''Brien'");
        assert_eq!(quote_literal("a\\b'c").expect("ok"), "E'a\\\\b''c'");
        assert_eq!(quote_literal("").expect("ok"), "''");
        assert_eq!(quote_literal("x\0"), Err(LiteralError::Nul));
    }

    proptest::proptest! {
        /// Reading the literal back as PostgreSQL does (both string syntaxes) gives the value.
        #[test]
        fn every_quoted_literal_reads_back_as_its_value(s in "[^\0]{0,40}") {
            let lit = quote_literal(&s).expect("no NUL");
            let (escape, body) = match lit.strip_prefix('E') {
                Some(rest) => (true, rest),
                None => (false, lit.as_str()),
            };
            let body = body.strip_prefix('\'').and_then(|b| b.strip_suffix('\'')).expect("quoted");
            let mut out = String::new();
            let mut chars = body.chars().peekable();
            while let Some(c) = chars.next() {
                match c {
                    '\'' => {
                        // Inside the literal a quote only ever comes doubled.
                        proptest::prop_assert_eq!(chars.next(), Some('\''));
                        out.push('\'');
                    }
                    '\\' if escape => {
                        proptest::prop_assert_eq!(chars.next(), Some('\\'));
                        out.push('\\');
                    }
                    '\\' => proptest::prop_assert!(false, "a backslash outside E'...'"),
                    c => out.push(c),
                }
            }
            proptest::prop_assert_eq!(out, s);
        }
    }
}
