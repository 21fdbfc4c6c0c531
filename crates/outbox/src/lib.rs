//! Transactional outbox for Rust applications.
//!
//! Write an event in the same database transaction as the business data it describes; the
//! `outbox relay` daemon publishes it afterwards, at least once, in per-aggregate order.
//!
//! ```no_run
//! # async fn example(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
//! let mut tx = pool.begin().await?;
//! sqlx::query("UPDATE orders SET status = 'placed' WHERE id = $1")
//!     .bind("o_91f2")
//!     .execute(&mut *tx)
//!     .await?;
//! let event = outbox::NewEvent::json(
//!     "Order",
//!     "o_91f2",
//!     "order.placed",
//!     &serde_json::json!({ "order_id": "o_91f2", "total_cents": 1250 }),
//! )?;
//! let id = outbox::postgres::enqueue(&mut *tx, &event).await?; // same transaction
//! tx.commit().await?; // the order and its event exist together, or neither does
//! # let _ = id; Ok(()) }
//! ```
//!
//! Features: `postgres` and `sqlite` (both on by default) and `mysql` select the database
//! modules; `otel` adds `NewEvent::with_trace_context` (the current OpenTelemetry span into
//! the event's `traceparent` / `tracestate`) and, with `inbox`, the consumer loops' spans.

pub use outbox_core::{Event, Identifier, NewEvent, QualifiedTable};

/// PostgreSQL: [`enqueue`](postgres::enqueue), [`enqueue_batch`](postgres::enqueue_batch),
/// [`PgOutbox`](postgres::PgOutbox) for a custom schema or table, and
/// [`migrate`](postgres::migrate).
#[cfg(feature = "postgres")]
pub mod postgres {
    pub use outbox_postgres::{
        EnqueueError, MigrateError, PgOutbox, enqueue, enqueue_batch, migrate,
    };
}

/// SQLite (the embedded default): the same shape as [`postgres`].
#[cfg(feature = "sqlite")]
pub mod sqlite {
    pub use outbox_sqlite::*;
}

/// MySQL 8 / MariaDB 10.6+ (feature `mysql`): [`enqueue`](mysql::enqueue),
/// [`enqueue_batch`](mysql::enqueue_batch) into the table `outbox`,
/// [`MySqlOutbox`](mysql::MySqlOutbox) for another table, and [`migrate`](mysql::migrate).
#[cfg(feature = "mysql")]
pub mod mysql {
    pub use outbox_mysql::{
        EnqueueError, MigrateError, MySqlOutbox, enqueue, enqueue_batch, migrate,
    };
}

/// The relay's JSON Schema check, in the producer (feature `schemas`, opt-in): load the same
/// directory as the relay's `[payload] schemas` once, then check each event before writing
/// it, inside the transaction; a refused event is the caller's to roll back.
///
/// ```no_run
/// # async fn example(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
/// let schemas = outbox::schemas::Schemas::load("schemas/".as_ref())
///     .map_err(|errors| errors[0].to_string())?;
/// let event = outbox::NewEvent::new("Order", "o_1", "order.placed", r#"{"total_cents":-5}"#);
/// let mut tx = pool.begin().await?;
/// // Err: "payload does not match schema order.placed.json: /total_cents: -5 is less than
/// // the minimum of 0", the reason the relay would have dead-lettered it with.
/// schemas.check_new(&event)?;
/// outbox::postgres::enqueue(&mut *tx, &event).await?;
/// tx.commit().await?;
/// # Ok(()) }
/// ```
#[cfg(feature = "schemas")]
pub mod schemas {
    pub use outbox_payload::schemas::{SchemaError, SchemaViolation, Schemas};
}

/// The consumer side (feature `inbox`): [`PgInbox`](inbox::PgInbox),
/// [`SqliteInbox`](inbox::SqliteInbox) and the consumer loops; see `docs/inbox.md`.
#[cfg(feature = "inbox")]
pub mod inbox {
    pub use outbox_inbox::*;
}
