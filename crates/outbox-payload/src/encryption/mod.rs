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

use std::collections::VecDeque;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine as _;
use bytes::Bytes;
use outbox_core::{Event, SinkError};
use ring::aead::NONCE_LEN;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use uuid::Uuid;

use crate::DecodeError;
use crate::header;

mod data_key;
mod fields;
mod file_key;
#[cfg(feature = "aws")]
mod kms;

use data_key::{AesKey, Clock, DataKey, DataKeyCache, RandomFailed};
use fields::Members;
use file_key::FileKey;

/// `encryption` of the whole payload.
const WHOLE: &str = "aes-256-gcm";
/// `encryption` of the fields mode.
const FIELDS: &str = "aes-256-gcm-fields";
/// The prefix of `key` for a KMS key.
const KMS_PREFIX: &str = "aws-kms:";
/// What a consumer says when a ciphertext fails authentication.
const TAMPERED: &str =
    "the payload fails authentication: it was altered, or belongs to another event";

const BASE64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

/// `encryption = { key = "aws-kms:alias/outbox" }` or `{ key = "file:/etc/outbox/key" }`.
#[derive(Clone, Deserialize, Serialize, PartialEq, Eq)]
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

// The key (a reference, never key material), the rest as is; credentials in `endpoint_url`
// masked.
crate::aws::debug_masking_endpoint!(EncryptionConfig {
    key,
    rotate,
    fields,
    region
});

/// Where `key` points.
enum KeyRef<'a> {
    File(&'a Path),
    #[cfg_attr(not(feature = "aws"), allow(dead_code))]
    Kms(&'a str),
}

impl EncryptionConfig {
    /// Checks the values without the network (the key file is read); the error names the key.
    pub fn validate(&self) -> Result<(), String> {
        match self.key_ref()? {
            KeyRef::File(path) => {
                FileKey::read(path).map_err(|e| format!("key: {e}"))?;
                crate::aws::refuse_unused(
                    self.region.as_deref(),
                    self.endpoint_url.as_deref(),
                    "is only used with `aws-kms:` keys, and the key is a file",
                )?;
            }
            KeyRef::Kms(_) => self.validate_aws()?,
        }
        if self.rotate < Duration::from_secs(1) {
            return Err(format!(
                "rotate: must be at least 1s (is {:?})",
                self.rotate
            ));
        }
        for (i, field) in self.fields.iter().enumerate() {
            if field.is_empty() {
                return Err("fields: a field name is empty".into());
            }
            if field.contains(',') {
                return Err(format!(
                    "fields: `{field}` has a comma, which separates the names in the \
                     encryption_fields header"
                ));
            }
            if self.fields[..i].contains(field) {
                return Err(format!("fields: `{field}` is listed twice"));
            }
        }
        Ok(())
    }

    fn key_ref(&self) -> Result<KeyRef<'_>, String> {
        if let Some(path) = self.key.strip_prefix(file_key::PREFIX) {
            if path.is_empty() {
                return Err(
                    "key: `file:` needs the path of the key file (`file:/etc/outbox/key`)".into(),
                );
            }
            return Ok(KeyRef::File(Path::new(path)));
        }
        if let Some(id) = self.key.strip_prefix(KMS_PREFIX) {
            if !cfg!(feature = "aws") {
                return Err(format!(
                    "key: `{}` is a KMS key, and this relay was built without AWS support (the \
                     `aws` feature); use a `file:` key or a build with it",
                    self.key
                ));
            }
            if id.trim().is_empty() || id.trim() != id {
                return Err(format!(
                    "key: `{}` needs a KMS key id, key ARN or `alias/NAME` after `aws-kms:`",
                    self.key
                ));
            }
            return Ok(KeyRef::Kms(id));
        }
        Err(format!(
            "key: `{}` must be `aws-kms:<key id, ARN or alias/NAME>` or `file:/path/to/key`",
            self.key
        ))
    }

    fn validate_aws(&self) -> Result<(), String> {
        crate::aws::validate(self.region.as_deref(), self.endpoint_url.as_deref(), "KMS")
    }
}

/// Where the relay's data keys come from.
enum Source {
    File(Box<FileKey>),
    #[cfg(feature = "aws")]
    Kms {
        kms: kms::Kms,
        key_id: String,
    },
}

impl Source {
    async fn new_data_key(&self) -> Result<DataKey, SinkError> {
        match self {
            Source::File(file) => file.new_data_key().map_err(random_error),
            // Boxed: the KMS request's future is large, and every event's encode future
            // would carry it inline although a data key is made once per `rotate`. 500
            // of those per batch cost more (allocating and faulting in their pages) than the
            // encryption itself.
            #[cfg(feature = "aws")]
            Source::Kms { kms, key_id } => Box::pin(kms.new_data_key(key_id)).await,
        }
    }
}

