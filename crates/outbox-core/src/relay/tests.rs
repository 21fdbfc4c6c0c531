use super::*;
use crate::sink::Delivery;
use crate::trace::{AttemptOutcome, AttemptSpan};
use crate::{Position, SinkError};

/// The ledger tests' event of aggregate `T`/`agg`, at `pos` with an id derived from it.
fn ev(agg: &str, pos: i64) -> Event {
    Event {
        id: uuid::Uuid::from_u128(pos as u128),
        position: Position(pos),
        ..crate::stream_ledger::tests::event(agg)
    }
}

fn positions(waves: &[Vec<Event>]) -> Vec<Vec<i64>> {
    waves
        .iter()
        .map(|w| w.iter().map(|e| e.position.0).collect())
        .collect()
}

#[test]
fn waves_hold_the_kth_event_of_each_aggregate_in_batch_order() {
    let batch = vec![
        ev("a", 1),
        ev("b", 2),
        ev("a", 3),
        ev("c", 4),
        ev("a", 5),
        ev("b", 6),
    ];
    let waves = split_into_waves(batch.clone(), Ordering::PerAggregate);
    assert_eq!(positions(&waves), vec![vec![1, 2, 4], vec![3, 6], vec![5]]);
    assert_eq!(
        positions(&split_into_waves(batch.clone(), Ordering::None)),
        vec![vec![1, 2, 3, 4, 5, 6]]
    );
    assert_eq!(split_into_waves(batch, Ordering::Total).len(), 6);
}

/// Fails the events at the given positions (transiently) and records what it acknowledged.
struct FailAt(Vec<i64>, std::sync::Mutex<Vec<i64>>);

impl Sink for FailAt {
    fn name(&self) -> &'static str {
        "fail-at"
    }
    async fn publish(&self, batch: &[Event]) -> Result<Vec<Delivery>, SinkError> {
        Ok(batch
            .iter()
            .map(|e| {
                if self.0.contains(&e.position.0) {
                    Err(SinkError::transient("scripted"))
                } else {
                    self.1.lock().expect("lock").push(e.position.0);
                    Ok(())
                }
            })
            .collect())
    }
    async fn healthcheck(&self) -> Result<(), SinkError> {
        Ok(())
    }
}

