//! The message headers this crate adds (docs/payloads.md). Each is a header like the row's
//! own: on every broker it travels the way the sink carries headers (NATS and Kafka headers,
//! SQS and SNS message attributes, CloudEvents extensions without the underscore).

/// The object holding the payload: `s3://bucket/prefix/Order/<event id>` or `file:///dir/…`.
pub const CLAIM_CHECK: &str = "claim_check";
/// Lower-case hex SHA-256 of the stored bytes (the ciphertext when encryption is on too).
pub const CLAIM_CHECK_SHA256: &str = "claim_check_sha256";
/// Size of the stored bytes, in decimal.
pub const CLAIM_CHECK_SIZE: &str = "claim_check_size";
/// `aes-256-gcm` (the whole payload) or `aes-256-gcm-fields` (some JSON fields).
pub const ENCRYPTION: &str = "encryption";
/// The key that wraps the data key: the KMS key ARN, or `file:<sha256 of the key, 16 hex>`.
pub const ENCRYPTION_KEY_ID: &str = "encryption_key_id";
/// The wrapped data key, base64 (standard alphabet, padded).
pub const ENCRYPTION_DATA_KEY: &str = "encryption_data_key";
/// The 12-byte nonce of the whole-payload mode, base64.
pub const ENCRYPTION_NONCE: &str = "encryption_nonce";
/// The encrypted fields of the fields mode, comma-separated, in the order configured.
pub const ENCRYPTION_FIELDS: &str = "encryption_fields";

/// Every header this crate writes; a row header with one of these names is refused by the
/// encoder (it would be ambiguous for consumers).
pub const ALL: &[&str] = &[
    CLAIM_CHECK,
    CLAIM_CHECK_SHA256,
    CLAIM_CHECK_SIZE,
    ENCRYPTION,
    ENCRYPTION_KEY_ID,
    ENCRYPTION_DATA_KEY,
    ENCRYPTION_NONCE,
    ENCRYPTION_FIELDS,
];
