//! The config file (`outbox.toml`): one typed tree, unknown keys refused, every key
//! overridable from the environment.
//!
//! Precedence, lowest first: defaults (the embedded SQLite + stdout setup), the TOML file
//! (`--config F`, else `./outbox.toml` if present), `OUTBOX_<SECTION>__<KEY>` variables
//! (e.g. `OUTBOX_RELAY__BATCH_SIZE=1000`), then `--database-url` / `OUTBOX_DATABASE_URL`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use figment::Figment;
use figment::providers::{Env, Format, Serialized, Toml};
use outbox_core::RelayConfig;
use outbox_postgres::PostgresConfig;
#[cfg(feature = "kafka")]
use outbox_sinks::KafkaConfig;
#[cfg(feature = "rabbitmq")]
use outbox_sinks::RabbitMqConfig;
#[cfg(feature = "redis")]
use outbox_sinks::RedisConfig;
use outbox_sinks::{ConfigError, FileConfig, HttpConfig, NatsConfig, StdoutConfig};
use outbox_sqlite::SqliteConfig;
use serde::Deserialize;

/// The whole configuration.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Config {
    /// Where events come from (`[source]`).
    #[serde(default)]
    pub(crate) source: SourceConfig,
    /// How they are relayed (`[relay]`).
    #[serde(default)]
    pub(crate) relay: RelayConfig,
    /// Where they go (`[sink]`).
    #[serde(default)]
    pub(crate) sink: SinkConfig,
    /// Prometheus endpoint and watchdog (`[metrics]`).
    #[serde(default)]
    pub(crate) metrics: MetricsConfig,
    /// Retention schedule and defaults (`[retention]`).
    #[serde(default)]
    pub(crate) retention: crate::retention::RetentionConfig,
}

/// `[source]`: the database holding the outbox table.
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub(crate) enum SourceConfig {
    /// PostgreSQL.
    Postgres(PostgresConfig),
    /// SQLite (the embedded default).
    Sqlite(SqliteConfig),
}

impl Default for SourceConfig {
    fn default() -> Self {
        Self::Sqlite(SqliteConfig::default())
    }
}

/// `[sink]`: the broker.
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub(crate) enum SinkConfig {
    /// NATS JetStream.
    Nats(NatsConfig),
    /// HTTP webhooks.
    Http(HttpConfig),
    /// JSON lines on standard output.
    Stdout(StdoutConfig),
    /// JSON lines appended to a file.
    File(FileConfig),
    /// Kafka (idempotent producer).
    #[cfg(feature = "kafka")]
    Kafka(KafkaConfig),
    /// Redis Streams (`XADD`).
    #[cfg(feature = "redis")]
    Redis(RedisConfig),
    /// RabbitMQ (publisher confirms, mandatory routing).
    #[cfg(feature = "rabbitmq")]
    Rabbitmq(RabbitMqConfig),
}

impl Default for SinkConfig {
    fn default() -> Self {
        Self::Stdout(StdoutConfig::default())
    }
}

impl SinkConfig {
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Self::Nats(_) => "nats",
            Self::Http(_) => "http",
            Self::Stdout(_) => "stdout",
            Self::File(_) => "file",
            #[cfg(feature = "kafka")]
            Self::Kafka(_) => "kafka",
            #[cfg(feature = "redis")]
            Self::Redis(_) => "redis",
            #[cfg(feature = "rabbitmq")]
            Self::Rabbitmq(_) => "rabbitmq",
        }
    }

    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        match self {
            Self::Nats(c) => c.validate(),
            Self::Http(c) => c.validate(),
            Self::Stdout(c) => c.validate(),
            Self::File(c) => c.validate(),
            #[cfg(feature = "kafka")]
            Self::Kafka(c) => c.validate(),
            #[cfg(feature = "redis")]
            Self::Redis(c) => c.validate(),
            #[cfg(feature = "rabbitmq")]
            Self::Rabbitmq(c) => c.validate(),
        }
    }
}

