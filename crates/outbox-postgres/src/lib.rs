//! PostgreSQL support for `outbox`: the schema ([`migrate`]), the producer ([`PgOutbox`],
//! [`enqueue`], [`emit_message`]), the polling source ([`PgPollSource`]) and the CDC source
//! ([`PgCdcSource`], logical replication; set up by [`setup_cdc`]).
//!
//! SQL lives in `queries/*.sql` (one statement per file, named `<table>_<verb>`) and
//! `migrations/*.sql`; a configured schema or table name reaches SQL only through
//! validated identifiers (see `sql.rs`).

mod backend;
mod cdc;
mod config;
mod dead;
mod doctor;
mod error;
mod inspect;
mod migrate;
mod partition;
mod poll;
mod producer;
mod replay;
mod retention;
mod sql;

use std::time::Duration;

pub use backend::PgBackend;
pub use cdc::{
    CdcClosed, CdcSetupError, CdcSetupReport, DEFAULT_MESSAGE_PREFIX, DecodedMessage,
    MESSAGE_VERSION, MessageDecodeError, PgCdcInspector, PgCdcSource, STANDBY_RETRY, SlotStatus,
    decode_message, emit_message, emit_message_with_prefix, encode_message, setup_cdc, slot_status,
};
pub use config::{DatabaseUrl, Mode, OnDelivered, PostgresConfig, redact};
pub use dead::PgDeadLetters;
pub use doctor::doctor;
pub use error::EnqueueError;
pub use inspect::{LockWait, OpenTransaction, PgInspector, Watchdog};
pub use migrate::{
    MigrateError, MigrateOptions, MigrationReport, SCHEMA_VERSION, migrate, migrate_with,
    schema_version,
};
pub use partition::{PARTITIONS_AHEAD, Partitioning};
pub use poll::PgPollSource;
pub use producer::{PgOutbox, enqueue, enqueue_batch};
pub use replay::{PgReplay, ReplayError};
pub use retention::{PgRetention, RetentionError};
// The database-neutral admin records, re-exported under their old paths.
pub use outbox_core::admin::{
    AttemptError, Blocker, DeadLetter, DoctorCheck, DoctorThresholds, EventStory, Health,
    HeldAggregate, KeptPartition, ReplayPlan, ReplayPreview, ReplaySelection, RetentionPreview,
    RetentionReport, RetentionSettings, RetrySelection, StoredEventDetail, Verdict,
};

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Connection, PgConnection, PgPool};

/// Opens a pool for the relay or the CLI: `connections` connections, each with
/// `idle_in_transaction_session_timeout = claim_timeout` and `application_name = outbox`.
pub async fn connect(config: &PostgresConfig, connections: u32) -> Result<PgPool, sqlx::Error> {
    let options: PgConnectOptions = config.url.expose().parse()?;
    let timeout_ms = config.claim_timeout.as_millis().to_string();
    let options = options
        .application_name("outbox")
        .options([("idle_in_transaction_session_timeout", timeout_ms.as_str())]);
    // One direct connection first: a pool only reports "timed out", this says why
    // (connection refused, authentication failed, unknown database).
    let probe = tokio::time::timeout(config.connect_timeout, PgConnection::connect_with(&options))
        .await
        .map_err(|_| sqlx::Error::PoolTimedOut)??;
    let _ = probe.close().await;
    PgPoolOptions::new()
        .max_connections(connections.max(1))
        .min_connections(0)
        .acquire_timeout(config.connect_timeout)
        .idle_timeout(Some(Duration::from_secs(300)))
        .connect_with(options)
        .await
}
