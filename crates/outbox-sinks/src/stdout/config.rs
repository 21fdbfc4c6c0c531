//! [`StdoutConfig`] and [`FileConfig`]: the `[sink]` tables for `kind = "stdout"` and
//! `kind = "file"`.

use std::path::PathBuf;

use outbox_core::{Destination, SinkError};
use serde::Deserialize;

use super::{FileSink, StdoutSink};
use crate::ConfigError;

/// Settings of the stdout sink: one JSON line per event on standard output.
///
/// ```toml
/// [sink]
/// kind = "stdout"
/// destination = "outbox.event.{aggregate_type}"
/// ```
#[derive(Debug, Clone, PartialEq, Default, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct StdoutConfig {
    /// Template of the `destination` field of each line; may use `{aggregate_type}`,
    /// `{event_type}` and `{aggregate_id}`. Default `outbox.event.{aggregate_type}`.
    pub destination: Destination,
}

impl StdoutConfig {
    /// Checks the values (nothing can be wrong once the template parsed).
    pub fn validate(&self) -> Result<(), ConfigError> {
        Ok(())
    }

    /// Builds the sink.
    pub async fn build(self) -> Result<StdoutSink, SinkError> {
        self.validate()
            .map_err(|e| SinkError::rejected(e.to_string()))?;
        Ok(StdoutSink::new(self.destination))
    }
}

/// Settings of the file sink: one JSON line per event, appended to a file.
///
/// ```toml
/// [sink]
/// kind = "file"
/// path = "/var/lib/outbox/events.jsonl"
/// sync = true
/// ```
#[derive(Debug, Clone, PartialEq, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct FileConfig {
    /// File to append to; created if missing. Its directory must exist (it is not created,
    /// so a typo in the path is an error rather than a new directory tree). Required.
    pub path: PathBuf,
    /// Template of the `destination` field of each line; may use `{aggregate_type}`,
    /// `{event_type}` and `{aggregate_id}`. Default `outbox.event.{aggregate_type}`.
    pub destination: Destination,
    /// `fsync` the file after each batch, before reporting the batch delivered. Without it
    /// a power loss can lose events that were already marked delivered. Default `true`.
    pub sync: bool,
}

impl Default for FileConfig {
    fn default() -> Self {
        Self {
            path: PathBuf::new(),
            destination: Destination::default(),
            sync: true,
        }
    }
}

impl FileConfig {
    /// Checks the values without touching the file system; the error names the key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.path.as_os_str().is_empty() {
            return Err(ConfigError::new(
                "path",
                "must be set (e.g. `events.jsonl`)",
            ));
        }
        Ok(())
    }

    /// Validates and opens the file for appending. A missing directory or a path that
    /// cannot be opened is [`Rejected`](outbox_core::SinkErrorKind::Rejected), with the path
    /// in the message.
    pub async fn build(self) -> Result<FileSink, SinkError> {
        self.validate()
            .map_err(|e| SinkError::rejected(e.to_string()))?;
        FileSink::open(self).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stdout_defaults_and_unknown_keys() {
        let config: StdoutConfig = toml::from_str("").expect("defaults");
        assert_eq!(config.destination, Destination::default());
        assert_eq!(config.validate(), Ok(()));
        let err = toml::from_str::<StdoutConfig>("path = \"x\"").expect_err("unknown key");
        assert!(err.to_string().contains("unknown field `path`"), "{err}");
    }

    #[test]
    fn file_needs_a_path_and_syncs_by_default() {
        let config: FileConfig = toml::from_str("").expect("defaults");
        assert!(config.sync);
        assert_eq!(
            config.validate().map_err(|e| e.to_string()),
            Err("sink.path: must be set (e.g. `events.jsonl`)".to_owned())
        );
        let config: FileConfig = toml::from_str(
            "path = \"out/events.jsonl\"\nsync = false\ndestination = \"x.{event_type}\"",
        )
        .expect("parses");
        assert_eq!(config.validate(), Ok(()));
        assert!(!config.sync);
        let err =
            toml::from_str::<FileConfig>("path = \"x\"\nfsync = true").expect_err("unknown key");
        assert!(err.to_string().contains("unknown field `fsync`"), "{err}");
    }

    /// The binary owns the `kind` tag; this is the shape it is expected to use, and it must
    /// keep unknown keys an error.
    #[test]
    fn configs_work_inside_an_internally_tagged_enum() {
        #[derive(Debug, Deserialize)]
        #[serde(tag = "kind", rename_all = "lowercase")]
        enum AnySink {
            Stdout(StdoutConfig),
            File(FileConfig),
        }
        let sink: AnySink = toml::from_str("kind = \"file\"\npath = \"e.jsonl\"").expect("parses");
        assert!(matches!(sink, AnySink::File(FileConfig { sync: true, .. })));
        let sink: AnySink = toml::from_str("kind = \"stdout\"").expect("parses");
        assert!(matches!(sink, AnySink::Stdout(c) if c.destination == Destination::default()));
        let err = toml::from_str::<AnySink>("kind = \"stdout\"\nurl = \"x\"").expect_err("unknown");
        assert!(err.to_string().contains("unknown field `url`"), "{err}");
    }
}
