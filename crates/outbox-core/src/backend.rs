//! The seam between the runtime (and the `outbox` command) and a database: one
//! [`BackendConfig`] per database kind opens a [`Backend`], which builds the relay's
//! pipelines and answers the operator commands.
//!
//! Every backend has the core abilities (migrate, relay, status, doctor). The others (dead
//! letters, `why`, replay, retention, a producer for `outbox bench`) are small traits of their
//! own; a backend that lacks one returns [`Unsupported`], which the command prints as
//! "`outbox replay` is not supported by kind = \"x\"" — never a panic or a silent no-op.
//!
//! The traits here are object-safe (futures are boxed): they are called once per command or
//! once per relay start, never per event. The per-event path stays generic: [`Pipelines`]
//! carries the backend's own [`Source`]s behind [`DynSource`], one boxed future per batch.
//!
//! `docs/architecture.md` walks through adding a backend.

use std::future::Future;
use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::Duration;

use time::OffsetDateTime;
use uuid::Uuid;

use crate::admin::{
    DeadLetter, DoctorCheck, DoctorThresholds, Explanation, ReplayPlan, ReplaySelection,
    RetentionPreview, RetentionReport, RetentionSettings, RetrySelection, StatusReport,
    StoredEventDetail,
};
use crate::sink::BoxFuture;
use crate::source::{Backlog, Fetched, Inspect, Settlement, Source, SourceError};
use crate::{NewEvent, RelayConfig};

mod checks;
mod forward;
mod settle;

pub use checks::{SchemaFixes, backlog_or_red, schema_check};
pub use settle::SettledBatch;

/// What the forwarding macros ([`forward_dead_letter_store!`](crate::forward_dead_letter_store)
/// and the others of `backend/forward.rs`) name, so that callers need no `time` or `uuid` of
/// their own in scope.
#[doc(hidden)]
pub mod __forward {
    pub use std::time::Duration;
    pub use time::OffsetDateTime;
    pub use uuid::Uuid;

    /// A backend's own error as a [`SourceError`](crate::SourceError).
    pub fn error(e: impl Into<crate::SourceError>) -> crate::SourceError {
        e.into()
    }
}

/// Object-safe form of [`Source`], implemented for every `Source`; [`BoxedSource`] wraps one
/// back into a `Source`, so the relay runs any backend's pipelines.
pub trait DynSource: Send + 'static {
    /// See [`Source::fetch`].
    fn dyn_fetch(
        &mut self,
        limit: usize,
        now: OffsetDateTime,
    ) -> BoxFuture<'_, Result<Fetched, SourceError>>;
    /// See [`Source::settle`].
    fn dyn_settle<'a>(
        &'a mut self,
        settlements: &'a [Settlement],
        now: OffsetDateTime,
    ) -> BoxFuture<'a, Result<(), SourceError>>;
    /// See [`Source::wait_for_events`].
    fn dyn_wait_for_events(&mut self, max: Duration) -> BoxFuture<'_, ()>;
}

impl<T: Source> DynSource for T {
    fn dyn_fetch(
        &mut self,
        limit: usize,
        now: OffsetDateTime,
    ) -> BoxFuture<'_, Result<Fetched, SourceError>> {
        Box::pin(self.fetch(limit, now))
    }
    fn dyn_settle<'a>(
        &'a mut self,
        settlements: &'a [Settlement],
        now: OffsetDateTime,
    ) -> BoxFuture<'a, Result<(), SourceError>> {
        Box::pin(self.settle(settlements, now))
    }
    fn dyn_wait_for_events(&mut self, max: Duration) -> BoxFuture<'_, ()> {
        Box::pin(self.wait_for_events(max))
    }
}

/// Any backend's [`Source`], boxed: what [`Pipelines`] carries and the relay runs. (A newtype
/// rather than `Box<dyn DynSource>`: the compiler then proves the relay's future `Send`
/// without tripping over the trait object's lifetime.)
pub struct BoxedSource(Box<dyn DynSource>);

impl BoxedSource {
    /// Boxes `source`.
    pub fn new(source: impl Source) -> Self {
        Self(Box::new(source))
    }
}

impl std::fmt::Debug for BoxedSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BoxedSource")
    }
}

