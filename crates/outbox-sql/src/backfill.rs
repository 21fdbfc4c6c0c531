//! The rows of `outbox backfill` (`outbox_core::backfill`), decoded once for the three SQL
//! databases: a page of outbox events, a subscription table's pending rows, what it handed
//! out per aggregate.
//!
//! Every database's backfill queries return these in the same column layout (MySQL's events
//! and pending rows excepted: they come in its claim's layout). A column each database
//! stores its own way (an event id, a time) is read through the database's
//! [`Columns`]; the others (text, a nullable integer, a flag, the headers' JSON object) sqlx
//! decodes the same way on every database ([`PlainColumns`]).

use outbox_core::admin_rows::Columns;
use outbox_core::backfill::{AggregateKey, Candidate, HandedOut, PendingRow};
use outbox_core::{Event, Position};
use sqlx::types::{Json, JsonValue};
use sqlx::{ColumnIndex, Decode, Row, Type};

/// The columns of a backfill row that sqlx decodes the same way on every database. Every
/// sqlx row type whose database decodes these Rust types has it.
pub trait PlainColumns: Row {
    /// A text column.
    fn text(&self, i: usize) -> Result<String, sqlx::Error>;
    /// A nullable 64-bit integer column.
    fn long_opt(&self, i: usize) -> Result<Option<i64>, sqlx::Error>;
    /// A flag: a boolean, or an integer that is 0 or 1 (MySQL's `EXISTS`).
    fn flag(&self, i: usize) -> Result<bool, sqlx::Error>;
    /// A JSON column (`jsonb`, `JSON` or JSON text).
    fn json(&self, i: usize) -> Result<JsonValue, sqlx::Error>;
}

impl<R: Row> PlainColumns for R
where
    usize: ColumnIndex<R>,
    for<'r> String: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> i64: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> bool: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> Json<JsonValue>: Decode<'r, R::Database> + Type<R::Database>,
{
    fn text(&self, i: usize) -> Result<String, sqlx::Error> {
        self.try_get(i)
    }

    fn long_opt(&self, i: usize) -> Result<Option<i64>, sqlx::Error> {
        self.try_get(i)
    }

    fn flag(&self, i: usize) -> Result<bool, sqlx::Error> {
        self.try_get(i)
    }

    fn json(&self, i: usize) -> Result<JsonValue, sqlx::Error> {
        Ok(self.try_get::<Json<JsonValue>, _>(i)?.0)
    }
}

/// The aggregate in columns 0 (type) and 1 (id).
pub fn aggregate_key<R: PlainColumns>(r: &R) -> Result<AggregateKey, sqlx::Error> {
    Ok((r.text(0)?, r.text(1)?))
}

/// A row of a database's `backfill_handed_out.sql`: the aggregate, then `last_seq`, `rows`
/// and `positioned` ([`HandedOut::from_facts`]).
pub fn handed_out<R: PlainColumns>(r: &R) -> Result<(AggregateKey, HandedOut), sqlx::Error> {
    let handed = HandedOut::from_facts(r.long_opt(2)?, r.flag(3)?, r.flag(4)?);
    Ok((aggregate_key(r)?, handed))
}

/// A row of a database's `backfill_events.sql` (PostgreSQL, SQLite): the outbox seq, then
/// the event's columns. `c` reads the same row in the database's encodings.
pub fn candidate<R, C>(r: &R, c: &C) -> Result<Candidate, sqlx::Error>
where
    R: PlainColumns,
    C: Columns<Error = sqlx::Error>,
{
    let outbox_seq = c.long(0)?;
    Ok(Candidate {
        outbox_seq,
        event: event_at(r, c, 1, outbox_seq)?,
    })
}

/// A row of a database's `backfill_pending.sql` (PostgreSQL, SQLite): the event's columns,
/// then attempts, `next_attempt_at` (NULL: ready at once), `last_error` and the outbox seq
/// (NULL: retention removed the outbox row). `c` reads the same row in the database's
/// encodings.
pub fn pending_row<R, C>(r: &R, c: &C) -> Result<PendingRow, sqlx::Error>
where
    R: PlainColumns,
    C: Columns<Error = sqlx::Error>,
{
    let mut event = event_at(r, c, 0, 0)?;
    event.attempts = u32::try_from(c.int(7)?).unwrap_or(0);
    Ok(PendingRow {
        event,
        next_attempt_at: c.time_opt(8)?,
        last_error: c.text_opt(9)?,
        outbox_seq: r.long_opt(10)?,
    })
}

/// An event from columns `at`.. (id, aggregate type and id, event type, payload, headers as
/// a JSON object, created_at), at `position`, with no attempts.
fn event_at<R, C>(r: &R, c: &C, at: usize, position: i64) -> Result<Event, sqlx::Error>
where
    R: PlainColumns,
    C: Columns<Error = sqlx::Error>,
{
    let JsonValue::Object(headers) = r.json(at + 5)? else {
        return Err(sqlx::Error::Decode(
            "invalid headers: not a JSON object".into(),
        ));
    };
    Ok(Event {
        id: c.id(at)?,
        position: Position(position),
        aggregate_type: c.text(at + 1)?,
        aggregate_id: c.text(at + 2)?,
        event_type: c.text(at + 3)?,
        payload: c.bytes(at + 4)?.into(),
        headers: outbox_core::enqueue::decode_headers(headers),
        created_at: c.time(at + 6)?,
        attempts: 0,
    })
}
