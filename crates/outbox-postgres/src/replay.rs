//! Replay (`outbox replay`): publish already-delivered events again, with the same ids.
//!
//! Polling mode puts the selected delivered rows back in line (pending, attempts 0, ready at
//! once); the running relay publishes them in `seq` order, so per-aggregate order holds among
//! them. CDC mode records no delivery per row and streams inserts only, so it deletes and
//! re-inserts the selected rows in `seq` order (the stream carries them again). Either way the
//! selected ids are read once in `seq` order, then the work goes in bounded batches by primary
//! key, each its own short transaction: a large replay never holds long locks, keeps
//! per-aggregate order across batches, and the caller can show progress between batches.

use outbox_core::SourceError;
use outbox_core::admin::{ReplayPlan, ReplayPreview, ReplaySelection};
use sqlx::{PgPool, Row};
use uuid::Uuid;

use crate::config::{Mode, OnDelivered, PostgresConfig};
use crate::error::source_error;
use crate::sql::render;

/// Why replay cannot run.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// Delivered events are deleted from the table (`on_delivered = "delete"`).
    #[error(
        "nothing can be replayed from outbox table {table}: it runs with source.on_delivered = \"delete\", so delivered events are deleted once the broker acknowledges them; replay from the broker's own retention instead"
    )]
    NotKept {
        /// The table.
        table: String,
    },
    /// The database failed.
    #[error(transparent)]
    Source(#[from] SourceError),
}

/// Replay on one outbox table.
#[derive(Debug, Clone)]
pub struct PgReplay {
    pool: crate::db::Db,
    table: String,
    cdc: bool,
    keeps_delivered: bool,
    select: String,
    ids: String,
    batch: String,
}

impl PgReplay {
    /// Replay on `config`'s table.
    pub fn new(pool: PgPool, config: &PostgresConfig) -> Self {
        let table = config.qualified_table();
        let cdc = config.mode == Mode::Cdc;
        let batch = if cdc {
            include_str!("../queries/outbox_replay_restream.sql")
        } else {
            include_str!("../queries/outbox_replay_batch.sql")
        };
        Self {
            pool: crate::db::Db::new(pool, config.transaction_pooling),
            table: table.to_string(),
            cdc,
            keeps_delivered: cdc || config.on_delivered == OnDelivered::Mark,
            select: render(include_str!("../queries/outbox_replay_select.sql"), &table),
            ids: render(include_str!("../queries/outbox_replay_ids.sql"), &table),
            batch: render(batch, &table),
        }
    }

    fn err(&self, context: &str, e: sqlx::Error) -> ReplayError {
        ReplayError::Source(source_error(context, &self.table, e))
    }

    /// Counts the selection and reads its first `preview` events. Fails with
    /// [`ReplayError::NotKept`] when delivered rows are not kept at all.
    pub async fn plan(
        &self,
        selection: &ReplaySelection,
        preview: i64,
    ) -> Result<ReplayPlan, ReplayError> {
        if !self.keeps_delivered {
            return Err(ReplayError::NotKept {
                table: self.table.clone(),
            });
        }
        // Rendered by `sql::render` from validated identifiers only.
        let rows = crate::sql::query(sqlx::AssertSqlSafe(self.select.as_str()))
            .bind(selection.since)
            .bind(selection.until)
            .bind(selection.aggregate_id.as_deref())
            .bind(selection.event_type.as_deref())
            .bind(self.cdc)
            .bind(preview)
            .fetch_all(&self.pool)
            .await
            .map_err(|e| self.err("selecting events to replay", e))?;
        let mut plan = ReplayPlan {
            total: 0,
            preview: Vec::new(),
            noun: if self.cdc {
                "event(s)"
            } else {
                "delivered event(s)"
            },
        };
        for r in &rows {
            let mut read = || -> Result<Option<ReplayPreview>, sqlx::Error> {
                let total: i64 = r.try_get(0)?;
                plan.total = u64::try_from(total).unwrap_or(0);
                let Some(id) = r.try_get::<Option<Uuid>, _>(1)? else {
                    return Ok(None);
                };
                Ok(Some(ReplayPreview {
                    id,
                    aggregate_type: r.try_get(2)?,
                    aggregate_id: r.try_get(3)?,
                    event_type: r.try_get(4)?,
                    created_at: r.try_get(5)?,
                    delivered_at: r.try_get(6)?,
                }))
            };
            if let Some(p) = read().map_err(|e| self.err("selecting events to replay", e))? {
                plan.preview.push(p);
            }
        }
        Ok(plan)
    }

    /// The ids of the selection, in `seq` order (16 bytes each in memory), for
    /// [`PgReplay::replay_batch`].
    pub async fn ids(&self, selection: &ReplaySelection) -> Result<Vec<Uuid>, ReplayError> {
        // Rendered by `sql::render` from validated identifiers only.
        crate::sql::query_scalar(sqlx::AssertSqlSafe(self.ids.as_str()))
            .bind(selection.since)
            .bind(selection.until)
            .bind(selection.aggregate_id.as_deref())
            .bind(selection.event_type.as_deref())
            .bind(self.cdc)
            .fetch_all(&self.pool)
            .await
            .map_err(|e| self.err("selecting events to replay", e))
    }

    /// Replays one batch: `ids` is the next slice of [`PgReplay::ids`], in order. Returns how
    /// many were replayed (fewer when rows changed meanwhile).
    pub async fn replay_batch(&self, ids: &[Uuid]) -> Result<u64, ReplayError> {
        // Rendered by `sql::render` from validated identifiers only.
        let done: Vec<Uuid> = crate::sql::query_scalar(sqlx::AssertSqlSafe(self.batch.as_str()))
            .bind(ids)
            .fetch_all(&self.pool)
            .await
            .map_err(|e| self.err("replaying events", e))?;
        Ok(done.len() as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn replay_queries_render_without_leftover_placeholders() {
        let mut config = PostgresConfig::new("postgres://localhost/app");
        for mode in [Mode::Poll, Mode::Cdc] {
            config.mode = mode;
            let replay = PgReplay::new(
                sqlx::PgPool::connect_lazy("postgres://localhost/app").expect("lazy pool"),
                &config,
            );
            assert!(!replay.select.contains("{{"), "{}", replay.select);
            assert!(!replay.ids.contains("{{"), "{}", replay.ids);
            assert!(!replay.batch.contains("{{"), "{}", replay.batch);
        }
    }
}
