//! `[ui]`: the web console's settings (the console itself is [`crate::console`]).

use outbox_sinks::Secret;

use super::metrics::MetricsConfig;

/// `[ui]`: the web console at `/ui` on the `[metrics] listen` address.
#[derive(Debug, Clone, Default, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct UiConfig {
    /// Serve `/ui`. Unset: on when `metrics.listen` is a loopback address or `token` is set,
    /// off otherwise. `true` beyond loopback without `token` is refused.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// Offer (and accept) retry and purge of dead letters. Off: the console only reads.
    pub allow_actions: bool,
    /// Needed to open the console (`Authorization: Bearer TOKEN`, or the login form, which
    /// sets a session cookie); at least 16 characters. Required when `metrics.listen` is not
    /// a loopback address. Also `token_file`. Never printed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token: Option<Secret>,
}

/// The shortest `[ui] token` accepted.
const MIN_TOKEN_LEN: usize = 16;

impl UiConfig {
    /// Whether `/ui` is served, given `[metrics]`.
    pub fn active(&self, metrics: &MetricsConfig) -> bool {
        match metrics.listen {
            None => false,
            Some(listen) => self
                .enabled
                .unwrap_or(listen.ip().is_loopback() || self.token.is_some()),
        }
    }

    /// Checks the console's settings against `[metrics]`; the message names the keys.
    pub fn validate(&self, metrics: &MetricsConfig) -> Result<(), String> {
        if let Some(token) = &self.token
            && token.expose().trim().chars().count() < MIN_TOKEN_LEN
        {
            return Err(format!(
                "ui.token: must be at least {MIN_TOKEN_LEN} characters (e.g. `openssl rand -hex 24`)"
            ));
        }
        match metrics.listen {
            None if self.enabled == Some(true) => Err(
                "ui.enabled = true needs metrics.listen: the console is served on the metrics listener"
                    .to_owned(),
            ),
            Some(listen)
                if self.enabled == Some(true)
                    && !listen.ip().is_loopback()
                    && self.token.is_none() =>
            {
                Err(format!(
                    "ui.enabled = true with metrics.listen = {listen} (not a loopback address) needs ui.token: the console shows event payloads and must not be reachable beyond loopback without a token. Set ui.token (or ui.token_file), listen on 127.0.0.1, or set ui.enabled = false"
                ))
            }
            _ => Ok(()),
        }
    }
}
