//! [`DynamoStreamSource`]: the outbox as the table's DynamoDB stream.
//!
//! - **Shards and lineage.** The source lists the stream's shards (again every
//!   [`DISCOVERY_INTERVAL`]) and reads a child shard only after its parent was read to its end
//!   and settled (`finished` in the lease table), so one item's records, and normally one
//!   aggregate's, come in order.
//! - **Leases.** A shard is read by the relay holding its lease in the lease table; a lease
//!   is renewed while the shard is read and expires `lease_duration` after its holder stopped
//!   renewing it (a crash, a pause). Every checkpoint write is conditioned on the lease, and
//!   a fetched batch is valid only until the earliest lease of its shards expires.
//! - **Checkpoints.** Per shard, the last sequence number up to which every record is settled
//!   for good (delivered, dead-lettered, or not an outbox insert). After a crash the next
//!   holder reads on from there: the unsettled tail is published again (at least once).
//! - **Order by `seq`.** Stream records are ordered per item; one aggregate's events could
//!   still be spread over two live shards (a partition split by sort key). An event goes in
//!   line only after its predecessor (`seq - 1`) was handed out: by this relay (in memory) or
//!   by any relay (the `aggregate#…` items of the lease table, written once the broker
//!   acknowledged). An event whose predecessor never shows up waits `gap_timeout`, then goes
//!   with an error in the log (see `docs/dynamodb.md`).
//! - **Dead letters** are items `dead#<id>` of the lease table; with
//!   `dead_letter = "hold-aggregate"` the later events of their aggregate are kept there too.

mod decode;
mod lag;
mod lease;
mod line;
mod requeue;
mod retries;
mod shards;

pub(crate) use lag::unread;
pub(crate) use lease::held_key;
pub(crate) use requeue::{DEAD_PREFIX, aggregate_of, request, scan_prefix};

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aws_sdk_dynamodb::error::ProvideErrorMetadata;
use outbox_core::source::{Fetched, Outcome, Settlement};
use outbox_core::stream_ledger::{Entry, Ledger, LedgerStats};
use outbox_core::{DeadLetterPolicy, Event, Ordering, Source, SourceError};
use time::OffsetDateTime;
use tokio::time::Instant;

use crate::config::DynamoDbConfig;
use lease::Leases;

/// How often the stream's shards are listed again (new shards after a split).
pub const DISCOVERY_INTERVAL: Duration = Duration::from_secs(5);
/// Pause between reads of a shard that returned nothing (AWS allows five reads per second
/// per shard, shared by every reader).
const IDLE_READ: Duration = Duration::from_millis(250);
/// Events held in memory before the source stops reading.
const MAX_BUFFERED: usize = 20_000;
/// How often the positions of aggregates whose events wait for a predecessor are read again.
const POSITION_REFRESH: Duration = Duration::from_millis(500);
/// Records asked for per read.
const READ_LIMIT: i32 = 1000;
/// How often the counter of `outbox dead retry` requests is read.
const REQUEUE_CHECK: Duration = Duration::from_secs(1);

/// Where an event came from.
#[derive(Debug, Clone)]
struct Meta {
    /// Empty for an event put back by `outbox dead retry`.
    shard: Arc<str>,
    seqnum: Arc<str>,
    seq: u64,
    /// The lease-table item of an event put back by `outbox dead retry`.
    requeued: Option<Arc<str>>,
}

/// An event read before its predecessor was handed out.
#[derive(Debug)]
struct Waiting {
    event: Event,
    meta: Meta,
    since: Instant,
}

/// A shard this relay holds the lease of.
#[derive(Debug)]
struct Shard {
    id: Arc<str>,
    iterator: Option<String>,
    /// Read to its end (a closed shard).
    ended: bool,
    /// Records read and not yet covered by the checkpoint, in order; true when settled.
    read: VecDeque<(Arc<str>, bool)>,
    /// The checkpoint to save, when it moved.
    checkpoint: Option<String>,
    dirty: bool,
    /// The last record read (where a fresh iterator resumes).
    last_read: Option<String>,
    lease_until: Instant,
    lease_renewed: Instant,
    next_read: Instant,
}

