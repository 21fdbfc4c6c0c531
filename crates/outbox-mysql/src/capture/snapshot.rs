//! `outbox capture snapshot` on MySQL and MariaDB (docs/capture.md, "Snapshot"): the rows
//! already in a captured table become events, one chunk per transaction, in primary-key
//! order, driven by [`Chunked`].
//!
//! A chunk locks the capture's row of `<outbox>_capture_snapshots` (`FOR UPDATE`), reads the
//! next rows `LOCK IN SHARE MODE` as their events' columns, through the capture trigger's
//! own expressions (the table is aliased `NEW`;
//! [queries/capture_snapshot_rows.sql](../../queries/capture_snapshot_rows.sql)), inserts
//! those events in one multi-row `INSERT ... VALUES`
//! ([queries/capture_snapshot_chunk.sql](../../queries/capture_snapshot_chunk.sql)), and
//! records the chunk's last key, all in one transaction. The
//! outbox's `BEFORE INSERT` trigger numbers each event from its aggregate's head row, whose
//! lock is held to the commit: per aggregate, `seq` order is commit order, and the share
//! lock puts every live change of a read row before the read or after the commit.
//!
//! The key is kept as text: an integer key in decimal (bound back through `CAST(? AS
//! SIGNED|UNSIGNED)`, exact for 64 bits), a character key as it is (a bound string takes the
//! column's collation, so `>` is the column's own order), a binary key in hex. Other key
//! types are refused.

use outbox_core::capture::recorded::check_recorded;
use outbox_core::capture::snapshot::{
    Chunked, Recorded, entry_names, resume_or_begin, single_key, starting,
};
use outbox_core::capture::{CaptureEntry, CaptureError, Dialect, splice_literals};
use outbox_core::migration::render_sql;
use outbox_sql::snapshot::{SnapshotDb, SqlSnapshot, check_triggers};
use sqlx::pool::PoolConnection;
use sqlx::{Executor, MySql, MySqlPool, Transaction};

use super::{MySqlCapture, Plan, TRIGGER_OF, TRIGGER_SQL, db};
use crate::sql::render;

const TABLE: &str = include_str!("../../queries/capture_snapshots_table.sql");
const STATE: &str = include_str!("../../queries/capture_snapshot_state.sql");
const BEGIN: &str = include_str!("../../queries/capture_snapshot_begin.sql");
const LOCK: &str = include_str!("../../queries/capture_snapshot_lock.sql");
const ROWS: &str = include_str!("../../queries/capture_snapshot_rows.sql");
const CHUNK: &str = include_str!("../../queries/capture_snapshot_chunk.sql");
const ADVANCE: &str = include_str!("../../queries/capture_snapshot_advance.sql");
const COUNT: &str = include_str!("../../queries/capture_snapshot_count.sql");
const KEY_COLUMN: &str = include_str!("../../queries/capture_snapshot_key_column.sql");

/// MySQL's errors a chunk is run again after: a deadlock (1213), a lock wait timeout (1205).
const RETRY_ERRORS: [u16; 2] = [1213, 1205];
/// `Column '...' cannot be null` (1048): a NULL aggregate id, event type or payload.
const NULL_ERROR: u16 = 1048;

/// Integer `DATA_TYPE`s.
const INTEGER_TYPES: [&str; 6] = [
    "tinyint",
    "smallint",
    "mediumint",
    "int",
    "integer",
    "bigint",
];
/// Character `DATA_TYPE`s a primary key can have in full.
const CHAR_TYPES: [&str; 2] = ["char", "varchar"];
/// Binary `DATA_TYPE`s a primary key can have in full.
const BINARY_KEY_TYPES: [&str; 2] = ["binary", "varbinary"];

/// How a key column's value is read as text (`@KEY_TEXT@`) and bound back (`@KEY_BOUND@`).
fn key_sql(data_type: &str, column_type: &str) -> Option<(&'static str, &'static str)> {
    let t = data_type.to_ascii_lowercase();
    if INTEGER_TYPES.contains(&t.as_str()) {
        let bound = if column_type.to_ascii_lowercase().contains("unsigned") {
            "CAST(? AS UNSIGNED)"
        } else {
            "CAST(? AS SIGNED)"
        };
        Some(("CAST(NEW.{{key_column}} AS CHAR)", bound))
    } else if CHAR_TYPES.contains(&t.as_str()) {
        Some(("NEW.{{key_column}}", "?"))
    } else if BINARY_KEY_TYPES.contains(&t.as_str()) {
        Some(("HEX(NEW.{{key_column}})", "UNHEX(?)"))
    } else {
        None
    }
}

