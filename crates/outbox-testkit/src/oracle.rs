//! The commit-order oracle of the source conformance suite
//! ([`crate::conformance::Harness::write_counted`]), written as a producer in any language
//! would: plain SQL, the four required columns plus `headers`, in the same transaction as a
//! business row (a per-aggregate counter) whose row lock orders the commits.

use std::time::Duration;

use outbox_core::NewEvent;
use sqlx::{MySqlPool, PgPool, SqlitePool};
use uuid::Uuid;

/// The business table of the oracle.
const COUNTERS: &str = "outbox_test_counters";

fn headers(event: &NewEvent) -> String {
    outbox_core::enqueue::headers_json(event)
}

/// PostgreSQL: see [`crate::conformance::Harness::write_counted`]. `table` is the outbox
/// table (schema-qualified text, from the harness's own validated config).
pub async fn pg_write_counted(
    pool: &PgPool,
    table: &str,
    event: &NewEvent,
    outbox_first: bool,
    hold: Duration,
) -> anyhow::Result<(Uuid, i64)> {
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "CREATE TABLE IF NOT EXISTS {COUNTERS} (aggregate_id text PRIMARY KEY, n bigint NOT NULL)"
    )))
    .execute(pool)
    .await
    .or_else(ignore_concurrent_create)?;
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO {COUNTERS} VALUES ($1, 0) ON CONFLICT DO NOTHING"
    )))
    .bind(&event.aggregate_id)
    .execute(pool)
    .await?;
    // Producers that take the aggregate's ordering lock (the outbox insert) and the business
    // row's lock in opposite orders can deadlock; PostgreSQL aborts one of them, and the
    // application retries it, as any application with two lock orders must.
    loop {
        match pg_write_counted_once(pool, table, event, outbox_first, hold).await {
            Err(sqlx::Error::Database(db))
                if matches!(db.code().as_deref(), Some("40P01" | "40001")) =>
            {
                continue;
            }
            other => return Ok(other?),
        }
    }
}

async fn pg_write_counted_once(
    pool: &PgPool,
    table: &str,
    event: &NewEvent,
    outbox_first: bool,
    hold: Duration,
) -> Result<(Uuid, i64), sqlx::Error> {
    let insert = format!(
        "INSERT INTO {table} (aggregate_type, aggregate_id, event_type, payload, headers) \
         VALUES ($1, $2, $3, $4, $5::jsonb) RETURNING id"
    );
    let bump = format!("UPDATE {COUNTERS} SET n = n + 1 WHERE aggregate_id = $1 RETURNING n");
    let mut tx = pool.begin().await?;
    let mut id = Uuid::nil();
    let mut n = 0;
    for step in if outbox_first { [0, 1] } else { [1, 0] } {
        if step == 0 {
            id = sqlx::query_scalar(sqlx::AssertSqlSafe(insert.as_str()))
                .bind(&event.aggregate_type)
                .bind(&event.aggregate_id)
                .bind(&event.event_type)
                .bind(event.payload.as_ref())
                .bind(headers(event))
                .fetch_one(&mut *tx)
                .await?;
        } else {
            n = sqlx::query_scalar(sqlx::AssertSqlSafe(bump.as_str()))
                .bind(&event.aggregate_id)
                .fetch_one(&mut *tx)
                .await?;
        }
        if step == if outbox_first { 0 } else { 1 } {
            tokio::time::sleep(hold).await;
        }
    }
    tx.commit().await?;
    Ok((id, n))
}

/// Two sessions racing `CREATE TABLE IF NOT EXISTS` may both try to create it; the loser's
/// unique violation means it exists.
fn ignore_concurrent_create(e: sqlx::Error) -> Result<sqlx::postgres::PgQueryResult, sqlx::Error> {
    match &e {
        sqlx::Error::Database(db) if db.code().as_deref() == Some("23505") => {
            Ok(sqlx::postgres::PgQueryResult::default())
        }
        _ => Err(e),
    }
}

