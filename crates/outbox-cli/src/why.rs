//! `outbox why EVENT_ID`: the story of one event. When it was written, every failed
//! attempt, when and where it was published, or what it waits for: its backoff, an earlier
//! event of its aggregate, a relay publishing it right now, or (not visible yet) the open
//! transaction that wrote it.

use anyhow::bail;
use clap::Args;
use outbox_core::admin::Explanation;
use outbox_runtime::{Config, story};
use time::OffsetDateTime;
use uuid::Uuid;

use crate::backend::source_error;

/// `outbox why` arguments.
#[derive(Debug, Args)]
pub(crate) struct WhyArgs {
    /// The event id (UUID).
    id: Uuid,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

pub(crate) async fn run(config: &Config, args: WhyArgs) -> anyhow::Result<()> {
    let now = OffsetDateTime::now_utc();
    let story = match explain(config, args.id, now).await? {
        Explanation::Found(story) => story,
        Explanation::NotFound { message, notes } => {
            for note in &notes {
                eprintln!("{note}");
            }
            bail!("{message}");
        }
    };
    if config.subscriptions.is_empty() {
        if args.json {
            let v = story::story_json(&config.sink, &story)?;
            println!("{}", serde_json::to_string_pretty(&v)?);
        } else {
            for line in story::story_lines(&config.sink, &story, now) {
                println!("{line}");
            }
        }
        return Ok(());
    }
    // With subscriptions, "delivered" in the outbox means "fanned out": the story goes on in
    // each subscription's table.
    let mut json = serde_json::Map::new();
    if !args.json {
        println!("outbox table:");
        for line in story::story_lines(&config.sink, &story, now) {
            // Delivered here means copied by the fan-out; `[sink]` is unused.
            match line.split_once(" to ") {
                Some((head, _)) if line.starts_with("why ") && line.contains("delivered at") => {
                    println!(
                        "  {} to the subscription tables that take it (the fan-out)",
                        head.replacen("delivered", "copied", 1)
                    );
                }
                _ => println!("  {line}"),
            }
        }
    }
    for sub in &config.subscriptions {
        let one = outbox_runtime::subscription::for_subscription(config, &sub.name)
            .map_err(|e| anyhow::anyhow!(e))?;
        match explain(&one, args.id, now).await? {
            Explanation::Found(story) if args.json => {
                json.insert(sub.name.clone(), story::story_json(&one.sink, &story)?);
            }
            Explanation::Found(story) => {
                println!("subscription `{}`:", sub.name);
                for line in story::story_lines(&one.sink, &story, now) {
                    println!("  {line}");
                }
            }
            Explanation::NotFound { .. } if args.json => {
                json.insert(sub.name.clone(), serde_json::Value::Null);
            }
            Explanation::NotFound { .. } => println!(
                "subscription `{}`: not in its table (its filter does not take this event, the fan-out has not copied it yet, or retention removed it)",
                sub.name
            ),
        }
    }
    if args.json {
        let mut outbox = story::story_json(&config.sink, &story)?;
        outbox["destination"] = serde_json::Value::from("fan-out");
        let v = serde_json::json!({
            "outbox": outbox,
            "subscriptions": json,
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
    }
    Ok(())
}

/// The story of `id` in the table of `config`'s `[source]`.
async fn explain(config: &Config, id: Uuid, now: OffsetDateTime) -> anyhow::Result<Explanation> {
    let backend = crate::backend::open(config, 2).await?;
    backend
        .explain()?
        .explain(id, now)
        .await
        .map_err(source_error)
}