/// The chunk statements of one capture's snapshot (see the module docs); `[first chunk,
/// later chunks]` where they differ. The progress row's statements are [`SqlSnapshot`]'s.
pub(crate) struct MySqlSnapshot {
    pool: MySqlPool,
    rows: [String; 2],
    /// The insert up to its `VALUES`, and one row's tuple.
    insert: String,
    tuple: String,
}

impl MySqlCapture {
    /// Checks `entry` and starts its snapshot, or resumes the unfinished one.
    pub(crate) async fn snapshot(
        &self,
        entry: CaptureEntry<'_>,
    ) -> Result<Chunked<SqlSnapshot<MySqlSnapshot>>, CaptureError> {
        let context = starting(entry)?;
        let config = entry.config;
        let name = config.name();
        let mut conn = self.pool.acquire().await.map_err(db(&context))?;
        if Self::kind(&mut conn, self.outbox.as_str(), &context)
            .await?
            .is_none()
        {
            return Err(CaptureError::NotMigrated {
                table: self.outbox.to_string(),
                database: self.database.clone(),
            });
        }
        let plan = self.check(&mut conn, entry, &context).await?;
        self.check_installed(&mut conn, &plan, &context).await?;
        let table = plan.table.as_str().to_owned();
        let columns: Vec<(String, String, String)> = sqlx::query_as(KEY_COLUMN)
            .bind(&table)
            .fetch_all(&mut *conn)
            .await
            .map_err(db(&context))?;
        let names: Vec<String> = columns.iter().map(|(n, _, _)| n.clone()).collect();
        let key = single_key(entry, &table, &names)?;
        let (_, data_type, column_type) = &columns[0];
        let Some((key_text, key_bound)) = key_sql(data_type, column_type) else {
            return Err(CaptureError::invalid(
                entry.key("table"),
                format!(
                    "the primary key {key} of {table} is of type {column_type}: a snapshot follows an integer, CHAR/VARCHAR or BINARY/VARBINARY primary key"
                ),
            ));
        };
        let mut named = entry_names(config, &key);
        named.extend([
            ("captured_table", &plan.table),
            ("outbox_table", &self.outbox),
        ]);
        let after = [
            "TRUE".to_owned(),
            format!("NEW.{{{{key_column}}}} > {key_bound}"),
        ];
        let structure = |template: &str, after: &str| {
            template
                .replace("@AFTER@", after)
                .replace("@KEY_TEXT@", key_text)
                .replace("@KEY_BOUND@", key_bound)
        };
        let statement = |template: &str, after: &str| {
            render_sql(&structure(template, after), None, &self.outbox, &named).replace('"', "`")
        };

        conn.execute(sqlx::AssertSqlSafe(render(TABLE, &self.outbox)))
            .await
            .map_err(db(&context))?;
        let mut tx = sqlx::Connection::begin(&mut *conn)
            .await
            .map_err(db(&context))?;
        let state: Option<(String, String, Option<String>, i64, bool)> =
            sqlx::query_as(sqlx::AssertSqlSafe(render(STATE, &self.outbox)))
                .bind(name.as_str())
                .fetch_optional(&mut *tx)
                .await
                .map_err(db(&context))?;
        let recorded = state.map(Recorded::from);
        let resume = resume_or_begin(recorded, &table, &key, async || {
            sqlx::query(sqlx::AssertSqlSafe(render(BEGIN, &self.outbox)))
                .bind(name.as_str())
                .bind(&table)
                .bind(key.as_str())
                .execute(&mut *tx)
                .await
                .map(drop)
        })
        .await
        .map_err(db(&context))?;
        tx.commit().await.map_err(db(&context))?;
        let mut count = sqlx::query_scalar(sqlx::AssertSqlSafe(statement(
            COUNT,
            &after[usize::from(resume.last_key.is_some())],
        )));
        if let Some(last) = &resume.last_key {
            count = count.bind(last);
        }
        let rows_left: i64 = count
            .fetch_one(&mut *conn)
            .await
            .map_err(db(format!("{context}: counting the rows left")))?;

        let event_type = if config.event_type_column.is_some() {
            TRIGGER_SQL.event_type_column
        } else {
            "@FIXED_EVENT_TYPE@"
        };
        let payload = match (config.payload.column(), plan.binary) {
            (None, _) => "@ROW@",
            (Some(_), true) => "NEW.{{payload_column}}",
            (Some(_), false) => TRIGGER_SQL.payload_column,
        };
        let literals = |rendered: &str| {
            splice_literals(
                Dialect::MySql,
                entry,
                &table,
                None,
                plan.row.as_deref(),
                rendered,
            )
        };
        let rendered = |template: &str, after: &str| {
            statement(
                &template
                    .replace("@EVENT_TYPE@", event_type)
                    .replace("@PAYLOAD@", payload),
                after,
            )
        };
        // Split before the literals go in: the tuple has no name, only `?` and literals.
        let chunk = rendered(CHUNK, "");
        let (insert, tuple) = chunk
            .rsplit_once("VALUES")
            .expect("capture_snapshot_chunk.sql has a VALUES");
        let run = MySqlSnapshot {
            pool: self.pool.clone(),
            rows: [
                literals(&rendered(ROWS, &after[0]))?,
                literals(&rendered(ROWS, &after[1]))?,
            ],
            insert: format!("{insert}VALUES "),
            tuple: literals(tuple.trim())?,
        };
        let start = resume.start(&name, &table, &key, rows_left);
        let (lock, advance) = (render(LOCK, &self.outbox), render(ADVANCE, &self.outbox));
        Ok(Chunked::new(
            start,
            SqlSnapshot::new(&name, lock, advance, run),
        ))
    }

