//! The loyalty service: awards points for every placed order, exactly once.
//!
//! The side effect (a row in `awards`, points added to `points`) and the inbox's dedup record
//! commit in one transaction. `awards` deliberately has no unique key on `order_id`: if the
//! inbox let a duplicate through, it would show there as a second row.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use outbox_inbox::{InboxMessage, PgInbox, SqliteInbox};

use crate::shop::OrderPlaced;
use crate::{CONSUMER, POINTS_PER_UNIT};

/// What the consumer saw.
#[derive(Debug, Default)]
pub struct Counters {
    /// Messages handed to the handler (first deliveries, duplicates and retries).
    pub deliveries: AtomicU64,
    /// Deliveries the inbox recognised as already processed.
    pub duplicates: AtomicU64,
    /// Commits after which the handler pretended to crash before acknowledging.
    pub lost_acks: AtomicU64,
}

impl Counters {
    fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }
    /// Reads a counter.
    pub fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }
}

/// Points for an order: one per whole currency unit.
pub fn points_for(order: &OrderPlaced) -> i64 {
    order.total_cents / 100 * POINTS_PER_UNIT
}

/// The handler's answer when it pretends to crash between commit and ack.
#[derive(Debug)]
pub struct LostAck;

impl std::error::Error for LostAck {}

impl std::fmt::Display for LostAck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("simulated crash after commit, before the acknowledgement")
    }
}

/// SQLite: creates `points` and `awards`, and the inbox table.
pub async fn prepare_sqlite(pool: &sqlx::SqlitePool, inbox: &SqliteInbox) -> anyhow::Result<()> {
    inbox.migrate(pool).await?;
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS points (customer TEXT PRIMARY KEY, points INTEGER NOT NULL)",
    )
    .execute(pool)
    .await?;
    sqlx::query("CREATE TABLE IF NOT EXISTS awards (order_id TEXT NOT NULL, customer TEXT NOT NULL, points INTEGER NOT NULL)")
        .execute(pool)
        .await?;
    Ok(())
}

/// SQLite: handles one `order.placed` message. `lose_ack` decides, per first delivery,
/// whether to pretend the process died right after the commit.
pub async fn handle_sqlite(
    pool: &sqlx::SqlitePool,
    inbox: &SqliteInbox,
    counters: &Arc<Counters>,
    message: InboxMessage,
    lose_ack: bool,
) -> anyhow::Result<()> {
    Counters::bump(&counters.deliveries);
    let Some(mut tx) = inbox.begin(pool, CONSUMER, message.id).await? else {
        Counters::bump(&counters.duplicates);
        return Ok(());
    };
    let order: OrderPlaced = serde_json::from_slice(&message.payload)?;
    let points = points_for(&order);
    sqlx::query("INSERT INTO awards (order_id, customer, points) VALUES (?, ?, ?)")
        .bind(&order.order_id)
        .bind(&order.customer)
        .bind(points)
        .execute(&mut *tx)
        .await?;
    sqlx::query(
        "INSERT INTO points (customer, points) VALUES (?, ?) \
         ON CONFLICT (customer) DO UPDATE SET points = points + excluded.points",
    )
    .bind(&order.customer)
    .bind(points)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    if lose_ack {
        Counters::bump(&counters.lost_acks);
        return Err(LostAck.into());
    }
    Ok(())
}

/// PostgreSQL: creates schema `loyalty` with `points`, `awards` and the inbox table.
pub async fn prepare_postgres(pool: &sqlx::PgPool, inbox: &PgInbox) -> anyhow::Result<()> {
    sqlx::query("CREATE SCHEMA IF NOT EXISTS loyalty")
        .execute(pool)
        .await?;
    inbox.migrate(pool).await?;
    sqlx::query("CREATE TABLE IF NOT EXISTS loyalty.points (customer text PRIMARY KEY, points bigint NOT NULL)")
        .execute(pool)
        .await?;
    sqlx::query("CREATE TABLE IF NOT EXISTS loyalty.awards (order_id text NOT NULL, customer text NOT NULL, points bigint NOT NULL)")
        .execute(pool)
        .await?;
    Ok(())
}

/// PostgreSQL: handles one `order.placed` message (see [`handle_sqlite`]).
pub async fn handle_postgres(
    pool: &sqlx::PgPool,
    inbox: &PgInbox,
    counters: &Arc<Counters>,
    message: InboxMessage,
    lose_ack: bool,
) -> anyhow::Result<()> {
    Counters::bump(&counters.deliveries);
    let Some(mut tx) = inbox.begin(pool, CONSUMER, message.id).await? else {
        Counters::bump(&counters.duplicates);
        return Ok(());
    };
    let order: OrderPlaced = serde_json::from_slice(&message.payload)?;
    let points = points_for(&order);
    sqlx::query("INSERT INTO loyalty.awards (order_id, customer, points) VALUES ($1, $2, $3)")
        .bind(&order.order_id)
        .bind(&order.customer)
        .bind(points)
        .execute(&mut *tx)
        .await?;
    sqlx::query(
        "INSERT INTO loyalty.points (customer, points) VALUES ($1, $2) \
         ON CONFLICT (customer) DO UPDATE SET points = loyalty.points.points + excluded.points",
    )
    .bind(&order.customer)
    .bind(points)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    if lose_ack {
        Counters::bump(&counters.lost_acks);
        return Err(LostAck.into());
    }
    Ok(())
}
