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
mod requeue;

pub(crate) use lag::unread;
pub(crate) use lease::held_key;
pub(crate) use requeue::{DEAD_PREFIX, aggregate_of, request, scan_prefix};

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aws_sdk_dynamodb::error::ProvideErrorMetadata;
use aws_sdk_dynamodbstreams::types::ShardIteratorType;
use outbox_core::source::{Fetched, Outcome, Settlement};
use outbox_core::stream_ledger::{Entry, Ledger, LedgerStats};
use outbox_core::{DeadLetterPolicy, Event, Ordering, Source, SourceError};
use time::OffsetDateTime;
use tokio::time::Instant;

use crate::config::DynamoDbConfig;
use decode::{Decoded, decode};
use lease::Leases;
use requeue::Requeued;

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

    /// Lists the shards, then takes the lease of every shard that is free and whose parent
    /// is finished.
    async fn discover(&mut self) -> Result<(), SourceError> {
        if Instant::now() < self.next_discovery {
            return Ok(());
        }
        self.next_discovery = Instant::now() + DISCOVERY_INTERVAL;
        let arn = self.stream_arn.clone().unwrap_or_default();
        let mut start: Option<String> = None;
        loop {
            let out = self
                .streams
                .describe_stream()
                .stream_arn(&arn)
                .set_exclusive_start_shard_id(start.clone())
                .send()
                .await
                .map_err(|e| self.call_err("listing the stream's shards", e))?;
            let Some(desc) = out.stream_description else {
                break;
            };
            for shard in desc.shards() {
                if let Some(id) = shard.shard_id() {
                    self.topology
                        .insert(id.to_owned(), shard.parent_shard_id().map(str::to_owned));
                }
            }
            match desc.last_evaluated_shard_id {
                Some(id) => start = Some(id),
                None => break,
            }
        }
        let mut candidates: Vec<(String, Option<String>)> = self
            .topology
            .iter()
            .filter(|(id, _)| !self.held.contains_key(id.as_str()) && !self.finished.contains(*id))
            .map(|(id, parent)| (id.clone(), parent.clone()))
            .collect();
        candidates.sort();
        for (id, parent) in candidates {
            if let Some(parent) = parent
                && self.topology.contains_key(&parent)
                && !self.finished.contains(&parent)
            {
                if self.leases.finished(&parent).await? {
                    self.finished.insert(parent);
                } else {
                    continue; // the parent first
                }
            }
            let now = now_ms();
            let until = now + self.lease_duration.as_millis() as u64;
            let Some(lease) = self.leases.acquire(&id, now, until).await? else {
                if self.leases.finished(&id).await? {
                    self.finished.insert(id);
                }
                continue;
            };
            let iterator = self.iterator(&id, lease.checkpoint.as_deref()).await?;
            tracing::info!(shard = %id, resume_after = ?lease.checkpoint, "reading a stream shard");
            let shard_id: Arc<str> = Arc::from(id.as_str());
            self.held.insert(
                shard_id.clone(),
                Shard {
                    id: shard_id,
                    iterator: Some(iterator),
                    ended: false,
                    read: VecDeque::new(),
                    checkpoint: lease.checkpoint.clone(),
                    dirty: false,
                    last_read: lease.checkpoint,
                    lease_until: Instant::now() + self.lease_duration,
                    lease_renewed: Instant::now(),
                    next_read: Instant::now(),
                },
            );
        }
        Ok(())
    }

    /// An iterator after `after`, or at the oldest record.
    async fn iterator(&self, shard: &str, after: Option<&str>) -> Result<String, SourceError> {
        let arn = self.stream_arn.clone().unwrap_or_default();
        let mut req = self
            .streams
            .get_shard_iterator()
            .stream_arn(&arn)
            .shard_id(shard);
        req = match after {
            Some(seq) => req
                .shard_iterator_type(ShardIteratorType::AfterSequenceNumber)
                .sequence_number(seq),
            None => req.shard_iterator_type(ShardIteratorType::TrimHorizon),
        };
        match req.send().await {
            Ok(out) => out
                .shard_iterator
                .ok_or_else(|| SourceError::unavailable("the stream returned no shard iterator")),
            Err(e) if e.code() == Some("TrimmedDataAccessException") => {
                warn_trimmed(shard, after);
                let out = self
                    .streams
                    .get_shard_iterator()
                    .stream_arn(&arn)
                    .shard_id(shard)
                    .shard_iterator_type(ShardIteratorType::TrimHorizon)
                    .send()
                    .await
                    .map_err(|e| self.call_err("opening a shard", e))?;
                out.shard_iterator.ok_or_else(|| {
                    SourceError::unavailable("the stream returned no shard iterator")
                })
            }
            Err(e) => Err(self.call_err("opening a shard", e)),
        }
    }

    /// Reads every held shard that is due.
    async fn read(&mut self, now: OffsetDateTime) -> Result<(), SourceError> {
        let due: Vec<Arc<str>> = self
            .held
            .values()
            .filter(|s| !s.ended && s.next_read <= Instant::now())
            .map(|s| s.id.clone())
            .collect();
        for shard in due {
            if self.ledger.unsettled() >= MAX_BUFFERED {
                return Ok(());
            }
            let Some(iterator) = self.held.get(&shard).and_then(|s| s.iterator.clone()) else {
                continue;
            };
            let out = self
                .streams
                .get_records()
                .shard_iterator(iterator)
                .limit(READ_LIMIT)
                .send()
                .await;
            let out = match out {
                Ok(out) => out,
                Err(e) if e.code() == Some("ExpiredIteratorException") => {
                    let after = self.held.get(&shard).and_then(|s| s.last_read.clone());
                    let fresh = self.iterator(&shard, after.as_deref()).await?;
                    if let Some(s) = self.held.get_mut(&shard) {
                        s.iterator = Some(fresh);
                    }
                    continue;
                }
                Err(e)
                    if e.code() == Some("LimitExceededException")
                        || e.code() == Some("ProvisionedThroughputExceededException") =>
                {
                    if let Some(s) = self.held.get_mut(&shard) {
                        s.next_read = Instant::now() + IDLE_READ * 4;
                    }
                    tracing::debug!(%shard, "stream reads throttled; backing off");
                    continue;
                }
                Err(e) if e.code() == Some("TrimmedDataAccessException") => {
                    let after = self.held.get(&shard).and_then(|s| s.last_read.clone());
                    warn_trimmed(&shard, after.as_deref());
                    let fresh = self.iterator(&shard, None).await?;
                    if let Some(s) = self.held.get_mut(&shard) {
                        s.iterator = Some(fresh);
                    }
                    continue;
                }
                Err(e) => return Err(self.call_err("reading the stream", e)),
            };
            let records = out.records.unwrap_or_default();
            let got = records.len();
            for record in &records {
                let seqnum: Arc<str> = Arc::from(
                    record
                        .dynamodb()
                        .and_then(|d| d.sequence_number())
                        .unwrap_or_default(),
                );
                let decoded = decode(record, &self.config.sort_key);
                let settled = matches!(decoded, Decoded::Ignored);
                if let Some(s) = self.held.get_mut(&shard) {
                    s.read.push_back((seqnum.clone(), settled));
                    s.last_read = Some(seqnum.to_string());
                }
                let meta = |seq| Meta {
                    shard: shard.clone(),
                    seqnum: seqnum.clone(),
                    seq,
                    requeued: None,
                };
                match decoded {
                    Decoded::Ignored => {}
                    Decoded::Event { event, seq } => self.ingest(event, meta(seq), now).await?,
                    Decoded::Invalid { event, reason } => {
                        tracing::error!(event_id = %event.id, %reason, "dead-lettered an outbox item that cannot be published");
                        self.leases.dead(&event, None, 1, &reason, now).await?;
                        self.mark_settled(&shard, &seqnum);
                    }
                }
            }
            if let Some(s) = self.held.get_mut(&shard) {
                s.iterator = out.next_shard_iterator;
                if s.iterator.is_none() {
                    s.ended = true;
                    tracing::info!(shard = %s.id, "read a closed shard to its end");
                }
                s.next_read = if got == 0 {
                    Instant::now() + IDLE_READ
                } else {
                    Instant::now()
                };
            }
        }
        Ok(())
    }

    /// An event read from the stream: in line when its predecessor is out, else waiting.
    async fn ingest(
        &mut self,
        event: Event,
        meta: Meta,
        now: OffsetDateTime,
    ) -> Result<(), SourceError> {
        let key = aggregate(&event);
        if self.hold
            && self.dead.as_ref().is_some_and(|d| d.contains(&key))
            && !self.leases.held(&key).await?
        {
            // Its dead letters were purged: the aggregate flows again.
            if let Some(dead) = self.dead.as_mut() {
                dead.remove(&key);
            }
        }
        if self.hold && self.dead.as_ref().is_some_and(|d| d.contains(&key)) {
            if self.leases.is_dead(event.id).await? {
                self.mark_settled(&meta.shard, &meta.seqnum);
                return Ok(());
            }
            let reason = format!(
                "held: an earlier event of aggregate {}/{} is dead-lettered (dead_letter = \"hold-aggregate\"); retry them together, in order",
                key.0, key.1
            );
            self.leases
                .dead(&event, Some(meta.seq), 0, &reason, now)
                .await?;
            self.unrecorded
                .entry(key.clone())
                .and_modify(|s| *s = (*s).max(meta.seq))
                .or_insert(meta.seq);
            self.last.insert(key, meta.seq);
            self.mark_settled(&meta.shard, &meta.seqnum);
            return Ok(());
        }
        if self.ordering == Ordering::None {
            self.put_in_line(event, meta);
            return Ok(());
        }
        if !self.last.contains_key(&key) {
            let found = self.leases.positions(std::slice::from_ref(&key)).await?;
            self.last
                .insert(key.clone(), found.get(&key).copied().unwrap_or(0));
        }
        let last = self.last.get(&key).copied().unwrap_or(0);
        if meta.seq <= last {
            // Handed out already (the tail after a restart, read again).
            tracing::debug!(event_id = %event.id, seq = meta.seq, "skipping an event already handed out");
            self.mark_settled(&meta.shard, &meta.seqnum);
            return Ok(());
        }
        self.waiting.entry(key.clone()).or_default().insert(
            meta.seq,
            Waiting {
                event,
                meta,
                since: Instant::now(),
            },
        );
        self.release_waiting(&key);
        Ok(())
    }

    /// Puts in line the waiting events of `key` whose predecessor is out.
    fn release_waiting(&mut self, key: &(String, String)) {
        let Some(queue) = self.waiting.get_mut(key) else {
            return;
        };
        let mut last = self.last.get(key).copied().unwrap_or(0);
        let mut ready = Vec::new();
        while let Some(entry) = queue.first_entry() {
            let seq = *entry.key();
            if seq <= last {
                let w = entry.remove();
                ready.push((w, false));
            } else if seq == last + 1 {
                last = seq;
                ready.push((entry.remove(), true));
            } else if entry.get().since.elapsed() >= self.gap_timeout {
                tracing::error!(
                    aggregate_type = %key.0,
                    aggregate_id = %key.1,
                    missing_after = last,
                    seq,
                    waited = ?self.gap_timeout,
                    "an event's predecessor never appeared in the stream; publishing it anyway (the gap may be events lost to the 24-hour retention, or a producer that does not draw seq from the aggregate's version)"
                );
                last = seq;
                ready.push((entry.remove(), true));
            } else {
                break;
            }
        }
        if queue.is_empty() {
            self.waiting.remove(key);
        }
        self.last.insert(key.clone(), last);
        for (w, in_line) in ready {
            if in_line {
                self.put_in_line(w.event, w.meta);
            } else {
                self.mark_settled(&w.meta.shard, &w.meta.seqnum);
            }
        }
    }

    fn put_in_line(&mut self, event: Event, meta: Meta) {
        self.counter += 1;
        self.ledger.commit(vec![(event, meta)], self.counter);
    }

    /// Marks a record settled for good in its shard's read list.
    fn mark_settled(&mut self, shard: &str, seqnum: &str) {
        if let Some(s) = self.held.get_mut(shard)
            && let Some(r) = s.read.iter_mut().find(|(n, _)| &**n == seqnum)
        {
            r.1 = true;
        }
    }

    /// Reads again the positions of aggregates whose events wait (another relay may have
    /// handed the predecessor out), and lets the waits past `gap_timeout` go.
    async fn refresh_waiting(&mut self) -> Result<(), SourceError> {
        if self.waiting.is_empty() || Instant::now() < self.next_position_refresh {
            return Ok(());
        }
        self.next_position_refresh = Instant::now() + POSITION_REFRESH;
        let keys: Vec<(String, String)> = self.waiting.keys().cloned().collect();
        let found = self.leases.positions(&keys).await?;
        for key in keys {
            if let Some(p) = found.get(&key) {
                let last = self.last.entry(key.clone()).or_insert(0);
                *last = (*last).max(*p);
            }
            self.release_waiting(&key);
        }
        Ok(())
    }

    /// Moves each shard's checkpoint over its settled prefix, renews leases, saves what
    /// moved, and lets finished shards go. Positions handed out are recorded first, so a
    /// checkpoint never passes an event whose position is not on record.
    async fn checkpoint(&mut self, force: bool) -> Result<(), SourceError> {
        if !self.unrecorded.is_empty() {
            let positions: Vec<_> = self
                .unrecorded
                .iter()
                .map(|(k, v)| (k.clone(), *v))
                .collect();
            self.leases.advance(positions).await?;
            self.unrecorded.clear();
        }
        let renew_after = self.lease_duration / 3;
        let ids: Vec<Arc<str>> = self.held.keys().cloned().collect();
        for id in ids {
            let Some(s) = self.held.get_mut(&id) else {
                continue;
            };
            while s.read.front().is_some_and(|(_, done)| *done) {
                if let Some((n, _)) = s.read.pop_front() {
                    s.checkpoint = Some(n.to_string());
                    s.dirty = true;
                }
            }
            let finished = s.ended && s.read.is_empty();
            let due = s.lease_renewed.elapsed() >= renew_after;
            if !(finished || due || (force && s.dirty)) {
                continue;
            }
            let checkpoint = s.dirty.then(|| s.checkpoint.clone()).flatten();
            let until = now_ms() + self.lease_duration.as_millis() as u64;
            let kept = self
                .leases
                .save(&id, checkpoint.as_deref(), finished, until)
                .await?;
            if !kept {
                tracing::warn!(shard = %id, "lost the lease of a shard to another relay; dropping what was read from it");
                self.drop_shard(&id);
                continue;
            }
            if finished {
                tracing::info!(shard = %id, "shard finished: its child shards may be read");
                self.held.remove(&id);
                self.finished.insert(id.to_string());
                self.next_discovery = Instant::now();
                continue;
            }
            if let Some(s) = self.held.get_mut(&id) {
                s.dirty = false;
                s.lease_renewed = Instant::now();
                s.lease_until = Instant::now() + self.lease_duration;
            }
        }
        Ok(())
    }

    /// Forgets a shard whose lease was lost: its queued and waiting events belong to the
    /// new holder.
    fn drop_shard(&mut self, id: &str) {
        self.held.remove(id);
        let queued: Vec<(i64, (String, String))> = self
            .ledger
            .queued()
            .filter(|e| &*e.meta.shard == id)
            .map(|e| (e.event.position.0, e.aggregate()))
            .collect();
        for (p, key) in queued {
            self.ledger.remove_queued(p);
            self.last.remove(&key);
        }
        for (key, queue) in self.waiting.iter_mut() {
            queue.retain(|_, w| &*w.meta.shard != id);
            self.last.remove(key);
        }
        self.waiting.retain(|_, q| !q.is_empty());
    }

    /// Until when a batch from the held shards may be published.
    fn valid_until(&self) -> Option<Instant> {
        let claims = (!self.claims.is_empty()).then_some(self.claims_until);
        self.held
            .values()
            .map(|s| s.lease_until)
            .chain(claims)
            .min()
    }

    /// Puts in line what `outbox dead retry` asked for, once the request counter moved (and
    /// at start, and when another relay's claim may have expired).
    async fn pick_up_requeued(&mut self) -> Result<(), SourceError> {
        if Instant::now() < self.next_requeue_check {
            return Ok(());
        }
        self.next_requeue_check = Instant::now() + REQUEUE_CHECK;
        let requests = self.leases.requeue_requests().await?;
        if self.requests_seen == Some(requests) {
            return Ok(());
        }
        let until = now_ms() + self.lease_duration.as_millis() as u64;
        let claimed = self.leases.claim_requeued(now_ms(), until).await?;
        // Marked items under another relay's claim: look again once that claim may have
        // expired (its relay died).
        self.requests_seen = (claimed.others == 0).then_some(requests);
        if claimed.others > 0 {
            self.next_requeue_check = Instant::now() + self.lease_duration;
        }
        if claimed.mine.is_empty() {
            return Ok(());
        }
        let mut mine = claimed.mine;
        mine.retain(|r| !self.claims.contains_key(r.key.as_str()));
        mine.sort_by(|a, b| {
            (&a.event.aggregate_type, &a.event.aggregate_id, a.seq).cmp(&(
                &b.event.aggregate_type,
                &b.event.aggregate_id,
                b.seq,
            ))
        });
        let keys: Vec<(String, String)> = mine.iter().map(|r| aggregate(&r.event)).collect();
        let unknown: Vec<(String, String)> = keys
            .iter()
            .filter(|k| !self.last.contains_key(*k))
            .cloned()
            .collect();
        if !unknown.is_empty() {
            let found = self.leases.positions(&unknown).await?;
            for k in unknown {
                let p = found.get(&k).copied().unwrap_or(0);
                self.last.insert(k, p);
            }
        }
        tracing::info!(
            events = mine.len(),
            "putting retried dead letters back in line"
        );
        for Requeued { key, event, seq } in mine {
            let agg = aggregate(&event);
            // New events of the aggregate from the stream are still parked until these are
            // out; then they are retried too, behind them.
            self.retrying.insert(agg.clone());
            let last = self.last.entry(agg.clone()).or_insert(0);
            *last = (*last).max(seq);
            let key: Arc<str> = Arc::from(key);
            self.claims.insert(key.clone(), agg);
            self.put_in_line(
                event,
                Meta {
                    shard: Arc::from(""),
                    seqnum: Arc::from(""),
                    seq,
                    requeued: Some(key),
                },
            );
        }
        self.claims_until = Instant::now() + self.lease_duration;
        self.claims_renewed = Instant::now();
        Ok(())
    }

    /// Renews the claims on retried events (with the shard leases); drops the ones lost.
    async fn renew_claims(&mut self) -> Result<(), SourceError> {
        if self.claims.is_empty() || self.claims_renewed.elapsed() < self.lease_duration / 3 {
            return Ok(());
        }
        let keys: Vec<String> = self.claims.keys().map(|k| k.to_string()).collect();
        let until = now_ms() + self.lease_duration.as_millis() as u64;
        let lost = self.leases.renew_claims(&keys, until).await?;
        self.claims_renewed = Instant::now();
        self.claims_until = Instant::now() + self.lease_duration;
        for key in lost {
            tracing::warn!(item = %key, "lost the claim on a retried dead letter; another relay retries it");
            self.claims.remove(key.as_str());
            let queued: Vec<i64> = self
                .ledger
                .queued()
                .filter(|e| e.meta.requeued.as_deref() == Some(key.as_str()))
                .map(|e| e.event.position.0)
                .collect();
            for p in queued {
                self.ledger.remove_queued(p);
            }
        }
        Ok(())
    }

    /// A retried event was settled for good (`delivered`: acknowledged; else dead again or
    /// parked). When its aggregate has no retried event left in line, what is left of its
    /// dead letters decides: none → the aggregate's mark goes; only events parked meanwhile
    /// behind the retried ones → they are retried too; a dead letter → the aggregate stays
    /// held.
    async fn requeued_settled(&mut self, key: &str, delivered: bool) -> Result<(), SourceError> {
        let Some(agg) = self.claims.remove(key) else {
            return Ok(());
        };
        if delivered {
            self.leases.requeued_done(key).await?;
        }
        if self.claims.values().any(|a| *a == agg) {
            return Ok(());
        }
        self.retrying.remove(&agg);
        let left = self.leases.dead_of(&agg).await?;
        if left.is_empty() {
            self.leases.unhold(&agg).await?;
            if let Some(dead) = self.dead.as_mut() {
                dead.remove(&agg);
            }
        } else if left.iter().all(|(_, held)| *held) {
            let keys: Vec<String> = left.into_iter().map(|(k, _)| k).collect();
            request(&self.leases.client, &self.leases.table, &keys, now_ms()).await?;
            self.next_requeue_check = Instant::now();
        } else if self.hold
            && let Some(dead) = self.dead.as_mut()
        {
            dead.insert(agg);
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
        let events = self.ledger.take(limit, now, self.ordering);
        self.stats.publish(&self.ledger);
        self.stats
            .streaming
            .store(!self.held.is_empty(), std::sync::atomic::Ordering::Relaxed);
        Ok(Fetched {
            more: events.len() >= limit,
            events,
            valid_until: self.valid_until(),
        })
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
