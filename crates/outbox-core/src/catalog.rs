//! The subscription catalog: the `[[subscription]]` entries an outbox fans out to, recorded in
//! the database (`<table>_subscriptions`) by `outbox migrate`, so every relay replica fans out
//! to the same subscriptions whatever file it runs with (docs/subscriptions.md).
//!
//! The core knows a subscription's filter only as JSON text; the runtime
//! (`outbox_runtime::catalog`) turns it into its filter type. Each database implements
//! [`SubscriptionCatalog`] with its own SQL, one query per verb.

use time::OffsetDateTime;

use crate::sink::BoxFuture;
use crate::source::SourceError;

/// Whether a catalogued subscription delivers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SubscriptionState {
    /// Copied into by the fan-out and delivered by its pipeline.
    Active,
    /// Still copied into by the fan-out (nothing is lost), but its pipeline claims nothing
    /// until it is resumed.
    Paused,
}

impl SubscriptionState {
    /// The word stored in the catalog's `state` column.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Active => "active",
            Self::Paused => "paused",
        }
    }

    /// Reads the `state` column; `Err` names the unknown word.
    pub fn parse(word: &str) -> Result<Self, SourceError> {
        match word {
            "active" => Ok(Self::Active),
            "paused" => Ok(Self::Paused),
            other => Err(SourceError::fatal(format!(
                "subscription catalog: unknown state `{other}` (expected active or paused)"
            ))),
        }
    }
}

/// What `outbox migrate` records for one `[[subscription]]` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CatalogRecord {
    /// The subscription's name (validated: lowercase letters, digits, `_`).
    pub name: String,
    /// Its resolved filter as JSON text (`{"event_type":[...],"aggregate_type":null}`).
    pub filter: String,
    /// The `[sinks.NAME]` that delivers it.
    pub sink: String,
    /// The state a new row starts in (`outbox migrate --paused`: paused, so that it can be
    /// backfilled before it delivers); a row already there keeps its own.
    pub state: SubscriptionState,
}

/// One row of the catalog.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct CatalogEntry {
    /// The subscription's name.
    pub name: String,
    /// Its filter as JSON text, as [`CatalogRecord::filter`].
    pub filter: String,
    /// The `[sinks.NAME]` that delivers it.
    pub sink: String,
    /// Active or paused.
    pub state: SubscriptionState,
    /// When `migrate` first recorded it.
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
}

/// What [`SubscriptionCatalog::record`] did with one entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recorded {
    /// A new row.
    Added,
    /// Its filter or sink changed.
    Updated,
    /// Already there as it is.
    Unchanged,
}

/// The subscription catalog of one outbox table.
///
/// Every call is one short statement (or one transaction for [`record`]); the fan-out calls
/// [`list`] once per batch, after the batch was claimed.
///
/// [`record`]: SubscriptionCatalog::record
/// [`list`]: SubscriptionCatalog::list
pub trait SubscriptionCatalog: Send + Sync {
    /// Creates the catalog table if needed and inserts or updates `records` (name, filter,
    /// sink; a new row in the record's state) in one transaction; never removes a row and
    /// never changes the state of a row already there.
    fn record<'a>(
        &'a self,
        records: &'a [CatalogRecord],
    ) -> BoxFuture<'a, Result<Vec<(String, Recorded)>, SourceError>>;
    /// Every catalogued subscription, by name. A missing catalog table is an error that says
    /// to run `outbox migrate`.
    fn list(&self) -> BoxFuture<'_, Result<Vec<CatalogEntry>, SourceError>>;
    /// Sets `name`'s state; `false` when there is no such subscription.
    fn set_state<'a>(
        &'a self,
        name: &'a str,
        state: SubscriptionState,
    ) -> BoxFuture<'a, Result<bool, SourceError>>;
    /// Deletes `name`'s row; `false` when there is no such subscription. The subscription's
    /// table is left to the caller.
    fn remove<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<bool, SourceError>>;
}

/// The catalog table of outbox table `table`: `<table>_subscriptions`.
pub fn catalog_table(table: &crate::Identifier) -> Result<crate::Identifier, String> {
    crate::Identifier::new(format!("{table}_subscriptions"))
        .map_err(|e| format!("the subscription catalog's table name {e}"))
}

/// Compares a stored row with a record to say what [`SubscriptionCatalog::record`] did.
pub fn recorded(before: Option<(&str, &str)>, record: &CatalogRecord) -> Recorded {
    match before {
        None => Recorded::Added,
        Some((filter, sink)) if filter == record.filter && sink == record.sink => {
            Recorded::Unchanged
        }
        Some(_) => Recorded::Updated,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_read_back_what_they_write() {
        for s in [SubscriptionState::Active, SubscriptionState::Paused] {
            assert_eq!(SubscriptionState::parse(s.as_str()).ok(), Some(s));
        }
        assert!(SubscriptionState::parse("stopped").is_err());
    }

    #[test]
    fn record_outcome_compares_filter_and_sink() {
        let r = CatalogRecord {
            name: "a".into(),
            filter: "{}".into(),
            sink: "k".into(),
            state: SubscriptionState::Active,
        };
        assert_eq!(recorded(None, &r), Recorded::Added);
        assert_eq!(recorded(Some(("{}", "k")), &r), Recorded::Unchanged);
        assert_eq!(recorded(Some(("{}", "j")), &r), Recorded::Updated);
    }
}
