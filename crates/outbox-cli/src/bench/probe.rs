//! What `outbox bench` puts around the relay to measure it without changing it: a sink that
//! acknowledges everything at once ([`NullSink`]), a sink wrapper that timestamps acks
//! ([`TimedSink`]), a source wrapper that counts settled deliveries ([`CountedSource`]), and
//! the process's CPU time and peak RSS from `/proc`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use outbox_core::sink::Delivery;
use outbox_core::source::{Fetched, Outcome, Settlement};
use outbox_core::{Event, Sink, SinkError, Source, SourceError};
use time::OffsetDateTime;
use tokio_util::sync::CancellationToken;

/// A real sink that acknowledges every event at once and sends nothing anywhere: the relay's
/// own cost, with the broker taken out.
#[derive(Debug, Default)]
pub(crate) struct NullSink;

impl Sink for NullSink {
    fn name(&self) -> &'static str {
        "null"
    }

    async fn publish<'a>(&'a self, batch: &'a [Event]) -> Result<Vec<Delivery>, SinkError> {
        Ok(vec![Ok(()); batch.len()])
    }

    async fn healthcheck(&self) -> Result<(), SinkError> {
        Ok(())
    }
}

/// Wraps a sink and records, for every acknowledged event, the time from its `created_at`
/// (the database clock at insert, just before the producer's commit) to the moment the sink
/// returned its acknowledgement: commit → ack latency, per event.
pub(crate) struct TimedSink<K> {
    inner: K,
    record: bool,
    /// Latencies in microseconds, in ack order.
    latencies: Mutex<Vec<u64>>,
}

impl<K: Sink> TimedSink<K> {
    /// Wraps `inner`; latencies are kept only when `record` is true (a backlog drain's
    /// "latency" is only the time the events waited in the backlog).
    pub(crate) fn new(inner: K, record: bool) -> Self {
        Self {
            inner,
            record,
            latencies: Mutex::new(Vec::new()),
        }
    }

    /// The recorded latencies in microseconds (unsorted).
    pub(crate) fn take_latencies(&self) -> Vec<u64> {
        std::mem::take(&mut *self.latencies.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

impl<K: Sink> Sink for TimedSink<K> {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    async fn publish<'a>(&'a self, batch: &'a [Event]) -> Result<Vec<Delivery>, SinkError> {
        let deliveries = self.inner.publish(batch).await?;
        if self.record {
            let acked_at = OffsetDateTime::now_utc();
            let mut out = self.latencies.lock().unwrap_or_else(|p| p.into_inner());
            for (event, delivery) in batch.iter().zip(&deliveries) {
                if delivery.is_ok() {
                    let micros = (acked_at - event.created_at).whole_microseconds();
                    out.push(u64::try_from(micros).unwrap_or(0));
                }
            }
        }
        Ok(deliveries)
    }

    async fn healthcheck(&self) -> Result<(), SinkError> {
        self.inner.healthcheck().await
    }
}

/// Shared by every [`CountedSource`] of one run: how many events were settled as delivered,
/// and the instant the count reached the target.
#[derive(Debug)]
pub(crate) struct Progress {
    settled: AtomicU64,
    target: AtomicU64,
    reached_at: OnceLock<Instant>,
    reached: CancellationToken,
}

impl Progress {
    /// A counter with no target yet.
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Self {
            settled: AtomicU64::new(0),
            target: AtomicU64::new(u64::MAX),
            reached_at: OnceLock::new(),
            reached: CancellationToken::new(),
        })
    }

    /// Events settled as delivered so far.
    pub(crate) fn settled(&self) -> u64 {
        self.settled.load(Ordering::SeqCst)
    }

    /// Sets the number of deliveries to wait for (checked at once as well).
    pub(crate) fn set_target(&self, target: u64) {
        self.target.store(target, Ordering::SeqCst);
        self.check();
    }

    /// Cancelled once the target is reached.
    pub(crate) fn reached(&self) -> &CancellationToken {
        &self.reached
    }

    /// When the target was reached (the end of the settle that reached it).
    pub(crate) fn reached_at(&self) -> Option<Instant> {
        self.reached_at.get().copied()
    }

