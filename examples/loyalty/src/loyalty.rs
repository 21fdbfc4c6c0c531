//! The loyalty service: awards points for every placed order, exactly once.
//!
//! The side effect (a row in `awards`, points added to `points`) and the inbox's dedup record
//! commit in one transaction. `awards` deliberately has no unique key on `order_id`: if the
//! inbox let a duplicate through, it would show there as a second row.

use std::sync::atomic::{AtomicU64, Ordering};

use outbox_inbox::{InboxError, InboxMessage, PgInbox, SqliteInbox};

use crate::POINTS_PER_UNIT;
use crate::shop::OrderPlaced;

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

/// A database's SQL for awarding an order's points, for [`handle`]: `award` writes the order's
/// row in `awards` (binds `order_id`, `customer`, `points`), `add_points` adds them to the
/// customer's total in `points` (binds `customer`, `points`).
#[derive(Debug)]
pub struct AwardSql {
    award: &'static str,
    add_points: &'static str,
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

/// SQLite's [`AwardSql`], on the tables of [`prepare_sqlite`].
pub const SQLITE: AwardSql = AwardSql {
    award: "INSERT INTO awards (order_id, customer, points) VALUES (?, ?, ?)",
    add_points: "INSERT INTO points (customer, points) VALUES (?, ?) \
                 ON CONFLICT (customer) DO UPDATE SET points = points + excluded.points",
};

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

/// PostgreSQL's [`AwardSql`], on the tables of [`prepare_postgres`].
pub const POSTGRES: AwardSql = AwardSql {
    award: "INSERT INTO loyalty.awards (order_id, customer, points) VALUES ($1, $2, $3)",
    add_points: "INSERT INTO loyalty.points (customer, points) VALUES ($1, $2) \
                 ON CONFLICT (customer) DO UPDATE SET points = loyalty.points.points + excluded.points",
};

/// Handles one `order.placed` message, on any database. `begin` is the inbox's
/// `begin(pool, CONSUMER, message.id)`: it records the message as processed by
/// [`CONSUMER`](crate::CONSUMER) in a new transaction, or gives `None` when it already was (a
/// duplicate, acknowledged without a side effect). In that transaction the order's points are
/// awarded with `sql` (the database's [`AwardSql`]), then it commits. `lose_ack` decides, per
/// first delivery, whether to pretend the process died right after the commit.
pub async fn handle<DB>(
    counters: &Counters,
    begin: impl Future<Output = Result<Option<sqlx::Transaction<'static, DB>>, InboxError>>,
    sql: &AwardSql,
    message: InboxMessage,
    lose_ack: bool,
) -> anyhow::Result<()>
where
    // What the two statements need of a database: its connection runs them, and it binds
    // text and 64-bit integers (true of every database sqlx supports).
    DB: sqlx::Database,
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    DB::Arguments: sqlx::IntoArguments<DB>,
    for<'q> String: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    for<'q> i64: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
{
    Counters::bump(&counters.deliveries);
    let Some(mut tx) = begin.await? else {
        Counters::bump(&counters.duplicates);
        return Ok(());
    };
    let order: OrderPlaced = serde_json::from_slice(&message.payload)?;
    let points = points_for(&order);
    sqlx::query(sql.award)
        .bind(&order.order_id)
        .bind(&order.customer)
        .bind(points)
        .execute(&mut *tx)
        .await?;
    sqlx::query(sql.add_points)
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
