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

pub use config::{SNS_MAX_MESSAGE_SIZE, SnsConfig};

crate::aws::queue_sink! {
    /// Publishes events to SNS topics; built from an [`SnsConfig`].
    pub struct SnsSink for SnsConfig through aws_sdk_sns {
        name: "sns",
        service: "SNS",
        target_name: config::topic_name,
        entry: PublishBatchRequestEntry { body: message },
        batch: "PublishBatch", |client, arn, entries| client
            .publish_batch()
            .topic_arn(arn)
            .set_publish_batch_request_entries(Some(entries)),
        sent_id: |ok| ok.id.clone(),
        describe: "GetTopicAttributes", |client, arn| client.get_topic_attributes().topic_arn(arn),
        list: "ListTopics", |client| client.list_topics(),
    }
}
