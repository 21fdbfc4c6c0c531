//! `[metrics]`: the HTTP endpoint and the watchdog's thresholds.

use std::net::SocketAddr;

use serde::Deserialize;

/// `[metrics]`: the HTTP endpoint (`/metrics`, `/healthz`, `/readyz`) and the watchdog.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsConfig {
    /// Address to serve on, e.g. `127.0.0.1:9187`. Unset: no endpoint.
    pub listen: Option<SocketAddr>,
    /// How often the backlog gauges are refreshed from the database.
    #[serde(with = "humantime_serde")]
    pub refresh_interval: std::time::Duration,
    /// Warn when the oldest ready pending event is older than this.
    #[serde(with = "humantime_serde")]
    pub stuck_after: std::time::Duration,
}

impl Default for MetricsConfig {
    fn default() -> Self {
        Self {
            listen: None,
            refresh_interval: std::time::Duration::from_secs(5),
            stuck_after: std::time::Duration::from_secs(60),
        }
    }
}
