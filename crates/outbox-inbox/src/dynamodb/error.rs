//! [`DynamoDbInboxError`]: why a DynamoDB inbox call failed.

use std::collections::HashMap;

use aws_sdk_dynamodb::error::{DisplayErrorContext, ProvideErrorMetadata};
use aws_sdk_dynamodb::types::AttributeValue;

/// Why a [`DynamoDbInbox`](crate::DynamoDbInbox) call failed. Whatever the variant, a
/// transaction that returns it committed nothing: neither the side effect nor the dedup
/// record, so the message must not be acknowledged.
#[derive(Debug, thiserror::Error)]
pub enum DynamoDbInboxError {
    /// One of the handler's own items failed (its condition, mostly): the handler's error.
    /// `index` is its position among the items the handler pushed (0 for the first).
    #[error("the handler's item {index} was refused ({code}){}", message.as_deref().map(|m| format!(": {m}")).unwrap_or_default())]
    Handler {
        /// The item's index among the handler's items.
        index: usize,
        /// DynamoDB's cancellation reason, e.g. `ConditionalCheckFailed`.
        code: String,
        /// DynamoDB's message.
        message: Option<String>,
        /// The item as it was, when the handler's item asked for it
        /// (`ReturnValuesOnConditionCheckFailure::AllOld`).
        item: Option<HashMap<String, AttributeValue>>,
    },
    /// DynamoDB cancelled the transaction for a reason that may pass (a conflicting
    /// transaction on the same items, throttling), still after the inbox's own retries:
    /// retry the message later.
    #[error("DynamoDB cancelled the transaction: {reasons}")]
    Cancelled {
        /// The cancellation reasons, by item.
        reasons: String,
    },
    /// A DynamoDB call failed (unreachable, refused, invalid request).
    #[error("DynamoDB failed to {what} (table `{table}`): {detail}")]
    DynamoDb {
        /// What the inbox was doing.
        what: &'static str,
        /// The table.
        table: String,
        /// The error code DynamoDB returned, if any (e.g. `ValidationException`).
        code: Option<String>,
        /// The SDK's error with its context.
        detail: String,
    },
    /// The request cannot be made (too many items, a key over DynamoDB's limits, no
    /// consumer name): retrying will not help.
    #[error("{0}")]
    Invalid(String),
    /// The table cannot hold the inbox (`migrate`).
    #[error("table `{table}`: {problem}")]
    Table {
        /// The table.
        table: String,
        /// What is wrong, and what to do.
        problem: String,
    },
}

impl DynamoDbInboxError {
    pub(crate) fn call<E>(what: &'static str, table: &str, e: E) -> Self
    where
        E: ProvideErrorMetadata + std::error::Error + 'static,
    {
        Self::DynamoDb {
            what,
            table: table.to_owned(),
            code: e.code().map(str::to_owned),
            detail: DisplayErrorContext(&e).to_string(),
        }
    }

    /// Whether retrying later may succeed without any change: conflicts, throttling and
    /// failed calls (except a refused request: `ValidationException`); a handler's error is
    /// for the handler to classify.
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Cancelled { .. } => true,
            Self::DynamoDb { code, .. } => code.as_deref() != Some("ValidationException"),
            Self::Handler { .. } | Self::Invalid(_) | Self::Table { .. } => false,
        }
    }
}