/// Reads the outbox from the table's stream (`kind = "dynamodb"`). See the module docs.
pub struct DynamoStreamSource {
    config: DynamoDbConfig,
    table: aws_sdk_dynamodb::Client,
    streams: aws_sdk_dynamodbstreams::Client,
    leases: Leases,
    ordering: Ordering,
    hold: bool,
    lease_duration: Duration,
    gap_timeout: Duration,
    stream_arn: Option<String>,
    /// Every shard of the stream and its parent.
    topology: HashMap<String, Option<String>>,
    finished: HashSet<String>,
    next_discovery: Instant,
    held: HashMap<Arc<str>, Shard>,
    ledger: Ledger<Meta>,
    counter: u64,
    /// Per aggregate, the last `seq` put in line (or handed out for good before).
    last: HashMap<(String, String), u64>,
    waiting: HashMap<(String, String), BTreeMap<u64, Waiting>>,
    next_position_refresh: Instant,
    /// Positions handed out for good, not yet recorded in the lease table.
    unrecorded: HashMap<(String, String), u64>,
    dead: Option<HashSet<(String, String)>>,
    /// The retry-request counter last seen (`None`: scan at the next check).
    requests_seen: Option<u64>,
    next_requeue_check: Instant,
    /// Retried events claimed and not yet settled for good: item key → aggregate.
    claims: HashMap<Arc<str>, (String, String)>,
    /// Held aggregates whose dead letters are being retried: their retried events are not
    /// parked (new events from the stream still are, and go after them).
    retrying: HashSet<(String, String)>,
    claims_until: Instant,
    claims_renewed: Instant,
    stats: Arc<LedgerStats>,
    closed_tx: Option<tokio::sync::watch::Sender<()>>,
    closed_rx: tokio::sync::watch::Receiver<()>,
}

impl std::fmt::Debug for DynamoStreamSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DynamoStreamSource")
            .field("table", &self.config.table)
            .field("shards", &self.held.len())
            .finish_non_exhaustive()
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Records the relay had not read were trimmed by the stream's 24-hour retention.
fn warn_trimmed(shard: &str, after: Option<&str>) {
    tracing::error!(
        shard,
        after,
        "records after the checkpoint were trimmed from the stream (older than 24 hours): events were lost; reading from the oldest record left"
    );
}

fn aggregate(e: &Event) -> (String, String) {
    (e.aggregate_type.clone(), e.aggregate_id.clone())
}

impl DynamoStreamSource {
    /// A source over `config`'s table; `owner` names this relay in the lease table (unique
    /// per replica). Nothing is read before the first `fetch`.
    pub async fn new(
        config: &DynamoDbConfig,
        owner: impl Into<String>,
        ordering: Ordering,
        dead_letter: DeadLetterPolicy,
    ) -> Result<Self, SourceError> {
        config
            .validate()
            .map_err(|e| SourceError::fatal(e.to_string()))?;
        let table = crate::migrate::client(config).await;
        let streams =
            aws_sdk_dynamodbstreams::Client::new(&crate::migrate::sdk_config(config).await);
        let leases = Leases::new(table.clone(), config.lease_table(), owner.into());
        let (closed_tx, closed_rx) = tokio::sync::watch::channel(());
        Ok(Self {
            closed_tx: Some(closed_tx),
            closed_rx,
            config: config.clone(),
            table,
            streams,
            leases,
            ordering,
            hold: dead_letter == DeadLetterPolicy::HoldAggregate && ordering != Ordering::None,
            lease_duration: config.lease_duration,
            gap_timeout: config.gap_timeout,
            stream_arn: None,
            topology: HashMap::new(),
            finished: HashSet::new(),
            next_discovery: Instant::now(),
            held: HashMap::new(),
            ledger: Ledger::new(0),
            counter: 0,
            last: HashMap::new(),
            waiting: HashMap::new(),
            next_position_refresh: Instant::now(),
            unrecorded: HashMap::new(),
            dead: None,
            requests_seen: None,
            next_requeue_check: Instant::now(),
            claims: HashMap::new(),
            retrying: HashSet::new(),
            claims_until: Instant::now(),
            claims_renewed: Instant::now(),
            stats: Arc::new(LedgerStats::default()),
        })
    }

