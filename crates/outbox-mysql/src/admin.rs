//! Read and repair views of one MySQL outbox table: the backlog (`status`, metrics), dead
//! letters (`outbox dead ...`), `why`'s blocker, held aggregates and retention.
//!
//! MySQL has no `UPDATE ... RETURNING`: a retry or a purge first selects and locks its rows
//! (`FOR UPDATE`), then changes exactly those, in one transaction.

use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::Duration;

use outbox_core::admin::{
    Blocker, DeadLetter, HeldAggregate, ReplayPlan, ReplaySelection, RetentionReport,
    RetrySelection, StoredEventDetail,
};
use outbox_core::admin_rows::{self, Columns};
use outbox_core::retention_batches::delete_in_batches;
use outbox_core::source::{Backlog, Inspect};
use outbox_core::{Identifier, SourceError};
use outbox_sql::rows::fetch_decoded;
use sqlx::mysql::MySqlRow;
use sqlx::{MySqlPool, Row};
use time::{OffsetDateTime, PrimitiveDateTime};
use uuid::Uuid;

use crate::config::{MySqlConfig, OnDelivered};
use crate::error::source_error;
use crate::poll::utc;
use crate::sql::{Cols, Queries, parse_id, render, stmt};

outbox_sql::query_set! {
    /// Every admin statement, rendered once for one table.
    pub(crate) struct AdminQueries;
    fn new(table: &Identifier), rendered by |sql| render(sql, table);
    files "outbox_" {
        dead_list, dead_show, dead_select, dead_retry, delete_positions, why_blocker,
        held_aggregates, purge_select = "outbox_dead_purge_select",
    }
    files "" {
        retention_count, retention_delete = "retention_delete_batch", replay_select,
        replay_count, replay_batch,
    }
}

/// Admin operations on one MySQL outbox table.
#[derive(Debug, Clone)]
pub struct MySqlAdmin {
    pool: MySqlPool,
    table: String,
    keeps_delivered: bool,
    queries: Arc<Queries>,
    admin: Arc<AdminQueries>,
    /// CDC mode: streamed rows stay `pending`; retention follows the kept binlog position.
    cdc: Option<Arc<crate::cdc::CdcQueries>>,
}

fn at(t: PrimitiveDateTime) -> OffsetDateTime {
    t.assume_utc()
}

