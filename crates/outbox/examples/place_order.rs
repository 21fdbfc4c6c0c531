//! Places an order and its `order.placed` event in one PostgreSQL transaction.
//!
//! ```sh
//! DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres \
//!     cargo run -p outbox --example place_order
//! ```
//! Then `outbox relay` publishes the event (see the README).

use anyhow::Context;
use outbox::NewEvent;

#[derive(serde::Serialize)]
struct OrderPlaced<'a> {
    order_id: &'a str,
    total_cents: i64,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let url = std::env::var("DATABASE_URL").context("set DATABASE_URL to a PostgreSQL URL")?;
    let pool = sqlx::PgPool::connect(&url)
        .await
        .context("connecting to PostgreSQL")?;
    let table = outbox::QualifiedTable::new(
        Some(outbox::Identifier::new("public")?),
        outbox::Identifier::new("outbox")?,
    );
    outbox::postgres::migrate(&pool, &table, false).await?;
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS orders (id text PRIMARY KEY, total_cents bigint NOT NULL)",
    )
    .execute(&pool)
    .await?;

    let order_id = format!("o_{}", uuid_like());
    let mut tx = pool.begin().await?;
    sqlx::query("INSERT INTO orders (id, total_cents) VALUES ($1, $2)")
        .bind(&order_id)
        .bind(1250_i64)
        .execute(&mut *tx)
        .await?;
    let event = NewEvent::json(
        "Order",
        &order_id,
        "order.placed",
        &OrderPlaced {
            order_id: &order_id,
            total_cents: 1250,
        },
    )?
    .with_header("source", "examples/place_order");
    let event_id = outbox::postgres::enqueue(&mut *tx, &event).await?;
    tx.commit().await?;
    println!("placed order {order_id}; event {event_id} is in the outbox");
    Ok(())
}

fn uuid_like() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    format!("{nanos:x}")
}
