//! `outbox capture` on MySQL and MariaDB (docs/capture.md): a business table as an event
//! source, through `AFTER INSERT` / `AFTER UPDATE` triggers that write each captured row's
//! event into the outbox table in the writer's own transaction.
//!
//! Per capture, named after its `name`:
//! - one trigger per captured write, `<name>_outbox_capture_insert` and
//!   `<name>_outbox_capture_update` ([queries/capture_trigger.sql](../queries/capture_trigger.sql)),
//!   whose `INSERT INTO outbox` fires the outbox's own `BEFORE INSERT` trigger: the event gets
//!   its UUIDv7 and its per-aggregate `seq` exactly as a producer's row does (the head row's
//!   lock serializes one aggregate's writers until commit);
//! - a row of `<outbox>_capture` recording the entry (MySQL triggers have no comments).
//!
//! MySQL commits every `CREATE TRIGGER` / `DROP TRIGGER` on its own, so an install cannot be
//! one transaction. It is all-or-nothing as far as it can be: every entry is checked before
//! anything changes; one install or remove runs at a time (`GET_LOCK`); a capture's triggers
//! are replaced under `LOCK TABLES ... WRITE`, so no writer commits in between; and on any
//! failure the triggers this run created are dropped and the ones it replaced are put back
//! (from `SHOW CREATE TRIGGER`). Names reach SQL only as validated, backquoted identifiers;
//! texts only as literals of [`Dialect::MySql`].

use outbox_core::Identifier;
use outbox_core::capture::{
    CaptureEntry, CaptureError, CaptureOp, CaptureRecord, Dialect, InstalledCapture, OpTrigger,
    TableColumn, check_columns, check_entries, install_line, op_trigger_name, payload_type_error,
    recorded, row_object,
};
use sqlx::pool::PoolConnection;
use sqlx::{Executor, MySql, MySqlPool};

use crate::config::MySqlConfig;

mod snapshot;

const TRIGGER: &str = include_str!("../queries/capture_trigger.sql");
const RECORD_TABLE: &str = include_str!("../queries/capture_record_table.sql");
const RECORD_UPSERT: &str = "INSERT INTO {{name:_capture}} (name, table_name, record) VALUES (?, ?, ?) \
     ON DUPLICATE KEY UPDATE table_name = VALUES(table_name), record = VALUES(record), installed_at = CURRENT_TIMESTAMP(6)";
const RECORD_READ: &str = "SELECT table_name, record FROM {{name:_capture}} WHERE name = ?";
const RECORD_DELETE: &str = "DELETE FROM {{name:_capture}} WHERE name = ?";
const RECORD_LIST: &str = "SELECT name, record FROM {{name:_capture}} ORDER BY name";
const TABLE_KIND: &str = "SELECT CAST(TABLE_TYPE AS CHAR) FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ?";
const COLUMNS: &str = "SELECT CAST(COLUMN_NAME AS CHAR), CAST(COLUMN_TYPE AS CHAR), CAST(DATA_TYPE AS CHAR) FROM information_schema.COLUMNS \
     WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ? ORDER BY ORDINAL_POSITION";
const TRIGGER_OF: &str = "SELECT CAST(EVENT_OBJECT_TABLE AS CHAR) FROM information_schema.TRIGGERS WHERE TRIGGER_SCHEMA = DATABASE() AND TRIGGER_NAME = ?";

/// How long install and remove wait for a table's metadata lock: `LOCK TABLES` and
/// `CREATE TRIGGER` wait for the transactions using the table, and later writers wait behind
/// them.
const LOCK_WAIT_SECONDS: u32 = 10;

/// Payload column types (`DATA_TYPE`) given as text in UTF-8, and as bytes.
const TEXT_TYPES: [&str; 7] = [
    "json",
    "char",
    "varchar",
    "tinytext",
    "text",
    "mediumtext",
    "longtext",
];
const BINARY_TYPES: [&str; 6] = [
    "binary",
    "varbinary",
    "tinyblob",
    "blob",
    "mediumblob",
    "longblob",
];

fn backquote(sql: String) -> String {
    sql.replace('"', "`")
}

