//! `outbox capture install|remove|snapshot|list`: business tables as event sources (docs/capture.md),
//! through the backend's capture support (PostgreSQL, SQLite, MySQL/MariaDB: row triggers
//! per `[[capture]]` entry, writing the event into the outbox table in the business
//! transaction).

use anyhow::bail;
use clap::Subcommand;
use outbox_core::Identifier;
use outbox_core::capture::{CaptureEntry, CaptureError, InstalledCapture, validate_all};
use outbox_runtime::Config;

mod snapshot;

/// `outbox capture` subcommands.
#[derive(Debug, Subcommand)]
pub(crate) enum CaptureCommand {
    /// Install (or replace) the trigger of every `[[capture]]` entry of the config, all in one
    /// transaction: every entry, or nothing.
    Install {
        /// Only the entry with this name (its `name`, or its table's name).
        #[arg(long)]
        name: Option<Identifier>,
    },
    /// Remove the trigger and function of every `[[capture]]` entry, or of one capture by
    /// name (also one no longer in the config).
    Remove {
        /// Only the capture with this name.
        #[arg(long)]
        name: Option<Identifier>,
    },
    /// Turn the rows already in each captured table (or in one) into events
    /// (`capture_op: snapshot`) while the application keeps writing: chunk by chunk in
    /// primary-key order, each chunk one short transaction; resumes after a kill.
    Snapshot {
        /// Only the capture with this name (its `name`, or its table's name).
        #[arg(long)]
        name: Option<Identifier>,
        /// At most this many rows per second (chunks of about a tenth of that, 1 to 2,000
        /// rows), so the application's transactions keep their pace.
        #[arg(long, value_name = "ROWS_PER_S", default_value_t = snapshot::DEFAULT_RATE,
              value_parser = clap::value_parser!(u32).range(1..))]
        rate: u32,
    },
    /// List the captures installed in the database for the configured outbox table.
    List {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

pub(crate) async fn run(config: &Config, command: CaptureCommand) -> anyhow::Result<()> {
    let e = |e: CaptureError| anyhow::anyhow!(crate::chain(&e));
    match command {
        CaptureCommand::Install { name } => {
            validate_all(&config.capture).map_err(|m| anyhow::anyhow!(m))?;
            let entries = selected(config, name.as_ref())?;
            let backend = crate::backend::open(config, 1).await?;
            let capture = backend.capture()?;
            for line in capture.install(&entries).await.map_err(e)? {
                println!("{line}");
            }
        }
        CaptureCommand::Remove { name } => {
            let names: Vec<Identifier> = match name {
                Some(n) => vec![n],
                None => {
                    validate_all(&config.capture).map_err(|m| anyhow::anyhow!(m))?;
                    if config.capture.is_empty() {
                        bail!(
                            "no [[capture]] entry in the configuration: nothing to remove (pass --name NAME for a capture no longer configured; `outbox capture list` shows what is installed)"
                        );
                    }
                    config.capture.iter().map(|c| c.name()).collect()
                }
            };
            let backend = crate::backend::open(config, 1).await?;
            let capture = backend.capture()?;
            for line in capture.remove(&names).await.map_err(e)? {
                println!("{line}");
            }
        }
        CaptureCommand::Snapshot { name, rate } => {
            validate_all(&config.capture).map_err(|m| anyhow::anyhow!(m))?;
            let entries = selected(config, name.as_ref())?;
            let backend = crate::backend::open(config, 2).await?;
            let capture = backend.capture()?;
            for entry in entries {
                snapshot::run(capture, entry, rate).await?;
            }
        }
        CaptureCommand::List { json } => {
            let backend = crate::backend::open(config, 1).await?;
            let capture = backend.capture()?;
            let list = capture.list().await.map_err(e)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&list)?);
            } else if list.is_empty() {
                println!("no capture writes into outbox table {}", backend.table());
            } else {
                for c in &list {
                    println!("{}", describe(c));
                }
            }
        }
    }
    Ok(())
}

/// The entries to install: all, or the one named `name`.
fn selected<'a>(
    config: &'a Config,
    name: Option<&Identifier>,
) -> anyhow::Result<Vec<CaptureEntry<'a>>> {
    let all = config
        .capture
        .iter()
        .enumerate()
        .map(|(index, config)| CaptureEntry { index, config });
    let entries: Vec<CaptureEntry<'a>> = match name {
        None => all.collect(),
        Some(n) => all.filter(|e| e.config.name() == *n).collect(),
    };
    if entries.is_empty() {
        match name {
            None => bail!(
                "no [[capture]] entry in the configuration: add one (table, aggregate_type, aggregate_id, event_type; see docs/capture.md)"
            ),
            Some(n) => bail!(
                "--name {n}: no [[capture]] entry has this name (configured: {})",
                config
                    .capture
                    .iter()
                    .map(|c| c.name().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }
    }
    Ok(entries)
}

/// One installed capture on one line.
fn describe(c: &InstalledCapture) -> String {
    let on =
        c.on.iter()
            .map(|o| o.as_str())
            .collect::<Vec<_>>()
            .join(", ");
    let mut line = match &c.table {
        Some(table) => format!(
            "{:<20} on {table} ({on}){}",
            c.name,
            if c.enabled {
                ""
            } else {
                " DISABLED: writes produce no event"
            }
        ),
        None => format!(
            "{:<20} NO TRIGGER: {} is installed but no table's trigger uses it; `outbox capture install` or `remove` it",
            c.name, c.function
        ),
    };
    if let Some(config) = &c.config {
        let event_type = match (&config.event_type, &config.event_type_column) {
            (Some(t), _) => format!("{t:?}"),
            (None, Some(col)) => format!("column {col}"),
            (None, None) => "?".to_owned(),
        };
        line.push_str(&format!(
            ": aggregate {:?} / column {}, event_type {event_type}, payload {}",
            config.aggregate_type, config.aggregate_id, config.payload
        ));
    }
    line
}
