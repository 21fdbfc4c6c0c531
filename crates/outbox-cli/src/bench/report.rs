//! The result of one `outbox bench` run: the JSON document (`--json`) and the table.

use std::fmt::Write as _;

use serde::Serialize;

/// Everything one run measured. Field names are the JSON keys (stable: scripts read them).
#[derive(Debug, Serialize)]
pub(crate) struct BenchReport {
    /// `backlog` or `steady`.
    pub(crate) mode: &'static str,
    /// `postgres-poll`, `postgres-cdc` or `sqlite`.
    pub(crate) source: String,
    /// The sink's name (`null`, `nats`, ...).
    pub(crate) sink: &'static str,
    /// The relay's batch size.
    pub(crate) batch_size: usize,
    /// Relay pipelines in this process.
    pub(crate) workers: usize,
    /// Events written for the run (prefilled, or produced during it).
    pub(crate) events: u64,
    /// Events the relay settled as delivered during the measurement.
    pub(crate) delivered: u64,
    /// Failed attempts scheduled for retry / events dead-lettered.
    pub(crate) retried: u64,
    /// Events dead-lettered.
    pub(crate) dead_lettered: u64,
    /// Events still pending after the relay stopped (0 when everything drained).
    pub(crate) pending_after: u64,
    /// Backlog: from starting the relay to the settle of the last event. Steady: from the
    /// first producer transaction to the settle of the last produced event.
    pub(crate) elapsed_seconds: f64,
    /// `delivered / elapsed_seconds`.
    pub(crate) events_per_second: f64,
    /// The producers (steady mode only).
    pub(crate) producer: Option<ProducerReport>,
    /// Commit → ack latency per event (steady mode only).
    pub(crate) latency_ms: Option<Latency>,
    /// CPU time of the relay in this process during the measurement (producers excluded).
    pub(crate) relay_cpu_seconds: f64,
    /// `relay_cpu_seconds` per delivered event, in microseconds.
    pub(crate) relay_cpu_us_per_event: f64,
    /// Peak resident set size of the process during the measurement, MiB.
    pub(crate) peak_rss_mib: Option<f64>,
    /// True when the run was stopped by a signal before it finished.
    pub(crate) interrupted: bool,
}

/// The producer side of a steady run.
#[derive(Debug, Serialize)]
pub(crate) struct ProducerReport {
    /// Concurrent producer connections.
    pub(crate) producers: usize,
    /// Events per producer transaction.
    pub(crate) events_per_transaction: usize,
    /// Requested events per second (all producers together).
    pub(crate) target_rate: f64,
    /// Events committed per second over the run's duration.
    pub(crate) achieved_rate: f64,
    /// How long the producers ran, seconds.
    pub(crate) duration_seconds: f64,
    /// CPU time of the producer thread, seconds (not counted as relay CPU).
    pub(crate) cpu_seconds: f64,
}

/// Latency percentiles in milliseconds (nearest rank).
#[derive(Debug, Serialize, PartialEq)]
pub(crate) struct Latency {
    /// Events measured.
    pub(crate) count: usize,
    /// Median.
    pub(crate) p50: f64,
    /// 90th percentile.
    pub(crate) p90: f64,
    /// 99th percentile.
    pub(crate) p99: f64,
    /// Slowest event.
    pub(crate) max: f64,
    /// Mean.
    pub(crate) mean: f64,
    /// The distribution: element `i` is the `i`-th percentile (0 = fastest, 100 = slowest),
    /// for latency CDF charts.
    pub(crate) percentiles: Vec<f64>,
}

impl Latency {
    /// Percentiles of `micros`; `None` when empty.
    pub(crate) fn from_micros(mut micros: Vec<u64>) -> Option<Self> {
        if micros.is_empty() {
            return None;
        }
        micros.sort_unstable();
        let n = micros.len();
        let rank = |q: f64| {
            let i = ((q * n as f64).ceil() as usize).clamp(1, n) - 1;
            micros[i] as f64 / 1000.0
        };
        let sum: u128 = micros.iter().map(|&m| u128::from(m)).sum();
        Some(Self {
            count: n,
            p50: rank(0.50),
            p90: rank(0.90),
            p99: rank(0.99),
            max: micros[n - 1] as f64 / 1000.0,
            mean: sum as f64 / n as f64 / 1000.0,
            percentiles: (0..=100)
                .map(|i| {
                    if i == 0 {
                        micros[0] as f64 / 1000.0
                    } else {
                        rank(f64::from(i) / 100.0)
                    }
                })
                .collect(),
        })
    }
}

impl BenchReport {
    /// The human-readable table.
    pub(crate) fn table(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "outbox bench {}: {} -> {}, batch {}, {} worker(s){}",
            self.mode,
            self.source,
            self.sink,
            self.batch_size,
            self.workers,
            if self.interrupted {
                " (INTERRUPTED)"
            } else {
                ""
            }
        );
        let row = |s: &mut String, k: &str, v: String| {
            let _ = writeln!(s, "  {k:<18} {v}");
        };
        row(&mut s, "events", self.events.to_string());
        row(
            &mut s,
            "delivered",
            format!(
                "{} (retried {}, dead-lettered {}, pending after {})",
                self.delivered, self.retried, self.dead_lettered, self.pending_after
            ),
        );
        if let Some(p) = &self.producer {
            row(
                &mut s,
                "producers",
                format!(
                    "{} x {} event(s)/transaction at {:.0}/s requested, {:.0}/s achieved over {:.1} s",
                    p.producers,
                    p.events_per_transaction,
                    p.target_rate,
                    p.achieved_rate,
                    p.duration_seconds
                ),
            );
        }
        row(&mut s, "elapsed", format!("{:.3} s", self.elapsed_seconds));
        row(
            &mut s,
            "throughput",
            format!("{:.0} events/s", self.events_per_second),
        );
        match &self.latency_ms {
            Some(l) => row(
                &mut s,
                "commit->ack",
                format!(
                    "p50 {:.2} ms  p90 {:.2} ms  p99 {:.2} ms  max {:.2} ms  ({} events)",
                    l.p50, l.p90, l.p99, l.max, l.count
                ),
            ),
            None => row(&mut s, "commit->ack", "- (steady mode only)".into()),
        }
        row(
            &mut s,
            "relay CPU",
            format!(
                "{:.2} s ({:.2} us/event)",
                self.relay_cpu_seconds, self.relay_cpu_us_per_event
            ),
        );
        row(
            &mut s,
            "peak RSS",
            self.peak_rss_mib
                .map_or_else(|| "unknown".into(), |m| format!("{m:.1} MiB")),
        );
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_use_the_nearest_rank() {
        let l = Latency::from_micros((1..=100).map(|i| i * 1000).collect()).unwrap();
        assert_eq!((l.p50, l.p90, l.p99, l.max), (50.0, 90.0, 99.0, 100.0));
        assert_eq!(l.count, 100);
        assert!((l.mean - 50.5).abs() < 1e-9);
        assert_eq!(l.percentiles.len(), 101);
        assert_eq!((l.percentiles[0], l.percentiles[100]), (1.0, 100.0));
        let one = Latency::from_micros(vec![2500]).unwrap();
        assert_eq!((one.p50, one.p99, one.max), (2.5, 2.5, 2.5));
        assert!(Latency::from_micros(Vec::new()).is_none());
    }
}
