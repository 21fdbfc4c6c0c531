//! [`LedgerStats`]: the ledger's counts as a running source publishes them for its
//! inspector (metrics, the watchdog, `status`), which run on other tasks.

use std::sync::atomic::{self, AtomicBool, AtomicI64, AtomicU64};

use time::OffsetDateTime;

use super::{Ledger, Spilled, Waiting};
use crate::source::Backlog;
use crate::spill::SpilledTxn;

/// Counters a running stream source shares with its inspector (metrics, the watchdog and
/// `status` run on other tasks).
#[derive(Debug)]
pub struct LedgerStats {
    unsettled: AtomicU64,
    retrying: AtomicU64,
    /// Unix microseconds of the oldest unsettled event; `i64::MIN` when none.
    oldest_micros: AtomicI64,
    /// True while the source holds its stream.
    pub streaming: AtomicBool,
    spilled_transactions: AtomicU64,
    spilled_events: AtomicU64,
}

impl Default for LedgerStats {
    fn default() -> Self {
        Self {
            unsettled: AtomicU64::new(0),
            retrying: AtomicU64::new(0),
            oldest_micros: AtomicI64::new(i64::MIN),
            streaming: AtomicBool::new(false),
            spilled_transactions: AtomicU64::new(0),
            spilled_events: AtomicU64::new(0),
        }
    }
}

impl LedgerStats {
    /// Copies the ledger's counts.
    pub fn publish<M: Clone>(&self, ledger: &Ledger<M>) {
        let relaxed = atomic::Ordering::Relaxed;
        let on_disk = ledger.drain.as_ref().map_or(0, SpilledTxn::remaining)
            + ledger
                .waiting
                .iter()
                .map(|(w, _)| match w {
                    Waiting::Spilled(s) => s.len(),
                    Waiting::Events(_) => 0,
                })
                .sum::<usize>();
        self.unsettled
            .store((ledger.unsettled() + on_disk) as u64, relaxed);
        let spilled = ledger.spilled();
        self.spilled_transactions
            .store(spilled.transactions, relaxed);
        self.spilled_events.store(spilled.events, relaxed);
        self.retrying.store(ledger.retrying() as u64, relaxed);
        let oldest = ledger
            .oldest()
            .map_or(i64::MIN, |t| (t.unix_timestamp_nanos() / 1_000) as i64);
        self.oldest_micros.store(oldest, relaxed);
    }

    /// What the ledger has committed from scratch files, as last published.
    pub fn spilled(&self) -> Spilled {
        let relaxed = atomic::Ordering::Relaxed;
        Spilled {
            transactions: self.spilled_transactions.load(relaxed),
            events: self.spilled_events.load(relaxed),
        }
    }

    /// Sets the backlog's pending and retrying counts and the oldest pending age at `now`
    /// from the last published counts.
    pub fn fill(&self, backlog: &mut Backlog, now: OffsetDateTime) {
        let relaxed = atomic::Ordering::Relaxed;
        backlog.pending = self.unsettled.load(relaxed);
        backlog.retrying = self.retrying.load(relaxed);
        let oldest = self.oldest_micros.load(relaxed);
        if oldest != i64::MIN {
            let age = now.unix_timestamp_nanos() as f64 / 1e9 - oldest as f64 / 1e6;
            backlog.oldest_pending_age_seconds = age.max(0.0);
        }
    }
}
