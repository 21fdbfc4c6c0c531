//! Delivery positions: the `aggregate_seq` header that lets a consumer apply each aggregate's
//! events in order even when its broker redelivers out of order (a consumer crash, two
//! consumer instances on one durable, a retry).
//!
//! A polling source keeps, per aggregate, the highest position it ever handed out (its
//! *head*, in a table next to the outbox), reads the heads with each claim, and numbers the
//! claimed events of an aggregate `head + 1, head + 2, …` in batch order ([`assign`]). The
//! relay publishes an aggregate's events of a batch one wave at a time and stops at the first
//! that is not delivered, so the published positions are always a contiguous run. When the
//! batch settles, the head moves to the highest position that was *used*: delivered, or
//! dead-lettered (a dead letter may have reached the broker before its last attempt failed;
//! its position is never handed to another event). An event that is retried or released
//! leaves the head alone and gets the same position again next time (the same event, so a
//! consumer sees the same number twice, which is a duplicate). The head moves in the same
//! transaction that records the outcomes, so a crash cannot separate the two.
//!
//! A consumer that has applied position `n` of an aggregate applies `n + 1` next and holds
//! anything higher until the gap fills (`outbox-inbox` does this).
//!
//! # Change streams ([`StreamPositions`])
//!
//! A change-stream source (PostgreSQL logical replication; [`crate::stream_ledger`]) has no
//! claim to read heads with, and after a crash it does not get its events back as rows but as
//! the stream's unconfirmed tail, sent again from the last confirmed stream position. It
//! numbers differently, so that the tail gets the same numbers the second time:
//!
//! - **Every event that enters the ledger is numbered, in ledger order (commit order), before
//!   anything can drop it or hand it out.** An aggregate's events get `head + 1, head + 2, …`
//!   whatever happens to them next: delivered, retried (the number stays on the event),
//!   dead-lettered, found already dead after a restart, parked behind a dead letter, or put
//!   back in line by the source itself. So the numbers of a stretch of the stream are a
//!   function of the heads at its start and of the stream's content alone.
//! - **The heads are saved with the stream position, in one transaction**: when the source
//!   saves that it has settled everything up to stream position `S`, it writes with it the
//!   head of every aggregate numbered in a transaction ending at or before `S`
//!   ([`StreamPositions::to_save`]), and nothing of a later transaction. The saved heads are
//!   therefore always exactly the heads "after `S`".
//! - **The stream is never confirmed past a transaction whose heads are not saved**
//!   ([`StreamPositions::bound`]): the server resumes at or before `S` (a source skips what
//!   ends at or before its saved `S`), so the stream starts again right after `S` with the
//!   heads of `S`, and numbers the same events in the same order: the same numbers.
//!
//! A crash (`kill -9`), a lost connection, a standby relay taking over: each resumes after
//! the last saved `S` and reads the heads saved with it. Nothing is numbered twice apart from
//! the same event getting its own number again, and nothing is skipped: an event is settled
//! for good (its transaction confirmed, its head saveable) only after it was numbered.

use std::collections::{HashMap, VecDeque};

use crate::message::header;
use crate::source::{Outcome, Settlement};
use crate::stream_ledger::Ledger;
use crate::{Event, Position};

/// The positions given to one claimed batch, kept until it settles.
#[derive(Debug, Default)]
pub struct AssignedPositions {
    /// Event position in the source → (index in `aggregates`, delivery position).
    by_event: HashMap<Position, (usize, i64)>,
    /// The aggregates of the batch, each once.
    aggregates: Vec<(String, String)>,
}

/// Numbers `events` (one batch, in source order) per aggregate from their heads:
/// `heads[i]` is the head of `events[i]`'s aggregate as read with the claim (0 when it has
/// none). Each event gets an [`AGGREGATE_SEQ`](header::AGGREGATE_SEQ) header.
///
/// # Panics
/// When `heads` and `events` differ in length (a bug in the calling source).
pub fn assign(events: &mut [Event], heads: &[i64]) -> AssignedPositions {
    assert_eq!(events.len(), heads.len(), "one head per event");
    let mut last: HashMap<(&str, &str), (usize, i64)> = HashMap::new();
    let mut by_event = HashMap::with_capacity(events.len());
    let mut aggregates = Vec::new();
    let mut numbered = Vec::with_capacity(events.len());
    for (event, head) in events.iter().zip(heads) {
        let key = (event.aggregate_type.as_str(), event.aggregate_id.as_str());
        let slot = last.entry(key).or_insert_with(|| {
            aggregates.push((key.0.to_owned(), key.1.to_owned()));
            (aggregates.len() - 1, *head)
        });
        slot.1 += 1;
        by_event.insert(event.position, *slot);
        numbered.push(slot.1);
    }
    for (event, n) in events.iter_mut().zip(numbered) {
        event
            .headers
            .push((header::AGGREGATE_SEQ.to_owned(), n.to_string()));
    }
    AssignedPositions {
        by_event,
        aggregates,
    }
}

