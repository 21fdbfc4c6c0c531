//! The producer side: write events into the outbox inside the caller's own transaction.

use std::sync::{Arc, LazyLock};

use outbox_core::enqueue::headers_json;
use outbox_core::{Identifier, NewEvent};
use outbox_sql::poll::bind_new_event;
use sqlx::{Acquire, Sqlite, SqliteExecutor};
use time::OffsetDateTime;
use uuid::Uuid;

use crate::error::EnqueueError;
use crate::sql::{Queries, stmt};
use crate::timestamp::to_micros;

/// A handle on one outbox table for producers. Cheap to clone; create it once.
///
/// ```no_run
/// # async fn place_order(pool: &sqlx::SqlitePool) -> Result<(), Box<dyn std::error::Error>> {
/// use outbox_core::NewEvent;
/// use outbox_sqlite::SqliteOutbox;
///
/// let outbox = SqliteOutbox::default();
/// // IMMEDIATE takes SQLite's write lock at once (waiting up to busy_timeout), instead of
/// // failing with SQLITE_BUSY when a read-then-write transaction loses a race.
/// let mut tx = pool.begin_with("BEGIN IMMEDIATE").await?;
/// sqlx::query("INSERT INTO orders (id, total_cents) VALUES (?1, ?2)")
///     .bind("o_91f2").bind(1250_i64)
///     .execute(&mut *tx).await?;
/// let event = NewEvent::json("Order", "o_91f2", "order.placed",
///     &serde_json::json!({"order_id": "o_91f2", "total_cents": 1250}))?;
/// let id = outbox.enqueue(&mut *tx, &event).await?;  // same transaction
/// tx.commit().await?;                                  // both or neither
/// # let _ = id; Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct SqliteOutbox {
    table: Identifier,
    queries: Arc<Queries>,
}

impl Default for SqliteOutbox {
    /// The table `outbox`.
    fn default() -> Self {
        Self::new(crate::SqliteConfig::default().table)
    }
}

impl SqliteOutbox {
    /// A handle on `table`.
    pub fn new(table: Identifier) -> Self {
        let queries = Arc::new(Queries::new(&table));
        Self { table, queries }
    }

    /// The table this handle writes to.
    pub fn table(&self) -> &Identifier {
        &self.table
    }

    /// Writes `event` using `executor`: pass `&mut *tx` to write in your transaction (the event
    /// then exists exactly when your transaction commits). Returns the event id: the one set
    /// on the event, else a new UUIDv7.
    pub async fn enqueue<'e, E: SqliteExecutor<'e>>(
        &self,
        executor: E,
        event: &NewEvent,
    ) -> Result<Uuid, EnqueueError> {
        outbox_core::enqueue::validate(event)?;
        let id = event.id.unwrap_or_else(Uuid::now_v7);
        self.insert(executor, id, event, OffsetDateTime::now_utc())
            .await?;
        Ok(id)
    }

    /// Writes many events, in order (events of one aggregate keep their order), atomically:
    /// inside a savepoint when given your transaction (`&mut tx`), else in a transaction of
    /// its own. Returns their ids, in input order.
    ///
    /// One prepared insert per event rather than one multi-row statement: SQLite runs
    /// in-process, so a "round trip" is a call into the library on sqlx's worker thread, and
    /// the prepared statement is cached; a multi-row statement would need SQL built per batch
    /// size.
    pub async fn enqueue_batch<'a, A: Acquire<'a, Database = Sqlite>>(
        &self,
        conn: A,
        events: &[NewEvent],
    ) -> Result<Vec<Uuid>, EnqueueError> {
        if events.is_empty() {
            return Ok(Vec::new());
        }
        for e in events {
            outbox_core::enqueue::validate(e)?;
        }
        let mut tx = conn.begin().await.map_err(EnqueueError::database)?;
        let now = OffsetDateTime::now_utc();
        let mut ids = Vec::with_capacity(events.len());
        for e in events {
            let id = e.id.unwrap_or_else(Uuid::now_v7);
            self.insert(&mut *tx, id, e, now).await?;
            ids.push(id);
        }
        tx.commit().await.map_err(EnqueueError::database)?;
        Ok(ids)
    }

    /// Copies relayed events into this table (a subscription's table, `[[subscription]]`) in
    /// one transaction: ids, payloads, headers and creation times are kept, slice order becomes
    /// seq order, and an id already present is skipped. Returns how many rows were new.
    pub async fn copy_in<'a, A: Acquire<'a, Database = Sqlite>>(
        &self,
        conn: A,
        events: &[outbox_core::Event],
    ) -> Result<u64, sqlx::Error> {
        let mut tx = conn.begin().await?;
        let mut new = 0;
        for e in events {
            let headers: serde_json::Map<String, serde_json::Value> = e
                .headers
                .iter()
                .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone())))
                .collect();
            new += sqlx::query(stmt(&self.queries.copy_in))
                .bind(e.id.hyphenated().to_string())
                .bind(&e.aggregate_type)
                .bind(&e.aggregate_id)
                .bind(&e.event_type)
                .bind(&e.payload[..])
                .bind(serde_json::Value::Object(headers).to_string())
                .bind(to_micros(e.created_at))
                .execute(&mut *tx)
                .await?
                .rows_affected();
        }
        tx.commit().await?;
        Ok(new)
    }

    async fn insert<'e, E: SqliteExecutor<'e>>(
        &self,
        executor: E,
        id: Uuid,
        event: &NewEvent,
        now: OffsetDateTime,
    ) -> Result<(), EnqueueError> {
        let insert = sqlx::query(stmt(&self.queries.insert));
        bind_new_event(
            insert,
            id.hyphenated().to_string(),
            event,
            headers_json(event),
        )
        .bind(to_micros(now))
        .execute(executor)
        .await
        .map_err(EnqueueError::database)?;
        Ok(())
    }
}

/// Writes `event` into the table `outbox` with `executor` (see [`SqliteOutbox::enqueue`]).
pub async fn enqueue<'e, E: SqliteExecutor<'e>>(
    executor: E,
    event: &NewEvent,
) -> Result<Uuid, EnqueueError> {
    DEFAULT.enqueue(executor, event).await
}

/// Writes `events` into the table `outbox`, atomically and in order (see
/// [`SqliteOutbox::enqueue_batch`]).
pub async fn enqueue_batch<'a, A: Acquire<'a, Database = Sqlite>>(
    conn: A,
    events: &[NewEvent],
) -> Result<Vec<Uuid>, EnqueueError> {
    DEFAULT.enqueue_batch(conn, events).await
}

/// The handle of the free functions: the default table.
static DEFAULT: LazyLock<SqliteOutbox> = LazyLock::new(SqliteOutbox::default);
