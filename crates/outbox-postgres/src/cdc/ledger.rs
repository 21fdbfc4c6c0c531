//! The PostgreSQL side of the shared stream ledger ([`outbox_core::stream_ledger`]): what
//! each event remembers for dead-lettering.

use outbox_core::Event;

/// Where an event came from, which decides how it is dead-lettered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Origin {
    /// A row of the outbox table: dead-lettering updates the row.
    Row {
        /// The row's per-aggregate commit order.
        seq: i64,
        /// A dead letter put back in line by `outbox dead retry`, not delivered since.
        put_back: bool,
    },
    /// A `pg_logical_emit_message` event: dead-lettering inserts a row.
    Message,
}

/// What the ledger keeps with each event.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Meta {
    pub(crate) origin: Origin,
    /// Its transaction's id in the database.
    pub(crate) xid: u32,
}

pub(crate) type Entry = outbox_core::stream_ledger::Entry<Meta>;
pub(crate) type Ledger = outbox_core::stream_ledger::Ledger<Meta>;

impl Meta {
    /// The row's seq (`None` for a table-less event).
    pub(crate) fn seq(&self) -> Option<i64> {
        match self.origin {
            Origin::Row { seq, .. } => Some(seq),
            Origin::Message => None,
        }
    }

    /// Whether this is a dead letter put back in line and not delivered since.
    pub(crate) fn put_back(&self) -> bool {
        matches!(self.origin, Origin::Row { put_back: true, .. })
    }
}

/// A committed transaction's events with their metadata.
pub(crate) fn with_meta(events: Vec<(Event, Origin)>, xid: u32) -> Vec<(Event, Meta)> {
    events
        .into_iter()
        .map(|(event, origin)| (event, Meta { origin, xid }))
        .collect()
}
