//! Transactions too large to hold ([`crate::spill`]): committed from their scratch file and
//! loaded in batches as room frees up, later transactions waiting behind them whole.

use time::OffsetDateTime;

use super::{Ledger, REFILL_BATCH, Txn, Waiting};
use crate::spill::{Spillable, SpilledTxn};
use crate::{Event, Ordering, SourceError};

impl<M: Clone + Spillable> Ledger<M> {
    /// Records a committed transaction whose events are in a scratch file; they are loaded
    /// by [`Ledger::refill`] (after those of an earlier one still loading). The source should
    /// read no more of its stream until [`Ledger::draining`] is false.
    pub fn commit_spilled(&mut self, events: SpilledTxn<(Event, M)>, end_lsn: u64) {
        self.spilled.transactions += 1;
        self.spilled.events += events.len() as u64;
        if self.drain.is_some() {
            self.waiting.push_back((Waiting::Spilled(events), end_lsn));
            return;
        }
        self.start_loading(events, end_lsn);
    }

    fn start_loading(&mut self, events: SpilledTxn<(Event, M)>, end_lsn: u64) {
        tracing::info!(
            events = events.len(),
            file_bytes = events.file_bytes(),
            "a large transaction committed; loading it from its scratch file in batches"
        );
        self.txns.push_back(Txn {
            end_lsn,
            remaining: 0,
            loading: true,
        });
        self.drain = Some(events);
    }

    /// Loads events of the spilled transaction, if any, until `max_unsettled` are held, at
    /// most [`REFILL_BATCH`] per call (the file is read on the caller's thread).
    pub fn refill(&mut self, max_unsettled: usize) -> Result<(), SourceError> {
        let room = max_unsettled
            .saturating_sub(self.unsettled())
            .min(REFILL_BATCH);
        let Some(drain) = self.drain.as_mut() else {
            return Ok(());
        };
        let batch = drain.next_batch(room).map_err(|e| {
            SourceError::unavailable("reading a large transaction back from its scratch file")
                .with_source(e)
        })?;
        let done = drain.remaining() == 0;
        self.enqueue(batch);
        if done {
            self.drain = None;
            if let Some(last) = self.txns.back_mut() {
                last.loading = false;
            }
            // What committed meanwhile, up to the next spilled transaction.
            while let Some((next, end_lsn)) = self.waiting.pop_front() {
                match next {
                    Waiting::Events(events) => {
                        self.commit(events, end_lsn);
                    }
                    Waiting::Spilled(events) => {
                        self.start_loading(events, end_lsn);
                        break;
                    }
                }
            }
            self.advance();
        }
        Ok(())
    }

    /// `wait_for_events` while [`Ledger::draining`]: it reads no stream but loads what fits
    /// and, when nothing is selectable (all in flight or backing off), waits until `deadline`.
    pub async fn wait_draining(
        &mut self,
        max_unsettled: usize,
        ordering: Ordering,
        deadline: tokio::time::Instant,
    ) -> Result<(), SourceError> {
        self.refill(max_unsettled)?;
        if self
            .selectable(1, OffsetDateTime::now_utc(), ordering)
            .is_empty()
        {
            tokio::time::sleep_until(deadline).await;
        }
        Ok(())
    }
}
