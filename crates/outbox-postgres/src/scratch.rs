//! `outbox crash-test` on PostgreSQL: the scratch config (a table, and for CDC a slot and a
//! publication, named after the run's tag; claims of a few seconds) and its removal.
//!
//! Removal is guarded twice: the backend offers it only for a table whose name starts with
//! [`SCRATCH_PREFIX`](outbox_core::backend::SCRATCH_PREFIX), and every name reaches SQL as a validated, double-quoted identifier.

use std::time::{Duration, Instant};

use outbox_core::backend::{SCRATCH_CLAIM_TIMEOUT, Scratch};
use outbox_core::scratch::write_and_roll_back;
use outbox_core::sink::BoxFuture;
use outbox_core::{Identifier, NewEvent, SourceError};
use outbox_sql::scratch::drop_table;
use sqlx::Executor;

use crate::backend::PgBackend;
use crate::config::{Mode, PostgresConfig};
use crate::sql::{render, render_with};

/// How long removal waits for the server to let go of a killed relay's replication slot.
const SLOT_RELEASE_WAIT: Duration = Duration::from_secs(30);

/// `config` with the scratch outbox `tag`: the table `tag` in the same schema; for CDC the
/// slot `<tag>_slot` and the publication `<tag>_pub`; claims of [`SCRATCH_CLAIM_TIMEOUT`];
/// a CDC heartbeat every second; no partitions, no LISTEN/NOTIFY trigger.
pub(crate) fn scratch_config(
    config: &PostgresConfig,
    tag: &Identifier,
) -> Result<PostgresConfig, String> {
    outbox_core::backend::check_scratch_tag(tag)?;
    let named = |suffix: &str| {
        Identifier::new(format!("{tag}{suffix}")).map_err(|e| format!("scratch name {e}"))
    };
    let scratch = PostgresConfig {
        table: tag.clone(),
        slot: named("_slot")?,
        publication: named("_pub")?,
        partitioning: crate::Partitioning::None,
        listen_notify: false,
        claim_timeout: SCRATCH_CLAIM_TIMEOUT,
        // CDC: an idle stream confirms the server's position this often, which is what the
        // crash test's drain (and verify) wait for.
        heartbeat_interval: Duration::from_secs(1),
        ..config.clone()
    };
    scratch.validate()?;
    Ok(scratch)
}

impl PgBackend {
    async fn drop_slot(&self) -> Result<Option<String>, SourceError> {
        let config = self.config();
        let started = Instant::now();
        loop {
            let exists: Option<bool> = crate::sql::query_scalar(
                "SELECT active FROM pg_replication_slots WHERE slot_name = $1",
            )
            .bind(config.slot.as_str())
            .fetch_optional(self.pool())
            .await
            .map_err(|e| fatal("looking up the scratch replication slot", &e))?;
            let Some(active) = exists else {
                return Ok(None);
            };
            if !active {
                let dropped =
                    crate::sql::query(include_str!("../queries/replication_slot_drop.sql"))
                        .bind(config.slot.as_str())
                        .execute(self.pool())
                        .await
                        .map_err(|e| fatal("dropping the scratch replication slot", &e))?;
                if dropped.rows_affected() > 0 {
                    return Ok(Some(format!("replication slot `{}`", config.slot)));
                }
            }
            if started.elapsed() > SLOT_RELEASE_WAIT {
                return Err(SourceError::fatal(format!(
                    "replication slot `{}` is still in use after {}s; drop it by hand once no relay streams from it: SELECT pg_drop_replication_slot('{}')",
                    config.slot,
                    SLOT_RELEASE_WAIT.as_secs(),
                    config.slot
                )));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

impl Scratch for PgBackend {
    fn roll_back<'a>(&'a self, events: &'a [NewEvent]) -> BoxFuture<'a, Result<(), SourceError>> {
        let outbox = crate::PgOutbox::new(self.config().qualified_table());
        Box::pin(write_and_roll_back(
            self.pool().begin(),
            async move |tx| outbox.enqueue_batch(&mut **tx, events).await,
            async |tx| tx.rollback().await,
        ))
    }

    fn remove(&self) -> BoxFuture<'_, Result<Vec<String>, SourceError>> {
        Box::pin(async move {
            let config = self.config();
            let table = config.qualified_table();
            let mut removed = Vec::new();
            if config.mode == Mode::Cdc {
                removed.extend(self.drop_slot().await?);
                let sql = render_with(
                    include_str!("../queries/scratch_drop_publication.sql"),
                    &table,
                    &[("publication", &config.publication)],
                );
                self.pool()
                    .execute(sqlx::AssertSqlSafe(sql))
                    .await
                    .map_err(|e| fatal("dropping the scratch publication", &e))?;
                removed.push(format!("publication `{}`", config.publication));
            }
            let sql = render(include_str!("../queries/scratch_drop.sql"), &table);
            drop_table(self.pool(), [sql], &table).await?;
            removed.push(format!(
                "table {table} (with its sequence, functions and bookkeeping tables)"
            ));
            Ok(removed)
        })
    }
}

fn fatal(what: &str, e: &(dyn std::error::Error + 'static)) -> SourceError {
    SourceError::fatal(format!("{what}: {}", outbox_core::relay::ErrorChain(e)))
}
