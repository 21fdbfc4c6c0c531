//! One batch through the sink: waves in order, every event's outcome decided (delivered,
//! retry, dead letter, released), nothing published past the claim.

use std::collections::HashSet;

use time::OffsetDateTime;

use super::{Ordering, Relay, split_into_waves};
use crate::metrics as m;
use crate::policy::{FailureAction, RetryPolicy};
use crate::sink::Delivery;
use crate::source::{Outcome, Settlement};
use crate::trace::{AttemptOutcome, AttemptSpan};
use crate::{Event, RelayReport, Sink, SinkError, SinkErrorKind};

/// The spans of one wave, one per event in wave order (`None` without a tracer).
type Spans = Option<std::vec::IntoIter<Box<dyn AttemptSpan>>>;

/// What publishing one batch has decided so far.
pub(super) struct BatchOutcome {
    pub(super) settlements: Vec<Settlement>,
    pub(super) report: RelayReport,
    /// The error that made the broker count as unavailable: nothing more is published.
    pub(super) sink_down: Option<SinkError>,
    /// Aggregates with an event not delivered in this batch: their later events are released.
    failed: HashSet<(String, String)>,
    /// The claim expires before a publish could finish: nothing more is published.
    expired: bool,
}

impl BatchOutcome {
    fn new(events: usize) -> Self {
        Self {
            settlements: Vec::with_capacity(events),
            report: RelayReport::default(),
            sink_down: None,
            failed: HashSet::new(),
            expired: false,
        }
    }

    fn release(&mut self, held: &[Event]) {
        self.settlements.extend(held.iter().map(|e| Settlement {
            position: e.position,
            outcome: Outcome::Released,
        }));
    }
}

impl<K: Sink> Relay<K> {
    /// Publishes one batch wave by wave and decides every event's outcome. Returns the
    /// settlements, the totals, and the error that made the broker count as unavailable.
    ///
    /// No wave is published unless it can finish (`relay.publish_timeout`) before the claim's
    /// `valid_until`: a relay that was paused past its claim publishes nothing stale.
    pub(super) async fn publish_batch(
        &self,
        events: Vec<Event>,
        policy: &RetryPolicy,
        rng: &mut impl rand::Rng,
        valid_until: Option<tokio::time::Instant>,
    ) -> (Vec<Settlement>, RelayReport, Option<SinkError>) {
        let mut batch = BatchOutcome::new(events.len());
        for wave in split_into_waves(events, self.config.ordering) {
            if !batch.expired && self.claim_expires_first(valid_until) {
                batch.expired = true;
            }
            if batch.expired {
                batch.report.fenced += wave.len() as u64;
            }
            let mut wave = self.hold_back(wave, &mut batch);
            if wave.is_empty() {
                continue;
            }
            let spans = self.start_spans(&mut wave);
            match self.publish_wave(&wave, valid_until).await {
                Some(deliveries) => {
                    self.settle_wave(&wave, deliveries, spans, policy, rng, &mut batch);
                }
                None => {
                    batch.expired = true;
                    batch.report.fenced += wave.len() as u64;
                    self.fence_wave(&wave, spans, &mut batch);
                }
            }
        }
        self.count_fenced(batch.report.fenced);
        (batch.settlements, batch.report, batch.sink_down)
    }

    /// Counts `n` events fenced (left to the replica that owns them now) in the metrics.
    pub(super) fn count_fenced(&self, n: u64) {
        if n > 0 {
            metrics::counter!(m::EVENTS_FENCED, self.labels(&[("sink", self.sink.name())]))
                .increment(n);
        }
    }

    /// Whether the claim ends before a publish started now could finish. Checked on the
    /// monotonic clock right before each wave: a process that was stopped (SIGSTOP, a frozen
    /// VM) sees the time that passed.
    fn claim_expires_first(&self, valid_until: Option<tokio::time::Instant>) -> bool {
        let Some(deadline) = valid_until else {
            return false;
        };
        if tokio::time::Instant::now() + self.config.publish_timeout <= deadline {
            return false;
        }
        tracing::warn!(
            sink = self.sink.name(),
            "the claim on this batch expires before a publish could finish (was the relay paused?); not publishing the rest: another replica delivers it"
        );
        true
    }

