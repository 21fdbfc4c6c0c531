//! [`SqsConfig`]: the `[sink]` table for `kind = "sqs"`.

use outbox_core::SinkError;

use super::SqsSink;
use crate::ConfigError;
use crate::secret::redact_url;

/// SQS' message size limit for most of its history and SNS' today: 256 KiB.
pub const DEFAULT_MAX_MESSAGE_SIZE: usize = 256 * 1024;
/// The largest message SQS accepts since August 2025: 1 MiB.
pub const SQS_MAX_MESSAGE_SIZE: usize = 1024 * 1024;

crate::aws::aws_sink_config! {
    /// Settings of the Amazon SQS sink.
    ///
    /// ```toml
    /// [sink]
    /// kind = "sqs"
    /// queue_url = "https://sqs.eu-west-1.amazonaws.com/123456789012/orders.fifo"
    /// region = "eu-west-1"                 # default: from the environment or profile
    /// # endpoint_url = "http://127.0.0.1:5000"   # a local server (moto, LocalStack)
    /// ```
    ///
    /// Credentials come from the standard AWS chain (environment, shared profile, web
    /// identity, ECS/EC2 metadata); none are configured here.
    pub struct SqsConfig {
        /// The queue URL. May use `{aggregate_type}`, `{event_type}` and `{aggregate_id}` (for
        /// a queue per type, say); each rendered URL's last segment must be a legal queue
        /// name. A name ending in `.fifo` is a FIFO queue: `MessageGroupId` is derived from
        /// `aggregate_id` and `MessageDeduplicationId` is the event id.
        queue_url,
        service: "SQS",
        max_message_size: DEFAULT_MAX_MESSAGE_SIZE, at most SQS_MAX_MESSAGE_SIZE,
        /// Largest message (body plus attribute names, types and values) to send, in bytes;
        /// larger events are dead-lettered with their size. Default 262144 (256 KiB); SQS
        /// accepts up to 1048576 (1 MiB) since 2025, older tooling and SNS do not.
    }
}

impl SqsConfig {
    /// Checks every value without touching the network; the error names the key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let Some(queue_url) = &self.queue_url else {
            return Err(ConfigError::new(
                "queue_url",
                "is required (the URL of the queue, e.g. \
                 https://sqs.eu-west-1.amazonaws.com/123456789012/orders.fifo)",
            ));
        };
        // Placeholders may render to anything: check what the literal parts make of a
        // sample that is legal in a queue name.
        let sample = queue_url.render(&crate::broker::sample_event("Order", "o_1", "order_placed"));
        queue_name(&sample).map_err(|e| ConfigError::new("queue_url", e))?;
        self.validate_shared()
    }

    /// Validates, loads the AWS configuration and builds the sink. No request is made: the
    /// relay's healthcheck finds a missing queue or refused credentials.
    pub async fn build(self) -> Result<SqsSink, SinkError> {
        self.validate()
            .map_err(|e| SinkError::rejected(e.to_string()))?;
        SqsSink::new(self).await
    }
}

/// The queue name of a queue URL (its last path segment), or why it is not a legal one: 1 to
/// 80 of `A-Za-z0-9_-`, plus `.fifo` for a FIFO queue.
pub(crate) fn queue_name(url: &str) -> Result<&str, String> {
    let shown = redact_url(url);
    if !(url.starts_with("https://") || url.starts_with("http://")) {
        return Err(format!(
            "`{shown}` is not a queue URL (it must start with https://)"
        ));
    }
    let authority = url.split("://").nth(1).unwrap_or("").split('/').next();
    if authority.is_some_and(|a| a.contains('@')) {
        return Err(format!(
            "`{shown}` must not carry a user or password (requests are signed with the keys \
             of the standard AWS credential chain)"
        ));
    }
    let name = url.trim_end_matches('/').rsplit('/').next().unwrap_or("");
    let base = name.strip_suffix(".fifo").unwrap_or(name);
    if name.len() > 80
        || base.is_empty()
        || !base
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    {
        return Err(format!(
            "`{name}` in `{shown}` is not a legal SQS queue name (1 to 80 letters, digits, `-` \
             and `_`, and `.fifo` at the end of a FIFO queue's name)"
        ));
    }
    Ok(name)
}

crate::build_sink!(SqsConfig, "sqs", |c, event| {
    match &c.queue_url {
        Some(url) => format!("SQS queue {}", redact_url(&url.render(event))),
        None => "SQS (no queue_url)".to_owned(),
    }
}, message_limit: |c| c.max_message_size);

#[cfg(test)]
mod tests {
    use super::*;

    fn config(toml_text: &str) -> Result<SqsConfig, String> {
        let config: SqsConfig = toml::from_str(toml_text).map_err(|e| e.to_string())?;
        config.validate().map_err(|e| e.to_string())?;
        Ok(config)
    }

    #[test]
    fn a_queue_url_is_required_and_checked() {
        let err = config("").expect_err("no queue_url");
        assert!(err.starts_with("sink.queue_url: is required"), "{err}");
        let err = config(r#"queue_url = "orders""#).expect_err("not a URL");
        assert!(
            err.contains("sink.queue_url") && err.contains("https://"),
            "{err}"
        );
        let err = config(r#"queue_url = "https://a:pw@sqs.x/1/orders""#).expect_err("password");
        assert!(
            err.contains("must not carry a user or password") && !err.contains("pw@"),
            "{err}"
        );
        let err = config(r#"queue_url = "https://sqs.x/1/or.ders""#).expect_err("dot");
        assert!(err.contains("not a legal SQS queue name"), "{err}");
        let ok = config(
            r#"queue_url = "https://sqs.eu-west-1.amazonaws.com/1/orders-{aggregate_type}.fifo""#,
        );
        assert!(ok.is_ok(), "{ok:?}");
    }

    #[test]
    fn unknown_keys_and_bad_values_name_the_key() {
        let err = config("queue_url = \"https://q/1/a\"\nqueue = \"x\"").expect_err("unknown");
        assert!(err.contains("unknown field `queue`"), "{err}");
        let err =
            config("queue_url = \"https://q/1/a\"\nregion = \"eu west\"").expect_err("region");
        assert!(err.starts_with("sink.region:"), "{err}");
        let err = config("queue_url = \"https://q/1/a\"\nendpoint_url = \"127.0.0.1:5000\"")
            .expect_err("ep");
        assert!(err.starts_with("sink.endpoint_url:"), "{err}");
        let err =
            config("queue_url = \"https://q/1/a\"\nmax_message_size = 2000000").expect_err("size");
        assert!(err.starts_with("sink.max_message_size:"), "{err}");
    }

    #[test]
    fn debug_masks_credentials_in_the_endpoint() {
        let config = SqsConfig {
            endpoint_url: Some("http://user:s3cr3t@127.0.0.1:5000".into()),
            ..SqsConfig::default()
        };
        let shown = format!("{config:?}");
        assert!(!shown.contains("s3cr3t"), "{shown}");
    }
}
