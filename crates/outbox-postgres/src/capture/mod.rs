//! `outbox capture` on PostgreSQL (docs/capture.md): a business table as an event source,
//! through a row trigger that writes each captured row's event into the outbox table in the
//! writer's own transaction.
//!
//! Per capture, named `<name>_outbox_capture`:
//! - a PL/pgSQL function in the outbox table's schema
//!   ([queries/capture_function.sql](../queries/capture_function.sql)), specific to the
//!   capture's columns, so every column reference is planned once and cast exactly as the
//!   config says;
//! - an `AFTER INSERT [OR UPDATE] ... FOR EACH ROW` trigger on the business table calling it,
//!   with the literal values (`capture_table`, `aggregate_type`, a fixed `event_type`) as
//!   trigger arguments;
//! - a comment on the function recording the entry and the outbox table, which `list` reads.
//!
//! Column and table names reach SQL only as validated, double-quoted identifiers
//! (`sql::render_with`); literal values only through `quote_literal`; names read back from
//! the catalog only through the server's own quoting (`format('%I')`). Install and remove run
//! in one transaction each, under an advisory lock and a `lock_timeout`: every entry, or
//! nothing.

use outbox_core::capture::{
    CaptureEntry, CaptureError, CaptureOp, CaptureRecord, TableColumn, TableKind, check_columns,
    check_entries, check_table, install_line, payload_type_error, quote_literal,
    trigger_identifiers,
};
use outbox_core::{Identifier, QualifiedTable};
use sqlx::{Executor, PgPool, Postgres, Transaction};

use crate::config::PostgresConfig;
use crate::sql::render_with;

macro_rules! query_file {
    ($name:literal) => {
        include_str!(concat!("../../queries/", $name, ".sql"))
    };
}

mod list;
mod snapshot;

const FUNCTION: &str = query_file!("capture_function");
const TRIGGER: &str = query_file!("capture_trigger");
const TABLE: &str = query_file!("capture_table");
const COLUMNS: &str = query_file!("capture_columns");
const TRIGGERS_OF: &str = query_file!("capture_triggers_of");
const TRIGGER_NAMED: &str = query_file!("capture_trigger_named");
const FUNCTION_RECORD: &str = query_file!("capture_function_record");
const LIST: &str = query_file!("capture_list");
const LOCK_TIMEOUT_SQL: &str = query_file!("partition_lock_timeout");

/// The record on the function, after `IS`: replaced by a quoted literal after rendering.
const COMMENT: &str = "COMMENT ON FUNCTION {{qname:_outbox_capture}}() IS @RECORD@";
const DROP_FUNCTION: &str = "DROP FUNCTION IF EXISTS {{qname:_outbox_capture}}()";
const DROP_TRIGGER: &str =
    "DROP TRIGGER IF EXISTS {{name:_outbox_capture}} ON {{captured_schema}}.{{captured_table}}";
/// The function's signature as text, for `to_regprocedure`.
const SIGNATURE: &str = "{{qname:_outbox_capture}}()";

/// `@EVENT_TYPE@` of capture_function.sql: the fixed value, or a column as text.
const EVENT_TYPE_FIXED: &str = "TG_ARGV[2]";

impl PayloadKind {
    /// `@PAYLOAD@`: the row as JSON text, a text-like column's text (UTF-8), a bytea column,
    /// read from `row` (`NEW` in the trigger, the table's alias in a snapshot: one expression
    /// for both, so a snapshot event carries what the trigger would write for the same row).
    fn expression(self, row: &str) -> String {
        match self {
            Self::Row => format!("pg_catalog.convert_to(pg_catalog.to_jsonb({row})::text, 'UTF8')"),
            Self::Text => {
                format!("pg_catalog.convert_to({row}.{{{{payload_column}}}}::text, 'UTF8')")
            }
            Self::Bytea => format!("{row}.{{{{payload_column}}}}"),
        }
    }
}

/// `@EVENT_TYPE@` for an event type from a column, read from `row` (see
/// [`PayloadKind::expression`]).
fn event_type_column(row: &str) -> String {
    format!("{row}.{{{{event_type_column}}}}::text")
}