impl Source for BoxedSource {
    fn fetch(
        &mut self,
        limit: usize,
        now: OffsetDateTime,
    ) -> impl Future<Output = Result<Fetched, SourceError>> + Send {
        self.0.dyn_fetch(limit, now)
    }
    async fn settle(
        &mut self,
        settlements: &[Settlement],
        now: OffsetDateTime,
    ) -> Result<(), SourceError> {
        self.0.dyn_settle(settlements, now).await
    }
    fn wait_for_events(&mut self, max: Duration) -> impl Future<Output = ()> + Send {
        self.0.dyn_wait_for_events(max)
    }
}

/// Object-safe form of [`Inspect`], implemented for every `Inspect`.
pub trait DynInspect: Send + Sync + 'static {
    /// See [`Inspect::backlog`].
    fn dyn_backlog(&self) -> BoxFuture<'_, Result<Backlog, SourceError>>;
}

impl<T: Inspect> DynInspect for T {
    fn dyn_backlog(&self) -> BoxFuture<'_, Result<Backlog, SourceError>> {
        Box::pin(self.backlog())
    }
}

/// Extra periodic checks a backend runs beside the backlog gauges while the relay runs
/// (PostgreSQL: stuck events and the transaction holding the vacuum horizon). It logs and
/// sets its own gauges.
pub trait Watchdog: Send + Sync + 'static {
    /// One round of checks; events pending longer than `stuck_after` are stuck.
    fn check(&self, stuck_after: Duration) -> BoxFuture<'_, ()>;
}

/// What a backend hands the relay.
pub struct Pipelines {
    /// One source per pipeline (relay workers); a backend that allows only one (a lease, a
    /// replication slot) returns one whatever `relay.workers` says.
    pub sources: Vec<BoxedSource>,
    /// The backlog counters for metrics and `/readyz`.
    pub inspector: Arc<dyn DynInspect>,
    /// Extra checks for the watchdog, if the backend has any.
    pub watchdog: Option<Arc<dyn Watchdog>>,
    /// Awaited (for a few seconds at most) after the relay stopped, e.g. so a stream sends
    /// its final acknowledgement.
    pub closed: Option<BoxFuture<'static, ()>>,
}

impl std::fmt::Debug for Pipelines {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pipelines")
            .field("sources", &self.sources.len())
            .field("watchdog", &self.watchdog.is_some())
            .field("closed", &self.closed.is_some())
            .finish()
    }
}

/// An ability this backend does not have.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`outbox {command}` is not supported by kind = \"{kind}\"{}", hint.as_deref().map(|h| format!("; {h}")).unwrap_or_default())]
pub struct Unsupported {
    /// The backend's kind.
    pub kind: &'static str,
    /// The command (`replay`, `dead`, ...).
    pub command: &'static str,
    /// What to do instead, if anything.
    pub hint: Option<String>,
}

impl Unsupported {
    /// `command` is not supported by `kind`.
    pub fn new(kind: &'static str, command: &'static str) -> Self {
        Self {
            kind,
            command,
            hint: None,
        }
    }
    /// Adds what to do instead.
    pub fn with_hint(mut self, hint: impl Into<String>) -> Self {
        self.hint = Some(hint.into());
        self
    }
}

/// Dead letters: list, show, retry, purge (`outbox dead ...`).
pub trait DeadLetterStore: Send + Sync {
    /// Dead letters in commit order, optionally filtered.
    fn list<'a>(
        &'a self,
        event_type: Option<&'a str>,
        aggregate_id: Option<&'a str>,
        limit: i64,
    ) -> BoxFuture<'a, Result<Vec<DeadLetter>, SourceError>>;
    /// One event in full (any state), or `None` when there is none with this id.
    fn show(&self, id: Uuid) -> BoxFuture<'_, Result<Option<StoredEventDetail>, SourceError>>;
    /// Puts the selected dead letters back in line, keeping per-aggregate order; returns the
    /// ids put back.
    fn retry<'a>(
        &'a self,
        selection: &'a RetrySelection,
    ) -> BoxFuture<'a, Result<Vec<Uuid>, SourceError>>;
    /// Deletes dead letters dead-lettered before `before`; returns their ids.
    fn purge<'a>(
        &'a self,
        before: OffsetDateTime,
        event_type: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Vec<Uuid>, SourceError>>;
}

/// The story of one event (`outbox why`).
pub trait Explain: Send + Sync {
    /// Where event `id` stands at `now`, and why.
    fn explain(
        &self,
        id: Uuid,
        now: OffsetDateTime,
    ) -> BoxFuture<'_, Result<Explanation, SourceError>>;
}

