//! The subscription catalog on a SQL table, written once: [`CatalogSql`] is what one
//! database supplies (its statements, run on its own pool or transaction), and every
//! [`CatalogSql`] is a [`SubscriptionCatalog`] through the flow here: `record` in one
//! transaction that reads each row before it upserts it, `list` decoding the `state` word,
//! the `rows affected` of `set_state` and `remove`, and the errors (a missing table says to
//! run `outbox migrate`).
//!
//! The core names no database and has no SQL driver: a database's statements, its
//! transaction type and its error type stay in its crate (`outbox-postgres`, `outbox-mysql`,
//! `outbox-sqlite`), which renders its `queries/subscriptions_*.sql` files with
//! [`catalog_queries!`](crate::catalog_queries).

use std::future::Future;
use std::sync::Arc;

use time::OffsetDateTime;

use crate::catalog::{
    CatalogEntry, CatalogRecord, Recorded, SubscriptionCatalog, SubscriptionState, recorded,
};
use crate::relay::ErrorChain;
use crate::sink::BoxFuture;
use crate::source::SourceError;

/// One stored row as a database reads it: name, filter (JSON text), sink, the `state` word and
/// when `migrate` first recorded it.
pub type CatalogRow = (String, String, String, String, OffsetDateTime);

/// The catalog's statements, rendered for one outbox table from the database's
/// `queries/subscriptions_*.sql` files (see [`catalog_queries!`](crate::catalog_queries)).
#[derive(Debug, Clone)]
pub struct CatalogQueries {
    /// Creates the catalog table if it is not there (`subscriptions_create.sql`).
    pub create: Arc<str>,
    /// The stored filter and sink of one name (`subscriptions_read_one.sql`).
    pub read_one: Arc<str>,
    /// Inserts a row or updates its filter and sink (`subscriptions_upsert.sql`).
    pub upsert: Arc<str>,
    /// Every row, by name (`subscriptions_list.sql`).
    pub list: Arc<str>,
    /// Sets one row's state (`subscriptions_set_state.sql`).
    pub set_state: Arc<str>,
    /// Deletes one row (`subscriptions_remove.sql`).
    pub remove: Arc<str>,
}

/// [`CatalogQueries`] from the `queries/subscriptions_*.sql` files beside the calling file's
/// folder (`include_str!` resolves relative to the file that invokes this macro, which must
/// sit one folder below `queries/`, as `src/catalog.rs` does), each passed through `render`
/// (a `Fn(&str) -> String` that puts in the table name).
#[macro_export]
macro_rules! catalog_queries {
    ($render:expr) => {{
        let render = $render;
        let r = |template: &str| -> ::std::sync::Arc<str> { render(template).into() };
        $crate::sql_catalog::CatalogQueries {
            create: r(include_str!("../queries/subscriptions_create.sql")),
            read_one: r(include_str!("../queries/subscriptions_read_one.sql")),
            upsert: r(include_str!("../queries/subscriptions_upsert.sql")),
            list: r(include_str!("../queries/subscriptions_list.sql")),
            set_state: r(include_str!("../queries/subscriptions_set_state.sql")),
            remove: r(include_str!("../queries/subscriptions_remove.sql")),
        }
    }};
}

/// What one SQL database supplies to the subscription catalog: each method runs one of its
/// statements (mostly those of [`CatalogQueries`]) and returns the driver's own error, which
/// the shared flow turns into a [`SourceError`]. Every type implementing it is a
/// [`SubscriptionCatalog`].
pub trait CatalogSql: Send + Sync {
    /// The driver's error (`sqlx::Error`).
    type Error: std::error::Error + Send + Sync + 'static;
    /// The transaction that [`SubscriptionCatalog::record`] writes in.
    type Tx: Send;

    /// The catalog table's name, for messages (`<table>_subscriptions`).
    fn table(&self) -> &str;

    /// Whether `error` says that the catalog table does not exist.
    fn is_missing(error: &Self::Error) -> bool;

