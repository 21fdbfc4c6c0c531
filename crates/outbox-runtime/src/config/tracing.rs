//! `[tracing]`: the relay's log level (reloadable) and where it exports its publish spans
//! (the exporter is [`crate::otlp`]).

use std::collections::BTreeMap;
use std::num::NonZeroUsize;
use std::time::Duration;

use serde::Deserialize;

/// `[tracing]`: where the relay exports its publish spans.
#[derive(Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct TracingConfig {
    /// The relay's log filter, `tracing` `EnvFilter` syntax: `info`, `debug`,
    /// `warn,outbox_core=debug`. Set, it wins over `OUTBOX_LOG`; unset, `OUTBOX_LOG` or the
    /// command's default. Applied at start and by each reload (SIGHUP, the console's reload).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub log_level: Option<String>,
    /// The OTLP/HTTP collector, e.g. `http://127.0.0.1:4318`; spans are POSTed to
    /// `<otlp_endpoint>/v1/traces` (protobuf). Unset: `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`
    /// (the full URL) or `OTEL_EXPORTER_OTLP_ENDPOINT` (the base, as here); none of the
    /// three: no spans at all. Printed with any password masked.
    #[serde(serialize_with = "outbox_core::redact::serde_redacted::optional_url")]
    pub otlp_endpoint: Option<String>,
    /// Extra request headers (an API key, `Authorization`); values are secrets, printed as
    /// `***`. `OTEL_EXPORTER_OTLP_HEADERS` adds to them.
    #[serde(serialize_with = "outbox_core::redact::serde_redacted::values")]
    pub headers: BTreeMap<String, String>,
    /// The `service.name` of the spans. Default `OTEL_SERVICE_NAME`, else `outbox-relay`.
    pub service_name: Option<String>,
    /// Finished spans held for export at most; past it spans are dropped and counted.
    pub queue_size: NonZeroUsize,
    /// Longest one export request (with its retries) may take.
    #[serde(with = "humantime_serde")]
    pub export_timeout: Duration,
}

impl Default for TracingConfig {
    fn default() -> Self {
        Self {
            log_level: None,
            otlp_endpoint: None,
            headers: BTreeMap::new(),
            service_name: None,
            queue_size: NonZeroUsize::new(2048).expect("not zero"),
            export_timeout: Duration::from_secs(10),
        }
    }
}

impl std::fmt::Debug for TracingConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TracingConfig")
            .field("log_level", &self.log_level)
            .field(
                "otlp_endpoint",
                &self
                    .otlp_endpoint
                    .as_deref()
                    .map(outbox_core::redact::redact_url),
            )
            .field("headers", &self.headers.keys().collect::<Vec<_>>())
            .field("service_name", &self.service_name)
            .field("queue_size", &self.queue_size)
            .field("export_timeout", &self.export_timeout)
            .finish()
    }
}

impl TracingConfig {
    /// Checks what serde cannot; the message names the key.
    pub fn validate(&self) -> Result<(), String> {
        if let Some(level) = &self.log_level {
            check_log_level(level).map_err(|why| format!("tracing.log_level: {why}"))?;
        }
        if let Some(url) = &self.otlp_endpoint {
            check_url(url).map_err(|why| format!("tracing.otlp_endpoint: {why}"))?;
        }
        if self.export_timeout.is_zero() {
            return Err("tracing.export_timeout: must be greater than 0".into());
        }
        for (name, value) in &self.headers {
            if axum::http::HeaderName::from_bytes(name.as_bytes()).is_err() {
                return Err(format!("tracing.headers: `{name}` is not a header name"));
            }
            if axum::http::HeaderValue::from_str(value).is_err() {
                return Err(format!("tracing.headers.{name}: not a valid header value"));
            }
        }
        Ok(())
    }

    /// The URL spans are POSTed to, if tracing is on: `otlp_endpoint` + `/v1/traces`, else
    /// `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` as is, else `OTEL_EXPORTER_OTLP_ENDPOINT` +
    /// `/v1/traces` (empty variables count as unset).
    pub fn traces_url(&self) -> Result<Option<String>, String> {
        let env = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        let (url, from) = if let Some(base) = &self.otlp_endpoint {
            (with_traces_path(base), "tracing.otlp_endpoint")
        } else if let Some(full) = env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") {
            (full, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        } else if let Some(base) = env("OTEL_EXPORTER_OTLP_ENDPOINT") {
            (with_traces_path(&base), "OTEL_EXPORTER_OTLP_ENDPOINT")
        } else {
            return Ok(None);
        };
        check_url(&url).map_err(|why| format!("{from}: {why}"))?;
        Ok(Some(url))
    }
}

/// Whether `spec` is a log filter `EnvFilter` accepts (what the binary then installs).
pub(crate) fn check_log_level(spec: &str) -> Result<(), String> {
    if spec.trim().is_empty() {
        return Err("must not be empty (e.g. \"info\" or \"warn,outbox_core=debug\")".into());
    }
    tracing_subscriber::EnvFilter::builder()
        .parse(spec)
        .map(drop)
        .map_err(|e| format!("`{spec}` is not a log filter: {e}"))
}

fn check_url(url: &str) -> Result<(), String> {
    let rest = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"))
        .ok_or_else(|| {
            format!(
                "`{}` is not an http:// or https:// URL (OTLP over HTTP, port 4318 by default)",
                outbox_core::redact::redact_url(url)
            )
        })?;
    if rest.is_empty() || rest.starts_with('/') {
        return Err(format!(
            "`{}` has no host",
            outbox_core::redact::redact_url(url)
        ));
    }
    Ok(())
}

/// The OTLP/HTTP convention for a base endpoint: the signal's path appended.
pub(crate) fn with_traces_path(base: &str) -> String {
    let base = base.trim_end_matches('/');
    if base.ends_with("/v1/traces") {
        base.to_owned()
    } else {
        format!("{base}/v1/traces")
    }
}
