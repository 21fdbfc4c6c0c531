//! `[source]` settings for DynamoDB (`kind = "dynamodb"`), the contract's keys
//! (`docs/contract.md`, "Configuration words") plus the names a single-table design may choose.

use std::time::Duration;

use serde::Deserialize;

use crate::error::ConfigError;

/// DynamoDB source settings.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct DynamoDbConfig {
    /// The application's table, which holds the business items and the outbox items.
    pub table: String,
    /// AWS region; default: the standard chain's (`AWS_REGION`, profile).
    #[serde(default)]
    pub region: Option<String>,
    /// Another endpoint (a local server such as moto, a VPC endpoint): `http(s)://host:port`,
    /// no user or password. Default: AWS's own.
    #[serde(default)]
    pub endpoint_url: Option<String>,
    /// Name of the table's partition key attribute.
    #[serde(default = "default_partition_key")]
    pub partition_key: String,
    /// Name of the table's sort key attribute (a string: outbox items use `OUTBOX#<id>`).
    #[serde(default = "default_sort_key")]
    pub sort_key: String,
    /// The relay's own table for shard checkpoints and leases; default `<table>-outbox-leases`.
    #[serde(default)]
    pub lease_table: Option<String>,
    /// How long a relay's lease of a stream shard lasts without renewal: after a crash or a
    /// pause, another relay takes the shard over this long after the last renewal. A batch is
    /// published only while its shards' leases last, so this must exceed
    /// `relay.publish_timeout`.
    #[serde(default = "default_lease_duration", with = "humantime_serde")]
    pub lease_duration: Duration,
    /// How long an event waits for its predecessor (`seq - 1`) before it goes anyway, with an
    /// error in the log (`docs/dynamodb.md`, "Order").
    #[serde(default = "default_gap_timeout", with = "humantime_serde")]
    pub gap_timeout: Duration,
    /// How long to wait for a connection.
    #[serde(default = "default_connect_timeout", with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// Longest wait for one request's answer.
    #[serde(default = "default_timeout", with = "humantime_serde")]
    pub timeout: Duration,
}

/// The sort key prefix that marks an outbox item.
pub const OUTBOX_PREFIX: &str = "OUTBOX#";

fn default_partition_key() -> String {
    "pk".to_owned()
}
fn default_sort_key() -> String {
    "sk".to_owned()
}
fn default_lease_duration() -> Duration {
    Duration::from_secs(60)
}
fn default_gap_timeout() -> Duration {
    Duration::from_secs(60)
}
fn default_connect_timeout() -> Duration {
    Duration::from_secs(5)
}
fn default_timeout() -> Duration {
    Duration::from_secs(10)
}

impl DynamoDbConfig {
    /// Settings for `table` with every default.
    pub fn new(table: impl Into<String>) -> Self {
        Self {
            table: table.into(),
            region: None,
            endpoint_url: None,
            partition_key: default_partition_key(),
            sort_key: default_sort_key(),
            lease_table: None,
            lease_duration: default_lease_duration(),
            gap_timeout: default_gap_timeout(),
            connect_timeout: default_connect_timeout(),
            timeout: default_timeout(),
        }
    }

    /// The lease table's name.
    pub fn lease_table(&self) -> String {
        self.lease_table
            .clone()
            .unwrap_or_else(|| format!("{}-outbox-leases", self.table))
    }