    /// Resolves once this source, after being dropped, saved its checkpoints and gave its
    /// leases up (so another relay takes its shards over at once).
    pub fn closed(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut rx = self.closed_rx.clone();
        async move { while rx.changed().await.is_ok() {} }
    }

    /// The counters this source shares with metrics, `/readyz` and the watchdog: events read
    /// and not yet settled for good (in line, in flight, retrying).
    pub fn stats(&self) -> Arc<LedgerStats> {
        self.stats.clone()
    }

    fn call_err<E>(&self, doing: &str, e: E) -> SourceError
    where
        E: std::error::Error + Send + Sync + 'static,
    {
        SourceError::unavailable(format!(
            "{doing} (table `{}`) failed: {}",
            self.config.table,
            outbox_core::relay::ErrorChain(&e)
        ))
    }

    /// The stream's ARN (read once) and the dead aggregates (loaded once).
    async fn ensure_started(&mut self) -> Result<(), SourceError> {
        if self.stream_arn.is_none() {
            let out = self
                .table
                .describe_table()
                .table_name(&self.config.table)
                .send()
                .await;
            let table = match out {
                Ok(out) => out.table,
                Err(e) if e.code() == Some("ResourceNotFoundException") => {
                    return Err(SourceError::fatal(format!(
                        "DynamoDB table `{}` does not exist: create it, then run `outbox migrate`",
                        self.config.table
                    )));
                }
                Err(e) => return Err(self.call_err("describing the table", e)),
            };
            let enabled = table
                .as_ref()
                .and_then(|t| t.stream_specification())
                .is_some_and(|s| s.stream_enabled());
            let arn = table.as_ref().and_then(|t| t.latest_stream_arn());
            match (enabled, arn) {
                (true, Some(arn)) => self.stream_arn = Some(arn.to_owned()),
                _ => {
                    return Err(SourceError::fatal(format!(
                        "DynamoDB table `{}` has no stream: run `outbox migrate`, which turns it on",
                        self.config.table
                    )));
                }
            }
        }
        if self.dead.is_none() {
            self.dead = Some(if self.hold {
                self.leases.dead_aggregates().await?
            } else {
                HashSet::new()
            });
        }
        Ok(())
    }
}

impl Source for DynamoStreamSource {
    async fn fetch(&mut self, limit: usize, now: OffsetDateTime) -> Result<Fetched, SourceError> {
        self.ledger.release_in_flight();
        self.ensure_started().await?;
        self.discover().await?;
        self.read(now).await?;
        self.refresh_waiting().await?;
        self.pick_up_requeued().await?;
        self.renew_claims().await?;
        self.checkpoint(false).await?;
        self.stats
            .streaming
            .store(!self.held.is_empty(), std::sync::atomic::Ordering::Relaxed);
        let valid_until = self.valid_until();
        let (ledger, stats) = (&mut self.ledger, &self.stats);
        Ok(ledger.fetched(limit, now, self.ordering, valid_until, stats))
    }

