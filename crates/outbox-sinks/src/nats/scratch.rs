//! `outbox crash-test` on NATS JetStream: a scratch stream of its own, named after the run's
//! tag and capturing subjects under it, deleted at the end.

use async_nats::jetstream::context::DeleteStreamErrorKind;
use outbox_core::{Destination, Identifier, SinkError, SinkErrorKind};

use super::NatsConfig;

/// `config` publishing to `<tag>.{aggregate_type}` in the stream `<tag>` (created by the
/// relay's first connection, as for any new stream).
pub(super) fn scratch(config: &NatsConfig, tag: &Identifier) -> Result<NatsConfig, String> {
    let destination = Destination::parse(&format!("{tag}.{{aggregate_type}}"))
        .map_err(|e| format!("scratch destination: {e}"))?;
    let scratch = NatsConfig {
        destination,
        stream: tag.as_str().to_owned(),
        stream_subjects: None,
        ..config.clone()
    };
    scratch.validate().map_err(|e| e.to_string())?;
    Ok(scratch)
}

/// Deletes the scratch stream.
pub(super) async fn remove_scratch(config: &NatsConfig) -> Result<String, SinkError> {
    let (_client, jetstream, url) = super::connect_client(config).await?;
    let name = &config.stream;
    match jetstream.delete_stream(name).await {
        Ok(_) => Ok(format!("JetStream stream `{name}` on {url}")),
        Err(e) if matches!(e.kind(), DeleteStreamErrorKind::JetStream(ref j) if j.code() == 404) => {
            Ok(format!("JetStream stream `{name}` on {url} (already gone)"))
        }
        Err(e) => Err(SinkError::new(
            SinkErrorKind::Unavailable,
            format!("deleting JetStream stream `{name}` on {url}"),
        )
        .with_source(e)),
    }
}
