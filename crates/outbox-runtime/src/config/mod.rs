//! The config file (`outbox.toml`): one typed tree, unknown keys refused, every key
//! overridable from the environment.
//!
//! Precedence, lowest first: defaults (the embedded SQLite + stdout setup), the TOML file
//! (`--config F`, else `./outbox.toml` if present), `OUTBOX_<SECTION>__<KEY>` variables
//! (e.g. `OUTBOX_RELAY__BATCH_SIZE=1000`), then `--database-url` / `OUTBOX_DATABASE_URL`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use figment::Figment;
use figment::providers::{Env, Format, Serialized, Toml};
use outbox_core::RelayConfig;
use serde::Deserialize;

pub use crate::registry::{SinkConfig, SourceConfig};
use crate::retention::RetentionConfig;

mod metrics;
pub mod subscription;
pub(crate) mod tracing;
mod ui;

pub use metrics::MetricsConfig;
pub use subscription::SubscriptionConfig;
pub use tracing::TracingConfig;
pub use ui::UiConfig;

/// Why the configuration cannot be used. The message names the key and where it came from.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(String);

impl ConfigError {
    /// An error with this message (which names the key).
    pub fn new(message: impl Into<String>) -> Self {
        Self(message.into())
    }
}

/// The whole configuration.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Where events come from (`[source]`).
    #[serde(default)]
    pub source: SourceConfig,
    /// How they are relayed (`[relay]`).
    #[serde(default)]
    pub relay: RelayConfig,
    /// Where they go (`[sink]`), unless `[[subscription]]` entries fan them out.
    #[serde(default)]
    pub sink: SinkConfig,
    /// Named sinks for `[[subscription]]` entries (`[sinks.NAME]`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub sinks: BTreeMap<String, SinkConfig>,
    /// Subscriptions: each takes the events its filter matches to its sink, with its own
    /// progress, retries and dead letters (`[[subscription]]`).
    #[serde(
        default,
        rename = "subscription",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub subscriptions: Vec<SubscriptionConfig>,
    /// Prometheus endpoint and watchdog (`[metrics]`).
    #[serde(default)]
    pub metrics: MetricsConfig,
    /// Retention schedule and defaults (`[retention]`).
    #[serde(default)]
    pub retention: RetentionConfig,
    /// The web console at `/ui` on the metrics listener (`[ui]`).
    #[serde(default)]
    pub ui: UiConfig,
    /// A span per publish attempt, exported over OTLP (`[tracing]`).
    #[serde(default)]
    pub tracing: TracingConfig,
    /// Business tables as event sources, installed by `outbox capture install`
    /// (`[[capture]]`, docs/capture.md).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub capture: Vec<outbox_core::capture::CaptureConfig>,
    /// A probe event written and read back on a schedule (`[canary]`, off by default).
    #[serde(default)]
    pub canary: crate::canary::CanaryConfig,
    /// What the relay does with payloads before publishing them: `schemas` (a directory of
    /// JSON Schema files), `claim_check` and `encryption` for every sink (`[payload]`, all off
    /// by default; docs/payloads.md).
    #[serde(default)]
    pub payload: crate::payload::PayloadConfig,
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
    /// Checks `[sinks.*]` and `[[subscription]]` and resolves each subscription to its sink
    /// (destination applied) and table; errors name the key (`subscription[1].sink: ...`).
    pub fn resolve_subscriptions(&self) -> Result<Vec<subscription::Resolved>, String> {
        subscription::resolve(&self.source, &self.sinks, &self.subscriptions)
    }

    /// Reads a configuration from TOML text (for services that embed the relay), with the
    /// same environment overrides and checks as [`load`].
    pub fn from_toml(text: &str) -> Result<Self, ConfigError> {
        from_figment(
            Figment::new().merge(Toml::string(text)),
            &Origin::Code,
            None,
        )
    }

    /// The effective configuration as TOML, defaults filled in, with every secret (URL
    /// passwords and secret parameters, tokens, header values, secret client settings)
    /// shown as `***`: what `outbox check-config` prints, safe to paste into a ticket.
    pub fn to_redacted_toml(&self) -> Result<String, ConfigError> {
        let error = |e: &dyn std::fmt::Display| {
            ConfigError(format!("cannot print the configuration as TOML: {e}"))
        };
        if self.subscriptions.is_empty() {
            return toml::to_string_pretty(self).map_err(|e| error(&e));
        }
        // With subscriptions the events go to [sinks.*]; `[sink]` (its unused default) would
        // make the printed file unreadable ("cannot be combined"), so it is left out.
        #[derive(serde::Serialize)]
        struct WithoutSink<'a> {
            source: &'a SourceConfig,
            relay: &'a RelayConfig,
            sinks: &'a BTreeMap<String, SinkConfig>,
            subscription: &'a [SubscriptionConfig],
            metrics: &'a MetricsConfig,
            retention: &'a RetentionConfig,
            ui: &'a UiConfig,
            tracing: &'a TracingConfig,
            #[serde(skip_serializing_if = "<[_]>::is_empty")]
            capture: &'a [outbox_core::capture::CaptureConfig],
            canary: &'a crate::canary::CanaryConfig,
            payload: &'a crate::payload::PayloadConfig,
        }
        toml::to_string_pretty(&WithoutSink {
            source: &self.source,
            relay: &self.relay,
            sinks: &self.sinks,
            subscription: &self.subscriptions,
            metrics: &self.metrics,
            retention: &self.retention,
            ui: &self.ui,
            tracing: &self.tracing,
            capture: &self.capture,
            canary: &self.canary,
            payload: &self.payload,
        })
        .map_err(|e| error(&e))
    }

    /// Checks what serde cannot; errors name the key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.relay.validate().map_err(ConfigError)?;
        self.retention.validate().map_err(ConfigError)?;
        if !self.subscriptions.is_empty() && self.relay.ordering == outbox_core::Ordering::Total {
            return Err(ConfigError(
                "relay.ordering: `total` cannot hold with [[subscription]] (each subscription progresses on its own); use `per-aggregate`".into(),
            ));
        }
        self.source.validate(&self.relay).map_err(ConfigError)?;
        self.sink.validate().map_err(ConfigError)?;
        if self.subscriptions.is_empty() {
            self.payload
                .validate_for(&self.sink, "[sink]")
                .map_err(ConfigError)?;
        }
        for (name, sink) in &self.sinks {
            self.payload
                .validate_for(sink, &format!("[sinks.{name}]"))
                .map_err(ConfigError)?;
        }
        self.ui.validate(&self.metrics).map_err(ConfigError)?;
        self.tracing.validate().map_err(ConfigError)?;
        self.canary.validate().map_err(ConfigError)?;
        outbox_core::capture::validate_all(&self.capture).map_err(ConfigError)?;
        self.resolve_subscriptions().map_err(ConfigError)?;
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
    figment = read_secret_files(figment)?;
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
    if figment.find_value("subscription").is_ok() && figment.find_value("sink").is_ok() {
        return Err(ConfigError(format!(
            "invalid configuration in {origin}: [sink] and [[subscription]] cannot be combined; move the sink to [sinks.NAME] and add a subscription for it"
        )));
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
    let Some(first) = e.path.first().cloned() else {
        return e.into_iter().collect();
    };
    // `[source]`, `[sink]`, or one named sink `[sinks.NAME]`.
    let (section, is_source) = match (first.as_str(), e.path.len()) {
        ("source", 1) => (first, true),
        ("sink", 1) => (first, false),
        ("sinks", 2) => (format!("sinks.{}", e.path[1]), false),
        _ => return e.into_iter().collect(),
    };
    let Ok(figment::value::Value::Dict(_, mut keys)) = figment.find_value(&section) else {
        return e.into_iter().collect();
    };
    let Some(kind) = keys.remove("kind").and_then(|k| k.into_string()) else {
        return e.into_iter().collect();
    };
    let inner = Figment::from(Serialized::defaults(keys));
    let found = if is_source {
        SourceConfig::extract_error(&kind, &inner)
    } else {
        SinkConfig::extract_error(&kind, &inner)
    };
    match found {
        Some(precise) => precise
            .into_iter()
            .map(|mut error| {
                for (i, part) in section.split('.').enumerate() {
                    error.path.insert(i, part.to_owned());
                }
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
                    let mut message = format!(
                        "unknown value `{found}` (expected one of: {})",
                        expected.join(", ")
                    );
                    if e.path.last().is_some_and(|p| p == "kind")
                        && crate::registry::OPTIONAL_KINDS.contains(&found.as_str())
                    {
                        message.push_str(&format!(
                            "; `{found}` exists, but this build of outbox was made without it (cargo feature `{found}`): build with the default features, `cargo build --release -p outbox-cli`"
                        ));
                    }
                    message
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

/// Keys of `[source]`, `[sink]` and `[ui]` whose value may come from a file instead
/// (`KEY_file = "/run/secrets/..."`): the URL (it may carry a password), tokens, signing
/// secrets, NATS NKey seeds.
const SECRET_FILE_KEYS: &[&str] = &["url", "token", "secret", "nkey_seed"];

/// Sections whose secrets may come from files.
const SECRET_FILE_SECTIONS: [&str; 3] = ["source", "sink", "ui"];

/// Replaces every `[source]`/`[sink]`/`[sinks.NAME]`/`[ui]` `KEY_file` by `KEY` = the file's
/// contents (one trailing newline dropped). Errors name the key and the path, never the
/// contents.
fn read_secret_files(figment: Figment) -> Result<Figment, ConfigError> {
    use figment::value::{Dict, Value};
    let has_file_key = |dict: &Dict| dict.keys().any(|k| k.ends_with("_file"));
    let mut found = false;
    for section in SECRET_FILE_SECTIONS {
        if let Ok(Value::Dict(_, dict)) = figment.find_value(section) {
            found |= has_file_key(&dict);
        }
    }
    if let Ok(Value::Dict(_, sinks)) = figment.find_value("sinks") {
        found |= sinks
            .values()
            .any(|v| matches!(v, Value::Dict(_, d) if has_file_key(d)));
    }
    if !found {
        return Ok(figment);
    }
    let mut root: Dict = figment
        .extract()
        .map_err(|e| ConfigError(format!("invalid configuration: {e}")))?;
    for section in SECRET_FILE_SECTIONS {
        if let Some(Value::Dict(_, dict)) = root.get_mut(section) {
            secrets_from_files(section, dict)?;
        }
    }
    if let Some(Value::Dict(_, sinks)) = root.get_mut("sinks") {
        for (name, sink) in sinks.iter_mut() {
            if let Value::Dict(_, dict) = sink {
                secrets_from_files(&format!("sinks.{name}"), dict)?;
            }
        }
    }
    Ok(Figment::from(Serialized::defaults(root)))
}

/// [`read_secret_files`] for one section (`section` names it in errors).
fn secrets_from_files(section: &str, dict: &mut figment::value::Dict) -> Result<(), ConfigError> {
    use figment::value::Value;
    let file_keys: Vec<String> = dict
        .keys()
        .filter(|k| k.ends_with("_file"))
        .cloned()
        .collect();
    for file_key in file_keys {
        let stem = file_key.trim_end_matches("_file");
        if !SECRET_FILE_KEYS.contains(&stem) {
            return Err(ConfigError(format!(
                "{section}.{file_key}: unknown key (a secret can come from a file as one of: {})",
                SECRET_FILE_KEYS
                    .iter()
                    .map(|k| format!("{k}_file"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
        if dict.contains_key(stem) {
            return Err(ConfigError(format!(
                "{section}.{file_key}: set either {section}.{stem} or {section}.{file_key}, not both"
            )));
        }
        let Some(Value::String(_, path)) = dict.remove(&file_key) else {
            return Err(ConfigError(format!(
                "{section}.{file_key}: expected a file path (a string)"
            )));
        };
        let contents = std::fs::read_to_string(&path)
            .map_err(|e| ConfigError(format!("{section}.{file_key}: cannot read `{path}`: {e}")))?;
        let value = contents
            .strip_suffix("\r\n")
            .or_else(|| contents.strip_suffix('\n'))
            .unwrap_or(&contents)
            .to_owned();
        if value.is_empty() {
            return Err(ConfigError(format!(
                "{section}.{file_key}: `{path}` is empty"
            )));
        }
        dict.insert(stem.to_owned(), Value::from(value));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
