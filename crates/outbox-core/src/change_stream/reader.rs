//! Reading the log: the loops every change-stream source runs over its [`LogReader`].

use std::future::Future;
use std::time::Duration;

use futures::FutureExt as _;
use time::OffsetDateTime;
use tokio::time::Instant;

use super::{ChangeStream, MAX_BUFFERED};
use crate::SourceError;
use crate::spill::Spillable;
use crate::stream_ledger::PUMP_BUDGET;

/// A database's log, as a change-stream source reads it: one session at a time, items in
/// commit order, each applied to the ledger by the source (a transaction's events enter the
/// ledger at its commit).
///
/// Delivery contract: at-least-once. After a lost session the log is read again from the
/// confirmed position, so [`LogReader::receive`] sees again what it saw before; the ledger
/// was reset by [`LogReader::lost`] and takes it afresh.
pub trait LogReader: Send {
    /// What the ledger keeps with each event.
    type Meta: Clone + Spillable + Send + Sync;
    /// One item of the log (an event of the replication protocol, or its failure).
    type Item: Send;

    /// The shared state.
    fn stream(&self) -> &ChangeStream<Self::Meta>;
    /// The shared state, to change.
    fn stream_mut(&mut self) -> &mut ChangeStream<Self::Meta>;
    /// True while a session is open.
    fn is_open(&self) -> bool;
    /// The next item of the open session (`None`: no session).
    fn next_item(&mut self) -> Option<impl Future<Output = Self::Item> + Send + '_>;
    /// Applies one item. `Ok(true)`: a transaction with events committed. A failure has
    /// ended the session (through [`LogReader::lost`]).
    fn receive(&mut self, item: Self::Item) -> Result<bool, SourceError>;
    /// Ends the session after a failure; the next `fetch` opens one again, and the log
    /// resends everything unconfirmed.
    fn lost(&mut self, error: SourceError) -> SourceError;
    /// True while a transaction is read but not committed: it is read to its commit even
    /// past [`MAX_BUFFERED`].
    fn mid_transaction(&self) -> bool;
    /// Events committed but held outside the ledger (PostgreSQL: waiting for the
    /// synchronous standbys); they count against [`MAX_BUFFERED`].
    fn held(&self) -> usize {
        0
    }
    /// Longest quiet wait before `fetch` should run again (PostgreSQL: to ask the standbys).
    fn wake_within(&self) -> Option<Duration> {
        None
    }
    /// A wait timed out without a word from the log: an error ends the session (a server
    /// gone without closing the connection).
    fn silent(&mut self) -> Option<SourceError> {
        None
    }
}

/// Reads what the log has ready without waiting, for at most [`PUMP_BUDGET`].
pub fn pump<R: LogReader>(reader: &mut R) -> Result<(), SourceError> {
    let until = Instant::now() + PUMP_BUDGET;
    loop {
        let ledger = &mut reader.stream_mut().ledger;
        if ledger.draining() {
            // A large transaction loads from its scratch file first (commit order).
            return ledger.refill(MAX_BUFFERED).map_err(|e| reader.lost(e));
        }
        if Instant::now() >= until {
            return Ok(()); // the rest at the next fetch
        }
        let buffered = reader.stream().ledger.unsettled() + reader.held();
        if buffered >= MAX_BUFFERED && !reader.mid_transaction() {
            return Ok(());
        }
        let Some(next) = reader.next_item() else {
            return Ok(());
        };
        match next.now_or_never() {
            None => return Ok(()),
            Some(item) => {
                reader.receive(item)?;
            }
        }
    }
}

/// Right after the start: reads the log until it passed the head seen at the start
/// ([`ChangeStream::catch_up`]: everything committed before is then in memory), a batch is
/// full, or `timeout` passed.
pub async fn catch_up<R: LogReader>(
    reader: &mut R,
    limit: usize,
    timeout: Duration,
) -> Result<(), SourceError> {
    let deadline = Instant::now() + timeout;
    while catching_up(reader.stream(), limit) {
        let Some(next) = reader.next_item() else {
            return Ok(());
        };
        let Ok(item) = tokio::time::timeout_at(deadline, next).await else {
            reader.stream_mut().catch_up = None;
            return Ok(());
        };
        reader.receive(item)?;
    }
    Ok(())
}

fn catching_up<M: Clone>(stream: &ChangeStream<M>, limit: usize) -> bool {
    let ledger = &stream.ledger;
    stream.catch_up.is_some()
        && ledger.unsettled() < MAX_BUFFERED
        && !ledger.draining()
        && ledger
            .selectable(limit, OffsetDateTime::now_utc(), stream.ordering)
            .len()
            < limit
}

/// True when the ledger has an event `fetch` would return now.
fn ready<M: Clone>(stream: &ChangeStream<M>) -> bool {
    let now = OffsetDateTime::now_utc();
    !stream.ledger.selectable(1, now, stream.ordering).is_empty()
}

/// Waits until an event may be fetched (a commit, a retry coming due), at most `max`. A
/// failure of the log is kept in [`ChangeStream::failure`] for the next `fetch`.
pub async fn wait_for_events<R: LogReader>(reader: &mut R, max: Duration) {
    let mut deadline = Instant::now() + max;
    if reader.stream().failure.is_some() {
        return;
    }
    if !reader.is_open() {
        tokio::time::sleep_until(deadline.min(reader.stream().claim.next_attempt())).await;
        return;
    }
    let now = OffsetDateTime::now_utc();
    if let Some(due) = reader.stream().ledger.next_due(now) {
        let wait = (due - now).try_into().unwrap_or(Duration::ZERO);
        deadline = deadline.min(Instant::now() + wait);
    }
    if ready(reader.stream()) {
        return;
    }
    loop {
        if let Some(within) = reader.wake_within() {
            deadline = deadline.min(Instant::now() + within);
        }
        let stream = reader.stream_mut();
        if stream.ledger.draining() {
            let waited = stream
                .ledger
                .wait_draining(MAX_BUFFERED, stream.ordering, deadline);
            if let Err(e) = waited.await {
                let e = reader.lost(e);
                reader.stream_mut().failure = Some(e);
            }
            return;
        }
        let Some(next) = reader.next_item() else {
            return;
        };
        let Ok(item) = tokio::time::timeout_at(deadline, next).await else {
            if let Some(e) = reader.silent() {
                let e = reader.lost(e);
                reader.stream_mut().failure = Some(e);
            }
            return;
        };
        match reader.receive(item) {
            Ok(true) if ready(reader.stream()) => return,
            Ok(_) => {}
            Err(e) => {
                reader.stream_mut().failure = Some(e);
                return;
            }
        }
    }
}
