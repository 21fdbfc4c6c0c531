//! The producer's payload back from a claim-checked or encrypted message (feature `payload`;
//! docs/payloads.md): a handler wrapped with [`decoding`] receives the message as the
//! producer wrote it, whatever the relay's `claim_check` and `encryption` did to it.
//!
//! ```no_run
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::Arc;
//! use outbox_inbox::InboxMessage;
//! use outbox_inbox::payload::{Decoder, KeyRing, ClaimCheckFetcher, decoding};
//!
//! let decoder = Decoder::new()
//!     .with_claim_check(ClaimCheckFetcher::new(None, None).await.allow("s3://orders-big/outbox"))
//!     .with_keys(KeyRing::new().with_key_file("/etc/outbox/key".as_ref())?);
//! let handler = decoding(Arc::new(decoder), |message: InboxMessage| async move {
//!     // message.payload is the producer's plaintext here
//!     Ok::<(), std::io::Error>(())
//! });
//! # let _ = handler; Ok(()) }
//! ```

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

pub use outbox_payload::claim_check::ClaimCheckFetcher;
pub use outbox_payload::encryption::KeyRing;
pub use outbox_payload::{DecodeError, Decoder};

use crate::InboxMessage;
use crate::lane::MessageHandler;

impl InboxMessage {
    /// This message with the producer's payload: fetched from its claim-check store and
    /// decrypted as its headers say, and those headers (`claim_check*`, `encryption*`)
    /// removed. A message that is neither comes back as it was.
    pub async fn decode(mut self, decoder: &Decoder) -> Result<Self, DecodeError> {
        let payload = decoder
            .decode(self.id, &self.payload, &self.headers)
            .await?;
        self.payload = payload;
        self.headers
            .retain(|(name, _)| !outbox_payload::header::ALL.contains(&name.as_str()));
        Ok(self)
    }
}

/// Why a [`decoding`] handler did not finish: the payload could not be decoded, or the
/// handler failed. Either way the loop retries, then dead-letters after its last attempt
/// (a payload whose hash or authentication fails will not pass on a retry: it ends in the
/// dead letters with this reason).
#[derive(Debug)]
pub enum DecodingError<E> {
    /// The store or the key could not be used; see [`DecodeError`].
    Decode(DecodeError),
    /// The handler's own error.
    Handler(E),
}

impl<E: fmt::Display> fmt::Display for DecodingError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Decode(e) => write!(f, "decoding the payload: {e}"),
            Self::Handler(e) => e.fmt(f),
        }
    }
}

/// The future of a [`decoding`] handler.
pub type DecodingFuture<E> = Pin<Box<dyn Future<Output = Result<(), DecodingError<E>>> + Send>>;

/// `handler`, called with each message decoded by `decoder` first (see
/// [`InboxMessage::decode`]); usable wherever a consumer loop takes a handler.
pub fn decoding<H: MessageHandler>(
    decoder: Arc<Decoder>,
    handler: H,
) -> impl Fn(InboxMessage) -> DecodingFuture<H::Error> + Send + Sync + 'static {
    let handler = Arc::new(handler);
    move |message: InboxMessage| {
        let decoder = decoder.clone();
        let handler = handler.clone();
        Box::pin(async move {
            let message = message
                .decode(&decoder)
                .await
                .map_err(DecodingError::Decode)?;
            handler.call(message).await.map_err(DecodingError::Handler)
        })
    }
}
