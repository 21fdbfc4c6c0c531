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

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Mutex;

    use super::*;

    /// A catalog in memory; `missing` makes every call fail as on a database without the table.
    #[derive(Default)]
    struct Memory {
        rows: Mutex<BTreeMap<String, (String, String, SubscriptionState)>>,
        missing: bool,
    }

    #[derive(Debug, thiserror::Error)]
    #[error("no such table")]
    struct NoTable;

    impl CatalogSql for Memory {
        type Error = NoTable;
        type Tx = ();

        fn table(&self) -> &str {
            "outbox_subscriptions"
        }

        fn is_missing(_: &NoTable) -> bool {
            true
        }

        async fn begin(&self) -> Result<(), NoTable> {
            if self.missing { Err(NoTable) } else { Ok(()) }
        }

        async fn upsert(
            &self,
            (): &mut (),
            r: &CatalogRecord,
        ) -> Result<Option<(String, String)>, NoTable> {
            let mut rows = self.rows.lock().expect("lock");
            let before = rows.get(&r.name).map(|(f, s, _)| (f.clone(), s.clone()));
            let state = rows.get(&r.name).map_or(r.state, |(_, _, state)| *state);
            rows.insert(r.name.clone(), (r.filter.clone(), r.sink.clone(), state));
            Ok(before)
        }

        async fn commit((): ()) -> Result<(), NoTable> {
            Ok(())
        }

        async fn rows(&self) -> Result<Vec<CatalogRow>, NoTable> {
            if self.missing {
                return Err(NoTable);
            }
            let rows = self.rows.lock().expect("lock");
            Ok(rows
                .iter()
                .map(|(name, (filter, sink, state))| {
                    let at = OffsetDateTime::UNIX_EPOCH;
                    (
                        name.clone(),
                        filter.clone(),
                        sink.clone(),
                        state.as_str().into(),
                        at,
                    )
                })
                .collect())
        }

        async fn set_state(&self, name: &str, state: SubscriptionState) -> Result<u64, NoTable> {
            let mut rows = self.rows.lock().expect("lock");
            Ok(rows.get_mut(name).map_or(0, |row| {
                row.2 = state;
                1
            }))
        }

        async fn remove(&self, name: &str) -> Result<u64, NoTable> {
            Ok(self
                .rows
                .lock()
                .expect("lock")
                .remove(name)
                .map_or(0, |_| 1))
        }
    }

    fn record(name: &str, sink: &str) -> CatalogRecord {
        CatalogRecord {
            name: name.into(),
            filter: "{}".into(),
            sink: sink.into(),
            state: SubscriptionState::Paused,
        }
    }

    #[tokio::test]
    async fn record_list_pause_and_remove_through_the_shared_flow() {
        let catalog = Memory::default();
        let done = catalog.record(&[record("a", "k")]).await.expect("record");
        assert_eq!(done, vec![("a".to_owned(), Recorded::Added)]);
        let done = catalog
            .record(&[record("a", "j"), record("b", "k")])
            .await
            .expect("record");
        assert_eq!(
            done,
            vec![
                ("a".to_owned(), Recorded::Updated),
                ("b".to_owned(), Recorded::Added)
            ]
        );
        let c: &dyn SubscriptionCatalog = &catalog;
        assert!(
            c.set_state("a", SubscriptionState::Active)
                .await
                .expect("set")
        );
        assert!(
            !c.set_state("z", SubscriptionState::Active)
                .await
                .expect("set")
        );
        let listed = c.list().await.expect("list");
        assert_eq!(listed.len(), 2);
        assert_eq!(listed[0].state, SubscriptionState::Active);
        assert_eq!(listed[1].state, SubscriptionState::Paused);
        assert!(c.remove("b").await.expect("remove"));
        assert!(!c.remove("b").await.expect("remove"));
    }

    #[tokio::test]
    async fn a_missing_table_says_to_run_migrate() {
        let catalog = Memory {
            missing: true,
            ..Memory::default()
        };
        let e = catalog.list().await.expect_err("no table");
        assert!(e.to_string().contains("run `outbox migrate`"), "{e}");
        assert!(catalog.record(&[record("a", "k")]).await.is_err());
    }
}
