use super::*;
use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicU64, Ordering};

use super::super::{BoxError, ConsumerOrder};

/// Records what the lanes did with each delivery (a stand-in for a broker: the logic
/// under test is the lanes', the brokers' own tests use real servers).
#[derive(Default)]
struct Log(Mutex<Vec<String>>);

impl Settle for Log {
    type Handle = u32;
    async fn ack(&self, h: u32) -> Result<(), BoxError> {
        self.0.lock().expect("lock").push(format!("ack {h}"));
        Ok(())
    }
    async fn dead_letter(
        &self,
        h: u32,
        _: Option<&InboxMessage>,
        reason: &str,
    ) -> Result<(), BoxError> {
        self.0
            .lock()
            .expect("lock")
            .push(format!("dead {h}: {reason}"));
        Ok(())
    }
    async fn release(&self, h: u32) {
        self.0.lock().expect("lock").push(format!("release {h}"));
    }
}

impl Log {
    /// What was done, in order.
    fn lines(&self) -> Vec<String> {
        self.0.lock().expect("lock").clone()
    }
}

/// One lane: one message at a time, in the order the lanes hand them out.
fn one_lane() -> LanePolicy {
    LanePolicy {
        lanes: NonZeroUsize::new(1).expect("not zero"),
        ..LanePolicy::default()
    }
}

/// Lanes without an order gate, settling into a log.
struct Ungated {
    log: Arc<Log>,
    shutdown: CancellationToken,
    lanes: Lanes<Log>,
}

/// [`Ungated`] lanes calling `handler`, with a fresh log.
fn ungated(policy: &LanePolicy, handler: impl MessageHandler) -> Ungated {
    let log = Arc::new(Log::default());
    let shutdown = CancellationToken::new();
    let lanes = Lanes::start(policy, None, Arc::clone(&log), handler, &shutdown);
    Ungated {
        log,
        shutdown,
        lanes,
    }
}

impl Ungated {
    /// Dispatches `deliveries` in order, each taken in.
    async fn dispatch<const N: usize>(&self, deliveries: [Incoming<u32>; N]) {
        dispatch_all(&self.lanes, &self.shutdown, deliveries).await;
    }

    /// Finishes the lanes: their report, and what they did with each delivery.
    async fn finish(self) -> (ConsumerReport, Vec<String>) {
        (self.lanes.finish().await, self.log.lines())
    }
}

/// Dispatches `deliveries` in order, each taken in.
async fn dispatch_all<const N: usize>(
    lanes: &Lanes<Log>,
    shutdown: &CancellationToken,
    deliveries: [Incoming<u32>; N],
) {
    for delivery in deliveries {
        assert!(lanes.dispatch(delivery, shutdown).await);
    }
}

/// Applied positions in memory (the inbox's table in the real loops).
#[derive(Default)]
struct Positions(Mutex<HashMap<(String, String), u64>>);

impl crate::lane::OrderGate for Arc<Positions> {
    fn applied<'a>(
        &'a self,
        t: &'a str,
        id: &'a str,
    ) -> BoxFuture<'a, Result<u64, crate::InboxError>> {
        let n = self
            .0
            .lock()
            .expect("lock")
            .get(&(t.to_owned(), id.to_owned()))
            .copied()
            .unwrap_or(0);
        Box::pin(async move { Ok(n) })
    }
    fn pass<'a>(
        &'a self,
        t: &'a str,
        id: &'a str,
        seq: u64,
    ) -> BoxFuture<'a, Result<(), crate::InboxError>> {
        self.advance(t, id, seq);
        Box::pin(async { Ok(()) })
    }
}

impl Positions {
    fn advance(&self, t: &str, id: &str, seq: u64) {
        let mut map = self.0.lock().expect("lock");
        let n = map.entry((t.to_owned(), id.to_owned())).or_insert(0);
        *n = (*n).max(seq);
    }
}

fn numbered(h: u32, key: &str, seq: u64) -> Incoming<u32> {
    let mut i = incoming(h, key, 0);
    i.message.aggregate_seq = Some(seq);
    i
}

/// A handler that applies a message's position (as `begin_message` does) and logs it.
fn applying(positions: &Arc<Positions>, applied: &Arc<Mutex<Vec<u64>>>) -> impl MessageHandler {
    let (positions, applied) = (Arc::clone(positions), Arc::clone(applied));
    move |m: InboxMessage| {
        let (positions, applied) = (Arc::clone(&positions), Arc::clone(&applied));
        async move {
            let seq = m.aggregate_seq.expect("numbered");
            applied.lock().expect("lock").push(seq);
            positions.advance(&m.aggregate_type, &m.aggregate_id, seq);
            Ok::<_, String>(())
        }
    }
}

/// Lanes behind an order gate over in-memory positions, with a handler that applies them.
struct Gated {
    positions: Arc<Positions>,
    /// The positions the handler applied, in order.
    applied: Arc<Mutex<Vec<u64>>>,
    shutdown: CancellationToken,
    lanes: Lanes<Log>,
}

impl Gated {
    /// Dispatches `deliveries` in order, each taken in.
    async fn dispatch<const N: usize>(&self, deliveries: [Incoming<u32>; N]) {
        dispatch_all(&self.lanes, &self.shutdown, deliveries).await;
    }

    /// The positions applied so far, in order.
    fn applied(&self) -> Vec<u64> {
        self.applied.lock().expect("lock").clone()
    }

    /// Finishes the lanes: their report, and every position applied.
    async fn finish(self) -> (ConsumerReport, Vec<u64>) {
        let report = self.lanes.finish().await;
        let applied = self.applied.lock().expect("lock").clone();
        (report, applied)
    }
}

