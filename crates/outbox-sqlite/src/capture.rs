//! `outbox capture` on SQLite (docs/capture.md): a business table as an event source, through
//! `AFTER INSERT` / `AFTER UPDATE` triggers that write each captured row's event into the
//! outbox table in the writer's own transaction.
//!
//! Per capture, named after its `name`:
//! - one trigger per captured write, `<name>_outbox_capture_insert` and
//!   `<name>_outbox_capture_update` ([queries/capture_trigger.sql](../queries/capture_trigger.sql));
//!   the event's `id` (a UUIDv7 built in SQL), `created_at` and `seq` come from the outbox
//!   table's own defaults, exactly as for a plain-SQL producer;
//! - a row of `<outbox>_capture` recording the entry (SQLite triggers have no comments; a
//!   table is simpler and sturdier than parsing trigger text back out of sqlite_schema).
//!
//! Install and remove run in one `BEGIN IMMEDIATE` transaction each (SQLite DDL is
//! transactional): every entry or nothing, and no writer ever sees a moment without the
//! trigger while one is replaced. Names reach SQL only as validated, quoted identifiers
//! (`render_sql`); texts only as literals of [`Dialect::Sqlite`].

use outbox_core::Identifier;
use outbox_core::capture::rows::{self, RowCatalog};
use outbox_core::capture::{
    CaptureEntry, CaptureError, CaptureRecord, Dialect, InstalledCapture, OpTrigger, TableColumn,
    TableKind, check_columns, check_entries, check_table, op_trigger_name, payload_type_error,
    row_object, trigger_identifiers,
};
use sqlx::{Executor, Sqlite, SqliteConnection, SqlitePool, Transaction};

use crate::sql::render;

mod snapshot;

const TRIGGER: &str = include_str!("../queries/capture_trigger.sql");
const RECORD_TABLE: &str = include_str!("../queries/capture_record_table.sql");
const RECORD_UPSERT: &str = "INSERT INTO {{name:_capture}} (name, table_name, record, installed_at) VALUES (?1, ?2, ?3, ?4) \
     ON CONFLICT (name) DO UPDATE SET table_name = excluded.table_name, record = excluded.record, installed_at = excluded.installed_at";
const RECORD_READ: &str = "SELECT table_name, record FROM {{name:_capture}} WHERE name = ?1";
const RECORD_DELETE: &str = "DELETE FROM {{name:_capture}} WHERE name = ?1";
const RECORD_LIST: &str = "SELECT name, record FROM {{name:_capture}} ORDER BY name";
const TABLE_KIND: &str =
    "SELECT type FROM sqlite_schema WHERE name = ?1 AND type IN ('table', 'view')";
const TRIGGER_OF: &str = "SELECT tbl_name FROM sqlite_schema WHERE type = 'trigger' AND name = ?1";
const COLUMNS: &str = "SELECT name, type FROM pragma_table_info(?1) ORDER BY cid";

/// The trigger of one capture for one op: the NULL checks (a row that cannot become an
/// event fails the write; losing the event silently is not an option), the event type of a
/// column as text, a payload column as it is (a number stored in it as its text: the relay
/// reads text or blob bytes).
const TRIGGER_SQL: OpTrigger<'static> = OpTrigger {
    dialect: Dialect::Sqlite,
    template: TRIGGER,
    trigger_prefix: "",
    checks: [
        "    SELECT RAISE(ABORT, @NULL_AGGREGATE_ID@) WHERE NEW.{{aggregate_id}} IS NULL;\n",
        "    SELECT RAISE(ABORT, @NULL_EVENT_TYPE@) WHERE NEW.{{event_type_column}} IS NULL;\n",
        "    SELECT RAISE(ABORT, @NULL_PAYLOAD@) WHERE NEW.{{payload_column}} IS NULL;\n",
    ],
    event_type_column: "CAST(NEW.{{event_type_column}} AS TEXT)",
    payload_column: "CASE WHEN typeof(NEW.{{payload_column}}) IN ('integer', 'real') THEN CAST(NEW.{{payload_column}} AS TEXT) ELSE NEW.{{payload_column}} END",
    quote: std::convert::identity,
};

