//! The commit-order oracle of the source conformance suite
//! ([`crate::conformance::Harness::write_counted`]), written as a producer in any language
//! would: plain SQL, the four required columns plus `headers`, in the same transaction as a
//! business row (a per-aggregate counter) whose row lock orders the commits.

use std::time::Duration;

use outbox_core::NewEvent;
use sqlx::error::BoxDynError;
use sqlx::{Arguments as _, Database, Encode, MySqlPool, PgPool, SqlitePool, Type};
use uuid::Uuid;

/// The business table of the oracle.
const COUNTERS: &str = "outbox_test_counters";

/// The bind arguments of the oracle's outbox insert, in its column order: `aggregate_type`,
/// `aggregate_id`, `event_type`, `payload`, `headers` (JSON text).
fn event_arguments<DB: Database>(event: &NewEvent) -> Result<DB::Arguments, sqlx::Error>
where
    str: Type<DB>,
    [u8]: Type<DB>,
    for<'a> &'a str: Encode<'a, DB>,
    for<'a> &'a [u8]: Encode<'a, DB>,
{
    let headers = outbox_core::enqueue::headers_json(event);
    let mut args = DB::Arguments::default();
    let add = |result: Result<(), BoxDynError>| result.map_err(sqlx::Error::Encode);
    add(args.add(event.aggregate_type.as_str()))?;
    add(args.add(event.aggregate_id.as_str()))?;
    add(args.add(event.event_type.as_str()))?;
    add(args.add(event.payload.as_ref()))?;
    add(args.add(headers.as_str()))?;
    Ok(args)
}

/// One statement of the oracle's transaction, or the pause between them.
#[derive(Clone, Copy)]
enum Step {
    /// The outbox insert.
    Insert,
    /// The pause that holds the transaction open between the two statements.
    Hold,
    /// The counter bump.
    Bump,
}

/// The steps of the oracle's transaction: the outbox row first when `outbox_first` (a
/// producer that inserts its event before it touches the business row), else the counter.
fn steps(outbox_first: bool) -> [Step; 3] {
    if outbox_first {
        [Step::Insert, Step::Hold, Step::Bump]
    } else {
        [Step::Bump, Step::Hold, Step::Insert]
    }
}

/// The oracle's transaction in a database whose `insert` and `bump` return the id and the
/// counter value (`RETURNING`: PostgreSQL, SQLite), run on `tx` in the order of
/// [`steps`]. The caller commits.
async fn insert_and_bump<DB, Id>(
    tx: &mut DB::Connection,
    insert: &str,
    bump: &str,
    event: &NewEvent,
    outbox_first: bool,
    hold: Duration,
) -> Result<(Id, i64), sqlx::Error>
where
    DB: Database,
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    for<'r> (Id,): sqlx::FromRow<'r, DB::Row>,
    for<'r> (i64,): sqlx::FromRow<'r, DB::Row>,
    Id: Default + Send + Unpin,
    DB::Arguments: sqlx::IntoArguments<DB>,
    str: Type<DB>,
    [u8]: Type<DB>,
    for<'a> &'a str: Encode<'a, DB>,
    for<'a> &'a [u8]: Encode<'a, DB>,
{
    let (mut id, mut n) = (Id::default(), 0);
    for step in steps(outbox_first) {
        match step {
            Step::Insert => {
                id = sqlx::query_scalar_with(sqlx::AssertSqlSafe(insert), event_arguments(event)?)
                    .fetch_one(&mut *tx)
                    .await?;
            }
            Step::Hold => tokio::time::sleep(hold).await,
            Step::Bump => {
                n = sqlx::query_scalar(sqlx::AssertSqlSafe(bump))
                    .bind(event.aggregate_id.as_str())
                    .fetch_one(&mut *tx)
                    .await?;
            }
        }
    }
    Ok((id, n))
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
    prepare_counter::<sqlx::Postgres>(
        &mut *pool.acquire().await?,
        &format!(
            "CREATE TABLE IF NOT EXISTS {COUNTERS} \
             (aggregate_id text PRIMARY KEY, n bigint NOT NULL)"
        ),
        &format!("INSERT INTO {COUNTERS} VALUES ($1, 0) ON CONFLICT DO NOTHING"),
        &event.aggregate_id,
    )
    .await?;
    let insert = format!(
        "INSERT INTO {table} (aggregate_type, aggregate_id, event_type, payload, headers) \
         VALUES ($1, $2, $3, $4, $5::jsonb) RETURNING id"
    );
    let bump = format!("UPDATE {COUNTERS} SET n = n + 1 WHERE aggregate_id = $1 RETURNING n");
    let (insert, bump) = (&insert, &bump);
    // Producers that take the aggregate's ordering lock (the outbox insert) and the business
    // row's lock in opposite orders can deadlock; PostgreSQL aborts one of them, and the
    // application retries it, as any application with two lock orders must.
    retry_deadlocks(&["40P01", "40001"], move || async move {
        let mut tx = pool.begin().await?;
        let (id, n) = insert_and_bump::<sqlx::Postgres, Uuid>(
            &mut tx,
            insert,
            bump,
            event,
            outbox_first,
            hold,
        )
        .await?;
        tx.commit().await?;
        Ok((id, n))
    })
    .await
}