/// [`Gated`] lanes, the gate configured by `order`.
fn gated(order: impl FnOnce(ConsumerOrder) -> ConsumerOrder) -> Gated {
    let positions = Arc::new(Positions::default());
    let applied = Arc::new(Mutex::new(Vec::new()));
    let shutdown = CancellationToken::new();
    let lanes = Lanes::start(
        &LanePolicy::default(),
        Some(order(ConsumerOrder::new(Arc::clone(&positions)))),
        Arc::new(Log::default()),
        applying(&positions, &applied),
        &shutdown,
    );
    Gated {
        positions,
        applied,
        shutdown,
        lanes,
    }
}

#[tokio::test(start_paused = true)]
async fn the_order_gate_holds_later_positions_until_the_missing_one_arrives() {
    let gated = gated(|order| order);
    gated
        .dispatch([numbered(3, "k", 3), numbered(2, "k", 2)])
        .await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(gated.applied().is_empty(), "2 and 3 wait for 1");
    gated.dispatch([numbered(1, "k", 1)]).await;
    // Another instance applied 4 meanwhile; its redelivery here is still handed over (the
    // inbox makes it a duplicate), and 5 follows without waiting.
    gated.positions.advance("A", "j", 4);
    gated.dispatch([numbered(5, "j", 5)]).await;
    let (report, applied) = gated.finish().await;
    let of_k: Vec<u64> = applied.iter().copied().filter(|s| *s != 5).collect();
    assert_eq!(of_k, vec![1, 2, 3], "key k in position order: {applied:?}");
    assert!(applied.contains(&5), "j's next position flows: {applied:?}");
    assert!(report.held >= 1, "{report:?}");
    assert_eq!((report.acked, report.gaps), (4, 0));
}

#[tokio::test(start_paused = true)]
async fn a_missing_position_is_given_up_on_after_the_gap_timeout() {
    let gated = gated(|order| order.gap_timeout(Duration::from_secs(30)));
    gated
        .dispatch([numbered(2, "k", 2), numbered(3, "k", 3)])
        .await;
    tokio::time::sleep(Duration::from_secs(29)).await;
    assert!(gated.applied().is_empty(), "still waiting for 1");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(gated.applied(), vec![2, 3]);
    let (report, _) = gated.finish().await;
    assert_eq!((report.acked, report.gaps), (2, 1));
}

fn incoming(h: u32, key: &str, earlier_attempts: u32) -> Incoming<u32> {
    Incoming {
        handle: h,
        message: InboxMessage {
            id: uuid::Uuid::from_u128(u128::from(h)),
            event_type: "e".into(),
            aggregate_type: "A".into(),
            aggregate_id: key.into(),
            aggregate_seq: None,
            headers: vec![],
            payload: bytes::Bytes::new(),
        },
        earlier_attempts,
    }
}

#[tokio::test(start_paused = true)]
async fn a_failing_message_is_retried_in_place_before_later_ones_of_its_key() {
    let fails = Arc::new(AtomicU64::new(2));
    let lanes = ungated(&one_lane(), move |m: InboxMessage| {
        let fails = Arc::clone(&fails);
        async move {
            let first_fails = m.id.as_u128() == 1 && fails.fetch_sub(1, Ordering::SeqCst) > 0;
            if first_fails || m.id.as_u128() == 3 {
                return Err("boom");
            }
            Ok(())
        }
    });
    let deliveries = [(1, 0), (2, 0), (3, 9)].map(|(h, earlier)| incoming(h, "k", earlier));
    lanes.dispatch(deliveries).await;
    let (report, log) = lanes.finish().await;
    let dead = "dead 3: handler failed 10 times; last error: boom";
    assert_eq!(log, ["ack 1", "ack 2", dead]);
    assert_eq!(report.retried, 2);
    assert_eq!(report.acked, 2);
}

#[tokio::test(start_paused = true)]
async fn a_key_waiting_for_a_retry_does_not_hold_up_other_keys() {
    let policy = LanePolicy {
        max_attempts: std::num::NonZeroU32::new(3).expect("not zero"),
        ..one_lane()
    };
    let poison = |m: InboxMessage| async move {
        if m.aggregate_id == "p" {
            Err("poison")
        } else {
            Ok(())
        }
    };
    let lanes = ungated(&policy, poison);
    lanes.dispatch([1, 2].map(|h| incoming(h, "p", 0))).await;
    lanes.dispatch([3, 4].map(|h| incoming(h, "k", 0))).await;
    let (report, log) = lanes.finish().await;
    assert_eq!(
        log,
        [
            "ack 3",
            "ack 4",
            "dead 1: handler failed 3 times; last error: poison",
            "dead 2: handler failed 3 times; last error: poison",
        ],
        "k flows while p waits; p keeps its order"
    );
    assert_eq!(
        (report.acked, report.dead_lettered, report.retried),
        (2, 2, 4)
    );
}

#[tokio::test(start_paused = true)]
async fn shutdown_releases_queued_and_waiting_messages() {
    let failing = |_m: InboxMessage| async { Err::<(), _>("down") };
    let lanes = ungated(&one_lane(), failing);
    lanes.dispatch([1, 2].map(|h| incoming(h, "k", 0))).await;
    tokio::time::sleep(Duration::from_millis(1500)).await; // 1 failed twice, now waiting
    lanes.shutdown.cancel();
    let late = incoming(3, "j", 0);
    assert!(!lanes.lanes.dispatch(late, &lanes.shutdown).await);
    let (report, log) = lanes.finish().await;
    assert_eq!(log, ["release 3", "release 1", "release 2"]);
    assert_eq!((report.acked, report.released, report.retried), (0, 3, 2));
}
