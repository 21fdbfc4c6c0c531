//! DynamoDB support for `outbox` (single-table design; `docs/contract.md`, "DynamoDB (the
//! outbox item)"):
//!
//! - [`DynamoOutbox`]: the producer side, an event as the outbox item (`OUTBOX#<id>` sort
//!   key, `seq` from the aggregate's version) for the caller's own `TransactWriteItems`;
//! - [`migrate`]: turns the table's stream on (or checks it) and creates the relay's lease
//!   and checkpoint table.
//!
//! The Streams relay source builds on these (see `docs/dynamodb.md`).

mod backend;
mod config;
mod dead;
mod error;
mod migrate;
mod producer;
mod stream;

pub use backend::DynamoBackend;
pub use config::{DynamoDbConfig, OUTBOX_PREFIX};
pub use dead::DynamoDeadLetters;
pub use error::{ConfigError, DynamoError};
pub use migrate::{LEASE_KEY, MigrateReport, client, migrate};
pub use producer::{DynamoOutbox, MAX_ITEM_BYTES, OutboxWrite, attr};
pub use stream::{DISCOVERY_INTERVAL, DynamoStreamSource};
