//! The PostgreSQL `[source]` section behind the core's [`BackendConfig`]: which URLs it
//! claims, what it checks against the relay settings, the subscription and scratch variants,
//! and connecting the pool into a [`PgBackend`].

use std::sync::Arc;

use outbox_core::backend::{Backend, BackendConfig, OpenError, OpenOptions};
use outbox_core::sink::BoxFuture;
use outbox_core::{Ordering, RelayConfig};

use super::PgBackend;
use crate::config::{Mode, PostgresConfig};

impl BackendConfig for PostgresConfig {
    const KIND: &'static str = "postgres";

    fn claims_url(url: &str) -> bool {
        url.starts_with("postgres://") || url.starts_with("postgresql://")
    }

    fn validate(&self, relay: &RelayConfig) -> Result<(), String> {
        PostgresConfig::validate(self)?;
        if relay.ordering == Ordering::Total && self.mode != Mode::Cdc {
            return Err("relay.ordering: `total` needs the CDC source (source.mode = \"cdc\"); the polling source offers `none` or `per-aggregate`".into());
        }
        outbox_core::backend::check_claim_outlasts_publish(
            "source.claim_timeout",
            self.claim_timeout,
            relay,
        )
    }

    fn describe(&self) -> String {
        self.url.redacted()
    }

    fn for_subscription(&self, name: &str) -> Result<Self, String> {
        // A subscription's table is always polled: its rows are written by the fan-out, and
        // its claims keep the subscription's own progress, retries and dead letters.
        let config = Self {
            table: outbox_core::backend::subscription_table(&self.table, name)?,
            mode: Mode::Poll,
            ..self.clone()
        };
        PostgresConfig::validate(&config)?;
        Ok(config)
    }

    fn scratch(&self, tag: &outbox_core::Identifier) -> Result<Self, String> {
        crate::scratch::scratch_config(self, tag)
    }

    fn open(&self, options: OpenOptions) -> BoxFuture<'_, Result<Arc<dyn Backend>, OpenError>> {
        Box::pin(async move {
            let pool = crate::connect(self, options.connections)
                .await
                .map_err(|e| {
                    OpenError::new(
                        format!("cannot connect to {}", self.url),
                        "check source.url (host, port, user, password, database) and that PostgreSQL runs",
                        e,
                    )
                })?;
            Ok(Arc::new(PgBackend::new(pool, self.clone())) as Arc<dyn Backend>)
        })
    }
}
