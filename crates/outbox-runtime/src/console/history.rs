//! The console's charts: one sample per `metrics.refresh_interval` for the last hour, kept in
//! memory (a ring of at most [`MAX_SAMPLES`]).
//!
//! Backlog and oldest pending age come from the watchdog's backlog read. Throughput and the
//! commit→ack p99 come from the same Prometheus registry `/metrics` serves: the published
//! counter and the `outbox_commit_to_ack_seconds` histogram buckets, read from the rendered
//! text. The p99 of an interval is estimated from the bucket counts that grew during it, as
//! Prometheus' `histogram_quantile(0.99, rate(..._bucket[interval]))` does (linear within a
//! bucket), so the console and a Prometheus dashboard agree.

use std::collections::VecDeque;
use std::time::Duration;

use outbox_core::metrics as m;
use outbox_core::source::Backlog;

/// At most this many samples: an hour at one per second. With `refresh_interval` under a
/// second the charts cover the last 3,600 refreshes instead of an hour.
pub(crate) const MAX_SAMPLES: usize = 3_600;
/// How far back the charts go.
pub(crate) const WINDOW: Duration = Duration::from_secs(3_600);

/// What the relay's Prometheus registry said at one moment.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Counters {
    /// `outbox_events_published_total`, summed over its `sink` labels.
    pub(crate) published: u64,
    /// `outbox_commit_to_ack_seconds` buckets: (upper bound, cumulative count), ascending,
    /// `+Inf` last.
    pub(crate) ack_buckets: Vec<(f64, u64)>,
    /// `outbox_sink_up`: the relay's own view of the broker (0 while it pauses on an
    /// unreachable broker); `None` before the first batch.
    pub(crate) sink_up: Option<bool>,
}

impl Counters {
    /// Reads the counters from Prometheus text (what `/metrics` serves).
    pub(crate) fn parse(text: &str) -> Self {
        let mut out = Self::default();
        let bucket = format!("{}_bucket", m::COMMIT_TO_ACK_SECONDS);
        for line in text.lines() {
            if line.starts_with('#') || line.trim().is_empty() {
                continue;
            }
            let Some((series, value)) = line.rsplit_once(' ') else {
                continue;
            };
            let (name, labels) = match series.split_once('{') {
                Some((name, labels)) => (name, labels.trim_end_matches('}')),
                None => (series, ""),
            };
            let Ok(value) = value.trim().parse::<f64>() else {
                continue;
            };
            if name == m::EVENTS_PUBLISHED {
                out.published += value as u64;
            } else if name == bucket {
                let le = labels
                    .split(',')
                    .find_map(|l| l.trim().strip_prefix("le=\""))
                    .map(|v| v.trim_end_matches('"'));
                let bound = match le {
                    Some("+Inf") => f64::INFINITY,
                    Some(v) => match v.parse::<f64>() {
                        Ok(b) => b,
                        Err(_) => continue,
                    },
                    None => continue,
                };
                out.ack_buckets.push((bound, value as u64));
            } else if name == m::SINK_UP {
                out.sink_up = Some(value != 0.0);
            }
        }
        out.ack_buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
        out
    }
}

/// The `q` quantile of the acknowledgements counted between two readings of the cumulative
/// buckets (`before` may be empty: since start). `None` when nothing was acknowledged.
pub(crate) fn quantile(q: f64, before: &[(f64, u64)], after: &[(f64, u64)]) -> Option<f64> {
    let count_before = |bound: f64| {
        before
            .iter()
            .find(|(b, _)| *b == bound)
            .map_or(0, |(_, c)| *c)
    };
    let deltas: Vec<(f64, u64)> = after
        .iter()
        .map(|(b, c)| (*b, c.saturating_sub(count_before(*b))))
        .collect();
    let total = deltas.last().map(|(_, c)| *c)?;
    if total == 0 {
        return None;
    }
    let rank = q * total as f64;
    let mut lower_bound = 0.0;
    let mut lower_count = 0u64;
    for (bound, count) in &deltas {
        if *count as f64 >= rank {
            if bound.is_infinite() {
                // Above the highest finite bucket: Prometheus answers with that bound.
                return Some(lower_bound);
            }
            let in_bucket = (count - lower_count) as f64;
            if in_bucket == 0.0 {
                return Some(*bound);
            }
            return Some(
                lower_bound + (bound - lower_bound) * (rank - lower_count as f64) / in_bucket,
            );
        }
        lower_bound = *bound;
        lower_count = *count;
    }
    Some(lower_bound)
}

/// One point of the charts.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub(crate) struct Sample {
    /// Unix time, milliseconds.
    pub(crate) t: i64,
    /// Pending events (retrying included).
    pub(crate) pending: u64,
    /// Pending events waiting on backoff.
    pub(crate) retrying: u64,
    /// Dead letters.
    pub(crate) dead: u64,
    /// Age of the oldest ready pending event, seconds.
    pub(crate) oldest_age: f64,
    /// Events this relay published since it started.
    pub(crate) published: u64,
    /// Events per second published since the previous sample.
    pub(crate) rate: Option<f64>,
    /// p99 commit→ack latency (seconds) of the events acknowledged since the previous sample.
    pub(crate) p99: Option<f64>,
    /// The cumulative buckets at this moment, for the window's p99.
    #[serde(skip)]
    buckets: Vec<(f64, u64)>,
}

