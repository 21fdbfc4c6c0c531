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
use outbox_core::capture::rows;
use outbox_core::capture::{
    CaptureEntry, CaptureError, Dialect, InstalledCapture, OpTrigger, check_entries,
};
use sqlx::{Executor, MySql, MySqlConnection, MySqlPool};

use crate::config::MySqlConfig;

mod apply;
mod catalog;
mod check;
mod lock;
mod snapshot;

use check::Plan;

const TRIGGER: &str = include_str!("../../queries/capture_trigger.sql");
const RECORD_TABLE: &str = include_str!("../../queries/capture_record_table.sql");
const RECORD_UPSERT: &str = "INSERT INTO {{name:_capture}} (name, table_name, record) VALUES (?, ?, ?) \
     ON DUPLICATE KEY UPDATE table_name = VALUES(table_name), record = VALUES(record), installed_at = CURRENT_TIMESTAMP(6)";
const RECORD_READ: &str = "SELECT table_name, record FROM {{name:_capture}} WHERE name = ?";
const RECORD_DELETE: &str = "DELETE FROM {{name:_capture}} WHERE name = ?";
const RECORD_LIST: &str = "SELECT name, record FROM {{name:_capture}} ORDER BY name";
const TABLE_KIND: &str = "SELECT CAST(TABLE_TYPE AS CHAR) FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ?";
const COLUMNS: &str = "SELECT CAST(COLUMN_NAME AS CHAR), CAST(COLUMN_TYPE AS CHAR), CAST(DATA_TYPE AS CHAR) FROM information_schema.COLUMNS \
     WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ? ORDER BY ORDINAL_POSITION";
const TRIGGER_OF: &str = "SELECT CAST(EVENT_OBJECT_TABLE AS CHAR) FROM information_schema.TRIGGERS WHERE TRIGGER_SCHEMA = DATABASE() AND TRIGGER_NAME = ?";

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

    /// The `TABLE_TYPE` of table `name` in the outbox's database, if it exists.
    async fn kind(
        conn: &mut MySqlConnection,
        name: &str,
        context: &str,
    ) -> Result<Option<String>, CaptureError> {
        sqlx::query_scalar(TABLE_KIND)
            .bind(name)
            .fetch_optional(conn)
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
        conn: &mut sqlx::pool::PoolConnection<MySql>,
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
        let mut saved: Vec<apply::Saved> = Vec::new();
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
        conn: &mut MySqlConnection,
        names: &[Identifier],
        context: &str,
    ) -> Result<Vec<String>, CaptureError> {
        rows::remove(&mut self.catalog(conn, context), names).await
    }

    /// The captures recorded for this outbox table, by name, with the triggers present.
    pub async fn list(&self) -> Result<Vec<InstalledCapture>, CaptureError> {
        let context = format!("listing captures into outbox table {}", self.outbox);
        let mut conn = self.pool.acquire().await.map_err(db(&context))?;
        rows::list(&mut self.catalog(&mut conn, &context)).await
    }
}

fn db(context: impl Into<String>) -> impl FnOnce(sqlx::Error) -> CaptureError {
    CaptureError::database(context)
}

outbox_core::impl_capture!(MySqlCapture, snapshot);

#[cfg(test)]
mod tests {
    use outbox_core::capture::CaptureOp;

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
