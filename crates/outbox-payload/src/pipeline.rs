//! [`PayloadOptions`] (the config keys), [`Encoder`] (the relay's side: encrypt, then
//! offload) and [`Decoder`] (the consumer's side: fetch, then decrypt).

use bytes::Bytes;
use outbox_core::{Event, SinkError};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::claim_check::{ClaimCheck, ClaimCheckConfig, ClaimCheckFetcher};
use crate::encryption::{EncryptionConfig, Encryptor, KeyRing};

/// The payload keys of a `[sink]`, a `[sinks.NAME]` or `[payload]` (for every sink): both
/// off by default. A sink's own key replaces the global one, key by key.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct PayloadOptions {
    /// Large payloads to a store, a reference on the broker.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub claim_check: Option<ClaimCheckConfig>,
    /// Payloads (or some JSON fields) encrypted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub encryption: Option<EncryptionConfig>,
}

impl PayloadOptions {
    /// True when neither is set.
    pub fn is_empty(&self) -> bool {
        self.claim_check.is_none() && self.encryption.is_none()
    }

    /// These options, each unset one taken from `global`.
    pub fn or(&self, global: &PayloadOptions) -> PayloadOptions {
        PayloadOptions {
            claim_check: self
                .claim_check
                .clone()
                .or_else(|| global.claim_check.clone()),
            encryption: self
                .encryption
                .clone()
                .or_else(|| global.encryption.clone()),
        }
    }

    /// Checks the values without the network; the error names the key (`claim_check.above:
    /// …`). `sink_limit` is the sink's message limit, if it has one.
    pub fn validate(&self, sink_limit: Option<usize>) -> Result<(), String> {
        if let Some(claim_check) = &self.claim_check {
            claim_check
                .validate(sink_limit)
                .map_err(|e| format!("claim_check.{e}"))?;
        }
        if let Some(encryption) = &self.encryption {
            encryption
                .validate()
                .map_err(|e| format!("encryption.{e}"))?;
        }
        Ok(())
    }
}

/// The relay's side: what happens to each event before its sink publishes it.
pub struct Encoder {
    encryptor: Option<Encryptor>,
    claim_check: Option<ClaimCheck>,
}

impl Encoder {
    /// `None` when `options` is empty; else ready to encode (no request is made).
    pub async fn connect(
        options: &PayloadOptions,
        sink_limit: Option<usize>,
    ) -> Result<Option<Self>, SinkError> {
        if options.is_empty() {
            return Ok(None);
        }
        let encryptor = match &options.encryption {
            Some(config) => Some(Encryptor::connect(config).await?),
            None => None,
        };
        let claim_check = match &options.claim_check {
            Some(config) => Some(ClaimCheck::connect(config, sink_limit).await?),
            None => None,
        };
        Ok(Some(Self {
            encryptor,
            claim_check,
        }))
    }

    /// `event` as its sink must publish it: encrypted, then offloaded if too large. The
    /// relay's canary probes pass unchanged (their payload is the relay's own bookkeeping).
    /// A row header that reuses one of this crate's names is refused.
    pub async fn encode(&self, event: &Event) -> Result<Event, SinkError> {
        if event.aggregate_type == outbox_core::canary::AGGREGATE_TYPE {
            return Ok(event.clone());
        }
        if let Some((name, _)) = event
            .headers
            .iter()
            .find(|(name, _)| crate::header::ALL.contains(&name.as_str()))
        {
            return Err(SinkError::rejected(format!(
                "the event has a header `{name}`, a name the relay's payload options write \
                 themselves; rename it in the producer"
            )));
        }
        let mut event = event.clone();
        if let Some(encryptor) = &self.encryptor {
            event = encryptor.apply(event).await?;
        }
        if let Some(claim_check) = &self.claim_check {
            event = claim_check.apply(event).await?;
        }
        Ok(event)
    }

    /// `outbox doctor`: one line per part that is on, `Ok` or `Err` each.
    pub async fn check(&self) -> Vec<(&'static str, Result<String, SinkError>)> {
        let mut out = Vec::new();
        if let Some(encryptor) = &self.encryptor {
            out.push(("encryption", encryptor.check().await));
        }
        if let Some(claim_check) = &self.claim_check {
            out.push(("claim_check", claim_check.check().await));
        }
        out
    }

    /// `outbox migrate`: the claim-check store's expiry rule, when claim-check is on.
    pub async fn ensure_expiry(&self) -> Option<Result<String, SinkError>> {
        match &self.claim_check {
            Some(claim_check) => Some(claim_check.ensure_expiry().await),
            None => None,
        }
    }
}

/// Why a delivered payload cannot be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The store or KMS cannot be reached, or refused the request: try again later.
    #[error("{0}")]
    Unavailable(String),
    /// The message is encrypted with a key this consumer was not given.
    #[error("{0}")]
    NoKey(String),
    /// The message cannot be decoded, ever: a stored object of the wrong size or hash, a
    /// ciphertext that fails authentication, a malformed header.
    #[error("{0}")]
    Invalid(String),
}

impl DecodeError {
    /// True when trying again later may succeed.
    pub fn is_transient(&self) -> bool {
        matches!(self, Self::Unavailable(_))
    }
}

/// The consumer's side: turns a delivered payload back into the producer's.
#[derive(Default)]
pub struct Decoder {
    fetcher: Option<ClaimCheckFetcher>,
    keys: Option<KeyRing>,
}

impl Decoder {
    /// Decodes nothing yet: add a fetcher and keys.
    pub fn new() -> Self {
        Self::default()
    }

    /// Fetches claim-checked payloads with `fetcher`.
    pub fn with_claim_check(mut self, fetcher: ClaimCheckFetcher) -> Self {
        self.fetcher = Some(fetcher);
        self
    }

    /// Decrypts with `keys`.
    pub fn with_keys(mut self, keys: KeyRing) -> Self {
        self.keys = Some(keys);
        self
    }

    /// The producer's payload of a message with event id `id`: fetched if claim-checked,
    /// then decrypted if encrypted; `payload` itself (a cheap clone) when neither.
    pub async fn decode(
        &self,
        id: Uuid,
        payload: &Bytes,
        headers: &[(String, String)],
    ) -> Result<Bytes, DecodeError> {
        let has = |name: &str| headers.iter().any(|(n, _)| n == name);
        let mut payload = payload.clone();
        if has(crate::header::CLAIM_CHECK) {
            let Some(fetcher) = &self.fetcher else {
                return Err(DecodeError::NoKey(
                    "the payload is claim-checked and this decoder has no store to fetch it from"
                        .into(),
                ));
            };
            if let Some(stored) = fetcher.fetch(headers).await? {
                payload = stored;
            }
        }
        if has(crate::header::ENCRYPTION) {
            let Some(keys) = &self.keys else {
                return Err(DecodeError::NoKey(
                    "the payload is encrypted and this decoder was given no key".into(),
                ));
            };
            if let Some(plain) = keys.decrypt(id, &payload, headers).await? {
                payload = plain;
            }
        }
        Ok(payload)
    }
}
