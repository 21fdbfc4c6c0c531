//! `outbox why EVENT_ID`: the story of one event. When it was written, every failed
//! attempt, when and where it was published, or what it waits for: its backoff, an earlier
//! event of its aggregate, a relay publishing it right now, or (not visible yet) the open
//! transaction that wrote it.

use anyhow::bail;
use clap::Args;
use outbox_core::admin::{DeliveryModel, EventStory, Explanation, StoredEventDetail, Verdict};
use outbox_core::{Event, Position};
use outbox_runtime::{Config, SinkConfig};
use time::OffsetDateTime;
use uuid::Uuid;

use crate::admin::source_error;
use crate::dead::{event_json, print_attempts, print_body, when};

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
        let mut v = serde_json::to_value(&story)?;
        v["event"] = event_json(&story.event)?;
        v["destination"] = serde_json::Value::from(destination(&config.sink, &story.event));
        v["cdc"] = serde_json::Value::Bool(story.model == DeliveryModel::Stream);
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    print_story(config, &story, now);
    Ok(())
}

fn print_story(config: &Config, story: &EventStory, now: OffsetDateTime) {
    let model = story.model;
    let d = &story.event;
    let s = &d.summary;
    println!("event        {}", s.id);
    println!("aggregate    {}/{}", s.aggregate_type, s.aggregate_id);
    println!("event type   {}", s.event_type);
    println!("created      {}", when(s.created_at));
    println!("state        {} (seq {})", d.state, d.seq);
    print_attempts(d);
    print_body(d);
    let to = destination(&config.sink, d);
    let why = match &story.verdict {
        Verdict::Delivered => format!(
            "delivered at {} to {to} (per the current [sink] config)",
            d.delivered_at.map(when).unwrap_or_else(|| "?".to_owned())
        ),
        Verdict::Dead => format!(
            "dead-lettered at {}: {}. Fix the cause, then `outbox dead retry {}`",
            s.dead_lettered_at
                .map(when)
                .unwrap_or_else(|| "?".to_owned()),
            s.reason.as_deref().unwrap_or("-"),
            s.id
        ),
        Verdict::Backoff { until } => format!(
            "waiting on backoff: attempt {} failed; next attempt at {} (in {:.0}s), then to {to}",
            s.attempts,
            when(*until),
            (*until - now).as_seconds_f64().max(0.0)
        ),
        Verdict::BlockedByEarlier { blocker: b } => {
            let what = match (b.state.as_str(), b.backoff_until) {
                ("dead", _) => format!(
                    "a dead letter ({} failed attempts; last error: {}); `outbox dead retry {}` releases the aggregate",
                    b.attempts,
                    b.last_error.as_deref().unwrap_or("-"),
                    b.id
                ),
                (_, Some(until)) => format!(
                    "retrying: attempt {} failed ({}); next attempt at {}",
                    b.attempts,
                    b.last_error.as_deref().unwrap_or("-"),
                    when(until)
                ),
                _ => "pending, ready: it goes first".to_owned(),
            };
            format!(
                "waiting for an earlier event of {}/{} (per-aggregate order): {} written {}, {what}. `outbox why {}` tells its story",
                s.aggregate_type,
                s.aggregate_id,
                b.id,
                when(b.created_at),
                b.id
            )
        }
        Verdict::Claimed => {
            format!("being published right now: a relay holds its claim (destination {to})")
        }
        Verdict::Ready { .. } if model == DeliveryModel::Lease => format!(
            "ready: nothing holds it; the relay holding the file's lease publishes it next (to {to}). If it stays here, is `outbox relay` running? (`outbox status`)"
        ),
        Verdict::Streamed | Verdict::Ready { .. } if model == DeliveryModel::Stream => format!(
            "CDC mode: delivery is not recorded per row; a running relay streams it when its transaction's commit is decoded (to {to}). `outbox status` shows the slot's lag and who streams from it"
        ),
        Verdict::Streamed => format!("streamed by the CDC relay (to {to})"),
        Verdict::Ready { ahead } => format!(
            "ready: nothing holds it; {ahead} pending event(s) not in backoff are ahead of it in claim order. If it stays here, is a relay running and reaching the broker? (`outbox status`, `outbox doctor`)"
        ),
    };
    println!("why          {why}");
}

/// The destination the event goes (or went) to, from the sink's template.
fn destination(sink: &SinkConfig, d: &StoredEventDetail) -> String {
    let s = &d.summary;
    let event = Event {
        id: s.id,
        position: Position(d.seq),
        aggregate_type: s.aggregate_type.clone(),
        aggregate_id: s.aggregate_id.clone(),
        event_type: s.event_type.clone(),
        payload: Default::default(),
        headers: Vec::new(),
        created_at: s.created_at,
        attempts: 0,
    };
    sink.describe_destination(&event)
}
