//! What the relay can do to a payload on its way to the broker, and how a consumer undoes it
//! (docs/payloads.md, which gives the exact wire format for consumers in any language):
//!
//! - [`claim_check`]: a message that would exceed a size (`above`, by default the sink's limit)
//!   has its payload written to a store (`s3://bucket/prefix`, or `file:///dir` for development)
//!   under `<prefix>/<aggregate_type>/<event id>`; the message keeps every header, adds
//!   `claim_check`, `claim_check_sha256` and `claim_check_size`, and its body is a small JSON
//!   reference with the same three fields.
//! - [`encryption`]: the payload, or only some of its JSON fields, encrypted with AES-256-GCM
//!   under a data key from AWS KMS (`GenerateDataKey`) or wrapped by a local key file; the
//!   event id is the additional authenticated data.
//!
//! - [`schemas`] (feature `schemas`): JSON payloads checked against JSON Schema files, by the
//!   relay before it publishes and, opt-in, by the producer before it writes.
//!
//! Both are opt-in, per sink or for all sinks ([`PayloadOptions`]); with both, the payload is
//! encrypted first, then offloaded. [`Encoder`] is the relay's side, [`Decoder`] the
//! consumer's (the inbox uses it under its `payload` feature).

mod aws;
pub mod claim_check;
pub mod encryption;
pub mod header;
mod pipeline;
#[cfg(feature = "schemas")]
pub mod schemas;
mod size;

pub use pipeline::{DecodeError, Decoder, Encoder, PayloadOptions};
pub use size::ByteSize;
