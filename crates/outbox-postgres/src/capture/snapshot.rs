//! `outbox capture snapshot` on PostgreSQL (docs/capture.md, "Snapshot"): the rows already in
//! a captured table become events, one chunk per transaction, in primary-key order.
//!
//! A chunk locks the capture's row of `<outbox>_capture_snapshots` (`FOR UPDATE`), reads the
//! next rows after its `last_key` `FOR SHARE`, inserts their events through the same
//! expressions as the capture's trigger function (the row is the table's alias instead of
//! `NEW`), and records the new key, all in one transaction
//! ([queries/capture_snapshot_chunk.sql](../../queries/capture_snapshot_chunk.sql)).

use outbox_core::capture::snapshot::{composite_key, no_primary_key, not_installed, null_in_row};
use outbox_core::capture::{CaptureEntry, CaptureError, SnapshotChunk, SnapshotRun, SnapshotStart};
use outbox_core::sink::BoxFuture;
use outbox_core::{Identifier, QualifiedTable};
use sqlx::{Postgres, Transaction};

use super::{PgCapture, Plan, db, event_type_column};
use crate::sql::render;

const TABLE: &str = query_file!("capture_snapshots_table");
const STATE: &str = query_file!("capture_snapshot_state");
const BEGIN: &str = query_file!("capture_snapshot_begin");
const LOCK: &str = query_file!("capture_snapshot_lock");
const CHUNK: &str = query_file!("capture_snapshot_chunk");
const ADVANCE: &str = query_file!("capture_snapshot_advance");
const COUNT: &str = query_file!("capture_snapshot_count");
const PRIMARY_KEY: &str = query_file!("capture_primary_key");
const TRIGGER_NAMED: &str = query_file!("capture_trigger_named");

/// A fixed event type in a snapshot chunk: its 6th parameter.
const SNAPSHOT_EVENT_TYPE_FIXED: &str = "$6::text";

/// How often a chunk that lost a deadlock (or a serialization failure) is tried again.
const RETRIES: u32 = 10;

/// A running snapshot of one capture (see the module docs).
pub(crate) struct PgSnapshot {
    pool: crate::db::Db,
    start: SnapshotStart,
    /// The chunk statement, rendered for this capture.
    chunk: String,
    lock: String,
    advance: String,
    aggregate_type: String,
    event_type: Option<String>,
}

impl PgCapture {
    /// Checks `entry` and starts its snapshot, or resumes the unfinished one.
    pub(crate) async fn snapshot(
        &self,
        entry: CaptureEntry<'_>,
    ) -> Result<PgSnapshot, CaptureError> {
        entry
            .config
            .validate(entry.index)
            .map_err(outbox_core::capture::keyed)?;
        let name = entry.config.name();
        let context = format!("starting the snapshot of capture `{name}`");
        let mut tx = self.begin(&context).await?;
        let outbox_oid = self.outbox_oid(&mut tx, &context).await?;
        let plan = self.check(&mut tx, entry, outbox_oid).await?;
        self.check_installed(&mut tx, &plan, &context).await?;
        let key = primary_key(&mut tx, &plan, &context).await?;
        let table = plan.table.to_string();

        crate::sql::query(sqlx::AssertSqlSafe(render(TABLE, &self.outbox)))
            .execute(&mut *tx)
            .await
            .map_err(db(&context))?;
        let state: Option<(String, String, Option<String>, i64, bool)> =
            crate::sql::query_as(sqlx::AssertSqlSafe(render(STATE, &self.outbox)))
                .bind(name.as_str())
                .fetch_optional(&mut *tx)
                .await
                .map_err(db(&context))?;
        let (resumed, last_key, rows_done) = match state {
            Some((t, k, last, rows, false)) if t == table && k == key.as_str() => {
                (true, last, rows)
            }
            _ => {
                crate::sql::query(sqlx::AssertSqlSafe(render(BEGIN, &self.outbox)))
                    .bind(name.as_str())
                    .bind(&table)
                    .bind(key.as_str())
                    .execute(&mut *tx)
                    .await
                    .map_err(db(&context))?;
                (false, None, 0)
            }
        };
        tx.commit().await.map_err(db(&context))?;

        let named = plan_names(&plan, &key);
        let rows_left: i64 =
            crate::sql::query_scalar(sqlx::AssertSqlSafe(self.render(COUNT, &name, &named)))
                .bind(last_key.as_deref())
                .bind(key.as_str())
                .fetch_one(&self.pool)
                .await
                .map_err(db(format!("{context}: counting the rows left")))?;
        let config = entry.config;
        let event_type = if config.event_type_column.is_some() {
            event_type_column("t")
        } else {
            SNAPSHOT_EVENT_TYPE_FIXED.to_owned()
        };
        let chunk = self.render(
            &CHUNK
                .replace("@EVENT_TYPE@", &event_type)
                .replace("@PAYLOAD@", &plan.payload.expression("t")),
            &name,
            &named,
        );
        Ok(PgSnapshot {
            pool: self.pool.clone(),
            start: SnapshotStart {
                name: name.to_string(),
                table,
                key: key.to_string(),
                resumed,
                rows_done: rows_done.max(0) as u64,
                rows_left: rows_left.max(0) as u64,
            },
            chunk,
            lock: render(LOCK, &self.outbox),
            advance: render(ADVANCE, &self.outbox),
            aggregate_type: config.aggregate_type.clone(),
            event_type: config.event_type.clone(),
        })
    }

