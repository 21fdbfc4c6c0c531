//! The CDC queries, rendered once for one outbox table and publication.
//!
//! Placeholders go through [`crate::sql::render_with`] like every other query; the
//! publication is one more validated, double-quoted [`Identifier`] (`{{publication}}`).

use std::sync::Arc;

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

/// Every table-bound CDC query, rendered.
#[derive(Debug, Clone)]
pub(crate) struct CdcQueries {
    pub(crate) dead_letter: Arc<str>,
    pub(crate) dead_insert: Arc<str>,
    pub(crate) dead_aggregates: Arc<str>,
    pub(crate) dead_of_aggregate: Arc<str>,
    pub(crate) put_back_aggregates: Arc<str>,
    pub(crate) put_back_of_aggregate: Arc<str>,
    pub(crate) put_back_delivered: Arc<str>,
    pub(crate) restream: Arc<str>,
    pub(crate) aggregate_lock: Arc<str>,
    pub(crate) park: Arc<str>,
    pub(crate) backlog: Arc<str>,
    pub(crate) publication_create: Arc<str>,
    pub(crate) publication_add_table: Arc<str>,
    pub(crate) offset_read: Arc<str>,
    pub(crate) offset_save: Arc<str>,
    pub(crate) offset_init: Arc<str>,
    pub(crate) offset_claim: Arc<str>,
    pub(crate) recovery_begin: Arc<str>,
    pub(crate) recovery_after: Arc<str>,
    pub(crate) recovery_rows: Arc<str>,
    pub(crate) recovery_done: Arc<str>,
    pub(crate) positions_read: Arc<str>,
    pub(crate) positions_advance: Arc<str>,
}

impl CdcQueries {
    pub(crate) fn new(table: &QualifiedTable, publication: &Identifier) -> Self {
        let r =
            |t: &str| -> Arc<str> { render_with(t, table, &[("publication", publication)]).into() };
        Self {
            dead_letter: r(query_file!("outbox_cdc_dead_letter")),
            dead_insert: r(query_file!("outbox_cdc_dead_insert")),
            dead_aggregates: r(query_file!("outbox_cdc_dead_aggregates")),
            dead_of_aggregate: r(query_file!("outbox_cdc_dead_of_aggregate")),
            put_back_aggregates: r(query_file!("outbox_cdc_put_back_aggregates")),
            put_back_of_aggregate: r(query_file!("outbox_cdc_put_back_of_aggregate")),
            put_back_delivered: r(query_file!("outbox_cdc_put_back_delivered")),
            restream: r(query_file!("outbox_cdc_restream")),
            aggregate_lock: r(query_file!("outbox_cdc_aggregate_lock")),
            park: r(query_file!("outbox_cdc_park")),
            backlog: r(query_file!("outbox_cdc_backlog")),
            publication_create: r(query_file!("outbox_publication_create")),
            publication_add_table: r(query_file!("outbox_publication_add_table")),
            offset_read: r(query_file!("outbox_cdc_offset_read")),
            offset_save: r(query_file!("outbox_cdc_offset_save")),
            offset_init: r(query_file!("outbox_cdc_offset_init")),
            offset_claim: r(query_file!("outbox_cdc_offset_claim")),
            recovery_begin: r(query_file!("outbox_cdc_recovery_begin")),
            recovery_after: r(query_file!("outbox_cdc_recovery_after")),
            recovery_rows: r(query_file!("outbox_cdc_recovery_rows")),
            recovery_done: r(query_file!("outbox_cdc_recovery_done")),
            positions_read: r(query_file!("outbox_cdc_positions_read")),
            positions_advance: r(query_file!("outbox_positions_advance")),
        }
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
        for sql in [
            &q.dead_letter,
            &q.dead_insert,
            &q.dead_aggregates,
            &q.dead_of_aggregate,
            &q.put_back_aggregates,
            &q.put_back_of_aggregate,
            &q.put_back_delivered,
            &q.restream,
            &q.aggregate_lock,
            &q.park,
            &q.backlog,
            &q.publication_create,
            &q.publication_add_table,
            &q.offset_read,
            &q.offset_save,
            &q.offset_init,
            &q.offset_claim,
            &q.recovery_begin,
            &q.recovery_after,
            &q.recovery_rows,
            &q.recovery_done,
            &q.positions_read,
            &q.positions_advance,
        ] {
            assert!(!sql.contains("{{"), "{sql}");
        }
        assert!(
            q.publication_create
                .contains("CREATE PUBLICATION \"pub1\" FOR TABLE \"app\".\"events\"")
        );
    }
}
