//! `outbox capture snapshot` on SQLite (docs/capture.md, "Snapshot"): the rows already in a
//! captured table become events, one chunk per `BEGIN IMMEDIATE` transaction, in primary-key
//! order, driven by [`Chunked`].
//!
//! A chunk holds SQLite's write lock from its first statement to its commit: it reads its
//! progress row, inserts the next rows' events through the capture trigger's own expressions
//! (the table is aliased `NEW`), and records the chunk's last key
//! ([queries/capture_snapshot_chunk.sql](../../queries/capture_snapshot_chunk.sql)). No writer
//! commits in between, so every live change of a row commits before the chunk (its event has
//! a smaller rowid, i.e. `seq`) or after it (a larger one).
//!
//! Tables without a declared primary key (rowid only) are refused: `VACUUM` may renumber the
//! rowids of such a table, so a resumed snapshot could skip or repeat rows.

use outbox_core::capture::recorded::check_recorded;
use outbox_core::capture::snapshot::{
    Chunked, Recorded, entry_names, resume_or_begin, single_key, starting,
};
use outbox_core::capture::{CaptureEntry, CaptureError, splice};
use outbox_core::migration::render_sql;
use outbox_sql::error::has_code;
use outbox_sql::snapshot::{LockedKey, SnapshotDb, SqlSnapshot, check_triggers};
use sqlx::query::Query;
use sqlx::sqlite::{SqliteArguments, SqliteArgumentsBuffer, SqliteRow, SqliteTypeInfo};
use sqlx::{Executor, Row, Sqlite, SqlitePool, Transaction};

use super::{Plan, SqliteCapture, TRIGGER_OF, TRIGGER_SQL, db};
use crate::sql::render;

const TABLE: &str = include_str!("../../queries/capture_snapshots_table.sql");
const STATE: &str = include_str!("../../queries/capture_snapshot_state.sql");
const BEGIN: &str = include_str!("../../queries/capture_snapshot_begin.sql");
const LOCK: &str = include_str!("../../queries/capture_snapshot_lock.sql");
const CHUNK: &str = include_str!("../../queries/capture_snapshot_chunk.sql");
const LAST: &str = include_str!("../../queries/capture_snapshot_last.sql");
const ADVANCE: &str = include_str!("../../queries/capture_snapshot_advance.sql");
const COUNT: &str = include_str!("../../queries/capture_snapshot_count.sql");
const KEYS: &str = include_str!("../../queries/capture_snapshot_keys.sql");
const NULL_KEY: &str = include_str!("../../queries/capture_snapshot_null_key.sql");

/// `@AFTER@` of the first chunk, and of the later ones (the last key is `?1`).
const FROM_START: &str = "NEW.{{key_column}} IS NOT NULL";
const AFTER_KEY: &str = "NEW.{{key_column}} > ?1";

/// A key value as SQLite stores it: the storage class is kept, so the comparison with the
/// key column is the column's own.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Key {
    Integer(i64),
    Real(f64),
    Text(String),
    Blob(Vec<u8>),
}

impl Key {
    /// The key in columns `at` (its `typeof`) and `at + 1` (its value) of `row`.
    fn read(row: &SqliteRow, at: usize) -> Result<Option<Self>, sqlx::Error> {
        let class: String = row.try_get(at)?;
        Ok(Some(match class.as_str() {
            "integer" => Self::Integer(row.try_get(at + 1)?),
            "real" => Self::Real(row.try_get(at + 1)?),
            "text" => Self::Text(row.try_get(at + 1)?),
            "blob" => Self::Blob(row.try_get(at + 1)?),
            _ => return Ok(None),
        }))
    }
}

impl sqlx::Type<Sqlite> for Key {
    fn type_info() -> SqliteTypeInfo {
        <str as sqlx::Type<Sqlite>>::type_info()
    }

    fn compatible(_: &SqliteTypeInfo) -> bool {
        true
    }
}

