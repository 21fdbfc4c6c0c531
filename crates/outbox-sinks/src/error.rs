//! [`ConfigError`]: why a sink configuration was refused, naming the key.

/// A sink configuration value that [`validate`](crate::NatsConfig::validate) refused.
///
/// Displays as `sink.<key>: <message>`, e.g. `sink.url: must use http or https`, so that a
/// user sees at once which line of the config file to fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("sink.{key}: {message}")]
pub struct ConfigError {
    key: String,
    message: String,
}

impl ConfigError {
    /// A refusal of the value at `key` (relative to the `[sink]` table).
    pub fn new(key: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            key: key.into(),
            message: message.into(),
        }
    }

    /// The offending key, relative to the `[sink]` table (`url`, `headers.x-tenant`, ...).
    pub fn key(&self) -> &str {
        &self.key
    }

    /// Why the value was refused.
    pub fn message(&self) -> &str {
        &self.message
    }
}

/// Test support: parses each `(table, expected)` of `cases` as a `C` (a `[sink]` table in
/// TOML) and asserts that `validate` refuses it with an error starting with `expected`;
/// returns the errors as text, for further checks.
#[cfg(test)]
pub(crate) fn assert_refusals<C: serde::de::DeserializeOwned>(
    cases: &[(&str, &str)],
    validate: impl Fn(&C) -> Result<(), ConfigError>,
) -> Vec<String> {
    let mut errors = Vec::with_capacity(cases.len());
    for (text, expected) in cases {
        let config: C = toml::from_str(text).expect("parses");
        let err = validate(&config).expect_err(text).to_string();
        assert!(err.starts_with(expected), "{text}: {err}");
        errors.push(err);
    }
    errors
}

/// Test support: asserts that `text` does not parse as a `C` and that the error says
/// `expected` (an unknown key, say).
#[cfg(test)]
pub(crate) fn assert_unparsable<C: serde::de::DeserializeOwned + std::fmt::Debug>(
    text: &str,
    expected: &str,
) {
    let err = toml::from_str::<C>(text).expect_err(text).to_string();
    assert!(err.contains(expected), "{text}: {err}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn displays_the_full_key_path() {
        let e = ConfigError::new("url", "must not be empty");
        assert_eq!(e.to_string(), "sink.url: must not be empty");
        assert_eq!(e.key(), "url");
    }
}
