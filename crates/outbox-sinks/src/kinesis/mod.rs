//! Amazon Kinesis Data Streams sink (feature `kinesis`).
//!
//! Each event becomes one record, written with `PutRecords` (up to 500 records and 5 MiB per
//! call, calls in parallel, every answer awaited before the batch is reported):
//!
//! | part | value |
//! | --- | --- |
//! | stream | `stream` rendered for the event |
//! | `PartitionKey` | `aggregate_id` when it is 1 to 256 bytes, else `sha256:<hex>` of it: one aggregate always lands on one shard, in order |
//! | data | the payload bytes exactly |
//!
//! Kinesis records have no attributes: the event id, type and headers do not travel. A
//! consumer that needs them sets `format = "cloudevents-structured"`: the data is then the
//! CloudEvents JSON envelope (id, type, source, subject, time, headers as extensions, the
//! payload as `data` or `data_base64`). `cloudevents-binary` is refused: it needs headers.
//! Kinesis does not deduplicate: a republished event is a second record with the same data.
//!
//! | failure | kind |
//! | --- | --- |
//! | no connection, timeout, no credentials, credentials or permission refused | `Unavailable` (the whole batch) |
//! | a record failed (`ProvisionedThroughputExceededException`, `InternalFailure`, KMS) | sent again alone twice within the call, then `Transient`; the relay holds that aggregate's later events until it is through |
//! | throttling of the whole call, a 5xx, a missing stream | `Transient` |
//! | an illegal rendered stream name, a record over `max_message_size` | `Rejected`, with the reason |

mod config;
mod readback;

use std::fmt;

use aws_sdk_kinesis::Client;
use aws_sdk_kinesis::primitives::Blob;
use aws_sdk_kinesis::types::PutRecordsRequestEntry;
use outbox_core::cloudevents::Binding;
use outbox_core::sink::Delivery;
use outbox_core::{Event, Sink, SinkError};

pub use config::{KINESIS_MAX_RECORD_SIZE, KinesisConfig};
pub use readback::KinesisReadBack;

use crate::aws::{self, BatchLimits, EntryOutcome, Pending};

/// Kinesis takes at most 500 records per `PutRecords`...
const BATCH_RECORDS: usize = 500;
/// ...and at most 5 MiB in all.
const BATCH_BYTES: usize = 5 * 1024 * 1024;

/// Kinesis records have no headers: only the structured mode is possible (the config
/// refuses the binary one), and its content type does not travel.
const BINDING: Binding = Binding {
    prefix: "ce-",
    data_content_type: None,
    structured_content_type: None,
    percent_encode: false,
};

/// Writes events to Kinesis data streams; built from a [`KinesisConfig`].
#[derive(Clone)]
pub struct KinesisSink {
    client: Client,
    place: aws::Place,
}

impl fmt::Debug for KinesisSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KinesisSink")
            .field("place", &self.place)
            .finish_non_exhaustive()
    }
}

/// One record: its partition key and data.
#[derive(Debug)]
struct Record {
    partition_key: String,
    data: bytes::Bytes,
}

/// The partition key of `aggregate_id`: itself when it is 1 to 256 bytes, else its digest.
pub(crate) fn partition_key(aggregate_id: &str) -> std::borrow::Cow<'_, str> {
    crate::cloud::ordering_key(aggregate_id, 256, |_| true)
}

impl KinesisSink {
    async fn new(config: KinesisConfig) -> Result<Self, SinkError> {
        let (sdk, place) = config.connect().await?;
        Ok(Self {
            client: Client::new(&sdk),
            place,
        })
    }

    /// The record of one event for stream `name`, or why it cannot be written.
    fn record(
        &self,
        index: usize,
        event: &Event,
        name: &str,
    ) -> Result<Pending<Record>, SinkError> {
        config::stream_name(name).map_err(SinkError::rejected)?;
        let partition_key = partition_key(&event.aggregate_id).into_owned();
        let data = self
            .place
            .format
            .encode(event, &BINDING, |_, _| {})
            .map_err(|reason| crate::cloudevents::not_a_cloudevent(event, reason))?
            .body;
        let size = data.len() + partition_key.len();
        if size > self.place.max_message_size {
            return Err(SinkError::rejected(format!(
                "record of {size} bytes (payload and partition key) exceeds the Kinesis limit of \
                 {} bytes (sink.max_message_size)",
                self.place.max_message_size
            )));
        }
        Ok(Pending {
            index,
            size,
            message: Record {
                partition_key,
                data,
            },
        })
    }

    /// One `PutRecords` of `records` to `stream`: an outcome per record, in order.
    async fn put_records(
        &self,
        stream: &str,
        records: Vec<&Pending<Record>>,
    ) -> Result<Vec<EntryOutcome>, SinkError> {
        let entries = records
            .iter()
            .map(|p| {
                PutRecordsRequestEntry::builder()
                    .data(Blob::new(p.message.data.to_vec()))
                    .partition_key(&p.message.partition_key)
                    .build()
                    .map_err(|e| SinkError::rejected(format!("Kinesis record: {e}")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let output = self
            .client
            .put_records()
            .stream_name(stream)
            .set_records(Some(entries))
            .send()
            .await
            .map_err(|e| {
                aws::request_error(&self.place.endpoint, &format!("PutRecords to {stream}"), e)
            })?;
        // The answer lists one result per record, in request order.
        Ok(output
            .records()
            .iter()
            .map(|result| match result.error_code() {
                None => EntryOutcome::Sent,
                Some(code) => EntryOutcome::Failed {
                    retry: true,
                    reason: format!(
                        "Kinesis did not write the record to {stream}: {code} {}",
                        result.error_message().unwrap_or("")
                    )
                    .trim_end()
                    .to_owned(),
                },
            })
            .collect())
    }
}

impl Sink for KinesisSink {
    fn name(&self) -> &'static str {
        "kinesis"
    }

    async fn publish(&self, batch: &[Event]) -> Result<Vec<Delivery>, SinkError> {
        let (deliveries, streams) = aws::plan(
            batch,
            |event| self.place.target.render(event),
            |i, event, stream| self.record(i, event, stream),
        );
        let limits = BatchLimits {
            entries: BATCH_RECORDS,
            bytes: BATCH_BYTES,
        };
        aws::send_batched(deliveries, &streams, limits, |stream, records| {
            self.put_records(stream, records)
        })
        .await
    }

    async fn healthcheck(&self) -> Result<(), SinkError> {
        if self.place.target.is_fixed() {
            let stream = self.place.target.template();
            self.client
                .describe_stream_summary()
                .stream_name(stream)
                .send()
                .await
                .map_err(|e| {
                    aws::request_error(
                        &self.place.endpoint,
                        &format!("DescribeStreamSummary of {stream}"),
                        e,
                    )
                })?;
        } else {
            self.client
                .list_streams()
                .limit(1)
                .send()
                .await
                .map_err(|e| aws::request_error(&self.place.endpoint, "ListStreams", e))?;
        }
        Ok(())
    }
}