fn count(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

impl MySqlAdmin {
    /// Operations on `config`'s table using `pool` (see [`crate::connect`]).
    pub fn new(pool: MySqlPool, config: &MySqlConfig) -> Self {
        Self {
            pool,
            table: config.table.to_string(),
            keeps_delivered: config.on_delivered == OnDelivered::Mark,
            queries: Arc::new(Queries::new(&config.table)),
            admin: Arc::new(AdminQueries::new(&config.table)),
            cdc: (config.mode == crate::config::Mode::Cdc)
                .then(|| Arc::new(crate::cdc::CdcQueries::new(&config.table))),
        }
    }

    /// The retention cutoff and queries: delivered rows delivered before `now - keep`; in CDC
    /// mode, streamed rows created before both `now - keep` and `keep` before the kept binlog
    /// position last moved (none while no position is kept).
    async fn retention_plan(
        &self,
        now: OffsetDateTime,
        keep: Duration,
    ) -> Result<Option<(PrimitiveDateTime, &Arc<str>, &Arc<str>)>, SourceError> {
        let Some(cdc) = &self.cdc else {
            return Ok(Some((
                utc(now - keep),
                &self.admin.retention_count,
                &self.admin.retention_delete,
            )));
        };
        let kept = crate::cdc::load_position(&self.pool, cdc)
            .await
            .map_err(|e| self.err("reading the CDC position", e))?;
        Ok(kept.map(|kept| {
            (
                utc((now - keep).min(kept.moved - keep)),
                &cdc.retention_count,
                &cdc.retention_delete_batch,
            )
        }))
    }

    fn err(&self, context: &str, e: sqlx::Error) -> SourceError {
        source_error(context, &self.table, e)
    }

    /// Backlog counters at `now`. `delivered_last_minute` is `None` when delivered rows are
    /// deleted (`on_delivered = "delete"`).
    pub async fn backlog_at(&self, now: OffsetDateTime) -> Result<Backlog, SourceError> {
        let now = utc(now);
        let (pending, retrying, dead, oldest, delivered): (i64, i64, i64, Option<i64>, i64) =
            sqlx::query_as(stmt(&self.queries.backlog))
                .bind(now)
                .bind(now)
                .bind(now)
                .fetch_one(&self.pool)
                .await
                .map_err(|e| self.err("reading the backlog", e))?;
        // Microseconds as f64: exact for any age this relay will ever see.
        #[allow(clippy::cast_precision_loss)]
        let oldest = oldest.unwrap_or(0) as f64 / 1e6;
        Ok(Backlog {
            pending: count(pending),
            retrying: count(retrying),
            dead: count(dead),
            oldest_pending_age_seconds: oldest.max(0.0),
            delivered_last_minute: self.keeps_delivered.then(|| count(delivered)),
        })
    }

    /// Dead letters in insert order, optionally filtered by event type and aggregate id.
    pub async fn list(
        &self,
        event_type: Option<&str>,
        aggregate_id: Option<&str>,
        limit: i64,
    ) -> Result<Vec<DeadLetter>, SourceError> {
        // Each filter twice: `(? IS NULL OR column = ?)`.
        let query = sqlx::query(stmt(&self.admin.dead_list))
            .bind(event_type)
            .bind(event_type)
            .bind(aggregate_id)
            .bind(aggregate_id)
            .bind(limit);
        fetch_decoded(query, &self.pool, |r| admin_rows::dead_letter(&Cols(r)))
            .await
            .map_err(|e| self.err("listing dead letters", e))
    }

    /// One event in full at `now`, or `None` when no row has this id.
    pub async fn show(
        &self,
        id: Uuid,
        now: OffsetDateTime,
    ) -> Result<Option<StoredEventDetail>, SourceError> {
        let row = sqlx::query(stmt(&self.admin.dead_show))
            .bind(id.hyphenated().to_string())
            .fetch_optional(&self.pool)
            .await
            .map_err(|e| self.err("reading an event", e))?;
        let Some(r) = row else { return Ok(None) };
        detail(&r, now)
            .map(Some)
            .map_err(|e| self.err("reading an event", e))
    }

    /// The first earlier undelivered event of `event`'s aggregate (`outbox why`), at `now`.
    pub async fn blocker(
        &self,
        event: &StoredEventDetail,
        now: OffsetDateTime,
    ) -> Result<Option<Blocker>, SourceError> {
        let row = sqlx::query(stmt(&self.admin.why_blocker))
            .bind(utc(now))
            .bind(&event.summary.aggregate_type)
            .bind(&event.summary.aggregate_id)
            .bind(event.seq)
            .fetch_optional(&self.pool)
            .await
            .map_err(|e| self.err("explaining an event", e))?;
        row.map(|r| admin_rows::blocker(&Cols(&r)))
            .transpose()
            .map_err(|e| self.err("explaining an event", e))
    }

    /// Aggregates held by a retrying or dead head event (`outbox status`).
    pub async fn held_aggregates(&self, limit: i64) -> Result<Vec<HeldAggregate>, SourceError> {
        let query = sqlx::query(stmt(&self.admin.held_aggregates)).bind(limit);
        fetch_decoded(query, &self.pool, |r| admin_rows::held_aggregate(&Cols(r)))
            .await
            .map_err(|e| self.err("reading held aggregates", e))
    }

    /// Puts the selected dead letters back in line; returns the ids put back.
    pub async fn retry(&self, selection: &RetrySelection) -> Result<Vec<Uuid>, SourceError> {
        let (ids, event_type, all) = match selection {
            RetrySelection::Ids(ids) => (
                Some(
                    serde_json::Value::from(
                        ids.iter()
                            .map(|id| id.hyphenated().to_string())
                            .collect::<Vec<_>>(),
                    )
                    .to_string(),
                ),
                None,
                false,
            ),
            RetrySelection::EventType(t) => (None, Some(t.clone()), false),
            RetrySelection::All => (None, None, true),
        };
        let err = |e| self.err("retrying dead letters", e);
        let mut tx = self.pool.begin().await.map_err(err)?;
        let rows: Vec<(i64, String)> = sqlx::query_as(stmt(&self.admin.dead_select))
            .bind(all)
            .bind(ids)
            .bind(event_type)
            .fetch_all(&mut *tx)
            .await
            .map_err(err)?;
        let mut changed = rows.clone();
        if let Some(cdc) = &self.cdc {
            let chosen = serde_json::Value::from(rows.iter().map(|(p, _)| *p).collect::<Vec<_>>())
                .to_string();
            let parked: Vec<(i64, String)> = sqlx::query_as(stmt(&cdc.dead_parked_select))
                .bind(&chosen)
                .bind(&chosen)
                .fetch_all(&mut *tx)
                .await
                .map_err(err)?;
            if !parked.is_empty() {
                tracing::info!(
                    parked = parked.len(),
                    "also putting back the events parked behind them (dead_letter = \"hold-aggregate\")"
                );
            }
            changed.extend(parked);
        }
        self.change(&mut tx, &self.admin.dead_retry, &changed)
            .await
            .map_err(err)?;
        tx.commit().await.map_err(err)?;
        rows.into_iter()
            .map(|(_, id)| parse_id(&id))
            .collect::<Result<_, _>>()
            .map_err(err)
    }

    /// Deletes dead letters dead-lettered before `before`; returns their ids.
    pub async fn purge(
        &self,
        before: OffsetDateTime,
        event_type: Option<&str>,
    ) -> Result<Vec<Uuid>, SourceError> {
        let err = |e| self.err("purging dead letters", e);
        let mut tx = self.pool.begin().await.map_err(err)?;
        let rows: Vec<(i64, String)> = sqlx::query_as(stmt(&self.admin.purge_select))
            .bind(utc(before))
            .bind(event_type)
            .bind(event_type)
            .fetch_all(&mut *tx)
            .await
            .map_err(err)?;
        self.change(&mut tx, &self.admin.delete_positions, &rows)
            .await
            .map_err(err)?;
        tx.commit().await.map_err(err)?;
        rows.into_iter()
            .map(|(_, id)| parse_id(&id))
            .collect::<Result<_, _>>()
            .map_err(err)
    }

    /// Runs `sql` (one JSON array of positions) over the selected rows.
    async fn change(
        &self,
        tx: &mut sqlx::Transaction<'static, sqlx::MySql>,
        sql: &Arc<str>,
        rows: &[(i64, String)],
    ) -> Result<(), sqlx::Error> {
        if rows.is_empty() {
            return Ok(());
        }
        let positions: Vec<i64> = rows.iter().map(|(p, _)| *p).collect();
        sqlx::query(stmt(sql))
            .bind(serde_json::Value::from(positions).to_string())
            .execute(&mut **tx)
            .await?;
        Ok(())
    }

    /// How many rows a retention run at `now` keeping `keep` would delete, and the oldest
    /// delivery time among them.
    pub async fn retention_preview(
        &self,
        now: OffsetDateTime,
        keep: Duration,
    ) -> Result<(u64, Option<OffsetDateTime>), SourceError> {
        let Some((cutoff, count_rows, _)) = self.retention_plan(now, keep).await? else {
            return Ok((0, None));
        };
        let (n, oldest): (i64, Option<PrimitiveDateTime>) = sqlx::query_as(stmt(count_rows))
            .bind(cutoff)
            .fetch_one(&self.pool)
            .await
            .map_err(|e| self.err("counting delivered rows", e))?;
        Ok((count(n), oldest.map(at)))
    }

    /// Deletes delivered rows delivered before `now - keep`, `batch` rows per statement,
    /// sleeping `pause` between statements. `progress` gets the rows deleted so far after
    /// each full batch; `Break` stops the run.
    pub async fn retention_run(
        &self,
        now: OffsetDateTime,
        keep: Duration,
        batch: u32,
        pause: Duration,
        progress: &mut (dyn FnMut(u64) -> ControlFlow<()> + Send),
    ) -> Result<RetentionReport, SourceError> {
        let mut report = RetentionReport::default();
        let Some((cutoff, _, delete)) = self.retention_plan(now, keep).await? else {
            return Ok(report);
        };
        delete_in_batches(batch, pause, progress, &mut report, |batch| async move {
            let done = sqlx::query(stmt(delete))
                .bind(cutoff)
                .bind(batch)
                .execute(&self.pool)
                .await
                .map_err(|e| self.err("deleting a batch of delivered rows", e))?;
            Ok(done.rows_affected())
        })
        .await?;
        Ok(report)
    }
}

impl MySqlAdmin {
    fn refuse_without_history(&self) -> Result<(), SourceError> {
        if self.keeps_delivered {
            return Ok(());
        }
        Err(SourceError::fatal(format!(
            "outbox table {} deletes delivered rows (source.on_delivered = \"delete\"): there is nothing to replay",
            self.table
        )))
    }

    /// Counts the delivered events `selection` holds and returns the first `preview`.
    pub async fn replay_plan(
        &self,
        selection: &ReplaySelection,
        preview: usize,
    ) -> Result<ReplayPlan, SourceError> {
        self.refuse_without_history()?;
        let err = |e| self.err("selecting events to replay", e);
        let until = selection.until.map(utc);
        let total: i64 = sqlx::query_scalar(stmt(&self.admin.replay_count))
            .bind(utc(selection.since))
            .bind(until)
            .bind(until)
            .bind(&selection.aggregate_id)
            .bind(&selection.aggregate_id)
            .bind(&selection.event_type)
            .bind(&selection.event_type)
            .fetch_one(&self.pool)
            .await
            .map_err(err)?;
        let rows = self.replay_rows(selection, preview).await?;
        let preview = rows
            .iter()
            .map(|r| admin_rows::replay_preview(&Cols(r)))
            .collect::<Result<_, sqlx::Error>>()
            .map_err(err)?;
        Ok(ReplayPlan {
            total: count(total),
            preview,
            noun: "delivered event(s)",
        })
    }

    /// The ids `selection` holds, in insert order.
    pub async fn replay_ids(&self, selection: &ReplaySelection) -> Result<Vec<Uuid>, SourceError> {
        self.refuse_without_history()?;
        let rows = self.replay_rows(selection, usize::MAX).await?;
        rows.iter()
            .map(|r| Cols(r).id(0))
            .collect::<Result<_, sqlx::Error>>()
            .map_err(|e| self.err("selecting events to replay", e))
    }

    async fn replay_rows(
        &self,
        selection: &ReplaySelection,
        limit: usize,
    ) -> Result<Vec<MySqlRow>, SourceError> {
        let until = selection.until.map(utc);
        sqlx::query(stmt(&self.admin.replay_select))
            .bind(utc(selection.since))
            .bind(until)
            .bind(until)
            .bind(&selection.aggregate_id)
            .bind(&selection.aggregate_id)
            .bind(&selection.event_type)
            .bind(&selection.event_type)
            .bind(u64::try_from(limit).unwrap_or(u64::MAX))
            .fetch_all(&self.pool)
            .await
            .map_err(|e| self.err("selecting events to replay", e))
    }

    /// Puts `ids` back in line (one statement); returns how many were delivered and now are
    /// pending again.
    pub async fn replay_ids_batch(&self, ids: &[Uuid]) -> Result<u64, SourceError> {
        let ids: Vec<String> = ids.iter().map(|id| id.hyphenated().to_string()).collect();
        Ok(sqlx::query(stmt(&self.admin.replay_batch))
            .bind(serde_json::Value::from(ids).to_string())
            .execute(&self.pool)
            .await
            .map_err(|e| self.err("replaying events", e))?
            .rows_affected())
    }
}

/// A `outbox_dead_show.sql` row: the headers as JSON text, no attempt history, the next
/// attempt (column 13) a backoff while it is after `now`.
fn detail(r: &MySqlRow, now: OffsetDateTime) -> Result<StoredEventDetail, sqlx::Error> {
    let headers: String = r.try_get(5)?;
    let next_attempt_at = at(r.try_get(13)?);
    admin_rows::stored_event(
        &Cols(r),
        serde_json::from_str(&headers).unwrap_or(serde_json::Value::String(headers)),
        Vec::new(),
        (next_attempt_at > now).then_some(next_attempt_at),
    )
}

impl Inspect for MySqlAdmin {
    async fn backlog(&self) -> Result<Backlog, SourceError> {
        self.backlog_at(OffsetDateTime::now_utc()).await
    }
}
