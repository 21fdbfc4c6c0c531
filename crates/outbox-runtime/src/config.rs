//! The config file (`outbox.toml`): one typed tree, unknown keys refused, every key
//! overridable from the environment.
//!
//! Precedence, lowest first: defaults (the embedded SQLite + stdout setup), the TOML file
//! (`--config F`, else `./outbox.toml` if present), `OUTBOX_<SECTION>__<KEY>` variables
//! (e.g. `OUTBOX_RELAY__BATCH_SIZE=1000`), then `--database-url` / `OUTBOX_DATABASE_URL`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use figment::Figment;
use figment::providers::{Env, Format, Serialized, Toml};
use outbox_core::RelayConfig;
use serde::Deserialize;

pub use crate::registry::{SinkConfig, SourceConfig};
use crate::retention::RetentionConfig;

/// Why the configuration cannot be used. The message names the key and where it came from.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(String);

/// The whole configuration.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Where events come from (`[source]`).
    #[serde(default)]
    pub source: SourceConfig,
    /// How they are relayed (`[relay]`).
    #[serde(default)]
    pub relay: RelayConfig,
    /// Where they go (`[sink]`).
    #[serde(default)]
    pub sink: SinkConfig,
    /// Prometheus endpoint and watchdog (`[metrics]`).
    #[serde(default)]
    pub metrics: MetricsConfig,
    /// Retention schedule and defaults (`[retention]`).
    #[serde(default)]
    pub retention: RetentionConfig,
}

/// `[metrics]`: the HTTP endpoint (`/metrics`, `/healthz`, `/readyz`) and the watchdog.
#[derive(Debug, Clone, Deserialize)]
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

/// Where the configuration came from, for the startup log line.
#[derive(Debug, Clone)]
pub enum Origin {
    /// A TOML file.
    File(PathBuf),
    /// No file: the built-in defaults (plus environment overrides).
    Defaults,
    /// Given by the embedding application ([`Config::from_toml`] or built in code).
    Code,
}

impl std::fmt::Display for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::File(p) => write!(f, "{}", p.display()),
            Self::Defaults => f.write_str("built-in defaults (no outbox.toml)"),
            Self::Code => f.write_str("the embedding application"),
        }
    }
}

/// Loads, merges and validates the configuration: the file (`path`, else `./outbox.toml` if
/// present, else the built-in defaults), then `OUTBOX_<SECTION>__<KEY>` variables, then
/// `database_url` (which also picks `[source] kind` when the file does not).
pub fn load(
    path: Option<&Path>,
    database_url: Option<&str>,
) -> Result<(Config, Origin), ConfigError> {
    let (figment, origin) = match path {
        Some(p) => {
            if !p.is_file() {
                return Err(ConfigError(format!(
                    "config file `{}` not found",
                    p.display()
                )));
            }
            (
                Figment::new().merge(Toml::file_exact(p)),
                Origin::File(p.to_owned()),
            )
        }
        None if Path::new("outbox.toml").is_file() => (
            Figment::new().merge(Toml::file_exact("outbox.toml")),
            Origin::File(PathBuf::from("outbox.toml")),
        ),
        None => (Figment::new(), Origin::Defaults),
    };
    let config = from_figment(figment, &origin, database_url)?;
    Ok((config, origin))
}

impl Config {
    /// Reads a configuration from TOML text (for services that embed the relay), with the
    /// same environment overrides and checks as [`load`].
    pub fn from_toml(text: &str) -> Result<Self, ConfigError> {
        from_figment(
            Figment::new().merge(Toml::string(text)),
            &Origin::Code,
            None,
        )
    }

    /// Checks what serde cannot; errors name the key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.relay.validate().map_err(ConfigError)?;
        self.retention.validate().map_err(ConfigError)?;
        self.source.validate(&self.relay).map_err(ConfigError)?;
        self.sink.validate().map_err(ConfigError)?;
        Ok(())
    }
}

fn from_figment(
    mut figment: Figment,
    origin: &Origin,
    database_url: Option<&str>,
) -> Result<Config, ConfigError> {
    // Only nested variables (`OUTBOX_SECTION__KEY`): flat ones such as OUTBOX_DATABASE_URL
    // or OUTBOX_LOG are handled explicitly, and must not read as unknown top-level keys.
    figment = figment.merge(
        Env::prefixed("OUTBOX_")
            .filter(|k| k.as_str().contains("__"))
            .split("__"),
    );
    if let Some(url) = database_url {
        figment = figment.merge(Serialized::default("source.url", url));
        let has_kind = figment.find_value("source.kind").is_ok();
        if !has_kind {
            let Some(kind) = SourceConfig::kind_of_url(url) else {
                return Err(ConfigError(format!(
                    "cannot tell the database kind of `{}`: use a postgres:// URL or set [source] kind (one of: {})",
                    outbox_core::redact::redact_url(url),
                    SourceConfig::KINDS.join(", ")
                )));
            };
            figment = figment.merge(Serialized::default("source.kind", kind));
        }
    }
    let config: Config = figment.extract().map_err(|e| {
        ConfigError(format!(
            "invalid configuration in {origin}: {}",
            describe(section_error(&figment, e))
        ))
    })?;
    config.validate()?;
    Ok(config)
}

/// `[source]` and `[sink]` are chosen by their `kind`, and serde reports an error inside them
/// at the section only (`source: invalid value ...`). For such an error, the section is read
/// again as the chosen kind's own type, whose error names the key (`source.claim_timeout`).
fn section_error(figment: &Figment, e: figment::Error) -> Vec<figment::Error> {
    let Some(section) = e.path.first().cloned() else {
        return e.into_iter().collect();
    };
    if e.path.len() != 1 || !matches!(section.as_str(), "source" | "sink") {
        return e.into_iter().collect();
    }
    let Ok(figment::value::Value::Dict(_, mut keys)) = figment.find_value(&section) else {
        return e.into_iter().collect();
    };
    let Some(kind) = keys.remove("kind").and_then(|k| k.into_string()) else {
        return e.into_iter().collect();
    };
    let inner = Figment::from(Serialized::defaults(keys));
    let found = if section == "source" {
        SourceConfig::extract_error(&kind, &inner)
    } else {
        SinkConfig::extract_error(&kind, &inner)
    };
    match found {
        Some(precise) => precise
            .into_iter()
            .map(|mut error| {
                error.path.insert(0, section.clone());
                error
            })
            .collect(),
        None => e.into_iter().collect(),
    }
}

/// One line per figment error, with the key path but without figment's profile prefix.
fn describe(errors: Vec<figment::Error>) -> String {
    errors
        .into_iter()
        .map(|e| {
            use figment::error::Kind;
            let path = e.path.join(".");
            let kind = match &e.kind {
                Kind::Message(m) => m.clone(),
                Kind::UnknownField(found, expected) => {
                    format!(
                        "unknown key `{found}` (expected one of: {})",
                        expected.join(", ")
                    )
                }
                Kind::UnknownVariant(found, expected) => {
                    format!(
                        "unknown value `{found}` (expected one of: {})",
                        expected.join(", ")
                    )
                }
                Kind::MissingField(field) => format!("missing key `{field}`"),
                other => other.to_string(),
            };
            if path.is_empty() {
                kind
            } else {
                format!("{path}: {kind}")
            }
        })
        .collect::<Vec<_>>()
        .join("; ")
}
