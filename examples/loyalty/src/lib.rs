//! Seed 001's scenario, end to end, with every failure the outbox pattern exists for.
//!
//! - [`shop`]: `place_order` writes the order **and** its `order.placed` event in one
//!   transaction (the producer side: no dual write).
//! - the relay (the `outbox` crates' own relay loop, run in-process here) publishes the event
//!   at least once; [`chaos::Redeliver`] makes it publish some batches twice, as a relay that
//!   crashed after publishing and before recording would on restart.
//! - [`loyalty`]: the consumer awards points through the inbox: exactly once per order, even
//!   when a message arrives twice or when the consumer "crashes" after its commit and before
//!   its acknowledgement ([`Options::lost_acks`]).
//!
//! Two setups, one command each (see `examples/loyalty/README.md`):
//! [`run_embedded`] (SQLite files + signed HTTP webhooks, no services) and
//! [`run_postgres_nats`] (PostgreSQL + NATS JetStream).

pub mod chaos;
pub mod loyalty;
mod run;
pub mod shop;

pub use run::{Options, Summary, run_embedded, run_postgres_nats};

/// The consumer's name in `processed_events`.
pub const CONSUMER: &str = "loyalty";

/// Points per whole currency unit of an order.
pub const POINTS_PER_UNIT: i64 = 1;
