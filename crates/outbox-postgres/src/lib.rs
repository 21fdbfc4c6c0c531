//! PostgreSQL support for `outbox`: the schema ([`migrate`]), the producer ([`PgOutbox`],
//! [`enqueue`], [`emit_message`]), the polling source ([`PgPollSource`]) and the CDC source
//! ([`PgCdcSource`], logical replication; set up by [`setup_cdc`]).
//!
//! SQL lives in `queries/*.sql` (one statement per file, named `<table>_<verb>`) and
//! `migrations/*.sql`; a configured schema or table name reaches SQL only through
//! validated identifiers (see `sql.rs`).

mod backend;
mod backfill;
mod capture;
mod catalog;
mod cdc;
mod config;
mod db;
mod dead;
mod doctor;
mod error;
mod event_arrays;
mod inspect;
mod migrate;
mod partition;
mod poll;
mod producer;
mod replay;
mod retention;
mod scratch;
mod sql;
mod verify;

use std::time::Duration;

pub use backend::PgBackend;
pub use backfill::PgBackfill;
pub use capture::PgCapture;
pub use cdc::{
    CdcClosed, CdcSetupError, CdcSetupReport, DEFAULT_MESSAGE_PREFIX, DecodedMessage,
    MESSAGE_VERSION, MessageDecodeError, PgCdcInspector, PgCdcSource, RecoveryStatus,
    STANDBY_RETRY, SlotStatus, decode_message, emit_message, emit_message_with_prefix,
    encode_message, recovery_status, setup_cdc, slot_status,
};
pub use config::{
    DatabaseUrl, Mode, OnDelivered, OnSlotLoss, PostgresConfig, WaitForStandby, redact,
};
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
pub use verify::{CDC_CONFIRM_WAIT, PgLedger};
// The database-neutral admin records, re-exported under their old paths.
pub use outbox_core::admin::{
    AttemptError, Blocker, DeadLetter, DoctorCheck, DoctorThresholds, EventStory, Health,
    HeldAggregate, KeptPartition, ReplayPlan, ReplayPreview, ReplaySelection, RetentionPreview,
    RetentionReport, RetentionSettings, RetrySelection, StoredEventDetail, Verdict,
};

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Connection, PgConnection, PgPool};

/// The URL without secret parameters the driver does not support (`sslpassword`, tokens):
/// sqlx ignores them, but its warning prints their values. Each one dropped is logged by
/// name only.
fn without_unsupported_secrets(raw: &str) -> String {
    let Ok(mut url) = url::Url::parse(raw) else {
        return raw.to_owned();
    };
    let (kept, dropped): (Vec<_>, Vec<_>) = url
        .query_pairs()
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .partition(|(k, _)| k == "password" || !outbox_core::redact::is_secret_key(k));
    if dropped.is_empty() {
        return raw.to_owned();
    }
    for (key, _) in &dropped {
        tracing::warn!(key = %key, "source.url: connection parameter not supported by the driver; ignored");
    }
    if kept.is_empty() {
        url.set_query(None);
    } else {
        url.query_pairs_mut().clear().extend_pairs(kept);
    }
    url.to_string()
}

/// Opens a pool for the relay or the CLI: `connections` connections, each with
/// `idle_in_transaction_session_timeout = claim_timeout` and `application_name = outbox`.
///
/// With `source.transaction_pooling` (PgBouncer in transaction mode) the process switches to
/// unnamed statements. Code of this crate reaches the pool through `Db` (src/db.rs), which runs
/// every statement in an explicit transaction committed before it reports success, and
/// claims take their own explicit transactions ([`connect_claims`]); see `db.rs` for why.
pub async fn connect(config: &PostgresConfig, connections: u32) -> Result<PgPool, sqlx::Error> {
    let options = connect_options(config)?;
    probe(config, &options).await?;
    if config.transaction_pooling {
        sql::use_unnamed_statements();
    }
    pool_options(config, connections)
        .connect_with(options)
        .await
}

/// The pool the polling relay claims with: `workers` connections. Without a transaction
/// pooler it is `pool`; with one, a pool of its own, so that claims (held open while their
/// batch is published) never wait for the connections the pooler lends to everything else.
pub async fn connect_claims(
    config: &PostgresConfig,
    pool: &PgPool,
    workers: u32,
) -> Result<PgPool, sqlx::Error> {
    if !config.transaction_pooling {
        return Ok(pool.clone());
    }
    // `pool` was opened from the same options: no second probe.
    pool_options(config, workers)
        .connect_with(connect_options(config)?)
        .await
}

/// Pool sizing and timeouts shared by both pools.
fn pool_options(config: &PostgresConfig, connections: u32) -> PgPoolOptions {
    PgPoolOptions::new()
        .max_connections(connections.max(1))
        .min_connections(0)
        .acquire_timeout(config.connect_timeout)
        .idle_timeout(Some(Duration::from_secs(300)))
}

/// The connect options for `config`.
fn connect_options(config: &PostgresConfig) -> Result<PgConnectOptions, sqlx::Error> {
    let options: PgConnectOptions = without_unsupported_secrets(config.url.expose()).parse()?;
    let options = options.application_name("outbox");
    let options = if config.transaction_pooling {
        // A pooler refuses startup parameters it does not track (PgBouncer: "unsupported
        // startup parameter"); the claim timeout is set per claim (SET LOCAL) instead.
        options.extra_float_digits(None)
    } else {
        let timeout_ms = config.claim_timeout.as_millis().to_string();
        options.options([("idle_in_transaction_session_timeout", timeout_ms.as_str())])
    };
    Ok(options)
}

/// One direct connection first: a pool only reports "timed out", this says why the database
/// cannot be reached (refused, authentication failed, unknown database, no answer).
async fn probe(config: &PostgresConfig, options: &PgConnectOptions) -> Result<(), sqlx::Error> {
    let probe = tokio::time::timeout(config.connect_timeout, PgConnection::connect_with(options))
        .await
        .map_err(|_| {
            // A hung server (or a firewall dropping packets) answers nothing: say so, rather
            // than the pool's "timed out while waiting for an open connection".
            sqlx::Error::Io(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!(
                    "the server did not answer within {:?} (source.connect_timeout)",
                    config.connect_timeout
                ),
            ))
        })??;
    let _ = probe.close().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn secret_parameters_the_driver_ignores_are_dropped_before_it_can_print_them() {
        let url = super::without_unsupported_secrets(
            "postgres://app@db/app?sslmode=require&sslpassword=k3y&password=pw",
        );
        assert!(!url.contains("k3y"), "{url}");
        assert!(
            url.contains("sslmode=require") && url.contains("password=pw"),
            "{url}"
        );
        let plain = "postgres://app:pw@db/app";
        assert_eq!(super::without_unsupported_secrets(plain), plain);
    }
}
