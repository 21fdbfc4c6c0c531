//! The subscription catalog as the runtime and the CLI read it: the subscriptions `outbox
//! migrate` recorded in `<table>_subscriptions`, with their filters parsed
//! (docs/subscriptions.md, "Subscriptions known to the database").
//!
//! - [`read`] / [`find`]: the catalogued subscriptions of an opened outbox backend (what the
//!   fan-out routes by, what `outbox backfill --subscription NAME` filters by);
//! - [`record`]: `outbox migrate`'s part, the file's `[[subscription]]` entries inserted or
//!   updated, never removed.

use outbox_core::Unsupported;
use outbox_core::backend::Backend;
pub use outbox_core::catalog::{CatalogEntry, SubscriptionState};
use outbox_core::catalog::{CatalogRecord, Recorded, SubscriptionCatalog};
use outbox_core::source::SourceError;
use time::OffsetDateTime;

use crate::config::Config;
use crate::config::subscription::Filter;

/// One catalogued subscription, its filter parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CatalogedSubscription {
    /// Its name (its table is `<table>_sub_<name>`).
    pub name: String,
    /// Which events the fan-out copies into its table.
    pub filter: Filter,
    /// The `[sinks.NAME]` that delivers it (a relay whose file lacks it only copies).
    pub sink: String,
    /// Active, or paused (copied into, not delivered).
    pub state: SubscriptionState,
    /// When `outbox migrate` first recorded it.
    pub created_at: OffsetDateTime,
}

