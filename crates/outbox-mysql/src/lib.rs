//! MySQL and MariaDB support for `outbox`: the outbox table (`migrate`), the producer
//! (`MySqlOutbox::enqueue` in the caller's own transaction), the polling relay source
//! ([`MySqlPollSource`]) and the binlog CDC source ([`MySqlCdcSource`]).
//!
//! **Per-aggregate order in commit order.** MySQL has no transaction-scoped advisory locks,
//! and `AUTO_INCREMENT` follows insert order, not commit order. The table's `BEFORE INSERT`
//! trigger therefore numbers each aggregate's events from a head row per aggregate
//! (`<table>_aggregate_heads`): its upsert locks that row until the producer's transaction
//! ends, so a second transaction for the same aggregate waits, and `seq` = 1, 2, 3, … follows
//! commit order with no gaps — for producers in any language, also when a producer writes the
//! outbox row before it locks its business row. The relay delivers an aggregate's events only
//! as a run of consecutive `seq`s after the last one settled. See `docs/mysql.md`.
//!
//! `source.mode = "cdc"` reads the row-based binlog instead ([`MySqlCdcSource`]).

mod admin;
mod backend;
mod backfill;
mod capture;
mod catalog;
mod cdc;
mod config;
mod connect;
mod error;
mod lease;
mod migrate;
mod poll;
mod producer;
mod scratch;
mod server;
mod sql;
mod verify;

pub use admin::MySqlAdmin;
pub use backend::MySqlBackend;
pub use backfill::MySqlBackfill;
pub use capture::MySqlCapture;
pub use cdc::{CdcSetupReport, MySqlCdcInspector, MySqlCdcSource, binlog_problems, setup_cdc};
pub use config::{ClaimMode, DatabaseUrl, Mode, MySqlConfig, OnDelivered};
pub use connect::connect;
pub use error::EnqueueError;
pub use lease::MySqlLeaseSource;
pub use migrate::{MigrateError, MigrationReport, SCHEMA_VERSION, migrate, schema_version};
pub use poll::MySqlPollSource;
pub use producer::{BATCH_ROWS, MySqlOutbox, enqueue, enqueue_batch};
pub use server::{ServerVersion, server_version};
pub use verify::{CDC_SETTLE, MySqlLedger};