/// The trigger of one capture for one op: a NULL that cannot become an event fails the
/// write (`SIGNAL`, whose message must be a plain literal: the table name has no backslash);
/// a column event type as text; a text payload column converted to UTF-8 (a binary one is
/// `@PAYLOAD_BYTES@`, see [`payload_sql`]).
const TRIGGER_SQL: OpTrigger<'static> = OpTrigger {
    dialect: Dialect::MySql,
    template: TRIGGER,
    trigger_prefix: "",
    checks: [
        "    IF NEW.{{aggregate_id}} IS NULL THEN SIGNAL SQLSTATE '23000' SET MESSAGE_TEXT = @NULL_AGGREGATE_ID@; END IF;\n",
        "    IF NEW.{{event_type_column}} IS NULL THEN SIGNAL SQLSTATE '23000' SET MESSAGE_TEXT = @NULL_EVENT_TYPE@; END IF;\n",
        "    IF NEW.{{payload_column}} IS NULL THEN SIGNAL SQLSTATE '23000' SET MESSAGE_TEXT = @NULL_PAYLOAD@; END IF;\n",
    ],
    event_type_column: "CAST(NEW.{{event_type_column}} AS CHAR)",
    payload_column: "CONVERT(NEW.{{payload_column}} USING utf8mb4)",
    quote: backquote,
};

/// Captures writing into one outbox table, in the URL's database.
#[derive(Debug, Clone)]
pub struct MySqlCapture {
    pool: MySqlPool,
    outbox: Identifier,
    database: String,
}

/// One entry, checked: what to install.
#[derive(Debug)]
struct Plan<'a> {
    entry: CaptureEntry<'a>,
    table: Identifier,
    /// The row payload's `JSON_OBJECT(...)`, or `None` for a payload column.
    row: Option<String>,
    /// The payload column holds bytes (given as they are).
    binary: bool,
}

/// A trigger as it was before this run replaced it, to put back on failure.
struct Saved {
    trigger: String,
    create: Option<String>,
}

impl MySqlCapture {
    /// Captures into the outbox table of `config`, over `pool`.
    pub fn new(pool: MySqlPool, config: &MySqlConfig) -> Self {
        Self {
            pool,
            outbox: config.table.clone(),
            database: config.url.redacted(),
        }
    }

    fn sql(&self, template: &str) -> sqlx::AssertSqlSafe<String> {
        sqlx::AssertSqlSafe(crate::sql::render(template, &self.outbox))
    }

