//! [`InboxTransaction`]: the handler's items, the dedup record and the applied position in
//! one `TransactWriteItems`; the cancellation reasons tell a duplicate from a handler's
//! failed condition.

use std::time::{Duration, SystemTime};

use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::types::{AttributeValue, CancellationReason, Put, TransactWriteItem};
use uuid::Uuid;

use super::{
    DynamoDbInbox, DynamoDbInboxError, MAX_TRANSACT_ITEMS, PROCESSED_SK, Position, attr,
    unix_seconds,
};
use crate::Outcome;

/// Retries of a transaction cancelled by a conflicting transaction or throttling.
const TRANSIENT_RETRIES: u32 = 4;

/// First wait before such a retry; doubles per retry.
const TRANSIENT_BACKOFF: Duration = Duration::from_millis(25);

/// One delivery's transaction: push the side effect's items, then [`commit`](Self::commit).
/// Made by [`DynamoDbInbox::transaction`]; nothing is sent before `commit`, and dropping it
/// writes nothing.
///
/// The items are sent in the order pushed, followed by the dedup record (a `Put` with
/// `attribute_not_exists`) and, for a message with `aggregate_seq`, the conditional update of
/// the applied position. They commit together or not at all; only these items are
/// effectively-once: work the handler does outside them (an HTTP call) may run again.
#[derive(Debug)]
pub struct InboxTransaction {
    inbox: DynamoDbInbox,
    consumer: String,
    event_id: Uuid,
    processed_key: String,
    position: Option<Position>,
    items: Vec<TransactWriteItem>,
}

/// What the cancellation reasons of one attempt mean.
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    /// The dedup record exists: processed before.
    Duplicate,
    /// The handler's item at this index was refused.
    Handler(usize),
    /// The stored position is already at or past the message's: send again without it.
    PositionPassed,
    /// A conflicting transaction or throttling: send again after a wait.
    Transient,
    /// Anything else.
    Other,
}

const CONDITIONAL_CHECK_FAILED: &str = "ConditionalCheckFailed";

/// Reasons that may pass when the same transaction is sent again.
fn transient(code: &str) -> bool {
    matches!(
        code,
        "TransactionConflict" | "ThrottlingError" | "ProvisionedThroughputExceeded"
    )
}

/// Reads the cancellation reasons (one per item, in the order sent: `handler_items` of the
/// handler's, then the dedup record, then the position when sent). A duplicate wins over a
/// handler's failure: the event was processed, the handler's condition does not matter.
fn classify(codes: &[Option<&str>], handler_items: usize, with_position: bool) -> Verdict {
    let code = |i: usize| {
        codes
            .get(i)
            .copied()
            .flatten()
            .filter(|c| !c.is_empty() && *c != "None")
    };
    if code(handler_items) == Some(CONDITIONAL_CHECK_FAILED) {
        return Verdict::Duplicate;
    }
    if let Some(i) = (0..handler_items).find(|&i| code(i).is_some_and(|c| !transient(c))) {
        return Verdict::Handler(i);
    }
    if with_position && code(handler_items + 1) == Some(CONDITIONAL_CHECK_FAILED) {
        return Verdict::PositionPassed;
    }
    let failed: Vec<&str> = (0..codes.len()).filter_map(code).collect();
    if !failed.is_empty() && failed.iter().all(|c| transient(c)) {
        Verdict::Transient
    } else {
        Verdict::Other
    }
}

fn describe(reasons: &[CancellationReason]) -> String {
    reasons
        .iter()
        .enumerate()
        .map(|(i, r)| format!("item {i}: {}", r.code().unwrap_or("None")))
        .collect::<Vec<_>>()
        .join(", ")
}

impl InboxTransaction {
    pub(super) fn new(
        inbox: DynamoDbInbox,
        consumer: &str,
        event_id: Uuid,
        position: Option<Position>,
    ) -> Result<Self, DynamoDbInboxError> {
        let processed_key = inbox.processed_key(consumer, event_id)?;
        Ok(Self {
            inbox,
            consumer: consumer.to_owned(),
            event_id,
            processed_key,
            position,
            items: Vec::new(),
        })
    }

    /// The event id this transaction records.
    pub fn event_id(&self) -> Uuid {
        self.event_id
    }

    /// How many more items the handler may push: [`MAX_TRANSACT_ITEMS`] less the dedup
    /// record, the position (when the message has one) and the items pushed so far.
    pub fn room(&self) -> usize {
        MAX_TRANSACT_ITEMS - 1 - usize::from(self.position.is_some()) - self.items.len()
    }

    /// Adds one of the side effect's items (a `Put`, `Update`, `Delete` or
    /// `ConditionCheck`, on any table of the client's account and region). Refused when the
    /// transaction is full ([`room`](Self::room) is 0).
    pub fn push(&mut self, item: TransactWriteItem) -> Result<&mut Self, DynamoDbInboxError> {
        if self.room() == 0 {
            return Err(DynamoDbInboxError::Invalid(format!(
                "a TransactWriteItems holds at most {MAX_TRANSACT_ITEMS} items, and the inbox uses {} of them: \
                 split the side effect, or record it in fewer items",
                1 + usize::from(self.position.is_some())
            )));
        }
        self.items.push(item);
        Ok(self)
    }

    /// The items pushed so far.
    pub fn items(&self) -> &[TransactWriteItem] {
        &self.items
    }

