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

use aws_sdk_sqs::types::QueueAttributeName;

pub use config::{DEFAULT_MAX_MESSAGE_SIZE, SQS_MAX_MESSAGE_SIZE, SqsConfig};

crate::aws::queue_sink! {
    /// Sends events to SQS queues; built from an [`SqsConfig`].
    pub struct SqsSink for SqsConfig through aws_sdk_sqs {
        name: "sqs",
        service: "SQS",
        target_name: config::queue_name,
        entry: SendMessageBatchRequestEntry { body: message_body },
        batch: "SendMessageBatch", |client, url, entries| client
            .send_message_batch()
            .queue_url(url)
            .set_entries(Some(entries)),
        sent_id: |ok| Some(ok.id.clone()),
        describe: "GetQueueAttributes", |client, url| client
            .get_queue_attributes()
            .queue_url(url)
            .attribute_names(QueueAttributeName::QueueArn),
        list: "ListQueues", |client| client.list_queues().max_results(1),
    }
}