impl AssignedPositions {
    /// The new head of every aggregate whose head moves with `settlements`: the highest
    /// position among its delivered events and, when `dead_recorded`, its dead-lettered ones.
    /// Returned as (aggregate_type, aggregate_id, head).
    pub fn advanced(
        &self,
        settlements: &[Settlement],
        dead_recorded: bool,
    ) -> Vec<(String, String, i64)> {
        let mut highest: HashMap<usize, i64> = HashMap::new();
        for s in settlements {
            let used = match s.outcome {
                Outcome::Delivered => true,
                Outcome::DeadLetter { .. } => dead_recorded,
                Outcome::Retry { .. } | Outcome::Released => false,
            };
            if let (true, Some(&(agg, n))) = (used, self.by_event.get(&s.position)) {
                let h = highest.entry(agg).or_insert(n);
                *h = (*h).max(n);
            }
        }
        let mut out: Vec<_> = highest
            .into_iter()
            .map(|(agg, n)| {
                let (t, id) = &self.aggregates[agg];
                (t.clone(), id.clone(), n)
            })
            .collect();
        out.sort_unstable();
        out
    }
}

/// An aggregate: (aggregate_type, aggregate_id).
type Aggregate = (String, String);

/// A head kept in memory by [`StreamPositions`].
#[derive(Debug)]
struct Head {
    /// The last number handed out.
    last: i64,
    /// Unsaved transactions with numbers of this aggregate (forgotten at 0).
    unsaved: usize,
}

/// The delivery positions of a change-stream source: see the module docs ("Change streams").
///
/// Use: before each fetch, [`unknown`](Self::unknown) names the aggregates whose heads must
/// be read from the table, [`load`](Self::load) takes them, [`assign`](Self::assign) numbers
/// every event the ledger received since. With each save of the settled stream position `S`,
/// write [`to_save(S)`](Self::to_save) in the same transaction, then call
/// [`saved(S)`](Self::saved). Confirm at most [`bound`](Self::bound) to the stream. When the
/// stream starts again from the saved position, [`reset`](Self::reset).
#[derive(Debug, Default)]
pub struct StreamPositions {
    /// Heads of the aggregates numbered and not saved yet, or just read.
    heads: HashMap<Aggregate, Head>,
    /// The ledger position of the last event numbered.
    numbered_through: i64,
    /// Per transaction (the stream position it ends at), in stream order: the last number it
    /// gave each aggregate, until saved.
    unsaved: VecDeque<(u64, HashMap<Aggregate, i64>)>,
}

impl StreamPositions {
    /// The aggregates of events waiting to be numbered whose head is not in memory, each once:
    /// read their heads from the table (0 for none) and hand them to [`load`](Self::load).
    pub fn unknown<M: Clone>(&self, ledger: &Ledger<M>) -> Vec<Aggregate> {
        let mut out = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for e in ledger.queued_after(self.numbered_through) {
            let key = e.aggregate();
            if !self.heads.contains_key(&key) && seen.insert(key.clone()) {
                out.push(key);
            }
        }
        out
    }

    /// Takes the heads read from the table for `asked` (from [`unknown`](Self::unknown));
    /// an aggregate absent from `found` has none yet (0).
    pub fn load(&mut self, asked: Vec<Aggregate>, found: Vec<(String, String, i64)>) {
        let found: HashMap<Aggregate, i64> =
            found.into_iter().map(|(t, i, n)| ((t, i), n)).collect();
        for key in asked {
            let last = found.get(&key).copied().unwrap_or(0);
            self.heads.entry(key).or_insert(Head { last, unsaved: 0 });
        }
    }