/// Publishing delivered events again (`outbox replay`).
pub trait Replay: Send + Sync {
    /// Counts the selection and returns its first `preview` events.
    fn plan<'a>(
        &'a self,
        selection: &'a ReplaySelection,
        preview: usize,
    ) -> BoxFuture<'a, Result<ReplayPlan, SourceError>>;
    /// The selected ids, in commit order.
    fn ids<'a>(
        &'a self,
        selection: &'a ReplaySelection,
    ) -> BoxFuture<'a, Result<Vec<Uuid>, SourceError>>;
    /// Puts `ids` back in line in one short transaction; returns how many were.
    fn replay_batch<'a>(&'a self, ids: &'a [Uuid]) -> BoxFuture<'a, Result<u64, SourceError>>;
}

/// Progress of a retention run: rows removed so far; `Break` stops after the current batch.
pub type RetentionProgress<'a> = dyn FnMut(u64) -> ControlFlow<()> + Send + 'a;

/// Deleting delivered events past a window (`outbox retention run`, the relay's schedule).
pub trait Retention: Send + Sync {
    /// What a run at `now` would remove.
    fn preview(
        &self,
        now: OffsetDateTime,
        keep: Duration,
    ) -> BoxFuture<'_, Result<RetentionPreview, SourceError>>;
    /// Runs retention at `now`, in batches.
    fn run<'a>(
        &'a self,
        now: OffsetDateTime,
        settings: &'a RetentionSettings,
        progress: &'a mut RetentionProgress<'_>,
    ) -> BoxFuture<'a, Result<RetentionReport, SourceError>>;
}

/// Writing events with the producer library, for `outbox bench`.
pub trait Producer: Send + Sync {
    /// Writes `events` in one statement where the database allows (a backlog fill).
    fn fill<'a>(&'a self, events: &'a [NewEvent]) -> BoxFuture<'a, Result<(), SourceError>>;
    /// Writes `events` the way an application does: BEGIN, enqueue, COMMIT.
    fn commit<'a>(&'a self, events: &'a [NewEvent]) -> BoxFuture<'a, Result<(), SourceError>>;
}

/// How every scratch outbox's name starts (`outbox_crash_1a2b3c4d`): a backend removes
/// only a table whose name starts so ([`Scratch::remove`]), never the application's.
pub const SCRATCH_PREFIX: &str = "outbox_crash_";

/// How long a claim (a row lock, a lease) lasts in a scratch config ([`BackendConfig::scratch`]):
/// short, so that `outbox crash-test` can pause a relay past it within a run of seconds.
pub const SCRATCH_CLAIM_TIMEOUT: Duration = Duration::from_secs(4);

/// Checks that `tag` names a scratch outbox (it starts with [`SCRATCH_PREFIX`]): what every
/// [`BackendConfig::scratch`] checks first.
pub fn check_scratch_tag(tag: &crate::Identifier) -> Result<(), String> {
    if tag.as_str().starts_with(SCRATCH_PREFIX) {
        Ok(())
    } else {
        Err(format!(
            "a scratch table's name starts with `{SCRATCH_PREFIX}`"
        ))
    }
}

/// What every [`Backend::scratch`] returns: `ability` when `table` is a scratch outbox's
/// (named [`SCRATCH_PREFIX`]...), so that removal can never reach the application's table.
pub fn scratch_only<'a>(
    kind: &'static str,
    table: &crate::Identifier,
    ability: &'a dyn Scratch,
) -> Result<&'a dyn Scratch, Unsupported> {
    if table.as_str().starts_with(SCRATCH_PREFIX) {
        Ok(ability)
    } else {
        Err(Unsupported::new(kind, "crash-test").with_hint(format!(
            "only a scratch outbox table ({SCRATCH_PREFIX}...) can be removed"
        )))
    }
}

/// A scratch outbox of `outbox crash-test`: a table of its own (see [`BackendConfig::scratch`])
/// that the command writes to, relays, verifies, and removes at the end.
pub trait Scratch: Send + Sync {
    /// Writes `events` in one transaction and rolls it back: none of them may ever reach the
    /// destination (the phantom check of `outbox crash-test`).
    fn roll_back<'a>(&'a self, events: &'a [NewEvent]) -> BoxFuture<'a, Result<(), SourceError>>;
    /// Drops the outbox table and everything `migrate` made for it (its bookkeeping tables,
    /// sequences and functions; a CDC slot and publication); returns what it removed, one
    /// line each. Removing what is already gone is not an error.
    fn remove(&self) -> BoxFuture<'_, Result<Vec<String>, SourceError>>;
}

