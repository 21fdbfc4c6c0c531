//! `[[subscription]]`: the entries, their filters, and how each resolves to its sink and table
//! (docs/subscriptions.md). The fan-out that runs them is [`crate::subscription`].

use std::collections::{BTreeMap, HashSet};

use outbox_core::{Destination, Event};
use serde::{Deserialize, Serialize};

use crate::registry::{SinkConfig, SourceConfig};

/// One `[[subscription]]` entry.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SubscriptionConfig {
    /// Its name: lowercase letters, digits and `_`, at most 20 bytes. Names its table
    /// (`<table>_sub_<name>`), its metrics label and its `--subscription` selector.
    pub name: String,
    /// The `[sinks.NAME]` it publishes to.
    pub sink: String,
    /// Only events whose `event_type` matches one of these globs (`*`, `?`); unset: all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event_type: Option<Patterns>,
    /// Only events whose `aggregate_type` matches one of these globs; unset: all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aggregate_type: Option<Patterns>,
    /// Replaces the sink's destination template for this subscription.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub destination: Option<String>,
}

/// One glob or a list of globs.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(untagged)]
pub enum Patterns {
    /// `event_type = "order.*"`.
    One(String),
    /// `event_type = ["order.placed", "order.paid"]`.
    Many(Vec<String>),
}

impl Patterns {
    fn list(&self) -> Vec<String> {
        match self {
            Self::One(p) => vec![p.clone()],
            Self::Many(ps) => ps.clone(),
        }
    }
}

/// The longest subscription name (its table name must stay an identifier).
const MAX_NAME: usize = 20;

/// Which events a subscription takes. Its JSON form (`{"event_type":["order.*"],
/// "aggregate_type":null}`) is what the subscription catalog stores.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Filter {
    event_type: Option<Vec<String>>,
    aggregate_type: Option<Vec<String>>,
}

impl Filter {
    /// Whether `event` passes. Canary probes pass only a filter that asks for them
    /// ([`Filter::asks_for_probes`]).
    pub fn matches(&self, event: &Event) -> bool {
        if event.aggregate_type == outbox_core::canary::AGGREGATE_TYPE && !self.asks_for_probes() {
            return false;
        }
        let any = |patterns: &Option<Vec<String>>, text: &str| match patterns {
            None => true,
            Some(ps) => ps.iter().any(|p| glob(p.as_bytes(), text.as_bytes())),
        };
        any(&self.event_type, &event.event_type) && any(&self.aggregate_type, &event.aggregate_type)
    }
}

impl Filter {
    /// The filter as the catalog stores it (JSON text).
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|_| "{}".to_owned())
    }

    /// Reads a filter stored by [`Filter::to_json`].
    pub fn from_json(text: &str) -> Result<Self, String> {
        serde_json::from_str(text).map_err(|e| format!("unreadable filter `{text}`: {e}"))
    }

    /// The `event_type` globs; `None`: every event type.
    pub fn event_types(&self) -> Option<&[String]> {
        self.event_type.as_deref()
    }

    /// The `aggregate_type` globs; `None`: every aggregate type.
    pub fn aggregate_types(&self) -> Option<&[String]> {
        self.aggregate_type.as_deref()
    }

    /// Whether the subscription takes canary probes: its `aggregate_type` names
    /// `outbox.canary` exactly.
    pub fn asks_for_probes(&self) -> bool {
        outbox_core::canary::asked_for(self.aggregate_type.as_deref())
    }
}

/// `*` matches any run of bytes, `?` one byte, anything else itself.
fn glob(pattern: &[u8], text: &[u8]) -> bool {
    let (mut p, mut t) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        match pattern.get(p) {
            Some(b'*') => {
                star = Some((p, t));
                p += 1;
            }
            Some(&c) if c == b'?' || c == text[t] => {
                p += 1;
                t += 1;
            }
            _ => match star {
                Some((sp, st)) => {
                    p = sp + 1;
                    t = st + 1;
                    star = Some((sp, st + 1));
                }
                None => return false,
            },
        }
    }
    pattern[p..].iter().all(|&c| c == b'*')
}

/// One subscription, resolved: its filter, its sink (destination applied) and its table.
#[derive(Debug, Clone)]
pub struct Resolved {
    /// The subscription's name.
    pub name: String,
    /// Which events it takes.
    pub filter: Filter,
    /// Its sink, with the subscription's destination.
    pub sink: SinkConfig,
    /// Its table, as a source.
    pub source: SourceConfig,
}

