//! MySQL and MariaDB support for `outbox`: the outbox table (`migrate`) and the producer
//! (`MySqlOutbox::enqueue` in the caller's own transaction).
//!
//! **Per-aggregate order in commit order.** MySQL has no transaction-scoped advisory locks,
//! and `AUTO_INCREMENT` follows insert order, not commit order. The table's `BEFORE INSERT`
//! trigger therefore numbers each aggregate's events from a head row per aggregate
//! (`<table>_aggregate_heads`): its upsert locks that row until the producer's transaction
//! ends, so a second transaction for the same aggregate waits, and `seq` = 1, 2, 3, … follows
//! commit order with no gaps — for producers in any language, also when a producer writes the
//! outbox row before it locks its business row. See `docs/mysql.md`.
//!
//! Not built yet: the polling relay, binlog CDC, the inbox and the operator commands.

mod error;
mod migrate;
mod producer;
mod sql;

pub use error::EnqueueError;
pub use migrate::{MigrateError, MigrationReport, SCHEMA_VERSION, migrate};
pub use producer::MySqlOutbox;
