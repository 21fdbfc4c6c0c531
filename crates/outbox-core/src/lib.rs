//! Core of the `outbox` relay: the event model, the [`Source`] and [`Sink`] traits, the retry
//! policy and the relay loop that moves events from one to the other.
//!
//! The core never names a database or a broker. A source reads committed outbox events and
//! records what became of them; a sink publishes them; the [`relay`] decides, per event, whether
//! it was delivered, must be retried later, or is dead-lettered, and keeps per-aggregate order.
//!
//! The delivery contract is **at-least-once**: an event is recorded as delivered only after the
//! sink returned an acknowledgement for it, so a crash between publish and settle republishes
//! the event. Consumers deduplicate by [`Event::id`].

pub mod admin;
pub mod admin_rows;
pub mod aggregate_seq;
pub mod backend;
pub mod backfill;
pub mod canary;
pub mod capture;
pub mod catalog;
pub mod change_stream;
pub mod cloudevents;
pub mod destination;
pub mod enqueue;
pub mod event;
pub mod future;
pub mod identifier;
pub mod message;
pub mod metrics;
pub mod migration;
pub mod policy;
pub mod redact;
pub mod relay;
pub mod retention_batches;
pub mod scratch;
pub mod sink;
pub mod source;
pub mod spill;
pub mod sql_catalog;
pub mod stream_ledger;
pub mod table_error;
pub mod table_ledger;
pub mod trace;
pub mod verify;

pub use backend::{
    Backend, BackendConfig, BoxedSource, DynSource, OpenError, OpenOptions, Pipelines, Unsupported,
};
pub use cloudevents::{Format, MessageFormat};
pub use destination::{Destination, DestinationError};
pub use enqueue::EnqueueError;
pub use event::{Event, NewEvent, Position};
pub use identifier::{Identifier, IdentifierError, QualifiedTable};
pub use policy::{Backoff, FailureAction, RetryPolicy};
pub use relay::{DeadLetterPolicy, Ordering, Relay, RelayConfig, RelayError, RelayReport};
pub use sink::{BuildSink, DynSink, Sink, SinkError, SinkErrorKind};
pub use source::{
    Backlog, Fetched, Inspect, Outcome, Settlement, Source, SourceError, SourceErrorKind,
};