fn random_error(_: RandomFailed) -> SinkError {
    SinkError::unavailable("the system's secure random source failed")
}

/// The relay's side: encrypts payloads.
pub struct Encryptor {
    config: EncryptionConfig,
    source: Source,
    cache: DataKeyCache,
}

/// The configuration (key references only) and where data keys come from; never a key.
impl std::fmt::Debug for Encryptor {
    #[allow(clippy::infallible_destructuring_match)] // one variant without `aws`
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let source: &dyn std::fmt::Debug = match &self.source {
            Source::File(file) => file,
            #[cfg(feature = "aws")]
            Source::Kms { kms, .. } => kms,
        };
        f.debug_struct("Encryptor")
            .field("config", &self.config)
            .field("source", source)
            .finish_non_exhaustive()
    }
}

impl Encryptor {
    /// Ready to encrypt (the key file is read; no KMS request yet).
    pub async fn connect(config: &EncryptionConfig) -> Result<Self, SinkError> {
        Self::with_clock(config, Arc::new(Instant::now)).await
    }

    async fn with_clock(config: &EncryptionConfig, clock: Clock) -> Result<Self, SinkError> {
        let invalid = |e: String| SinkError::rejected(format!("encryption.{e}"));
        config.validate().map_err(invalid)?;
        let source = match config.key_ref().map_err(invalid)? {
            KeyRef::File(path) => Source::File(Box::new(
                FileKey::read(path).map_err(|e| invalid(format!("key: {e}")))?,
            )),
            #[cfg(feature = "aws")]
            KeyRef::Kms(key_id) => Source::Kms {
                kms: kms::Kms::new(config.region.as_deref(), config.endpoint_url.as_deref()).await,
                key_id: key_id.to_owned(),
            },
            #[cfg(not(feature = "aws"))]
            KeyRef::Kms(_) => return Err(invalid("key: KMS needs the `aws` feature".into())),
        };
        Ok(Self {
            config: config.clone(),
            source,
            cache: DataKeyCache::new(config.rotate, clock),
        })
    }

    async fn data_key(&self) -> Result<Arc<DataKey>, SinkError> {
        self.cache.get(|| self.source.new_data_key()).await
    }

    /// `event` with its payload (or fields) encrypted and the headers added.
    pub async fn apply(&self, mut event: Event) -> Result<Event, SinkError> {
        if self.config.fields.is_empty() {
            let data_key = self.data_key().await?;
            let nonce = data_key::random::<NONCE_LEN>().map_err(random_error)?;
            let body = data_key
                .key
                .seal(nonce, event.id.to_string().as_bytes(), &event.payload);
            event.payload = Bytes::from(body);
            push_key_headers(&mut event, WHOLE, &data_key);
            event
                .headers
                .push((header::ENCRYPTION_NONCE.into(), BASE64.encode(nonce)));
            return Ok(event);
        }
        let mut members = Members::parse(&event.payload).map_err(|e| {
            SinkError::rejected(format!(
                "encryption.fields is set and the payload is not a JSON object: {e}"
            ))
        })?;
        let present: Vec<&String> = self
            .config
            .fields
            .iter()
            .filter(|name| members.0.iter().any(|(n, _)| n == *name))
            .collect();
        if present.is_empty() {
            // Nothing to encrypt: the message goes as it is, without encryption headers.
            return Ok(event);
        }
        let data_key = self.data_key().await?;
        for name in &present {
            let aad = format!("{}/{name}", event.id);
            for (_, value) in members.0.iter_mut().filter(|(n, _)| n == *name) {
                let sealed = data_key
                    .key
                    .seal_with_nonce(aad.as_bytes(), value.get().as_bytes())
                    .map_err(random_error)?;
                *value = fields::enc_value(&BASE64.encode(sealed));
            }
        }
        event.payload = Bytes::from(members.to_bytes());
        push_key_headers(&mut event, FIELDS, &data_key);
        let names: Vec<&str> = present.iter().map(|n| n.as_str()).collect();
        event
            .headers
            .push((header::ENCRYPTION_FIELDS.into(), names.join(",")));
        Ok(event)
    }

