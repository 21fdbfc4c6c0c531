//! The config file (`outbox.toml`): one typed tree, unknown keys refused, every key
//! overridable from the environment.
//!
//! Precedence, lowest first: defaults (the embedded SQLite + stdout setup), the TOML file
//! (`--config F`, else `./outbox.toml` if present), `OUTBOX_<SECTION>__<KEY>` variables
//! (e.g. `OUTBOX_RELAY__BATCH_SIZE=1000`), then `--database-url` / `OUTBOX_DATABASE_URL`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use figment::Figment;
use figment::providers::{Env, Format, Serialized, Toml};
use outbox_core::RelayConfig;
use serde::Deserialize;

use crate::console::UiConfig;
use crate::otlp::TracingConfig;
pub use crate::registry::{SinkConfig, SourceConfig};
use crate::retention::RetentionConfig;
pub use crate::subscription::SubscriptionConfig;

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
        crate::subscription::resolve(self).map_err(ConfigError)?;
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
mod tests {
    use super::{Config, describe};

    #[test]
    fn a_kind_left_out_of_the_build_says_which_feature_brings_it_back() {
        let mut error = figment::Error::from(figment::error::Kind::UnknownVariant(
            "postgres".to_owned(),
            &["sqlite"],
        ));
        error.path = vec!["source".to_owned(), "kind".to_owned()];
        let message = describe(vec![error]);
        assert!(
            message.starts_with("source.kind: unknown value `postgres`")
                && message.contains("cargo feature `postgres`")
                && message.contains("cargo build --release -p outbox-cli"),
            "{message}"
        );
        let mut typo = figment::Error::from(figment::error::Kind::UnknownVariant(
            "postgre".to_owned(),
            &["sqlite"],
        ));
        typo.path = vec!["source".to_owned(), "kind".to_owned()];
        assert!(!describe(vec![typo]).contains("cargo feature"));
    }

    /// What `outbox check-config` prints is a config file: read back, it is the same
    /// configuration (secrets aside, which print as `***`).
    #[test]
    fn the_printed_configuration_reads_back_as_the_same_configuration() {
        let text = r#"
[source]
kind = "sqlite"
path = "orders.db"
lease_ttl = "1m"
[relay]
batch_size = 200
backoff = { initial = "250ms", max = "1m" }
[sink]
kind = "file"
path = "events.jsonl"
[metrics]
listen = "127.0.0.1:9187"
[retention]
keep = "3days"
"#;
        let config = Config::from_toml(text).expect("valid");
        let printed = config.to_redacted_toml().expect("printable");
        assert!(printed.contains("batch_size = 200"), "{printed}");
        assert!(printed.contains("initial = \"250ms\""), "{printed}");
        let again = Config::from_toml(&printed)
            .unwrap_or_else(|e| panic!("the printed config does not read back: {e}\n{printed}"));
        assert_eq!(again.to_redacted_toml().expect("printable"), printed);
    }

    /// With subscriptions, the printed file keeps every section but `[sink]` and reads back
    /// as the same configuration.
    #[test]
    fn a_configuration_with_subscriptions_prints_and_reads_back() {
        let text = r#"
[source]
kind = "postgres"
url = "postgres://app@127.0.0.1:5432/app"
[sinks.files]
kind = "file"
path = "events.jsonl"
[[subscription]]
name = "all"
sink = "files"
event_type = ["order.*", "invoice.paid"]
[[capture]]
table = "bookings"
aggregate_type = "Customer"
aggregate_id = "customer_id"
event_type = "booking.created"
"#;
        let config = Config::from_toml(text).expect("valid");
        let printed = config.to_redacted_toml().expect("printable");
        assert!(!printed.contains("[sink]"), "{printed}");
        for section in [
            "[source]",
            "[relay]",
            "[sinks.files]",
            "[[subscription]]",
            "[metrics]",
            "[retention]",
            "[ui]",
            "[tracing]",
            "[[capture]]",
        ] {
            assert!(
                printed.contains(section),
                "{section} missing from\n{printed}"
            );
        }
        let again = Config::from_toml(&printed)
            .unwrap_or_else(|e| panic!("the printed config does not read back: {e}\n{printed}"));
        assert_eq!(again.to_redacted_toml().expect("printable"), printed);
    }

    /// A secret read from a file (`KEY_file`) is the key's value, without the file's trailing
    /// newline; mistakes name the key and the path, never the contents.
    #[test]
    fn secrets_come_from_files() {
        let dir = tempfile::tempdir().expect("tempdir");
        let url = dir.path().join("db.url");
        std::fs::write(&url, "postgres://app:Pw-From-File@127.0.0.1:5432/app\n").expect("write");
        let token = dir.path().join("token");
        std::fs::write(&token, "Tok-From-File\n").expect("write");
        let text = format!(
            "[source]\nkind = \"postgres\"\nurl_file = \"{}\"\n[sink]\nkind = \"http\"\nurl = \"http://127.0.0.1:1/in\"\nsecret_file = \"{}\"\n",
            url.display(),
            token.display()
        );
        let config = Config::from_toml(&text).expect("valid");
        let printed = config.to_redacted_toml().expect("printable");
        assert!(
            printed.contains("url = \"postgres://app:***@127.0.0.1:5432/app\""),
            "{printed}"
        );
        assert!(printed.contains("secret = \"***\""), "{printed}");
        assert!(!printed.contains("From-File"), "{printed}");
        let crate::SourceConfig::Postgres(pg) = &config.source else {
            panic!("not postgres")
        };
        assert_eq!(
            pg.url.expose(),
            "postgres://app:Pw-From-File@127.0.0.1:5432/app"
        );

        let both = format!("{text}\n").replace("[sink]", "url = \"postgres://x@h/d\"\n[sink]");
        let e = Config::from_toml(&both).expect_err("both").to_string();
        assert!(
            e.contains("source.url_file") && e.contains("not both"),
            "{e}"
        );
        let missing = text.replace(&token.display().to_string(), "/no/such/secret");
        let e = Config::from_toml(&missing)
            .expect_err("missing")
            .to_string();
        assert!(
            e.contains("sink.secret_file") && e.contains("/no/such/secret"),
            "{e}"
        );
        // A named sink (`[sinks.NAME]`) reads its secrets from files the same way.
        let named = format!(
            "[source]\nkind = \"postgres\"\nurl_file = \"{}\"\n[sinks.hook]\nkind = \"http\"\nurl = \"http://127.0.0.1:1/in\"\nsecret_file = \"{}\"\n[[subscription]]\nname = \"partner\"\nsink = \"hook\"\n",
            url.display(),
            token.display()
        );
        let config = Config::from_toml(&named).expect("valid");
        let printed = config.to_redacted_toml().expect("printable");
        assert!(printed.contains("[sinks.hook]"), "{printed}");
        assert!(printed.contains("secret = \"***\""), "{printed}");
        assert!(!printed.contains("From-File"), "{printed}");
        assert!(!format!("{config:?}").contains("From-File"));
        let e = Config::from_toml(&named.replace(&token.display().to_string(), "/no/such/secret"))
            .expect_err("missing")
            .to_string();
        assert!(
            e.contains("sinks.hook.secret_file") && e.contains("/no/such/secret"),
            "{e}"
        );
        let unknown = text.replace("secret_file", "headers_file");
        let e = Config::from_toml(&unknown)
            .expect_err("unknown")
            .to_string();
        assert!(e.contains("sink.headers_file"), "{e}");
    }
}
