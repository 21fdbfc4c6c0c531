//! What each database supplies to [`SqlInbox`](super::SqlInbox).

use futures::future::BoxFuture;
use outbox_core::QualifiedTable;
use outbox_core::migration::Migration;
use sqlx::database::HasStatementCache;
use sqlx::{Database, Encode, Type};
use time::OffsetDateTime;
use uuid::Uuid;

/// The per-database part of the inbox: constants, the `.sql` templates, two encodings
/// and the lock hooks of `migrate`.
#[allow(unreachable_pub)] // reachable as the sealed supertrait of `Dialect`
pub trait Engine: Database + HasStatementCache {
    /// The public name of the inbox type, for `Debug`.
    const INBOX: &'static str;
    /// The schema of a table given without one (`None`: the database has no schemas or
    /// uses the connection's).
    const DEFAULT_SCHEMA: Option<&'static str>;
    /// The migrations of the inbox tables, in order.
    const MIGRATIONS: &'static [Migration];
    /// `queries/<db>/processed_events_insert.sql`: consumer, event id, now.
    const INSERT: &'static str;
    /// `queries/<db>/processed_events_purge.sql`: cutoff, batch size.
    const PURGE: &'static str;
    /// `queries/<db>/processed_events_contains.sql`: consumer, event id.
    const CONTAINS: &'static str;
    /// `queries/<db>/positions_advance.sql`: consumer, aggregate type and id, seq.
    const POSITIONS_ADVANCE: &'static str;
    /// `queries/<db>/positions_read.sql`: consumer, aggregate type and id.
    const POSITIONS_READ: &'static str;
    /// `queries/<db>/migrations_prepare.sql`, raw SQL: the bookkeeping table.
    const MIGRATIONS_PREPARE: &'static str;
    /// `queries/<db>/migrations_applied.sql`: `(version, checksum)` rows.
    const MIGRATIONS_APPLIED: &'static str;
    /// `queries/<db>/migrations_record.sql`: version, name, checksum.
    const MIGRATIONS_RECORD: &'static str;
    /// The statement that opens an inbox transaction (`None`: sqlx's `BEGIN`).
    const BEGIN: Option<&'static str> = None;
    /// Single reads and writes on the pool (`contains`, `applied_position`, each purge
    /// batch, the order gate's `pass`) run in an explicit transaction.
    const TRANSACTION_PER_CALL: bool = false;
    /// `migrate` runs in one transaction (else on one session, with each migration
    /// idempotent, as DDL commits on its own).
    const MIGRATE_IN_TRANSACTION: bool = true;
    /// The insert returns a row when it inserted and none for a duplicate (`ON
    /// CONFLICT DO NOTHING RETURNING 1`); else a duplicate is an error recognized by
    /// [`is_duplicate_key`](Self::is_duplicate_key).
    const INSERT_RETURNS: bool = true;
    /// `positions_advance.sql` takes the seq a second time (for its update clause).
    const ADVANCE_SEQ_TWICE: bool = false;

    /// The event id as the `event_id` column stores it.
    type Id: for<'q> Encode<'q, Self> + Type<Self> + Send + 'static;
    /// A point in time as the timestamp columns store it.
    type Time: for<'q> Encode<'q, Self> + Type<Self> + Send + 'static;

    /// The event id, encoded.
    fn id(id: Uuid) -> Self::Id;
    /// A point in time, encoded.
    fn time(at: OffsetDateTime) -> Self::Time;
    /// Fills the placeholders of one of this database's `.sql` files for `table`.
    fn render(template: &str, table: &QualifiedTable) -> String;

    /// The rows a statement changed (sqlx has no generic accessor).
    fn rows_affected(result: &Self::QueryResult) -> u64;

    /// Whether `e` is the insert's duplicate-key error (when not
    /// [`INSERT_RETURNS`](Self::INSERT_RETURNS)).
    fn is_duplicate_key(_e: &sqlx::Error) -> bool {
        false
    }

    /// Takes `migrate`'s lock for table `name` on `conn` (in migrate's transaction when
    /// [`MIGRATE_IN_TRANSACTION`](Self::MIGRATE_IN_TRANSACTION)); returns what
    /// [`unlock_migrate`](Self::unlock_migrate) needs.
    fn lock_migrate<'c>(
        _conn: &'c mut Self::Connection,
        _name: &'c str,
        _persistent: bool,
    ) -> BoxFuture<'c, Result<Option<String>, sqlx::Error>> {
        Box::pin(async { Ok(None) })
    }

    /// Releases a session lock taken by [`lock_migrate`](Self::lock_migrate).
    fn unlock_migrate(_conn: &mut Self::Connection, _lock: String) -> BoxFuture<'_, ()> {
        Box::pin(async {})
    }
}
