//! `outbox dead list|show|retry|purge`: inspect and act on dead letters, through the
//! backend's dead-letter store (with every attempt's error where the backend keeps them).

use std::io::{BufRead, IsTerminal, Write};

use anyhow::{Context, bail};
use clap::{Args, Subcommand};
use outbox_core::SourceError;
use outbox_core::admin::RetrySelection;
use outbox_runtime::{Config, story};
use time::OffsetDateTime;
use uuid::Uuid;

/// `outbox dead` subcommands.
#[derive(Debug, Subcommand)]
pub(crate) enum DeadCommand {
    /// List dead letters, oldest first.
    List {
        /// Only this event type.
        #[arg(long = "type")]
        event_type: Option<String>,
        /// Only this aggregate id.
        #[arg(long)]
        aggregate: Option<String>,
        /// At most this many.
        #[arg(long, default_value_t = 100)]
        limit: i64,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Show one event: payload, headers, and every attempt's error.
    Show {
        /// Event id.
        id: Uuid,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Put dead letters back in line (per-aggregate order is kept: a retried event is
    /// delivered before the later events of its aggregate).
    Retry(RetryArgs),
    /// Delete dead letters older than a given age.
    Purge {
        /// Age, e.g. `7d`, `12h`.
        #[arg(long, value_parser = humantime::parse_duration)]
        older_than: std::time::Duration,
        /// Only this event type.
        #[arg(long = "type")]
        event_type: Option<String>,
        /// Do not ask for confirmation.
        #[arg(long)]
        yes: bool,
    },
}

/// Which dead letters to retry: ids, `--type T` or `--all`.
#[derive(Debug, Args)]
#[group(required = true, multiple = false)]
pub(crate) struct RetryArgs {
    /// Event ids.
    ids: Vec<Uuid>,
    /// Every dead letter of this event type.
    #[arg(long = "type")]
    event_type: Option<String>,
    /// Every dead letter.
    #[arg(long)]
    all: bool,
}

pub(crate) use outbox_core::admin::when;

pub(crate) async fn run(config: &Config, command: DeadCommand) -> anyhow::Result<()> {
    let backend = crate::backend::open(config, 1).await?;
    let dead = backend.dead_letters()?;
    let e = |e: SourceError| anyhow::anyhow!(crate::chain(&e));
    match command {
        DeadCommand::List {
            event_type,
            aggregate,
            limit,
            json,
        } => {
            let list = dead
                .list(event_type.as_deref(), aggregate.as_deref(), limit)
                .await
                .map_err(e)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&list)?);
            } else if list.is_empty() {
                println!("no dead letters");
            } else {
                println!(
                    "{:<36}  {:<28}  {:<20}  {:>8}  reason",
                    "id", "aggregate", "event_type", "attempts"
                );
                for d in &list {
                    let aggregate = format!("{}/{}", d.aggregate_type, d.aggregate_id);
                    let reason: String = d
                        .reason
                        .as_deref()
                        .unwrap_or("-")
                        .chars()
                        .take(80)
                        .collect();
                    println!(
                        "{:<36}  {:<28}  {:<20}  {:>8}  {reason}",
                        d.id, aggregate, d.event_type, d.attempts
                    );
                }
            }
        }
        DeadCommand::Show { id, json } => {
            let detail = dead
                .show(id)
                .await
                .map_err(e)?
                .with_context(|| format!("no event with id {id}"))?;
            if json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&story::event_json(&detail)?)?
                );
            } else {
                for line in story::detail_lines(&detail) {
                    println!("{line}");
                }
            }
        }
        DeadCommand::Retry(args) => {
            let selection = if args.all {
                RetrySelection::All
            } else if let Some(t) = args.event_type {
                RetrySelection::EventType(t)
            } else {
                RetrySelection::Ids(args.ids.clone())
            };
            let retried = dead.retry(&selection).await.map_err(e)?;
            if let RetrySelection::Ids(asked) = &selection {
                for id in asked.iter().filter(|id| !retried.contains(id)) {
                    eprintln!("warning: {id} is not a dead letter (unknown id, or not dead)");
                }
            }
            println!("{} dead letter(s) put back in line", retried.len());
        }
        DeadCommand::Purge {
            older_than,
            event_type,
            yes,
        } => {
            let before = OffsetDateTime::now_utc() - older_than;
            if !yes
                && !confirm(&format!(
                    "Delete dead letters dead-lettered before {before}{}? [y/N] ",
                    event_type
                        .as_deref()
                        .map(|t| format!(" of type {t}"))
                        .unwrap_or_default()
                ))?
            {
                bail!("not confirmed; nothing deleted (pass --yes to skip the question)");
            }
            let purged = dead.purge(before, event_type.as_deref()).await.map_err(e)?;
            println!("{} dead letter(s) deleted", purged.len());
        }
    }
    Ok(())
}

fn confirm(question: &str) -> anyhow::Result<bool> {
    if !std::io::stdin().is_terminal() {
        bail!("refusing to delete without confirmation: stdin is not a terminal; pass --yes");
    }
    eprint!("{question}");
    std::io::stderr().flush()?;
    let mut answer = String::new();
    std::io::stdin().lock().read_line(&mut answer)?;
    Ok(matches!(answer.trim(), "y" | "Y" | "yes"))
}