async fn outcomes(
    ordering: Ordering,
    batch: Vec<Event>,
    fail: Vec<i64>,
) -> (Vec<i64>, Vec<(i64, &'static str)>) {
    let sink = Arc::new(FailAt(fail, std::sync::Mutex::new(Vec::new())));
    let relay = Relay::new(
        RelayConfig {
            ordering,
            ..RelayConfig::default()
        },
        sink.clone(),
    );
    let (settlements, _, _) = relay
        .publish_batch(batch, &relay.config.retry_policy(), &mut rand::rng(), None)
        .await;
    let mut out: Vec<(i64, &'static str)> = settlements
        .iter()
        .map(|s| {
            let kind = match s.outcome {
                Outcome::Delivered => "delivered",
                Outcome::Retry { .. } => "retry",
                Outcome::DeadLetter { .. } => "dead",
                Outcome::Released => "released",
            };
            (s.position.0, kind)
        })
        .collect();
    out.sort();
    let published = sink.1.lock().expect("lock").clone();
    (published, out)
}

#[tokio::test]
async fn a_failure_holds_back_only_its_aggregate_with_per_aggregate_order() {
    let batch = vec![ev("a", 1), ev("b", 2), ev("a", 3), ev("b", 4)];
    let (published, out) = outcomes(Ordering::PerAggregate, batch, vec![1]).await;
    assert_eq!(published, vec![2, 4]);
    assert_eq!(
        out,
        vec![
            (1, "retry"),
            (2, "delivered"),
            (3, "released"),
            (4, "delivered")
        ]
    );
}

#[tokio::test]
async fn a_failure_holds_back_everything_after_it_with_total_order() {
    let batch = vec![ev("a", 1), ev("b", 2), ev("c", 3), ev("d", 4)];
    let (published, out) = outcomes(Ordering::Total, batch, vec![2]).await;
    assert_eq!(published, vec![1]);
    assert_eq!(
        out,
        vec![
            (1, "delivered"),
            (2, "retry"),
            (3, "released"),
            (4, "released")
        ]
    );
}

#[tokio::test]
async fn without_ordering_a_failure_holds_back_nothing() {
    let batch = vec![ev("a", 1), ev("a", 2), ev("a", 3)];
    let (published, out) = outcomes(Ordering::None, batch, vec![1]).await;
    assert_eq!(published, vec![2, 3]);
    assert_eq!(out, vec![(1, "retry"), (2, "delivered"), (3, "delivered")]);
}

/// Acknowledges everything after `delay` (tokio time), recording what it published.
struct Slow(Duration, std::sync::Mutex<Vec<i64>>);

impl Sink for Slow {
    fn name(&self) -> &'static str {
        "slow"
    }
    async fn publish(&self, batch: &[Event]) -> Result<Vec<Delivery>, SinkError> {
        tokio::time::sleep(self.0).await;
        self.1
            .lock()
            .expect("lock")
            .extend(batch.iter().map(|e| e.position.0));
        Ok(vec![Ok(()); batch.len()])
    }
    async fn healthcheck(&self) -> Result<(), SinkError> {
        Ok(())
    }
}

fn slow_relay(delay: Duration) -> (Relay<Slow>, Arc<Slow>) {
    let sink = Arc::new(Slow(delay, std::sync::Mutex::new(Vec::new())));
    let relay = Relay::new(
        RelayConfig {
            publish_timeout: Duration::from_secs(10),
            ..RelayConfig::default()
        },
        sink.clone(),
    );
    (relay, sink)
}

#[tokio::test(start_paused = true)]
async fn a_relay_paused_past_its_claim_publishes_nothing_from_it() {
    let (relay, sink) = slow_relay(Duration::from_millis(1));
    // The claim ran out while the process was stopped.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    let (settlements, report, _) = relay
        .publish_batch(
            vec![ev("a", 1), ev("b", 2)],
            &relay.config.retry_policy(),
            &mut rand::rng(),
            Some(deadline),
        )
        .await;
    assert!(sink.1.lock().expect("lock").is_empty(), "nothing published");
    assert!(settlements.iter().all(|s| s.outcome == Outcome::Released));
    assert_eq!(report.fenced, 2);
}

#[tokio::test(start_paused = true)]
async fn a_claim_running_out_mid_batch_stops_before_the_wave_that_could_not_finish() {
    let (relay, sink) = slow_relay(Duration::from_secs(3));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(14);
    let batch = vec![ev("a", 1), ev("a", 2), ev("a", 3)];
    let (settlements, report, _) = relay
        .publish_batch(
            batch,
            &relay.config.retry_policy(),
            &mut rand::rng(),
            Some(deadline),
        )
        .await;
    // Waves at t=0 and t=3 fit (each may take publish_timeout = 10s); at t=6 it would not.
    assert_eq!(*sink.1.lock().expect("lock"), vec![1, 2]);
    assert_eq!(
        settlements.last().map(|s| &s.outcome),
        Some(&Outcome::Released)
    );
    assert_eq!(report.fenced, 1);
    assert_eq!(report.delivered, 2);
}

/// Sends the first event of a wave, then its process stops (the thread sleeps, so no timer
/// or socket of the runtime moves) for `.0`, then it sends the rest: a relay paused in the
/// middle of a wave, which a slow network makes the common case.
struct FreezesMidWave(Duration, std::sync::Mutex<Vec<i64>>);

impl Sink for FreezesMidWave {
    fn name(&self) -> &'static str {
        "freezes"
    }
    async fn publish(&self, batch: &[Event]) -> Result<Vec<Delivery>, SinkError> {
        let sent = |events: &[Event]| {
            self.1
                .lock()
                .expect("lock")
                .extend(events.iter().map(|e| e.position.0));
        };
        sent(&batch[..1]);
        std::thread::sleep(self.0);
        // Back from the stop: the runtime turns its timers before this future runs again.
        tokio::task::yield_now().await;
        sent(&batch[1..]);
        Ok(vec![Ok(()); batch.len()])
    }
    async fn healthcheck(&self) -> Result<(), SinkError> {
        Ok(())
    }
}

