//! `outbox crash-test` on MySQL / MariaDB: the scratch config (a table named after the run's
//! tag, claims of a few seconds) and its removal.
//!
//! Removal is guarded twice: the backend offers it only for a table whose name starts with
//! [`SCRATCH_PREFIX`](outbox_core::backend::SCRATCH_PREFIX), and the name reaches SQL as a validated, quoted identifier.

use outbox_core::backend::{SCRATCH_CLAIM_TIMEOUT, Scratch};
use outbox_core::scratch::write_and_roll_back;
use outbox_core::sink::BoxFuture;
use outbox_core::{Identifier, NewEvent, SourceError};
use outbox_sql::scratch::drop_table;

use crate::backend::MySqlBackend;
use crate::config::MySqlConfig;
use crate::sql::{render, statements};

/// `config` with the scratch outbox table `tag` and claims of [`SCRATCH_CLAIM_TIMEOUT`].
pub(crate) fn scratch_config(
    config: &MySqlConfig,
    tag: &Identifier,
) -> Result<MySqlConfig, String> {
    outbox_core::scratch::scratch_config(tag, MySqlConfig::validate, |table| {
        Ok(MySqlConfig {
            table,
            claim_timeout: SCRATCH_CLAIM_TIMEOUT,
            ..config.clone()
        })
    })
}

impl Scratch for MySqlBackend {
    fn roll_back<'a>(&'a self, events: &'a [NewEvent]) -> BoxFuture<'a, Result<(), SourceError>> {
        let outbox = crate::MySqlOutbox::new(self.config().table.clone());
        Box::pin(write_and_roll_back(
            self.pool().begin(),
            async move |tx| outbox.enqueue_batch(tx, events).await,
            async |tx| tx.rollback().await,
        ))
    }

    fn remove(&self) -> BoxFuture<'_, Result<Vec<String>, SourceError>> {
        Box::pin(async move {
            let table = &self.config().table;
            let sql = render(include_str!("../queries/scratch_drop.sql"), table);
            drop_table(self.pool(), statements(&sql).map(str::to_owned), table).await?;
            Ok(vec![format!("table {table} (with its bookkeeping tables)")])
        })
    }
}