/// Base types a payload column may have (`format_type` spelling), and bytea.
const TEXT_PAYLOAD_TYPES: [&str; 4] = ["json", "jsonb", "text", "character varying"];

/// How long install and remove wait for a table lock: `CREATE TRIGGER` and `DROP TRIGGER`
/// wait for the transactions writing the table, and every later writer waits behind them.
const LOCK_TIMEOUT: &str = "10s";

/// The record written as the function's comment (`COMMENT ON FUNCTION`).
type Record = CaptureRecord;

/// Captures writing into one outbox table: what [`PgBackend`](crate::PgBackend) hands
/// `outbox capture`.
#[derive(Debug, Clone)]
pub struct PgCapture {
    pool: crate::db::Db,
    outbox: QualifiedTable,
    database: String,
}

/// What a payload column gives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PayloadKind {
    Row,
    Text,
    Bytea,
}

/// One entry, checked against the catalog: what to install.
#[derive(Debug)]
pub(crate) struct Plan<'a> {
    pub(crate) entry: CaptureEntry<'a>,
    /// `schema.table`, the `capture_table` header.
    pub(crate) table: QualifiedTable,
    /// The table's oid.
    pub(crate) oid: i64,
    pub(crate) payload: PayloadKind,
}

impl PgCapture {
    /// Captures into the outbox table of `config`, over `pool`.
    pub fn new(pool: PgPool, config: &PostgresConfig) -> Self {
        Self {
            pool: crate::db::Db::new(pool, config.transaction_pooling),
            outbox: config.qualified_table(),
            database: config.url.redacted(),
        }
    }

    pub(crate) fn schema(&self) -> &Identifier {
        self.outbox
            .schema
            .as_ref()
            .expect("PostgresConfig::qualified_table always has a schema")
    }

    /// Renders `template` for capture `name`: `{{qname:_outbox_capture}}` is its function,
    /// `{{name:_outbox_capture}}` its trigger, `{{schema}}.{{outbox_table}}` the outbox.
    pub(crate) fn render(
        &self,
        template: &str,
        name: &Identifier,
        named: &[(&str, &Identifier)],
    ) -> String {
        let capture = QualifiedTable::new(Some(self.schema().clone()), name.clone());
        let mut all: Vec<(&str, &Identifier)> = vec![("outbox_table", &self.outbox.table)];
        all.extend_from_slice(named);
        render_with(template, &capture, &all)
    }

    /// Installs or replaces the captures of `entries`, all in one transaction.
    pub async fn install(&self, entries: &[CaptureEntry<'_>]) -> Result<Vec<String>, CaptureError> {
        let context = format!("installing captures into outbox table {}", self.outbox);
        let mut tx = self.begin(&context).await?;
        let outbox_oid = self.outbox_oid(&mut tx, &context).await?;
        check_entries(entries)?;
        let mut plans = Vec::with_capacity(entries.len());
        for entry in entries {
            plans.push(self.check(&mut tx, *entry, outbox_oid).await?);
        }
        let mut lines = Vec::with_capacity(plans.len());
        for plan in &plans {
            lines.push(self.apply(&mut tx, plan).await?);
        }
        tx.commit().await.map_err(db(&context))?;
        Ok(lines)
    }

    /// The outbox table's oid; [`CaptureError::NotMigrated`] when it does not exist.
    pub(crate) async fn outbox_oid(
        &self,
        tx: &mut Transaction<'static, Postgres>,
        context: &str,
    ) -> Result<i64, CaptureError> {
        let oid: Option<i64> = crate::sql::query_scalar("SELECT to_regclass($1)::oid::bigint")
            .bind(self.outbox.quoted())
            .fetch_one(&mut **tx)
            .await
            .map_err(db(context))?;
        oid.ok_or_else(|| CaptureError::NotMigrated {
            table: self.outbox.to_string(),
            database: self.database.clone(),
        })
    }

    /// Begins the transaction of an install or remove: a `lock_timeout`, and one capture
    /// command per outbox table at a time (two concurrent `CREATE OR REPLACE FUNCTION` of
    /// the same function fail).
    pub(crate) async fn begin(
        &self,
        context: &str,
    ) -> Result<Transaction<'static, Postgres>, CaptureError> {
        let mut tx = self.pool.begin().await.map_err(db(context))?;
        crate::sql::query(LOCK_TIMEOUT_SQL)
            .bind(LOCK_TIMEOUT)
            .execute(&mut *tx)
            .await
            .map_err(db(context))?;
        crate::sql::query("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))")
            .bind(format!("outbox capture {}", self.outbox))
            .execute(&mut *tx)
            .await
            .map_err(db(context))?;
        Ok(tx)
    }