    /// The capture must be installed as configured: its function recorded with this entry,
    /// its trigger on the table. Otherwise live changes would not follow the snapshot.
    async fn check_installed(
        &self,
        tx: &mut Transaction<'static, Postgres>,
        plan: &Plan<'_>,
        context: &str,
    ) -> Result<(), CaptureError> {
        let entry = plan.entry;
        let name = entry.config.name();
        let signature = self.render(super::SIGNATURE, &name, &[]);
        match self.function_record(tx, &signature, context).await? {
            None => return Err(not_installed(entry, "is not installed")),
            Some(Some(r)) if r.outbox == self.outbox.to_string() && r.config == *entry.config => {}
            Some(_) => {
                return Err(not_installed(
                    entry,
                    "is installed differently from this [[capture]] entry",
                ));
            }
        }
        let calls: Option<String> = crate::sql::query_scalar(TRIGGER_NAMED)
            .bind(plan.oid)
            .bind(format!("{name}_outbox_capture"))
            .fetch_optional(&mut **tx)
            .await
            .map_err(db(context))?;
        if calls.is_none() {
            return Err(not_installed(
                entry,
                &format!("has no trigger on {}", plan.table),
            ));
        }
        Ok(())
    }
}

/// The table's single primary-key column, or why there is none to follow.
async fn primary_key(
    tx: &mut Transaction<'static, Postgres>,
    plan: &Plan<'_>,
    context: &str,
) -> Result<Identifier, CaptureError> {
    let columns: Vec<String> = crate::sql::query_scalar(PRIMARY_KEY)
        .bind(plan.oid)
        .fetch_all(&mut **tx)
        .await
        .map_err(db(context))?;
    let table = plan.table.to_string();
    match columns.as_slice() {
        [] => Err(no_primary_key(plan.entry, &table)),
        [one] => Identifier::new(one.as_str()).map_err(|e| {
            CaptureError::invalid(
                plan.entry.key("table"),
                format!("the primary-key column of {table} cannot be followed: {e}"),
            )
        }),
        more => Err(composite_key(plan.entry, &table, more)),
    }
}

/// The identifiers of the chunk and count statements.
fn plan_names<'p>(plan: &'p Plan<'_>, key: &'p Identifier) -> Vec<(&'p str, &'p Identifier)> {
    let config = plan.entry.config;
    let table: &QualifiedTable = &plan.table;
    let mut named: Vec<(&str, &Identifier)> = vec![
        (
            "captured_schema",
            table.schema.as_ref().expect("qualified_table has a schema"),
        ),
        ("captured_table", &table.table),
        ("aggregate_id", &config.aggregate_id),
        ("key_column", key),
    ];
    if let Some(c) = &config.event_type_column {
        named.push(("event_type_column", c));
    }
    if let Some(c) = config.payload.column() {
        named.push(("payload_column", c));
    }
    named
}

impl PgSnapshot {
    /// One chunk's transaction; `Err` as the database gave it.
    async fn try_chunk(&self, limit: u32) -> Result<SnapshotChunk, sqlx::Error> {
        let mut tx = self.pool.begin().await?;
        let last: Option<Option<String>> =
            crate::sql::query_scalar(sqlx::AssertSqlSafe(self.lock.as_str()))
                .bind(&self.start.name)
                .fetch_optional(&mut *tx)
                .await?;
        let Some(last) = last else {
            return Ok(SnapshotChunk {
                rows: 0,
                finished: true,
            });
        };
        // Never prepared for reuse: planned with the values, so `$4 IS NULL` folds away and
        // the key range is an index condition.
        let mut chunk =
            crate::sql::query_as::<(i64, Option<String>)>(sqlx::AssertSqlSafe(self.chunk.as_str()))
                .persistent(false)
                .bind(i64::from(limit))
                .bind(&self.aggregate_type)
                .bind(&self.start.table)
                .bind(last.as_deref())
                .bind(&self.start.key);
        if let Some(t) = &self.event_type {
            chunk = chunk.bind(t);
        }
        let (rows, new_last) = chunk.fetch_one(&mut *tx).await?;
        let finished = rows < i64::from(limit);
        crate::sql::query(sqlx::AssertSqlSafe(self.advance.as_str()))
            .bind(&self.start.name)
            .bind(new_last.as_deref())
            .bind(rows)
            .bind(finished)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(SnapshotChunk {
            rows: rows.max(0) as u64,
            finished,
        })
    }
}

impl SnapshotRun for PgSnapshot {
    fn start(&self) -> &SnapshotStart {
        &self.start
    }

    fn chunk(&mut self, limit: u32) -> BoxFuture<'_, Result<SnapshotChunk, CaptureError>> {
        Box::pin(async move {
            let mut attempt = 0;
            loop {
                match self.try_chunk(limit).await {
                    Ok(done) => return Ok(done),
                    Err(e) if retryable(&e) && attempt < RETRIES => attempt += 1,
                    Err(e) => {
                        let context = if is_code(&e, "23502") {
                            null_in_row(&self.start.table)
                        } else {
                            format!(
                                "snapshot of {}: a chunk failed and wrote nothing (run the snapshot again: it resumes after the last chunk that committed)",
                                self.start.table
                            )
                        };
                        return Err(CaptureError::Database {
                            context,
                            source: Box::new(e),
                        });
                    }
                }
            }
        })
    }
}

/// Whether `e` is the database's error `code` (SQLSTATE).
fn is_code(e: &sqlx::Error, code: &str) -> bool {
    matches!(e, sqlx::Error::Database(d) if d.code().as_deref() == Some(code))
}

/// A deadlock (an application transaction locked the rows of one aggregate in another
/// order) or a serialization failure: the chunk was rolled back and can run again.
fn retryable(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(d) if matches!(d.code().as_deref(), Some("40P01" | "40001")))
}