/// The ring of samples.
#[derive(Debug, Default)]
pub(crate) struct History {
    samples: VecDeque<Sample>,
}

impl History {
    /// Adds the reading taken at `t` (Unix ms); drops samples older than the window.
    pub(crate) fn push(&mut self, t: i64, backlog: &Backlog, counters: Counters) {
        let previous = self.samples.back();
        let (rate, p99) = match previous {
            Some(p) if t > p.t => (
                Some(
                    counters.published.saturating_sub(p.published) as f64 * 1000.0
                        / (t - p.t) as f64,
                ),
                quantile(0.99, &p.buckets, &counters.ack_buckets),
            ),
            _ => (None, None),
        };
        self.samples.push_back(Sample {
            t,
            pending: backlog.pending,
            retrying: backlog.retrying,
            dead: backlog.dead,
            oldest_age: backlog.oldest_pending_age_seconds,
            published: counters.published,
            rate,
            p99,
            buckets: counters.ack_buckets,
        });
        let oldest_kept = t - WINDOW.as_millis() as i64;
        while self.samples.len() > MAX_SAMPLES
            || self.samples.front().is_some_and(|s| s.t < oldest_kept)
        {
            self.samples.pop_front();
        }
    }

    /// Samples taken after `after` (Unix ms), oldest first.
    pub(crate) fn since(&self, after: i64) -> Vec<Sample> {
        self.samples
            .iter()
            .filter(|s| s.t > after)
            .cloned()
            .collect()
    }

    /// The latest sample.
    pub(crate) fn latest(&self) -> Option<&Sample> {
        self.samples.back()
    }

    /// p99 commit→ack latency over the whole window (first to last sample).
    pub(crate) fn window_p99(&self) -> Option<f64> {
        let first = self.samples.front()?;
        let last = self.samples.back()?;
        quantile(0.99, &first.buckets, &last.buckets)
    }

    /// Seconds from the first sample to the last.
    pub(crate) fn span_seconds(&self) -> f64 {
        match (self.samples.front(), self.samples.back()) {
            (Some(a), Some(b)) => (b.t - a.t) as f64 / 1000.0,
            _ => 0.0,
        }
    }

    /// Events per second over the whole window.
    pub(crate) fn window_rate(&self) -> Option<f64> {
        let first = self.samples.front()?;
        let last = self.samples.back()?;
        (last.t > first.t).then(|| {
            last.published.saturating_sub(first.published) as f64 * 1000.0
                / (last.t - first.t) as f64
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = r#"# TYPE outbox_events_published_total counter
outbox_events_published_total{sink="http"} 7
outbox_events_published_total{sink="other"} 3
# TYPE outbox_sink_up gauge
outbox_sink_up 1
# TYPE outbox_commit_to_ack_seconds histogram
outbox_commit_to_ack_seconds_bucket{le="0.01"} 50
outbox_commit_to_ack_seconds_bucket{le="0.1"} 98
outbox_commit_to_ack_seconds_bucket{le="1"} 100
outbox_commit_to_ack_seconds_bucket{le="+Inf"} 100
outbox_commit_to_ack_seconds_sum 3.2
outbox_commit_to_ack_seconds_count 100
"#;

    #[test]
    fn counters_are_read_from_the_prometheus_text() {
        let c = Counters::parse(TEXT);
        assert_eq!(c.published, 10);
        assert_eq!(c.sink_up, Some(true));
        assert_eq!(
            c.ack_buckets,
            vec![(0.01, 50), (0.1, 98), (1.0, 100), (f64::INFINITY, 100)]
        );
        assert_eq!(Counters::parse(""), Counters::default());
    }

    #[test]
    fn p99_interpolates_within_the_bucket_like_prometheus() {
        let c = Counters::parse(TEXT);
        // rank 99 of 100 falls in (0.1, 1]: 1 of its 2 events -> halfway.
        let p = quantile(0.99, &[], &c.ack_buckets).expect("some");
        assert!((p - 0.55).abs() < 1e-9, "{p}");
        // Only what grew between two readings counts.
        let before = vec![(0.01, 50), (0.1, 98), (1.0, 98), (f64::INFINITY, 98)];
        let p = quantile(0.99, &before, &c.ack_buckets).expect("some");
        assert!(p > 0.1 && p <= 1.0, "{p}");
        assert_eq!(quantile(0.99, &c.ack_buckets, &c.ack_buckets), None);
        // Beyond the last finite bucket: that bound.
        let slow = vec![(0.01, 0), (1.0, 0), (f64::INFINITY, 5)];
        assert_eq!(quantile(0.99, &[], &slow), Some(1.0));
    }

    #[test]
    fn samples_carry_the_rate_and_p99_of_their_interval_and_expire_after_the_window() {
        let mut h = History::default();
        let backlog = Backlog {
            pending: 4,
            ..Backlog::default()
        };
        h.push(1_000, &backlog, Counters::default());
        let mut c = Counters::parse(TEXT);
        h.push(3_000, &backlog, c.clone());
        let last = h.latest().expect("sample");
        assert_eq!(last.rate, Some(5.0));
        assert!(last.p99.is_some());
        assert_eq!(h.since(1_000).len(), 1);
        c.published += 20;
        h.push(3_000 + WINDOW.as_millis() as i64, &backlog, c);
        assert_eq!(h.since(0).len(), 2, "the first sample left the window");
        assert!(h.window_rate().is_some());
    }
}
