//! The [`Ledger`] of a window as a SQL database's outbox table reports it (`outbox verify`),
//! assembled once: the delivered rows and the counts its queries returned, and the note of a
//! table that deletes rows on delivery.

use crate::verify::{Basis, Ledger, LedgerEvent, deleted_on_delivery_note};

/// The ledger of outbox table `table` on `basis`: its `delivered` rows, the `undelivered` and
/// `dead` counts as the database returned them (a negative count reads as 0), and `notes`,
/// to which [`deleted_on_delivery_note`] is added when the basis is [`Basis::Deleted`].
pub fn table_ledger(
    table: &str,
    basis: Basis,
    delivered: Vec<LedgerEvent>,
    (undelivered, dead): (i64, i64),
    mut notes: Vec<String>,
) -> Ledger {
    if basis == Basis::Deleted {
        notes.push(deleted_on_delivery_note(table));
    }
    Ledger {
        basis,
        delivered,
        undelivered: count(undelivered),
        dead: count(dead),
        notes,
    }
}

fn count(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}
