//! The database-neutral records the operator commands show: stored events and dead letters,
//! the story of one event (`outbox why`), doctor checks, retention and replay plans, and the
//! backlog view (`outbox status`). Every backend fills the same types; the CLI prints them.

use std::time::Duration;

use time::OffsetDateTime;
use uuid::Uuid;

use crate::source::Backlog;

/// A stored event as `outbox dead list` shows it (the summary of any row).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct DeadLetter {
    /// Event id.
    pub id: Uuid,
    /// Aggregate type.
    pub aggregate_type: String,
    /// Aggregate id.
    pub aggregate_id: String,
    /// Event type.
    pub event_type: String,
    /// Failed attempts.
    pub attempts: i32,
    /// Why it was dead-lettered (or the latest error).
    pub reason: Option<String>,
    /// When the producer wrote it.
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    /// When it was dead-lettered.
    #[serde(with = "time::serde::rfc3339::option")]
    pub dead_lettered_at: Option<OffsetDateTime>,
}

/// Everything the outbox holds about one event (`outbox dead show`, `outbox why`).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct StoredEventDetail {
    /// The list fields.
    #[serde(flatten)]
    pub summary: DeadLetter,
    /// `pending`, `delivered` or `dead`.
    pub state: String,
    /// Payload bytes.
    #[serde(skip)]
    pub payload: Vec<u8>,
    /// The row's headers.
    pub headers: serde_json::Value,
    /// When it was delivered, if it was (and the backend keeps delivered rows).
    #[serde(with = "time::serde::rfc3339::option")]
    pub delivered_at: Option<OffsetDateTime>,
    /// Commit-order position.
    pub seq: i64,
    /// Every recorded failed attempt, oldest first; empty where the backend keeps only the
    /// latest error (then `summary.reason` holds it).
    pub attempt_errors: Vec<AttemptError>,
    /// When a retrying event is tried again, if that is in the future (backoff).
    #[serde(with = "time::serde::rfc3339::option")]
    pub backoff_until: Option<OffsetDateTime>,
}

/// One failed publish attempt.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct AttemptError {
    /// Attempt number (1 = the first publish).
    pub attempt: i32,
    /// When the failure was recorded.
    #[serde(with = "time::serde::rfc3339")]
    pub at: OffsetDateTime,
    /// The broker's or the relay's error.
    pub error: String,
    /// `retry` (tried again later), `dead` (the attempt that dead-lettered it) or `requeued`
    /// (put back in line by `outbox dead retry`; not a failure).
    pub kind: String,
}

/// Which dead letters to retry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RetrySelection {
    /// These ids.
    Ids(Vec<Uuid>),
    /// Every dead letter of this event type.
    EventType(String),
    /// Every dead letter.
    All,
}

/// Why an event is where it is, as `outbox why` tells it.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[serde(tag = "verdict", rename_all = "snake_case")]
pub enum Verdict {
    /// The broker acknowledged it (`delivered_at` says when).
    Delivered,
    /// It is a dead letter (`last_error` says why); `outbox dead retry` puts it back.
    Dead,
    /// It failed and waits for its next attempt.
    Backoff {
        /// Next attempt.
        #[serde(with = "time::serde::rfc3339")]
        until: OffsetDateTime,
    },
    /// An earlier undelivered event of its aggregate must go first.
    BlockedByEarlier {
        /// That event.
        blocker: Blocker,
    },
    /// A relay holds it right now: it is being published.
    Claimed,
    /// Stream (CDC) mode: delivery is not recorded per row; a running relay streams the
    /// event when its transaction's commit is decoded.
    Streamed,
    /// Nothing holds it: the next relay poll takes it (`ahead` ready events come first).
    Ready {
        /// Pending events not in backoff before it in claim order (capped by the backend).
        ahead: i64,
    },
}

/// The earlier event of the same aggregate that holds an event back.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Blocker {
    /// Its id.
    pub id: Uuid,
    /// `pending` or `dead`.
    pub state: String,
    /// Its failed attempts.
    pub attempts: i32,
    /// Its latest error.
    pub last_error: Option<String>,
    /// Its next attempt, when it is in backoff.
    #[serde(with = "time::serde::rfc3339::option")]
    pub backoff_until: Option<OffsetDateTime>,
    /// When it was written.
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
}

/// How a backend hands events to relays, which changes what "ready" means in `outbox why`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DeliveryModel {
    /// Several relays claim rows (row locks, `SKIP LOCKED`).
    Claims,
    /// One relay at a time holds a lease on the whole outbox.
    Lease,
    /// A change stream (CDC): delivery is the stream's confirmed position, not row state.
    Stream,
}

/// The story of one event (`outbox why`).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct EventStory {
    /// The row, with its attempt history.
    pub event: StoredEventDetail,
    /// Where it stands and why.
    pub verdict: Verdict,
    /// How this backend delivers.
    pub model: DeliveryModel,
}