    /// Starts the transaction of `record`, the catalog table created (and, where the database
    /// needs it, `record` serialized against another `migrate`).
    fn begin(&self) -> impl Future<Output = Result<Self::Tx, Self::Error>> + Send;

    /// In `tx`: reads the stored filter and sink of `record.name` (`None`: no row), then
    /// inserts or updates the row (a new row in `record.state`; a row already there keeps its
    /// state) and returns what it read.
    fn upsert(
        &self,
        tx: &mut Self::Tx,
        record: &CatalogRecord,
    ) -> impl Future<Output = Result<Option<(String, String)>, Self::Error>> + Send;

    /// Commits `tx`.
    fn commit(tx: Self::Tx) -> impl Future<Output = Result<(), Self::Error>> + Send;

    /// Every row, by name.
    fn rows(&self) -> impl Future<Output = Result<Vec<CatalogRow>, Self::Error>> + Send;

    /// Sets `name`'s state; the number of rows changed.
    fn set_state(
        &self,
        name: &str,
        state: SubscriptionState,
    ) -> impl Future<Output = Result<u64, Self::Error>> + Send;

    /// Deletes `name`'s row; the number of rows deleted.
    fn remove(&self, name: &str) -> impl Future<Output = Result<u64, Self::Error>> + Send;
}

/// The catalog error of `error` on `sql`'s table: fatal, saying to run `outbox migrate`, when
/// the table does not exist; otherwise unavailable (retried).
fn catalog_error<S: CatalogSql>(sql: &S, error: &S::Error) -> SourceError {
    if S::is_missing(error) {
        SourceError::fatal(format!(
            "the subscription catalog {} does not exist; run `outbox migrate`",
            sql.table()
        ))
    } else {
        SourceError::unavailable(format!(
            "subscription catalog {}: {}",
            sql.table(),
            ErrorChain(error)
        ))
    }
}

/// [`SubscriptionCatalog::record`]: one transaction, each record read and then upserted.
async fn record_all<S: CatalogSql>(
    sql: &S,
    records: &[CatalogRecord],
) -> Result<Vec<(String, Recorded)>, S::Error> {
    let mut tx = sql.begin().await?;
    let mut out = Vec::with_capacity(records.len());
    for r in records {
        let before = sql.upsert(&mut tx, r).await?;
        let outcome = recorded(before.as_ref().map(|(f, s)| (f.as_str(), s.as_str())), r);
        out.push((r.name.clone(), outcome));
    }
    S::commit(tx).await?;
    Ok(out)
}

impl<S: CatalogSql> SubscriptionCatalog for S {
    fn record<'a>(
        &'a self,
        records: &'a [CatalogRecord],
    ) -> BoxFuture<'a, Result<Vec<(String, Recorded)>, SourceError>> {
        Box::pin(async move {
            record_all(self, records)
                .await
                .map_err(|e| catalog_error(self, &e))
        })
    }

    fn list(&self) -> BoxFuture<'_, Result<Vec<CatalogEntry>, SourceError>> {
        Box::pin(async move {
            let rows = self.rows().await.map_err(|e| catalog_error(self, &e))?;
            rows.into_iter()
                .map(|(name, filter, sink, state, created_at)| {
                    Ok(CatalogEntry {
                        name,
                        filter,
                        sink,
                        state: SubscriptionState::parse(&state)?,
                        created_at,
                    })
                })
                .collect()
        })
    }

    fn set_state<'a>(
        &'a self,
        name: &'a str,
        state: SubscriptionState,
    ) -> BoxFuture<'a, Result<bool, SourceError>> {
        Box::pin(async move {
            let changed = CatalogSql::set_state(self, name, state)
                .await
                .map_err(|e| catalog_error(self, &e))?;
            Ok(changed > 0)
        })
    }

    fn remove<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<bool, SourceError>> {
        Box::pin(async move {
            let removed = CatalogSql::remove(self, name)
                .await
                .map_err(|e| catalog_error(self, &e))?;
            Ok(removed > 0)
        })
    }
}
