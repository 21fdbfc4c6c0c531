//! A new database, added the way `docs/architecture.md` says: a config type that implements
//! `BackendConfig`, a backend that implements `Backend`, a source that implements `Source`,
//! and one line in a registry (`source_registry!`). The backend keeps its outbox in memory.
//!
//! It then passes the same source conformance suite as PostgreSQL and SQLite, is chosen by
//! `kind = "toy"` from TOML, and answers a command it lacks with a clear "not supported".

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use outbox_core::admin::{DoctorCheck, DoctorThresholds, StatusReport};
use outbox_core::backend::{
    Backend, BackendConfig, BoxedSource, OpenError, OpenOptions, Pipelines,
};
use outbox_core::sink::BoxFuture;
use outbox_core::source::{Backlog, Fetched, Inspect, Outcome, Settlement};
use outbox_core::{
    DeadLetterPolicy, Event, NewEvent, Ordering, Position, RelayConfig, Source, SourceError,
};
use outbox_testkit::conformance::{self, Harness, StoredEvent};
use serde::Deserialize;
use time::OffsetDateTime;
use uuid::Uuid;

// ---- the backend ----------------------------------------------------------------------

/// `[source] kind = "toy"`: an outbox in this process's memory, named so that producers and
/// relays of one test share it.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
struct ToyConfig {
    name: String,
}

#[derive(Debug, Clone, PartialEq)]
enum State {
    Pending,
    Delivered,
    Dead,
}

#[derive(Debug, Clone)]
struct Row {
    event: Event,
    state: State,
    attempts: u32,
    next_attempt_at: OffsetDateTime,
    claimed_by: Option<u64>,
}

#[derive(Debug, Default)]
struct Store {
    /// Committed rows, in the order the source reads them.
    rows: Vec<Row>,
    /// The last sequence number handed out.
    next_seq: i64,
}

impl Store {
    fn seq(&mut self) -> i64 {
        self.next_seq += 1;
        self.next_seq
    }
}

type Shared = Arc<Mutex<Store>>;

fn lock(store: &Shared) -> MutexGuard<'_, Store> {
    store
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The named stores of this process.
fn store(name: &str) -> Shared {
    static STORES: OnceLock<Mutex<HashMap<String, Shared>>> = OnceLock::new();
    let mut stores = STORES
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    stores.entry(name.to_owned()).or_default().clone()
}

impl BackendConfig for ToyConfig {
    const KIND: &'static str = "toy";
    fn claims_url(url: &str) -> bool {
        url.starts_with("toy:")
    }
    fn validate(&self, _relay: &RelayConfig) -> Result<(), String> {
        if self.name.is_empty() {
            return Err("source.name: must not be empty".into());
        }
        Ok(())
    }
    fn describe(&self) -> String {
        format!("toy outbox `{}`", self.name)
    }
    fn open(&self, _options: OpenOptions) -> BoxFuture<'_, Result<Arc<dyn Backend>, OpenError>> {
        let backend = ToyBackend {
            name: self.name.clone(),
            store: store(&self.name),
        };
        Box::pin(async move { Ok(Arc::new(backend) as Arc<dyn Backend>) })
    }
}

struct ToyBackend {
    name: String,
    store: Shared,
}

impl ToyBackend {
    fn backlog(&self) -> Backlog {
        let store = lock(&self.store);
        let count = |f: &dyn Fn(&Row) -> bool| store.rows.iter().filter(|r| f(r)).count() as u64;
        Backlog {
            pending: count(&|r| r.state == State::Pending),
            retrying: count(&|r| r.state == State::Pending && r.attempts > 0),
            dead: count(&|r| r.state == State::Dead),
            ..Backlog::default()
        }
    }
}

