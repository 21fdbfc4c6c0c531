//! Table-less events: the encoding of an event inside a `pg_logical_emit_message` payload,
//! and the producer call that emits one in the caller's transaction.
//!
//! Encoding, version 1 (documented in `docs/cdc.md` so producers in any language can emit):
//!
//! ```text
//! {"v":1,"id":"<uuid>","aggregate_type":"Order","aggregate_id":"o_1","event_type":"order.placed","headers":{"k":"v"}}\n<payload bytes>
//! ```
//!
//! One line of compact JSON (no raw newline inside: JSON escapes it in strings), a `\n`, then
//! the payload bytes exactly as they are delivered. The header carries its version; a reader
//! refuses any other. The payload needs no escaping, so binary payloads cost nothing extra.

use bytes::Bytes;
use outbox_core::NewEvent;
use serde::{Deserialize, Serialize};
use sqlx::PgExecutor;
use uuid::Uuid;

use crate::error::EnqueueError;

/// The message prefix the CDC source listens to by default (`source.message_prefix`).
pub const DEFAULT_MESSAGE_PREFIX: &str = "outbox";

/// The encoding version this build writes and reads.
pub const MESSAGE_VERSION: u64 = 1;

const EMIT: &str = include_str!("../../queries/outbox_emit_message.sql");

/// Why a logical message could not be read as an outbox event.
#[derive(Debug, thiserror::Error)]
pub enum MessageDecodeError {
    /// The payload has no `\n` after the header line.
    #[error("no header line (expected `{{\"v\":1,...}}\\n` before the payload)")]
    NoHeader,
    /// The header line is not the expected JSON object.
    #[error("the header line is not a valid event header")]
    BadHeader(#[source] serde_json::Error),
    /// The header names a version this build does not read.
    #[error("unsupported event encoding version {0} (this build reads {MESSAGE_VERSION})")]
    UnsupportedVersion(u64),
    /// A required field is empty.
    #[error("invalid event: {0}")]
    Invalid(&'static str),
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Header {
    v: u64,
    id: Uuid,
    aggregate_type: String,
    aggregate_id: String,
    event_type: String,
    #[serde(default)]
    headers: serde_json::Map<String, serde_json::Value>,
}

/// A table-less event as read back from the WAL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodedMessage {
    /// Event id.
    pub id: Uuid,
    /// Aggregate type.
    pub aggregate_type: String,
    /// Aggregate id.
    pub aggregate_id: String,
    /// Event type.
    pub event_type: String,
    /// Headers (string values; other JSON values are kept as their JSON text).
    pub headers: Vec<(String, String)>,
    /// The payload bytes exactly as emitted.
    pub payload: Bytes,
}

/// Encodes `event` with the id `id` (version 1).
pub fn encode_message(event: &NewEvent, id: Uuid) -> Vec<u8> {
    let header = Header {
        v: MESSAGE_VERSION,
        id,
        aggregate_type: event.aggregate_type.clone(),
        aggregate_id: event.aggregate_id.clone(),
        event_type: event.event_type.clone(),
        headers: event
            .headers
            .iter()
            .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone())))
            .collect(),
    };
    let mut out = serde_json::to_vec(&header).expect("a header of strings always serializes");
    out.push(b'\n');
    out.extend_from_slice(&event.payload);
    out
}

/// Decodes a message written by [`encode_message`] (or by any producer following the
/// documented encoding).
pub fn decode_message(content: &Bytes) -> Result<DecodedMessage, MessageDecodeError> {
    let newline = content
        .iter()
        .position(|b| *b == b'\n')
        .ok_or(MessageDecodeError::NoHeader)?;
    let header: Header =
        serde_json::from_slice(&content[..newline]).map_err(|e| {
            match version_of(&content[..newline]) {
                Some(v) if v != MESSAGE_VERSION => MessageDecodeError::UnsupportedVersion(v),
                _ => MessageDecodeError::BadHeader(e),
            }
        })?;
    if header.v != MESSAGE_VERSION {
        return Err(MessageDecodeError::UnsupportedVersion(header.v));
    }
    if let Some(what) = outbox_core::enqueue::empty_key(
        &header.aggregate_type,
        &header.aggregate_id,
        &header.event_type,
    ) {
        return Err(MessageDecodeError::Invalid(what));
    }
    Ok(DecodedMessage {
        id: header.id,
        aggregate_type: header.aggregate_type,
        aggregate_id: header.aggregate_id,
        event_type: header.event_type,
        headers: outbox_core::enqueue::decode_headers(header.headers),
        payload: content.slice(newline + 1..),
    })
}

/// The `v` of a header that failed to parse as version 1, to report a version mismatch
/// rather than a shape error.
fn version_of(line: &[u8]) -> Option<u64> {
    #[derive(Deserialize)]
    struct V {
        v: u64,
    }
    serde_json::from_slice::<V>(line).ok().map(|v| v.v)
}

