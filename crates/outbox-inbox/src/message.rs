//! [`InboxMessage`]: a delivered message with the contract headers of `DESIGN.md` parsed
//! back (`id`, `event_type`, `aggregate_type`, `aggregate_id`, then the row's own headers).

use bytes::Bytes;
use outbox_core::message::header;
use uuid::Uuid;

/// A message as a consumer receives it, whatever the broker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InboxMessage {
    /// The event id: the inbox's deduplication key.
    pub id: Uuid,
    /// Event kind, e.g. `order.placed`.
    pub event_type: String,
    /// Aggregate kind, e.g. `Order`.
    pub aggregate_type: String,
    /// Aggregate instance, e.g. `o_91f2`: the ordering key of the consumer loops.
    pub aggregate_id: String,
    /// The event's delivery position within its aggregate (header `aggregate_seq`: 1, 2, 3,
    /// … with no gaps), set by the polling relay when ordering is on; `None` without it
    /// (CDC, replays, `ordering = "none"`, a relay from before it). The loops' order gate
    /// holds a message until its predecessor is applied.
    pub aggregate_seq: Option<u64>,
    /// The row's own headers (not the contract headers, nor broker headers the loop
    /// knows, such as `Nats-Msg-Id`).
    pub headers: Vec<(String, String)>,
    /// The payload bytes exactly as the producer stored them.
    pub payload: Bytes,
}

/// Why a delivered message does not follow the contract. Such a message can never be
/// processed, so the loops dead-letter it (or answer 400) instead of retrying.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MessageError {
    /// A contract header is missing.
    #[error("the message has no `{0}` header")]
    MissingHeader(&'static str),
    /// The `id` header is not a UUID.
    #[error("the `id` header `{0}` is not a UUID")]
    InvalidId(String),
}

impl InboxMessage {
    /// Parses the contract headers out of `headers`; every other header is kept in
    /// [`InboxMessage::headers`] except those named in `skip` (broker bookkeeping).
    pub fn from_headers<'h>(
        headers: impl IntoIterator<Item = (&'h str, &'h str)>,
        skip: &[&str],
        payload: Bytes,
    ) -> Result<Self, MessageError> {
        let (mut id, mut event_type, mut aggregate_type, mut aggregate_id) =
            (None, None, None, None);
        let mut aggregate_seq = None;
        let mut own = Vec::new();
        for (name, value) in headers {
            let slot = match name {
                header::ID => &mut id,
                header::EVENT_TYPE => &mut event_type,
                header::AGGREGATE_TYPE => &mut aggregate_type,
                header::AGGREGATE_ID => &mut aggregate_id,
                header::AGGREGATE_SEQ => {
                    aggregate_seq = aggregate_seq.or(outbox_core::aggregate_seq::parse(value));
                    continue;
                }
                other if skip.iter().any(|s| s.eq_ignore_ascii_case(other)) => continue,
                other => {
                    own.push((other.to_owned(), value.to_owned()));
                    continue;
                }
            };
            slot.get_or_insert_with(|| value.to_owned());
        }
        let id = id.ok_or(MessageError::MissingHeader(header::ID))?;
        let id = Uuid::parse_str(&id).map_err(|_| MessageError::InvalidId(id))?;
        Ok(Self {
            id,
            event_type: event_type.ok_or(MessageError::MissingHeader(header::EVENT_TYPE))?,
            aggregate_type: aggregate_type
                .ok_or(MessageError::MissingHeader(header::AGGREGATE_TYPE))?,
            aggregate_id: aggregate_id.ok_or(MessageError::MissingHeader(header::AGGREGATE_ID))?,
            aggregate_seq,
            headers: own,
            payload,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contract_headers_are_parsed_and_the_rest_kept_except_skipped_ones() {
        let m = InboxMessage::from_headers(
            [
                ("id", "00000000-0000-0000-0000-000000000001"),
                ("event_type", "order.placed"),
                ("aggregate_type", "Order"),
                ("aggregate_id", "o_1"),
                ("aggregate_seq", "7"),
                ("tenant", "acme"),
                ("Nats-Msg-Id", "00000000-0000-0000-0000-000000000001"),
            ],
            &["nats-msg-id"],
            Bytes::from_static(b"{}"),
        )
        .expect("valid");
        assert_eq!(m.id, Uuid::from_u128(1));
        assert_eq!(m.aggregate_id, "o_1");
        assert_eq!(m.aggregate_seq, Some(7));
        assert_eq!(m.headers, vec![("tenant".to_owned(), "acme".to_owned())]);
    }

    #[test]
    fn a_message_without_a_valid_id_is_refused() {
        let missing = InboxMessage::from_headers([("event_type", "x")], &[], Bytes::new());
        assert_eq!(missing, Err(MessageError::MissingHeader("id")));
        let bad = InboxMessage::from_headers([("id", "nope")], &[], Bytes::new());
        assert_eq!(bad, Err(MessageError::InvalidId("nope".to_owned())));
    }
}
