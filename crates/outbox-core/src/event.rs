//! The event as producers write it ([`NewEvent`]) and as the relay reads it back ([`Event`]).

use bytes::Bytes;
use time::OffsetDateTime;
use uuid::Uuid;

/// Where an event sits in its source: the outbox row's `seq` for polling sources, the WAL
/// position for CDC. Opaque to the core, except that it identifies the event when settling.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Position(pub i64);

/// A committed outbox event, as a source hands it to the relay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// Stable event id (UUIDv7 by default). Every message carries it so consumers dedupe.
    pub id: Uuid,
    /// Where the event sits in its source.
    pub position: Position,
    /// Aggregate kind, e.g. `Order`. With `aggregate_id` it forms the ordering key.
    pub aggregate_type: String,
    /// Aggregate instance, e.g. `o_91f2`. Also the message key (Kafka partitioning).
    pub aggregate_id: String,
    /// Event kind, e.g. `order.placed`.
    pub event_type: String,
    /// The payload bytes exactly as the producer stored them.
    pub payload: Bytes,
    /// The row's own headers (string values), in the order the source returned them.
    pub headers: Vec<(String, String)>,
    /// When the producer wrote the event (the database clock).
    pub created_at: OffsetDateTime,
    /// Failed publish attempts recorded before this delivery attempt.
    pub attempts: u32,
}

impl Event {
    /// True when `other` belongs to the same aggregate, i.e. shares the ordering key.
    pub fn same_aggregate(&self, other: &Event) -> bool {
        self.aggregate_id == other.aggregate_id && self.aggregate_type == other.aggregate_type
    }
}

/// An event to write into the outbox, inside the caller's transaction.
///
/// ```
/// use outbox_core::NewEvent;
///
/// #[derive(serde::Serialize)]
/// struct OrderPlaced { order_id: String, total_cents: i64 }
///
/// let event = NewEvent::json("Order", "o_91f2", "order.placed",
///         &OrderPlaced { order_id: "o_91f2".into(), total_cents: 1250 })?
///     .with_header("tenant", "acme");
/// assert_eq!(&event.payload[..], br#"{"order_id":"o_91f2","total_cents":1250}"#);
/// # Ok::<(), serde_json::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewEvent {
    /// Event id; `None` lets the database assign a UUIDv7.
    pub id: Option<Uuid>,
    /// Aggregate kind, e.g. `Order`.
    pub aggregate_type: String,
    /// Aggregate instance, e.g. `o_91f2`.
    pub aggregate_id: String,
    /// Event kind, e.g. `order.placed`.
    pub event_type: String,
    /// Payload bytes, stored and delivered exactly as given.
    pub payload: Bytes,
    /// Extra message headers (string values).
    pub headers: Vec<(String, String)>,
}

impl NewEvent {
    /// An event with a raw byte payload (JSON text, protobuf, Avro: any bytes).
    pub fn new(
        aggregate_type: impl Into<String>,
        aggregate_id: impl Into<String>,
        event_type: impl Into<String>,
        payload: impl Into<Bytes>,
    ) -> Self {
        Self {
            id: None,
            aggregate_type: aggregate_type.into(),
            aggregate_id: aggregate_id.into(),
            event_type: event_type.into(),
            payload: payload.into(),
            headers: Vec::new(),
        }
    }

    /// An event whose payload is `value` serialized as JSON, now, at write time.
    pub fn json<T: serde::Serialize + ?Sized>(
        aggregate_type: impl Into<String>,
        aggregate_id: impl Into<String>,
        event_type: impl Into<String>,
        value: &T,
    ) -> Result<Self, serde_json::Error> {
        let payload = serde_json::to_vec(value)?;
        Ok(Self::new(aggregate_type, aggregate_id, event_type, payload))
    }

    /// Sets the event id instead of letting the database assign a UUIDv7.
    pub fn with_id(mut self, id: Uuid) -> Self {
        self.id = Some(id);
        self
    }

    /// Adds a message header.
    pub fn with_header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }
}