/// What `outbox why` found for an id.
#[derive(Debug, Clone, PartialEq)]
pub enum Explanation {
    /// The event is there.
    Found(Box<EventStory>),
    /// No committed event has this id.
    NotFound {
        /// One line that says so, and where it looked.
        message: String,
        /// What may explain it (open writers, ...), one line each, shown before `message`.
        notes: Vec<String>,
    },
}

/// How bad a finding is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Health {
    /// Nothing to do.
    Ok,
    /// Works now, but will hurt: worth a look.
    Warn,
    /// Broken, or about to break: fix it (`outbox doctor` exits non-zero).
    Red,
}

/// One check's verdict (`outbox doctor`).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct DoctorCheck {
    /// Short name (`schema`, `indexes`, ...).
    pub name: &'static str,
    /// The verdict.
    pub health: Health,
    /// What was found.
    pub detail: String,
    /// What to do about it (warn and red only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

impl DoctorCheck {
    /// A green check.
    pub fn ok(name: &'static str, detail: impl Into<String>) -> Self {
        Self {
            name,
            health: Health::Ok,
            detail: detail.into(),
            fix: None,
        }
    }
    /// A warning with its fix.
    pub fn warn(name: &'static str, detail: impl Into<String>, fix: impl Into<String>) -> Self {
        Self {
            name,
            health: Health::Warn,
            detail: detail.into(),
            fix: Some(fix.into()),
        }
    }
    /// A red finding with its fix.
    pub fn red(name: &'static str, detail: impl Into<String>, fix: impl Into<String>) -> Self {
        Self {
            name,
            health: Health::Red,
            detail: detail.into(),
            fix: Some(fix.into()),
        }
    }
}

/// Thresholds of the doctor's checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DoctorThresholds {
    /// The oldest ready pending event may be this old (`metrics.stuck_after`).
    pub stuck_after: Duration,
    /// An idle-in-transaction session holding a snapshot for longer than this is red.
    pub stale_transaction: Duration,
}

/// How a retention run behaves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetentionSettings {
    /// Delivered events younger than this are kept.
    pub keep: Duration,
    /// Rows deleted per statement (one short transaction each).
    pub batch: u32,
    /// Pause between two batches.
    pub pause: Duration,
    /// Stream (CDC) mode: how long to wait for the stream to confirm the observed horizon.
    pub cdc_wait: Duration,
}

impl Default for RetentionSettings {
    fn default() -> Self {
        Self {
            keep: Duration::from_secs(7 * 86_400),
            batch: 5_000,
            pause: Duration::from_millis(20),
            cdc_wait: Duration::from_secs(30),
        }
    }
}

/// A partition a run did not drop, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeptPartition {
    /// Partition name.
    pub name: String,
    /// Why it was kept, for the operator.
    pub reason: String,
}

/// What a retention run did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RetentionReport {
    /// Rows deleted by the batched delete.
    pub deleted: u64,
    /// Delete statements run.
    pub batches: u64,
    /// Partitions created ahead (partitioned tables).
    pub partitions_created: Vec<String>,
    /// Partitions dropped, with the rows they held.
    pub partitions_dropped: Vec<(String, u64)>,
    /// Partitions older than the window that were kept, and why.
    pub partitions_kept: Vec<KeptPartition>,
    /// Anything the operator should know.
    pub notes: Vec<String>,
    /// The progress callback asked to stop before the end.
    pub stopped: bool,
}

impl RetentionReport {
    /// Rows removed in total: deleted rows plus the rows of dropped partitions.
    pub fn removed(&self) -> u64 {
        self.deleted + self.partitions_dropped.iter().map(|(_, n)| n).sum::<u64>()
    }
}

/// What a retention run would do (`--dry-run`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RetentionPreview {
    /// Rows the batched delete would remove.
    pub rows: u64,
    /// The oldest of them.
    pub oldest: Option<OffsetDateTime>,
    /// Partitions older than the window that would be dropped, with their rows.
    pub partitions_dropped: Vec<(String, u64)>,
    /// Partitions older than the window that would be kept, and why.
    pub partitions_kept: Vec<KeptPartition>,
    /// Anything the operator should know.
    pub notes: Vec<String>,
}

/// Which events to replay. Times compare with `created_at` (when the producer wrote them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplaySelection {
    /// Written at or after this time.
    pub since: OffsetDateTime,
    /// Written before this time (`None`: up to now).
    pub until: Option<OffsetDateTime>,
    /// Only this aggregate id.
    pub aggregate_id: Option<String>,
    /// Only this event type.
    pub event_type: Option<String>,
}