/// `[metrics]`: the HTTP endpoint (`/metrics`, `/healthz`, `/readyz`) and the watchdog.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct MetricsConfig {
    /// Address to serve on, e.g. `127.0.0.1:9187`. Unset: no endpoint.
    pub(crate) listen: Option<SocketAddr>,
    /// How often the backlog gauges are refreshed from the database.
    #[serde(with = "humantime_serde")]
    pub(crate) refresh_interval: std::time::Duration,
    /// Warn when the oldest ready pending event is older than this.
    #[serde(with = "humantime_serde")]
    pub(crate) stuck_after: std::time::Duration,
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
pub(crate) enum Origin {
    File(PathBuf),
    Defaults,
}

impl std::fmt::Display for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::File(p) => write!(f, "{}", p.display()),
            Self::Defaults => f.write_str("built-in defaults (no outbox.toml)"),
        }
    }
}

/// Loads, merges and validates the configuration.
pub(crate) fn load(
    path: Option<&Path>,
    database_url: Option<&str>,
) -> anyhow::Result<(Config, Origin)> {
    let (mut figment, origin) = match path {
        Some(p) => {
            if !p.is_file() {
                bail!("config file `{}` not found", p.display());
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
            let kind = if url.starts_with("postgres://") || url.starts_with("postgresql://") {
                "postgres"
            } else if url.starts_with("sqlite:") || url.ends_with(".db") {
                "sqlite"
            } else {
                bail!(
                    "cannot tell the database kind of `{}`: use a postgres:// URL or set [source] kind",
                    outbox_postgres::redact(url)
                );
            };
            figment = figment.merge(Serialized::default("source.kind", kind));
        }
    }
    let config: Config = figment
        .extract()
        .map_err(|e| anyhow::anyhow!(describe(section_error(&figment, e))))
        .with_context(|| format!("invalid configuration in {origin}"))?;
    config.validate()?;
    Ok((config, origin))
}

impl Config {
    /// Checks what serde cannot; errors name the key.
    pub(crate) fn validate(&self) -> anyhow::Result<()> {
        self.relay.validate().map_err(anyhow::Error::msg)?;
        self.retention.validate().map_err(anyhow::Error::msg)?;
        match &self.source {
            SourceConfig::Postgres(pg) => {
                pg.validate().map_err(anyhow::Error::msg)?;
                if self.relay.ordering == outbox_core::Ordering::Total
                    && pg.mode != outbox_postgres::Mode::Cdc
                {
                    bail!(
                        "relay.ordering: `total` needs the CDC source (source.mode = \"cdc\"); the polling source offers `none` or `per-aggregate`"
                    );
                }
                if pg.claim_timeout <= self.relay.publish_timeout {
                    bail!(
                        "source.claim_timeout: must be longer than relay.publish_timeout ({:?})",
                        self.relay.publish_timeout
                    );
                }
            }
            SourceConfig::Sqlite(sq) => sq.validate().map_err(anyhow::Error::msg)?,
        }
        self.sink.validate()?;
        Ok(())
    }
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
    let found = match (section.as_str(), kind.as_str()) {
        ("source", "postgres") => inner.extract::<PostgresConfig>().err(),
        ("source", "sqlite") => inner.extract::<SqliteConfig>().err(),
        ("sink", "nats") => inner.extract::<NatsConfig>().err(),
        ("sink", "http") => inner.extract::<HttpConfig>().err(),
        ("sink", "stdout") => inner.extract::<StdoutConfig>().err(),
        ("sink", "file") => inner.extract::<FileConfig>().err(),
        #[cfg(feature = "kafka")]
        ("sink", "kafka") => inner.extract::<KafkaConfig>().err(),
        #[cfg(feature = "redis")]
        ("sink", "redis") => inner.extract::<RedisConfig>().err(),
        #[cfg(feature = "rabbitmq")]
        ("sink", "rabbitmq") => inner.extract::<RabbitMqConfig>().err(),
        _ => None,
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
