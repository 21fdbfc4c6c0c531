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
use sha2::{Digest as _, Sha256};

use crate::header::{CLAIM_CHECK, CLAIM_CHECK_SHA256, CLAIM_CHECK_SIZE};
use crate::{ByteSize, DecodeError};

mod file;
mod location;
#[cfg(feature = "aws")]
mod s3;

use location::Location;

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

/// Seconds in a day: S3 lifecycle rules count whole days.
const DAY: u64 = 24 * 3600;

/// `keep` in whole days, rounded up.
fn keep_days(keep: Duration) -> u64 {
    (keep.as_secs() + u64::from(keep.subsec_nanos() > 0)).div_ceil(DAY)
}

crate::aws::debug_masking_endpoint!(ClaimCheckConfig {
    store,
    above,
    keep,
    region
});

impl ClaimCheckConfig {
    /// Checks the values without the network; the error names the key (`store`, `above`,
    /// `keep`) and says what is wrong. `sink_limit` is the sink's own message limit: `above`
    /// is required when it is `None`, and may not exceed it.
    pub fn validate(&self, sink_limit: Option<usize>) -> Result<(), String> {
        let location = Location::parse(&self.store)?;
        #[cfg(not(feature = "aws"))]
        if location.is_s3() {
            return Err(format!(
                "store: `{}` is not available: this relay was built without the `aws` feature \
                 (the S3 client); write file:///absolute/dir, or build with it",
                outbox_core::redact::redact_url(&self.store)
            ));
        }
        match (self.above, sink_limit) {
            (None, None) => {
                return Err(
                    "above: is required for this sink, which has no message limit of \
                            its own"
                        .into(),
                );
            }
            (Some(above), _) if above.0 == 0 => {
                return Err("above: must be greater than 0".into());
            }
            (Some(above), Some(limit)) if above.bytes() > limit => {
                return Err(format!(
                    "above: {above} is over the sink's own message limit of {limit} bytes: the \
                     sink would refuse such messages anyway; leave above out to use the limit"
                ));
            }
            (None, Some(0)) => {
                return Err("above: is required: the sink's message limit is 0".into());
            }
            _ => {}
        }
        let keep = humantime_serde::re::humantime::format_duration(self.keep);
        if self.keep.is_zero() {
            return Err("keep: must be greater than 0".into());
        }
        if location.is_s3() {
            if self.keep < Duration::from_secs(DAY) {
                return Err(format!(
                    "keep: {keep} is under a day; S3 expires objects in whole days (keep is \
                     rounded up), so write at least 1d"
                ));
            }
            if i32::try_from(keep_days(self.keep)).is_err() {
                return Err(format!("keep: {keep} is too long"));
            }
        } else {
            crate::aws::refuse_unused(
                self.region.as_deref(),
                self.endpoint_url.as_deref(),
                "only an s3:// store uses it",
            )?;
        }
        crate::aws::validate(self.region.as_deref(), self.endpoint_url.as_deref(), "AWS")
    }
}

/// The size a message of `event` counts against a limit: the payload, plus every header's
/// name and value (the event's own and the four contract headers).
pub fn message_size(event: &Event) -> usize {
    let mut size = event.payload.len();
    outbox_core::message::for_each_header(event, |name, value| size += name.len() + value.len());
    size
}

/// The message body of a claim-checked event: the reference, as compact JSON in this order.
#[derive(Serialize)]
struct Reference<'a> {
    claim_check: &'a str,
    claim_check_sha256: &'a str,
    claim_check_size: usize,
}

/// `{"claim_check":"<url>","claim_check_sha256":"<hex>","claim_check_size":<n>}`.
fn reference_body(url: &str, sha256: &str, size: usize) -> Bytes {
    let reference = Reference {
        claim_check: url,
        claim_check_sha256: sha256,
        claim_check_size: size,
    };
    // A struct of strings and a number always serializes.
    Bytes::from(serde_json::to_vec(&reference).unwrap_or_default())
}

/// Room the default `above` leaves under a sink's limit for the headers and the sink's own
/// framing (SQS and SNS attribute types, CloudEvents attributes).
const HEADROOM: usize = 8 * 1024;

/// `above` when the config leaves it out: three quarters of what the sink's limit leaves after
/// 8 KiB, because a sink may send a binary payload as base64 (SQS, SNS, structured
/// CloudEvents), which is 4/3 of its size. 186 KiB for SQS' 256 KiB, 762 KiB for NATS' 1 MiB.
pub fn default_above(sink_limit: usize) -> usize {
    sink_limit.saturating_sub(HEADROOM) / 4 * 3
}

/// Where the payloads go.
enum Store {
    File(file::FileStore),
    #[cfg(feature = "aws")]
    S3(s3::S3Store),
}

/// The relay's side: offloads the payloads of large messages.
pub struct ClaimCheck {
    location: Location,
    above: usize,
    store: Store,
}

