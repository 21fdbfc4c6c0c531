//! The shop: places orders. The order row and its `order.placed` event are written in the
//! same transaction, so both exist or neither does.

use outbox_core::NewEvent;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// The `order.placed` payload.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OrderPlaced {
    /// The order.
    pub order_id: String,
    /// Who placed it.
    pub customer: String,
    /// Its total, in cents.
    pub total_cents: i64,
}

impl OrderPlaced {
    /// The outbox event for this order (aggregate `Order`/`order_id`).
    pub fn event(&self) -> anyhow::Result<NewEvent> {
        Ok(NewEvent::json(
            "Order",
            &self.order_id,
            "order.placed",
            self,
        )?)
    }
}

/// SQLite: creates the `orders` table (the outbox table is created by `outbox_sqlite::migrate`).
pub async fn prepare_sqlite(pool: &sqlx::SqlitePool) -> anyhow::Result<()> {
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS orders (id TEXT PRIMARY KEY, customer TEXT NOT NULL, total_cents INTEGER NOT NULL)",
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// SQLite: one transaction, two writes.
pub async fn place_order_sqlite(
    pool: &sqlx::SqlitePool,
    order: &OrderPlaced,
) -> anyhow::Result<Uuid> {
    let mut tx = pool.begin().await?;
    sqlx::query("INSERT INTO orders (id, customer, total_cents) VALUES (?, ?, ?)")
        .bind(&order.order_id)
        .bind(&order.customer)
        .bind(order.total_cents)
        .execute(&mut *tx)
        .await?;
    let event_id = outbox_sqlite::enqueue(&mut *tx, &order.event()?).await?;
    tx.commit().await?;
    Ok(event_id)
}

/// PostgreSQL: creates the `orders` table (the outbox table is created by
/// `outbox_postgres::migrate`).
pub async fn prepare_postgres(pool: &sqlx::PgPool) -> anyhow::Result<()> {
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS orders (id text PRIMARY KEY, customer text NOT NULL, total_cents bigint NOT NULL)",
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// PostgreSQL: one transaction, two writes.
pub async fn place_order_postgres(
    pool: &sqlx::PgPool,
    order: &OrderPlaced,
) -> anyhow::Result<Uuid> {
    let mut tx = pool.begin().await?;
    sqlx::query("INSERT INTO orders (id, customer, total_cents) VALUES ($1, $2, $3)")
        .bind(&order.order_id)
        .bind(&order.customer)
        .bind(order.total_cents)
        .execute(&mut *tx)
        .await?;
    let event_id = outbox_postgres::enqueue(&mut *tx, &order.event()?).await?;
    tx.commit().await?;
    Ok(event_id)
}
