//! The publish path and healthcheck that the SQS and SNS sinks share: [`QueueApi`], the few
//! calls in which the two services' SDK clients differ (the entry type, the batch call, the
//! healthcheck's requests), and [`publish`] and [`healthcheck`], which serve both on top of it.

use std::collections::HashMap;
use std::future::Future;

use aws_smithy_types::error::operation::BuildError;
use outbox_core::sink::Delivery;
use outbox_core::{Event, SinkError};

use super::{BatchLimits, EntryOutcome, Pending, Place, QueueMessage};

/// SQS and SNS take at most ten entries per batch call.
const BATCH_ENTRIES: usize = 10;

/// One entry the service did not store, as its batch answer names it.
#[derive(Debug)]
pub(crate) struct FailedEntry {
    /// The entry id (`e<position>`).
    pub(crate) id: String,
    /// True when the service blames the sender: the entry is not sent again.
    pub(crate) sender_fault: bool,
    /// The service's error code.
    pub(crate) code: String,
    /// The service's message, if any.
    pub(crate) message: Option<String>,
}

/// The answer to one batch call: the ids of the stored entries and the failed ones.
#[derive(Debug, Default)]
pub(crate) struct BatchAnswer {
    pub(crate) sent: Vec<String>,
    pub(crate) failed: Vec<FailedEntry>,
}

/// What an SQS or SNS client does differently: the rest of the sink is [`publish`] and
/// [`healthcheck`].
pub(crate) trait QueueApi: Sync {
    /// The service, for messages (`SQS`).
    const SERVICE: &'static str;
    /// A String message attribute value.
    type Attribute;
    /// One entry of a batch call.
    type Entry: Send;

    /// The target's queue or topic name (FIFO when it ends in `.fifo`), or why it is not legal.
    fn target_name(target: &str) -> Result<&str, String>;

    /// The String attribute `value`.
    fn attribute(value: &str) -> Result<Self::Attribute, BuildError>;

    /// The batch entry `id` of `message`, with its `attributes` already built.
    fn entry(
        id: String,
        message: &QueueMessage,
        attributes: HashMap<String, Self::Attribute>,
    ) -> Result<Self::Entry, BuildError>;

    /// One batch call of `entries` to `target`.
    fn send_batch(
        &self,
        place: &Place,
        target: &str,
        entries: Vec<Self::Entry>,
    ) -> impl Future<Output = Result<BatchAnswer, SinkError>> + Send;

    /// Asks the service about the one fixed `target` (it exists, the credentials may use it).
    fn describe(
        &self,
        place: &Place,
        target: &str,
    ) -> impl Future<Output = Result<(), SinkError>> + Send;

    /// Lists the service's queues or topics: the endpoint answers and the credentials work.
    fn list(&self, place: &Place) -> impl Future<Output = Result<(), SinkError>> + Send;
}

/// Publishes `batch` through `api`: each event made into a message for its rendered target,
/// then every target's messages sent in calls of at most ten entries and `max_message_size`
/// bytes (see [`super::send_batched`]).
pub(crate) async fn publish<A: QueueApi>(
    api: &A,
    place: &Place,
    batch: &[Event],
) -> Result<Vec<Delivery>, SinkError> {
    let max = place.max_message_size;
    let (deliveries, targets) = super::plan(
        batch,
        |event| place.target.render(event),
        |i, event, target| {
            let name = A::target_name(target);
            super::queue_message(i, event, name, &place.format, (A::SERVICE, max))
        },
    );
    let limits = BatchLimits {
        entries: BATCH_ENTRIES,
        bytes: max,
    };
    super::send_batched(deliveries, &targets, limits, |target, messages| {
        send_batch(api, place, target, messages)
    })
    .await
}

/// The healthcheck of an SQS or SNS sink: the fixed target described, else a listing.
pub(crate) async fn healthcheck<A: QueueApi>(api: &A, place: &Place) -> Result<(), SinkError> {
    if place.target.is_fixed() {
        api.describe(place, place.target.template()).await
    } else {
        api.list(place).await
    }
}

/// One batch call of `messages` to `target`: an outcome per message, in order.
async fn send_batch<A: QueueApi>(
    api: &A,
    place: &Place,
    target: &str,
    messages: Vec<&Pending<QueueMessage>>,
) -> Result<Vec<EntryOutcome>, SinkError> {
    let entries = messages
        .iter()
        .enumerate()
        .map(|(position, p)| entry::<A>(position, &p.message))
        .collect::<Result<Vec<_>, _>>()?;
    let answer = api.send_batch(place, target, entries).await?;
    Ok(super::outcomes_by_id(
        messages.len(),
        answer.sent.iter().map(String::as_str),
        answer.failed.iter().map(|failed| {
            let reason = format!(
                "{} refused the message for {target}: {} {}",
                A::SERVICE,
                failed.code,
                failed.message.as_deref().unwrap_or("")
            );
            (
                failed.id.as_str(),
                failed.sender_fault,
                reason.trim_end().to_owned(),
            )
        }),
    ))
}