/// Captures writing into one outbox table of one SQLite file.
#[derive(Debug, Clone)]
pub struct SqliteCapture {
    pool: SqlitePool,
    outbox: Identifier,
}

/// One entry, checked against the schema: what to install.
#[derive(Debug)]
struct Plan<'a> {
    entry: CaptureEntry<'a>,
    table: Identifier,
    /// The row payload's `json_object(...)`, or `None` for a payload column.
    row: Option<String>,
}

impl SqliteCapture {
    /// Captures into `outbox`, over `pool`.
    pub fn new(pool: SqlitePool, outbox: Identifier) -> Self {
        Self { pool, outbox }
    }

    fn record_sql(&self, template: &str) -> sqlx::AssertSqlSafe<String> {
        sqlx::AssertSqlSafe(render(template, &self.outbox))
    }

    /// Installs or replaces the captures of `entries`, all in one transaction.
    pub async fn install(&self, entries: &[CaptureEntry<'_>]) -> Result<Vec<String>, CaptureError> {
        let context = format!("installing captures into outbox table {}", self.outbox);
        check_entries(entries)?;
        let mut tx = self.begin(&context).await?;
        if self.kind(&mut tx, self.outbox.as_str(), &context).await? != Some("table".into()) {
            return Err(CaptureError::NotMigrated {
                table: self.outbox.to_string(),
                database: "the SQLite file".into(),
            });
        }
        tx.execute(self.record_sql(RECORD_TABLE))
            .await
            .map_err(db(&context))?;
        let mut plans = Vec::with_capacity(entries.len());
        for entry in entries {
            plans.push(self.check(&mut tx, *entry, &context).await?);
        }
        let mut lines = Vec::with_capacity(plans.len());
        for plan in &plans {
            lines.push(self.apply(&mut tx, plan).await?);
        }
        tx.commit().await.map_err(db(&context))?;
        Ok(lines)
    }

    /// `BEGIN IMMEDIATE`: SQLite's write lock first, so concurrent installs take turns.
    async fn begin(&self, context: &str) -> Result<Transaction<'static, Sqlite>, CaptureError> {
        self.pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(db(context))
    }

    async fn kind(
        &self,
        tx: &mut Transaction<'static, Sqlite>,
        name: &str,
        context: &str,
    ) -> Result<Option<String>, CaptureError> {
        sqlx::query_scalar(TABLE_KIND)
            .bind(name)
            .fetch_optional(&mut **tx)
            .await
            .map_err(db(context))
    }