/// A relay (`publish_timeout` 100 ms) whose sink stops for 400 ms after a wave's first send.
fn freezing_relay() -> (Relay<FreezesMidWave>, Arc<FreezesMidWave>) {
    let sink = Arc::new(FreezesMidWave(
        Duration::from_millis(400),
        std::sync::Mutex::new(Vec::new()),
    ));
    let relay = Relay::new(
        RelayConfig {
            publish_timeout: Duration::from_millis(100),
            ..RelayConfig::default()
        },
        sink.clone(),
    );
    (relay, sink)
}

#[tokio::test]
async fn a_relay_stopped_mid_wave_past_its_claim_sends_nothing_more_of_it() {
    let (relay, sink) = freezing_relay();
    // The wave may start (it could finish within publish_timeout), then the stop outlasts
    // the claim.
    let deadline = tokio::time::Instant::now() + Duration::from_millis(200);
    let (settlements, report, sink_down) = relay
        .publish_batch(
            vec![ev("a", 1), ev("b", 2), ev("c", 3)],
            &relay.config.retry_policy(),
            &mut rand::rng(),
            Some(deadline),
        )
        .await;
    assert_eq!(
        *sink.1.lock().expect("lock"),
        vec![1],
        "only what was sent before the stop"
    );
    assert!(settlements.iter().all(|s| s.outcome == Outcome::Released));
    assert_eq!(report.fenced, 3);
    assert_eq!(report.delivered, 0);
    assert!(sink_down.is_none(), "the broker is not to blame");
}

/// A metrics recorder that keeps one counter, `outbox_events_fenced_total`.
struct FencedCounter(Arc<std::sync::atomic::AtomicU64>);

