//! [`StdoutConfig`] and [`FileConfig`]: the `[sink]` tables for `kind = "stdout"` and
//! `kind = "file"`.

use std::path::PathBuf;

use outbox_core::cloudevents::{Format, MessageFormat};
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
#[derive(Debug, Clone, PartialEq, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct StdoutConfig {
    /// Template of the `destination` field of each line; may use `{aggregate_type}`,
    /// `{event_type}` and `{aggregate_id}`. Default `outbox.event.{aggregate_type}`.
    pub destination: Destination,
    /// The message format: `plain` (the line above, the default) or `cloudevents-structured` (each
    /// line is the event's CloudEvents JSON envelope); `cloudevents-binary` is refused, a line
    /// has no message headers (`docs/sinks.md`, "CloudEvents").
    pub format: Format,
    /// CloudEvents `source`, a template with `{aggregate_type}`, `{event_type}` and
    /// `{aggregate_id}`. Default `urn:outbox:{aggregate_type}`. Only used by the
    /// CloudEvents formats.
    pub cloudevents_source: String,
    /// CloudEvents `datacontenttype` of an event without a `content-type` header. Default
    /// `application/json`. Only used by the CloudEvents formats.
    pub cloudevents_content_type: String,
}

impl Default for StdoutConfig {
    fn default() -> Self {
        Self {
            destination: Destination::default(),
            format: Format::Plain,
            cloudevents_source: crate::cloudevents::default_source(),
            cloudevents_content_type: crate::cloudevents::default_content_type(),
        }
    }
}

impl StdoutConfig {
    /// Checks the values; the error names the key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        message_format(
            self.format,
            &self.cloudevents_source,
            &self.cloudevents_content_type,
        )
        .map(drop)
    }

    /// Builds the sink.
    pub async fn build(self) -> Result<StdoutSink, SinkError> {
        let format = message_format(
            self.format,
            &self.cloudevents_source,
            &self.cloudevents_content_type,
        )
        .map_err(|e| SinkError::rejected(e.to_string()))?;
        Ok(StdoutSink::new(self.destination).with_format(format))
    }
}

/// The checked format keys of a JSON-lines sink: the binary mode needs message headers,
/// which a line does not have.
fn message_format(
    format: Format,
    source: &str,
    content_type: &str,
) -> Result<MessageFormat, ConfigError> {
    crate::cloudevents::refuse_binary(format, "a JSON line has no message headers")?;
    crate::cloudevents::message_format(format, source, content_type)
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
    /// The message format: `plain` (the line above, the default) or `cloudevents-structured` (each
    /// line is the event's CloudEvents JSON envelope); `cloudevents-binary` is refused, a line
    /// has no message headers (`docs/sinks.md`, "CloudEvents").
    pub format: Format,
    /// CloudEvents `source`, a template with `{aggregate_type}`, `{event_type}` and
    /// `{aggregate_id}`. Default `urn:outbox:{aggregate_type}`. Only used by the
    /// CloudEvents formats.
    pub cloudevents_source: String,
    /// CloudEvents `datacontenttype` of an event without a `content-type` header. Default
    /// `application/json`. Only used by the CloudEvents formats.
    pub cloudevents_content_type: String,
}

impl Default for FileConfig {
    fn default() -> Self {
        Self {
            path: PathBuf::new(),
            destination: Destination::default(),
            sync: true,
            format: Format::Plain,
            cloudevents_source: crate::cloudevents::default_source(),
            cloudevents_content_type: crate::cloudevents::default_content_type(),
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
        message_format(
            self.format,
            &self.cloudevents_source,
            &self.cloudevents_content_type,
        )
        .map(drop)
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
    fn json_lines_take_the_structured_format_but_not_the_binary_one() {
        let config: StdoutConfig =
            toml::from_str("format = \"cloudevents-structured\"").expect("parses");
        assert_eq!(config.validate(), Ok(()));
        let config: StdoutConfig =
            toml::from_str("format = \"cloudevents-binary\"").expect("parses");
        let err = config.validate().expect_err("no headers").to_string();
        assert!(
            err.starts_with("sink.format: `cloudevents-binary`") && err.contains("structured"),
            "{err}"
        );
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