impl sqlx::Encode<'_, Sqlite> for Key {
    fn encode_by_ref(
        &self,
        buf: &mut SqliteArgumentsBuffer,
    ) -> Result<sqlx::encode::IsNull, sqlx::error::BoxDynError> {
        match self {
            Self::Integer(i) => sqlx::Encode::<Sqlite>::encode_by_ref(i, buf),
            Self::Real(r) => sqlx::Encode::<Sqlite>::encode_by_ref(r, buf),
            Self::Text(t) => sqlx::Encode::<Sqlite>::encode_by_ref(t, buf),
            Self::Blob(b) => sqlx::Encode::<Sqlite>::encode_by_ref(b, buf),
        }
    }
}

/// The lock statement reads the key's storage class and value.
impl LockedKey<Sqlite> for Key {
    fn locked(row: &SqliteRow) -> Result<Option<Self>, sqlx::Error> {
        Self::read(row, 0)
    }
}

/// The chunk statements of one capture's snapshot (see the module docs). The progress row's
/// statements are [`SqlSnapshot`]'s.
pub(crate) struct SqliteSnapshot {
    pool: SqlitePool,
    table: String,
    aggregate_type: String,
    event_type: Option<String>,
    /// The chunk's insert and its last key: first chunk, later chunks.
    chunk: [String; 2],
    last: [String; 2],
}

impl SqliteCapture {
    /// Checks `entry` and starts its snapshot, or resumes the unfinished one.
    pub(crate) async fn snapshot(
        &self,
        entry: CaptureEntry<'_>,
    ) -> Result<Chunked<SqlSnapshot<SqliteSnapshot>>, CaptureError> {
        let context = starting(entry)?;
        let config = entry.config;
        let name = config.name();
        let mut tx = self.begin(&context).await?;
        if self.kind(&mut tx, self.outbox.as_str(), &context).await? != Some("table".into()) {
            return Err(CaptureError::NotMigrated {
                table: self.outbox.to_string(),
                database: "the SQLite file".into(),
            });
        }
        let plan = self.check(&mut tx, entry, &context).await?;
        self.check_installed(&mut tx, &plan, &context).await?;
        let table = plan.table.as_str().to_owned();
        let columns: Vec<String> = sqlx::query_scalar(KEYS)
            .bind(&table)
            .fetch_all(&mut *tx)
            .await
            .map_err(db(&context))?;
        let key = single_key(entry, &table, &columns)?;
        let mut named = entry_names(config, &key);
        named.extend([
            ("captured_table", &plan.table),
            ("outbox_table", &self.outbox),
        ]);
        let statement = |template: &str, after: &str| {
            render_sql(
                &template.replace("@AFTER@", after),
                None,
                &self.outbox,
                &named,
            )
        };
        let null_key: bool = sqlx::query_scalar(sqlx::AssertSqlSafe(statement(NULL_KEY, "")))
            .fetch_one(&mut *tx)
            .await
            .map_err(db(&context))?;
        if null_key {
            return Err(CaptureError::invalid(
                entry.key("table"),
                format!(
                    "table {table} has rows whose primary key {key} is NULL (SQLite allows it in a key other than INTEGER PRIMARY KEY): they have no place in key order; give them a key (or make the key NOT NULL) and run it again"
                ),
            ));
        }

        tx.execute(sqlx::AssertSqlSafe(render(TABLE, &self.outbox)))
            .await
            .map_err(db(&context))?;
        let state = sqlx::query(sqlx::AssertSqlSafe(render(STATE, &self.outbox)))
            .bind(name.as_str())
            .fetch_optional(&mut *tx)
            .await
            .map_err(db(&context))?;
        let recorded = state
            .map(|row| -> Result<_, sqlx::Error> {
                Ok(Recorded {
                    table: row.try_get(0)?,
                    key: row.try_get(1)?,
                    last_key: Key::read(&row, 2)?,
                    rows: row.try_get(4)?,
                    finished: row.try_get(5)?,
                })
            })
            .transpose()
            .map_err(db(&context))?;
        let resume = resume_or_begin(recorded, &table, &key, async || {
            sqlx::query(sqlx::AssertSqlSafe(render(BEGIN, &self.outbox)))
                .bind(name.as_str())
                .bind(&table)
                .bind(key.as_str())
                .bind(now())
                .execute(&mut *tx)
                .await
                .map(drop)
        })
        .await
        .map_err(db(&context))?;
        let rows_left: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(statement(
            COUNT,
            if resume.last_key.is_some() {
                AFTER_KEY
            } else {
                FROM_START
            },
        )))
        .bind(resume.last_key.clone())
        .fetch_one(&mut *tx)
        .await
        .map_err(db(format!("{context}: counting the rows left")))?;
        tx.commit().await.map_err(db(&context))?;