    /// Checks one entry: the table (no schema but `main`), its columns, the payload column's
    /// declared type, and that the trigger names are free or this capture's own.
    async fn check<'a>(
        &self,
        tx: &mut Transaction<'static, Sqlite>,
        entry: CaptureEntry<'a>,
        context: &str,
    ) -> Result<Plan<'a>, CaptureError> {
        let config = entry.config;
        if let Some(schema) = &config.table.schema
            && schema.as_str() != "main"
        {
            return Err(CaptureError::invalid(
                entry.key("table"),
                format!(
                    "`{}`: SQLite has no schemas; name the table alone (`{}`)",
                    config.table, config.table.table
                ),
            ));
        }
        let table = config.table.table.clone();
        let kind = match self.kind(tx, table.as_str(), context).await?.as_deref() {
            None => TableKind::Missing,
            Some("view") => TableKind::Other("a view".into()),
            Some(_) if table == self.outbox => TableKind::Outbox,
            Some(_) => TableKind::Table,
        };
        check_table(entry, table.as_str(), kind, "the SQLite file")?;
        let columns: Vec<(String, String)> = sqlx::query_as(COLUMNS)
            .bind(table.as_str())
            .fetch_all(&mut **tx)
            .await
            .map_err(db(context))?;
        let columns: Vec<TableColumn> = columns
            .into_iter()
            .map(|(name, type_name)| TableColumn { name, type_name })
            .collect();
        let row = match check_columns(entry, table.as_str(), &columns)? {
            Some(c) if !payload_type_ok(&c.type_name) => {
                return Err(payload_type_error(
                    entry,
                    table.as_str(),
                    c,
                    "declared TEXT, JSON or BLOB (or untyped)",
                ));
            }
            Some(_) => None,
            // Integers and reals as JSON numbers, text as strings, NULL as null, a blob as
            // its hex text (JSON holds no bytes).
            None => Some(row_object(
                Dialect::Sqlite,
                "json_object",
                entry,
                table.as_str(),
                &columns,
                |_, col| format!("CASE WHEN typeof({col}) = 'blob' THEN hex({col}) ELSE {col} END"),
            )?),
        };
        let mut catalog = self.catalog(tx, context);
        let ours = rows::recorded_row(&mut catalog, &config.name()).await?;
        rows::check_names_free(&mut catalog, entry, ours.is_some()).await?;
        Ok(Plan { entry, table, row })
    }

    /// The recorded table and record of capture `name`, if installed.
    async fn recorded(
        &self,
        tx: &mut Transaction<'static, Sqlite>,
        name: &Identifier,
        context: &str,
    ) -> Result<Option<(String, Option<CaptureRecord>)>, CaptureError> {
        rows::recorded_row(&mut self.catalog(tx, context), name).await
    }

    /// The captures of this outbox table over `conn`, `context` naming the command.
    fn catalog<'c>(&'c self, conn: &'c mut SqliteConnection, context: &'c str) -> Catalog<'c> {
        Catalog {
            capture: self,
            conn,
            context,
        }
    }

    /// Installs one checked capture: drops its old triggers (also on a table it captured
    /// before), creates one per op, records it.
    async fn apply(
        &self,
        tx: &mut Transaction<'static, Sqlite>,
        plan: &Plan<'_>,
    ) -> Result<String, CaptureError> {
        let config = plan.entry.config;
        let name = config.name();
        let table = &plan.table;
        let context = format!("installing capture `{name}` on {table}");
        let mut catalog = self.catalog(tx, &context);
        let before = rows::recorded_row(&mut catalog, &name).await?;
        rows::drop_triggers(&mut catalog, &name).await?;
        let named = trigger_identifiers(
            config,
            [("captured_table", table), ("outbox_table", &self.outbox)],
        );
        let mut triggers = Vec::new();
        for op in config.ops() {
            let sql =
                TRIGGER_SQL.render(plan.entry, op, table.as_str(), plan.row.as_deref(), &named)?;
            let trigger = op_trigger_name(&name, op);
            tx.execute(sqlx::AssertSqlSafe(sql))
                .await
                .map_err(db(format!("{context}: creating trigger {trigger}")))?;
            triggers.push(trigger);
        }
        let record = CaptureRecord::new(self.outbox.to_string(), config).to_json();
        sqlx::query(self.record_sql(RECORD_UPSERT))
            .bind(name.as_str())
            .bind(table.as_str())
            .bind(record)
            .bind(crate::timestamp::to_micros(time::OffsetDateTime::now_utc()))
            .execute(&mut **tx)
            .await
            .map_err(db(format!("{context}: recording it")))?;
        let before = before.as_ref().map(|(t, _)| t.as_str());
        let outbox = self.outbox.as_str();
        let line = rows::installed_line(config, before, &triggers, table.as_str(), outbox);
        Ok(line)
    }

    /// Removes the captures named `names`, all in one transaction.
    pub async fn remove(&self, names: &[Identifier]) -> Result<Vec<String>, CaptureError> {
        let context = format!("removing captures from outbox table {}", self.outbox);
        let mut tx = self.begin(&context).await?;
        let lines = rows::remove(&mut self.catalog(&mut tx, &context), names).await?;
        tx.commit().await.map_err(db(&context))?;
        Ok(lines)
    }

    /// The captures recorded for this outbox table, by name, with the triggers present.
    pub async fn list(&self) -> Result<Vec<InstalledCapture>, CaptureError> {
        let context = format!("listing captures into outbox table {}", self.outbox);
        let mut conn = self.pool.acquire().await.map_err(db(&context))?;
        rows::list(&mut self.catalog(&mut conn, &context)).await
    }
}

