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

use crate::admin::source_error;

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
    let backend = crate::admin::open(config, 2).await?;
    let now = OffsetDateTime::now_utc();
    let story = match backend
        .explain()?
        .explain(args.id, now)
        .await
        .map_err(source_error)?
    {
        Explanation::Found(story) => story,
        Explanation::NotFound { message, notes } => {
            for note in &notes {
                eprintln!("{note}");
            }
            bail!("{message}");
        }
    };
    if args.json {
        let v = story::story_json(&config.sink, &story)?;
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    for line in story::story_lines(&config.sink, &story, now) {
        println!("{line}");
    }
    Ok(())
}
