//! `outbox subscription list|pause|resume|remove`: the subscription catalog
//! (`<table>_subscriptions`) that every relay fans out by, and what `status` and `doctor`
//! say about it (docs/subscriptions.md, "Operating subscriptions").

use std::sync::Arc;

use anyhow::{Context, bail};
use clap::Subcommand;
use outbox_core::admin::{DoctorCheck, StatusReport};
use outbox_core::backend::{Backend, OpenOptions};
use outbox_runtime::Config;
use outbox_runtime::catalog::{self, CatalogError, CatalogedSubscription, SubscriptionState};
use time::OffsetDateTime;

use crate::backend::{open, source_error};

/// The subscription catalog's commands.
#[derive(Debug, Subcommand)]
pub(crate) enum SubscriptionCommand {
    /// List the catalogued subscriptions: state, sink, filter, and whether this file
    /// delivers them.
    List {
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Stop delivering NAME: the fan-out keeps copying its events (nothing is lost), its
    /// pipelines claim nothing until `resume`.
    Pause {
        /// The subscription.
        name: String,
    },
    /// Deliver NAME again, from its oldest undelivered event, in order.
    Resume {
        /// The subscription.
        name: String,
    },
    /// Remove NAME from the catalog: relays stop copying into it at their next batch. Refused
    /// while its table holds undelivered events, unless --force. Its table is kept.
    Remove {
        /// The subscription.
        name: String,
        /// Remove it even with undelivered events (they stay in its table, undelivered).
        #[arg(long)]
        force: bool,
    },
}

/// Runs one `outbox subscription` command.
pub(crate) async fn run(config: &Config, command: SubscriptionCommand) -> anyhow::Result<()> {
    let outbox = open(config, 1).await?;
    match command {
        SubscriptionCommand::List { json } => list(config, &*outbox, json).await,
        SubscriptionCommand::Pause { name } => {
            set_state(&*outbox, &name, SubscriptionState::Paused).await
        }
        SubscriptionCommand::Resume { name } => {
            set_state(&*outbox, &name, SubscriptionState::Active).await
        }
        SubscriptionCommand::Remove { name, force } => remove(config, &*outbox, &name, force).await,
    }
}

fn catalog_error(e: CatalogError) -> anyhow::Error {
    anyhow::anyhow!(crate::chain(&e))
}

async fn list(config: &Config, outbox: &dyn Backend, json: bool) -> anyhow::Result<()> {
    let subs = catalog::read(outbox).await.map_err(catalog_error)?;
    if json {
        let rows: Vec<serde_json::Value> = subs
            .iter()
            .map(|s| {
                serde_json::json!({
                    "name": s.name,
                    "state": s.state,
                    "sink": s.sink,
                    "filter": s.filter,
                    "created_at": s.created_at.format(&time::format_description::well_known::Rfc3339).unwrap_or_default(),
                    "delivered_by_this_file": in_file(config, &s.name),
                })
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(());
    }
    if subs.is_empty() {
        println!(
            "no subscriptions in the catalog of {} (`outbox migrate` records the file's [[subscription]] entries)",
            outbox.table()
        );
    }
    for s in &subs {
        println!(
            "{:<20} {:<6} sink {:<12} filter {}{}",
            s.name,
            s.state.as_str(),
            s.sink,
            s.filter.to_json(),
            if in_file(config, &s.name) {
                ""
            } else {
                "  (not in this file: copied into, not delivered by a relay with this file)"
            }
        );
    }
    Ok(())
}

fn in_file(config: &Config, name: &str) -> bool {
    config.subscriptions.iter().any(|s| s.name == name)
}

async fn set_state(
    outbox: &dyn Backend,
    name: &str,
    state: SubscriptionState,
) -> anyhow::Result<()> {
    let catalog = catalog::catalog_of(outbox).map_err(catalog_error)?;
    if !catalog.set_state(name, state).await.map_err(source_error)? {
        return Err(catalog_error(unknown(outbox, name).await));
    }
    match state {
        SubscriptionState::Paused => println!(
            "subscription `{name}` paused: relays keep copying its events into its table and deliver none until `outbox subscription resume {name}` (a batch already claimed finishes)"
        ),
        SubscriptionState::Active => println!(
            "subscription `{name}` resumed: its pipelines deliver its waiting events in order from their next claim"
        ),
    }
    Ok(())
}

/// The error for a name the catalog does not have, listing those it has.
async fn unknown(outbox: &dyn Backend, name: &str) -> CatalogError {
    match catalog::find(outbox, name).await {
        Err(e) => e,
        Ok(_) => CatalogError::Unknown {
            name: name.to_owned(),
            known: Vec::new(),
        },
    }
}

/// The table of catalogued subscription `name`, opened.
async fn open_table(config: &Config, name: &str) -> anyhow::Result<Arc<dyn Backend>> {
    let source = config
        .source
        .for_subscription(name)
        .map_err(|e| anyhow::anyhow!("subscription `{name}`: {e}"))?;
    source
        .open(OpenOptions { connections: 1 })
        .await
        .map_err(|e| anyhow::anyhow!(crate::chain(&e)))
}

async fn remove(
    config: &Config,
    outbox: &dyn Backend,
    name: &str,
    force: bool,
) -> anyhow::Result<()> {
    catalog::find(outbox, name).await.map_err(catalog_error)?;
    let table = open_table(config, name).await?;
    let status = table
        .status(OffsetDateTime::now_utc(), config.metrics.stuck_after)
        .await
        .map_err(source_error)
        .with_context(|| format!("reading subscription `{name}`'s table {}", table.table()))?;
    let b = &status.backlog;
    let undelivered = b.pending + b.dead;
    if undelivered > 0 && !force {
        bail!(
            "subscription `{name}` has {undelivered} undelivered event(s) in {} (pending {}, of which retrying {}; dead-lettered {}); let a relay deliver them (`outbox status --subscription {name}`), or remove it anyway with --force (the rows stay in its table)",
            table.table(),
            b.pending,
            b.retrying,
            b.dead
        );
    }
    let catalog = catalog::catalog_of(outbox).map_err(catalog_error)?;
    if !catalog.remove(name).await.map_err(source_error)? {
        return Err(catalog_error(unknown(outbox, name).await));
    }
    println!(
        "subscription `{name}` removed from the catalog: relays stop copying into it from their next batch, and its pipelines claim nothing"
    );
    println!(
        "its table {} is kept ({undelivered} undelivered event(s)); drop it by hand when you no longer need it",
        table.table()
    );
    if in_file(config, name) {
        println!(
            "this file still has [[subscription]] `{name}`: remove it, or the next `outbox migrate` records it again"
        );
    }
    Ok(())
}

/// The catalog as `status` and `doctor` read it: `None` when this database has no catalog,
/// or it does not exist yet and the file has no subscriptions.
pub(crate) async fn catalogued(
    config: &Config,
    outbox: &dyn Backend,
) -> anyhow::Result<Option<Vec<CatalogedSubscription>>> {
    match catalog::read(outbox).await {
        Ok(subs) => Ok(Some(subs)),
        Err(CatalogError::Unsupported(_)) => Ok(None),
        Err(_) if config.subscriptions.is_empty() => Ok(None),
        Err(e) => Err(catalog_error(e)),
    }
}

/// One subscription as `outbox status` shows it: its table's status and what the catalog
/// says (`None`: not catalogued, so no relay copies into it).
pub(crate) struct SubscriptionStatus {
    pub(crate) name: String,
    pub(crate) status: StatusReport,
    pub(crate) catalog: Option<CatalogedSubscription>,
    pub(crate) in_file: bool,
}

impl SubscriptionStatus {
    /// The words after the backlog on its `status` line.
    pub(crate) fn remark(&self) -> String {
        match (&self.catalog, self.in_file) {
            (None, _) => {
                "NOT IN THE CATALOG: nothing is copied into it; run `outbox migrate`".to_owned()
            }
            (Some(c), false) => format!(
                "{}; not in this file (no [[subscription]] with its [sinks.{}]): copied into, delivered only by a relay whose file has it",
                c.state.as_str(),
                c.sink
            ),
            (Some(c), true) => c.state.as_str().to_owned(),
        }
    }

    /// The JSON of `status --json`'s `subscriptions.NAME`.
    pub(crate) fn to_json(&self) -> anyhow::Result<serde_json::Value> {
        let mut value = serde_json::to_value(&self.status)?;
        if let Some(object) = value.as_object_mut() {
            object.insert(
                "state".into(),
                match &self.catalog {
                    Some(c) => serde_json::to_value(c.state)?,
                    None => "not_catalogued".into(),
                },
            );
            object.insert(
                "sink".into(),
                self.catalog.as_ref().map(|c| c.sink.clone()).into(),
            );
            object.insert("delivered_by_this_file".into(), self.in_file.into());
        }
        Ok(value)
    }
}

/// The status of every subscription: the file's, in file order, then the catalogued ones
/// the file lacks.
pub(crate) async fn statuses(
    config: &Config,
    outbox: &dyn Backend,
    now: OffsetDateTime,
) -> anyhow::Result<Vec<SubscriptionStatus>> {
    let catalogued = catalogued(config, outbox).await?.unwrap_or_default();
    let mut names: Vec<String> = config
        .subscriptions
        .iter()
        .map(|s| s.name.clone())
        .collect();
    names.extend(
        catalogued
            .iter()
            .filter(|c| !in_file(config, &c.name))
            .map(|c| c.name.clone()),
    );
    let mut out = Vec::with_capacity(names.len());
    for name in names {
        let table = open_table(config, &name).await?;
        let status = table
            .status(now, config.metrics.stuck_after)
            .await
            .map_err(|e| {
                anyhow::anyhow!(
                    "subscription `{name}` ({}): {}",
                    table.table(),
                    crate::chain(&e)
                )
            })?;
        out.push(SubscriptionStatus {
            catalog: catalogued.iter().find(|c| c.name == name).cloned(),
            in_file: in_file(config, &name),
            name,
            status,
        });
    }
    Ok(out)
}

/// `outbox doctor`'s catalog checks: a file subscription not recorded (red: nothing is copied
/// into it), a catalogued one this file cannot deliver (warn), a paused one (warn).
pub(crate) async fn doctor(config: &Config) -> Vec<DoctorCheck> {
    let outbox = match open(config, 1).await {
        Ok(b) => b,
        Err(_) => return Vec::new(), // the database check says why
    };
    let catalogued = match catalogued(config, &*outbox).await {
        Ok(Some(c)) => c,
        Ok(None) => return Vec::new(),
        Err(e) => {
            return vec![DoctorCheck::red(
                "subscription_catalog",
                format!("{e:#}"),
                "run `outbox migrate` (it records the file's [[subscription]] entries)",
            )];
        }
    };
    let mut out = Vec::new();
    for sub in &config.subscriptions {
        if !catalogued.iter().any(|c| c.name == sub.name) {
            out.push(DoctorCheck::red(
                "subscription_catalog",
                format!("subscription `{}` is in this file but not in the catalog: no relay copies events into it", sub.name),
                "run `outbox migrate` with this file",
            ));
        }
    }
    for c in &catalogued {
        if !in_file(config, &c.name) {
            out.push(DoctorCheck::warn(
                "subscription_catalog",
                format!(
                    "subscription `{}` is catalogued but this file has no [[subscription]] `{}` with its [sinks.{}]: a relay with this file copies its events and delivers none",
                    c.name, c.name, c.sink
                ),
                format!(
                    "add [sinks.{}] and its [[subscription]] `{}` to this file, or run a relay whose file has them, or `outbox subscription remove {}`",
                    c.sink, c.name, c.name
                ),
            ));
        }
        if c.state == SubscriptionState::Paused {
            out.push(DoctorCheck::warn(
                "subscription_catalog",
                format!(
                    "subscription `{}` is paused: its events wait in its table",
                    c.name
                ),
                format!("`outbox subscription resume {}`", c.name),
            ));
        }
    }
    if out.is_empty() {
        out.push(DoctorCheck::ok(
            "subscription_catalog",
            format!(
                "{} subscription(s) catalogued, every one delivered by this file",
                catalogued.len()
            ),
        ));
    }
    out
}
