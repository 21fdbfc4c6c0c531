//! `[payload] schemas`: the relay's side of JSON Schema validation (docs/payloads.md). The
//! schemas themselves (loading, the file fallback, the check and its reasons) live in
//! [`outbox_payload::schemas`], shared with the producer's opt-in check.

use std::sync::Arc;

pub use outbox_payload::schemas::{SchemaError, SchemaViolation, Schemas};

/// `[payload] schemas` compiled, or `None` when unset. The error names every broken file.
pub fn from_config(
    config: &crate::payload::PayloadConfig,
) -> Result<Option<Arc<Schemas>>, crate::ConfigError> {
    let Some(dir) = &config.schemas else {
        return Ok(None);
    };
    match Schemas::load(dir) {
        Ok(schemas) => Ok(Some(Arc::new(schemas))),
        Err(errors) => Err(crate::ConfigError::new(
            errors
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("; "),
        )),
    }
}
