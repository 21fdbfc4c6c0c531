//! The MySQL `[source]` section behind the core's [`BackendConfig`]: which URLs it claims,
//! what it checks against the relay settings, the subscription and scratch variants, and
//! opening the pool into a [`MySqlBackend`].

use std::sync::Arc;

use outbox_core::backend::{Backend, BackendConfig, OpenError, OpenOptions};
use outbox_core::sink::BoxFuture;
use outbox_core::{Ordering, RelayConfig};

use super::MySqlBackend;
use crate::config::{Mode, MySqlConfig};

impl BackendConfig for MySqlConfig {
    const KIND: &'static str = "mysql";

    fn claims_url(url: &str) -> bool {
        url.starts_with("mysql://") || url.starts_with("mariadb://")
    }

    fn validate(&self, relay: &RelayConfig) -> Result<(), String> {
        MySqlConfig::validate(self)?;
        if relay.ordering == Ordering::Total {
            return Err("relay.ordering: `total` is not offered by the MySQL polling source; use `none` or `per-aggregate`".into());
        }
        outbox_core::backend::check_claim_outlasts_publish(
            "source.claim_timeout",
            self.claim_timeout,
            relay,
        )
    }

    fn describe(&self) -> String {
        format!("MySQL {}", self.url.redacted())
    }

    fn for_subscription(&self, name: &str) -> Result<Self, String> {
        if self.mode == Mode::Cdc {
            return Err(
                "source.mode: [[subscription]] needs mode = \"poll\" with kind = \"mysql\" (the binlog source does not fan out yet)"
                    .into(),
            );
        }
        // The same database, the subscription's own table, polled: its rows are written by
        // the fan-out, and its claims keep the subscription's own progress, retries and
        // dead letters.
        let config = Self {
            table: outbox_core::backend::subscription_table(&self.table, name)?,
            ..self.clone()
        };
        MySqlConfig::validate(&config)?;
        Ok(config)
    }

    fn scratch(&self, tag: &outbox_core::Identifier) -> Result<Self, String> {
        crate::scratch::scratch_config(self, tag)
    }

    fn open(&self, options: OpenOptions) -> BoxFuture<'_, Result<Arc<dyn Backend>, OpenError>> {
        Box::pin(async move {
            let connections = self.max_connections.unwrap_or(options.connections);
            let pool = crate::connect(self, connections).await.map_err(|e| {
                OpenError::new(
                    format!("cannot connect to MySQL at {}", self.url.redacted()),
                    "check source.url (mysql://user:password@host:port/database) and that the server is running",
                    e,
                )
            })?;
            Ok(Arc::new(MySqlBackend::new(pool, self.clone())) as Arc<dyn Backend>)
        })
    }
}