    /// Checks every value; the error names the key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        table_name("table", &self.table)?;
        table_name("lease_table", &self.lease_table())?;
        if self.lease_table() == self.table {
            return Err(ConfigError::new(
                "lease_table",
                "must not be the application's table",
            ));
        }
        attribute_name("partition_key", &self.partition_key)?;
        attribute_name("sort_key", &self.sort_key)?;
        if self.partition_key == self.sort_key {
            return Err(ConfigError::new(
                "sort_key",
                "must differ from `partition_key`",
            ));
        }
        if let Some(region) = &self.region
            && (region.is_empty()
                || !region
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'))
        {
            return Err(ConfigError::new(
                "region",
                format!("`{region}` is not a region name (e.g. `us-east-1`)"),
            ));
        }
        if let Some(endpoint) = &self.endpoint_url {
            let url = url::Url::parse(endpoint)
                .map_err(|e| ConfigError::new("endpoint_url", format!("not a URL ({e})")))?;
            if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
                return Err(ConfigError::new(
                    "endpoint_url",
                    "must be http(s)://host[:port]",
                ));
            }
            if !url.username().is_empty() || url.password().is_some() {
                return Err(ConfigError::new(
                    "endpoint_url",
                    "must not carry a user or password: AWS credentials come from the standard chain",
                ));
            }
        }
        for (key, value) in [
            ("connect_timeout", self.connect_timeout),
            ("lease_duration", self.lease_duration),
            ("timeout", self.timeout),
        ] {
            if value.is_zero() {
                return Err(ConfigError::new(key, "must be more than zero"));
            }
        }
        Ok(())
    }
}

/// DynamoDB's rule for table names: 3 to 255 of `a-z A-Z 0-9 _ - .`.
fn table_name(key: &'static str, name: &str) -> Result<(), ConfigError> {
    checked_name(key, name, 3, "a DynamoDB table name")
}

/// An attribute name: 1 to 255 bytes, printable, no `#` or `:` (the expression placeholders
/// this crate uses never need them).
fn attribute_name(key: &'static str, name: &str) -> Result<(), ConfigError> {
    checked_name(key, name, 1, "an attribute name this relay accepts")
}

/// The one check behind [`table_name`] and [`attribute_name`]: `min` to 255 of
/// `a-z A-Z 0-9 _ - .`; the error says `name` is not `what`.
fn checked_name(key: &'static str, name: &str, min: usize, what: &str) -> Result<(), ConfigError> {
    let ok = (min..=255).contains(&name.len())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
    if ok {
        Ok(())
    } else {
        Err(ConfigError::new(
            key,
            format!("`{name}` is not {what} ({min} to 255 of a-z, A-Z, 0-9, `_`, `-`, `.`)"),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<DynamoDbConfig, String> {
        let config: DynamoDbConfig = toml::from_str(text).map_err(|e| e.to_string())?;
        config.validate().map_err(|e| e.to_string())?;
        Ok(config)
    }

    #[test]
    fn the_design_keys_parse_with_defaults_for_the_rest() {
        let c = parse(
            "table = \"app\"\nregion = \"us-east-1\"\nendpoint_url = \"http://127.0.0.1:5000\"\n",
        )
        .expect("valid");
        assert_eq!(c.partition_key, "pk");
        assert_eq!(c.sort_key, "sk");
        assert_eq!(c.lease_table(), "app-outbox-leases");
        assert_eq!(c.endpoint_url.as_deref(), Some("http://127.0.0.1:5000"));
    }

    #[test]
    fn bad_values_are_refused_naming_the_key() {
        for (text, key) in [
            ("table = \"a b\"", "table"),
            ("table = \"ab\"", "table"),
            ("table = \"app\"\nsort_key = \"pk\"", "sort_key"),
            ("table = \"app\"\npartition_key = \"p#k\"", "partition_key"),
            ("table = \"app\"\nregion = \"US East\"", "region"),
            (
                "table = \"app\"\nendpoint_url = \"ftp://x\"",
                "endpoint_url",
            ),
            (
                "table = \"app\"\nendpoint_url = \"http://u:pw@127.0.0.1:1\"",
                "endpoint_url",
            ),
            ("table = \"app\"\nlease_table = \"app\"", "lease_table"),
            ("table = \"app\"\ntimeout = \"0s\"", "timeout"),
        ] {
            let e = parse(text).expect_err(text);
            assert!(e.contains(key), "{text}: {e}");
        }
        let e = parse("table = \"app\"\nendpoint_url = \"http://u:pw@127.0.0.1:1\"")
            .expect_err("refused");
        assert!(!e.contains("pw"), "the password is not echoed: {e}");
        let e = parse("table = \"app\"\nstream = \"x\"").expect_err("unknown key");
        assert!(e.contains("stream"), "{e}");
    }
}