impl Backend for ToyBackend {
    fn kind(&self) -> &'static str {
        ToyConfig::KIND
    }
    fn database(&self) -> String {
        format!("memory:{}", self.name)
    }
    fn table(&self) -> String {
        "outbox".into()
    }
    fn migrate(&self) -> BoxFuture<'_, Result<Vec<String>, SourceError>> {
        Box::pin(async {
            Ok(vec![
                "nothing to migrate: the toy outbox is memory".to_owned(),
            ])
        })
    }
    fn start_relay<'a>(
        &'a self,
        relay: &'a RelayConfig,
    ) -> BoxFuture<'a, Result<Pipelines, SourceError>> {
        Box::pin(async move {
            let sources = (0..relay.workers.get())
                .map(|_| BoxedSource::new(ToySource::new(self.store.clone(), relay)))
                .collect();
            Ok(Pipelines {
                sources,
                inspector: Arc::new(ToyInspector(self.store.clone())),
                watchdog: None,
                closed: None,
            })
        })
    }
    fn pending(&self) -> BoxFuture<'_, Result<Option<u64>, SourceError>> {
        Box::pin(async { Ok(Some(self.backlog().pending)) })
    }
    fn status(
        &self,
        _now: OffsetDateTime,
        _stuck_after: Duration,
    ) -> BoxFuture<'_, Result<StatusReport, SourceError>> {
        Box::pin(async {
            Ok(StatusReport::new(
                self.database(),
                self.table(),
                self.backlog(),
            ))
        })
    }
    fn doctor(&self, _thresholds: DoctorThresholds) -> BoxFuture<'_, Vec<DoctorCheck>> {
        Box::pin(async { vec![DoctorCheck::ok("memory", "the toy outbox is in memory")] })
    }
}

struct ToyInspector(Shared);

impl Inspect for ToyInspector {
    async fn backlog(&self) -> Result<Backlog, SourceError> {
        let pending = lock(&self.0)
            .rows
            .iter()
            .filter(|r| r.state == State::Pending)
            .count() as u64;
        Ok(Backlog {
            pending,
            ..Backlog::default()
        })
    }
}

/// One relay pipeline: claims rows in commit (`seq`) order; an aggregate whose earliest
/// undelivered event is claimed elsewhere, in backoff or (when held) dead is skipped whole.
struct ToySource {
    id: u64,
    store: Shared,
    ordering: Ordering,
    dead_letter: DeadLetterPolicy,
}

impl ToySource {
    fn new(store: Shared, relay: &RelayConfig) -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        Self {
            id: NEXT.fetch_add(1, AtomicOrdering::Relaxed),
            store,
            ordering: relay.ordering,
            dead_letter: relay.dead_letter,
        }
    }
}

impl Source for ToySource {
    async fn fetch(&mut self, limit: usize, now: OffsetDateTime) -> Result<Fetched, SourceError> {
        let mut store = lock(&self.store);
        let ordered = self.ordering != Ordering::None;
        let mut held: HashSet<(String, String)> = HashSet::new();
        let mut fetched = Fetched::default();
        for row in &mut store.rows {
            let key = (
                row.event.aggregate_type.clone(),
                row.event.aggregate_id.clone(),
            );
            let blocks = match row.state {
                State::Delivered => continue,
                State::Dead => self.dead_letter == DeadLetterPolicy::HoldAggregate,
                State::Pending => {
                    if held.contains(&key) {
                        continue;
                    }
                    if row.claimed_by.is_some() || row.next_attempt_at > now {
                        true
                    } else {
                        if fetched.events.len() == limit {
                            fetched.more = true;
                            break;
                        }
                        row.claimed_by = Some(self.id);
                        let mut event = row.event.clone();
                        event.attempts = row.attempts;
                        fetched.events.push(event);
                        false
                    }
                }
            };
            if blocks && ordered {
                held.insert(key);
            }
        }
        Ok(fetched)
    }

    async fn settle(
        &mut self,
        settlements: &[Settlement],
        _now: OffsetDateTime,
    ) -> Result<(), SourceError> {
        let mut store = lock(&self.store);
        for s in settlements {
            let Some(row) = store
                .rows
                .iter_mut()
                .find(|r| r.event.position == s.position && r.claimed_by == Some(self.id))
            else {
                continue;
            };
            row.claimed_by = None;
            match &s.outcome {
                Outcome::Delivered => row.state = State::Delivered,
                Outcome::Retry { not_before, .. } => {
                    row.attempts += 1;
                    row.next_attempt_at = *not_before;
                }
                Outcome::DeadLetter { .. } => {
                    row.attempts += 1;
                    row.state = State::Dead;
                }
                Outcome::Released => {}
            }
        }
        Ok(())
    }
}

