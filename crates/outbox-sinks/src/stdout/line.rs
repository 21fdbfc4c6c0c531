//! [`JsonLine`]: one line of the stdout / file output read back, for tests and tools that
//! consume it (the encoding itself is `crate::json_lines`, shared with the HTTP sink's
//! batched mode).

use std::collections::BTreeMap;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde::Deserialize;
use serde_json::value::RawValue;
use time::OffsetDateTime;
use uuid::Uuid;

/// One line of the stdout / file output, parsed back (see [`crate::stdout`]).
#[derive(Debug, Clone, Deserialize)]
pub struct JsonLine {
    /// The event id.
    pub id: Uuid,
    /// The rendered destination.
    pub destination: String,
    /// The message key (`aggregate_id`).
    pub key: String,
    /// The event type.
    pub event_type: String,
    /// The aggregate type.
    pub aggregate_type: String,
    /// The aggregate id.
    pub aggregate_id: String,
    /// The message headers: the contract headers and the row's own.
    pub headers: BTreeMap<String, String>,
    /// When the producer wrote the event.
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    /// The payload, when it is JSON.
    #[serde(default)]
    pub payload: Option<Box<RawValue>>,
    /// The payload bytes in base64, when it is not JSON.
    #[serde(default)]
    pub payload_base64: Option<String>,
}

/// Why a [`JsonLine`]'s payload could not be recovered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PayloadError {
    /// Neither `payload` nor `payload_base64` was present.
    #[error("the line has neither `payload` nor `payload_base64`")]
    Missing,
    /// `payload_base64` was not valid base64.
    #[error("`payload_base64` is not valid base64")]
    InvalidBase64,
}

impl JsonLine {
    /// Parses one line.
    pub fn parse(line: &str) -> Result<Self, serde_json::Error> {
        serde_json::from_str(line)
    }

    /// The payload bytes: the JSON text of `payload`, or the decoded `payload_base64`.
    pub fn payload_bytes(&self) -> Result<Vec<u8>, PayloadError> {
        match (&self.payload, &self.payload_base64) {
            (Some(json), _) => Ok(json.get().as_bytes().to_vec()),
            (None, Some(encoded)) => STANDARD
                .decode(encoded)
                .map_err(|_| PayloadError::InvalidBase64),
            (None, None) => Err(PayloadError::Missing),
        }
    }
}