/// SQLite: see [`crate::conformance::Harness::write_counted`]. SQLite runs one write
/// transaction at a time (`BEGIN IMMEDIATE`), so the writes cannot overlap there: the check
/// still runs and must find commit order.
pub async fn sqlite_write_counted(
    pool: &SqlitePool,
    table: &str,
    event: &NewEvent,
    outbox_first: bool,
    hold: Duration,
) -> anyhow::Result<(Uuid, i64)> {
    let mut tx = pool.begin_with("BEGIN IMMEDIATE").await?;
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "CREATE TABLE IF NOT EXISTS {COUNTERS} (aggregate_id TEXT PRIMARY KEY, n INTEGER NOT NULL)"
    )))
    .execute(&mut *tx)
    .await?;
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO {COUNTERS} VALUES (?1, 0) ON CONFLICT DO NOTHING"
    )))
    .bind(&event.aggregate_id)
    .execute(&mut *tx)
    .await?;
    let insert = format!(
        "INSERT INTO {table} (aggregate_type, aggregate_id, event_type, payload, headers) \
         VALUES (?1, ?2, ?3, ?4, ?5) RETURNING id"
    );
    let bump = format!("UPDATE {COUNTERS} SET n = n + 1 WHERE aggregate_id = ?1 RETURNING n");
    let mut id = String::new();
    let mut n = 0;
    for step in if outbox_first { [0, 1] } else { [1, 0] } {
        if step == 0 {
            id = sqlx::query_scalar(sqlx::AssertSqlSafe(insert.as_str()))
                .bind(&event.aggregate_type)
                .bind(&event.aggregate_id)
                .bind(&event.event_type)
                .bind(event.payload.as_ref())
                .bind(headers(event))
                .fetch_one(&mut *tx)
                .await?;
        } else {
            n = sqlx::query_scalar(sqlx::AssertSqlSafe(bump.as_str()))
                .bind(&event.aggregate_id)
                .fetch_one(&mut *tx)
                .await?;
        }
        if step == if outbox_first { 0 } else { 1 } {
            tokio::time::sleep(hold).await;
        }
    }
    tx.commit().await?;
    Ok((Uuid::parse_str(&id)?, n))
}

/// MySQL / MariaDB: see [`crate::conformance::Harness::write_counted`]. `table` is the
/// outbox table (backquoted, from the harness's own validated config). A plain four-column
/// `INSERT` as any producer would write it: the table's trigger orders it.
pub async fn mysql_write_counted(
    pool: &MySqlPool,
    table: &str,
    event: &NewEvent,
    outbox_first: bool,
    hold: Duration,
) -> anyhow::Result<(Uuid, i64)> {
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "CREATE TABLE IF NOT EXISTS {COUNTERS} \
         (aggregate_id VARCHAR(255) PRIMARY KEY, n BIGINT NOT NULL) ENGINE = InnoDB"
    )))
    .execute(pool)
    .await?;
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT IGNORE INTO {COUNTERS} VALUES (?, 0)"
    )))
    .bind(&event.aggregate_id)
    .execute(pool)
    .await?;
    // Two lock orders (the aggregate's head row, the business row) can deadlock; InnoDB
    // aborts one transaction and the application retries it.
    loop {
        match mysql_write_counted_once(pool, table, event, outbox_first, hold).await {
            Err(sqlx::Error::Database(db)) if db.code().as_deref() == Some("40001") => continue,
            other => return Ok(other?),
        }
    }
}

async fn mysql_write_counted_once(
    pool: &MySqlPool,
    table: &str,
    event: &NewEvent,
    outbox_first: bool,
    hold: Duration,
) -> Result<(Uuid, i64), sqlx::Error> {
    let insert = format!(
        "INSERT INTO {table} (aggregate_type, aggregate_id, event_type, payload, headers) \
         VALUES (?, ?, ?, ?, ?)"
    );
    let read_id = format!("SELECT id FROM {table} WHERE position = LAST_INSERT_ID()");
    let bump = format!("UPDATE {COUNTERS} SET n = n + 1 WHERE aggregate_id = ?");
    let read_n = format!("SELECT n FROM {COUNTERS} WHERE aggregate_id = ?");
    let mut tx = pool.begin().await?;
    let mut id = String::new();
    let mut n = 0;
    for step in if outbox_first { [0, 1] } else { [1, 0] } {
        if step == 0 {
            sqlx::query(sqlx::AssertSqlSafe(insert.as_str()))
                .bind(&event.aggregate_type)
                .bind(&event.aggregate_id)
                .bind(&event.event_type)
                .bind(event.payload.as_ref())
                .bind(headers(event))
                .execute(&mut *tx)
                .await?;
            id = sqlx::query_scalar(sqlx::AssertSqlSafe(read_id.as_str()))
                .fetch_one(&mut *tx)
                .await?;
        } else {
            sqlx::query(sqlx::AssertSqlSafe(bump.as_str()))
                .bind(&event.aggregate_id)
                .execute(&mut *tx)
                .await?;
            n = sqlx::query_scalar(sqlx::AssertSqlSafe(read_n.as_str()))
                .bind(&event.aggregate_id)
                .fetch_one(&mut *tx)
                .await?;
        }
        if step == if outbox_first { 0 } else { 1 } {
            tokio::time::sleep(hold).await;
        }
    }
    tx.commit().await?;
    let id = Uuid::parse_str(&id).map_err(|e| sqlx::Error::Decode(Box::new(e)))?;
    Ok((id, n))
}
