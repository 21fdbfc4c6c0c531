//! The producer side: write events into the outbox inside the caller's own transaction.

use std::sync::{Arc, LazyLock};

use outbox_core::enqueue::headers_object;
use outbox_core::{NewEvent, QualifiedTable};
use outbox_sql::poll::bind_new_event;
use sqlx::PgExecutor;
use sqlx::types::Json;
use uuid::Uuid;

use crate::error::EnqueueError;
use crate::event_arrays::EventArrays;
use crate::sql::{Queries, stmt};

/// A handle on one outbox table for producers. Cheap to clone; create it once.
///
/// ```no_run
/// # async fn place_order(pool: &sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
/// use outbox_core::NewEvent;
/// use outbox_postgres::PgOutbox;
///
/// let outbox = PgOutbox::default();
/// let mut tx = pool.begin().await?;
/// sqlx::query("INSERT INTO orders (id, total_cents) VALUES ($1, $2)")
///     .bind("o_91f2").bind(1250_i64)
///     .execute(&mut *tx).await?;
/// let event = NewEvent::json("Order", "o_91f2", "order.placed",
///     &serde_json::json!({"order_id": "o_91f2", "total_cents": 1250}))?;
/// let id = outbox.enqueue(&mut *tx, &event).await?;  // same transaction
/// tx.commit().await?;                                  // both or neither
/// # let _ = id; Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct PgOutbox {
    table: QualifiedTable,
    queries: Arc<Queries>,
    named_statements: bool,
}

impl Default for PgOutbox {
    /// The table `public.outbox`.
    fn default() -> Self {
        Self::new(crate::PostgresConfig::new("postgres://").qualified_table())
    }
}

impl PgOutbox {
    /// A handle on `table`.
    pub fn new(table: QualifiedTable) -> Self {
        let queries = Arc::new(Queries::new(&table));
        Self {
            table,
            queries,
            named_statements: true,
        }
    }

    /// For a pool that reaches PostgreSQL through a transaction pooler (PgBouncer
    /// `pool_mode = transaction`, before 1.21 or without `max_prepared_statements`): writes
    /// with unnamed statements, which live only inside your transaction. (Give your own
    /// queries `.persistent(false)` too; sqlx names and caches statements by default.)
    #[must_use]
    pub fn transaction_pooling(mut self, on: bool) -> Self {
        self.named_statements = !on;
        self
    }

    /// The table this handle writes to.
    pub fn table(&self) -> &QualifiedTable {
        &self.table
    }

    /// Writes `event` using `executor`: pass `&mut *tx` to write in your transaction (the event
    /// then exists exactly when your transaction commits). Returns the event id.
    pub async fn enqueue<'e, E: PgExecutor<'e>>(
        &self,
        executor: E,
        event: &NewEvent,
    ) -> Result<Uuid, EnqueueError> {
        outbox_core::enqueue::validate(event)?;
        let id = event.id.unwrap_or_else(Uuid::now_v7);
        let insert = crate::sql::query(stmt(&self.queries.insert))
            .persistent(self.named_statements && crate::sql::named());
        bind_new_event(insert, id, event, Json(headers_object(event)))
            .execute(executor)
            .await
            .map_err(EnqueueError::database)?;
        Ok(id)
    }

    /// Writes many events in one round trip, in order (events of one aggregate keep their
    /// order). Returns their ids, in input order.
    pub async fn enqueue_batch<'e, E: PgExecutor<'e>>(
        &self,
        executor: E,
        events: &[NewEvent],
    ) -> Result<Vec<Uuid>, EnqueueError> {
        if events.is_empty() {
            return Ok(Vec::new());
        }
        let n = events.len();
        let (mut ids, mut types, mut agg_ids, mut event_types, mut payloads, mut headers) = (
            Vec::with_capacity(n),
            Vec::with_capacity(n),
            Vec::with_capacity(n),
            Vec::with_capacity(n),
            Vec::with_capacity(n),
            Vec::with_capacity(n),
        );
        for e in events {
            outbox_core::enqueue::validate(e)?;
            ids.push(e.id.unwrap_or_else(Uuid::now_v7));
            types.push(e.aggregate_type.as_str());
            agg_ids.push(e.aggregate_id.as_str());
            event_types.push(e.event_type.as_str());
            payloads.push(&e.payload[..]);
            headers.push(Json(headers_object(e)));
        }
        crate::sql::query(stmt(&self.queries.insert_batch))
            .persistent(self.named_statements && crate::sql::named())
            .bind(&ids)
            .bind(&types)
            .bind(&agg_ids)
            .bind(&event_types)
            .bind(&payloads)
            .bind(&headers)
            .execute(executor)
            .await
            .map_err(EnqueueError::database)?;
        Ok(ids)
    }

    /// Copies relayed events into this table (a subscription's table, `[[subscription]]`):
    /// ids, payloads, headers and creation times are kept, slice order becomes seq order, and
    /// an id already present is skipped. Returns how many rows were new.
    pub async fn copy_in<'e, E: PgExecutor<'e>>(
        &self,
        executor: E,
        events: &[outbox_core::Event],
    ) -> Result<u64, sqlx::Error> {
        if events.is_empty() {
            return Ok(0);
        }
        // Every header is copied.
        let arrays = EventArrays::new(events, |_| true);
        let done = arrays
            .bind(
                crate::sql::query(stmt(&self.queries.copy_in))
                    .persistent(self.named_statements && crate::sql::named()),
            )
            .execute(executor)
            .await?;
        Ok(done.rows_affected())
    }
}

/// Writes `event` into `public.outbox` with `executor` (see [`PgOutbox::enqueue`]).
pub async fn enqueue<'e, E: PgExecutor<'e>>(
    executor: E,
    event: &NewEvent,
) -> Result<Uuid, EnqueueError> {
    DEFAULT.enqueue(executor, event).await
}

/// Writes `events` into `public.outbox` in one round trip (see [`PgOutbox::enqueue_batch`]).
pub async fn enqueue_batch<'e, E: PgExecutor<'e>>(
    executor: E,
    events: &[NewEvent],
) -> Result<Vec<Uuid>, EnqueueError> {
    DEFAULT.enqueue_batch(executor, events).await
}

/// The handle of the free functions: the default table.
static DEFAULT: LazyLock<PgOutbox> = LazyLock::new(PgOutbox::default);