    /// Numbers every event the ledger received since the last call, in commit order: each
    /// gets an [`AGGREGATE_SEQ`](header::AGGREGATE_SEQ) header. Call [`load`](Self::load) for
    /// the [`unknown`](Self::unknown) aggregates first (one missing counts from 0).
    pub fn assign<M: Clone>(&mut self, ledger: &mut Ledger<M>) {
        for (end, entry) in ledger.queued_after_mut(self.numbered_through) {
            let key = entry.aggregate();
            debug_assert!(self.heads.contains_key(&key), "head of {key:?} not loaded");
            let head = match self.heads.get_mut(&key) {
                Some(head) => head,
                None => self.heads.entry(key.clone()).or_insert(Head {
                    last: 0,
                    unsaved: 0,
                }),
            };
            head.last += 1;
            let n = head.last;
            if self.unsaved.back().is_none_or(|(e, _)| *e != end) {
                self.unsaved.push_back((end, HashMap::new()));
            }
            if let Some((_, txn)) = self.unsaved.back_mut()
                && txn.insert(key, n).is_none()
            {
                head.unsaved += 1;
            }
            entry
                .event
                .headers
                .push((header::AGGREGATE_SEQ.to_owned(), n.to_string()));
            self.numbered_through = entry.event.position.0;
        }
    }

    /// The heads to write with the saved stream position `through`: the last number of every
    /// aggregate numbered in a transaction ending at or before it, as (aggregate_type,
    /// aggregate_id, head), sorted (writers lock rows in one order). Never moves a head back
    /// when written with `GREATEST`.
    pub fn to_save(&self, through: u64) -> Vec<(String, String, i64)> {
        let mut heads: HashMap<&Aggregate, i64> = HashMap::new();
        for (_, txn) in self.unsaved.iter().take_while(|(end, _)| *end <= through) {
            for (key, n) in txn {
                heads.insert(key, *n);
            }
        }
        let mut out: Vec<_> = heads
            .into_iter()
            .map(|((t, i), n)| (t.clone(), i.clone(), n))
            .collect();
        out.sort_unstable();
        out
    }

    /// [`to_save(through)`](Self::to_save) is committed: forgets it, and the heads no unsaved
    /// transaction needs (the table has them; they are read again when needed).
    pub fn saved(&mut self, through: u64) {
        while self.unsaved.front().is_some_and(|(end, _)| *end <= through) {
            let Some((_, txn)) = self.unsaved.pop_front() else {
                break;
            };
            for key in txn.into_keys() {
                if let Some(head) = self.heads.get_mut(&key) {
                    head.unsaved = head.unsaved.saturating_sub(1);
                    if head.unsaved == 0 {
                        self.heads.remove(&key);
                    }
                }
            }
        }
    }

    /// How far the stream may be confirmed, given the ledger's `confirmed` position and the
    /// last `saved` one: past `saved` only when no transaction up to `confirmed` has unsaved
    /// heads (a stream resumed after it would not number them again).
    pub fn bound(&self, confirmed: u64, saved: u64) -> u64 {
        match self.unsaved.front() {
            Some((end, _)) if *end <= confirmed => saved.min(confirmed),
            _ => confirmed,
        }
    }

    /// The stream starts again after the saved position: forgets every head in memory (they
    /// are read again from the table, as saved with that position) and what was not saved.
    pub fn reset(&mut self) {
        self.heads.clear();
        self.unsaved.clear();
    }
}

