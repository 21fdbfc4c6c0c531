//! Dead letters: list, show, retry, purge (`outbox dead ...` on the SQLite source).
//!
//! The same operations and the same rules as PostgreSQL's: a retried event keeps its `seq`,
//! so it goes out before the later events of its aggregate that waited behind it. SQLite
//! keeps only the latest error per event (`last_error`), not a per-attempt history.

use outbox_core::admin::{Blocker, DeadLetter, RetrySelection, StoredEventDetail};
use outbox_core::admin_rows;
use outbox_core::{Identifier, SourceError};
use outbox_sql::rows::fetch_decoded;
use sqlx::{Row, SqlitePool};
use time::OffsetDateTime;
use uuid::Uuid;

use crate::error::source_error;
use crate::sql::{Cols, parse_id, render};
use crate::timestamp::{from_micros, to_micros};

/// Dead-letter operations on one SQLite outbox table.
#[derive(Debug, Clone)]
pub struct SqliteDeadLetters {
    pool: SqlitePool,
    table: String,
    list: String,
    show: String,
    retry: String,
    purge: String,
    blocker: String,
}

impl SqliteDeadLetters {
    /// Operations on `table` in the database of `pool` (see [`crate::connect`]).
    pub fn new(pool: SqlitePool, table: &Identifier) -> Self {
        Self {
            pool,
            table: table.to_string(),
            list: render(include_str!("../queries/outbox_dead_list.sql"), table),
            show: render(include_str!("../queries/outbox_dead_show.sql"), table),
            retry: render(include_str!("../queries/outbox_dead_retry.sql"), table),
            purge: render(include_str!("../queries/outbox_dead_purge.sql"), table),
            blocker: render(include_str!("../queries/outbox_why_blocker.sql"), table),
        }
    }

    fn err(&self, context: &str, e: sqlx::Error) -> SourceError {
        source_error(context, &self.table, e)
    }

    /// Dead letters in commit order, optionally filtered by event type and aggregate id.
    pub async fn list(
        &self,
        event_type: Option<&str>,
        aggregate_id: Option<&str>,
        limit: i64,
    ) -> Result<Vec<DeadLetter>, SourceError> {
        // Rendered by `sql::render` from a validated identifier only.
        let query = sqlx::query(sqlx::AssertSqlSafe(self.list.as_str()))
            .bind(event_type)
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
        // Rendered by `sql::render` from a validated identifier only.
        let row = sqlx::query(sqlx::AssertSqlSafe(self.show.as_str()))
            .bind(id.to_string())
            .fetch_optional(&self.pool)
            .await
            .map_err(|e| self.err("reading an event", e))?;
        let Some(r) = row else { return Ok(None) };
        // The headers as JSON text, no attempt history, the next attempt (column 13) a backoff
        // while it is after `now`.
        let detail = (|| -> Result<StoredEventDetail, sqlx::Error> {
            let headers: String = r.try_get(5)?;
            let next_attempt_at: i64 = r.try_get(13)?;
            admin_rows::stored_event(
                &Cols(&r),
                serde_json::from_str(&headers).unwrap_or(serde_json::Value::String(headers)),
                Vec::new(),
                (next_attempt_at > to_micros(now)).then(|| from_micros(next_attempt_at)),
            )
        })()
        .map_err(|e| self.err("reading an event", e))?;
        Ok(Some(detail))
    }

    /// The first earlier undelivered event of `event`'s aggregate (`outbox why`), at `now`.
    pub async fn blocker(
        &self,
        event: &StoredEventDetail,
        now: OffsetDateTime,
    ) -> Result<Option<Blocker>, SourceError> {
        // Rendered by `sql::render` from a validated identifier only.
        let query = sqlx::query(sqlx::AssertSqlSafe(self.blocker.as_str()))
            .bind(&event.summary.aggregate_type)
            .bind(&event.summary.aggregate_id)
            .bind(event.seq)
            .bind(to_micros(now));
        let row = query
            .fetch_optional(&self.pool)
            .await
            .map_err(|e| self.err("explaining an event", e))?;
        row.map(|r| admin_rows::blocker(&Cols(&r)))
            .transpose()
            .map_err(|e| self.err("explaining an event", e))
    }

    /// Puts the selected dead letters back in line; returns the ids put back.
    pub async fn retry(&self, selection: &RetrySelection) -> Result<Vec<Uuid>, SourceError> {
        let (ids, event_type, all) = match selection {
            RetrySelection::Ids(ids) => (
                Some(
                    serde_json::Value::from(ids.iter().map(Uuid::to_string).collect::<Vec<_>>())
                        .to_string(),
                ),
                None,
                false,
            ),
            RetrySelection::EventType(t) => (None, Some(t.clone()), false),
            RetrySelection::All => (None, None, true),
        };
        // Rendered by `sql::render` from a validated identifier only.
        let ids: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(self.retry.as_str()))
            .bind(ids)
            .bind(event_type)
            .bind(all)
            .fetch_all(&self.pool)
            .await
            .map_err(|e| self.err("retrying dead letters", e))?;
        ids.into_iter()
            .map(parse_id)
            .collect::<Result<_, _>>()
            .map_err(|e| self.err("retrying dead letters", e))
    }

    /// Deletes dead letters dead-lettered before `before`; returns their ids.
    pub async fn purge(
        &self,
        before: OffsetDateTime,
        event_type: Option<&str>,
    ) -> Result<Vec<Uuid>, SourceError> {
        // Rendered by `sql::render` from a validated identifier only.
        let ids: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(self.purge.as_str()))
            .bind(to_micros(before))
            .bind(event_type)
            .fetch_all(&self.pool)
            .await
            .map_err(|e| self.err("purging dead letters", e))?;
        ids.into_iter()
            .map(parse_id)
            .collect::<Result<_, _>>()
            .map_err(|e| self.err("purging dead letters", e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dead_letter_queries_render_without_leftover_placeholders() {
        let table = Identifier::new("events").expect("valid");
        for sql in [
            include_str!("../queries/outbox_dead_list.sql"),
            include_str!("../queries/outbox_dead_show.sql"),
            include_str!("../queries/outbox_dead_retry.sql"),
            include_str!("../queries/outbox_dead_purge.sql"),
            include_str!("../queries/outbox_why_blocker.sql"),
        ] {
            assert!(!render(sql, &table).contains("{{"));
        }
    }
}