/// Checks `[sinks.*]` and `[[subscription]]` and resolves each subscription; errors name
/// the key (`subscription[1].sink: ...`).
pub fn resolve(
    source: &SourceConfig,
    sinks: &BTreeMap<String, SinkConfig>,
    subscriptions: &[SubscriptionConfig],
) -> Result<Vec<Resolved>, String> {
    for (name, sink) in sinks {
        sink.validate()
            .map_err(|e| format!("sinks.{name}: {}", e.strip_prefix("sink.").unwrap_or(&e)))?;
    }
    if subscriptions.is_empty() {
        if let Some(name) = sinks.keys().next() {
            return Err(format!(
                "sinks.{name}: named sinks are used by [[subscription]] entries, and there are none; add one (name, sink = \"{name}\") or use [sink]"
            ));
        }
        return Ok(Vec::new());
    }
    let mut seen = HashSet::new();
    let mut out = Vec::with_capacity(subscriptions.len());
    for (i, sub) in subscriptions.iter().enumerate() {
        let key = format!("subscription[{i}]");
        let name = &sub.name;
        if name.is_empty()
            || name.len() > MAX_NAME
            || !name.starts_with(|c: char| c.is_ascii_lowercase())
            || !name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        {
            return Err(format!(
                "{key}.name: `{name}` must start with a lowercase letter and use lowercase letters, digits and `_` only, at most {MAX_NAME} bytes"
            ));
        }
        if !seen.insert(name.clone()) {
            return Err(format!(
                "{key}.name: `{name}` is used by two subscriptions; names must be unique"
            ));
        }
        let Some(sink) = sinks.get(&sub.sink) else {
            let known: Vec<&str> = sinks.keys().map(String::as_str).collect();
            return Err(format!(
                "{key}.sink: no [sinks.{}] (named sinks: {})",
                sub.sink,
                if known.is_empty() {
                    "none".to_owned()
                } else {
                    known.join(", ")
                }
            ));
        };
        let mut sink = sink.clone();
        if let Some(template) = &sub.destination {
            let d = Destination::parse(template).map_err(|e| format!("{key}.destination: {e}"))?;
            sink.set_destination(d)
                .map_err(|e| format!("{key}.destination: {e}"))?;
        }
        let patterns = |field: &str, p: &Option<Patterns>| -> Result<Option<Vec<String>>, String> {
            let Some(p) = p else { return Ok(None) };
            let list = p.list();
            if list.is_empty() {
                return Err(format!(
                    "{key}.{field}: an empty list matches no event; leave {field} out to take every event"
                ));
            }
            if let Some(bad) = list.iter().find(|p| p.trim().is_empty()) {
                return Err(format!(
                    "{key}.{field}: `{bad}` matches no event (an empty pattern)"
                ));
            }
            Ok(Some(list))
        };
        let filter = Filter {
            event_type: patterns("event_type", &sub.event_type)?,
            aggregate_type: patterns("aggregate_type", &sub.aggregate_type)?,
        };
        let source = source
            .for_subscription(name)
            .map_err(|e| format!("{key}.name: {e}"))?;
        out.push(Resolved {
            name: name.clone(),
            filter,
            sink,
            source,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_match_like_shell_patterns() {
        let g = |p: &str, t: &str| glob(p.as_bytes(), t.as_bytes());
        assert!(g("order.*", "order.placed"));
        assert!(g("order.*", "order."));
        assert!(!g("order.*", "orders.placed"));
        assert!(g("*.paid", "invoice.paid"));
        assert!(!g("*.paid", "invoice.paid.late"));
        assert!(g("a*b*c", "aXXbYYc"));
        assert!(!g("a*b*c", "aXXbYY"));
        assert!(g("?rder", "order"));
        assert!(!g("?rder", "rder"));
        assert!(g("*", ""));
        assert!(g("exact", "exact"));
        assert!(!g("exact", "exactly"));
    }

    fn event_of(aggregate_type: &str) -> Event {
        Event {
            id: uuid::Uuid::new_v4(),
            position: outbox_core::Position(1),
            aggregate_type: aggregate_type.to_owned(),
            aggregate_id: "a".into(),
            event_type: "t".into(),
            payload: Default::default(),
            headers: Vec::new(),
            created_at: time::OffsetDateTime::UNIX_EPOCH,
            attempts: 0,
        }
    }

    #[test]
    fn canary_probes_reach_only_subscriptions_that_name_them() {
        let probe = event_of(outbox_core::canary::AGGREGATE_TYPE);
        let all = Filter::default();
        assert!(all.matches(&event_of("Order")));
        assert!(!all.matches(&probe), "no filter: every event but probes");
        let star = Filter {
            event_type: None,
            aggregate_type: Some(vec!["*".into()]),
        };
        assert!(!star.matches(&probe), "`*` does not ask for probes");
        let asks = Filter {
            event_type: None,
            aggregate_type: Some(vec!["Order".into(), "outbox.canary".into()]),
        };
        assert!(asks.asks_for_probes());
        assert!(asks.matches(&probe));
        assert!(asks.matches(&event_of("Order")));
    }
}
