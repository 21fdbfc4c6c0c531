//! [`SnsConfig`]: the `[sink]` table for `kind = "sns"`.

use outbox_core::SinkError;

use super::SnsSink;
use crate::ConfigError;

/// SNS' message size limit: 256 KiB (body plus attributes).
pub const SNS_MAX_MESSAGE_SIZE: usize = 256 * 1024;

crate::aws::aws_sink_config! {
    /// Settings of the Amazon SNS sink.
    ///
    /// ```toml
    /// [sink]
    /// kind = "sns"
    /// topic_arn = "arn:aws:sns:eu-west-1:123456789012:orders.fifo"
    /// region = "eu-west-1"                 # default: from the environment or profile
    /// # endpoint_url = "http://127.0.0.1:5000"   # a local server (moto, LocalStack)
    /// ```
    ///
    /// Credentials come from the standard AWS chain (environment, shared profile, web
    /// identity, ECS/EC2 metadata); none are configured here.
    pub struct SnsConfig {
        /// The topic ARN. May use `{aggregate_type}`, `{event_type}` and `{aggregate_id}`;
        /// each rendered ARN must end in a legal topic name. A name ending in `.fifo` is a
        /// FIFO topic: `MessageGroupId` is derived from `aggregate_id` and
        /// `MessageDeduplicationId` is the event id.
        topic_arn,
        service: "SNS",
        max_message_size: SNS_MAX_MESSAGE_SIZE, at most SNS_MAX_MESSAGE_SIZE,
        /// Largest message (body plus attribute names, types and values) to send, in bytes;
        /// larger events are dead-lettered with their size. Default and most 262144 (256 KiB).
    }
}

impl SnsConfig {
    /// Checks every value without touching the network; the error names the key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let Some(topic_arn) = &self.topic_arn else {
            return Err(ConfigError::new(
                "topic_arn",
                "is required (the ARN of the topic, e.g. \
                 arn:aws:sns:eu-west-1:123456789012:orders.fifo)",
            ));
        };
        // Placeholders may render to anything: check what the literal parts make of a
        // sample that is legal in a topic name.
        let sample = topic_arn.render(&crate::broker::sample_event("Order", "o_1", "order_placed"));
        topic_name(&sample).map_err(|e| ConfigError::new("topic_arn", e))?;
        self.validate_shared()
    }

    /// Validates, loads the AWS configuration and builds the sink. No request is made: the
    /// relay's healthcheck finds a missing topic or refused credentials.
    pub async fn build(self) -> Result<SnsSink, SinkError> {
        self.validate()
            .map_err(|e| SinkError::rejected(e.to_string()))?;
        SnsSink::new(self).await
    }
}

/// The topic name of a topic ARN (`arn:PARTITION:sns:REGION:ACCOUNT:NAME`), or why it is not
/// a legal one: 1 to 256 of `A-Za-z0-9_-`, the last five of them `.fifo` for a FIFO topic.
pub(crate) fn topic_name(arn: &str) -> Result<&str, String> {
    let parts: Vec<&str> = arn.splitn(6, ':').collect();
    let [prefix, _partition, service, _region, _account, name] = parts[..] else {
        return Err(format!(
            "`{arn}` is not a topic ARN (arn:aws:sns:REGION:ACCOUNT:NAME)"
        ));
    };
    if prefix != "arn" || service != "sns" {
        return Err(format!(
            "`{arn}` is not a topic ARN (arn:aws:sns:REGION:ACCOUNT:NAME)"
        ));
    }
    let base = name.strip_suffix(".fifo").unwrap_or(name);
    if name.len() > 256
        || base.is_empty()
        || !base
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    {
        return Err(format!(
            "`{name}` in `{arn}` is not a legal SNS topic name (1 to 256 letters, digits, `-` \
             and `_`, and `.fifo` at the end of a FIFO topic's name)"
        ));
    }
    Ok(name)
}

crate::build_sink!(SnsConfig, "sns", |c, event| {
    match &c.topic_arn {
        Some(arn) => format!("SNS topic {}", arn.render(event)),
        None => "SNS (no topic_arn)".to_owned(),
    }
}, message_limit: |c| c.max_message_size);

#[cfg(test)]
mod tests {
    use super::*;

    fn config(toml_text: &str) -> Result<SnsConfig, String> {
        let config: SnsConfig = toml::from_str(toml_text).map_err(|e| e.to_string())?;
        config.validate().map_err(|e| e.to_string())?;
        Ok(config)
    }

    #[test]
    fn a_topic_arn_is_required_and_checked() {
        let err = config("").expect_err("no topic_arn");
        assert!(err.starts_with("sink.topic_arn: is required"), "{err}");
        let err = config(r#"topic_arn = "orders""#).expect_err("not an ARN");
        assert!(err.contains("is not a topic ARN"), "{err}");
        let err = config(r#"topic_arn = "arn:aws:sqs:eu-west-1:1:orders""#).expect_err("sqs");
        assert!(err.contains("is not a topic ARN"), "{err}");
        let err = config(r#"topic_arn = "arn:aws:sns:eu-west-1:1:or.ders""#).expect_err("dot");
        assert!(err.contains("not a legal SNS topic name"), "{err}");
        let ok = config(r#"topic_arn = "arn:aws:sns:eu-west-1:1:orders-{aggregate_type}.fifo""#);
        assert!(ok.is_ok(), "{ok:?}");
    }

    #[test]
    fn bad_values_name_the_key() {
        let base = "topic_arn = \"arn:aws:sns:eu-west-1:1:t\"\n";
        let err = config(&format!("{base}topic = \"x\"")).expect_err("unknown");
        assert!(err.contains("unknown field `topic`"), "{err}");
        let err = config(&format!("{base}max_message_size = 300000")).expect_err("size");
        assert!(err.starts_with("sink.max_message_size:"), "{err}");
        let err = config(&format!("{base}timeout = \"0s\"")).expect_err("timeout");
        assert!(err.starts_with("sink.timeout:"), "{err}");
    }
}
