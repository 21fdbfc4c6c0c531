//! Opening the configured backend, shared by every operator command.

use std::sync::Arc;

use outbox_core::backend::{Backend, OpenOptions};
use outbox_runtime::Config;

/// Opens the configured database with `connections` connections.
pub(crate) async fn open(config: &Config, connections: u32) -> anyhow::Result<Arc<dyn Backend>> {
    config
        .source
        .open(OpenOptions { connections })
        .await
        .map_err(|e| anyhow::anyhow!(crate::chain(&e)))
}

/// A source error with its causes, as one line.
pub(crate) fn source_error(e: outbox_core::SourceError) -> anyhow::Error {
    anyhow::anyhow!(crate::chain(&e))
}