/// One selected event, for `--dry-run`.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ReplayPreview {
    /// Event id.
    pub id: Uuid,
    /// Aggregate type.
    pub aggregate_type: String,
    /// Aggregate id.
    pub aggregate_id: String,
    /// Event type.
    pub event_type: String,
    /// When the producer wrote it.
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    /// When it was delivered (where the backend records it).
    #[serde(with = "time::serde::rfc3339::option")]
    pub delivered_at: Option<OffsetDateTime>,
}

/// What a replay selection holds, read once before replaying.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplayPlan {
    /// Events selected.
    pub total: u64,
    /// The first few, in commit order.
    pub preview: Vec<ReplayPreview>,
    /// `delivered event(s)` or `event(s)`: what the selection counts, for the operator.
    pub noun: &'static str,
}

/// An aggregate whose oldest undelivered event is retrying or dead-lettered.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct HeldAggregate {
    /// Aggregate type.
    pub aggregate_type: String,
    /// Aggregate id.
    pub aggregate_id: String,
    /// The event at the head of the aggregate.
    pub head_id: Uuid,
    /// `pending` (retrying) or `dead`.
    pub state: String,
    /// Failed attempts of the head event.
    pub attempts: i32,
    /// When the head event is tried again (retrying only).
    #[serde(with = "time::serde::rfc3339::option")]
    pub next_attempt_at: Option<OffsetDateTime>,
    /// The head event's latest error.
    pub last_error: Option<String>,
    /// Pending events of the aggregate waiting behind the head.
    pub waiting: i64,
}

/// `outbox status`: the backlog and what holds delivery back.
///
/// Backend-specific findings (a replication slot, producers waiting on a lock, the
/// transaction holding the vacuum horizon) come as JSON sections and text lines, so the CLI
/// prints any backend without knowing it.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct StatusReport {
    /// The database, secrets redacted.
    pub database: String,
    /// The outbox table.
    pub table: String,
    /// The counters.
    #[serde(flatten)]
    pub backlog: Backlog,
    /// Aggregates held by a retrying or dead head event.
    pub held_aggregates: Vec<HeldAggregate>,
    /// Backend-specific sections of `--json` (e.g. `replication_slot`).
    #[serde(flatten)]
    pub sections: serde_json::Map<String, serde_json::Value>,
    /// Text lines shown right after the title (e.g. the replication slot).
    #[serde(skip)]
    pub head_lines: Vec<String>,
    /// Text lines shown after the counters (e.g. stuck events, the horizon's holder).
    #[serde(skip)]
    pub detail_lines: Vec<String>,
    /// Text lines naming other things that hold delivery back (e.g. producers waiting on an
    /// aggregate lock); with `held_aggregates`, empty means nothing holds delivery back.
    #[serde(skip)]
    pub blocking_lines: Vec<String>,
}

impl StatusReport {
    /// A report with only the counters.
    pub fn new(database: String, table: String, backlog: Backlog) -> Self {
        Self {
            database,
            table,
            backlog,
            held_aggregates: Vec::new(),
            sections: serde_json::Map::new(),
            head_lines: Vec::new(),
            detail_lines: Vec::new(),
            blocking_lines: Vec::new(),
        }
    }
}

/// A time for people: RFC 3339, UTC (`2026-11-22T07:35:01.696251Z`).
pub fn when(t: OffsetDateTime) -> String {
    t.to_offset(time::UtcOffset::UTC)
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_else(|_| t.to_string())
}

/// `doctor`'s backlog checks, the same for every database: the oldest ready event against
/// `stuck_after` (red when older, with `stuck_hint` saying where to look), and dead letters
/// (a warning when there are any).
pub fn backlog_checks(
    b: &crate::source::Backlog,
    stuck_after: Duration,
    stuck_hint: &str,
) -> Vec<DoctorCheck> {
    let age = b.oldest_pending_age_seconds;
    let oldest = if age > stuck_after.as_secs_f64() {
        DoctorCheck::red(
            "oldest_pending",
            format!(
                "the oldest ready event has waited {age:.0}s (metrics.stuck_after = {}s; {} pending)",
                stuck_after.as_secs(),
                b.pending
            ),
            stuck_hint,
        )
    } else {
        DoctorCheck::ok(
            "oldest_pending",
            format!("{age:.1}s ({} pending, {} retrying)", b.pending, b.retrying),
        )
    };
    vec![oldest, dead_letter_check(b.dead)]
}

/// `doctor`'s dead-letter check: a warning when there are any.
pub fn dead_letter_check(dead: u64) -> DoctorCheck {
    if dead > 0 {
        DoctorCheck::warn(
            "dead_letters",
            format!("{dead} dead-lettered event(s)"),
            "`outbox dead list` shows why; `outbox dead retry` puts them back in line once fixed",
        )
    } else {
        DoctorCheck::ok("dead_letters", "none")
    }
}
