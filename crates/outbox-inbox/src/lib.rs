//! The consumer side of `outbox`: an idempotent inbox that turns at-least-once delivery into
//! effectively-once processing, and ready consumer loops.
//!
//! The relay delivers every event **at least once**; after a crash it may deliver one twice.
//! The inbox records `(consumer, event_id)` in a `processed_events` table **in the same
//! transaction as the consumer's side effect**: a duplicate hits the primary key, inserts
//! nothing, and the side effect is skipped; a failing handler rolls back both. See
//! `docs/inbox.md` for the full contract and the retention rule.
//!
//! - [`PgInbox`] (PostgreSQL), [`SqliteInbox`] (SQLite) and `MySqlInbox` (MySQL / MariaDB,
//!   feature `mysql`): `migrate`, `begin` (returns the open transaction, or `None` for a
//!   duplicate), `process` (runs a handler in it), `purge_older_than` (retention).
//! - `DynamoDbInbox` (feature `dynamodb`): the dedup item put with `attribute_not_exists` in
//!   the handler's own `TransactWriteItems` (`transaction`, then `commit`), TTL retention.
//! - [`InboxMessage`]: a delivered message with the contract headers parsed back.
//!
//! Each database is a feature (`postgres`, `sqlite`: both on by default; `mysql`: off by
//! default): a PostgreSQL-only consumer sets `default-features = false, features =
//! ["postgres", "nats"]` and builds no SQLite; a MySQL consumer sets `features = ["mysql"]`.
//!
//! Consumer loops, each behind its own feature, all built on the [`lane`] module: ack only
//! after the handler's commit, bounded concurrency with one message at a time per key
//! `(aggregate_type, aggregate_id)`, handler errors retried in place with backoff (per-key
//! order kept across retries, other keys flowing meanwhile), then the broker's dead-letter
//! mechanism (never a silent ack), graceful shutdown on a `CancellationToken` returning a
//! [`ConsumerReport`]:
//!
//! | feature | loop | dead letters |
//! | --- | --- | --- |
//! | `nats` (default) | [`nats::JetStreamConsumer`]: durable pull consumer | `+TERM` (advisory) |
//! | `redis` | `redis::StreamConsumer`: consumer group, `XAUTOCLAIM` recovery | `<stream>.dead` |
//! | `rabbitmq` | `rabbitmq::QueueConsumer`: manual acks, prefetch | the queue's dead-letter exchange |
//! | `kafka` | `kafka::KafkaConsumer`: consumer group, contiguous offset commits | `<topic>.dead` |
//! | `http` | [`http::WebhookReceiver`]: Standard Webhooks verification (401), 500 on error | the sender's |
//!
//! With the `payload` feature, `payload::decoding` wraps a handler so that it receives the
//! producer's payload from a claim-checked or encrypted message (docs/payloads.md).
//!
//! With the `otel` feature every loop runs each handler attempt in an OpenTelemetry span of
//! kind CONSUMER, a child of the message's `traceparent` (`docs/observability.md`, "Traces"),
//! and `InboxMessage::trace_context` reads that parent for loops of your own.

pub mod canary;
#[cfg(feature = "dynamodb")]
pub mod dynamodb;
mod error;
pub mod lane;
mod message;
#[cfg(feature = "mysql")]
mod mysql;
#[cfg(feature = "postgres")]
mod postgres;
mod sql;
mod sql_inbox;
#[cfg(feature = "sqlite")]
mod sqlite;
mod trace;

#[cfg(feature = "http")]
pub mod http;
#[cfg(feature = "kafka")]
pub mod kafka;
#[cfg(feature = "nats")]
pub mod nats;
#[cfg(feature = "payload")]
pub mod payload;
#[cfg(feature = "rabbitmq")]
pub mod rabbitmq;
#[cfg(feature = "redis")]
pub mod redis;

#[cfg(feature = "dynamodb")]
pub use dynamodb::{DynamoDbInbox, DynamoDbInboxError, DynamoDbOrderGate, InboxTransaction};
pub use error::{InboxError, MigrateError, MigrationReport};
pub use lane::{
    ConsumerError, ConsumerOrder, ConsumerReport, LanePolicy, MessageHandler, OrderGate,
};
pub use message::{InboxMessage, MessageError};
#[cfg(feature = "mysql")]
pub use mysql::MySqlInbox;
#[cfg(feature = "postgres")]
pub use postgres::PgInbox;
pub use sql::SCHEMA_VERSION;
pub use sql_inbox::{Dialect, SqlInbox};
#[cfg(feature = "sqlite")]
pub use sqlite::SqliteInbox;

/// What became of one delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome<T> {
    /// First delivery: the handler ran and its transaction committed with the dedup record.
    Processed(T),
    /// The consumer already processed this event: the handler was not called.
    Duplicate,
}

impl<T> Outcome<T> {
    /// True for [`Outcome::Duplicate`].
    pub fn is_duplicate(&self) -> bool {
        matches!(self, Self::Duplicate)
    }
}

/// Default name of the inbox table.
pub const DEFAULT_TABLE: &str = "processed_events";

/// Rows deleted per statement by `purge_older_than`.
pub const PURGE_BATCH: i64 = 5_000;
