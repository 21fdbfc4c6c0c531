//! What every consumer-loop test shares: events as the relay writes them, and a [`Ledger`]:
//! a consumer whose side effect is a row in `points`, run through the PostgreSQL inbox, with
//! injectable failures (transient, poison, a crash between commit and ack).

#![allow(dead_code, unreachable_pub)]

use std::collections::{HashMap, HashSet};
use std::num::{NonZeroU32, NonZeroUsize};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::FutureExt as _;
use futures::future::BoxFuture;
use outbox_core::{Event, Position, Sink};
use outbox_inbox::{
    ConsumerError, ConsumerReport, InboxError, InboxMessage, LanePolicy, Outcome, PgInbox,
};
use outbox_testkit::services::Postgres;
use outbox_testkit::wait::eventually;
use sqlx::PgPool;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// How long a test waits for a loop to get through its messages.
pub const WAIT: Duration = Duration::from_secs(30);

/// Keys of the order scenario, and events per key.
pub const KEYS: [&str; 6] = ["a", "b", "c", "d", "e", "f"];
pub const PER_KEY: usize = 20;

/// A name unique to this test (stream, queue, topic, group).
pub fn unique() -> String {
    format!("t{}", &Uuid::now_v7().simple().to_string()[20..])
}

/// An `Order` event of `aggregate_id` whose payload is `seq`.
pub fn event(aggregate_id: &str, seq: usize) -> Event {
    Event {
        id: Uuid::now_v7(),
        position: Position(seq as i64),
        aggregate_type: "Order".to_owned(),
        aggregate_id: aggregate_id.to_owned(),
        event_type: "order.placed".to_owned(),
        payload: seq.to_string().into_bytes().into(),
        headers: vec![("tenant".to_owned(), "acme".to_owned())],
        created_at: time::OffsetDateTime::now_utc(),
        attempts: 0,
    }
}

/// `PER_KEY` events for each of `KEYS`, interleaved, in commit order.
pub fn order_events() -> Vec<Event> {
    (0..PER_KEY)
        .flat_map(|seq| KEYS.iter().map(move |k| event(k, seq)))
        .collect()
}

/// Publishes through one of the relay's real sinks; every event must be delivered.
pub async fn publish_all(sink: &impl Sink, events: &[Event]) {
    for d in sink.publish(events).await.expect("published") {
        d.expect("delivered");
    }
}

/// Runs a loop in a task; it must end without error.
pub fn spawn<F>(run: F) -> JoinHandle<ConsumerReport>
where
    F: Future<Output = Result<ConsumerReport, ConsumerError>> + Send + 'static,
{
    tokio::spawn(async move { run.await.expect("runs") })
}

/// Fast retries for tests: 4 lanes, `max_attempts` 4, backoff 10 ms doubling to 50 ms.
pub fn policy() -> LanePolicy {
    LanePolicy {
        lanes: NonZeroUsize::new(4).expect("not zero"),
        max_in_flight: NonZeroUsize::new(32).expect("not zero"),
        max_attempts: NonZeroU32::new(4).expect("not zero"),
        backoff_base: Duration::from_millis(10),
        backoff_max: Duration::from_millis(50),
    }
}

/// The handler type every loop accepts.
pub type Handler =
    Box<dyn Fn(InboxMessage) -> BoxFuture<'static, Result<(), String>> + Send + Sync>;

/// A consumer adding one `points` row per event, through the inbox.
pub struct Ledger {
    pub pool: PgPool,
    /// Remaining failures (after the side effect, so the rollback is exercised) per seq of
    /// key `aggregate_id`.
    failures: Mutex<HashMap<(String, usize), usize>>,
    /// Aggregates whose every event fails.
    poison: Mutex<HashSet<String>>,
    /// The next handled message commits, then waits for this token and fails: a consumer
    /// stopped between its commit and its ack.
    crash: Mutex<Option<CancellationToken>>,
    /// `(aggregate_id, seq)` of each processed (committed) message, in commit order.
    pub processed: Mutex<Vec<(String, usize)>>,
    pub duplicates: AtomicUsize,
    pub attempts: AtomicUsize,
}

