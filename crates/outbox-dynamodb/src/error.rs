//! This crate's errors: a bad setting (naming its key), and a failed DynamoDB call (saying
//! what was being done, on which table, and what AWS answered).

/// A `[source]` value that is not acceptable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("source.{key}: {message}")]
pub struct ConfigError {
    /// The key, e.g. `table`.
    pub key: &'static str,
    /// What is wrong.
    pub message: String,
}

impl ConfigError {
    pub(crate) fn new(key: &'static str, message: impl Into<String>) -> Self {
        Self {
            key,
            message: message.into(),
        }
    }
}

/// What went wrong talking to DynamoDB, or with what it holds.
#[derive(Debug, thiserror::Error)]
pub enum DynamoError {
    /// A setting is not acceptable.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The table does not exist.
    #[error(
        "DynamoDB table `{table}` does not exist{where_}: create it (partition key `{partition_key}`, sort key `{sort_key}` of type S) or fix source.table"
    )]
    TableMissing {
        /// The table.
        table: String,
        /// ` in region R` when known.
        where_: String,
        /// The configured partition key name.
        partition_key: String,
        /// The configured sort key name.
        sort_key: String,
    },
    /// The table exists but is not what the configuration says.
    #[error("DynamoDB table `{table}`: {problem}")]
    Table {
        /// The table.
        table: String,
        /// What does not match, and how to fix it.
        problem: String,
    },
    /// An event cannot be written as an outbox item.
    #[error("event {id}: {problem}")]
    Event {
        /// The event's id.
        id: uuid::Uuid,
        /// What is wrong with it.
        problem: String,
    },
    /// A DynamoDB call failed.
    #[error("{doing} (table `{table}`) failed: {message}")]
    Call {
        /// What was being done.
        doing: &'static str,
        /// The table.
        table: String,
        /// AWS's code and message, or the transport's error chain (never credentials: the
        /// SDK's errors carry none).
        message: String,
    },
}

impl DynamoError {
    pub(crate) fn call<E>(doing: &'static str, table: &str, error: E) -> Self
    where
        E: std::error::Error + 'static,
    {
        Self::Call {
            doing,
            table: table.to_owned(),
            message: outbox_core::relay::ErrorChain(&error).to_string(),
        }
    }
}