/// Copying events into this backend's table (the subscription tables of a fan-out,
/// `[[subscription]]`): each event keeps its id, payload, headers and creation time, and an
/// event already there is left alone, so copying a batch again after a crash adds nothing.
pub trait Forward: Send + Sync {
    /// Inserts `events` in one transaction, in slice order (which becomes their order in this
    /// table), skipping ids already present; returns how many rows were new.
    fn copy_in<'a>(&'a self, events: &'a [crate::Event])
    -> BoxFuture<'a, Result<u64, SourceError>>;
}

/// An opened database: the relay's pipelines and the operator commands.
pub trait Backend: Send + Sync + 'static {
    /// The config `kind` (`postgres`, `sqlite`, ...).
    fn kind(&self) -> &'static str;
    /// The database, secrets redacted (a URL or a path).
    fn database(&self) -> String;
    /// The outbox table as messages name it (`public.outbox`, ``outbox in `outbox.db` ``).
    fn table(&self) -> String;
    /// A short label for reports (`postgres-poll`, `postgres-cdc`, `sqlite`).
    fn label(&self) -> String {
        self.kind().to_owned()
    }
    /// Whether only one pipeline can run (a lease, a replication slot).
    fn single_pipeline(&self) -> bool {
        false
    }
    /// Creates or upgrades the schema (idempotent); returns what it did, one line each.
    fn migrate(&self) -> BoxFuture<'_, Result<Vec<String>, SourceError>>;
    /// Checks (or, where the database is embedded, installs) the schema before a relay
    /// starts, then builds its pipelines.
    fn start_relay<'a>(
        &'a self,
        relay: &'a RelayConfig,
    ) -> BoxFuture<'a, Result<Pipelines, SourceError>>;
    /// Pending events by row state; `None` where the backlog is not row state (a stream).
    fn pending(&self) -> BoxFuture<'_, Result<Option<u64>, SourceError>>;
    /// `outbox status` at `now`.
    fn status(
        &self,
        now: OffsetDateTime,
        stuck_after: Duration,
    ) -> BoxFuture<'_, Result<StatusReport, SourceError>>;
    /// `outbox doctor`: every database check; a failed query turns its check red.
    fn doctor(&self, thresholds: DoctorThresholds) -> BoxFuture<'_, Vec<DoctorCheck>>;
    /// Dead letters.
    fn dead_letters(&self) -> Result<&dyn DeadLetterStore, Unsupported> {
        Err(Unsupported::new(self.kind(), "dead"))
    }
    /// `outbox why`.
    fn explain(&self) -> Result<&dyn Explain, Unsupported> {
        Err(Unsupported::new(self.kind(), "why"))
    }
    /// `outbox replay`.
    fn replay(&self) -> Result<&dyn Replay, Unsupported> {
        Err(Unsupported::new(self.kind(), "replay"))
    }
    /// Retention.
    fn retention(&self) -> Result<&dyn Retention, Unsupported> {
        Err(Unsupported::new(self.kind(), "retention"))
    }
    /// Copying events in, for the subscription tables of a fan-out.
    fn forward(&self) -> Result<&dyn Forward, Unsupported> {
        Err(Unsupported::new(self.kind(), "relay with [[subscription]]"))
    }
    /// The subscription catalog (`<table>_subscriptions`), where `outbox migrate` records
    /// the `[[subscription]]` entries every relay fans out to (docs/subscriptions.md).
    fn catalog(&self) -> Result<&dyn crate::catalog::SubscriptionCatalog, Unsupported> {
        Err(Unsupported::new(self.kind(), "subscription"))
    }
    /// `outbox backfill`: copying this outbox's retained events into the table of
    /// subscription `subscription` (docs/subscriptions.md, "Backfill").
    fn backfill(
        &self,
        subscription: &str,
    ) -> Result<Box<dyn crate::backfill::Backfill>, Unsupported> {
        let _ = subscription;
        Err(Unsupported::new(self.kind(), "backfill"))
    }
    /// `outbox capture`: business tables as event sources (docs/capture.md).
    fn capture(&self) -> Result<&dyn crate::capture::Capture, Unsupported> {
        Err(Unsupported::new(self.kind(), "capture"))
    }
    /// The producer, for `outbox bench`.
    fn producer(&self) -> Result<&dyn Producer, Unsupported> {
        Err(Unsupported::new(self.kind(), "bench"))
    }
    /// What the table says was delivered, for `outbox verify`.
    fn delivery_ledger(&self) -> Result<&dyn crate::verify::DeliveryLedger, Unsupported> {
        Err(Unsupported::new(self.kind(), "verify"))
    }
    /// The scratch outbox of `outbox crash-test`; only on a backend opened from a
    /// [`BackendConfig::scratch`] config (a table named [`SCRATCH_PREFIX`]...).
    fn scratch(&self) -> Result<&dyn Scratch, Unsupported> {
        Err(Unsupported::new(self.kind(), "crash-test"))
    }
}

