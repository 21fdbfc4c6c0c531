//! Dead letters: list, show, retry, purge (`outbox dead ...`).

use std::sync::Arc;

use outbox_core::SourceError;
use outbox_core::admin::{AttemptError, DeadLetter, RetrySelection, StoredEventDetail};
use outbox_core::admin_rows;
use outbox_sql::rows::fetch_decoded;
use sqlx::types::Json;
use sqlx::{PgPool, Row};
use time::OffsetDateTime;
use uuid::Uuid;

use crate::config::PostgresConfig;
use crate::error::source_error;
use crate::sql::{Cols, Queries, stmt};

/// Dead-letter operations on one outbox table.
#[derive(Debug, Clone)]
pub struct PgDeadLetters {
    pool: crate::db::Db,
    queries: Arc<Queries>,
    table: String,
    cdc: bool,
}

impl PgDeadLetters {
    /// Operations on `config`'s table.
    pub fn new(pool: PgPool, config: &PostgresConfig) -> Self {
        let table = config.qualified_table();
        Self {
            pool: crate::db::Db::new(pool, config.transaction_pooling),
            queries: Arc::new(Queries::new(&table)),
            table: table.to_string(),
            cdc: config.mode == crate::Mode::Cdc,
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
        let query = crate::sql::query(stmt(&self.queries.dead_list))
            .bind(event_type)
            .bind(aggregate_id)
            .bind(limit);
        fetch_decoded(query, &self.pool, |r| admin_rows::dead_letter(&Cols(r)))
            .await
            .map_err(|e| self.err("listing dead letters", e))
    }

    /// One event in full, or `None` when no row has this id.
    pub async fn show(&self, id: Uuid) -> Result<Option<StoredEventDetail>, SourceError> {
        self.show_at(id, OffsetDateTime::now_utc()).await
    }

    /// [`PgDeadLetters::show`] at `now` (which decides whether a next attempt is backoff).
    pub async fn show_at(
        &self,
        id: Uuid,
        now: OffsetDateTime,
    ) -> Result<Option<StoredEventDetail>, SourceError> {
        let row = crate::sql::query(stmt(&self.queries.dead_show))
            .bind(id)
            .bind(now)
            .fetch_optional(&self.pool)
            .await
            .map_err(|e| self.err("reading an event", e))?;
        let Some(r) = row else { return Ok(None) };
        // The headers as `jsonb`, the attempt history (column 13), the backoff (14) as the
        // query computed it at `now`.
        let detail = (|| -> Result<StoredEventDetail, sqlx::Error> {
            let headers: Json<serde_json::Value> = r.try_get(5)?;
            let history: Json<Vec<AttemptError>> = r.try_get(13)?;
            admin_rows::stored_event(&Cols(&r), headers.0, history.0, r.try_get(14)?)
        })()
        .map_err(|e| self.err("reading an event", e))?;
        Ok(Some(detail))
    }

    /// Puts the selected dead letters back in line; returns the ids put back. In CDC mode the
    /// rows are re-inserted (the publication streams inserts only), together with every other
    /// dead row of their aggregates, in their original order.
    pub async fn retry(&self, selection: &RetrySelection) -> Result<Vec<Uuid>, SourceError> {
        let (ids, event_type, all) = match selection {
            RetrySelection::Ids(ids) => (Some(ids.clone()), None, false),
            RetrySelection::EventType(t) => (None, Some(t.clone()), false),
            RetrySelection::All => (None, None, true),
        };
        if !self.cdc {
            return crate::sql::query_scalar(stmt(&self.queries.dead_retry))
                .bind(ids)
                .bind(event_type)
                .bind(all)
                .fetch_all(&self.pool)
                .await
                .map_err(|e| self.err("retrying dead letters", e));
        }
        // CDC: the re-inserted rows keep their seq (migration 0005), which the relay
        // compares with events streamed again after a restart.
        let err = |e| self.err("retrying dead letters", e);
        let mut tx = self.pool.begin().await.map_err(err)?;
        crate::sql::query(crate::cdc::queries::KEEP_SEQ)
            .execute(&mut *tx)
            .await
            .map_err(err)?;
        // After the aggregates' locks: a relay parking their events commits first or waits.
        crate::sql::query(stmt(&self.queries.cdc_dead_retry_lock))
            .bind(ids.clone())
            .bind(event_type.clone())
            .bind(all)
            .execute(&mut *tx)
            .await
            .map_err(err)?;
        let put_back = crate::sql::query_scalar(stmt(&self.queries.cdc_dead_restream))
            .bind(ids)
            .bind(event_type)
            .bind(all)
            .fetch_all(&mut *tx)
            .await
            .map_err(err)?;
        tx.commit().await.map_err(err)?;
        Ok(put_back)
    }

    /// Deletes dead letters dead-lettered before `before`; returns their ids.
    pub async fn purge(
        &self,
        before: OffsetDateTime,
        event_type: Option<&str>,
    ) -> Result<Vec<Uuid>, SourceError> {
        crate::sql::query_scalar(stmt(&self.queries.dead_purge))
            .bind(before)
            .bind(event_type)
            .fetch_all(&self.pool)
            .await
            .map_err(|e| self.err("purging dead letters", e))
    }
}