impl ClaimCheck {
    /// The store of `config`, ready (no request is made).
    pub async fn connect(
        config: &ClaimCheckConfig,
        sink_limit: Option<usize>,
    ) -> Result<Self, SinkError> {
        let refuse = |e: String| SinkError::rejected(format!("claim_check.{e}"));
        config.validate(sink_limit).map_err(refuse)?;
        let location = Location::parse(&config.store).map_err(refuse)?;
        let above = config
            .above
            .map(ByteSize::bytes)
            .or(sink_limit.map(default_above))
            .ok_or_else(|| refuse("above: is required".into()))?;
        let store = match &location {
            Location::File { dir } => Store::File(file::FileStore::new(dir)),
            #[cfg(feature = "aws")]
            Location::S3 { bucket, prefix } => Store::S3(
                s3::S3Store::connect(
                    bucket,
                    prefix,
                    i32::try_from(keep_days(config.keep)).unwrap_or(i32::MAX),
                    config.region.as_deref(),
                    config.endpoint_url.as_deref(),
                )
                .await,
            ),
            #[cfg(not(feature = "aws"))]
            Location::S3 { .. } => {
                return Err(refuse(
                    "store: s3:// needs the relay built with the `aws` feature".into(),
                ));
            }
        };
        Ok(Self {
            location,
            above,
            store,
        })
    }

    /// The threshold in bytes.
    pub fn above(&self) -> usize {
        self.above
    }

    /// `event` unchanged when its message fits, else with its payload stored and replaced
    /// by the reference (see the module documentation).
    pub async fn apply(&self, mut event: Event) -> Result<Event, SinkError> {
        if message_size(&event) <= self.above {
            return Ok(event);
        }
        let key = self.location.key(&event.aggregate_type, event.id);
        let url = self.location.url(&key);
        let stored = std::mem::take(&mut event.payload);
        let sha256 = hex::encode(Sha256::digest(&stored));
        event.payload = reference_body(&url, &sha256, stored.len());
        event.headers.extend([
            (CLAIM_CHECK.to_owned(), url),
            (CLAIM_CHECK_SHA256.to_owned(), sha256),
            (CLAIM_CHECK_SIZE.to_owned(), stored.len().to_string()),
        ]);
        // Checked before the write: an event that cannot be sent leaves no object behind.
        let size = message_size(&event);
        if size > self.above {
            let headers = size - event.payload.len();
            let above = self.above;
            let why = if headers > above {
                format!("its headers alone are {headers} bytes")
            } else {
                format!(
                    "its headers ({headers} bytes) and the reference body ({} bytes) are {size} \
                     bytes",
                    event.payload.len()
                )
            };
            return Err(SinkError::rejected(format!(
                "the message still does not fit after claim-check: {why}, over the limit of \
                 {above} (claim_check.above)"
            )));
        }
        match &self.store {
            Store::File(store) => store.put(&key, &stored).await?,
            #[cfg(feature = "aws")]
            Store::S3(store) => {
                let content_type = event
                    .headers
                    .iter()
                    .find(|(name, _)| name.eq_ignore_ascii_case("content-type"))
                    .map_or("application/octet-stream", |(_, value)| value.as_str());
                let id = event.id.hyphenated().to_string();
                // Boxed: the S3 request's future is large, and it would otherwise sit inline
                // in every event's encode future, offloaded or not.
                Box::pin(store.put(s3::Put {
                    key: &key,
                    body: &stored,
                    event_id: &id,
                    aggregate_type: &event.aggregate_type,
                    event_type: &event.event_type,
                    content_type,
                }))
                .await?;
            }
        }
        Ok(event)
    }

    /// `outbox doctor`: the store answers, a write is allowed, and (S3) the expiry rule
    /// exists. `Ok` says what was checked; `Err` what is wrong.
    pub async fn check(&self) -> Result<String, SinkError> {
        match &self.store {
            Store::File(store) => store.check().await,
            #[cfg(feature = "aws")]
            Store::S3(store) => store.check().await,
        }
    }

    /// `outbox migrate`: sets the expiry rule (S3 lifecycle for the prefix). `Ok` says what
    /// was done.
    pub async fn ensure_expiry(&self) -> Result<String, SinkError> {
        match &self.store {
            Store::File(store) => Ok(store.ensure_expiry()),
            #[cfg(feature = "aws")]
            Store::S3(store) => store.ensure_expiry().await,
        }
    }
}

/// The consumer's side: fetches a claim-checked payload and checks its size and hash.
pub struct ClaimCheckFetcher {
    /// The stores whose objects it fetches (`s3://bucket/prefix`, `file:///dir`).
    allowed: Vec<String>,
    #[cfg(feature = "aws")]
    region: Option<String>,
    #[cfg(feature = "aws")]
    endpoint_url: Option<String>,
    /// The S3 client and where it sends, made on the first `s3://` fetch.
    #[cfg(feature = "aws")]
    s3: tokio::sync::OnceCell<(aws_sdk_s3::Client, String)>,
}