impl Drop for ToySource {
    /// A dead relay's claims are free at once (a database does this when the connection
    /// holding the row locks goes away).
    fn drop(&mut self) {
        for row in &mut lock(&self.store).rows {
            if row.claimed_by == Some(self.id) {
                row.claimed_by = None;
            }
        }
    }
}

// ---- the registry line --------------------------------------------------------------------

outbox_runtime::source_registry! {
    /// The runtime's databases plus the toy one: one line.
    enum TestSources {
        /// The in-memory toy outbox.
        Toy(ToyConfig),
        /// SQLite, as in the runtime's own registry.
        Sqlite(outbox_sqlite::SqliteConfig),
    }
}

#[derive(Debug, Deserialize)]
struct TestConfig {
    source: TestSources,
}

// ---- the conformance harness ---------------------------------------------------------------

struct ToyHarness {
    backend: Arc<dyn Backend>,
    store: Shared,
    /// The business counters of the commit-order oracle; the lock is the rows' lock, held
    /// from the bump to the commit.
    counters: tokio::sync::Mutex<HashMap<String, i64>>,
    /// Deliberately wrong: number rows when they are inserted instead of when they commit,
    /// and read them in that order (a relay that publishes by id or insert sequence).
    insert_order: bool,
}

impl ToyHarness {
    async fn new() -> anyhow::Result<Self> {
        let name = Uuid::now_v7().to_string();
        let config: TestConfig =
            toml::from_str(&format!("[source]\nkind = \"toy\"\nname = \"{name}\"\n"))?;
        let backend = config.source.open(OpenOptions { connections: 1 }).await?;
        Ok(Self {
            backend,
            store: store(&name),
            counters: tokio::sync::Mutex::new(HashMap::new()),
            insert_order: false,
        })
    }

    fn row(seq: i64, e: NewEvent, now: OffsetDateTime) -> Row {
        Row {
            event: Event {
                id: e.id.unwrap_or_else(Uuid::now_v7),
                position: Position(seq),
                aggregate_type: e.aggregate_type,
                aggregate_id: e.aggregate_id,
                event_type: e.event_type,
                payload: e.payload,
                headers: e.headers,
                created_at: now,
                attempts: 0,
            },
            state: State::Pending,
            attempts: 0,
            next_attempt_at: now,
            claimed_by: None,
        }
    }
}

impl Harness for ToyHarness {
    type Source = BoxedSource;

    async fn source(
        &self,
        ordering: Ordering,
        dead_letter: DeadLetterPolicy,
    ) -> anyhow::Result<BoxedSource> {
        let relay = RelayConfig {
            ordering,
            dead_letter,
            ..RelayConfig::default()
        };
        let mut pipelines = self.backend.start_relay(&relay).await?;
        pipelines
            .sources
            .pop()
            .ok_or_else(|| anyhow::anyhow!("the toy backend built no pipeline"))
    }

    async fn write(&self, events: Vec<NewEvent>, commit: bool) -> anyhow::Result<Vec<Uuid>> {
        let mut store = lock(&self.store);
        let now = OffsetDateTime::now_utc();
        let rows: Vec<Row> = events
            .into_iter()
            .map(|e| Self::row(store.seq(), e, now))
            .collect();
        let ids = rows.iter().map(|r| r.event.id).collect();
        // A transaction: all rows appear at once at commit, none after a rollback.
        if commit {
            store.rows.extend(rows);
        }
        Ok(ids)
    }