impl metrics::Recorder for FencedCounter {
    fn describe_counter(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn describe_gauge(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn describe_histogram(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn register_counter(&self, key: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Counter {
        if key.name() == crate::metrics::EVENTS_FENCED {
            metrics::Counter::from_arc(self.0.clone())
        } else {
            metrics::Counter::noop()
        }
    }
    fn register_gauge(&self, _: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Gauge {
        metrics::Gauge::noop()
    }
    fn register_histogram(
        &self,
        _: &metrics::Key,
        _: &metrics::Metadata<'_>,
    ) -> metrics::Histogram {
        metrics::Histogram::noop()
    }
}

#[test]
fn fenced_events_are_counted_in_the_metrics() {
    let fenced = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let recorder = FencedCounter(fenced.clone());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let (relay, _) = freezing_relay();
    let report = metrics::with_local_recorder(&recorder, || {
        runtime.block_on(async {
            let deadline = tokio::time::Instant::now() + Duration::from_millis(200);
            let batch = vec![ev("a", 1), ev("b", 2), ev("a", 3)];
            let policy = relay.config.retry_policy();
            relay
                .publish_batch(batch, &policy, &mut rand::rng(), Some(deadline))
                .await
                .1
        })
    });
    // The first wave cut mid-way (2 events) and the second never started (1).
    assert_eq!(report.fenced, 3);
    assert_eq!(fenced.load(std::sync::atomic::Ordering::SeqCst), 3);
}

#[test]
fn after_the_claim_expired_only_deliveries_are_recorded() {
    let at = |p: i64, outcome: Outcome| Settlement {
        position: Position(p),
        outcome,
    };
    let mut settlements = vec![
        at(1, Outcome::Delivered),
        at(
            2,
            Outcome::Retry {
                not_before: OffsetDateTime::UNIX_EPOCH,
                error: "x".into(),
            },
        ),
        at(3, Outcome::DeadLetter { reason: "y".into() }),
        at(4, Outcome::Released),
    ];
    assert_eq!(fence_settlements(&mut settlements), 2);
    let kinds: Vec<_> = settlements.iter().map(|s| s.outcome.clone()).collect();
    assert_eq!(
        kinds,
        vec![
            Outcome::Delivered,
            Outcome::Released,
            Outcome::Released,
            Outcome::Released
        ]
    );
}

/// Spans recorded as (position, attempt, outcome).
type Recorded = Arc<std::sync::Mutex<Vec<(i64, u32, &'static str)>>>;

/// Records every span's event, attempt and outcome; marks each published event.
struct Spans(Recorded);

struct Span(Recorded, i64, u32);

impl PublishTracer for Spans {
    fn start(&self, event: &mut Event, _sink: &'static str) -> Box<dyn AttemptSpan> {
        event
            .headers
            .push(("traceparent".into(), format!("span-{}", event.position.0)));
        Box::new(Span(self.0.clone(), event.position.0, event.attempts + 1))
    }
}

impl AttemptSpan for Span {
    fn end(self: Box<Self>, outcome: AttemptOutcome<'_>) {
        self.0
            .lock()
            .expect("lock")
            .push((self.1, self.2, outcome.as_str()));
    }
}

/// Fails the events at the given positions (transiently) and records the trace header of
/// everything it was given.
struct Headers(Vec<i64>, std::sync::Mutex<Vec<String>>);

impl Sink for Headers {
    fn name(&self) -> &'static str {
        "headers"
    }
    async fn publish(&self, batch: &[Event]) -> Result<Vec<Delivery>, SinkError> {
        let mut seen = self.1.lock().expect("lock");
        Ok(batch
            .iter()
            .map(|e| {
                seen.extend(crate::trace::header(&e.headers, "traceparent").map(str::to_owned));
                if self.0.contains(&e.position.0) {
                    Err(SinkError::transient("scripted"))
                } else {
                    Ok(())
                }
            })
            .collect())
    }
    async fn healthcheck(&self) -> Result<(), SinkError> {
        Ok(())
    }
}

#[tokio::test]
async fn a_tracer_gets_one_span_per_published_event_with_its_outcome() {
    let recorded = Arc::new(std::sync::Mutex::new(Vec::new()));
    let sink = Arc::new(Headers(vec![1], std::sync::Mutex::new(Vec::new())));
    let relay = Relay::new(RelayConfig::default(), sink.clone())
        .with_tracer(Arc::new(Spans(recorded.clone())));
    let mut retried = ev("a", 1);
    retried.attempts = 2;
    // Event 3 waits behind event 1 of its aggregate: never published, no span.
    let batch = vec![retried, ev("b", 2), ev("a", 3)];
    relay
        .publish_batch(batch, &relay.config.retry_policy(), &mut rand::rng(), None)
        .await;
    let mut spans = recorded.lock().expect("lock").clone();
    spans.sort();
    assert_eq!(spans, vec![(1, 3, "retry"), (2, 1, "delivered")]);
    let mut seen = sink.1.lock().expect("lock").clone();
    seen.sort();
    assert_eq!(seen, vec!["span-1", "span-2"]);
}

#[test]
fn a_batch_of_distinct_aggregates_is_one_wave() {
    let batch = vec![ev("a", 1), ev("b", 2), ev("c", 3)];
    assert_eq!(
        positions(&split_into_waves(batch, Ordering::PerAggregate)),
        vec![vec![1, 2, 3]]
    );
}

#[test]
fn relay_config_defaults_and_unknown_keys() {
    let c: RelayConfig = toml::from_str("batch_size = 100\nordering = \"none\"").expect("valid");
    assert_eq!(c.batch_size.get(), 100);
    assert_eq!(c.ordering, Ordering::None);
    assert_eq!(c.max_attempts.get(), 10);
    assert!(toml::from_str::<RelayConfig>("batch_sise = 1").is_err());
    assert!(toml::from_str::<RelayConfig>("batch_size = 0").is_err());
    let bad = RelayConfig {
        idle_interval: Duration::from_millis(1),
        ..RelayConfig::default()
    };
    assert!(
        bad.validate()
            .unwrap_err()
            .starts_with("relay.idle_interval")
    );
}