/// This outbox table's captures over one connection: the SQLite side of [`RowCatalog`].
struct Catalog<'c> {
    capture: &'c SqliteCapture,
    conn: &'c mut SqliteConnection,
    /// What the command does, for error messages.
    context: &'c str,
}

impl RowCatalog for Catalog<'_> {
    fn outbox(&self) -> &str {
        self.capture.outbox.as_str()
    }

    async fn has_records(&mut self) -> Result<bool, CaptureError> {
        let kind: Option<String> = sqlx::query_scalar(TABLE_KIND)
            .bind(format!("{}_capture", self.capture.outbox))
            .fetch_optional(&mut *self.conn)
            .await
            .map_err(db(self.context))?;
        Ok(kind.as_deref() == Some("table"))
    }

    async fn record(
        &mut self,
        name: &Identifier,
    ) -> Result<Option<(String, String)>, CaptureError> {
        let read = sqlx::query_as(self.capture.record_sql(RECORD_READ)).bind(name.as_str());
        read.fetch_optional(&mut *self.conn)
            .await
            .map_err(db(self.context))
    }

    async fn records(&mut self) -> Result<Vec<(String, String)>, CaptureError> {
        let all = sqlx::query_as(self.capture.record_sql(RECORD_LIST));
        all.fetch_all(&mut *self.conn)
            .await
            .map_err(db(self.context))
    }

    async fn trigger_table(&mut self, trigger: &str) -> Result<Option<String>, CaptureError> {
        let on = sqlx::query_scalar(TRIGGER_OF).bind(trigger);
        on.fetch_optional(&mut *self.conn)
            .await
            .map_err(db(self.context))
    }

    async fn execute(&mut self, sql: String, what: &str) -> Result<(), CaptureError> {
        let what = format!("{}: {what}", self.context);
        let sql = sqlx::AssertSqlSafe(sql);
        self.conn.execute(sql).await.map_err(db(what))?;
        Ok(())
    }

    async fn delete_record(&mut self, name: &Identifier) -> Result<(), CaptureError> {
        let delete = sqlx::query(self.capture.record_sql(RECORD_DELETE)).bind(name.as_str());
        delete
            .execute(&mut *self.conn)
            .await
            .map_err(db(self.context))?;
        Ok(())
    }
}

/// Declared types whose values a payload column may hold: TEXT or BLOB affinity (SQLite's
/// rules: CHAR, CLOB, TEXT; BLOB or no type), or a JSON column.
fn payload_type_ok(declared: &str) -> bool {
    let t = declared.to_ascii_uppercase();
    if t.contains("INT") {
        return false;
    }
    t.is_empty()
        || ["CHAR", "CLOB", "TEXT", "BLOB", "JSON"]
            .iter()
            .any(|k| t.contains(k))
}

fn db(context: impl Into<String>) -> impl FnOnce(sqlx::Error) -> CaptureError {
    CaptureError::database(context)
}

outbox_core::impl_capture!(SqliteCapture, snapshot);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payload_types_follow_sqlite_affinity() {
        for ok in ["TEXT", "varchar(20)", "JSON", "BLOB", "", "clob"] {
            assert!(payload_type_ok(ok), "{ok}");
        }
        for bad in ["INTEGER", "REAL", "NUMERIC", "bigint", "DOUBLE"] {
            assert!(!payload_type_ok(bad), "{bad}");
        }
    }
}
