//! Claim-check: a payload too large for the broker is written to a store, and the message
//! carries a reference to it (docs/payloads.md, "Claim-check").
//!
//! - The store is `s3://bucket/prefix` (the AWS SDK, the standard credential chain, `region`
//!   and `endpoint_url` as the AWS sinks have them) or `file:///dir` (development).
//! - An event whose message would exceed `above` ([`message_size`]) has its payload written
//!   under `<prefix>/<aggregate_type>/<event id>` (the aggregate type percent-encoded
//!   outside `A-Za-z0-9._-`), with the event id in the object's metadata (`event-id`), before
//!   it is published. A retry writes the same key again: idempotent.
//! - The message keeps every header and gains `claim_check` (the object's URL),
//!   `claim_check_sha256` (lower-case hex of the stored bytes) and `claim_check_size`; its
//!   body is `{"claim_check":"…","claim_check_sha256":"…","claim_check_size":N}`.
//! - A store that cannot be reached, or refuses the write (a missing permission), is
//!   [`SinkErrorKind::Unavailable`](outbox_core::SinkErrorKind::Unavailable): retried,
//!   never dead-lettered. A message whose headers alone exceed `above` is
//!   [`Rejected`](outbox_core::SinkErrorKind::Rejected) with that reason.

use std::time::Duration;

use bytes::Bytes;
use outbox_core::{Event, SinkError};
use serde::{Deserialize, Serialize};

use crate::{ByteSize, DecodeError};

/// `claim_check = { store = "s3://bucket/prefix", above = "200KiB" }`.
#[derive(Clone, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ClaimCheckConfig {
    /// `s3://bucket/prefix` or `file:///absolute/dir`.
    pub store: String,
    /// Offload a message larger than this. Default: the sink's own limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub above: Option<ByteSize>,
    /// How long stored payloads are kept (whole days on S3: a lifecycle rule that `outbox
    /// migrate` sets and `outbox doctor` checks). Default 7 days.
    #[serde(default = "default_keep", with = "humantime_serde")]
    pub keep: Duration,
    /// S3 only: the AWS region. Default: the standard chain's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    /// S3 only: a local server (moto, MinIO); path-style addressing is used with it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint_url: Option<String>,
}

fn default_keep() -> Duration {
    Duration::from_secs(7 * 24 * 3600)
}

impl std::fmt::Debug for ClaimCheckConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClaimCheckConfig")
            .field("store", &self.store)
            .field("above", &self.above)
            .field("keep", &self.keep)
            .field("region", &self.region)
            .field(
                "endpoint_url",
                &self.endpoint_url.as_deref().map(outbox_core::redact::redact_url),
            )
            .finish()
    }
}

impl ClaimCheckConfig {
    /// Checks the values without the network; the error names the key (`store`, `above`,
    /// `keep`) and says what is wrong. `sink_limit` is the sink's own message limit: `above`
    /// is required when it is `None`, and may not exceed it.
    pub fn validate(&self, sink_limit: Option<usize>) -> Result<(), String> {
        let _ = sink_limit;
        Err("claim_check: not built yet".into())
    }
}

/// The size a message of `event` counts against a limit: the payload, plus every header's
/// name and value (the event's own and the four contract headers).
pub fn message_size(event: &Event) -> usize {
    let mut size = event.payload.len();
    outbox_core::message::for_each_header(event, |name, value| size += name.len() + value.len());
    size
}

/// The relay's side: offloads the payloads of large messages.
pub struct ClaimCheck {
    _private: (),
}

impl ClaimCheck {
    /// The store of `config`, ready (no request is made).
    pub async fn connect(
        config: &ClaimCheckConfig,
        sink_limit: Option<usize>,
    ) -> Result<Self, SinkError> {
        let _ = (config, sink_limit);
        Err(SinkError::rejected("claim_check: not built yet"))
    }

    /// The threshold in bytes.
    pub fn above(&self) -> usize {
        0
    }

    /// `event` unchanged when its message fits, else with its payload stored and replaced
    /// by the reference (see the module documentation).
    pub async fn apply(&self, event: Event) -> Result<Event, SinkError> {
        Ok(event)
    }

    /// `outbox doctor`: the store answers, a write is allowed, and (S3) the expiry rule
    /// exists. `Ok` says what was checked; `Err` what is wrong.
    pub async fn check(&self) -> Result<String, SinkError> {
        Err(SinkError::rejected("claim_check: not built yet"))
    }

    /// `outbox migrate`: sets the expiry rule (S3 lifecycle for the prefix). `Ok` says what
    /// was done.
    pub async fn ensure_expiry(&self) -> Result<String, SinkError> {
        Err(SinkError::rejected("claim_check: not built yet"))
    }
}

/// The consumer's side: fetches a claim-checked payload and checks its size and hash.
pub struct ClaimCheckFetcher {
    _private: (),
}

impl ClaimCheckFetcher {
    /// A fetcher of `file://` URLs, and of `s3://` URLs through the standard AWS chain
    /// (`region`, `endpoint_url` as in the config).
    pub async fn new(region: Option<&str>, endpoint_url: Option<&str>) -> Self {
        let _ = (region, endpoint_url);
        Self { _private: () }
    }

    /// `Ok(None)` when `headers` has no `claim_check`; else the stored bytes, checked
    /// against `claim_check_size` and `claim_check_sha256`.
    pub async fn fetch(&self, headers: &[(String, String)]) -> Result<Option<Bytes>, DecodeError> {
        let _ = headers;
        Ok(None)
    }
}
