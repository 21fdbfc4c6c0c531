//! `outbox why EVENT_ID`: the story of one event. When it was written, every failed
//! attempt, when and where it was published, or what it waits for: its backoff, an earlier
//! event of its aggregate, a relay publishing it right now, or (not visible yet) the open
//! transaction that wrote it.

use anyhow::{Context, bail};
use clap::Args;
use outbox_core::{Event, Position};
use outbox_postgres::{EventStory, OpenTransaction, PgInspector, StoredEventDetail, Verdict};
use time::OffsetDateTime;
use uuid::Uuid;

use crate::config::{Config, SinkConfig, SourceConfig};
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
    let SourceConfig::Postgres(pg) = &config.source else {
        return sqlite(config, args).await;
    };
    let pool = outbox_postgres::connect(pg, 2)
        .await
        .with_context(|| format!("cannot connect to {}", pg.url))?;
    let inspector = PgInspector::new(pool, pg);
    let e = |e: outbox_core::SourceError| anyhow::anyhow!(crate::chain(&e));
    let now = OffsetDateTime::now_utc();
    let Some(story) = inspector.why(args.id, now).await.map_err(e)? else {
        let writers = inspector.uncommitted_writers(10).await.map_err(e)?;
        if writers.is_empty() {
            bail!(
                "no event with id {} in outbox table {} (never written, rolled back, or deleted: on_delivered = \"delete\" or retention)",
                args.id,
                pg.qualified_table()
            );
        }
        eprintln!(
            "Transactions that wrote to {} and have not committed yet (an event becomes visible, and publishable, when its transaction commits):",
            pg.qualified_table()
        );
        // A producer blocked on its aggregate's ordering lock is a writer too (the insert
        // started); say who it waits for.
        let waits = inspector.lock_waits(50).await.map_err(e)?;
        let id = args.id.to_string();
        for w in &writers {
            let mut notes = String::new();
            if let Some(lock) = waits.iter().find(|l| l.waiting_pid == w.pid) {
                notes.push_str(&format!(
                    "  <- waits for the aggregate's ordering lock held by pid {}",
                    lock.holder_pid
                ));
            }
            if w.query.as_deref().is_some_and(|q| q.contains(&id)) {
                notes.push_str("  <- its last query names this id");
            }
            eprintln!("  {}{notes}", describe(w));
        }
        bail!(
            "no committed event with id {} in outbox table {}; if one of the {} open writer(s) above wrote it, it waits for that commit",
            args.id,
            pg.qualified_table(),
            writers.len()
        );
    };
    let cdc = pg.mode == outbox_postgres::Mode::Cdc;
    let kind = if cdc { Kind::Cdc } else { Kind::Poll };
    if args.json {
        let mut v = serde_json::to_value(&story)?;
        v["event"] = event_json(&story.event)?;
        v["destination"] = serde_json::Value::from(destination(&config.sink, &story.event));
        v["cdc"] = serde_json::Value::Bool(cdc);
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    print_story(config, &story, now, kind);
    Ok(())
}

/// Which source the story comes from: what "ready" means differs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Poll,
    Cdc,
    Sqlite,
}

fn print_story(config: &Config, story: &EventStory, now: OffsetDateTime, kind: Kind) {
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
        Verdict::Ready { .. } if kind == Kind::Sqlite => format!(
            "ready: nothing holds it; the relay holding the file's lease publishes it next (to {to}). If it stays here, is `outbox relay` running? (`outbox status`)"
        ),
        Verdict::Streamed | Verdict::Ready { .. } if kind == Kind::Cdc => format!(
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
    match sink {
        SinkConfig::Nats(c) => format!("NATS subject {}", c.destination.render(&event)),
        SinkConfig::Http(c) => format!(
            "HTTP POST {}",
            outbox_core::Destination::parse(&c.url)
                .map(|d| d.render(&event))
                .unwrap_or_else(|_| c.url.clone())
        ),
        SinkConfig::Stdout(c) => format!("stdout ({})", c.destination.render(&event)),
        SinkConfig::File(c) => format!("file ({})", c.destination.render(&event)),
        #[cfg(feature = "kafka")]
        SinkConfig::Kafka(c) => format!("Kafka topic {}", c.destination.render(&event)),
        #[cfg(feature = "redis")]
        SinkConfig::Redis(c) => format!("Redis stream {}", c.destination.render(&event)),
        #[cfg(feature = "rabbitmq")]
        SinkConfig::Rabbitmq(c) => format!("RabbitMQ routing key {}", c.destination.render(&event)),
    }
}

/// One open transaction for a human: pid, state, age, query start, query.
pub(crate) fn describe(t: &OpenTransaction) -> String {
    format!(
        "pid {} ({}, user {}, application `{}`): transaction open {:.1}s, last query started {}: {}",
        t.pid,
        t.state.as_deref().unwrap_or("?"),
        t.user.as_deref().unwrap_or("?"),
        t.application_name.as_deref().unwrap_or(""),
        t.xact_age_seconds,
        t.query_start.map(when).unwrap_or_else(|| "?".to_owned()),
        t.query.as_deref().unwrap_or("").trim()
    )
}

/// SQLite: the row, its latest error, and backoff or delivery (one relay per file, no row
/// locks: nothing else can hold an event there but an earlier dead or retrying one).
async fn sqlite(config: &Config, args: WhyArgs) -> anyhow::Result<()> {
    let SourceConfig::Sqlite(sq) = &config.source else {
        bail!("unsupported source");
    };
    let pool = outbox_sqlite::connect(sq)
        .await
        .with_context(|| format!("cannot open SQLite database `{}`", sq.path.display()))?;
    let dead = outbox_sqlite::SqliteDeadLetters::new(pool, &sq.table);
    let now = OffsetDateTime::now_utc();
    let e = |e: outbox_core::SourceError| anyhow::anyhow!(crate::chain(&e));
    let Some(row) = dead.show(args.id, now).await.map_err(e)? else {
        bail!(
            "no event with id {} in outbox table {} of `{}`",
            args.id,
            sq.table,
            sq.path.display()
        );
    };
    let verdict = match (row.state.as_str(), row.backoff_until) {
        ("delivered", _) => Verdict::Delivered,
        ("dead", _) => Verdict::Dead,
        (_, Some(until)) => Verdict::Backoff { until },
        _ => match dead.blocker(&row, now).await.map_err(e)? {
            Some(b) => Verdict::BlockedByEarlier {
                blocker: outbox_postgres::Blocker {
                    id: b.id,
                    state: b.state,
                    attempts: b.attempts,
                    last_error: b.last_error,
                    backoff_until: b.backoff_until,
                    created_at: b.created_at,
                },
            },
            None => Verdict::Ready { ahead: 0 },
        },
    };
    let story = EventStory {
        event: StoredEventDetail {
            summary: outbox_postgres::DeadLetter {
                id: row.summary.id,
                aggregate_type: row.summary.aggregate_type,
                aggregate_id: row.summary.aggregate_id,
                event_type: row.summary.event_type,
                attempts: row.summary.attempts,
                reason: row.summary.reason,
                created_at: row.summary.created_at,
                dead_lettered_at: row.summary.dead_lettered_at,
            },
            state: row.state,
            payload: row.payload,
            headers: row.headers,
            delivered_at: row.delivered_at,
            seq: row.seq,
            attempt_errors: Vec::new(),
            backoff_until: row.backoff_until,
        },
        verdict,
    };
    if args.json {
        let mut v = serde_json::to_value(&story)?;
        v["event"] = event_json(&story.event)?;
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        print_story(config, &story, now, Kind::Sqlite);
    }
    Ok(())
}
