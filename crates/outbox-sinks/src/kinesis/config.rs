//! [`KinesisConfig`]: the `[sink]` table for `kind = "kinesis"`.

use outbox_core::SinkError;

use super::KinesisSink;
use crate::ConfigError;

/// Kinesis' record size limit: 1 MiB (data plus partition key).
pub const KINESIS_MAX_RECORD_SIZE: usize = 1024 * 1024;

crate::aws::aws_sink_config! {
    /// Settings of the Amazon Kinesis Data Streams sink.
    ///
    /// ```toml
    /// [sink]
    /// kind = "kinesis"
    /// stream = "orders"
    /// region = "eu-west-1"                 # default: from the environment or profile
    /// # endpoint_url = "http://127.0.0.1:5000"   # a local server (moto, LocalStack)
    /// ```
    ///
    /// Credentials come from the standard AWS chain (environment, shared profile, web
    /// identity, ECS/EC2 metadata); none are configured here.
    pub struct KinesisConfig {
        /// The stream name. May use `{aggregate_type}`, `{event_type}` and `{aggregate_id}`;
        /// each rendered name must be a legal stream name (1 to 128 of `A-Za-z0-9_.-`).
        stream,
        service: "Kinesis",
        max_message_size: KINESIS_MAX_RECORD_SIZE, at most KINESIS_MAX_RECORD_SIZE,
        /// Largest record (payload plus partition key) to send, in bytes; larger events are
        /// dead-lettered with their size. Default and most 1048576 (1 MiB).
    }
}

impl KinesisConfig {
    /// Checks every value without touching the network; the error names the key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let Some(stream) = &self.stream else {
            return Err(ConfigError::new(
                "stream",
                "is required (the name of the Kinesis data stream)",
            ));
        };
        let sample = stream.render(&crate::broker::sample_event("Order", "o_1", "order.placed"));
        stream_name(&sample).map_err(|e| ConfigError::new("stream", e))?;
        crate::cloudevents::refuse_binary(self.format, "Kinesis records have none")?;
        self.validate_shared()
    }

    /// Validates, loads the AWS configuration and builds the sink. No request is made: the
    /// relay's healthcheck finds a missing stream or refused credentials.
    pub async fn build(self) -> Result<KinesisSink, SinkError> {
        self.validate()
            .map_err(|e| SinkError::rejected(e.to_string()))?;
        KinesisSink::new(self).await
    }
}

/// `name` when it is a legal stream name (1 to 128 of `A-Za-z0-9_.-`), else why not.
pub(crate) fn stream_name(name: &str) -> Result<&str, String> {
    if name.is_empty()
        || name.len() > 128
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
    {
        return Err(format!(
            "`{name}` is not a legal Kinesis stream name (1 to 128 letters, digits, `_`, `.` \
             and `-`)"
        ));
    }
    Ok(name)
}

crate::build_sink!(KinesisConfig, "kinesis", |c, event| {
    match &c.stream {
        Some(stream) => format!("Kinesis stream {}", stream.render(event)),
        None => "Kinesis (no stream)".to_owned(),
    }
}, message_limit: |c| c.max_message_size, read_back: super::readback::read_back);

#[cfg(test)]
mod tests {
    use super::*;

    fn config(toml_text: &str) -> Result<KinesisConfig, String> {
        let config: KinesisConfig = toml::from_str(toml_text).map_err(|e| e.to_string())?;
        config.validate().map_err(|e| e.to_string())?;
        Ok(config)
    }

    #[test]
    fn a_stream_is_required_and_checked() {
        let err = config("").expect_err("no stream");
        assert!(err.starts_with("sink.stream: is required"), "{err}");
        let err = config(r#"stream = "orders/x""#).expect_err("slash");
        assert!(err.contains("not a legal Kinesis stream name"), "{err}");
        assert!(config(r#"stream = "outbox.{aggregate_type}""#).is_ok());
        let err = config("stream = \"s\"\nmax_message_size = 2000000").expect_err("size");
        assert!(err.starts_with("sink.max_message_size:"), "{err}");
        let err = config("stream = \"s\"\nshards = 2").expect_err("unknown");
        assert!(err.contains("unknown field `shards`"), "{err}");
    }
}
