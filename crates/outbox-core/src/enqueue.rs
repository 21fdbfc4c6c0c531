//! What every database's producer shares: the one [`EnqueueError`], the event checks made
//! before a row is written, and the `headers` column codec (a JSON object of string values).

use std::error::Error as StdError;

use crate::NewEvent;

/// Why `enqueue` failed.
#[derive(Debug, thiserror::Error)]
pub enum EnqueueError {
    /// The event is not valid (an empty aggregate type, id or event type).
    #[error("invalid outbox event: {0}")]
    Invalid(&'static str),
    /// The database refused the insert or could not be reached. The caller's transaction
    /// should be rolled back. The cause is the driver's error (e.g. `sqlx::Error`).
    #[error("writing to the outbox failed")]
    Database(#[source] Box<dyn StdError + Send + Sync>),
}

impl EnqueueError {
    /// A database failure with its cause.
    pub fn database(e: impl StdError + Send + Sync + 'static) -> Self {
        Self::Database(Box::new(e))
    }
}

/// Checks `event` before it is written: aggregate type, aggregate id and event type are set.
pub fn validate(event: &NewEvent) -> Result<(), EnqueueError> {
    match empty_key(
        &event.aggregate_type,
        &event.aggregate_id,
        &event.event_type,
    ) {
        Some(what) => Err(EnqueueError::Invalid(what)),
        None => Ok(()),
    }
}

/// The first of an event's keys that is empty, as the error says it (`"aggregate_type is
/// empty"`), or `None` when all three are set: the check [`validate`] makes, also made on
/// events read back from a stream.
pub fn empty_key(
    aggregate_type: &str,
    aggregate_id: &str,
    event_type: &str,
) -> Option<&'static str> {
    [
        (aggregate_type, "aggregate_type is empty"),
        (aggregate_id, "aggregate_id is empty"),
        (event_type, "event_type is empty"),
    ]
    .into_iter()
    .find_map(|(value, what)| value.is_empty().then_some(what))
}

/// The event's headers as the `headers` column holds them: a JSON object of strings.
pub fn headers_object(event: &NewEvent) -> serde_json::Map<String, serde_json::Value> {
    event
        .headers
        .iter()
        .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone())))
        .collect()
}

/// [`headers_object`] as JSON text (databases without a JSON type).
pub fn headers_json(event: &NewEvent) -> String {
    serde_json::Value::Object(headers_object(event)).to_string()
}

/// The `headers` column read back: string values as they are, any other JSON value (written
/// by a producer in another language) as its JSON text. A header named
/// [`aggregate_seq`](crate::message::header::AGGREGATE_SEQ) is dropped: only the relay sets it.
pub fn decode_headers(
    headers: serde_json::Map<String, serde_json::Value>,
) -> Vec<(String, String)> {
    headers
        .into_iter()
        .filter(|(k, _)| k != crate::message::header::AGGREGATE_SEQ)
        .map(|(k, v)| match v {
            serde_json::Value::String(s) => (k, s),
            other => (k, other.to_string()),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_round_trip_and_foreign_values_become_text() {
        let event = NewEvent::new("Order", "o_1", "order.placed", "{}").with_header("k", "v");
        assert_eq!(headers_json(&event), r#"{"k":"v"}"#);
        let mut map = headers_object(&event);
        map.insert("n".into(), serde_json::json!(3));
        let mut decoded = decode_headers(map);
        decoded.sort();
        assert_eq!(
            decoded,
            vec![("k".into(), "v".into()), ("n".into(), "3".into())]
        );
    }

    #[test]
    fn an_event_without_its_keys_is_refused_with_what_is_missing() {
        let event = NewEvent::new("", "o_1", "order.placed", "{}");
        assert_eq!(
            validate(&event).expect_err("invalid").to_string(),
            "invalid outbox event: aggregate_type is empty"
        );
        assert!(validate(&NewEvent::new("Order", "o_1", "t", "{}")).is_ok());
    }
}
