//! What `outbox verify` found: the counts and the ids per finding, serialised as the
//! `--json` report (its keys are part of the contract, docs/operations.md "Proving delivery").

use outbox_core::verify::{Basis, Lane, Trimmed};
use serde::Serialize;
use time::OffsetDateTime;
use uuid::Uuid;

/// One finding: how many, and the first ids (at most `--ids`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Finding {
    /// How many (for duplicates: copies beyond the first).
    pub count: u64,
    /// The first ids found, at most the `--ids` limit (for duplicates: the events that were
    /// copied).
    pub ids: Vec<Uuid>,
    #[serde(skip)]
    pub(crate) cap: usize,
}

impl Finding {
    fn new(cap: usize) -> Self {
        Self {
            count: 0,
            ids: Vec::new(),
            cap,
        }
    }

    /// Adds one occurrence of `id`.
    pub(crate) fn add(&mut self, id: Uuid) {
        self.add_many(id, 1);
    }

    /// Adds `n` occurrences of `id` (listed once).
    pub(crate) fn add_many(&mut self, id: Uuid, n: u64) {
        self.count += n;
        if self.ids.len() < self.cap {
            self.ids.push(id);
        }
    }
}

/// An event that reached the destination after a later event of its aggregate.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OrderBreak {
    /// The event that arrived late.
    pub id: Uuid,
    /// The later event it arrived after.
    pub after: Uuid,
    /// Its aggregate type.
    pub aggregate_type: String,
    /// Its aggregate id.
    pub aggregate_id: String,
    /// The lane (stream, partition, stream key, file) where it happened.
    pub lane: String,
    /// What ordered them: `aggregate_seq` (the header) or `table order` (commit order in the
    /// table, where messages carry no `aggregate_seq`).
    pub by: &'static str,
    /// Its `aggregate_seq` or table position.
    pub position: i64,
    /// That of the event it arrived after.
    pub after_position: i64,
}

/// The reconciler's counts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Tally {
    pub(crate) max_ids: usize,
    pub(crate) matched: u64,
    pub(crate) lost: Finding,
    pub(crate) phantom: Finding,
    pub(crate) duplicates: Finding,
    pub(crate) order_breaks: Finding,
    pub(crate) breaks: Vec<OrderBreak>,
    pub(crate) expired_at_destination: Finding,
    pub(crate) deleted_from_table: Finding,
    pub(crate) dead_at_destination: Finding,
    pub(crate) in_flight: u64,
    pub(crate) outside_window: u64,
    pub(crate) without_id: u64,
}

impl Tally {
    pub(crate) fn new(max_ids: usize) -> Self {
        let f = || Finding::new(max_ids);
        Self {
            max_ids,
            matched: 0,
            lost: f(),
            phantom: f(),
            duplicates: f(),
            order_breaks: f(),
            breaks: Vec::new(),
            expired_at_destination: f(),
            deleted_from_table: f(),
            dead_at_destination: f(),
            in_flight: 0,
            outside_window: 0,
            without_id: 0,
        }
    }

    /// No lost event, no phantom, no order break.
    pub(crate) fn is_clean(&self) -> bool {
        self.lost.count == 0 && self.phantom.count == 0 && self.order_breaks.count == 0
    }
}

/// The verdict, and the exit code `outbox verify` ends with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Every delivered event of the window is at the destination, nothing else is, and
    /// order held: exit 0.
    Ok,
    /// A lost event, a phantom or an order break: exit 1.
    Failed,
    /// Nothing wrong was found, but delivery could not be proven (delivered rows are deleted,
    /// or the destination no longer holds the window): exit 2.
    CannotVerify,
}

impl Verdict {
    /// The process exit code.
    pub fn exit_code(self) -> u8 {
        match self {
            Self::Ok => 0,
            Self::Failed => 1,
            Self::CannotVerify => 2,
        }
    }
}

/// The window, as read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct WindowReport {
    /// Events written at or after this time…
    #[serde(with = "time::serde::rfc3339")]
    pub since: OffsetDateTime,
    /// …and before this one.
    #[serde(with = "time::serde::rfc3339")]
    pub until: OffsetDateTime,
}

/// The outbox side.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SourceReport {
    /// The database, secrets redacted.
    pub database: String,
    /// The outbox table.
    pub table: String,
    /// What "delivered" means for it.
    pub basis: Basis,
    /// Events the table records as delivered in the window.
    pub delivered: u64,
    /// Events of the window not delivered yet.
    pub undelivered: u64,
    /// Dead-lettered events of the window.
    pub dead: u64,
}

/// The destination side.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DestinationReport {
    /// The destination, secrets redacted.
    pub describe: String,
    /// Messages read back.
    pub read: u64,
    /// The lanes read.
    pub lanes: Vec<Lane>,
    /// Destinations that no longer hold their oldest messages.
    pub trimmed: Vec<Trimmed>,
}

/// Everything `outbox verify` found (`--json` prints this).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    /// `ok`, `failed` or `cannot_verify`.
    pub verdict: Verdict,
    /// The exit code (0, 1, 2).
    pub exit_code: u8,
    /// Why delivery could not be proven, when `verdict` is `cannot_verify`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cannot_verify: Option<String>,
    /// The window.
    pub window: WindowReport,
    /// The outbox side.
    pub source: SourceReport,
    /// The destination side.
    pub destination: DestinationReport,
    /// Delivered events found at the destination.
    pub matched: u64,
    /// Delivered per the table, absent at the destination.
    pub lost: Finding,
    /// At the destination under an id the table does not have.
    pub phantom: Finding,
    /// Copies beyond the first (ids: the events copied).
    pub duplicates: Finding,
    /// Events that reached the destination after a later event of their aggregate.
    pub order_breaks: Finding,
    /// The first order breaks in detail.
    pub order_break_details: Vec<OrderBreak>,
    /// Whether order was checked (`relay.ordering` is not `none`).
    pub order_checked: bool,
    /// Delivered per the table, gone from the destination by its retention (sent before its
    /// oldest retained message): not counted as lost.
    pub expired_at_destination: Finding,
    /// At the destination, no longer in the table (deleted on delivery, or older than the
    /// table's retention): not counted as phantom.
    pub deleted_from_table: Finding,
    /// At the destination and dead-lettered in the table (the broker stored it, the relay
    /// did not see the acknowledgement in time).
    pub dead_at_destination: Finding,
    /// At the destination, not yet recorded as delivered (the relay is settling them).
    pub in_flight: u64,
    /// At the destination, written outside the window.
    pub outside_window: u64,
    /// Messages without an event id (not written by the relay).
    pub without_id: u64,
    /// Anything the operator should know.
    pub notes: Vec<String>,
    /// Wall time of the whole verification.
    pub seconds: f64,
    /// Delivered events verified per second (`source.delivered / seconds`).
    pub events_per_second: f64,
}
