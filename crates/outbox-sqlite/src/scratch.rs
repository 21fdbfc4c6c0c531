//! `outbox crash-test` on SQLite: a rolled-back write and the scratch outbox's removal (its
//! config, a table named after the run's tag in the same file with a relay lease of a few
//! seconds, is [`crate::config::scratch_config`]).
//!
//! Removal is guarded twice: the backend offers it only for a table whose name starts with
//! [`SCRATCH_PREFIX`](outbox_core::backend::SCRATCH_PREFIX), and the name reaches SQL as a validated, quoted identifier.

use outbox_core::backend::Scratch;
use outbox_core::scratch::write_and_roll_back;
use outbox_core::sink::BoxFuture;
use outbox_core::{NewEvent, SourceError};
use outbox_sql::scratch::drop_table;

use crate::backend::SqliteBackend;
use crate::sql::render;

impl Scratch for SqliteBackend {
    fn roll_back<'a>(&'a self, events: &'a [NewEvent]) -> BoxFuture<'a, Result<(), SourceError>> {
        let outbox = crate::SqliteOutbox::new(self.config().table.clone());
        Box::pin(write_and_roll_back(
            self.pool().begin(),
            async move |tx| outbox.enqueue_batch(&mut **tx, events).await,
            async |tx| tx.rollback().await,
        ))
    }

    fn remove(&self) -> BoxFuture<'_, Result<Vec<String>, SourceError>> {
        Box::pin(async move {
            let table = &self.config().table;
            let sql = render(include_str!("../queries/scratch_drop.sql"), table);
            drop_table(self.pool(), [sql], table).await?;
            Ok(vec![format!(
                "table {table} in `{}` (with its lease and bookkeeping tables)",
                self.config().path.display()
            )])
        })
    }
}
