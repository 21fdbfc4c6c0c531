//! `outbox crash-test` on Redis Streams: one scratch stream key named after the run's tag,
//! deleted at the end.

use outbox_core::{Destination, Identifier, SinkError};

use super::RedisConfig;

/// `config` appending to the stream key `<tag>` (no placeholder: one key to read back and to
/// delete), without trimming.
pub(super) fn scratch(config: &RedisConfig, tag: &Identifier) -> Result<RedisConfig, String> {
    let destination =
        Destination::parse(tag.as_str()).map_err(|e| format!("scratch destination: {e}"))?;
    let scratch = RedisConfig {
        destination,
        maxlen: None,
        ..config.clone()
    };
    scratch.validate().map_err(|e| e.to_string())?;
    Ok(scratch)
}

/// Deletes the scratch stream key.
pub(super) async fn remove_scratch(config: &RedisConfig) -> Result<String, SinkError> {
    let client = config
        .client()
        .map_err(|e| SinkError::rejected(e.to_string()))?;
    let url = outbox_core::redact::redact_url(config.url.trim());
    let mut connection = super::manage(config, client)
        .await
        .map_err(|e| super::connect_error(&url, e))?;
    let key = config.destination.template();
    let removed: u64 = redis::cmd("DEL")
        .arg(key)
        .query_async(&mut connection)
        .await
        .map_err(|e| super::connect_error(&url, e))?;
    Ok(if removed > 0 {
        format!("Redis stream `{key}` on {url}")
    } else {
        format!("Redis stream `{key}` on {url} (never written)")
    })
}
