//! What a change-stream source reports from its ledger, the same for every one of them: the
//! batch a fetch hands the relay, with the counts it leaves ([`Ledger::fetched`]), and the backlog
//! ([`LedgerStats::backlog`]).

use time::OffsetDateTime;

use super::{Ledger, LedgerStats};
use crate::Ordering;
use crate::source::{Backlog, Fetched};

impl<M: Clone> Ledger<M> {
    /// [`take`](Ledger::take)s up to `limit` events ready at `now` as the batch a fetch
    /// returns (`more` when the limit was reached, the claim valid until `valid_until`), and
    /// [`publish`](LedgerStats::publish)es the ledger's counts after it to `stats`.
    pub fn fetched(
        &mut self,
        limit: usize,
        now: OffsetDateTime,
        ordering: Ordering,
        valid_until: Option<tokio::time::Instant>,
        stats: &LedgerStats,
    ) -> Fetched {
        let events = self.take(limit, now, ordering);
        stats.publish(self);
        Fetched {
            more: events.len() >= limit,
            events,
            valid_until,
        }
    }
}

impl LedgerStats {
    /// A change-stream source's backlog at `now`: `dead` letters as counted in the table, the
    /// rest from what a running source last published (`stats`; nothing without one).
    pub fn backlog(stats: Option<&Self>, dead: i64, now: OffsetDateTime) -> Backlog {
        let mut backlog = Backlog {
            dead: dead.max(0) as u64,
            delivered_last_minute: None,
            ..Backlog::default()
        };
        if let Some(stats) = stats {
            stats.fill(&mut backlog, now);
        }
        backlog
    }
}
