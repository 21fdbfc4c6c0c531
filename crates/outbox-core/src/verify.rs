//! The two seams of `outbox verify`: what the outbox table says was delivered, and what the
//! destination holds.
//!
//! - [`DeliveryLedger`] is a backend ability ([`crate::Backend::delivery_ledger`]): the events
//!   the table records as delivered in a [`Window`], in commit order, and a lookup of ids in
//!   any state. Each database says what "delivered" means for it ([`Basis`]): a row marked
//!   delivered (polling), nothing (rows deleted on delivery), or a stream position that passed
//!   the row's transaction (CDC).
//! - [`ReadBack`] is built by a sink's config ([`crate::BuildSink::read_back`]): the messages
//!   the destination holds since a time, read with the broker's own consumer API **without
//!   taking them from its consumers** (an ephemeral ordered consumer, offsets by time, a range
//!   read, the file). A sink whose destination cannot be read that way (a queue, a webhook)
//!   refuses with [`ReadBackErrorKind::Unsupported`], never with an empty read.
//!
//! The reconciler that compares the two (lost, phantom, duplicates, order breaks) knows
//! neither: it is `outbox_runtime::verify`. Both traits are object-safe and called once per
//! command.

use time::OffsetDateTime;
use uuid::Uuid;

use crate::SourceError;
use crate::future::BoxFuture;

/// The events a verification covers: written at or after `since` and before `until`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    /// Written at or after this time.
    pub since: OffsetDateTime,
    /// Written before this time.
    pub until: OffsetDateTime,
}

/// What "delivered" means for one outbox table.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Basis {
    /// Rows are marked `state = 'delivered'` (with `delivered_at`) once the broker
    /// acknowledged them: the table proves every delivery.
    Marked,
    /// Delivered rows are deleted (`source.on_delivered = "delete"`): only undelivered rows
    /// remain, so the table cannot say which events should be at the destination.
    Deleted,
    /// A change stream (CDC): an event counts as delivered once the stream's confirmed
    /// position passed its transaction.
    Stream {
        /// How that was decided, for people (the slot, the position, the margin).
        detail: String,
    },
}

/// One delivered event as the table records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LedgerEvent {
    /// The event id.
    pub id: Uuid,
    /// Aggregate type.
    pub aggregate_type: String,
    /// Aggregate id.
    pub aggregate_id: String,
    /// Event type.
    pub event_type: String,
    /// Its commit-order position in the table (`seq`, `position`): orders one aggregate's
    /// events.
    pub position: i64,
    /// When the producer wrote it.
    pub created_at: OffsetDateTime,
    /// When it was delivered, where the table records that.
    pub delivered_at: Option<OffsetDateTime>,
}

/// What the table holds for a window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ledger {
    /// What "delivered" means here.
    pub basis: Basis,
    /// The delivered events written in the window, in commit order.
    pub delivered: Vec<LedgerEvent>,
    /// Events written in the window and not delivered yet (pending, retrying, or not yet
    /// confirmed by the stream).
    pub undelivered: u64,
    /// Dead-lettered events written in the window.
    pub dead: u64,
    /// Anything the operator should know about this reading (one line each).
    pub notes: Vec<String>,
}

/// The state of a row found by [`DeliveryLedger::lookup`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RowState {
    /// Delivered (marked so, or, in stream mode, any row that is not a dead letter: the
    /// caller compares its time with the window).
    Delivered,
    /// Pending or retrying.
    Undelivered,
    /// Dead-lettered.
    Dead,
}

/// A row of the table, found by id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredRow {
    /// The event id.
    pub id: Uuid,
    /// Its state.
    pub state: RowState,
    /// Its commit-order position.
    pub position: i64,
    /// When the producer wrote it.
    pub created_at: OffsetDateTime,
}

impl RowState {
    /// The state of a row from its `state` column (`pending`, `delivered`, `dead`).
    pub fn from_column(state: &str) -> Self {
        match state {
            "delivered" => Self::Delivered,
            "dead" => Self::Dead,
            _ => Self::Undelivered,
        }
    }
}