    /// Sends the transaction. [`Outcome::Processed`]: the side effect and the dedup record
    /// committed together. [`Outcome::Duplicate`]: `consumer` processed this event before;
    /// nothing was written (a message's position is still recorded, on its own).
    ///
    /// A handler's item that fails its condition is [`DynamoDbInboxError::Handler`] with its
    /// index, and nothing is written. A conflicting transaction or throttling is retried a
    /// few times here, then returned as [`DynamoDbInboxError::Cancelled`].
    pub async fn commit(self) -> Result<Outcome<()>, DynamoDbInboxError> {
        let inbox = &self.inbox;
        let dedup = TransactWriteItem::builder()
            .put(self.dedup_record())
            .build();
        let position = self
            .position
            .as_ref()
            .map(|p| inbox.position_update(&self.consumer, p));
        let mut with_position = position.is_some();
        let mut transient_retries = 0;
        loop {
            let mut items = self.items.clone();
            items.push(dedup.clone());
            if let (true, Some(update)) = (with_position, &position) {
                items.push(TransactWriteItem::builder().update(update.clone()).build());
            }
            let error = match inbox
                .client
                .transact_write_items()
                .set_transact_items(Some(items))
                .send()
                .await
            {
                Ok(_) => return Ok(Outcome::Processed(())),
                Err(e) => e,
            };
            let Some(TransactWriteItemsError::TransactionCanceledException(cancelled)) =
                error.as_service_error()
            else {
                return Err(DynamoDbInboxError::call(
                    "write the transaction",
                    &inbox.table,
                    error,
                ));
            };
            let reasons = cancelled.cancellation_reasons();
            let codes: Vec<Option<&str>> = reasons.iter().map(CancellationReason::code).collect();
            match classify(&codes, self.items.len(), with_position) {
                Verdict::Duplicate => {
                    if let Some(p) = &self.position {
                        inbox
                            .advance(&self.consumer, &p.aggregate_type, &p.aggregate_id, p.seq)
                            .await?;
                    }
                    return Ok(Outcome::Duplicate);
                }
                Verdict::Handler(index) => {
                    let reason = &reasons[index];
                    return Err(DynamoDbInboxError::Handler {
                        index,
                        code: reason.code().unwrap_or_default().to_owned(),
                        message: reason.message().map(str::to_owned),
                        item: reason.item().cloned(),
                    });
                }
                Verdict::PositionPassed => with_position = false,
                Verdict::Transient if transient_retries < TRANSIENT_RETRIES => {
                    tokio::time::sleep(TRANSIENT_BACKOFF * 2u32.pow(transient_retries)).await;
                    transient_retries += 1;
                }
                Verdict::Transient | Verdict::Other => {
                    return Err(DynamoDbInboxError::Cancelled {
                        reasons: describe(reasons),
                    });
                }
            }
        }
    }

    /// The dedup record: put only when no record of this consumer and event exists.
    fn dedup_record(&self) -> Put {
        let inbox = &self.inbox;
        let now = SystemTime::now();
        let s = |v: &str| AttributeValue::S(v.to_owned());
        let n = |v: u64| AttributeValue::N(v.to_string());
        Put::builder()
            .table_name(&inbox.table)
            .item(&inbox.partition_key, s(&self.processed_key))
            .item(&inbox.sort_key, s(PROCESSED_SK))
            .item(attr::CONSUMER, s(&self.consumer))
            .item(attr::EVENT_ID, s(&self.event_id.hyphenated().to_string()))
            .item(attr::PROCESSED_AT, n(unix_seconds(now)))
            .item(&inbox.ttl_attribute, n(unix_seconds(now + inbox.keep)))
            .condition_expression("attribute_not_exists(#pk)")
            .expression_attribute_names("#pk", &inbox.partition_key)
            .build()
            .expect("table name and item are set")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CCF: Option<&str> = Some(CONDITIONAL_CHECK_FAILED);
    const NONE: Option<&str> = Some("None");

    #[test]
    fn the_dedup_record_failing_is_a_duplicate_even_when_a_handler_item_failed_too() {
        assert_eq!(classify(&[NONE, NONE, CCF], 2, false), Verdict::Duplicate);
        assert_eq!(
            classify(&[CCF, NONE, CCF, NONE], 2, true),
            Verdict::Duplicate
        );
    }

    #[test]
    fn a_handler_item_failing_is_the_handler_error_with_its_index() {
        assert_eq!(classify(&[NONE, CCF, NONE], 2, false), Verdict::Handler(1));
        assert_eq!(
            classify(&[Some("ValidationError"), NONE, NONE, NONE], 2, true),
            Verdict::Handler(0)
        );
        // A handler item failing beats a passed position: the retry would fail the same way.
        assert_eq!(classify(&[CCF, NONE, CCF], 1, true), Verdict::Handler(0));
    }

    #[test]
    fn a_position_at_or_past_the_message_is_sent_again_without_it() {
        assert_eq!(
            classify(&[NONE, NONE, CCF], 1, true),
            Verdict::PositionPassed
        );
        // Without a position the same index is not one.
        assert_eq!(classify(&[NONE, NONE, CCF], 1, false), Verdict::Other);
    }

    #[test]
    fn conflicts_and_throttling_are_transient_other_reasons_not() {
        assert_eq!(
            classify(&[Some("TransactionConflict"), NONE], 1, false),
            Verdict::Transient
        );
        assert_eq!(
            classify(&[None, Some("ThrottlingError")], 1, false),
            Verdict::Transient
        );
        assert_eq!(
            classify(&[NONE, Some("ItemCollectionSizeLimitExceeded")], 1, false),
            Verdict::Other
        );
        assert_eq!(classify(&[], 1, false), Verdict::Other);
    }
}