impl ClaimCheckFetcher {
    /// A fetcher of `file://` URLs, and of `s3://` URLs through the standard AWS chain
    /// (`region`, `endpoint_url` as in the config).
    pub async fn new(region: Option<&str>, endpoint_url: Option<&str>) -> Self {
        #[cfg(not(feature = "aws"))]
        let _ = (region, endpoint_url);
        Self {
            allowed: Vec::new(),
            #[cfg(feature = "aws")]
            region: region.map(str::to_owned),
            #[cfg(feature = "aws")]
            endpoint_url: endpoint_url.map(str::to_owned),
            #[cfg(feature = "aws")]
            s3: tokio::sync::OnceCell::new(),
        }
    }

    /// Fetches objects of `store` (the relay's `claim_check.store`, e.g.
    /// `s3://bucket/prefix`). A fetcher follows only the stores it was given: a message
    /// cannot make the consumer read another bucket or a local file of its choosing.
    pub fn allow(mut self, store: &str) -> Self {
        self.allowed.push(store.trim_end_matches('/').to_owned());
        self
    }

    /// `Ok(None)` when `headers` has no `claim_check`; else the stored bytes, checked
    /// against `claim_check_size` and `claim_check_sha256`. A URL outside the allowed
    /// stores is [`DecodeError::Invalid`].
    pub async fn fetch(&self, headers: &[(String, String)]) -> Result<Option<Bytes>, DecodeError> {
        let header = |name: &str| {
            headers
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.as_str())
        };
        let Some(url) = header(CLAIM_CHECK) else {
            return Ok(None);
        };
        if !self.allowed.iter().any(|store| {
            url.strip_prefix(store.as_str())
                .is_some_and(|rest| rest.starts_with('/'))
        }) {
            return Err(DecodeError::Invalid(format!(
                "claim_check `{}` is not in a store this consumer allows ({}); add the relay's \
                 claim_check.store with ClaimCheckFetcher::allow",
                outbox_core::redact::redact_url(url),
                if self.allowed.is_empty() {
                    "none given".to_owned()
                } else {
                    self.allowed.join(", ")
                }
            )));
        }
        let size = header(CLAIM_CHECK_SIZE)
            .ok_or_else(|| {
                DecodeError::Invalid(format!(
                    "the message has {CLAIM_CHECK} but no {CLAIM_CHECK_SIZE} header"
                ))
            })?
            .parse::<usize>()
            .map_err(|_| {
                DecodeError::Invalid(format!(
                    "the {CLAIM_CHECK_SIZE} header is not a number of bytes"
                ))
            })?;
        let sha256 = header(CLAIM_CHECK_SHA256).ok_or_else(|| {
            DecodeError::Invalid(format!(
                "the message has {CLAIM_CHECK} but no {CLAIM_CHECK_SHA256} header"
            ))
        })?;
        if sha256.len() != 64 || !sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(DecodeError::Invalid(format!(
                "the {CLAIM_CHECK_SHA256} header is not 64 hex digits"
            )));
        }
        let bytes = if let Some(path) = url.strip_prefix("file://") {
            file::read(url, path).await?
        } else if url.starts_with("s3://") {
            self.read_s3(url).await?
        } else {
            return Err(DecodeError::Invalid(format!(
                "claim_check `{}` is neither an s3:// nor a file:// URL",
                outbox_core::redact::redact_url(url)
            )));
        };
        if bytes.len() != size {
            return Err(DecodeError::Invalid(format!(
                "the claim-checked payload at {url} is {} bytes, but {CLAIM_CHECK_SIZE} says \
                 {size}",
                bytes.len()
            )));
        }
        let actual = hex::encode(Sha256::digest(&bytes));
        if !actual.eq_ignore_ascii_case(sha256) {
            return Err(DecodeError::Invalid(format!(
                "the claim-checked payload at {url} has sha256 {actual}, but \
                 {CLAIM_CHECK_SHA256} says {sha256}"
            )));
        }
        Ok(Some(bytes))
    }

    #[cfg(feature = "aws")]
    async fn read_s3(&self, url: &str) -> Result<Bytes, DecodeError> {
        let (client, endpoint) = self
            .s3
            .get_or_init(|| s3::client(self.region.as_deref(), self.endpoint_url.as_deref()))
            .await;
        s3::read(client, endpoint, url).await
    }

    #[cfg(not(feature = "aws"))]
    async fn read_s3(&self, url: &str) -> Result<Bytes, DecodeError> {
        Err(DecodeError::Invalid(format!(
            "the payload is claim-checked in S3 ({url}), and this consumer was built without \
             the `aws` feature (the S3 client)"
        )))
    }
}

#[cfg(test)]
mod tests;
