//! The CDC source's statements, rendered once for one outbox table.

use outbox_core::Identifier;

use crate::sql::render;

outbox_sql::query_set! {
    /// See the `.sql` files under `queries/cdc_*`.
    pub(crate) struct CdcQueries;
    fn new(table: &Identifier), rendered by |sql| render(sql, table);
    files {
        position_table = "cdc_position_table",
        position_init = "cdc_position_init",
        position_load = "cdc_position_load",
        position_save = "cdc_position_save",
        dead_letter = "cdc_dead_letter",
        dead_aggregates = "cdc_dead_aggregates",
        dead_of_aggregate = "cdc_dead_of_aggregate",
        retention_delete_batch = "cdc_retention_delete_batch",
        dead_count = "cdc_dead_count",
        retention_count = "cdc_retention_count",
        dead_parked_select = "cdc_dead_parked_select",
        put_back_seqs = "cdc_put_back_seqs",
        restream = "cdc_restream",
        put_back_delivered = "cdc_put_back_delivered",
        put_back_aggregates = "cdc_put_back_aggregates",
    }
}