    /// Checks one entry against the catalog: the table, its columns and their types, and
    /// that the capture's name is free or already this capture's.
    pub(crate) async fn check<'a>(
        &self,
        tx: &mut Transaction<'static, Postgres>,
        entry: CaptureEntry<'a>,
        outbox_oid: i64,
    ) -> Result<Plan<'a>, CaptureError> {
        let config = entry.config;
        let table = config.qualified_table();
        let schema = table.schema.as_ref().expect("qualified_table has a schema");
        let context = format!("checking {} for capture `{}`", table, config.name());
        let found: Option<(i64, String)> = crate::sql::query_as(TABLE)
            .bind(schema.as_str())
            .bind(table.table.as_str())
            .fetch_optional(&mut **tx)
            .await
            .map_err(db(&context))?;
        let kind = match &found {
            None => TableKind::Missing,
            Some((oid, _)) if *oid == outbox_oid => TableKind::Outbox,
            Some((_, kind)) if kind == "r" || kind == "p" => TableKind::Table,
            Some((_, kind)) => TableKind::Other(relkind(kind).to_owned()),
        };
        check_table(entry, &table.to_string(), kind, &self.database)?;
        // check_table refused a missing table.
        let oid = found.map(|(oid, _)| oid).unwrap_or_default();
        let columns: Vec<(String, String, String)> = crate::sql::query_as(COLUMNS)
            .bind(oid)
            .fetch_all(&mut **tx)
            .await
            .map_err(db(&context))?;
        let listed: Vec<TableColumn> = columns
            .iter()
            .map(|(name, ty, _)| TableColumn {
                name: name.clone(),
                type_name: ty.clone(),
            })
            .collect();
        let payload = match check_columns(entry, &table.to_string(), &listed)? {
            None => PayloadKind::Row,
            Some(c) => {
                let base = columns
                    .iter()
                    .find(|(n, _, _)| *n == c.name)
                    .map(|(_, _, base)| base.as_str())
                    .unwrap_or_default();
                if base == "bytea" {
                    PayloadKind::Bytea
                } else if TEXT_PAYLOAD_TYPES.contains(&base) {
                    PayloadKind::Text
                } else {
                    return Err(payload_type_error(
                        entry,
                        &table.to_string(),
                        c,
                        "json, jsonb, text, varchar or bytea",
                    ));
                }
            }
        };
        // The name: the function is ours (or absent), and no other trigger of that name
        // sits on the table.
        let name = config.name();
        let signature = self.render(SIGNATURE, &name, &[]);
        let function = self.function_record(tx, &signature, &context).await?;
        if let Some(existing) = &function
            && existing
                .as_ref()
                .is_none_or(|r| r.outbox != self.outbox.to_string())
        {
            return Err(CaptureError::invalid(
                entry.key("name"),
                format!(
                    "function {}.{name}_outbox_capture exists and {}; set another `name`",
                    self.schema(),
                    match existing {
                        Some(r) => format!("belongs to a capture into outbox table {}", r.outbox),
                        None => "is not an outbox capture".to_owned(),
                    }
                ),
            ));
        }
        let trigger_name = format!("{name}_outbox_capture");
        let calls: Option<String> = crate::sql::query_scalar(TRIGGER_NAMED)
            .bind(oid)
            .bind(&trigger_name)
            .fetch_optional(&mut **tx)
            .await
            .map_err(db(&context))?;
        let ours = format!("{}.{trigger_name}", self.schema());
        if let Some(calls) = calls
            && calls != ours
        {
            return Err(CaptureError::invalid(
                entry.key("name"),
                format!(
                    "table {table} already has a trigger {trigger_name} calling {calls}, not this capture's {ours}; set another `name`"
                ),
            ));
        }
        Ok(Plan {
            entry,
            table,
            oid,
            payload,
        })
    }

    /// `Some(record)` when the function exists (`Some(None)`: without a readable record).
    pub(crate) async fn function_record(
        &self,
        tx: &mut Transaction<'static, Postgres>,
        signature: &str,
        context: &str,
    ) -> Result<Option<Option<Record>>, CaptureError> {
        let found: Option<Option<String>> = crate::sql::query_scalar(FUNCTION_RECORD)
            .bind(signature)
            .fetch_optional(&mut **tx)
            .await
            .map_err(db(context))?;
        Ok(found.map(|comment| Record::parse(comment.as_deref())))
    }

    /// Drops the triggers calling a capture's function; returns their tables.
    async fn drop_triggers(
        &self,
        tx: &mut Transaction<'static, Postgres>,
        signature: &str,
        context: &str,
    ) -> Result<Vec<String>, CaptureError> {
        let triggers: Vec<(String, String, String)> = crate::sql::query_as(TRIGGERS_OF)
            .bind(signature)
            .fetch_all(&mut **tx)
            .await
            .map_err(db(context))?;
        let mut tables = Vec::with_capacity(triggers.len());
        for (trigger, table, drop_sql) in triggers {
            // Quoted by the server (`format('%I')`) from catalog names.
            tx.execute(sqlx::AssertSqlSafe(drop_sql))
                .await
                .map_err(lock_or_db(format!("dropping trigger {trigger} on {table}")))?;
            tables.push(table);
        }
        Ok(tables)
    }

    /// Installs one checked capture: drops the triggers that call its function (also on a
    /// table it captured before), replaces the function, creates the trigger, records it.
    async fn apply(
        &self,
        tx: &mut Transaction<'static, Postgres>,
        plan: &Plan<'_>,
    ) -> Result<String, CaptureError> {
        let config = plan.entry.config;
        let name = config.name();
        let table = &plan.table;
        let context = format!("installing capture `{name}` on {table}");
        let signature = self.render(SIGNATURE, &name, &[]);
        let existed = self
            .function_record(tx, &signature, &context)
            .await?
            .is_some();
        let before = self.drop_triggers(tx, &signature, &context).await?;
        let schema = table.schema.as_ref().expect("qualified_table has a schema");
        let named = trigger_identifiers(
            config,
            [
                ("captured_schema", schema),
                ("captured_table", &table.table),
            ],
        );
        // The business table may hold a trigger of that name from a capture whose function
        // was dropped by hand; check() made sure it is not someone else's.
        tx.execute(sqlx::AssertSqlSafe(self.render(
            DROP_TRIGGER,
            &name,
            &named,
        )))
        .await
        .map_err(lock_or_db(format!("{context}: dropping the old trigger")))?;
        let event_type = if config.event_type_column.is_some() {
            event_type_column("NEW")
        } else {
            EVENT_TYPE_FIXED.to_owned()
        };
        let payload = plan.payload.expression("NEW");
        // Only constants of this file are spliced before rendering; `render` then fills in
        // the validated identifiers.
        let function = self.render(
            &FUNCTION
                .replace("@EVENT_TYPE@", &event_type)
                .replace("@PAYLOAD@", &payload),
            &name,
            &named,
        );
        tx.execute(sqlx::raw_sql(sqlx::AssertSqlSafe(function)))
            .await
            .map_err(db(format!("{context}: creating function {signature}")))?;

        let ops = config.ops();
        let events = ops
            .iter()
            .map(|op| match op {
                CaptureOp::Insert => "INSERT",
                CaptureOp::Update => "UPDATE",
            })
            .collect::<Vec<_>>()
            .join(" OR ");
        let literal = |key: &str, value: &str| {
            quote_literal(value)
                .map_err(|e| CaptureError::invalid(plan.entry.key(key), e.to_string()))
        };
        let mut args = vec![
            literal("table", &table.to_string())?,
            literal("aggregate_type", &config.aggregate_type)?,
        ];
        if let Some(t) = &config.event_type {
            args.push(literal("event_type", t)?);
        }
        // Rendered first, then the literals spliced in one replacement: a literal's text is
        // never scanned for placeholders.
        let trigger = self
            .render(&TRIGGER.replace("@EVENTS@", &events), &name, &named)
            .replace("@ARGS@", &args.join(", "));
        tx.execute(sqlx::AssertSqlSafe(trigger))
            .await
            .map_err(lock_or_db(format!("{context}: creating the trigger")))?;

        let record = Record::new(self.outbox.to_string(), config).to_json();
        let comment = self
            .render(COMMENT, &name, &[])
            .replace("@RECORD@", &literal("name", &record)?);
        tx.execute(sqlx::AssertSqlSafe(comment))
            .await
            .map_err(db(format!("{context}: recording it")))?;

        let mut line = install_line(
            config,
            existed,
            &format!("{name}_outbox_capture"),
            &table.to_string(),
            &self.outbox.to_string(),
        );
        let moved: Vec<&String> = before.iter().filter(|t| **t != table.to_string()).collect();
        if !moved.is_empty() {
            line.push_str(&format!(
                " (its trigger on {} was removed)",
                moved
                    .iter()
                    .map(|t| t.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        Ok(line)
    }

    /// Removes the captures named `names`, all in one transaction.
    pub async fn remove(&self, names: &[Identifier]) -> Result<Vec<String>, CaptureError> {
        let context = format!("removing captures from outbox table {}", self.outbox);
        let mut tx = self.begin(&context).await?;
        let mut lines = Vec::with_capacity(names.len());
        for name in names {
            let signature = self.render(SIGNATURE, name, &[]);
            match self.function_record(&mut tx, &signature, &context).await? {
                None => {
                    lines.push(format!(
                        "capture {name}: not installed (no function {signature}); nothing to remove"
                    ));
                    continue;
                }
                Some(Some(r)) if r.outbox == self.outbox.to_string() => {}
                Some(other) => {
                    return Err(CaptureError::invalid(
                        format!("capture `{name}`"),
                        format!(
                            "function {signature} {}; not removed",
                            match other {
                                Some(r) =>
                                    format!("belongs to a capture into outbox table {}", r.outbox),
                                None => "is not an outbox capture".to_owned(),
                            }
                        ),
                    ));
                }
            }
            let tables = self.drop_triggers(&mut tx, &signature, &context).await?;
            tx.execute(sqlx::AssertSqlSafe(self.render(DROP_FUNCTION, name, &[])))
                .await
                .map_err(db(format!("{context}: dropping function {signature}")))?;
            lines.push(format!(
                "capture {name}: removed trigger {name}_outbox_capture from {} and function {signature}",
                if tables.is_empty() {
                    "no table".to_owned()
                } else {
                    tables.join(", ")
                }
            ));
        }
        tx.commit().await.map_err(db(&context))?;
        Ok(lines)
    }
}

/// What a `relkind` is, for messages.
fn relkind(kind: &str) -> &'static str {
    match kind {
        "v" => "a view",
        "m" => "a materialized view",
        "f" => "a foreign table",
        "S" => "a sequence",
        "i" | "I" => "an index",
        "c" => "a composite type",
        "t" => "a TOAST table",
        _ => "not a table",
    }
}

pub(crate) fn db(context: impl Into<String>) -> impl FnOnce(sqlx::Error) -> CaptureError {
    CaptureError::database(context)
}

/// [`db`], saying so when the statement gave up waiting for a table lock.
fn lock_or_db(context: String) -> impl FnOnce(sqlx::Error) -> CaptureError {
    move |e| {
        let lock = matches!(&e, sqlx::Error::Database(d) if d.code().as_deref() == Some("55P03"));
        let context = if lock {
            format!(
                "{context}: the table's lock was not granted within {LOCK_TIMEOUT} (a long transaction uses the table); nothing was changed, run it again"
            )
        } else {
            context
        };
        CaptureError::Database {
            context,
            source: Box::new(e),
        }
    }
}

outbox_core::impl_capture!(PgCapture, snapshot);

#[cfg(test)]
mod tests;