    /// The capture must be installed as configured: recorded with this entry, its triggers
    /// on the table. Otherwise live changes would not follow the snapshot.
    async fn check_installed(
        &self,
        conn: &mut PoolConnection<MySql>,
        plan: &Plan<'_>,
        context: &str,
    ) -> Result<(), CaptureError> {
        let (entry, table) = (plan.entry, plan.table.as_str());
        let name = entry.config.name();
        let recorded = self.recorded(conn, &name, context).await?;
        check_recorded(entry, self.outbox.as_str(), table, recorded)?;
        check_triggers::<MySql>(&mut **conn, entry, table, TRIGGER_OF, context).await
    }
}

/// One read row: its key as text, and its event's aggregate id, event type and payload
/// (NULL ones are inserted as NULL, which the outbox refuses: error 1048).
type EventRow = (String, Option<String>, Option<String>, Option<Vec<u8>>);

/// The server's error number of `e`, if it is one.
fn number(e: &sqlx::Error) -> Option<u16> {
    match e {
        sqlx::Error::Database(d) => d
            .try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
            .map(|m| m.number()),
        _ => None,
    }
}

impl SnapshotDb for MySqlSnapshot {
    type Database = MySql;
    type Key = String;

    async fn begin(&self) -> Result<Transaction<'static, MySql>, sqlx::Error> {
        self.pool.begin().await
    }

    async fn write(
        &self,
        tx: &mut Transaction<'static, MySql>,
        last: Option<&String>,
        limit: u32,
    ) -> Result<(u64, Option<String>), sqlx::Error> {
        let at = usize::from(last.is_some());
        let mut read = sqlx::query_as::<_, EventRow>(sqlx::AssertSqlSafe(self.rows[at].as_str()));
        if let Some(last) = last {
            read = read.bind(last);
        }
        let rows = read.bind(i64::from(limit)).fetch_all(&mut **tx).await?;
        let Some((high, ..)) = rows.last() else {
            return Ok((0, None));
        };
        let tuples = vec![self.tuple.as_str(); rows.len()].join(", ");
        let sql = format!("{}{tuples}", self.insert);
        let mut insert = sqlx::query(sqlx::AssertSqlSafe(sql));
        for (_, aggregate_id, event_type, payload) in &rows {
            insert = insert.bind(aggregate_id).bind(event_type).bind(payload);
        }
        insert.execute(&mut **tx).await?;
        Ok((rows.len() as u64, Some(high.clone())))
    }

    /// A deadlock (an application transaction holding one aggregate's head row wants a row
    /// this chunk share-locked) or a lock wait timeout.
    fn retryable(e: &sqlx::Error) -> bool {
        number(e).is_some_and(|n| RETRY_ERRORS.contains(&n))
    }

    fn null_in_row(e: &sqlx::Error) -> bool {
        number(e) == Some(NULL_ERROR)
    }
}

#[cfg(test)]
mod tests {
    use super::key_sql;

    #[test]
    fn keys_are_read_and_bound_by_type() {
        assert_eq!(
            key_sql("bigint", "bigint(20) unsigned").map(|k| k.1),
            Some("CAST(? AS UNSIGNED)")
        );
        assert_eq!(
            key_sql("INT", "int(11)").map(|k| k.1),
            Some("CAST(? AS SIGNED)")
        );
        assert_eq!(key_sql("varchar", "varchar(20)").map(|k| k.1), Some("?"));
        assert_eq!(
            key_sql("binary", "binary(16)").map(|k| k.1),
            Some("UNHEX(?)")
        );
        assert_eq!(key_sql("decimal", "decimal(10,2)"), None);
    }
}
