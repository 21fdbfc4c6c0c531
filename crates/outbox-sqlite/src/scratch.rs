//! `outbox crash-test` on SQLite: the scratch config (a table named after the run's tag in
//! the same file, a relay lease of a few seconds) and its removal.
//!
//! Removal is guarded twice: the backend offers it only for a table whose name starts with
//! [`SCRATCH_PREFIX`](outbox_core::backend::SCRATCH_PREFIX), and the name reaches SQL as a validated, quoted identifier.

use outbox_core::backend::{SCRATCH_CLAIM_TIMEOUT, Scratch};
use outbox_core::sink::BoxFuture;
use outbox_core::{Identifier, NewEvent, SourceError};
use sqlx::Executor;

use crate::backend::SqliteBackend;
use crate::config::SqliteConfig;
use crate::sql::render;

/// `config` with the scratch outbox table `tag` and a lease of [`SCRATCH_CLAIM_TIMEOUT`].
pub(crate) fn scratch_config(
    config: &SqliteConfig,
    tag: &Identifier,
) -> Result<SqliteConfig, String> {
    outbox_core::backend::check_scratch_tag(tag)?;
    let scratch = SqliteConfig {
        table: tag.clone(),
        lease_ttl: SCRATCH_CLAIM_TIMEOUT,
        ..config.clone()
    };
    scratch.validate()?;
    Ok(scratch)
}

impl Scratch for SqliteBackend {
    fn roll_back<'a>(&'a self, events: &'a [NewEvent]) -> BoxFuture<'a, Result<(), SourceError>> {
        Box::pin(async move {
            let outbox = crate::SqliteOutbox::new(self.config().table.clone());
            let mut tx = self
                .pool()
                .begin()
                .await
                .map_err(|e| unavailable("beginning a transaction", &e))?;
            outbox
                .enqueue_batch(&mut *tx, events)
                .await
                .map_err(|e| unavailable("writing events", &e))?;
            tx.rollback()
                .await
                .map_err(|e| unavailable("rolling back", &e))
        })
    }

    fn remove(&self) -> BoxFuture<'_, Result<Vec<String>, SourceError>> {
        Box::pin(async move {
            let table = &self.config().table;
            let sql = render(include_str!("../queries/scratch_drop.sql"), table);
            self.pool()
                .execute(sqlx::raw_sql(sqlx::AssertSqlSafe(sql)))
                .await
                .map_err(|e| {
                    SourceError::fatal(format!(
                        "dropping the scratch outbox table {table}: {}",
                        outbox_core::relay::ErrorChain(&e)
                    ))
                })?;
            Ok(vec![format!(
                "table {table} in `{}` (with its lease and bookkeeping tables)",
                self.config().path.display()
            )])
        })
    }
}

fn unavailable(what: &str, e: &(dyn std::error::Error + 'static)) -> SourceError {
    SourceError::unavailable(format!("{what}: {}", outbox_core::relay::ErrorChain(e)))
}