    /// The part of `wave` that may be published; the rest is released. Nothing goes once the
    /// broker is down or the claim expired; with total order, nothing after the first event
    /// not delivered; per aggregate, nothing of an aggregate that failed earlier in the batch.
    fn hold_back(&self, wave: Vec<Event>, batch: &mut BatchOutcome) -> Vec<Event> {
        let ordering = self.config.ordering;
        let total_halt = ordering == Ordering::Total && !batch.failed.is_empty();
        if batch.sink_down.is_some() || total_halt || batch.expired {
            batch.release(&wave);
            return Vec::new();
        }
        if ordering == Ordering::None || batch.failed.is_empty() {
            return wave;
        }
        let (go, held): (Vec<Event>, Vec<Event>) = wave.into_iter().partition(|e| {
            !batch
                .failed
                .contains(&(e.aggregate_type.clone(), e.aggregate_id.clone()))
        });
        batch.release(&held);
        go
    }

    /// One span per event, started right before the publish call; the tracer may put its own
    /// span's context in the message's trace headers (the row keeps its own).
    fn start_spans(&self, wave: &mut [Event]) -> Spans {
        let sink_name = self.sink.name();
        self.tracer.as_ref().map(|tracer| {
            wave.iter_mut()
                .map(|event| tracer.start(event, sink_name))
                .collect::<Vec<_>>()
                .into_iter()
        })
    }

    /// Publishes one wave and awaits its acknowledgements, one result per event: a sink error,
    /// a wrong number of results or no answer within `relay.publish_timeout` fails them all.
    /// `None`: the claim (`valid_until`) ended while the wave was under way, and the sink was
    /// not let on with it (see [`within_claim`]).
    async fn publish_wave(
        &self,
        wave: &[Event],
        valid_until: Option<tokio::time::Instant>,
    ) -> Option<Vec<Delivery>> {
        let timeout = self.config.publish_timeout;
        let publish = tokio::time::timeout(timeout, self.sink.publish(wave));
        let published = match valid_until {
            Some(deadline) => within_claim(publish, deadline).await?,
            None => publish.await,
        };
        Some(match published {
            Ok(Ok(d)) if d.len() == wave.len() => d,
            Ok(Ok(d)) => {
                let e = SinkError::transient(format!(
                    "sink `{}` returned {} results for {} events",
                    self.sink.name(),
                    d.len(),
                    wave.len()
                ));
                vec![Err(e); wave.len()]
            }
            Ok(Err(e)) => vec![Err(e); wave.len()],
            Err(_) => {
                let e = SinkError::unavailable(format!(
                    "no acknowledgement within {timeout:?} (relay.publish_timeout)"
                ));
                vec![Err(e); wave.len()]
            }
        })
    }

    /// A wave cut short because the claim ended under it: every event goes back (some may
    /// have reached the broker; the replica that owns them now publishes them again, from the
    /// oldest, in order), and nothing more of the batch is published.
    fn fence_wave(&self, wave: &[Event], mut spans: Spans, batch: &mut BatchOutcome) {
        tracing::warn!(
            sink = self.sink.name(),
            events = wave.len(),
            "the claim on this batch ended while a wave was being published (was the relay paused?); sending nothing more of it: another replica delivers it"
        );
        let err = SinkError::unavailable("the claim ended while the wave was being published");
        for _ in wave {
            let mut span = spans.as_mut().and_then(Iterator::next);
            end_span(&mut span, AttemptOutcome::Released { error: &err });
        }
        batch.release(wave);
    }

    /// Records each event's outcome, its metrics and its span's end.
    fn settle_wave(
        &self,
        wave: &[Event],
        deliveries: Vec<Delivery>,
        mut spans: Spans,
        policy: &RetryPolicy,
        rng: &mut impl rand::Rng,
        batch: &mut BatchOutcome,
    ) {
        let acked_at = OffsetDateTime::now_utc();
        let latency_histogram = metrics::histogram!(m::COMMIT_TO_ACK_SECONDS, self.labels(&[]));
        let ordered = self.config.ordering != Ordering::None;
        let mut published = 0u64;
        for (event, delivery) in wave.iter().zip(deliveries) {
            let mut span = spans.as_mut().and_then(Iterator::next);
            let outcome = match delivery {
                Ok(()) => {
                    published += 1;
                    let latency = (acked_at - event.created_at).as_seconds_f64().max(0.0);
                    latency_histogram.record(latency);
                    end_span(&mut span, AttemptOutcome::Delivered);
                    Outcome::Delivered
                }
                Err(err) => self.failed(event, err, &mut span, policy, rng, acked_at, batch),
            };
            if ordered && outcome != Outcome::Delivered {
                batch
                    .failed
                    .insert((event.aggregate_type.clone(), event.aggregate_id.clone()));
            }
            batch.settlements.push(Settlement {
                position: event.position,
                outcome,
            });
        }
        batch.report.delivered += published;
        metrics::counter!(
            m::EVENTS_PUBLISHED,
            self.labels(&[("sink", self.sink.name())])
        )
        .increment(published);
    }