        let event_type = if config.event_type_column.is_some() {
            TRIGGER_SQL.event_type_column
        } else {
            "?5"
        };
        let payload = if config.payload.column().is_some() {
            TRIGGER_SQL.payload_column
        } else {
            "@ROW@"
        };
        // The row expression goes in last, never scanned for placeholders.
        let chunk = |after: &str| {
            let structure = CHUNK
                .replace("@EVENT_TYPE@", event_type)
                .replace("@PAYLOAD@", payload);
            splice(
                &statement(&structure, after),
                &[("ROW", plan.row.as_deref().unwrap_or_default())],
            )
        };
        let start = resume.start(&name, &table, &key, rows_left);
        let run = SqliteSnapshot {
            pool: self.pool.clone(),
            table,
            aggregate_type: config.aggregate_type.clone(),
            event_type: config.event_type.clone(),
            chunk: [chunk(FROM_START), chunk(AFTER_KEY)],
            last: [statement(LAST, FROM_START), statement(LAST, AFTER_KEY)],
        };
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
        tx: &mut Transaction<'static, Sqlite>,
        plan: &Plan<'_>,
        context: &str,
    ) -> Result<(), CaptureError> {
        let (entry, table) = (plan.entry, plan.table.as_str());
        let name = entry.config.name();
        let recorded = self.recorded(tx, &name, context).await?;
        check_recorded(entry, self.outbox.as_str(), table, recorded)?;
        check_triggers::<Sqlite>(&mut **tx, entry, table, TRIGGER_OF, context).await
    }
}

/// Now, in Unix microseconds.
fn now() -> i64 {
    crate::timestamp::to_micros(time::OffsetDateTime::now_utc())
}

impl SnapshotDb for SqliteSnapshot {
    type Database = Sqlite;
    type Key = Key;

    /// `BEGIN IMMEDIATE`: SQLite's write lock from the first statement on.
    async fn begin(&self) -> Result<Transaction<'static, Sqlite>, sqlx::Error> {
        self.pool.begin_with("BEGIN IMMEDIATE").await
    }

    async fn write(
        &self,
        tx: &mut Transaction<'static, Sqlite>,
        last: Option<&Key>,
        limit: u32,
    ) -> Result<(u64, Option<Key>), sqlx::Error> {
        let at = usize::from(last.is_some());
        let rows = sqlx::query(sqlx::AssertSqlSafe(self.chunk[at].as_str()))
            .bind(last)
            .bind(i64::from(limit))
            .bind(&self.aggregate_type)
            .bind(&self.table)
            .bind(self.event_type.as_deref())
            .execute(&mut **tx)
            .await?
            .rows_affected();
        if rows == 0 {
            return Ok((0, None));
        }
        let row = sqlx::query(sqlx::AssertSqlSafe(self.last[at].as_str()))
            .bind(last)
            .bind(rows as i64 - 1)
            .fetch_one(&mut **tx)
            .await?;
        Ok((rows, Key::read(&row, 0)?))
    }

    /// The time `finished_at` takes (`?5`).
    fn bind_advance(
        query: Query<'static, Sqlite, SqliteArguments>,
    ) -> Query<'static, Sqlite, SqliteArguments> {
        query.bind(now())
    }

    /// `SQLITE_BUSY` (and its extended codes): the write lock was not granted within
    /// `source.busy_timeout` while writers kept it busy. The chunk wrote nothing; it waits
    /// its turn again. (One writer at a time: no deadlocks.)
    fn retryable(e: &sqlx::Error) -> bool {
        ["5", "261", "517"]
            .into_iter()
            .any(|code| has_code(e, code))
    }

    /// `SQLITE_CONSTRAINT_NOTNULL`: the outbox's NOT NULL columns.
    fn null_in_row(e: &sqlx::Error) -> bool {
        has_code(e, "1299")
    }
}