/// The table of subscription `name` beside outbox table `table`: `<table>_sub_<name>`.
pub fn subscription_table(
    table: &crate::Identifier,
    name: &str,
) -> Result<crate::Identifier, String> {
    crate::Identifier::new(format!("{table}_sub_{name}")).map_err(|e| {
        format!("the subscription's table name {e}; use a shorter subscription or table name")
    })
}

/// Checks that a claim lasting `claim` (row locks, a lease) outlasts one publish: the relay
/// publishes nothing it could not finish before its claim runs out, so a claim shorter than
/// `relay.publish_timeout` would publish nothing. `key` names the setting in the message
/// (`source.claim_timeout: must be longer than relay.publish_timeout (5s)`).
pub fn check_claim_outlasts_publish(
    key: &str,
    claim: Duration,
    relay: &RelayConfig,
) -> Result<(), String> {
    if claim <= relay.publish_timeout {
        return Err(format!(
            "{key}: must be longer than relay.publish_timeout ({:?})",
            relay.publish_timeout
        ));
    }
    Ok(())
}

/// Why a backend could not be opened.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct OpenError {
    /// What failed, naming the database (redacted): ``cannot open SQLite database `x.db` ``.
    pub message: String,
    /// What the operator should check.
    pub fix: &'static str,
    /// The cause.
    #[source]
    pub source: Option<Box<dyn std::error::Error + Send + Sync>>,
}

impl OpenError {
    /// An error with its fix and cause.
    pub fn new(
        message: impl Into<String>,
        fix: &'static str,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        Self {
            message: message.into(),
            fix,
            source: Some(Box::new(source)),
        }
    }
}

/// What opening a backend is for: how many connections it may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenOptions {
    /// Connections in the pool (`relay.workers` + 2 for a relay; 1-2 for a command).
    pub connections: u32,
}

/// The `[source]` section of one database kind: validated, then opened into a [`Backend`].
/// The runtime's registry lists one line per implementation.
pub trait BackendConfig:
    serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug + Clone + Send + Sync + 'static
{
    /// The `kind` value that selects it.
    const KIND: &'static str;
    /// Whether `--database-url URL` without a `kind` means this backend.
    fn claims_url(url: &str) -> bool;
    /// Checks what serde cannot, with the relay settings it must agree with; the message
    /// names the key (`source.claim_timeout: ...`).
    fn validate(&self, relay: &RelayConfig) -> Result<(), String>;
    /// The database for messages and logs, secrets redacted.
    fn describe(&self) -> String;
    /// The same database with the table of subscription `name` as the outbox table (see
    /// [`subscription_table`]), polled: it keeps that subscription's progress, retries and
    /// dead letters (`[[subscription]]`). `Err` says why this kind cannot.
    fn for_subscription(&self, name: &str) -> Result<Self, String> {
        let _ = name;
        Err(format!(
            "[[subscription]] is not supported by source kind = \"{}\"",
            Self::KIND
        ))
    }
    /// The same database with a scratch outbox named `tag` for `outbox crash-test`: the
    /// table (and, for CDC, the slot and publication) named after `tag`, claims lasting
    /// [`SCRATCH_CLAIM_TIMEOUT`]. `Err` says why this kind cannot have one.
    fn scratch(&self, tag: &crate::Identifier) -> Result<Self, String> {
        let _ = tag;
        Err(format!(
            "`outbox crash-test` is not supported by source kind = \"{}\"",
            Self::KIND
        ))
    }
    /// Connects (or opens the file).
    fn open(&self, options: OpenOptions) -> BoxFuture<'_, Result<Arc<dyn Backend>, OpenError>>;
}

/// What a polling source does with a row once the broker acknowledged its event: the
/// `source.on_delivered` setting of every database that keeps delivery in its rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, serde::Serialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum OnDelivered {
    /// Set `state = 'delivered'` and `delivered_at`; retention deletes it later. Keeps history
    /// for `replay` and `status`.
    #[default]
    Mark,
    /// Delete the row at once: less write traffic (about half the WAL on PostgreSQL),
    /// nothing to clean up, no replay.
    Delete,
}
