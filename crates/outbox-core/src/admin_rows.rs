//! The rows of the operator queries (`outbox dead`, `why`, `status`, `replay`, `verify`),
//! decoded once for every SQL database.
//!
//! Every database's `queries/*.sql` return the same columns in the same order; what differs
//! is how a column is stored (an event id as `uuid` or as hyphenated text, a time as
//! `timestamptz`, `DATETIME(6)` or Unix microseconds). A database crate implements
//! [`Columns`] for its row type, reading one column by position, and the functions here build
//! the core's types from it, naming each column once.

use time::OffsetDateTime;
use uuid::Uuid;

use crate::admin::{
    AttemptError, Blocker, DeadLetter, HeldAggregate, ReplayPreview, StoredEventDetail,
};
use crate::verify::{LedgerEvent, RowState, StoredRow};

/// One row of an operator query, read by column position in the database's own encoding.
pub trait Columns {
    /// The driver's decoding error (`sqlx::Error`).
    type Error;

    /// A text column.
    fn text(&self, i: usize) -> Result<String, Self::Error>;
    /// A nullable text column.
    fn text_opt(&self, i: usize) -> Result<Option<String>, Self::Error>;
    /// A 32-bit integer column (attempt counts).
    fn int(&self, i: usize) -> Result<i32, Self::Error>;
    /// A 64-bit integer column (positions, counts).
    fn long(&self, i: usize) -> Result<i64, Self::Error>;
    /// A binary column (payloads).
    fn bytes(&self, i: usize) -> Result<Vec<u8>, Self::Error>;
    /// An event id column.
    fn id(&self, i: usize) -> Result<Uuid, Self::Error>;
    /// A time column, in UTC.
    fn time(&self, i: usize) -> Result<OffsetDateTime, Self::Error>;
    /// A nullable time column, in UTC.
    fn time_opt(&self, i: usize) -> Result<Option<OffsetDateTime>, Self::Error>;
}

/// The positions of a [`DeadLetter`]'s columns in a row: id, aggregate type, aggregate id,
/// event type, attempts, reason, created at, dead-lettered at.
type DeadLetterColumns = [usize; 8];

/// Where `outbox_dead_list.sql` returns them: in order.
const LISTED: DeadLetterColumns = [0, 1, 2, 3, 4, 5, 6, 7];

/// Where `outbox_dead_show.sql` returns them (its other columns are the event's details).
const SHOWN: DeadLetterColumns = [0, 1, 2, 3, 8, 9, 6, 11];

fn dead_letter_at<C: Columns>(r: &C, at: DeadLetterColumns) -> Result<DeadLetter, C::Error> {
    let [
        id,
        aggregate_type,
        aggregate_id,
        event_type,
        attempts,
        reason,
        created,
        dead,
    ] = at;
    Ok(DeadLetter {
        id: r.id(id)?,
        aggregate_type: r.text(aggregate_type)?,
        aggregate_id: r.text(aggregate_id)?,
        event_type: r.text(event_type)?,
        attempts: r.int(attempts)?,
        reason: r.text_opt(reason)?,
        created_at: r.time(created)?,
        dead_lettered_at: r.time_opt(dead)?,
    })
}

/// A row of `outbox_dead_list.sql`.
pub fn dead_letter<C: Columns>(r: &C) -> Result<DeadLetter, C::Error> {
    dead_letter_at(r, LISTED)
}

/// A row of `outbox_dead_show.sql` (columns 0 to 12), with what each database stores its own
/// way: the headers, the attempt history and whether the next attempt is still backoff.
pub fn stored_event<C: Columns>(
    r: &C,
    headers: serde_json::Value,
    attempt_errors: Vec<AttemptError>,
    backoff_until: Option<OffsetDateTime>,
) -> Result<StoredEventDetail, C::Error> {
    Ok(StoredEventDetail {
        summary: dead_letter_at(r, SHOWN)?,
        state: r.text(7)?,
        payload: r.bytes(4)?,
        headers,
        delivered_at: r.time_opt(10)?,
        seq: r.long(12)?,
        attempt_errors,
        backoff_until,
    })
}

/// A row of `outbox_why_blocker.sql`.
pub fn blocker<C: Columns>(r: &C) -> Result<Blocker, C::Error> {
    Ok(Blocker {
        id: r.id(0)?,
        state: r.text(1)?,
        attempts: r.int(2)?,
        last_error: r.text_opt(3)?,
        backoff_until: r.time_opt(4)?,
        created_at: r.time(5)?,
    })
}

/// A row of `outbox_held_aggregates.sql`.
pub fn held_aggregate<C: Columns>(r: &C) -> Result<HeldAggregate, C::Error> {
    Ok(HeldAggregate {
        aggregate_type: r.text(0)?,
        aggregate_id: r.text(1)?,
        head_id: r.id(2)?,
        state: r.text(3)?,
        attempts: r.int(4)?,
        next_attempt_at: r.time_opt(5)?,
        last_error: r.text_opt(6)?,
        waiting: r.long(7)?,
    })
}

/// A row of `replay_select.sql`.
pub fn replay_preview<C: Columns>(r: &C) -> Result<ReplayPreview, C::Error> {
    Ok(ReplayPreview {
        id: r.id(0)?,
        aggregate_type: r.text(1)?,
        aggregate_id: r.text(2)?,
        event_type: r.text(3)?,
        created_at: r.time(4)?,
        delivered_at: r.time_opt(5)?,
    })
}

/// A row of `verify_delivered.sql`.
pub fn ledger_event<C: Columns>(r: &C) -> Result<LedgerEvent, C::Error> {
    Ok(LedgerEvent {
        id: r.id(0)?,
        aggregate_type: r.text(1)?,
        aggregate_id: r.text(2)?,
        event_type: r.text(3)?,
        position: r.long(4)?,
        created_at: r.time(5)?,
        delivered_at: r.time_opt(6)?,
    })
}

/// A row of `verify_lookup.sql`.
pub fn stored_row<C: Columns>(r: &C) -> Result<StoredRow, C::Error> {
    Ok(StoredRow {
        id: r.id(0)?,
        state: RowState::from_column(&r.text(1)?),
        position: r.long(2)?,
        created_at: r.time(3)?,
    })
}

/// The [`Columns`] methods whose Rust type every database decodes directly (`text`,
/// `text_opt`, `int`, `long`, `bytes`), for an `impl Columns for Wrapper<'_>` in a database
/// crate: each forwards to the wrapped row's typed getter, `self.0.try_get(i)` (sqlx's
/// `Row::try_get`, which must be in scope where this is invoked; the core does not name
/// sqlx). The crate writes `type Error`, `id`, `time` and `time_opt` itself.
#[macro_export]
macro_rules! forward_plain_columns {
    () => {
        fn text(&self, i: usize) -> ::std::result::Result<String, Self::Error> {
            self.0.try_get(i)
        }
        fn text_opt(&self, i: usize) -> ::std::result::Result<Option<String>, Self::Error> {
            self.0.try_get(i)
        }
        fn int(&self, i: usize) -> ::std::result::Result<i32, Self::Error> {
            self.0.try_get(i)
        }
        fn long(&self, i: usize) -> ::std::result::Result<i64, Self::Error> {
            self.0.try_get(i)
        }
        fn bytes(&self, i: usize) -> ::std::result::Result<Vec<u8>, Self::Error> {
            self.0.try_get(i)
        }
    };
}