    fn add(&self, n: u64) {
        self.settled.fetch_add(n, Ordering::SeqCst);
        self.check();
    }

    fn check(&self) {
        if self.settled.load(Ordering::SeqCst) >= self.target.load(Ordering::SeqCst) {
            let _ = self.reached_at.set(Instant::now());
            self.reached.cancel();
        }
    }
}

/// Wraps a source and counts the events it settled as delivered (after the settle committed),
/// so a drain ends when the database says so, not when the broker acked.
pub(crate) struct CountedSource<S> {
    inner: S,
    progress: Arc<Progress>,
}

impl<S: Source> CountedSource<S> {
    /// Wraps `inner`, counting into `progress`.
    pub(crate) fn new(inner: S, progress: Arc<Progress>) -> Self {
        Self { inner, progress }
    }
}

impl<S: Source> Source for CountedSource<S> {
    async fn fetch(&mut self, limit: usize, now: OffsetDateTime) -> Result<Fetched, SourceError> {
        self.inner.fetch(limit, now).await
    }

    async fn settle(
        &mut self,
        settlements: &[Settlement],
        now: OffsetDateTime,
    ) -> Result<(), SourceError> {
        self.inner.settle(settlements, now).await?;
        let delivered = settlements
            .iter()
            .filter(|s| s.outcome == Outcome::Delivered)
            .count();
        self.progress.add(delivered as u64);
        Ok(())
    }

    async fn wait_for_events(&mut self, max: Duration) {
        self.inner.wait_for_events(max).await;
    }
}

/// Linux reports process CPU times in `USER_HZ` ticks, which is 100 on every architecture
/// the kernel exports to user space (`sysconf(_SC_CLK_TCK)`).
const TICKS_PER_SECOND: f64 = 100.0;

/// User + system CPU time of a `/proc/.../stat` file, in seconds.
fn cpu_of(stat_path: &str) -> Option<Duration> {
    let stat = std::fs::read_to_string(stat_path).ok()?;
    // Fields after the command name (which may contain spaces) start at field 3 (state);
    // utime and stime are fields 14 and 15.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(Duration::from_secs_f64(
        (utime + stime) as f64 / TICKS_PER_SECOND,
    ))
}

/// CPU time used by this process so far (every thread), or zero where `/proc` is missing.
pub(crate) fn process_cpu() -> Duration {
    cpu_of("/proc/self/stat").unwrap_or_default()
}

/// CPU time used by the calling thread so far.
pub(crate) fn thread_cpu() -> Duration {
    cpu_of("/proc/thread-self/stat").unwrap_or_default()
}

/// Resets the kernel's peak-RSS mark to the current RSS (`/proc/self/clear_refs` = 5), so the
/// peak read later covers only what follows. Returns false where that is not possible.
pub(crate) fn reset_peak_rss() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// Peak resident set size in bytes (`VmHWM`), if `/proc` reports it.
pub(crate) fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line
        .trim_start_matches("VmHWM:")
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_reaches_its_target_whichever_comes_first() {
        let p = Progress::new();
        p.add(5);
        assert!(!p.reached().is_cancelled());
        p.set_target(5);
        assert!(p.reached().is_cancelled() && p.reached_at().is_some());
        let q = Progress::new();
        q.set_target(3);
        q.add(2);
        assert!(!q.reached().is_cancelled());
        q.add(1);
        assert!(q.reached().is_cancelled());
    }

    #[test]
    fn proc_figures_are_read_on_linux() {
        // Burn CPU until the tick counter moves: on a busy machine 60 ms of wall time can be
        // less than one 10 ms tick of this process's CPU time, so wait for the counter, not
        // for a budget (the bound only keeps a broken reader from spinning forever).
        let before = process_cpu();
        let start = Instant::now();
        let mut x = 0u64;
        while process_cpu() <= before && start.elapsed() < Duration::from_secs(60) {
            for _ in 0..100_000 {
                x = x.wrapping_mul(31).wrapping_add(7);
            }
        }
        std::hint::black_box(x);
        assert!(process_cpu() > before, "process CPU time never moved");
        assert!(peak_rss_bytes().is_some_and(|b| b > 1024 * 1024));
    }
}
