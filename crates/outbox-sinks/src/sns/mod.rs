//! Amazon SNS sink (feature `sns`): standard and FIFO topics.
//!
//! Each event becomes one message, published with `PublishBatch` (ten per call, calls in
//! parallel, every answer awaited before the batch is reported). The message is built by the
//! same rules as SQS' (see [`crate::sqs`]): the payload as the text body (base64 with
//! `content-transfer-encoding: base64` when it is not legal text), headers as String message
//! attributes (at most ten; the rest in `outbox-headers`), and on a FIFO topic (`….fifo`)
//! `MessageGroupId` from `aggregate_id` and `MessageDeduplicationId` = the event id.
//!
//! A subscriber queue sees these attributes only with raw message delivery
//! (`RawMessageDelivery = true`); without it SQS subscribers get SNS' JSON envelope, whose
//! `Message` is the body and `MessageAttributes` the attributes.
//!
//! Failures map as for SQS: no connection, no or refused credentials → `Unavailable`; an
//! entry failed on SNS' side → sent again alone twice, then `Transient`; throttling, 5xx, a
//! missing topic → `Transient`; the sender's fault, an illegal topic name, a message over
//! `max_message_size` → `Rejected`.

mod config;

use std::collections::HashMap;
use std::fmt;

use aws_sdk_sns::Client;
use aws_sdk_sns::types::{MessageAttributeValue, PublishBatchRequestEntry};
use outbox_core::sink::Delivery;
use outbox_core::{Event, Sink, SinkError};

pub use config::{SNS_MAX_MESSAGE_SIZE, SnsConfig};

use crate::aws::{self, BatchLimits, EntryOutcome, Pending, QueueMessage, STRING_TYPE};

/// SNS takes at most ten entries per `PublishBatch`.
const BATCH_ENTRIES: usize = 10;

/// Publishes events to SNS topics; built from an [`SnsConfig`].
#[derive(Clone)]
pub struct SnsSink {
    client: Client,
    place: aws::Place,
}

impl fmt::Debug for SnsSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SnsSink")
            .field("place", &self.place)
            .finish_non_exhaustive()
    }
}

impl SnsSink {
    async fn new(config: SnsConfig) -> Result<Self, SinkError> {
        let (sdk, place) = config.connect().await?;
        Ok(Self {
            client: Client::new(&sdk),
            place,
        })
    }

    /// One `PublishBatch` of `messages` to `arn`: an outcome per message, in order.
    async fn send_batch(
        &self,
        arn: &str,
        messages: Vec<&Pending<QueueMessage>>,
    ) -> Result<Vec<EntryOutcome>, SinkError> {
        let entries = messages
            .iter()
            .enumerate()
            .map(|(position, p)| entry(position, &p.message))
            .collect::<Result<Vec<_>, _>>()?;
        let output = self
            .client
            .publish_batch()
            .topic_arn(arn)
            .set_publish_batch_request_entries(Some(entries))
            .send()
            .await
            .map_err(|e| {
                aws::request_error(&self.place.endpoint, &format!("PublishBatch to {arn}"), e)
            })?;
        Ok(aws::outcomes_by_id(
            messages.len(),
            output.successful().iter().filter_map(|ok| ok.id()),
            output.failed().iter().map(|failed| {
                let reason = format!(
                    "SNS refused the message for {arn}: {} {}",
                    failed.code(),
                    failed.message().unwrap_or("")
                );
                (
                    failed.id(),
                    failed.sender_fault(),
                    reason.trim_end().to_owned(),
                )
            }),
        ))
    }
}

/// The `PublishBatch` entry at `position`.
fn entry(position: usize, message: &QueueMessage) -> Result<PublishBatchRequestEntry, SinkError> {
    let mut attributes = HashMap::with_capacity(message.message.attributes.len());
    for (name, value) in &message.message.attributes {
        let value = MessageAttributeValue::builder()
            .data_type(STRING_TYPE)
            .string_value(value)
            .build()
            .map_err(|e| SinkError::rejected(format!("attribute `{name}`: {e}")))?;
        attributes.insert(name.clone(), value);
    }
    PublishBatchRequestEntry::builder()
        .id(aws::entry_id(position))
        .message(&message.message.body)
        .set_message_attributes(Some(attributes))
        .set_message_group_id(message.group_id.clone())
        .set_message_deduplication_id(message.dedup_id.clone())
        .build()
        .map_err(|e| SinkError::rejected(format!("SNS entry: {e}")))
}

impl Sink for SnsSink {
    fn name(&self) -> &'static str {
        "sns"
    }

    async fn publish(&self, batch: &[Event]) -> Result<Vec<Delivery>, SinkError> {
        let max = self.place.max_message_size;
        let (deliveries, topics) = aws::plan(
            batch,
            |event| self.place.target.render(event),
            |i, event, target| {
                let name = config::topic_name(target);
                aws::queue_message(i, event, name, &self.place.format, ("SNS", max))
            },
        );
        let limits = BatchLimits {
            entries: BATCH_ENTRIES,
            bytes: self.place.max_message_size,
        };
        aws::send_batched(deliveries, &topics, limits, |arn, messages| {
            self.send_batch(arn, messages)
        })
        .await
    }

    async fn healthcheck(&self) -> Result<(), SinkError> {
        if self.place.target.is_fixed() {
            let arn = self.place.target.template();
            self.client
                .get_topic_attributes()
                .topic_arn(arn)
                .send()
                .await
                .map_err(|e| {
                    aws::request_error(
                        &self.place.endpoint,
                        &format!("GetTopicAttributes of {arn}"),
                        e,
                    )
                })?;
        } else {
            self.client
                .list_topics()
                .send()
                .await
                .map_err(|e| aws::request_error(&self.place.endpoint, "ListTopics", e))?;
        }
        Ok(())
    }
}