    /// A connection holding the capture lock of this outbox table (one install or remove at
    /// a time) and waiting at most [`LOCK_WAIT_SECONDS`] for table locks.
    async fn locked(&self, context: &str) -> Result<PoolConnection<MySql>, CaptureError> {
        let mut conn = self.pool.acquire().await.map_err(db(context))?;
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "SET SESSION lock_wait_timeout = {LOCK_WAIT_SECONDS}"
        )))
        .execute(&mut *conn)
        .await
        .map_err(db(context))?;
        // Lock names are limited to 64 characters: the database and table as a SHA-1.
        let got: Option<i64> = sqlx::query_scalar(
            "SELECT GET_LOCK(CONCAT('outbox capture ', SHA1(CONCAT(DATABASE(), '.', ?))), ?)",
        )
        .bind(self.outbox.as_str())
        .bind(LOCK_WAIT_SECONDS)
        .fetch_one(&mut *conn)
        .await
        .map_err(db(context))?;
        if got != Some(1) {
            return Err(CaptureError::Database {
                context: format!(
                    "{context}: another `outbox capture install` or `remove` is running (its lock was not granted within {LOCK_WAIT_SECONDS}s); nothing was changed, run it again"
                ),
                source: "GET_LOCK timed out".into(),
            });
        }
        Ok(conn)
    }

    /// Ends the table locks and the capture lock before the connection goes back to the
    /// pool. Best effort: both are the session's, and end with it.
    async fn unlock(&self, conn: &mut PoolConnection<MySql>) {
        let _ = conn.execute("UNLOCK TABLES").await;
        let _ = sqlx::query(
            "DO RELEASE_LOCK(CONCAT('outbox capture ', SHA1(CONCAT(DATABASE(), '.', ?))))",
        )
        .bind(self.outbox.as_str())
        .execute(&mut **conn)
        .await;
    }

    async fn kind(
        conn: &mut PoolConnection<MySql>,
        name: &str,
        context: &str,
    ) -> Result<Option<String>, CaptureError> {
        sqlx::query_scalar(TABLE_KIND)
            .bind(name)
            .fetch_optional(&mut **conn)
            .await
            .map_err(db(context))
    }

    /// Installs or replaces the captures of `entries`: all, or (as far as MySQL allows)
    /// none.
    pub async fn install(&self, entries: &[CaptureEntry<'_>]) -> Result<Vec<String>, CaptureError> {
        let context = format!("installing captures into outbox table {}", self.outbox);
        check_entries(entries)?;
        let mut conn = self.locked(&context).await?;
        let result = self.install_locked(&mut conn, entries, &context).await;
        self.unlock(&mut conn).await;
        result
    }

    async fn install_locked(
        &self,
        conn: &mut PoolConnection<MySql>,
        entries: &[CaptureEntry<'_>],
        context: &str,
    ) -> Result<Vec<String>, CaptureError> {
        if Self::kind(conn, self.outbox.as_str(), context)
            .await?
            .is_none()
        {
            return Err(CaptureError::NotMigrated {
                table: self.outbox.to_string(),
                database: self.database.clone(),
            });
        }
        let mut plans = Vec::with_capacity(entries.len());
        for entry in entries {
            plans.push(self.check(conn, *entry, context).await?);
        }
        conn.execute(self.sql(RECORD_TABLE))
            .await
            .map_err(db(context))?;
        let mut saved: Vec<Saved> = Vec::new();
        let mut lines = Vec::with_capacity(plans.len());
        let mut applied = Ok(());
        for plan in &plans {
            match self.apply(conn, plan, &mut saved, context).await {
                Ok(line) => lines.push(line),
                Err(e) => {
                    applied = Err(e);
                    break;
                }
            }
        }
        if applied.is_ok() {
            applied = self.record(conn, &plans, context).await;
        }
        if let Err(e) = applied {
            let _ = conn.execute("UNLOCK TABLES").await;
            self.undo(conn, &saved).await;
            return Err(e);
        }
        Ok(lines)
    }

    /// Records every installed entry, in one transaction.
    async fn record(
        &self,
        conn: &mut PoolConnection<MySql>,
        plans: &[Plan<'_>],
        context: &str,
    ) -> Result<(), CaptureError> {
        let mut tx = sqlx::Connection::begin(&mut **conn)
            .await
            .map_err(db(context))?;
        for plan in plans {
            let config = plan.entry.config;
            sqlx::query(self.sql(RECORD_UPSERT))
                .bind(config.name().as_str())
                .bind(plan.table.as_str())
                .bind(CaptureRecord::new(self.outbox.to_string(), config).to_json())
                .execute(&mut *tx)
                .await
                .map_err(db(format!("{context}: recording it")))?;
        }
        tx.commit().await.map_err(db(context))
    }

    /// Puts the triggers this run changed back as they were: drops the new ones, recreates
    /// the replaced ones. Best effort: a failure here is logged, the original error stands.
    async fn undo(&self, conn: &mut PoolConnection<MySql>, saved: &[Saved]) {
        for s in saved.iter().rev() {
            let drop = format!("DROP TRIGGER IF EXISTS `{}`", s.trigger);
            if let Err(e) = conn.execute(sqlx::AssertSqlSafe(drop)).await {
                tracing::error!(trigger = %s.trigger, error = %e, "undoing a failed capture install: dropping the trigger failed");
            }
            if let Some(create) = &s.create
                && let Err(e) = conn.execute(sqlx::AssertSqlSafe(create.clone())).await
            {
                tracing::error!(trigger = %s.trigger, error = %e, "undoing a failed capture install: restoring the trigger failed");
            }
        }
    }

    /// Checks one entry: the table (in the outbox's database), its columns, the payload
    /// column's type, and that the trigger names are free or this capture's own.
    async fn check<'a>(
        &self,
        conn: &mut PoolConnection<MySql>,
        entry: CaptureEntry<'a>,
        context: &str,
    ) -> Result<Plan<'a>, CaptureError> {
        let config = entry.config;
        let database: String = sqlx::query_scalar("SELECT CAST(DATABASE() AS CHAR)")
            .fetch_one(&mut **conn)
            .await
            .map_err(db(context))?;
        if let Some(schema) = &config.table.schema
            && schema.as_str() != database
        {
            return Err(CaptureError::invalid(
                entry.key("table"),
                format!(
                    "`{}`: MySQL captures tables of the outbox's own database ({database}) only; name the table alone",
                    config.table
                ),
            ));
        }
        let table = config.table.table.clone();
        match Self::kind(conn, table.as_str(), context).await?.as_deref() {
            None => {
                return Err(CaptureError::invalid(
                    entry.key("table"),
                    format!("table {table} does not exist in {}", self.database),
                ));
            }
            Some("BASE TABLE") if table == self.outbox => {
                return Err(CaptureError::invalid(
                    entry.key("table"),
                    format!("{table} is the outbox table itself; capture a business table instead"),
                ));
            }
            Some("BASE TABLE") => {}
            Some(kind) => {
                return Err(CaptureError::invalid(
                    entry.key("table"),
                    format!(
                        "{table} is a {}, not a table: only a table's writes can be captured",
                        kind.to_lowercase()
                    ),
                ));
            }
        }
        let found: Vec<(String, String, String)> = sqlx::query_as(COLUMNS)
            .bind(table.as_str())
            .fetch_all(&mut **conn)
            .await
            .map_err(db(context))?;
        let columns: Vec<TableColumn> = found
            .iter()
            .map(|(name, ty, _)| TableColumn {
                name: name.clone(),
                type_name: ty.clone(),
            })
            .collect();
        let data_type = |name: &str| {
            found
                .iter()
                .find(|(n, _, _)| n == name)
                .map(|(_, _, t)| t.to_ascii_lowercase())
                .unwrap_or_default()
        };
        let (row, binary) = match check_columns(entry, table.as_str(), &columns)? {
            Some(c) if BINARY_TYPES.contains(&data_type(&c.name).as_str()) => (None, true),
            Some(c) if TEXT_TYPES.contains(&data_type(&c.name).as_str()) => (None, false),
            Some(c) => {
                return Err(payload_type_error(
                    entry,
                    table.as_str(),
                    c,
                    "json, a text type (char, varchar, text, ...) or a binary type (binary, varbinary, blob, ...)",
                ));
            }
            // Binary columns as hex text (JSON holds no bytes); the rest as JSON_OBJECT
            // gives them (numbers, strings, a json column as JSON).
            None => (
                Some(row_object(
                    Dialect::MySql,
                    "JSON_OBJECT",
                    entry,
                    table.as_str(),
                    &columns,
                    |c, col| {
                        if BINARY_TYPES.contains(&data_type(&c.name).as_str()) {
                            format!("HEX({col})")
                        } else {
                            col.to_owned()
                        }
                    },
                )?),
                false,
            ),
        };
        let name = config.name();
        let ours = self.recorded(conn, &name, context).await?;
        for op in [CaptureOp::Insert, CaptureOp::Update] {
            let trigger = op_trigger_name(&name, op);
            let on: Option<String> = sqlx::query_scalar(TRIGGER_OF)
                .bind(&trigger)
                .fetch_optional(&mut **conn)
                .await
                .map_err(db(context))?;
            if on.is_some() && ours.is_none() {
                return Err(recorded::name_clash(entry, &trigger, self.outbox.as_str()));
            }
        }
        Ok(Plan {
            entry,
            table,
            row,
            binary,
        })
    }

    /// The recorded table and record of capture `name`, if installed.
    async fn recorded(
        &self,
        conn: &mut PoolConnection<MySql>,
        name: &Identifier,
        context: &str,
    ) -> Result<Option<(String, Option<CaptureRecord>)>, CaptureError> {
        if Self::kind(conn, &format!("{}_capture", self.outbox), context)
            .await?
            .is_none()
        {
            return Ok(None);
        }
        let row: Option<(String, String)> = sqlx::query_as(self.sql(RECORD_READ))
            .bind(name.as_str())
            .fetch_optional(&mut **conn)
            .await
            .map_err(db(context))?;
        Ok(row.map(|(table, record)| (table, CaptureRecord::parse(Some(&record)))))
    }

    /// `SHOW CREATE TRIGGER` of `trigger`, if it exists.
    async fn create_statement(
        conn: &mut PoolConnection<MySql>,
        trigger: &str,
        context: &str,
    ) -> Result<Option<String>, CaptureError> {
        let exists: Option<String> = sqlx::query_scalar(TRIGGER_OF)
            .bind(trigger)
            .fetch_optional(&mut **conn)
            .await
            .map_err(db(context))?;
        if exists.is_none() {
            return Ok(None);
        }
        // A trigger name read from the catalog and equal to one built from a validated
        // identifier: safe to backquote.
        let row = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SHOW CREATE TRIGGER `{trigger}`"
        )))
        .fetch_one(&mut **conn)
        .await
        .map_err(db(context))?;
        let create: String = sqlx::Row::try_get(&row, 2).map_err(db(context))?;
        Ok(Some(create))
    }

    /// Replaces one capture's triggers under `LOCK TABLES ... WRITE` (no writer commits
    /// between the drop and the create), remembering in `saved` what it changed.
    async fn apply(
        &self,
        conn: &mut PoolConnection<MySql>,
        plan: &Plan<'_>,
        saved: &mut Vec<Saved>,
        context: &str,
    ) -> Result<String, CaptureError> {
        let config = plan.entry.config;
        let name = config.name();
        let table = &plan.table;
        let context = format!("{context}: capture `{name}` on {table}");
        let before = self.recorded(conn, &name, &context).await?;
        let mut old = Vec::new();
        for op in [CaptureOp::Insert, CaptureOp::Update] {
            let trigger = op_trigger_name(&name, op);
            let create = Self::create_statement(conn, &trigger, &context).await?;
            old.push(Saved { trigger, create });
        }
        // Every table holding one of the triggers, and the new one.
        let mut locked = vec![table.clone()];
        if let Some((t, _)) = &before
            && t != table.as_str()
            && let Ok(t) = Identifier::new(t.as_str())
        {
            locked.push(t);
        }
        let lock = format!(
            "LOCK TABLES {}",
            locked
                .iter()
                .map(|t| format!("`{t}` WRITE"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        conn.execute(sqlx::AssertSqlSafe(lock))
            .await
            .map_err(lock_or_db(format!("{context}: locking the table")))?;
        let mut named: Vec<(&str, &Identifier)> = vec![
            ("captured_table", table),
            ("outbox_table", &self.outbox),
            ("aggregate_id", &config.aggregate_id),
        ];
        if let Some(c) = &config.event_type_column {
            named.push(("event_type_column", c));
        }
        if let Some(c) = config.payload.column() {
            named.push(("payload_column", c));
        }
        let mut spec = TRIGGER_SQL;
        if plan.binary {
            spec.payload_column = "NEW.{{payload_column}}";
        }
        // From here on every trigger of this capture is in `saved`: undo puts them back.
        saved.extend(old);
        for op in [CaptureOp::Insert, CaptureOp::Update] {
            let sql = backquote(recorded::drop_trigger(&name, op));
            conn.execute(sqlx::AssertSqlSafe(sql))
                .await
                .map_err(db(format!("{context}: dropping the old trigger")))?;
        }
        let mut triggers = Vec::new();
        for op in config.ops() {
            let sql = spec.render(plan.entry, op, table.as_str(), plan.row.as_deref(), &named)?;
            let trigger = op_trigger_name(&name, op);
            conn.execute(sqlx::AssertSqlSafe(sql))
                .await
                .map_err(db(format!("{context}: creating trigger {trigger}")))?;
            triggers.push(trigger);
        }
        conn.execute("UNLOCK TABLES").await.map_err(db(&context))?;
        let mut line = install_line(
            config,
            before.is_some(),
            &triggers.join(", "),
            table.as_str(),
            self.outbox.as_str(),
        );
        line.push_str(&recorded::moved(
            before.as_ref().map(|(t, _)| t.as_str()),
            table.as_str(),
        ));
        Ok(line)
    }

    /// Removes the captures named `names`, one after the other (each capture's triggers,
    /// then its record).
    pub async fn remove(&self, names: &[Identifier]) -> Result<Vec<String>, CaptureError> {
        let context = format!("removing captures from outbox table {}", self.outbox);
        let mut conn = self.locked(&context).await?;
        let result = self.remove_locked(&mut conn, names, &context).await;
        self.unlock(&mut conn).await;
        result
    }

    async fn remove_locked(
        &self,
        conn: &mut PoolConnection<MySql>,
        names: &[Identifier],
        context: &str,
    ) -> Result<Vec<String>, CaptureError> {
        let mut lines = Vec::with_capacity(names.len());
        for name in names {
            let Some((table, _)) = self.recorded(conn, name, context).await? else {
                lines.push(recorded::removed_line(name, None, self.outbox.as_str()));
                continue;
            };
            for op in [CaptureOp::Insert, CaptureOp::Update] {
                let sql = backquote(recorded::drop_trigger(name, op));
                conn.execute(sqlx::AssertSqlSafe(sql))
                    .await
                    .map_err(lock_or_db(format!(
                        "{context}: dropping trigger {}",
                        op_trigger_name(name, op)
                    )))?;
            }
            sqlx::query(self.sql(RECORD_DELETE))
                .bind(name.as_str())
                .execute(&mut **conn)
                .await
                .map_err(db(context))?;
            lines.push(recorded::removed_line(
                name,
                Some(&table),
                self.outbox.as_str(),
            ));
        }
        Ok(lines)
    }

    /// The captures recorded for this outbox table, by name, with the triggers present.
    pub async fn list(&self) -> Result<Vec<InstalledCapture>, CaptureError> {
        let context = format!("listing captures into outbox table {}", self.outbox);
        let mut conn = self.pool.acquire().await.map_err(db(&context))?;
        if Self::kind(&mut conn, &format!("{}_capture", self.outbox), &context)
            .await?
            .is_none()
        {
            return Ok(Vec::new());
        }
        let rows: Vec<(String, String)> = sqlx::query_as(self.sql(RECORD_LIST))
            .fetch_all(&mut *conn)
            .await
            .map_err(db(&context))?;
        let mut out = Vec::with_capacity(rows.len());
        for (name, record) in rows {
            let mut found = Vec::new();
            for op in [CaptureOp::Insert, CaptureOp::Update] {
                let table: Option<String> = sqlx::query_scalar(TRIGGER_OF)
                    .bind(format!("{name}{}", op.trigger_suffix()))
                    .fetch_optional(&mut *conn)
                    .await
                    .map_err(db(&context))?;
                found.extend(table.map(|t| (op, t)));
            }
            out.push(recorded::installed(
                self.outbox.as_str(),
                name,
                &record,
                &found,
            ));
        }
        Ok(out)
    }
}

fn db(context: impl Into<String>) -> impl FnOnce(sqlx::Error) -> CaptureError {
    CaptureError::database(context)
}

/// [`db`], saying so when the statement gave up waiting for a table's metadata lock
/// (`ER_LOCK_WAIT_TIMEOUT`, 1205).
fn lock_or_db(context: String) -> impl FnOnce(sqlx::Error) -> CaptureError {
    move |e| {
        let lock =
            matches!(&e, sqlx::Error::Database(d) if d.message().contains("Lock wait timeout"));
        let context = if lock {
            format!(
                "{context}: the table's lock was not granted within {LOCK_WAIT_SECONDS}s (a long transaction uses the table); nothing was changed, run it again"
            )
        } else {
            context
        };
        CaptureError::database(context)(e)
    }
}

outbox_core::impl_capture!(MySqlCapture, snapshot);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_trigger_renders_backquoted_with_literals_last() {
        let config: outbox_core::capture::CaptureConfig = toml::from_str(
            "table = \"bookings\"\naggregate_type = \"a'@OP@\\\\\"\naggregate_id = \"customer_id\"\nevent_type_column = \"status\"\npayload = \"doc\"",
        )
        .expect("valid");
        let entry = CaptureEntry {
            index: 0,
            config: &config,
        };
        let id = |s: &str| Identifier::new(s).expect("valid");
        let (table, outbox, agg, et, pay) = (
            id("bookings"),
            id("outbox"),
            id("customer_id"),
            id("status"),
            id("doc"),
        );
        let named: Vec<(&str, &Identifier)> = vec![
            ("captured_table", &table),
            ("outbox_table", &outbox),
            ("aggregate_id", &agg),
            ("event_type_column", &et),
            ("payload_column", &pay),
        ];
        let sql = TRIGGER_SQL
            .render(entry, CaptureOp::Update, "bookings", None, &named)
            .expect("renders");
        let body = &sql[sql.find("CREATE TRIGGER").expect("create")..];
        assert!(!body.contains("{{") && !body.contains('"'), "{body}");
        assert!(body.contains(
            "CREATE TRIGGER `bookings_outbox_capture_update` AFTER UPDATE ON `bookings` FOR EACH ROW"
        ));
        // The aggregate type has a backslash: hex, so `@OP@` inside it stays as it is.
        assert!(
            body.contains("VALUES (CONVERT(X'6127404F50405C' USING utf8mb4)"),
            "{body}"
        );
        assert!(body.contains("CAST(NEW.`status` AS CHAR)"));
        assert!(body.contains("'capture_op', 'update'"));
    }
}
