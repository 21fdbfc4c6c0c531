//! The CDC queries, rendered once for one outbox table and publication.
//!
//! Placeholders go through [`crate::sql::render_with`] like every other query; the
//! publication is one more validated, double-quoted [`Identifier`] (`{{publication}}`).

use outbox_core::{Identifier, QualifiedTable};

use crate::sql::render_with;

macro_rules! query_file {
    ($name:literal) => {
        include_str!(concat!("../../queries/", $name, ".sql"))
    };
}

/// The slot as the server sees it; `$1` = slot name.
pub(crate) const SLOT_STATUS: &str = query_file!("replication_slot_status");
/// Creates the slot; `$1` = slot name.
pub(crate) const SLOT_CREATE: &str = query_file!("replication_slot_create");
/// Creates it as a PostgreSQL 17 failover slot; `$1` slot.
pub(crate) const SLOT_CREATE_FAILOVER: &str = query_file!("replication_slot_create_failover");
/// The publication's state; `$1` publication, `$2` schema, `$3` table.
pub(crate) const PUBLICATION_STATUS: &str = query_file!("publication_status");
/// Lets the outbox trigger keep a given `seq` for the rest of the transaction (migration 0005).
pub(crate) const KEEP_SEQ: &str = "SELECT set_config('outbox.keep_seq', 'on', true)";
/// Whether the transactions `$1` (xids) are visible to a new snapshot.
pub(crate) const TRANSACTION_VISIBLE: &str = query_file!("transaction_visible");

outbox_sql::query_set! {
    /// Every table-bound CDC query, rendered.
    pub(crate) struct CdcQueries;
    fn new(table: &QualifiedTable, publication: &Identifier),
        rendered by |sql| render_with(sql, table, &[("publication", publication)]);
    files "outbox_cdc_" {
        dead_letter, dead_insert, dead_aggregates, dead_of_aggregate, put_back_aggregates,
        put_back_of_aggregate, put_back_delivered, restream, aggregate_lock, park, backlog,
        offset_read, offset_save, offset_init, offset_claim, recovery_begin, recovery_after,
        recovery_rows, recovery_done, positions_read,
    }
    files "outbox_" {
        publication_create, publication_add_table, positions_advance,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_cdc_query_renders_with_quoted_identifiers_only() {
        let table = QualifiedTable::new(
            Some(Identifier::new("app").expect("valid")),
            Identifier::new("events").expect("valid"),
        );
        let q = CdcQueries::new(&table, &Identifier::new("pub1").expect("valid"));
        for (file, sql) in q.all() {
            assert!(!sql.contains("{{"), "{file}: {sql}");
        }
        assert!(
            q.publication_create
                .contains("CREATE PUBLICATION \"pub1\" FOR TABLE \"app\".\"events\"")
        );
    }
}
