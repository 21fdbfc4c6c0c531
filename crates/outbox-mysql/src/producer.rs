//! [`MySqlOutbox`]: writes events into the outbox table inside the caller's transaction.

use std::sync::{Arc, LazyLock};

use outbox_core::enqueue::headers_json;
use outbox_core::{Identifier, NewEvent};
use outbox_sql::poll::bind_new_event;
use sqlx::MySqlConnection;
use uuid::Uuid;

use crate::error::EnqueueError;
use crate::sql::{Queries, stmt};

/// The producer for one outbox table.
///
/// ```no_run
/// # async fn example(pool: sqlx::MySqlPool) -> anyhow::Result<()> {
/// use outbox_core::NewEvent;
/// use outbox_mysql::MySqlOutbox;
///
/// let outbox = MySqlOutbox::default();
/// let mut tx = pool.begin().await?;
/// sqlx::query("UPDATE orders SET state = 'placed' WHERE id = ?").bind("o_1").execute(&mut *tx).await?;
/// outbox.enqueue(&mut tx, &NewEvent::new("Order", "o_1", "order.placed", r#"{"total":1250}"#)).await?;
/// tx.commit().await?; // the order and its event, or neither
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct MySqlOutbox {
    table: Identifier,
    queries: Arc<Queries>,
}

impl Default for MySqlOutbox {
    /// The table `outbox`.
    fn default() -> Self {
        Self::new(Identifier::new("outbox").expect("a valid identifier"))
    }
}

impl MySqlOutbox {
    /// The producer for `table` (created by [`migrate`](crate::migrate)).
    pub fn new(table: Identifier) -> Self {
        let queries = Arc::new(Queries::new(&table));
        Self { table, queries }
    }

    /// The outbox table.
    pub fn table(&self) -> &Identifier {
        &self.table
    }

    /// Writes `event` with the caller's connection, normally inside its open transaction
    /// (`&mut tx`): the event commits or rolls back with the business data. Returns the
    /// event id (`event.id`, or a new UUIDv7).
    ///
    /// The insert takes the aggregate's head row lock until the transaction ends: keep
    /// transactions that write events short, and write one transaction's events for several
    /// aggregates in a consistent order (or retry on a deadlock), as with any row lock.
    pub async fn enqueue(
        &self,
        conn: &mut MySqlConnection,
        event: &NewEvent,
    ) -> Result<Uuid, EnqueueError> {
        outbox_core::enqueue::validate(event)?;
        let id = event.id.unwrap_or_else(Uuid::now_v7);
        bind_new_event(
            sqlx::query(stmt(&self.queries.insert)),
            id.hyphenated().to_string(),
            event,
            headers_json(event),
        )
        .execute(conn)
        .await
        .map_err(EnqueueError::database)?;
        Ok(id)
    }

    /// Writes `events` in order with the caller's connection (normally its open
    /// transaction), [`BATCH_ROWS`] rows per `INSERT` statement: one round trip per
    /// statement instead of per event. Returns the ids in order. Each aggregate's events
    /// get consecutive positions in the order given.
    pub async fn enqueue_batch(
        &self,
        conn: &mut MySqlConnection,
        events: &[NewEvent],
    ) -> Result<Vec<Uuid>, EnqueueError> {
        for event in events {
            outbox_core::enqueue::validate(event)?;
        }
        let ids: Vec<Uuid> = events
            .iter()
            .map(|e| e.id.unwrap_or_else(Uuid::now_v7))
            .collect();
        for (chunk, chunk_ids) in events.chunks(BATCH_ROWS).zip(ids.chunks(BATCH_ROWS)) {
            // Only the number of placeholders varies; every value is bound.
            let sql = format!(
                "{} VALUES {}",
                self.queries.insert_head,
                vec!["(?, ?, ?, ?, ?, ?)"; chunk.len()].join(", ")
            );
            let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
            for (event, id) in chunk.iter().zip(chunk_ids) {
                query = bind_new_event(
                    query,
                    id.hyphenated().to_string(),
                    event,
                    headers_json(event),
                );
            }
            query
                .execute(&mut *conn)
                .await
                .map_err(EnqueueError::database)?;
        }
        Ok(ids)
    }