    /// `outbox doctor`: a data key can be made (KMS answers and allows it). `Ok` says what
    /// was checked.
    #[allow(clippy::infallible_destructuring_match)] // one variant without `aws`
    pub async fn check(&self) -> Result<String, SinkError> {
        match &self.source {
            Source::File(file) => {
                let now = FileKey::read(file.path())
                    .map_err(|e| SinkError::unavailable(format!("encryption.key: {e}")))?;
                if now.id() != file.id() {
                    return Err(SinkError::unavailable(format!(
                        "the key file {} now holds another key ({}) than the relay read at start \
                         ({}): restart the relay to use it",
                        file.path().display(),
                        now.id(),
                        file.id()
                    )));
                }
                let data_key = self.source.new_data_key().await?;
                Ok(format!(
                    "data key from {} (key file {})",
                    data_key.key_id,
                    file.path().display()
                ))
            }
            #[cfg(feature = "aws")]
            Source::Kms { .. } => {
                let data_key = self.source.new_data_key().await?;
                Ok(format!("data key from {}", data_key.key_id))
            }
        }
    }
}

fn push_key_headers(event: &mut Event, mode: &str, data_key: &DataKey) {
    event.headers.extend([
        (header::ENCRYPTION.to_owned(), mode.to_owned()),
        (
            header::ENCRYPTION_KEY_ID.to_owned(),
            data_key.key_id.clone(),
        ),
        (
            header::ENCRYPTION_DATA_KEY.to_owned(),
            data_key.wrapped.clone(),
        ),
    ]);
}

/// How many unwrapped data keys a [`KeyRing`] keeps (by their wrapped form).
const UNWRAPPED_KEYS: usize = 64;

/// The consumer's side: the keys it may use to unwrap data keys.
pub struct KeyRing {
    files: Vec<FileKey>,
    #[cfg(feature = "aws")]
    kms: Option<kms::Kms>,
    /// Unwrapped data keys by `encryption_data_key`, the newest last.
    unwrapped: std::sync::Mutex<VecDeque<(String, Arc<AesKey>)>>,
}

/// The key ids it holds; never a key.
impl std::fmt::Debug for KeyRing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut out = f.debug_struct("KeyRing");
        out.field("files", &self.files);
        #[cfg(feature = "aws")]
        out.field("kms", &self.kms);
        out.finish_non_exhaustive()
    }
}

impl KeyRing {
    /// No key yet: an encrypted message is a [`DecodeError::NoKey`].
    pub fn new() -> Self {
        Self {
            files: Vec::new(),
            #[cfg(feature = "aws")]
            kms: None,
            unwrapped: std::sync::Mutex::new(VecDeque::new()),
        }
    }

    /// Unwraps `aws-kms` data keys with KMS `Decrypt`, through the standard AWS chain.
    /// Without the `aws` feature this adds nothing (such messages are `NoKey`).
    pub async fn with_kms(self, region: Option<&str>, endpoint_url: Option<&str>) -> Self {
        #[cfg(feature = "aws")]
        {
            let mut this = self;
            this.kms = Some(kms::Kms::new(region, endpoint_url).await);
            this
        }
        #[cfg(not(feature = "aws"))]
        {
            let _ = (region, endpoint_url);
            self
        }
    }

    /// Unwraps `file:` data keys with this key file (call it once per key file).
    pub fn with_key_file(mut self, path: &std::path::Path) -> Result<Self, DecodeError> {
        self.files
            .push(FileKey::read(path).map_err(DecodeError::Invalid)?);
        Ok(self)
    }