    async fn settle(
        &mut self,
        settlements: &[Settlement],
        now: OffsetDateTime,
    ) -> Result<(), SourceError> {
        for s in settlements {
            if let Outcome::DeadLetter { reason } = &s.outcome
                && let Some(e) = self.ledger.in_flight(s.position.0)
            {
                let (event, seq, attempts) = (e.event.clone(), e.meta.seq, e.event.attempts + 1);
                if let Err(err) = self
                    .leases
                    .dead(&event, Some(seq), attempts, reason, now)
                    .await
                {
                    self.ledger.release_in_flight();
                    return Err(err);
                }
            }
        }
        let mut settled: Vec<(Entry<Meta>, bool)> = Vec::new();
        for s in settlements {
            let Some(mut entry) = self.ledger.take_in_flight(s.position.0) else {
                continue;
            };
            match &s.outcome {
                Outcome::Delivered => settled.push((entry, true)),
                Outcome::DeadLetter { .. } => {
                    // A retried event dead again: the ones behind it are parked again.
                    self.retrying.remove(&entry.aggregate());
                    if self.hold
                        && let Some(dead) = self.dead.as_mut()
                    {
                        dead.insert(entry.aggregate());
                    }
                    settled.push((entry, false));
                }
                Outcome::Retry { not_before, .. } => {
                    entry.event.attempts += 1;
                    entry.not_before = Some(*not_before);
                    self.ledger.requeue(entry);
                }
                Outcome::Released => self.ledger.requeue(entry),
            }
        }
        self.ledger.release_in_flight();
        let mut requeued = Vec::new();
        for (entry, delivered) in settled {
            self.ledger.finish(&entry);
            self.unrecorded
                .entry(entry.aggregate())
                .and_modify(|s| *s = (*s).max(entry.meta.seq))
                .or_insert(entry.meta.seq);
            self.mark_settled(&entry.meta.shard, &entry.meta.seqnum);
            if let Some(key) = entry.meta.requeued.clone() {
                requeued.push((key, delivered));
            }
        }
        // A held event of a dead-lettered aggregate queued behind it is parked at once.
        if self.hold {
            let dead = self.dead.clone().unwrap_or_default();
            let parked: Vec<i64> = self
                .ledger
                .queued()
                .filter(|e| dead.contains(&e.aggregate()))
                .filter(|e| e.meta.requeued.is_none() || !self.retrying.contains(&e.aggregate()))
                .map(|e| e.event.position.0)
                .collect();
            for p in parked {
                if let Some(entry) = self.ledger.remove_queued(p) {
                    let key = entry.aggregate();
                    let reason = format!(
                        "held: an earlier event of aggregate {}/{} is dead-lettered (dead_letter = \"hold-aggregate\"); retry them together, in order",
                        key.0, key.1
                    );
                    self.leases
                        .dead(&entry.event, Some(entry.meta.seq), 0, &reason, now)
                        .await?;
                    self.ledger.finish(&entry);
                    self.unrecorded
                        .entry(key)
                        .and_modify(|s| *s = (*s).max(entry.meta.seq))
                        .or_insert(entry.meta.seq);
                    self.mark_settled(&entry.meta.shard, &entry.meta.seqnum);
                    if let Some(k) = entry.meta.requeued.clone() {
                        requeued.push((k, false));
                    }
                }
            }
        }
        for (key, delivered) in requeued {
            self.requeued_settled(&key, delivered).await?;
        }
        self.stats.publish(&self.ledger);
        self.checkpoint(true).await
    }

    async fn wait_for_events(&mut self, max: Duration) {
        let now = OffsetDateTime::now_utc();
        if !self.ledger.selectable(1, now, self.ordering).is_empty() {
            return;
        }
        let mut until = Instant::now() + max;
        for s in self.held.values() {
            if !s.ended {
                until = until.min(s.next_read);
            }
        }
        if !self.waiting.is_empty() {
            until = until.min(self.next_position_refresh);
        }
        if self.held.is_empty() {
            until = until.min(self.next_discovery);
        }
        until = until.min(self.next_requeue_check);
        if let Some(due) = self.ledger.next_due(now) {
            let wait: Duration = (due - now).try_into().unwrap_or(Duration::ZERO);
            until = until.min(Instant::now() + wait);
        }
        tokio::time::sleep_until(until).await;
    }
}

impl Drop for DynamoStreamSource {
    fn drop(&mut self) {
        let shards: Vec<(String, Option<String>)> = self
            .held
            .values()
            .map(|s| {
                let mut done = s.checkpoint.clone();
                for (n, settled) in &s.read {
                    if !*settled {
                        break;
                    }
                    done = Some(n.to_string());
                }
                (s.id.to_string(), done)
            })
            .collect();
        let closed = self.closed_tx.take();
        let claims: Vec<String> = self.claims.keys().map(|k| k.to_string()).collect();
        if shards.is_empty() && claims.is_empty() {
            return;
        }
        let leases = self.leases.clone();
        let unrecorded: Vec<_> = self.unrecorded.drain().collect();
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                leases.release_claims(&claims).await;
                if leases.advance(unrecorded).await.is_err() {
                    return; // keep the checkpoints where they are
                }
                for (shard, checkpoint) in shards {
                    let _ = leases.save(&shard, checkpoint.as_deref(), false, 0).await;
                    leases.release(&shard).await;
                }
                drop(closed);
            });
        }
    }
}
