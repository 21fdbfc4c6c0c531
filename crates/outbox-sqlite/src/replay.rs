//! `outbox replay` on SQLite: delivered events put back in line (same id, same `seq`), for
//! the running relay to publish again. The same selection and the same rules as the server
//! databases: a window of write times, optionally one aggregate or one event type, counted
//! first, then put back in short write transactions (SQLite runs one writer at a time, so the
//! relay's settles get their turn between batches).

use std::sync::Arc;

use outbox_core::admin::{ReplayPlan, ReplayPreview, ReplaySelection};
use outbox_core::{Identifier, SourceError};
use sqlx::sqlite::SqliteRow;
use sqlx::{Row, SqlitePool};
use uuid::Uuid;

use crate::config::OnDelivered;
use crate::error::source_error;
use crate::sql::parse_id;
use crate::sql::render;
use crate::timestamp::{from_micros, to_micros};

/// Replay over one SQLite outbox table.
#[derive(Debug, Clone)]
pub(crate) struct SqliteReplay {
    pool: SqlitePool,
    table: String,
    keeps_delivered: bool,
    count: Arc<str>,
    select: Arc<str>,
    batch: Arc<str>,
}

impl SqliteReplay {
    /// Replay over `table` in the database of `pool`; `on_delivered = "delete"` keeps nothing
    /// to replay, and every call says so.
    pub(crate) fn new(pool: SqlitePool, table: &Identifier, on_delivered: OnDelivered) -> Self {
        Self {
            pool,
            table: table.to_string(),
            keeps_delivered: on_delivered == OnDelivered::Mark,
            count: render(include_str!("../queries/replay_count.sql"), table).into(),
            select: render(include_str!("../queries/replay_select.sql"), table).into(),
            batch: render(include_str!("../queries/replay_batch.sql"), table).into(),
        }
    }

    fn err(&self, e: sqlx::Error) -> SourceError {
        source_error("selecting events to replay", &self.table, e)
    }

    fn refuse_without_history(&self) -> Result<(), SourceError> {
        if self.keeps_delivered {
            return Ok(());
        }
        Err(SourceError::fatal(format!(
            "nothing can be replayed from outbox table {}: it runs with source.on_delivered = \"delete\", so delivered events are deleted once the broker acknowledges them; replay from the broker's own retention instead",
            self.table
        )))
    }

    /// Counts the delivered events `selection` holds and returns the first `preview`.
    pub(crate) async fn plan(
        &self,
        selection: &ReplaySelection,
        preview: usize,
    ) -> Result<ReplayPlan, SourceError> {
        self.refuse_without_history()?;
        let total: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(&*self.count))
            .bind(to_micros(selection.since))
            .bind(selection.until.map(to_micros))
            .bind(&selection.aggregate_id)
            .bind(&selection.event_type)
            .fetch_one(&self.pool)
            .await
            .map_err(|e| self.err(e))?;
        let preview = self
            .rows(selection, preview)
            .await?
            .iter()
            .map(preview_row)
            .collect::<Result<_, sqlx::Error>>()
            .map_err(|e| self.err(e))?;
        Ok(ReplayPlan {
            total: u64::try_from(total).unwrap_or(0),
            preview,
            noun: "delivered event(s)",
        })
    }

    /// The ids `selection` holds, in commit order.
    pub(crate) async fn ids(&self, selection: &ReplaySelection) -> Result<Vec<Uuid>, SourceError> {
        self.refuse_without_history()?;
        self.rows(selection, usize::MAX)
            .await?
            .iter()
            .map(|r| parse_id(r.try_get(0)?))
            .collect::<Result<_, sqlx::Error>>()
            .map_err(|e| self.err(e))
    }

    async fn rows(
        &self,
        selection: &ReplaySelection,
        limit: usize,
    ) -> Result<Vec<SqliteRow>, SourceError> {
        sqlx::query(sqlx::AssertSqlSafe(&*self.select))
            .bind(to_micros(selection.since))
            .bind(selection.until.map(to_micros))
            .bind(&selection.aggregate_id)
            .bind(&selection.event_type)
            .bind(i64::try_from(limit).unwrap_or(i64::MAX))
            .fetch_all(&self.pool)
            .await
            .map_err(|e| self.err(e))
    }

    /// Puts `ids` back in line in one statement; returns how many were delivered and now
    /// are pending again.
    pub(crate) async fn put_back(&self, ids: &[Uuid]) -> Result<u64, SourceError> {
        let ids: Vec<String> = ids.iter().map(|id| id.hyphenated().to_string()).collect();
        Ok(sqlx::query(sqlx::AssertSqlSafe(&*self.batch))
            .bind(serde_json::Value::from(ids).to_string())
            .execute(&self.pool)
            .await
            .map_err(|e| source_error("replaying events", &self.table, e))?
            .rows_affected())
    }
}

/// A `replay_select.sql` row.
fn preview_row(r: &SqliteRow) -> Result<ReplayPreview, sqlx::Error> {
    Ok(ReplayPreview {
        id: parse_id(r.try_get(0)?)?,
        aggregate_type: r.try_get(1)?,
        aggregate_id: r.try_get(2)?,
        event_type: r.try_get(3)?,
        created_at: from_micros(r.try_get(4)?),
        delivered_at: r.try_get::<Option<i64>, _>(5)?.map(from_micros),
    })
}

outbox_core::forward_replay!(
    SqliteReplay,
    plan = plan,
    ids = ids,
    replay_batch = put_back
);