impl Ledger {
    /// A fresh database with the inbox and a `points` table (no unique key: only the inbox
    /// keeps a side effect from happening twice).
    pub async fn new() -> Arc<Self> {
        let pg = Postgres::shared().await.expect("postgres starts");
        let pool = PgPool::connect(&pg.fresh_database().await.expect("db"))
            .await
            .expect("connects");
        sqlx::query("CREATE TABLE points (event_id uuid NOT NULL, aggregate_id text, seq int)")
            .execute(&pool)
            .await
            .expect("points");
        PgInbox::default().migrate(&pool).await.expect("migrates");
        Arc::new(Self {
            pool,
            failures: Mutex::default(),
            poison: Mutex::default(),
            crash: Mutex::default(),
            processed: Mutex::default(),
            duplicates: AtomicUsize::new(0),
            attempts: AtomicUsize::new(0),
        })
    }

    pub fn fail(&self, aggregate_id: &str, seq: usize, times: usize) {
        self.failures
            .lock()
            .expect("lock")
            .insert((aggregate_id.to_owned(), seq), times);
    }

    pub fn poison(&self, aggregate_id: &str) {
        self.poison
            .lock()
            .expect("lock")
            .insert(aggregate_id.to_owned());
    }

    pub fn crash_after_next_commit(&self, until: CancellationToken) {
        *self.crash.lock().expect("lock") = Some(until);
    }

    /// The handler to give a loop.
    pub fn handler(self: &Arc<Self>) -> Handler {
        let me = Arc::clone(self);
        Box::new(move |m| {
            let me = Arc::clone(&me);
            async move { me.handle(m).await }.boxed()
        })
    }

    async fn handle(&self, m: InboxMessage) -> Result<(), String> {
        self.attempts.fetch_add(1, Ordering::SeqCst);
        let seq: usize = std::str::from_utf8(&m.payload)
            .expect("utf8")
            .parse()
            .expect("number");
        assert_eq!(m.headers, vec![("tenant".to_owned(), "acme".to_owned())]);
        let key = (m.aggregate_id.clone(), seq);
        let fail = {
            let mut failures = self.failures.lock().expect("lock");
            let left = failures.get_mut(&key);
            let poisoned = self.poison.lock().expect("lock").contains(&m.aggregate_id);
            match left {
                Some(n) if *n > 0 => {
                    *n -= 1;
                    true
                }
                _ => poisoned,
            }
        };
        let crash = self.crash.lock().expect("lock").take();
        let outcome = PgInbox::default()
            .process(&self.pool, "loyalty", m.id, |conn| {
                let aggregate_id = m.aggregate_id.clone();
                async move {
                    sqlx::query("INSERT INTO points VALUES ($1, $2, $3)")
                        .bind(m.id)
                        .bind(aggregate_id)
                        .bind(seq as i32)
                        .execute(conn)
                        .await
                        .map_err(|e| e.to_string())?;
                    if fail {
                        return Err("injected failure after the side effect".to_owned());
                    }
                    Ok(())
                }
                .boxed()
            })
            .await
            .map_err(|e| match e {
                InboxError::Handler(e) => e,
                InboxError::Database(e) => format!("inbox database: {e}"),
            })?;
        match outcome {
            Outcome::Processed(()) => self.processed.lock().expect("lock").push(key),
            Outcome::Duplicate => {
                self.duplicates.fetch_add(1, Ordering::SeqCst);
            }
        }
        if let Some(until) = crash {
            until.cancelled().await;
            return Err("crashed after the commit, before the ack".to_owned());
        }
        Ok(())
    }

    pub fn processed_count(&self) -> usize {
        self.processed.lock().expect("lock").len()
    }

    /// Waits until `n` messages were processed (committed).
    pub async fn wait_processed(&self, n: usize) {
        eventually(WAIT, || std::future::ready(self.processed_count() >= n))
            .await
            .unwrap_or_else(|_| panic!("{} of {n} processed", self.processed_count()));
    }

    /// Waits until `n` duplicates were seen.
    pub async fn wait_duplicates(&self, n: usize) {
        eventually(WAIT, || {
            std::future::ready(self.duplicates.load(Ordering::SeqCst) >= n)
        })
        .await
        .unwrap_or_else(|_| panic!("{n} duplicates expected"));
    }

