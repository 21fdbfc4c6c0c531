//! `outbox crash-test` on Kafka: one scratch topic named after the run's tag, created by the
//! sink on first use (`create_topics = true`) and deleted at the end.

use outbox_core::{Destination, Identifier, SinkError};
use rdkafka::admin::{AdminClient, AdminOptions};

use super::KafkaConfig;
use super::client::{KafkaContext, LastErrors};

/// `config` publishing to the topic `<tag>` (no placeholder: one topic to read back and to
/// delete), created on first use.
pub(super) fn scratch(config: &KafkaConfig, tag: &Identifier) -> Result<KafkaConfig, String> {
    let destination =
        Destination::parse(tag.as_str()).map_err(|e| format!("scratch destination: {e}"))?;
    let scratch = KafkaConfig {
        destination,
        create_topics: true,
        ..config.clone()
    };
    scratch.validate().map_err(|e| e.to_string())?;
    Ok(scratch)
}

/// Deletes the scratch topic.
pub(super) async fn remove_scratch(config: &KafkaConfig) -> Result<String, SinkError> {
    let topic = config.destination.template().to_owned();
    let brokers = config.brokers.clone();
    let client_config = config
        .client_config()
        .map_err(|e| SinkError::rejected(e.to_string()))?;
    let admin: AdminClient<KafkaContext> = client_config
        .create_with_context(KafkaContext::new(&LastErrors::default()))
        .map_err(|e| SinkError::rejected("cannot create the Kafka admin client").with_source(e))?;
    let timeout = config.metadata_timeout;
    let options = AdminOptions::new()
        .operation_timeout(Some(timeout))
        .request_timeout(Some(timeout));
    let results = tokio::time::timeout(
        timeout * 2,
        admin.delete_topics(&[topic.as_str()], &options),
    )
    .await
    .map_err(|_| {
        SinkError::unavailable(format!(
            "deleting Kafka topic `{topic}` on {brokers} timed out"
        ))
    })?
    .map_err(|e| {
        SinkError::unavailable(format!("cannot delete Kafka topic `{topic}` on {brokers}"))
            .with_source(e)
    })?;
    match results.into_iter().next() {
        Some(Ok(_)) => Ok(format!("Kafka topic `{topic}` on {brokers}")),
        Some(Err((_, rdkafka::types::RDKafkaErrorCode::UnknownTopicOrPartition))) => Ok(format!(
            "Kafka topic `{topic}` on {brokers} (never created)"
        )),
        Some(Err((_, code))) => Err(SinkError::rejected(format!(
            "cannot delete Kafka topic `{topic}` on {brokers}: {code}"
        ))),
        None => Ok(format!("Kafka topic `{topic}` on {brokers}")),
    }
}
