//! What a reload changes: the old and the new configuration as flat `key = value` lists,
//! compared key by key, with every secret shown as `***`.
//!
//! The values come from [`Config::to_redacted_toml`] (what `outbox check-config` prints), so
//! a secret can never reach the log through a diff. A secret that changed looks the same
//! masked; the file's own text (read again, never printed) tells that it changed, and the
//! change is listed as `*** → ***`.

use std::collections::BTreeMap;
use std::path::Path;

use crate::config::{Config, ConfigError};

/// One key whose value differs between two configurations.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Change {
    /// The key, as a path: `sinks.audit.path`, `subscription[paid].event_type`.
    pub key: String,
    /// The old value (secrets as `***`), `None` when the key was not set.
    pub old: Option<String>,
    /// The new value (secrets as `***`), `None` when the key is gone.
    pub new: Option<String>,
}

impl std::fmt::Display for Change {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let show = |v: &Option<String>| v.clone().unwrap_or_else(|| "(unset)".to_owned());
        write!(f, "{}: {} → {}", self.key, show(&self.old), show(&self.new))
    }
}

/// Keys that need a restart: the database the relay holds open (`source.*`), the pool sized
/// by `relay.workers`, and the listener and console (`metrics.listen`, `ui.*`).
pub(crate) fn needs_restart(key: &str) -> bool {
    key.starts_with("source.")
        || key == "relay.workers"
        || key == "metrics.listen"
        || key.starts_with("ui.")
}

/// The keys whose values differ between `old` and `new`, in key order. `old_raw` and
/// `new_raw` are the files' own keys (see [`raw_keys`]): a key that differs only there is a
/// secret that changed behind its mask.
pub(crate) fn changes(
    old: &Config,
    new: &Config,
    old_raw: &BTreeMap<String, String>,
    new_raw: &BTreeMap<String, String>,
) -> Result<Vec<Change>, ConfigError> {
    let old_keys = redacted_keys(old)?;
    let new_keys = redacted_keys(new)?;
    let mut out: BTreeMap<String, Change> = BTreeMap::new();
    for key in old_keys.keys().chain(new_keys.keys()) {
        let (o, n) = (old_keys.get(key), new_keys.get(key));
        if o != n {
            out.insert(
                key.clone(),
                Change {
                    key: key.clone(),
                    old: o.cloned(),
                    new: n.cloned(),
                },
            );
        }
    }
    for key in old_raw.keys().chain(new_raw.keys()) {
        if old_raw.get(key) != new_raw.get(key) && !out.contains_key(key) {
            // Equal once masked: a secret changed. Never print either value.
            let masked = |present: bool| present.then(|| "***".to_owned());
            out.insert(
                key.clone(),
                Change {
                    key: key.clone(),
                    old: masked(old_raw.contains_key(key)),
                    new: masked(new_raw.contains_key(key)),
                },
            );
        }
    }
    Ok(out.into_values().collect())
}

/// The file at `path` as flat keys, values as written (secrets included: compare only,
/// never print). An unreadable file gives no keys; loading it reports the error.
pub(crate) fn raw_keys(path: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    if let Ok(text) = std::fs::read_to_string(path)
        && let Ok(value) = text.parse::<toml::Table>()
    {
        flatten("", &toml::Value::Table(value), &mut out);
    }
    out
}

/// `config` as flat keys with every secret as `***`, defaults filled in.
fn redacted_keys(config: &Config) -> Result<BTreeMap<String, String>, ConfigError> {
    let text = config.to_redacted_toml()?;
    let table: toml::Table = text
        .parse()
        .map_err(|e| ConfigError::new(format!("cannot read the configuration back: {e}")))?;
    let mut out = BTreeMap::new();
    flatten("", &toml::Value::Table(table), &mut out);
    Ok(out)
}

/// Flattens `value` under `prefix`. Arrays of tables with a `name` (`[[subscription]]`) are
/// keyed by that name, so adding one entry is one change, not a shift of every index.
fn flatten(prefix: &str, value: &toml::Value, out: &mut BTreeMap<String, String>) {
    let join = |key: &str| {
        if prefix.is_empty() {
            key.to_owned()
        } else {
            format!("{prefix}.{key}")
        }
    };
    match value {
        toml::Value::Table(table) => {
            for (key, value) in table {
                flatten(&join(key), value, out);
            }
        }
        toml::Value::Array(items) if items.iter().all(toml::Value::is_table) => {
            for (i, item) in items.iter().enumerate() {
                let label = item
                    .get("name")
                    .and_then(toml::Value::as_str)
                    .map_or_else(|| i.to_string(), str::to_owned);
                flatten(&format!("{prefix}[{label}]"), item, out);
            }
        }
        other => {
            out.insert(prefix.to_owned(), other.to_string());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(text: &str) -> Config {
        Config::from_toml(text).expect("valid config")
    }

    #[test]
    fn a_changed_url_is_listed_with_its_password_masked() {
        let old = config("[sink]\nkind = \"nats\"\nurl = \"nats://app:hunter2@127.0.0.1:4222\"\n");
        let new = config("[sink]\nkind = \"nats\"\nurl = \"nats://app:hunter2@127.0.0.2:4222\"\n");
        let found = changes(&old, &new, &BTreeMap::new(), &BTreeMap::new()).expect("diff");
        assert_eq!(found.len(), 1, "{found:?}");
        let line = found[0].to_string();
        assert!(line.starts_with("sink.url: "), "{line}");
        assert!(line.contains("127.0.0.2") && line.contains("***"), "{line}");
        assert!(!line.contains("hunter2"), "{line}");
    }

    #[test]
    fn a_changed_secret_alone_is_listed_as_masks() {
        let text = |pw: &str| {
            format!("[sink]\nkind = \"nats\"\nurl = \"nats://app:{pw}@127.0.0.1:4222\"\n")
        };
        let (old, new) = (config(&text("hunter2")), config(&text("swordfish")));
        let raw = |pw: &str| {
            let mut out = BTreeMap::new();
            flatten(
                "",
                &toml::Value::Table(text(pw).parse().expect("toml")),
                &mut out,
            );
            out
        };
        let found = changes(&old, &new, &raw("hunter2"), &raw("swordfish")).expect("diff");
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].to_string(), "sink.url: *** → ***");
    }

    #[test]
    fn a_new_subscription_is_keyed_by_its_name() {
        let base = "[sinks.a]\nkind = \"stdout\"\n[[subscription]]\nname = \"all\"\nsink = \"a\"\n";
        let old = config(base);
        let new = config(&format!(
            "{base}[[subscription]]\nname = \"paid\"\nsink = \"a\"\nevent_type = \"*.paid\"\n"
        ));
        let found = changes(&old, &new, &BTreeMap::new(), &BTreeMap::new()).expect("diff");
        let keys: Vec<&str> = found.iter().map(|c| c.key.as_str()).collect();
        assert!(keys.contains(&"subscription[paid].event_type"), "{keys:?}");
        assert!(
            keys.iter().all(|k| !k.starts_with("subscription[all]")),
            "{keys:?}"
        );
        assert!(found.iter().all(|c| c.old.is_none()), "{found:?}");
    }

    #[test]
    fn the_database_and_the_listener_need_a_restart_and_the_sink_does_not() {
        assert!(needs_restart("source.url"));
        assert!(needs_restart("metrics.listen"));
        assert!(needs_restart("ui.allow_actions"));
        assert!(!needs_restart("sink.url"));
        assert!(!needs_restart("relay.batch_size"));
        assert!(!needs_restart("tracing.log_level"));
    }
}
