//! Amazon SQS sink (feature `sqs`): standard and FIFO queues.
//!
//! Each event becomes one message, sent with `SendMessageBatch` (ten per call, calls in
//! parallel, every answer awaited before the batch is reported):
//!
//! | part | value |
//! | --- | --- |
//! | queue | `queue_url` rendered for the event |
//! | body | the payload when it is legal SQS text; else base64 with the attribute `content-transfer-encoding: base64`; an empty payload is the body `-` with `content-transfer-encoding: empty` |
//! | attributes | String attributes `id`, `event_type`, `aggregate_type`, `aggregate_id`, then the row's own headers; what does not fit in SQS' ten (or has an illegal name or value) goes in `outbox-headers` as JSON `[[name, value], ...]` |
//! | `MessageGroupId` (FIFO) | `aggregate_id` when it is 1 to 128 printable ASCII characters, else `sha256:<hex>` of it |
//! | `MessageDeduplicationId` (FIFO) | the event id |
//!
//! FIFO queues keep each aggregate's order (one group per aggregate) and drop a republished
//! event within SQS' five-minute deduplication window. Standard queues keep no order and
//! deduplicate nothing: consumers deduplicate by the `id` attribute.
//!
//! | failure | kind |
//! | --- | --- |
//! | no connection, timeout, no credentials, credentials or permission refused | `Unavailable` (the whole batch) |
//! | an entry failed on SQS' side (`SenderFault = false`) | sent again alone twice within the call, then `Transient` |
//! | throttling, a 5xx, a missing queue | `Transient` (retried with backoff, dead-lettered after `max_attempts`) |
//! | an entry refused as the sender's fault, an illegal rendered queue name, a message over `max_message_size` | `Rejected`, with the reason |

mod config;

use std::collections::HashMap;
use std::fmt;

use aws_sdk_sqs::Client;
use aws_sdk_sqs::types::{MessageAttributeValue, QueueAttributeName, SendMessageBatchRequestEntry};
use outbox_core::sink::Delivery;
use outbox_core::{Event, Sink, SinkError};

pub use config::{DEFAULT_MAX_MESSAGE_SIZE, SQS_MAX_MESSAGE_SIZE, SqsConfig};

use crate::aws::{self, BatchLimits, EntryOutcome, Pending, QueueMessage, STRING_TYPE};

/// SQS takes at most ten entries per `SendMessageBatch`.
const BATCH_ENTRIES: usize = 10;

/// Sends events to SQS queues; built from an [`SqsConfig`].
#[derive(Clone)]
pub struct SqsSink {
    client: Client,
    place: aws::Place,
}

impl fmt::Debug for SqsSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqsSink")
            .field("place", &self.place)
            .finish_non_exhaustive()
    }
}

impl SqsSink {
    async fn new(config: SqsConfig) -> Result<Self, SinkError> {
        let (sdk, place) = config.connect().await?;
        Ok(Self {
            client: Client::new(&sdk),
            place,
        })
    }

    /// One `SendMessageBatch` of `messages` to `url`: an outcome per message, in order.
    async fn send_batch(
        &self,
        url: &str,
        messages: Vec<&Pending<QueueMessage>>,
    ) -> Result<Vec<EntryOutcome>, SinkError> {
        let entries = messages
            .iter()
            .enumerate()
            .map(|(position, p)| entry(position, &p.message))
            .collect::<Result<Vec<_>, _>>()?;
        let output = self
            .client
            .send_message_batch()
            .queue_url(url)
            .set_entries(Some(entries))
            .send()
            .await
            .map_err(|e| {
                aws::request_error(
                    &self.place.endpoint,
                    &format!("SendMessageBatch to {url}"),
                    e,
                )
            })?;
        Ok(aws::outcomes_by_id(
            messages.len(),
            output.successful().iter().map(|ok| ok.id()),
            output.failed().iter().map(|failed| {
                let reason = format!(
                    "SQS refused the message for {url}: {} {}",
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

/// The `SendMessageBatch` entry at `position`.
fn entry(
    position: usize,
    message: &QueueMessage,
) -> Result<SendMessageBatchRequestEntry, SinkError> {
    let mut attributes = HashMap::with_capacity(message.message.attributes.len());
    for (name, value) in &message.message.attributes {
        let value = MessageAttributeValue::builder()
            .data_type(STRING_TYPE)
            .string_value(value)
            .build()
            .map_err(|e| SinkError::rejected(format!("attribute `{name}`: {e}")))?;
        attributes.insert(name.clone(), value);
    }
    SendMessageBatchRequestEntry::builder()
        .id(aws::entry_id(position))
        .message_body(&message.message.body)
        .set_message_attributes(Some(attributes))
        .set_message_group_id(message.group_id.clone())
        .set_message_deduplication_id(message.dedup_id.clone())
        .build()
        .map_err(|e| SinkError::rejected(format!("SQS entry: {e}")))
}

impl Sink for SqsSink {
    fn name(&self) -> &'static str {
        "sqs"
    }

    async fn publish(&self, batch: &[Event]) -> Result<Vec<Delivery>, SinkError> {
        let max = self.place.max_message_size;
        let (deliveries, queues) = aws::plan(
            batch,
            |event| self.place.target.render(event),
            |i, event, target| {
                let name = config::queue_name(target);
                aws::queue_message(i, event, name, &self.place.format, ("SQS", max))
            },
        );
        let limits = BatchLimits {
            entries: BATCH_ENTRIES,
            bytes: self.place.max_message_size,
        };
        aws::send_batched(deliveries, &queues, limits, |url, messages| {
            self.send_batch(url, messages)
        })
        .await
    }

    async fn healthcheck(&self) -> Result<(), SinkError> {
        if self.place.target.is_fixed() {
            let url = self.place.target.template();
            self.client
                .get_queue_attributes()
                .queue_url(url)
                .attribute_names(QueueAttributeName::QueueArn)
                .send()
                .await
                .map_err(|e| {
                    aws::request_error(
                        &self.place.endpoint,
                        &format!("GetQueueAttributes of {url}"),
                        e,
                    )
                })?;
        } else {
            self.client
                .list_queues()
                .max_results(1)
                .send()
                .await
                .map_err(|e| aws::request_error(&self.place.endpoint, "ListQueues", e))?;
        }
        Ok(())
    }
}
