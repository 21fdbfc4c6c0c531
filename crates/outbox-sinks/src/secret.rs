//! [`Secret`]: a configured string that never appears in `Debug` output or logs.

use std::fmt;

/// A secret config value (a signing key, a token). `Debug` prints `Secret("***")`, so a
/// config struct can derive `Debug` and be logged without leaking it.
#[derive(Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret value.
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The secret itself. Call only where it is used, never to print it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

/// Serialized as `***`: the effective config `outbox check-config` prints never shows it.
impl serde::Serialize for Secret {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str("***")
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(\"***\")")
    }
}

impl From<String> for Secret {
    fn from(value: String) -> Self {
        Self(value)
    }
}

impl From<&str> for Secret {
    fn from(value: &str) -> Self {
        Self(value.to_owned())
    }
}

/// The workspace's one redaction function (`outbox_core::redact::redact_url`).
#[cfg(any(feature = "redis", feature = "rabbitmq", feature = "aws"))]
pub(crate) use outbox_core::redact::redact_url;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_output_hides_the_value() {
        let s = Secret::new("whsec_hunter2");
        assert_eq!(format!("{s:?}"), "Secret(\"***\")");
        assert!(!format!("{:?}", Some(&s)).contains("hunter2"));
        assert_eq!(s.expose(), "whsec_hunter2");
    }

    #[cfg(any(feature = "redis", feature = "rabbitmq"))]
    #[test]
    fn passwords_in_urls_are_masked() {
        assert_eq!(
            redact_url("amqp://guest:s3cret@127.0.0.1:5672/%2f"),
            "amqp://guest:***@127.0.0.1:5672/%2f"
        );
        assert_eq!(
            redact_url("redis://:s3cret@h:6379/0"),
            "redis://:***@h:6379/0"
        );
        assert_eq!(redact_url("redis://h:6379"), "redis://h:6379");
        assert_eq!(redact_url("redis://user@h"), "redis://user@h");
        assert_eq!(redact_url("not a url"), "not a url");
        assert_eq!(redact_url("amqp://u:p@ss@h/v"), "amqp://u:***@h/v");
    }
}