/// Why the catalog could not be read or changed.
#[derive(Debug, thiserror::Error)]
pub enum CatalogError {
    /// This database kind has no subscriptions.
    #[error(transparent)]
    Unsupported(#[from] Unsupported),
    /// The database refused or is unreachable (a missing catalog says to run migrate).
    #[error(transparent)]
    Source(#[from] SourceError),
    /// No catalogued subscription has this name.
    #[error("no subscription named `{name}` in the catalog (catalogued: {})", known_list(.known))]
    Unknown {
        /// The name asked for.
        name: String,
        /// The catalogued names.
        known: Vec<String>,
    },
    /// A stored filter does not parse (written by another version, or by hand).
    #[error("subscription `{name}`: {message}")]
    Filter {
        /// The subscription.
        name: String,
        /// What is wrong.
        message: String,
    },
}

fn known_list(known: &[String]) -> String {
    if known.is_empty() {
        "none; `outbox migrate` records the file's [[subscription]] entries".to_owned()
    } else {
        known.join(", ")
    }
}

/// The backend's catalog, or why it has none.
pub fn catalog_of(backend: &dyn Backend) -> Result<&dyn SubscriptionCatalog, CatalogError> {
    Ok(backend.catalog()?)
}

/// Parses a catalog row.
pub fn parse(entry: CatalogEntry) -> Result<CatalogedSubscription, CatalogError> {
    let filter = Filter::from_json(&entry.filter).map_err(|message| CatalogError::Filter {
        name: entry.name.clone(),
        message,
    })?;
    Ok(CatalogedSubscription {
        name: entry.name,
        filter,
        sink: entry.sink,
        state: entry.state,
        created_at: entry.created_at,
    })
}

/// Every catalogued subscription of the outbox `backend`, by name.
pub async fn read(backend: &dyn Backend) -> Result<Vec<CatalogedSubscription>, CatalogError> {
    catalog_of(backend)?
        .list()
        .await?
        .into_iter()
        .map(parse)
        .collect()
}

/// The catalogued subscription `name` of the outbox `backend`; [`CatalogError::Unknown`]
/// names the catalogued ones.
pub async fn find(
    backend: &dyn Backend,
    name: &str,
) -> Result<CatalogedSubscription, CatalogError> {
    let all = read(backend).await?;
    let known: Vec<String> = all.iter().map(|s| s.name.clone()).collect();
    all.into_iter()
        .find(|s| s.name == name)
        .ok_or_else(|| CatalogError::Unknown {
            name: name.to_owned(),
            known,
        })
}

/// A relay whose file has no `[[subscription]]` (a plain `[sink]`) marks events delivered
/// without copying them anywhere: beside a fan-out, every catalogued subscription would miss
/// the events it takes. Refused, naming them, when the outbox's catalog has any. A catalog
/// that cannot be read (a kind without one, a table not created yet) refuses nothing.
pub async fn refuse_plain_relay_beside_a_fan_out(backend: &dyn Backend) -> Result<(), String> {
    let Ok(catalog) = catalog_of(backend) else {
        return Ok(());
    };
    let listed = match catalog.list().await {
        Ok(listed) => listed,
        Err(e) => {
            tracing::debug!(error = %e, "no subscription catalog to check");
            return Ok(());
        }
    };
    if listed.is_empty() {
        return Ok(());
    }
    let names: Vec<&str> = listed.iter().map(|e| e.name.as_str()).collect();
    Err(format!(
        "outbox table {} fans out to catalogued subscriptions ({}), and this configuration has a single [sink] and no [[subscription]]: it would mark events delivered without copying them into those subscriptions' tables. Add the [[subscription]] entries (and their [sinks.NAME]) to this file, or remove the subscriptions with `outbox subscription remove NAME`",
        backend.table(),
        names.join(", ")
    ))
}

/// What `outbox migrate` records for the file's `[[subscription]]` entries; those new to the
/// catalog start in `new_state`.
pub fn records(
    config: &Config,
    new_state: SubscriptionState,
) -> Result<Vec<CatalogRecord>, String> {
    let resolved = config.resolve_subscriptions()?;
    Ok(config
        .subscriptions
        .iter()
        .zip(resolved)
        .map(|(entry, sub)| CatalogRecord {
            name: sub.name,
            filter: sub.filter.to_json(),
            sink: entry.sink.clone(),
            state: new_state,
        })
        .collect())
}

/// `outbox migrate`'s part: records the file's subscriptions in the catalog of the outbox
/// `backend` and returns one line per subscription, including those catalogued but no
/// longer in the file (kept: removing one is `outbox subscription remove NAME`). A
/// subscription new to the catalog starts in `new_state`: paused, the fan-out copies into its
/// table and its pipeline waits (for a backfill, then `outbox subscription resume`).
pub async fn record(
    backend: &dyn Backend,
    config: &Config,
    new_state: SubscriptionState,
) -> Result<Vec<String>, CatalogError> {
    let records = records(config, new_state).map_err(|message| CatalogError::Filter {
        name: "[[subscription]]".to_owned(),
        message,
    })?;
    let catalog = catalog_of(backend)?;
    let done = catalog.record(&records).await?;
    let mut lines: Vec<String> = done
        .into_iter()
        .map(|(name, outcome)| {
            let what = match (outcome, new_state) {
                (Recorded::Added, SubscriptionState::Active) => {
                    "recorded in the subscription catalog (fan-out starts now)".to_owned()
                }
                (Recorded::Added, SubscriptionState::Paused) => format!(
                    "recorded in the subscription catalog, paused: the fan-out copies into it from now on and nothing is delivered until `outbox subscription resume {name}` (backfill it first: `outbox backfill --subscription {name} --all`)"
                ),
                (Recorded::Updated, _) => {
                    "filter or sink updated in the subscription catalog".to_owned()
                }
                (Recorded::Unchanged, _) => "already in the subscription catalog".to_owned(),
            };
            format!("subscription `{name}`: {what}")
        })
        .collect();
    for entry in catalog.list().await? {
        if !records.iter().any(|r| r.name == entry.name) {
            lines.push(format!(
                "subscription `{}`: in the catalog but not in this file; kept (the fan-out still copies into it); remove it with `outbox subscription remove {}`",
                entry.name, entry.name
            ));
        }
    }
    Ok(lines)
}
