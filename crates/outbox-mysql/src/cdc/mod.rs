//! The CDC source (`source.mode = "cdc"`): the outbox table's inserts read from the server's
//! row-based binlog, over the replication protocol (`mysql_async`'s binlog stream, the kept
//! Rust client that speaks it; sqlx does not).
//!
//! - `setup.rs`: what `migrate` checks and records (binlog settings, the start position).
//! - `binlog.rs`: binlog coordinates, the session's connection options, rows to events.
//! - `source.rs`: [`MySqlCdcSource`], the [`outbox_core::Source`] over the stream, on the
//!   shared change-stream machinery ([`outbox_core::change_stream`]); its parts in `source/`:
//!   the session, its lock and the kept position (`session.rs`), binlog events into the
//!   ledger (`log.rs`), dead letters and put-back order (`dead.rs`).
//!
//! Design and operations: `docs/mysql.md`, section "CDC: the binlog source".

mod binlog;
mod inspect;
mod queries;
mod setup;
mod source;

pub use inspect::MySqlCdcInspector;
pub(crate) use inspect::replication_check;
pub(crate) use queries::CdcQueries;
pub(crate) use setup::load_position;
pub use setup::{CdcSetupReport, binlog_problems, setup_cdc};
pub use source::MySqlCdcSource;