/// The ids as text in both spellings a row may hold (databases that keep ids as text: a
/// plain-SQL producer may have written one in upper case; messages carry lower case), as a
/// JSON array to bind as one parameter.
pub fn id_spellings_json(ids: &[Uuid]) -> String {
    let mut texts = Vec::with_capacity(ids.len() * 2);
    for id in ids {
        let lower = id.hyphenated().to_string();
        texts.push(lower.to_uppercase());
        texts.push(lower);
    }
    serde_json::to_string(&texts).unwrap_or_else(|_| "[]".to_owned())
}

/// The note of a ledger whose table deletes rows on delivery.
pub fn deleted_on_delivery_note(table: &str) -> String {
    format!(
        "outbox table {table} deletes rows on delivery (source.on_delivered = \"delete\"): it keeps only undelivered events"
    )
}

/// The most ids [`DeliveryLedger::lookup`] is called with at once.
pub const LOOKUP_CHUNK: usize = 1_000;

/// Reading what the outbox table says was delivered (`outbox verify`).
pub trait DeliveryLedger: Send + Sync {
    /// The delivered events written in `window`, in commit order. A stream (CDC) backend
    /// may wait a bounded time for its stream to confirm what was committed before the
    /// call; when it cannot tell, it fails with a message saying why.
    fn delivered(&self, window: Window) -> BoxFuture<'_, Result<Ledger, SourceError>>;
    /// The rows with these ids (at most [`LOOKUP_CHUNK`]), in any state; ids the table does
    /// not have are left out of the answer.
    fn lookup<'a>(&'a self, ids: &'a [Uuid]) -> BoxFuture<'a, Result<Vec<StoredRow>, SourceError>>;
}

/// What identifies an outbox event in a message read back: the contract headers of the plain
/// format, or the CloudEvents attributes (binary or structured).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Identity {
    /// The event id; `None` when the message carries none (not an outbox message, or a
    /// malformed one).
    pub id: Option<Uuid>,
    /// Aggregate type.
    pub aggregate_type: Option<String>,
    /// Aggregate id.
    pub aggregate_id: Option<String>,
    /// The `aggregate_seq` header (`aggregateseq` attribute), when present.
    pub aggregate_seq: Option<u64>,
}

impl Identity {
    /// Reads a message: the plain headers (`id`, `aggregate_type`, `aggregate_id`,
    /// `aggregate_seq`) first, then the CloudEvents binary headers (`ce_id` / `ce-id`,
    /// `…aggregatetype`, `…subject`, `…aggregateseq`), then a structured CloudEvent in
    /// `body`. `header(name)` returns a header's (or a field's) value; it is asked only for
    /// exact, lowercase names.
    pub fn read(header: impl Fn(&str) -> Option<String>, body: &[u8]) -> Self {
        use crate::cloudevents::attribute as a;
        use crate::message::header as h;
        if let Some(id) = header(h::ID) {
            return Self {
                id: Uuid::parse_str(id.trim()).ok(),
                aggregate_type: header(h::AGGREGATE_TYPE),
                aggregate_id: header(h::AGGREGATE_ID),
                aggregate_seq: header(h::AGGREGATE_SEQ)
                    .and_then(|s| crate::aggregate_seq::parse(s.trim())),
            };
        }
        for prefix in ["ce_", "ce-"] {
            let get = |name: &str| header(&format!("{prefix}{name}"));
            if let Some(id) = get(a::ID) {
                return Self {
                    id: Uuid::parse_str(id.trim()).ok(),
                    aggregate_type: get(a::AGGREGATETYPE),
                    aggregate_id: get(a::SUBJECT),
                    aggregate_seq: get(a::AGGREGATESEQ)
                        .and_then(|s| crate::aggregate_seq::parse(s.trim())),
                };
            }
        }
        // Only a body that looks like a JSON object is parsed (a plain message with a JSON
        // payload and no `id` header is not an outbox message either way).
        if body.first() == Some(&b'{')
            && let Some(envelope) = crate::cloudevents::Envelope::parse(body)
        {
            let get = |name: &str| {
                envelope
                    .attributes
                    .iter()
                    .find(|(n, _)| n == name)
                    .map(|(_, v)| v.clone())
            };
            return Self {
                id: get(a::ID).and_then(|id| Uuid::parse_str(id.trim()).ok()),
                aggregate_type: get(a::AGGREGATETYPE),
                aggregate_id: get(a::SUBJECT),
                aggregate_seq: get(a::AGGREGATESEQ)
                    .and_then(|s| crate::aggregate_seq::parse(s.trim_matches('"'))),
            };
        }
        Self::default()
    }
}