    /// Copies relayed events into this table (a subscription's table, `[[subscription]]`)
    /// in one transaction, [`BATCH_ROWS`] rows per `INSERT … SELECT`: ids, payloads, headers
    /// and creation times are kept, slice order becomes position and `seq` order, and an id
    /// already present is skipped. Returns how many rows were new.
    ///
    /// Rows already present are filtered out by the `SELECT` (`NOT EXISTS`), never reach the
    /// insert and so never fire the `BEFORE INSERT` trigger: `INSERT IGNORE` or
    /// `ON DUPLICATE KEY` would run the trigger first and burn a `seq` number of the
    /// aggregate for the skipped copy (a gap in `aggregate_seq`). A copy of the same id
    /// racing this one fails on the unique key instead, rolling the whole transaction back
    /// (and its `seq` numbers with it); the fan-out copies the batch again.
    pub async fn copy_in(
        &self,
        conn: &mut MySqlConnection,
        events: &[outbox_core::Event],
    ) -> Result<u64, sqlx::Error> {
        use sqlx::Connection as _;
        let mut tx = conn.begin().await?;
        let mut new = 0;
        for chunk in events.chunks(BATCH_ROWS) {
            // Only the number of placeholders varies; every value is bound.
            let rows = vec![
                "SELECT ? AS n, ? AS id, ? AS aggregate_type, ? AS aggregate_id, ? AS event_type, ? AS payload, ? AS headers, ? AS created_at";
                chunk.len()
            ]
            .join(" UNION ALL ");
            let table = &self.queries.table;
            let sql = format!(
                "INSERT INTO {table} (id, aggregate_type, aggregate_id, event_type, payload, headers, created_at) \
                 SELECT e.id, e.aggregate_type, e.aggregate_id, e.event_type, e.payload, e.headers, e.created_at \
                 FROM ({rows}) AS e \
                 WHERE NOT EXISTS (SELECT 1 FROM {table} AS t WHERE t.id = e.id) \
                 ORDER BY e.n"
            );
            let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
            for (n, e) in chunk.iter().enumerate() {
                let headers: serde_json::Map<String, serde_json::Value> = e
                    .headers
                    .iter()
                    .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone())))
                    .collect();
                let created = e.created_at.to_offset(time::UtcOffset::UTC);
                query = query
                    .bind(i64::try_from(n).unwrap_or(i64::MAX))
                    .bind(e.id.hyphenated().to_string())
                    .bind(&e.aggregate_type)
                    .bind(&e.aggregate_id)
                    .bind(&e.event_type)
                    .bind(&e.payload[..])
                    .bind(serde_json::Value::Object(headers).to_string())
                    .bind(time::PrimitiveDateTime::new(created.date(), created.time()));
            }
            new += query.execute(&mut *tx).await?.rows_affected();
        }
        tx.commit().await?;
        Ok(new)
    }
}

/// Rows per statement of [`MySqlOutbox::enqueue_batch`].
pub const BATCH_ROWS: usize = 500;

/// Writes `event` into the table `outbox` with the caller's connection (normally its open
/// transaction); see [`MySqlOutbox::enqueue`].
pub async fn enqueue(conn: &mut MySqlConnection, event: &NewEvent) -> Result<Uuid, EnqueueError> {
    DEFAULT.enqueue(conn, event).await
}

/// Writes `events` into the table `outbox`; see [`MySqlOutbox::enqueue_batch`].
pub async fn enqueue_batch(
    conn: &mut MySqlConnection,
    events: &[NewEvent],
) -> Result<Vec<Uuid>, EnqueueError> {
    DEFAULT.enqueue_batch(conn, events).await
}

/// The handle of the free functions: the default table.
static DEFAULT: LazyLock<MySqlOutbox> = LazyLock::new(MySqlOutbox::default);
