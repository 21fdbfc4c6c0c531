//! `outbox capture snapshot` on PostgreSQL (docs/capture.md, "Snapshot"): the rows already in
//! a captured table become events, one chunk per transaction, in primary-key order.
//!
//! A chunk locks the capture's row of `<outbox>_capture_snapshots` (`FOR UPDATE`), reads the
//! next rows after its `last_key` `FOR SHARE`, inserts their events through the same
//! expressions as the capture's trigger function (the row is the table's alias instead of
//! `NEW`), and records the new key, all in one transaction
//! ([queries/capture_snapshot_chunk.sql](../../queries/capture_snapshot_chunk.sql)).

use outbox_core::capture::snapshot::{
    Chunked, Recorded, entry_names, not_installed, resume_or_begin, single_key, starting,
};
use outbox_core::capture::{CaptureEntry, CaptureError};
use outbox_core::{Identifier, QualifiedTable};
use outbox_sql::error::has_code;
use outbox_sql::snapshot::{SnapshotDb, SqlSnapshot};
use sqlx::postgres::PgArguments;
use sqlx::query::Query;
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

/// The chunk statement of one capture's snapshot (see the module docs). The progress row's
/// statements are [`SqlSnapshot`]'s.
pub(crate) struct PgSnapshot {
    pool: crate::db::Db,
    table: String,
    key: String,
    /// The chunk statement, rendered for this capture.
    chunk: String,
    aggregate_type: String,
    event_type: Option<String>,
}

impl PgCapture {
    /// Checks `entry` and starts its snapshot, or resumes the unfinished one.
    pub(crate) async fn snapshot(
        &self,
        entry: CaptureEntry<'_>,
    ) -> Result<Chunked<SqlSnapshot<PgSnapshot>>, CaptureError> {
        let context = starting(entry)?;
        let name = entry.config.name();
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
        let resume = resume_or_begin(state.map(Recorded::from), &table, &key, async || {
            crate::sql::query(sqlx::AssertSqlSafe(render(BEGIN, &self.outbox)))
                .bind(name.as_str())
                .bind(&table)
                .bind(key.as_str())
                .execute(&mut *tx)
                .await
                .map(drop)
        })
        .await
        .map_err(db(&context))?;
        // In the transaction, like every statement here: through a transaction pooler
        // (PgBouncer) a statement outside one may land on another server connection.
        let named = plan_names(&plan, &key);
        let rows_left: i64 =
            crate::sql::query_scalar(sqlx::AssertSqlSafe(self.render(COUNT, &name, &named)))
                .bind(resume.last_key.as_deref())
                .bind(key.as_str())
                .fetch_one(&mut *tx)
                .await
                .map_err(db(format!("{context}: counting the rows left")))?;
        tx.commit().await.map_err(db(&context))?;
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
        let start = resume.start(&name, &table, &key, rows_left);
        let run = PgSnapshot {
            pool: self.pool.clone(),
            table,
            key: key.to_string(),
            chunk,
            aggregate_type: config.aggregate_type.clone(),
            event_type: config.event_type.clone(),
        };
        let (lock, advance) = (render(LOCK, &self.outbox), render(ADVANCE, &self.outbox));
        Ok(Chunked::new(
            start,
            SqlSnapshot::new(&name, lock, advance, run),
        ))
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
    single_key(plan.entry, &plan.table.to_string(), &columns)
}

/// The identifiers of the chunk and count statements.
fn plan_names<'p>(plan: &'p Plan<'_>, key: &'p Identifier) -> Vec<(&'p str, &'p Identifier)> {
    let table: &QualifiedTable = &plan.table;
    let mut named = entry_names(plan.entry.config, key);
    named.extend([
        (
            "captured_schema",
            table.schema.as_ref().expect("qualified_table has a schema"),
        ),
        ("captured_table", &table.table),
    ]);
    named
}

impl SnapshotDb for PgSnapshot {
    type Database = Postgres;
    type Key = String;

    async fn begin(&self) -> Result<Transaction<'static, Postgres>, sqlx::Error> {
        self.pool.begin().await
    }

    /// Named (cached) unless a transaction pooler is in between.
    fn query(sql: &str) -> Query<'static, Postgres, PgArguments> {
        crate::sql::query(sqlx::AssertSqlSafe(sql))
    }

    async fn write(
        &self,
        tx: &mut Transaction<'static, Postgres>,
        last: Option<&String>,
        limit: u32,
    ) -> Result<(u64, Option<String>), sqlx::Error> {
        // Never prepared for reuse: planned with the values, so `$4 IS NULL` folds away and
        // the key range is an index condition.
        let mut chunk =
            crate::sql::query_as::<(i64, Option<String>)>(sqlx::AssertSqlSafe(self.chunk.as_str()))
                .persistent(false)
                .bind(i64::from(limit))
                .bind(&self.aggregate_type)
                .bind(&self.table)
                .bind(last)
                .bind(&self.key);
        if let Some(t) = &self.event_type {
            chunk = chunk.bind(t);
        }
        let (rows, new_last) = chunk.fetch_one(&mut **tx).await?;
        Ok((rows.max(0) as u64, new_last))
    }

    /// A deadlock (an application transaction locked the rows of one aggregate in another
    /// order) or a serialization failure.
    fn retryable(e: &sqlx::Error) -> bool {
        has_code(e, "40P01") || has_code(e, "40001")
    }

    fn null_in_row(e: &sqlx::Error) -> bool {
        has_code(e, "23502")
    }
}