/// One message read back from the destination.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadMessage {
    /// What identifies the event it carries.
    pub identity: Identity,
    /// The lane it was read from (an index into [`ReadOutcome::lanes`]): one totally ordered
    /// sequence, such as a partition, a stream, a stream key or a file.
    pub lane: u32,
    /// Its place in the lane, for people (stream sequence, offset, entry id, line number).
    pub offset: u64,
    /// When the broker stored it, where the broker says.
    pub stored_at: Option<OffsetDateTime>,
}

/// One ordered sequence of messages that was read.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Lane {
    /// What it is, for people: `stream OUTBOX, subject outbox.event.>`, `topic t partition 0`.
    pub name: String,
    /// Messages read from it.
    pub messages: u64,
}

/// Where a destination no longer holds what it once held (retention, trimming, deletes at
/// its start): events sent there before `retained_from` may be gone.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Trimmed {
    /// The destination it applies to (a topic, a stream key); `None`: every destination that
    /// was read.
    pub destination: Option<String>,
    /// When its oldest retained message was stored.
    #[serde(with = "time::serde::rfc3339")]
    pub retained_from: OffsetDateTime,
    /// What was found, for people (`stream OUTBOX starts at sequence 1042`).
    pub detail: String,
}

/// What a read-back returned.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReadOutcome {
    /// The messages, lane by lane, each lane in its own order.
    pub messages: Vec<ReadMessage>,
    /// The lanes.
    pub lanes: Vec<Lane>,
    /// Destinations that no longer hold their oldest messages.
    pub trimmed: Vec<Trimmed>,
    /// Anything the operator should know about the read (one line each).
    pub notes: Vec<String>,
}

/// Progress of a verification: its stages, and the messages read so far.
pub trait ReadProgress: Send + Sync {
    /// A new stage begins (`reading outbox table public.outbox`).
    fn stage(&self, what: &str) {
        let _ = what;
    }
    /// `read` messages read so far, of `total` where the broker tells it.
    fn advance(&self, read: u64, total: Option<u64>);
}

/// A [`ReadProgress`] that shows nothing.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoProgress;

impl ReadProgress for NoProgress {
    fn advance(&self, _read: u64, _total: Option<u64>) {}
}

/// Why a destination could not be read back: each kind means "cannot verify".
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ReadBackErrorKind {
    /// The destination cannot be read back without taking messages from its consumers (a
    /// queue, a webhook), or reading it back is not built yet.
    Unsupported,
    /// The broker could not be reached.
    Unreachable,
    /// The broker refused (authentication, permissions, a missing stream or topic).
    Refused,
    /// Anything else.
    Failed,
}

/// A destination that could not be read back; the message names what is missing (the URL
/// redacted).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ReadBackError {
    /// What kind of failure.
    pub kind: ReadBackErrorKind,
    /// What happened and what to do, for people.
    pub message: String,
}