    /// `Ok(None)` when `headers` has no `encryption`; else the plaintext payload.
    pub async fn decrypt(
        &self,
        id: Uuid,
        payload: &Bytes,
        headers: &[(String, String)],
    ) -> Result<Option<Bytes>, DecodeError> {
        let Some(mode) = find(headers, header::ENCRYPTION) else {
            return Ok(None);
        };
        if mode != WHOLE && mode != FIELDS {
            return Err(DecodeError::Invalid(format!(
                "the message is encrypted as `{mode}`, which this consumer does not know (it \
                 knows `{WHOLE}` and `{FIELDS}`)"
            )));
        }
        let key_id = required(headers, header::ENCRYPTION_KEY_ID)?;
        let wrapped = required(headers, header::ENCRYPTION_DATA_KEY)?;
        let key = self.data_key(key_id, wrapped).await?;
        if mode == WHOLE {
            let nonce = required(headers, header::ENCRYPTION_NONCE)?;
            let nonce: [u8; NONCE_LEN] = BASE64
                .decode(nonce)
                .ok()
                .and_then(|n| n.try_into().ok())
                .ok_or_else(|| {
                    DecodeError::Invalid(format!(
                        "the {} header is not the base64 of {NONCE_LEN} bytes",
                        header::ENCRYPTION_NONCE
                    ))
                })?;
            let plain = key
                .open(nonce, id.to_string().as_bytes(), payload)
                .ok_or_else(|| DecodeError::Invalid(TAMPERED.into()))?;
            return Ok(Some(Bytes::from(plain)));
        }
        let names = required(headers, header::ENCRYPTION_FIELDS)?;
        let mut members = Members::parse(payload).map_err(|e| {
            DecodeError::Invalid(format!(
                "the message is encrypted by fields and its payload is not a JSON object: {e}"
            ))
        })?;
        for name in names.split(',') {
            let aad = format!("{id}/{name}");
            let mut found = false;
            for (_, value) in members.0.iter_mut().filter(|(n, _)| n == name) {
                found = true;
                let sealed = fields::enc_text(value)
                    .and_then(|text| BASE64.decode(text).ok())
                    .ok_or_else(|| {
                        DecodeError::Invalid(format!(
                            "the field `{name}` is listed in {} and its value is not \
                             {{\"enc\": \"<base64>\"}}",
                            header::ENCRYPTION_FIELDS
                        ))
                    })?;
                let plain = key
                    .open_with_nonce(aad.as_bytes(), &sealed)
                    .ok_or_else(|| {
                        DecodeError::Invalid(format!("the field `{name}`: {TAMPERED}"))
                    })?;
                *value = String::from_utf8(plain)
                    .ok()
                    .and_then(|text| RawValue::from_string(text).ok())
                    .ok_or_else(|| {
                        DecodeError::Invalid(format!(
                            "the field `{name}` decrypts to something that is not JSON"
                        ))
                    })?;
            }
            if !found {
                return Err(DecodeError::Invalid(format!(
                    "the field `{name}` is listed in {} and the payload has no such field",
                    header::ENCRYPTION_FIELDS
                )));
            }
        }
        Ok(Some(Bytes::from(members.to_bytes())))
    }

    /// The data key wrapped as `wrapped` (base64) under `key_id`: from the cache, else
    /// unwrapped by the key file of that id or by KMS.
    async fn data_key(&self, key_id: &str, wrapped: &str) -> Result<Arc<AesKey>, DecodeError> {
        if let Some(key) = self.cached(wrapped) {
            return Ok(key);
        }
        let blob = BASE64.decode(wrapped).map_err(|_| {
            DecodeError::Invalid(format!(
                "the {} header is not base64",
                header::ENCRYPTION_DATA_KEY
            ))
        })?;
        let key = if key_id.starts_with(file_key::PREFIX) {
            let file = self
                .files
                .iter()
                .find(|f| f.id() == key_id)
                .ok_or_else(|| {
                    DecodeError::NoKey(format!(
                        "the payload is encrypted with the key file {key_id} and this consumer \
                         was not given that key"
                    ))
                })?;
            file.unwrap(&blob).ok_or_else(|| {
                DecodeError::Invalid(format!(
                    "the data key in {} fails authentication under {key_id}: it was altered",
                    header::ENCRYPTION_DATA_KEY
                ))
            })?
        } else {
            self.kms_unwrap(key_id, blob).await?
        };
        let key = Arc::new(key);
        let mut cache = self.unwrapped.lock().unwrap_or_else(|e| e.into_inner());
        if cache.len() >= UNWRAPPED_KEYS {
            cache.pop_front();
        }
        cache.push_back((wrapped.to_owned(), Arc::clone(&key)));
        Ok(key)
    }

    fn cached(&self, wrapped: &str) -> Option<Arc<AesKey>> {
        let cache = self.unwrapped.lock().unwrap_or_else(|e| e.into_inner());
        cache
            .iter()
            .find(|(w, _)| w == wrapped)
            .map(|(_, key)| Arc::clone(key))
    }

    #[cfg(feature = "aws")]
    async fn kms_unwrap(&self, key_id: &str, blob: Vec<u8>) -> Result<AesKey, DecodeError> {
        match &self.kms {
            Some(kms) => kms.unwrap(blob, key_id).await,
            None => Err(no_kms(key_id)),
        }
    }

    #[cfg(not(feature = "aws"))]
    async fn kms_unwrap(&self, key_id: &str, _blob: Vec<u8>) -> Result<AesKey, DecodeError> {
        Err(no_kms(key_id))
    }
}

fn no_kms(key_id: &str) -> DecodeError {
    DecodeError::NoKey(format!(
        "the payload is encrypted with the KMS key {key_id} and this consumer has no KMS access \
         (KeyRing::with_kms, and the `aws` feature)"
    ))
}

fn find<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
}

fn required<'a>(headers: &'a [(String, String)], name: &str) -> Result<&'a str, DecodeError> {
    find(headers, name).ok_or_else(|| {
        DecodeError::Invalid(format!(
            "the message is encrypted and has no `{name}` header"
        ))
    })
}

impl Default for KeyRing {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests;