    /// Side effects of `id` in the database.
    pub async fn side_effects(&self, id: Uuid) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM points WHERE event_id = $1")
            .bind(id)
            .fetch_one(&self.pool)
            .await
            .expect("count")
    }

    /// Side effects in all.
    pub async fn total(&self) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM points")
            .fetch_one(&self.pool)
            .await
            .expect("count")
    }

    /// Each of `keys` was processed exactly in seq order `0..per_key`.
    pub fn assert_per_key_order(&self, keys: &[&str], per_key: usize) {
        let processed = self.processed.lock().expect("lock");
        for k in keys {
            let seqs: Vec<usize> = processed
                .iter()
                .filter(|(a, _)| a == k)
                .map(|(_, s)| *s)
                .collect();
            assert_eq!(seqs, (0..per_key).collect::<Vec<_>>(), "order of key {k}");
        }
    }
}

/// Starts a consumer loop that stops when the token is cancelled.
pub trait Start: Fn(&CancellationToken) -> JoinHandle<ConsumerReport> {}
impl<F: Fn(&CancellationToken) -> JoinHandle<ConsumerReport>> Start for F {}

impl Ledger {
    /// The redelivery scenario: event `o_1` is committed by a consumer that stops before its
    /// ack; the restarted consumer gets it again and the inbox says duplicate. Then the relay
    /// publishes `o_2` twice (a crash after publish, before mark). Each has one side effect.
    /// `broker_drops_republish`: the broker deduplicates publishes itself (JetStream).
    /// Returns the second run's report.
    pub async fn redelivery_scenario(
        self: &Arc<Self>,
        start: impl Start,
        publish: impl AsyncFn(&[Event]),
        broker_drops_republish: bool,
    ) -> ConsumerReport {
        let first = event("o_1", 0);
        publish(std::slice::from_ref(&first)).await;
        let stop = CancellationToken::new();
        self.crash_after_next_commit(stop.clone());
        let run = start(&stop);
        self.wait_processed(1).await;
        stop.cancel();
        let report = run.await.expect("task");
        assert_eq!(
            (report.acked, report.released),
            (0, 1),
            "stopped before the ack"
        );

        let shutdown = CancellationToken::new();
        let run = start(&shutdown);
        self.wait_duplicates(1).await;
        let second = event("o_2", 0);
        publish(&[second.clone(), second.clone()]).await;
        if !broker_drops_republish {
            self.wait_duplicates(2).await;
        }
        self.wait_processed(2).await;
        shutdown.cancel();
        let report = run.await.expect("task");
        let duplicates = if broker_drops_republish { 1 } else { 2 };
        assert_eq!(report.acked, 1 + duplicates);
        assert_eq!(self.side_effects(first.id).await, 1);
        assert_eq!(self.side_effects(second.id).await, 1);
        report
    }

    /// The failure scenario: the order events plus two events of poison key `p`; `b/5`
    /// fails twice. Runs the loop until every good event was processed and `dead_lettered`
    /// says both poison events reached the dead-letter mechanism, then checks what all
    /// loops share: in-place retries kept per-key order, failed attempts rolled back.
    /// Returns the events (the poison ones last) and the report.
    pub async fn failure_scenario(
        self: &Arc<Self>,
        start: impl Start,
        publish: impl AsyncFn(&[Event]),
        dead_lettered: impl AsyncFn() -> bool,
    ) -> (Vec<Event>, ConsumerReport) {
        let mut events = order_events();
        events.extend([event("p", 0), event("p", 1)]);
        publish(&events).await;
        self.fail("b", 5, 2);
        self.poison("p");
        let shutdown = CancellationToken::new();
        let run = start(&shutdown);
        let normal = events.len() - 2;
        self.wait_processed(normal).await;
        eventually(WAIT, || dead_lettered())
            .await
            .expect("both poison messages dead-lettered");
        shutdown.cancel();
        let report = run.await.expect("task");
        assert_eq!(report.acked, normal as u64);
        assert_eq!(report.dead_lettered, 2);
        assert_eq!(
            report.retried,
            2 + 2 * 3,
            "b/5 twice, each poison message 3 times"
        );
        self.assert_per_key_order(&KEYS, PER_KEY);
        assert_eq!(
            self.total().await,
            normal as i64,
            "failed attempts rolled back"
        );
        (events, report)
    }
}
