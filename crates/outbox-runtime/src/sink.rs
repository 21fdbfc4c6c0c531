//! Connecting a sink: retried while the broker is unreachable, until shutdown.

use std::time::Duration;

use outbox_core::{DynSink, SinkErrorKind};
use tokio_util::sync::CancellationToken;

use crate::RuntimeError;
use crate::registry::SinkConfig;

/// Builds the sink from config, waiting out an unreachable broker (with backoff) until
/// `shutdown` (then `Ok(None)`); a configuration mistake fails at once.
pub async fn build_sink(
    config: &SinkConfig,
    shutdown: &CancellationToken,
) -> Result<Option<Box<dyn DynSink>>, RuntimeError> {
    let mut pause = Duration::from_millis(200);
    loop {
        match config.build().await {
            Ok(sink) => return Ok(Some(sink)),
            Err(e) if e.kind() == SinkErrorKind::Unavailable => {
                tracing::warn!(sink = config.kind(), error = %e.report(), retry_in = ?pause, "broker unreachable; retrying");
                tokio::select! {
                    () = tokio::time::sleep(pause) => {}
                    () = shutdown.cancelled() => return Ok(None),
                }
                pause = (pause * 2).min(Duration::from_secs(10));
            }
            Err(e) => {
                return Err(RuntimeError::Sink(format!(
                    "sink `{}`: {}",
                    config.kind(),
                    e.report()
                )));
            }
        }
    }
}
