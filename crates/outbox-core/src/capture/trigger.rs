//! Per-op capture triggers (SQLite, MySQL): their names, the template splicing, and the row
//! payload as a JSON object.

use super::{CaptureEntry, CaptureError, CaptureOp, Dialect, TableColumn};
use crate::identifier::Identifier;

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
        splice_literals(self.dialect, entry, table, Some(op), row, &rendered)
    }
}

/// Fills the literals of `entry` into `rendered` in one pass that is never scanned again
/// (see [`OpTrigger::render`]): `@AGGREGATE_TYPE@`, `@FIXED_EVENT_TYPE@`, `@OP@` (empty
/// without `op`), `@CAPTURE_TABLE@` (`table`), the `@NULL_...@` messages, and `@ROW@`.
pub fn splice_literals(
    dialect: Dialect,
    entry: CaptureEntry<'_>,
    table: &str,
    op: Option<CaptureOp>,
    row: Option<&str>,
    rendered: &str,
) -> Result<String, CaptureError> {
    let config = entry.config;
    let literal = |key: &str, value: &str| {
        dialect
            .literal(value)
            .map_err(|e| CaptureError::invalid(entry.key(key), e.to_string()))
    };
    let null = |what: &str| {
        literal(
            "table",
            &format!("outbox capture of {table}: the {what} of the written row is NULL"),
        )
    };
    let fixed = match &config.event_type {
        Some(t) => literal("event_type", t)?,
        None => String::new(),
    };
    let op = match op {
        Some(op) => literal("on", op.as_str())?,
        None => String::new(),
    };
    Ok(splice(
        rendered,
        &[
            (
                "AGGREGATE_TYPE",
                &literal("aggregate_type", &config.aggregate_type)?,
            ),
            ("FIXED_EVENT_TYPE", &fixed),
            ("OP", &op),
            ("CAPTURE_TABLE", &literal("table", table)?),
            ("NULL_AGGREGATE_ID", &null("aggregate_id column")?),
            ("NULL_EVENT_TYPE", &null("event_type column")?),
            ("NULL_PAYLOAD", &null("payload column")?),
            ("ROW", row.unwrap_or_default()),
        ],
    ))
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