/// The `aggregate_seq` header of a message's headers, when present and a positive number.
pub fn parse(value: &str) -> Option<u64> {
    value.parse::<u64>().ok().filter(|n| *n > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(agg: &str, pos: i64) -> Event {
        Event {
            id: uuid::Uuid::from_u128(pos as u128),
            position: Position(pos),
            aggregate_type: "A".into(),
            aggregate_id: agg.into(),
            event_type: "e".into(),
            payload: bytes::Bytes::new(),
            headers: vec![],
            created_at: time::OffsetDateTime::UNIX_EPOCH,
            attempts: 0,
        }
    }

    fn seq_of(e: &Event) -> &str {
        &e.headers
            .iter()
            .find(|(n, _)| n == header::AGGREGATE_SEQ)
            .expect("numbered")
            .1
    }

    fn settle(pos: i64, outcome: Outcome) -> Settlement {
        Settlement {
            position: Position(pos),
            outcome,
        }
    }

    #[test]
    fn events_are_numbered_per_aggregate_from_its_head() {
        let mut batch = vec![ev("x", 1), ev("y", 2), ev("x", 3), ev("x", 4)];
        let assigned = assign(&mut batch, &[7, 0, 7, 7]);
        let seqs: Vec<&str> = batch.iter().map(seq_of).collect();
        assert_eq!(seqs, ["8", "1", "9", "10"]);
        let dead = Outcome::DeadLetter { reason: "r".into() };
        let retry = Outcome::Retry {
            not_before: time::OffsetDateTime::UNIX_EPOCH,
            error: "e".into(),
        };
        let settlements = [
            settle(1, Outcome::Delivered),
            settle(2, retry),
            settle(3, dead),
            settle(4, Outcome::Released),
        ];
        assert_eq!(
            assigned.advanced(&settlements, true),
            vec![("A".to_owned(), "x".to_owned(), 9)],
            "a dead letter uses its position; a retry or a release does not"
        );
        assert_eq!(
            assigned.advanced(&settlements, false),
            vec![("A".to_owned(), "x".to_owned(), 8)],
            "a dead letter that was not recorded does not move the head"
        );
    }

    fn streamed(agg: &str) -> (Event, ()) {
        (ev(agg, 0), ())
    }

    /// Numbers what the ledger received, reading unknown heads from `table`.
    fn number(p: &mut StreamPositions, l: &mut Ledger<()>, table: &HashMap<Aggregate, i64>) {
        let asked = p.unknown(l);
        let found = asked
            .iter()
            .filter_map(|k| table.get(k).map(|n| (k.0.clone(), k.1.clone(), *n)))
            .collect();
        p.load(asked, found);
        p.assign(l);
    }

    fn taken_seqs(l: &mut Ledger<()>) -> Vec<(String, String)> {
        let now = time::OffsetDateTime::UNIX_EPOCH;
        l.take(100, now, crate::Ordering::None)
            .iter()
            .map(|e| (e.aggregate_id.clone(), seq_of(e).to_owned()))
            .collect()
    }

    fn pairs(v: &[(&str, &str)]) -> Vec<(String, String)> {
        v.iter()
            .map(|(a, n)| ((*a).to_owned(), (*n).to_owned()))
            .collect()
    }

    #[test]
    fn a_stream_resumed_from_the_saved_position_numbers_its_tail_the_same() {
        let mut table: HashMap<Aggregate, i64> = HashMap::new();
        table.insert(("A".into(), "x".into()), 4);
        let mut l = Ledger::<()>::new(0);
        let mut p = StreamPositions::default();
        l.commit(vec![streamed("x"), streamed("y")], 10);
        l.commit(vec![streamed("x")], 20);
        number(&mut p, &mut l, &table);
        let first = taken_seqs(&mut l);
        assert_eq!(first, pairs(&[("x", "5"), ("y", "1"), ("x", "6")]));
        // The first transaction settles; the second does not.
        for pos in [1, 2] {
            let e = l.take_in_flight(pos).expect("in flight");
            l.finish(&e);
        }
        l.release_in_flight();
        assert_eq!(l.confirmed(), 10);
        assert_eq!(p.bound(l.confirmed(), 0), 0, "not past unsaved heads");
        let heads = p.to_save(10);
        assert_eq!(
            heads,
            vec![("A".into(), "x".into(), 5), ("A".into(), "y".into(), 1)],
            "only the settled transaction's heads"
        );
        for (t, i, n) in heads {
            table.insert((t, i), n);
        }
        p.saved(10);
        assert_eq!(p.bound(l.confirmed(), 10), 10);
        // A crash: the stream resumes after 10 and sends the second transaction again.
        let mut l = Ledger::<()>::new(10);
        let mut p = StreamPositions::default();
        l.commit(vec![streamed("x")], 20);
        l.commit(vec![streamed("y"), streamed("x")], 30);
        number(&mut p, &mut l, &table);
        assert_eq!(
            taken_seqs(&mut l),
            pairs(&[("x", "6"), ("y", "2"), ("x", "7")]),
            "the same event gets the same number; the next ones follow without a gap"
        );
    }

    #[test]
    fn numbers_are_given_once_and_memory_is_freed_once_saved() {
        let table = HashMap::new();
        let mut l = Ledger::<()>::new(0);
        let mut p = StreamPositions::default();
        l.commit(vec![streamed("x")], 10);
        number(&mut p, &mut l, &table);
        number(&mut p, &mut l, &table);
        let e = l.queued().next().expect("queued").clone();
        assert_eq!(
            e.event
                .headers
                .iter()
                .filter(|(n, _)| n == header::AGGREGATE_SEQ)
                .count(),
            1,
            "numbered once"
        );
        assert!(p.unknown(&l).is_empty());
        p.saved(10);
        assert!(p.heads.is_empty(), "the table has the head now");
        assert_eq!(p.bound(10, 10), 10);
        l.commit(vec![streamed("x")], 20);
        assert_eq!(p.unknown(&l), vec![("A".to_owned(), "x".to_owned())]);
    }

    #[test]
    fn only_positive_numbers_parse() {
        assert_eq!(parse("12"), Some(12));
        assert_eq!(parse("0"), None);
        assert_eq!(parse("-1"), None);
        assert_eq!(parse("x"), None);
    }
}