    /// The outcome of a failed publish, as the retry policy decides it.
    #[allow(clippy::too_many_arguments)]
    fn failed(
        &self,
        event: &Event,
        err: SinkError,
        span: &mut Option<Box<dyn AttemptSpan>>,
        policy: &RetryPolicy,
        rng: &mut impl rand::Rng,
        acked_at: OffsetDateTime,
        batch: &mut BatchOutcome,
    ) -> Outcome {
        match policy.on_failure(err.kind(), event.attempts, rng) {
            FailureAction::Release => {
                end_span(span, AttemptOutcome::Released { error: &err });
                batch.sink_down.get_or_insert(err);
                Outcome::Released
            }
            FailureAction::RetryAfter(delay) => {
                batch.report.retried += 1;
                let kind = match err.kind() {
                    SinkErrorKind::Unavailable => "unavailable",
                    SinkErrorKind::Transient => "transient",
                    SinkErrorKind::Rejected => "rejected",
                };
                let labels = self.labels(&[("sink", self.sink.name()), ("kind", kind)]);
                metrics::counter!(m::EVENTS_FAILED, labels).increment(1);
                tracing::debug!(event_id = %event.id, error = %err.report(), retry_in = ?delay, "publish failed; will retry");
                end_span(span, AttemptOutcome::Retry { error: &err });
                Outcome::Retry {
                    not_before: acked_at + delay,
                    error: err.report(),
                }
            }
            FailureAction::DeadLetter => {
                batch.report.dead_lettered += 1;
                self.dead_letter(event, &err, span)
            }
        }
    }

    /// Dead-letters `event`: the reason, the metric, the log line and the span's end.
    fn dead_letter(
        &self,
        event: &Event,
        err: &SinkError,
        span: &mut Option<Box<dyn AttemptSpan>>,
    ) -> Outcome {
        metrics::counter!(
            m::EVENTS_DEAD_LETTERED,
            self.labels(&[("sink", self.sink.name())])
        )
        .increment(1);
        let reason = if err.kind() == SinkErrorKind::Transient {
            format!(
                "gave up after {} failed attempts: {}",
                event.attempts + 1,
                err.report()
            )
        } else {
            err.report()
        };
        tracing::warn!(
            event_id = %event.id,
            aggregate_type = %event.aggregate_type,
            event_type = %event.event_type,
            reason = %reason,
            "event dead-lettered"
        );
        end_span(
            span,
            AttemptOutcome::DeadLetter {
                error: err,
                reason: &reason,
            },
        );
        Outcome::DeadLetter { reason }
    }
}

/// Runs `publish` while the claim lasts: the clock is read before every poll, and once
/// `deadline` passed the sink's future is dropped without being polled again, so a relay
/// stopped in the middle of a wave (SIGSTOP, a frozen VM, a starved CPU) and resumed after its
/// claim ran out sends nothing more of it; `None` then. Without this, the publish timeout would
/// not help: `tokio::time::timeout` polls the future before its own timer, and a resumed sink
/// would first send the requests it had not sent yet. What is left is a send already handed to
/// the operating system (or to a client library's own thread) before the stop.
///
/// No timer of its own: `publish` carries `relay.publish_timeout`, and a wave starts only if
/// that ends before the claim does (`claim_expires_first`), so the timeout always wakes it
/// first.
async fn within_claim<F: std::future::Future>(
    publish: F,
    deadline: tokio::time::Instant,
) -> Option<F::Output> {
    let mut publish = std::pin::pin!(publish);
    std::future::poll_fn(|cx| {
        if tokio::time::Instant::now() >= deadline {
            return std::task::Poll::Ready(None);
        }
        publish.as_mut().poll(cx).map(Some)
    })
    .await
}

/// Ends an attempt's span, if there is one, with its outcome.
fn end_span(span: &mut Option<Box<dyn AttemptSpan>>, outcome: AttemptOutcome<'_>) {
    if let Some(span) = span.take() {
        span.end(outcome);
    }
}