impl ReadBackError {
    /// An error of `kind`.
    pub fn new(kind: ReadBackErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }
    /// The destination cannot be read back; see [`ReadBackErrorKind::Unsupported`].
    pub fn unsupported(message: impl Into<String>) -> Self {
        Self::new(ReadBackErrorKind::Unsupported, message)
    }
    /// The broker could not be reached.
    pub fn unreachable(message: impl Into<String>) -> Self {
        Self::new(ReadBackErrorKind::Unreachable, message)
    }
    /// The broker refused.
    pub fn refused(message: impl Into<String>) -> Self {
        Self::new(ReadBackErrorKind::Refused, message)
    }
    /// Anything else.
    pub fn failed(message: impl Into<String>) -> Self {
        Self::new(ReadBackErrorKind::Failed, message)
    }
    /// The default refusal of a sink `kind` whose destination consumers take messages from.
    pub fn consumed_destination(kind: &str) -> Self {
        Self::unsupported(format!(
            "a kind = \"{kind}\" destination cannot be read back without taking messages from its consumers, so `outbox verify` cannot check it; its consumers can check it with the canary's probes (`[canary]`, a consumer-side canary: docs/operations.md#canary)"
        ))
    }
}

/// Reading a destination back (`outbox verify`); built by [`crate::BuildSink::read_back`].
pub trait ReadBack: Send + Sync {
    /// The destination for people, secrets redacted (`NATS JetStream at nats://…, stream
    /// OUTBOX`).
    fn describe(&self) -> String;
    /// The destination template of the sink.
    fn destination(&self) -> &crate::Destination;
    /// Where `event` was sent (its rendered destination), to match it with
    /// [`Trimmed::destination`].
    fn destination_of(&self, event: &LedgerEvent) -> String {
        self.destination().render_parts(
            &event.aggregate_type,
            &event.aggregate_id,
            &event.event_type,
        )
    }
    /// Every message stored at or after `since` (a little earlier is fine: the caller sorts
    /// out what is outside the window), to the end of each lane as it was when the read
    /// started. `expected` are the events the table says were delivered, for sinks that
    /// find their destinations from them (a template with placeholders); a read must also
    /// look beyond them where the broker can list its destinations, so that phantoms on a
    /// destination the table never named are found.
    fn read<'a>(
        &'a self,
        since: OffsetDateTime,
        expected: &'a [LedgerEvent],
        progress: &'a dyn ReadProgress,
    ) -> BoxFuture<'a, Result<ReadOutcome, ReadBackError>>;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| {
            pairs
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| (*v).to_owned())
        }
    }

    #[test]
    fn reads_plain_headers() {
        let id = "0190f3c2-7d1e-7a4b-9c61-3f5e0b2a8d10";
        let got = Identity::read(
            headers(&[
                ("id", id),
                ("aggregate_type", "Order"),
                ("aggregate_id", "o_1"),
                ("aggregate_seq", "3"),
            ]),
            b"{}",
        );
        assert_eq!(got.id, Uuid::parse_str(id).ok());
        assert_eq!(got.aggregate_id.as_deref(), Some("o_1"));
        assert_eq!(got.aggregate_seq, Some(3));
    }

    #[test]
    fn reads_cloudevents_binary_and_structured() {
        let id = "0190f3c2-7d1e-7a4b-9c61-3f5e0b2a8d10";
        let got = Identity::read(
            headers(&[
                ("ce_id", id),
                ("ce_aggregatetype", "Order"),
                ("ce_subject", "o_1"),
            ]),
            b"",
        );
        assert_eq!(got.id, Uuid::parse_str(id).ok());
        assert_eq!(got.aggregate_type.as_deref(), Some("Order"));
        assert_eq!(got.aggregate_seq, None);
        let body = format!(
            "{{\"specversion\":\"1.0\",\"id\":\"{id}\",\"source\":\"s\",\"type\":\"t\",\"subject\":\"o_2\",\"aggregatetype\":\"Order\",\"aggregateseq\":\"7\",\"data\":{{}}}}"
        );
        let got = Identity::read(|_| None, body.as_bytes());
        assert_eq!(got.id, Uuid::parse_str(id).ok());
        assert_eq!(got.aggregate_id.as_deref(), Some("o_2"));
        assert_eq!(got.aggregate_seq, Some(7));
    }

    #[test]
    fn a_message_without_an_id_has_no_identity() {
        assert_eq!(Identity::read(|_| None, b"{\"a\":1}"), Identity::default());
        let got = Identity::read(headers(&[("id", "not-a-uuid")]), b"");
        assert_eq!(got.id, None);
    }
}
