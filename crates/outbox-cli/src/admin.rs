//! `outbox migrate` and `outbox status`.

use outbox_core::admin::when;
use outbox_runtime::Config;
use time::OffsetDateTime;

use crate::backend::{open, source_error};

/// `outbox migrate`'s options.
#[derive(Debug, clap::Args)]
pub(crate) struct MigrateArgs {
    /// Record the `[[subscription]]` entries new to the subscription catalog as paused: the
    /// fan-out copies every event into their tables from now on, and nothing is delivered
    /// until `outbox subscription resume NAME`. Backfill them in between (`outbox backfill
    /// --subscription NAME --all`): with nothing delivered yet, every older event goes in
    /// line ahead of the copies. Subscriptions already catalogued keep their state.
    #[arg(long)]
    paused: bool,
}

/// Creates or upgrades the outbox schema.
pub(crate) async fn migrate(config: &Config, args: MigrateArgs) -> anyhow::Result<()> {
    let backend = open(config, 1).await?;
    for line in backend.migrate().await.map_err(source_error)? {
        println!("{line}");
    }
    for sub in &config.subscriptions {
        let one = outbox_runtime::subscription::for_subscription(config, &sub.name)
            .map_err(|e| anyhow::anyhow!(e))?;
        let backend = open(&one, 1).await?;
        for line in backend.migrate().await.map_err(source_error)? {
            println!("subscription `{}`: {line}", sub.name);
        }
        if let Some(line) = claim_check_expiry(config, &one.sink).await? {
            println!("subscription `{}`: {line}", sub.name);
        }
    }
    let new_state = if args.paused {
        outbox_runtime::catalog::SubscriptionState::Paused
    } else {
        outbox_runtime::catalog::SubscriptionState::Active
    };
    match outbox_runtime::catalog::record(&*backend, config, new_state).await {
        Ok(lines) => lines.iter().for_each(|line| println!("{line}")),
        Err(outbox_runtime::catalog::CatalogError::Unsupported(_))
            if config.subscriptions.is_empty() => {}
        Err(e) => anyhow::bail!("recording the subscription catalog: {}", crate::chain(&e)),
    }
    if config.subscriptions.is_empty()
        && let Some(line) = claim_check_expiry(config, &config.sink).await?
    {
        println!("{line}");
    }
    Ok(())
}

/// `outbox migrate`'s part for a sink with a claim-check store: the rule that expires stored
/// payloads after `keep` (docs/payloads.md). `None` without claim-check.
async fn claim_check_expiry(
    config: &Config,
    sink: &outbox_runtime::SinkConfig,
) -> anyhow::Result<Option<String>> {
    let options = sink.payload(&config.payload.options());
    if options.claim_check.is_none() {
        return Ok(None);
    }
    let Some(encoder) = outbox_payload::Encoder::connect(&options, sink.message_limit())
        .await
        .map_err(|e| anyhow::anyhow!("claim_check: {}", e.report()))?
    else {
        return Ok(None);
    };
    match encoder.ensure_expiry().await {
        Some(Ok(done)) => Ok(Some(format!("claim_check: {done}"))),
        Some(Err(e)) => Err(anyhow::anyhow!("claim_check: {}", e.report())),
        None => Ok(None),
    }
}

/// Prints the backlog and what holds delivery back.
pub(crate) async fn status(config: &Config, json: bool) -> anyhow::Result<()> {
    let backend = open(config, 1).await?;
    let now = OffsetDateTime::now_utc();
    let status = backend
        .status(now, config.metrics.stuck_after)
        .await
        .map_err(|e| {
            anyhow::anyhow!(
                "reading outbox table {}: {}",
                backend.table(),
                crate::chain(&e)
            )
        })?;
    let subscriptions = crate::subscription_cmd::statuses(config, &*backend, now).await?;
    if json {
        let mut value = serde_json::to_value(&status)?;
        if !subscriptions.is_empty()
            && let Some(object) = value.as_object_mut()
        {
            let mut subs = serde_json::Map::new();
            for sub in &subscriptions {
                subs.insert(sub.name.clone(), sub.to_json()?);
            }
            object.insert("subscriptions".into(), subs.into());
        }
        println!("{}", serde_json::to_string_pretty(&value)?);
        return Ok(());
    }
    let b = &status.backlog;
    println!("outbox {} in {}", status.table, status.database);
    for line in &status.head_lines {
        println!("  {line}");
    }
    println!("  pending            {}", b.pending);
    println!("  retrying           {}", b.retrying);
    println!("  dead-lettered      {}", b.dead);
    println!(
        "  oldest pending     {:.1}s (not counting events waiting on backoff)",
        b.oldest_pending_age_seconds
    );
    match b.delivered_last_minute {
        Some(n) => println!("  published (1 min)  {n}"),
        None => println!("  published (1 min)  n/a (delivered rows are not kept)"),
    }
    for line in &status.detail_lines {
        println!("  {line}");
    }
    if status.held_aggregates.is_empty() && status.blocking_lines.is_empty() {
        println!("  blocked            nothing holds delivery back");
    }
    for h in &status.held_aggregates {
        let why = if h.state == "dead" {
            "dead-lettered (retry with `outbox dead retry`)".to_owned()
        } else {
            match h.next_attempt_at {
                Some(t) => format!(
                    "retrying (attempt {} failed; next at {})",
                    h.attempts,
                    when(t)
                ),
                None => format!("retrying (attempt {} failed; due now)", h.attempts),
            }
        };
        println!(
            "  held aggregate     {}/{}: head event {} {why}; {} event(s) wait behind it; last error: {}",
            h.aggregate_type,
            h.aggregate_id,
            h.head_id,
            h.waiting,
            h.last_error.as_deref().unwrap_or("-")
        );
    }
    for line in &status.blocking_lines {
        println!("  {line}");
    }
    for sub in &subscriptions {
        let (name, b) = (&sub.name, &sub.status.backlog);
        println!(
            "  subscription {name:<12} pending {}, retrying {}, dead-lettered {}, oldest pending {:.1}s, held aggregates {}, {} (details: outbox status --subscription {name})",
            b.pending,
            b.retrying,
            b.dead,
            b.oldest_pending_age_seconds,
            sub.status.held_aggregates.len(),
            sub.remark()
        );
    }
    Ok(())
}