/// The batch entry at `position`: its attributes, then the entry itself.
fn entry<A: QueueApi>(position: usize, message: &QueueMessage) -> Result<A::Entry, SinkError> {
    let mut attributes = HashMap::with_capacity(message.message.attributes.len());
    for (name, value) in &message.message.attributes {
        let value = A::attribute(value)
            .map_err(|e| SinkError::rejected(format!("attribute `{name}`: {e}")))?;
        attributes.insert(name.clone(), value);
    }
    A::entry(super::entry_id(position), message, attributes)
        .map_err(|e| SinkError::rejected(format!("{} entry: {e}", A::SERVICE)))
}

/// Writes an SQS or SNS sink: the sink type (the SDK client and its [`Place`]), its `Debug`,
/// its `new`, the client's [`QueueApi`] impl and the sink's `Sink` impl. The two SDKs have the
/// same shapes under other names (`aws_sdk_sqs` and `aws_sdk_sns` share no trait), so this
/// takes the names: the entry type and its body setter, the batch call, how a successful
/// entry gives its id, and the healthcheck's two calls.
macro_rules! queue_sink {
    (
        $(#[$doc:meta])*
        pub struct $sink:ident for $config:ident through $sdk:ident {
            name: $name:literal,
            service: $service:literal,
            target_name: $target_name:path,
            entry: $entry:ident { body: $body:ident },
            batch: $batch_call:literal, |$client:ident, $target:ident, $entries:ident| $batch:expr,
            sent_id: |$ok:ident| $sent_id:expr,
            describe: $describe_call:literal, |$dclient:ident, $dtarget:ident| $describe:expr,
            list: $list_call:literal, |$lclient:ident| $list:expr $(,)?
        }
    ) => {
        $(#[$doc])*
        #[derive(Clone)]
        pub struct $sink {
            client: $sdk::Client,
            place: crate::aws::Place,
        }

        impl std::fmt::Debug for $sink {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.debug_struct(stringify!($sink))
                    .field("place", &self.place)
                    .finish_non_exhaustive()
            }
        }

        impl $sink {
            async fn new(config: $config) -> Result<Self, outbox_core::SinkError> {
                let (sdk, place) = config.connect().await?;
                Ok(Self {
                    client: $sdk::Client::new(&sdk),
                    place,
                })
            }
        }

        #[doc = concat!(
            $service, "' `", $batch_call, "`, `", $describe_call, "` and `", $list_call, "`."
        )]
        impl crate::aws::QueueApi for $sdk::Client {
            const SERVICE: &'static str = $service;
            type Attribute = $sdk::types::MessageAttributeValue;
            type Entry = $sdk::types::$entry;

            fn target_name(target: &str) -> Result<&str, String> {
                $target_name(target)
            }

            fn attribute(
                value: &str,
            ) -> Result<Self::Attribute, aws_smithy_types::error::operation::BuildError> {
                $sdk::types::MessageAttributeValue::builder()
                    .data_type(crate::aws::STRING_TYPE)
                    .string_value(value)
                    .build()
            }

            fn entry(
                id: String,
                message: &crate::aws::QueueMessage,
                attributes: std::collections::HashMap<String, Self::Attribute>,
            ) -> Result<Self::Entry, aws_smithy_types::error::operation::BuildError> {
                $sdk::types::$entry::builder()
                    .id(id)
                    .$body(&message.message.body)
                    .set_message_attributes(Some(attributes))
                    .set_message_group_id(message.group_id.clone())
                    .set_message_deduplication_id(message.dedup_id.clone())
                    .build()
            }

            async fn send_batch(
                &self,
                place: &crate::aws::Place,
                $target: &str,
                $entries: Vec<Self::Entry>,
            ) -> Result<crate::aws::BatchAnswer, outbox_core::SinkError> {
                let $client = self;
                let what = format!("{} to {}", $batch_call, $target);
                let output = place.request(&what, $batch.send()).await?;
                Ok(crate::aws::BatchAnswer {
                    sent: output.successful().iter().filter_map(|$ok| $sent_id).collect(),
                    failed: output
                        .failed()
                        .iter()
                        .map(|failed| crate::aws::FailedEntry {
                            id: failed.id().to_owned(),
                            sender_fault: failed.sender_fault(),
                            code: failed.code().to_owned(),
                            message: failed.message().map(str::to_owned),
                        })
                        .collect(),
                })
            }

            async fn describe(
                &self,
                place: &crate::aws::Place,
                $dtarget: &str,
            ) -> Result<(), outbox_core::SinkError> {
                let $dclient = self;
                let what = format!("{} of {}", $describe_call, $dtarget);
                place.request(&what, $describe.send()).await?;
                Ok(())
            }

            async fn list(&self, place: &crate::aws::Place) -> Result<(), outbox_core::SinkError> {
                let $lclient = self;
                place.request($list_call, $list.send()).await?;
                Ok(())
            }
        }

        impl outbox_core::Sink for $sink {
            fn name(&self) -> &'static str {
                $name
            }

            async fn publish(
                &self,
                batch: &[outbox_core::Event],
            ) -> Result<Vec<outbox_core::sink::Delivery>, outbox_core::SinkError> {
                crate::aws::publish(&self.client, &self.place, batch).await
            }

            async fn healthcheck(&self) -> Result<(), outbox_core::SinkError> {
                crate::aws::healthcheck(&self.client, &self.place).await
            }
        }
    };
}
pub(crate) use queue_sink;