/// Emits `event` as a table-less event with the default prefix (`outbox`); see
/// [`emit_message_with_prefix`].
pub async fn emit_message<'e, E: PgExecutor<'e>>(
    executor: E,
    event: &NewEvent,
) -> Result<Uuid, EnqueueError> {
    emit_message_with_prefix(executor, DEFAULT_MESSAGE_PREFIX, event).await
}

/// Emits `event` with `pg_logical_emit_message(true, prefix, ...)` using `executor`: pass
/// `&mut *tx` to emit in your transaction. The event exists exactly when the transaction
/// commits, takes no table space, and is delivered by the CDC source (`source.mode = "cdc"`
/// with `source.message_prefix = prefix`) with the same message contract as an outbox row,
/// in commit order. Returns the event id.
///
/// ```no_run
/// # async fn place_order(pool: &sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
/// use outbox_core::NewEvent;
///
/// let mut tx = pool.begin().await?;
/// let event = NewEvent::new("Order", "o_91f2", "order.placed", &b"{\"total_cents\":1250}"[..]);
/// let id = outbox_postgres::emit_message(&mut *tx, &event).await?;
/// tx.commit().await?;
/// # let _ = id; Ok(()) }
/// ```
///
/// The database user needs `EXECUTE` on `pg_logical_emit_message`, and the server
/// `wal_level = logical`.
pub async fn emit_message_with_prefix<'e, E: PgExecutor<'e>>(
    executor: E,
    prefix: &str,
    event: &NewEvent,
) -> Result<Uuid, EnqueueError> {
    outbox_core::enqueue::validate(event)?;
    if prefix.is_empty() {
        return Err(EnqueueError::Invalid("message prefix is empty"));
    }
    let id = event.id.unwrap_or_else(Uuid::now_v7);
    crate::sql::query(sqlx::AssertSqlSafe(EMIT))
        .bind(prefix)
        .bind(encode_message(event, id))
        .execute(executor)
        .await
        .map_err(EnqueueError::database)?;
    Ok(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_encoded_event_decodes_to_the_same_fields_and_exact_payload_bytes() {
        let payload: Vec<u8> = vec![0, 159, 146, 150, b'\n', b'\\', b'x', 255];
        let event = NewEvent::new("Order", "o\n1", "order.placed", payload.clone())
            .with_header("tenant", "acme")
            .with_header("trace", "a\"b");
        let id = Uuid::now_v7();
        let bytes = Bytes::from(encode_message(&event, id));
        assert_eq!(bytes.iter().filter(|b| **b == b'\n').count(), 2);
        let decoded = decode_message(&bytes).expect("decodes");
        assert_eq!(decoded.id, id);
        assert_eq!(decoded.aggregate_id, "o\n1");
        assert_eq!(decoded.event_type, "order.placed");
        assert_eq!(&decoded.payload[..], &payload[..]);
        assert_eq!(
            decoded.headers,
            vec![
                ("tenant".to_owned(), "acme".to_owned()),
                ("trace".to_owned(), "a\"b".to_owned())
            ]
        );
    }

    #[test]
    fn a_header_written_by_hand_in_sql_decodes() {
        let bytes = Bytes::from_static(
            b"{\"v\" : 1, \"id\" : \"0190b6a0-0000-7000-8000-000000000001\", \"aggregate_type\" : \"Order\", \"aggregate_id\" : \"o_1\", \"event_type\" : \"order.placed\", \"headers\" : {\"n\": 3}}\n{}",
        );
        let d = decode_message(&bytes).expect("decodes");
        assert_eq!(d.headers, vec![("n".to_owned(), "3".to_owned())]);
        assert_eq!(&d.payload[..], b"{}");
    }

    #[test]
    fn other_versions_and_malformed_headers_are_refused() {
        let v2 = Bytes::from_static(b"{\"v\":2,\"whatever\":true}\npayload");
        assert!(matches!(
            decode_message(&v2),
            Err(MessageDecodeError::UnsupportedVersion(2))
        ));
        assert!(matches!(
            decode_message(&Bytes::from_static(b"no newline")),
            Err(MessageDecodeError::NoHeader)
        ));
        let empty = Bytes::from_static(
            b"{\"v\":1,\"id\":\"0190b6a0-0000-7000-8000-000000000001\",\"aggregate_type\":\"\",\"aggregate_id\":\"a\",\"event_type\":\"e\"}\n",
        );
        assert!(matches!(
            decode_message(&empty),
            Err(MessageDecodeError::Invalid(_))
        ));
        let unknown = Bytes::from_static(
            b"{\"v\":1,\"id\":\"0190b6a0-0000-7000-8000-000000000001\",\"aggregate_type\":\"T\",\"aggregate_id\":\"a\",\"event_type\":\"e\",\"extra\":1}\n",
        );
        assert!(matches!(
            decode_message(&unknown),
            Err(MessageDecodeError::BadHeader(_))
        ));
    }
}
