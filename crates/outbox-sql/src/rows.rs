//! Fetch-then-decode: a query's rows turned into the core's row types (dead letters,
//! verify's ledger events, held aggregates) by a decoder over the database's row, with one
//! error for both steps so the caller names what it was doing once.

use sqlx::query::Query;
use sqlx::{Database, Executor, IntoArguments};

/// Runs `query` (its arguments bound) on `executor` and decodes every row with `decode`.
pub async fn fetch_decoded<'q, 'e, 'c: 'e, DB, A, E, T>(
    query: Query<'q, DB, A>,
    executor: E,
    decode: impl FnMut(&DB::Row) -> Result<T, sqlx::Error>,
) -> Result<Vec<T>, sqlx::Error>
where
    DB: Database,
    A: IntoArguments<DB> + 'q + 'e,
    E: 'e + Executor<'c, Database = DB>,
    'q: 'e,
{
    let rows = query.fetch_all(executor).await?;
    rows.iter().map(decode).collect()
}
