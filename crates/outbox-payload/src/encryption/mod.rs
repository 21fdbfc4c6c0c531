//! Envelope encryption of payloads (docs/payloads.md, "Encryption").
//!
//! - The payload is encrypted with AES-256-GCM under a 256-bit data key, with a fresh random
//!   96-bit nonce per message and the event id (its 36-character hyphenated lower-case text)
//!   as the additional authenticated data: a ciphertext cannot be moved to another event.
//! - The data key comes from KMS `GenerateDataKey` (`key = "aws-kms:<key id, ARN or
//!   alias>"`), or is random and wrapped by a local 32-byte key (`key = "file:/path"`); it
//!   is cached and replaced every `rotate` (default 1 h).
//! - Headers: `encryption = "aes-256-gcm"`, `encryption_key_id`, `encryption_data_key` (the
//!   wrapped data key, base64) and `encryption_nonce` (base64). The body is the ciphertext
//!   followed by the 16-byte tag.
//! - With `fields = ["card", "email"]` (JSON object payloads), only those top-level values
//!   are encrypted, each as `{"enc": "<base64 of nonce ‖ ciphertext ‖ tag>"}` of its JSON
//!   text with AAD `<event id>/<field>`; `encryption = "aes-256-gcm-fields"`,
//!   `encryption_fields` lists the fields encrypted, and there is no `encryption_nonce`.
//! - Keys, data keys and plaintext are never logged nor in `Debug` output. KMS that cannot
//!   be reached is `Unavailable` (retried, never dead-lettered); a payload that is not a JSON
//!   object with `fields` set is `Rejected` with the reason.

use std::time::Duration;

use bytes::Bytes;
use outbox_core::{Event, SinkError};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::DecodeError;

/// `encryption = { key = "aws-kms:alias/outbox" }` or `{ key = "file:/etc/outbox/key" }`.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct EncryptionConfig {
    /// `aws-kms:<key id, ARN or alias/NAME>` or `file:/path/to/key` (32 bytes: raw, or 64 hex
    /// characters, or base64, with an optional trailing newline).
    pub key: String,
    /// How long one data key is used before a new one is made.
    #[serde(default = "default_rotate", with = "humantime_serde")]
    pub rotate: Duration,
    /// Only these top-level fields of a JSON object payload; empty: the whole payload.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fields: Vec<String>,
    /// KMS only: the AWS region. Default: the standard chain's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    /// KMS only: a local server (moto).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint_url: Option<String>,
}

fn default_rotate() -> Duration {
    Duration::from_secs(3600)
}

impl EncryptionConfig {
    /// Checks the values without the network (the key file is read); the error names the key.
    pub fn validate(&self) -> Result<(), String> {
        Err("encryption: not built yet".into())
    }
}

/// The relay's side: encrypts payloads.
pub struct Encryptor {
    _private: (),
}

impl Encryptor {
    /// Ready to encrypt (the key file is read; no KMS request yet).
    pub async fn connect(config: &EncryptionConfig) -> Result<Self, SinkError> {
        let _ = config;
        Err(SinkError::rejected("encryption: not built yet"))
    }

    /// `event` with its payload (or fields) encrypted and the headers added.
    pub async fn apply(&self, event: Event) -> Result<Event, SinkError> {
        Ok(event)
    }

    /// `outbox doctor`: a data key can be made (KMS answers and allows it). `Ok` says what
    /// was checked.
    pub async fn check(&self) -> Result<String, SinkError> {
        Err(SinkError::rejected("encryption: not built yet"))
    }
}

/// The consumer's side: the keys it may use to unwrap data keys.
pub struct KeyRing {
    _private: (),
}

impl KeyRing {
    /// No key yet: an encrypted message is a [`DecodeError::NoKey`].
    pub fn new() -> Self {
        Self { _private: () }
    }

    /// Unwraps `aws-kms` data keys with KMS `Decrypt`, through the standard AWS chain.
    pub async fn with_kms(self, region: Option<&str>, endpoint_url: Option<&str>) -> Self {
        let _ = (region, endpoint_url);
        self
    }

    /// Unwraps `file:` data keys with this key file.
    pub fn with_key_file(self, path: &std::path::Path) -> Result<Self, DecodeError> {
        let _ = path;
        Ok(self)
    }

    /// `Ok(None)` when `headers` has no `encryption`; else the plaintext payload.
    pub async fn decrypt(
        &self,
        id: Uuid,
        payload: &Bytes,
        headers: &[(String, String)],
    ) -> Result<Option<Bytes>, DecodeError> {
        let _ = (id, payload, headers);
        Ok(None)
    }
}

impl Default for KeyRing {
    fn default() -> Self {
        Self::new()
    }
}
