//! The outbox row on the hot path, the same sqlx code on every SQL database: a claimed row
//! decoded into an [`Event`], a settled batch recorded with one statement per outcome kind
//! ([`record_outcomes`]), and a new event's columns bound in the order of every database's
//! insert ([`bind_new_event`], for the producers).
//!
//! Each database keeps its SQL, its transactions, how it stores a column (its
//! [`Columns`] reader) and how it passes a list (arrays, JSON text): what differs is given
//! here as arguments or as an [`OutcomeStatements`] implementation, and nothing here adds a
//! round trip or a per-event allocation to what a database would write itself.

use std::sync::Arc;

use outbox_core::admin_rows::Columns;
use outbox_core::backend::{OnDelivered, SettledBatch};
use outbox_core::{Event, NewEvent, Position};
use sqlx::query::Query;
use sqlx::types::JsonValue;
use sqlx::types::time::OffsetDateTime;
use sqlx::{Connection, Database, Encode, Executor, IntoArguments, Type};

/// A statement with its binds, ready to run on a connection of `DB`.
pub type Statement<DB> = Query<'static, DB, <DB as Database>::Arguments>;

/// The statements that record a settled batch in one outbox table, each bound to its kind's
/// list in `batch` (in the database's own encoding) and to the settle's time where its SQL
/// takes one. [`record_outcomes`] builds each only when its kind has events.
pub trait OutcomeStatements<DB: Database> {
    /// Marks the delivered events (`on_delivered = "mark"`).
    fn mark_delivered(&self, batch: &SettledBatch<'_>) -> Statement<DB>;
    /// Deletes the delivered events (`on_delivered = "delete"`).
    fn delete_delivered(&self, batch: &SettledBatch<'_>) -> Statement<DB>;
    /// Schedules each retried event's next attempt.
    fn schedule_retry(&self, batch: &SettledBatch<'_>) -> Statement<DB>;
    /// Dead-letters the events given up on.
    fn dead_letter(&self, batch: &SettledBatch<'_>) -> Statement<DB>;
}

/// The settle statements of a database that reads each list from one JSON text bind (MySQL's
/// `JSON_TABLE`, SQLite's `json_each`): marking binds the delivered positions then the
/// settle's time, deleting the positions alone, scheduling retries their list, and
/// dead-lettering their list then the settle's time.
pub struct JsonListOutcomes<'a, Now, At> {
    mark_delivered: &'a Arc<str>,
    delete_delivered: &'a Arc<str>,
    schedule_retry: &'a Arc<str>,
    dead_letter: &'a Arc<str>,
    now: Now,
    retry_at: At,
}

impl<'a, Now, At> JsonListOutcomes<'a, Now, At> {
    /// The table's rendered statements for delivered events (`[mark_delivered,
    /// delete_delivered]`) and for failed ones (`[schedule_retry, dead_letter]`); `now` is the
    /// settle's time as the database stores it, and `retry_at` encodes a retry's next attempt
    /// as its `schedule_retry` reads it from the JSON.
    pub fn new(
        delivered: [&'a Arc<str>; 2],
        failed: [&'a Arc<str>; 2],
        now: Now,
        retry_at: At,
    ) -> Self {
        let [mark_delivered, delete_delivered] = delivered;
        let [schedule_retry, dead_letter] = failed;
        Self {
            mark_delivered,
            delete_delivered,
            schedule_retry,
            dead_letter,
            now,
            retry_at,
        }
    }
}

/// A rendered statement of a database crate's query set (its only dynamic parts are
/// validated, quoted identifiers), ready for its binds.
fn rendered<DB: Database>(sql: &Arc<str>) -> Statement<DB> {
    sqlx::query(sqlx::AssertSqlSafe(Arc::clone(sql)))
}

impl<DB, Now, At> OutcomeStatements<DB> for JsonListOutcomes<'_, Now, At>
where
    DB: Database,
    Now: Copy + for<'t> Encode<'t, DB> + Type<DB>,
    At: Fn(OffsetDateTime) -> JsonValue,
    String: for<'t> Encode<'t, DB> + Type<DB>,
{
    fn mark_delivered(&self, batch: &SettledBatch<'_>) -> Statement<DB> {
        rendered(self.mark_delivered)
            .bind(batch.delivered_json())
            .bind(self.now)
    }

    fn delete_delivered(&self, batch: &SettledBatch<'_>) -> Statement<DB> {
        rendered(self.delete_delivered).bind(batch.delivered_json())
    }

    fn schedule_retry(&self, batch: &SettledBatch<'_>) -> Statement<DB> {
        rendered(self.schedule_retry).bind(batch.retries_json(&self.retry_at))
    }

    fn dead_letter(&self, batch: &SettledBatch<'_>) -> Statement<DB> {
        rendered(self.dead_letter)
            .bind(batch.dead_json())
            .bind(self.now)
    }
}

/// A settle statement that failed: what it was doing (`"scheduling retries"`, …) and the
/// database's error.
#[derive(Debug)]
pub struct StepFailed {
    /// The step, worded as the context of a source error.
    pub step: &'static str,
    /// What the database answered.
    pub error: sqlx::Error,
}

/// Records `batch` on `conn` (the claim's or settle's open transaction): one statement per
/// outcome kind that has events, delivered first (marked or deleted, per `on_delivered`),
/// then retries, then dead letters. Stops at the first statement that fails.
pub async fn record_outcomes<C, S>(
    conn: &mut C,
    statements: &S,
    on_delivered: OnDelivered,
    batch: &SettledBatch<'_>,
) -> Result<(), StepFailed>
where
    C: Connection,
    <C::Database as Database>::Arguments: IntoArguments<C::Database>,
    S: OutcomeStatements<C::Database>,
    for<'c> &'c mut C: Executor<'c, Database = C::Database>,
{
    if !batch.delivered.is_empty() {
        let delivered = match on_delivered {
            OnDelivered::Mark => statements.mark_delivered(batch),
            OnDelivered::Delete => statements.delete_delivered(batch),
        };
        run(delivered, conn, "recording delivered events").await?;
    }
    if !batch.retries.is_empty() {
        run(statements.schedule_retry(batch), conn, "scheduling retries").await?;
    }
    if !batch.dead.is_empty() {
        run(statements.dead_letter(batch), conn, "dead-lettering events").await?;
    }
    Ok(())
}

async fn run<C>(
    statement: Statement<C::Database>,
    conn: &mut C,
    step: &'static str,
) -> Result<(), StepFailed>
where
    C: Connection,
    <C::Database as Database>::Arguments: IntoArguments<C::Database>,
    for<'c> &'c mut C: Executor<'c, Database = C::Database>,
{
    match statement.execute(conn).await {
        Ok(_) => Ok(()),
        Err(error) => Err(StepFailed { step, error }),
    }
}

/// The event of a claimed row, from the columns every database's claim returns first:
/// position (0), id (1), aggregate type (2), aggregate id (3), event type (4), payload (5),
/// headers (6), created at (7), attempts (8). The headers are stored each database's own way
/// (JSON, JSON text): the caller reads column 6 and passes them, decoded.
pub fn claimed_event<C: Columns>(
    row: &C,
    headers: Vec<(String, String)>,
) -> Result<Event, C::Error> {
    Ok(Event {
        position: Position(row.long(0)?),
        id: row.id(1)?,
        aggregate_type: row.text(2)?,
        aggregate_id: row.text(3)?,
        event_type: row.text(4)?,
        payload: row.bytes(5)?.into(),
        headers,
        created_at: row.time(7)?,
        attempts: u32::try_from(row.int(8)?).unwrap_or(0),
    })
}

/// A claimed row's column that does not decode as `what`.
pub fn invalid_column(what: &str, e: impl std::fmt::Display) -> sqlx::Error {
    sqlx::Error::Decode(format!("outbox row: invalid {what}: {e}").into())
}

/// Binds `event`'s columns to `query` in the order of every database's insert: id, aggregate
/// type, aggregate id, event type, payload, headers. The id and the headers come as the
/// database stores them (a `uuid` or hyphenated text; JSON or JSON text); a database whose
/// insert takes more (SQLite's creation time) binds it after.
pub fn bind_new_event<'q, DB, Id, Headers>(
    query: Query<'q, DB, <DB as Database>::Arguments>,
    id: Id,
    event: &NewEvent,
    headers: Headers,
) -> Query<'q, DB, <DB as Database>::Arguments>
where
    DB: Database,
    Id: for<'t> Encode<'t, DB> + Type<DB>,
    Headers: for<'t> Encode<'t, DB> + Type<DB>,
    for<'t> &'t str: Encode<'t, DB> + Type<DB>,
    for<'t> &'t [u8]: Encode<'t, DB> + Type<DB>,
{
    query
        .bind(id)
        .bind(event.aggregate_type.as_str())
        .bind(event.aggregate_id.as_str())
        .bind(event.event_type.as_str())
        .bind(&event.payload[..])
        .bind(headers)
}
