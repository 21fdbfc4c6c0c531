//! The CDC source's statements, rendered once for one outbox table.

use outbox_core::Identifier;

use crate::sql::render;

outbox_sql::query_set! {
    /// See the `.sql` files under `queries/cdc_*`.
    pub(crate) struct CdcQueries;
    fn new(table: &Identifier), rendered by |sql| render(sql, table);
    files "cdc_" {
        position_table, position_init, position_load, position_save, dead_letter,
        dead_aggregates, dead_of_aggregate, retention_delete_batch, dead_count, retention_count,
        dead_parked_select, put_back_seqs, restream, put_back_delivered, put_back_aggregates,
    }
}