    async fn write_counted(
        &self,
        event: NewEvent,
        outbox_first: bool,
        hold: Duration,
    ) -> anyhow::Result<(Uuid, i64)> {
        let now = OffsetDateTime::now_utc();
        let aggregate = event.aggregate_id.clone();
        // The insert: the row exists, invisible until commit. The right design numbers it at
        // commit; the wrong one now.
        let mut insert_seq = None;
        let mut event = Some(event);
        if outbox_first {
            insert_seq = Some(lock(&self.store).seq());
            tokio::time::sleep(hold).await;
        }
        let mut counters = self.counters.lock().await;
        let n = {
            let n = counters.entry(aggregate).or_insert(0);
            *n += 1;
            *n
        };
        if !outbox_first {
            tokio::time::sleep(hold).await;
            insert_seq = Some(lock(&self.store).seq());
        }
        // Commit, still holding the counter's lock.
        let mut store = lock(&self.store);
        let seq = if self.insert_order {
            insert_seq.unwrap_or_default()
        } else {
            store.seq()
        };
        let row = Self::row(
            seq,
            event
                .take()
                .ok_or_else(|| anyhow::anyhow!("written twice"))?,
            now,
        );
        let id = row.event.id;
        let at = store
            .rows
            .iter()
            .position(|r| r.event.position.0 > seq)
            .unwrap_or(store.rows.len());
        store.rows.insert(at, row);
        drop(store);
        drop(counters);
        Ok((id, n))
    }

    async fn stored(&self, id: Uuid) -> anyhow::Result<Option<StoredEvent>> {
        Ok(lock(&self.store)
            .rows
            .iter()
            .find(|r| r.event.id == id)
            .map(|r| StoredEvent {
                state: match r.state {
                    State::Pending => "pending",
                    State::Delivered => "delivered",
                    State::Dead => "dead",
                }
                .to_owned(),
                attempts: i32::try_from(r.attempts).unwrap_or(i32::MAX),
            }))
    }

    fn replicas(&self) -> usize {
        2
    }

    // The toy numbers nothing.
    fn assigns_positions(&self) -> bool {
        false
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_toy_backend_added_by_the_book_passes_the_source_conformance_suite() -> anyhow::Result<()>
{
    conformance::run_all(ToyHarness::new).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_that_publishes_in_insert_order_fails_the_commit_order_check()
-> anyhow::Result<()> {
    let mut h = ToyHarness::new().await?;
    h.insert_order = true;
    let error = conformance::concurrent_writers_reach_the_broker_in_commit_order(&h)
        .await
        .expect_err("publishing by insert order breaks commit order");
    assert!(
        error.to_string().contains("expected [1, 2,"),
        "the check names the commit order it expected: {error}"
    );
    Ok(())
}

#[tokio::test]
async fn the_registry_picks_the_toy_backend_by_kind_and_url() -> anyhow::Result<()> {
    assert_eq!(TestSources::KINDS, &["toy", "sqlite"]);
    assert_eq!(TestSources::kind_of_url("toy:orders"), Some("toy"));
    assert_eq!(TestSources::kind_of_url("sqlite:outbox.db"), Some("sqlite"));
    assert_eq!(TestSources::kind_of_url("mysql://db/app"), None);
    let config: TestConfig = toml::from_str("[source]\nkind = \"toy\"\nname = \"\"\n")?;
    let error = config
        .source
        .validate(&RelayConfig::default())
        .expect_err("an empty name is refused");
    assert_eq!(error, "source.name: must not be empty");
    let unknown = toml::from_str::<TestConfig>("[source]\nkind = \"toy\"\nname = \"a\"\nx = 1\n")
        .expect_err("unknown keys are refused");
    assert!(
        unknown.to_string().contains("unknown field `x`"),
        "{unknown}"
    );
    Ok(())
}

#[tokio::test]
async fn an_ability_the_toy_backend_lacks_is_a_clear_not_supported() -> anyhow::Result<()> {
    let h = ToyHarness::new().await?;
    let replay = h.backend.replay().err().map(|e| e.to_string());
    assert_eq!(
        replay.as_deref(),
        Some("`outbox replay` is not supported by kind = \"toy\"")
    );
    let dead = h.backend.dead_letters().err().map(|e| e.to_string());
    assert_eq!(
        dead.as_deref(),
        Some("`outbox dead` is not supported by kind = \"toy\"")
    );
    let checks = h
        .backend
        .doctor(DoctorThresholds {
            stuck_after: Duration::from_secs(60),
            stale_transaction: Duration::from_secs(60),
        })
        .await;
    assert_eq!(checks.len(), 1);
    Ok(())
}