/// Creates the counter table and the counter row of `aggregate_id` (at 0) when missing,
/// with the database's own `create` and `seed` statements. Two sessions racing
/// `CREATE TABLE IF NOT EXISTS` may both try to create it (PostgreSQL); the loser's unique
/// violation means it exists.
async fn prepare_counter<DB>(
    conn: &mut DB::Connection,
    create: &str,
    seed: &str,
    aggregate_id: &str,
) -> Result<(), sqlx::Error>
where
    DB: Database,
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    DB::Arguments: sqlx::IntoArguments<DB>,
    str: Type<DB>,
    for<'a> &'a str: Encode<'a, DB>,
{
    match sqlx::query(sqlx::AssertSqlSafe(create))
        .execute(&mut *conn)
        .await
    {
        Err(sqlx::Error::Database(db)) if db.code().as_deref() == Some("23505") => {}
        other => {
            other?;
        }
    }
    sqlx::query(sqlx::AssertSqlSafe(seed))
        .bind(aggregate_id)
        .execute(conn)
        .await?;
    Ok(())
}

/// Runs `attempt` again while the database aborts it as a deadlock victim (its error code
/// is one of `codes`).
async fn retry_deadlocks<T, Fut>(
    codes: &[&str],
    mut attempt: impl FnMut() -> Fut,
) -> anyhow::Result<T>
where
    Fut: std::future::Future<Output = Result<T, sqlx::Error>>,
{
    loop {
        match attempt().await {
            Err(sqlx::Error::Database(db))
                if db.code().is_some_and(|code| codes.contains(&code.as_ref())) =>
            {
                continue;
            }
            other => return Ok(other?),
        }
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
    prepare_counter::<sqlx::Sqlite>(
        &mut tx,
        &format!(
            "CREATE TABLE IF NOT EXISTS {COUNTERS} \
             (aggregate_id TEXT PRIMARY KEY, n INTEGER NOT NULL)"
        ),
        &format!("INSERT INTO {COUNTERS} VALUES (?1, 0) ON CONFLICT DO NOTHING"),
        &event.aggregate_id,
    )
    .await?;
    let insert = format!(
        "INSERT INTO {table} (aggregate_type, aggregate_id, event_type, payload, headers) \
         VALUES (?1, ?2, ?3, ?4, ?5) RETURNING id"
    );
    let bump = format!("UPDATE {COUNTERS} SET n = n + 1 WHERE aggregate_id = ?1 RETURNING n");
    let (id, n) =
        insert_and_bump::<sqlx::Sqlite, String>(&mut tx, &insert, &bump, event, outbox_first, hold)
            .await?;
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
    prepare_counter::<sqlx::MySql>(
        &mut *pool.acquire().await?,
        &format!(
            "CREATE TABLE IF NOT EXISTS {COUNTERS} \
             (aggregate_id VARCHAR(255) PRIMARY KEY, n BIGINT NOT NULL) ENGINE = InnoDB"
        ),
        &format!("INSERT IGNORE INTO {COUNTERS} VALUES (?, 0)"),
        &event.aggregate_id,
    )
    .await?;
    let insert = format!(
        "INSERT INTO {table} (aggregate_type, aggregate_id, event_type, payload, headers) \
         VALUES (?, ?, ?, ?, ?)"
    );
    let read_id = format!("SELECT id FROM {table} WHERE position = LAST_INSERT_ID()");
    let bump = format!("UPDATE {COUNTERS} SET n = n + 1 WHERE aggregate_id = ?");
    let read_n = format!("SELECT n FROM {COUNTERS} WHERE aggregate_id = ?");
    let (insert, read_id, bump, read_n) = (&insert, &read_id, &bump, &read_n);
    // Two lock orders (the aggregate's head row, the business row) can deadlock; InnoDB
    // aborts one transaction and the application retries it.
    retry_deadlocks(&["40001"], move || async move {
        let mut tx = pool.begin().await?;
        let (mut id, mut n) = (String::new(), 0);
        for step in steps(outbox_first) {
            match step {
                Step::Insert => {
                    sqlx::query_with(
                        sqlx::AssertSqlSafe(insert.as_str()),
                        event_arguments::<sqlx::MySql>(event)?,
                    )
                    .execute(&mut *tx)
                    .await?;
                    id = sqlx::query_scalar(sqlx::AssertSqlSafe(read_id.as_str()))
                        .fetch_one(&mut *tx)
                        .await?;
                }
                Step::Hold => tokio::time::sleep(hold).await,
                Step::Bump => {
                    sqlx::query(sqlx::AssertSqlSafe(bump.as_str()))
                        .bind(&event.aggregate_id)
                        .execute(&mut *tx)
                        .await?;
                    n = sqlx::query_scalar(sqlx::AssertSqlSafe(read_n.as_str()))
                        .bind(&event.aggregate_id)
                        .fetch_one(&mut *tx)
                        .await?;
                }
            }
        }
        tx.commit().await?;
        let id = Uuid::parse_str(&id).map_err(|e| sqlx::Error::Decode(Box::new(e)))?;
        Ok((id, n))
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn send<T: Send>(_: T) {}

    /// `Harness::write_counted` returns a `Send` future: the oracle's must be too.
    #[allow(dead_code)]
    fn oracle_futures_are_send(pg: &PgPool, sqlite: &SqlitePool, mysql: &MySqlPool) {
        let event = NewEvent::new("t", "a", "e", "{}");
        send(pg_write_counted(pg, "t", &event, true, Duration::ZERO));
        send(sqlite_write_counted(
            sqlite,
            "t",
            &event,
            true,
            Duration::ZERO,
        ));
        send(mysql_write_counted(
            mysql,
            "t",
            &event,
            true,
            Duration::ZERO,
        ));
    }
}
