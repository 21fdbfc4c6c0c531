//! The CDC source's statements, rendered once for one outbox table.

use std::sync::Arc;

use outbox_core::Identifier;

use crate::sql::render;

/// See the `.sql` files under `queries/cdc_*`.
#[derive(Debug, Clone)]
pub(crate) struct CdcQueries {
    pub(crate) position_table: Arc<str>,
    pub(crate) position_init: Arc<str>,
    pub(crate) position_load: Arc<str>,
    pub(crate) position_save: Arc<str>,
    pub(crate) dead_letter: Arc<str>,
    pub(crate) dead_aggregates: Arc<str>,
    pub(crate) dead_of_aggregate: Arc<str>,
    pub(crate) retention_delete_batch: Arc<str>,
    pub(crate) dead_count: Arc<str>,
    pub(crate) retention_count: Arc<str>,
    pub(crate) dead_parked_select: Arc<str>,
    pub(crate) put_back_seqs: Arc<str>,
    pub(crate) restream: Arc<str>,
    pub(crate) put_back_delivered: Arc<str>,
    pub(crate) put_back_aggregates: Arc<str>,
}

impl CdcQueries {
    pub(crate) fn new(table: &Identifier) -> Self {
        let r = |sql: &str| -> Arc<str> { render(sql, table).into() };
        Self {
            position_table: r(include_str!("../../queries/cdc_position_table.sql")),
            position_init: r(include_str!("../../queries/cdc_position_init.sql")),
            position_load: r(include_str!("../../queries/cdc_position_load.sql")),
            position_save: r(include_str!("../../queries/cdc_position_save.sql")),
            dead_letter: r(include_str!("../../queries/cdc_dead_letter.sql")),
            dead_aggregates: r(include_str!("../../queries/cdc_dead_aggregates.sql")),
            dead_of_aggregate: r(include_str!("../../queries/cdc_dead_of_aggregate.sql")),
            retention_delete_batch: r(include_str!("../../queries/cdc_retention_delete_batch.sql")),
            dead_count: r(include_str!("../../queries/cdc_dead_count.sql")),
            retention_count: r(include_str!("../../queries/cdc_retention_count.sql")),
            dead_parked_select: r(include_str!("../../queries/cdc_dead_parked_select.sql")),
            put_back_seqs: r(include_str!("../../queries/cdc_put_back_seqs.sql")),
            restream: r(include_str!("../../queries/cdc_restream.sql")),
            put_back_delivered: r(include_str!("../../queries/cdc_put_back_delivered.sql")),
            put_back_aggregates: r(include_str!("../../queries/cdc_put_back_aggregates.sql")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_cdc_statement_renders_backquoted() {
        let q = CdcQueries::new(&Identifier::new("events").expect("valid"));
        for sql in [
            &q.position_table,
            &q.position_init,
            &q.position_load,
            &q.position_save,
            &q.dead_letter,
            &q.dead_aggregates,
            &q.dead_of_aggregate,
            &q.retention_delete_batch,
            &q.dead_count,
            &q.retention_count,
            &q.dead_parked_select,
            &q.put_back_seqs,
            &q.restream,
            &q.put_back_delivered,
            &q.put_back_aggregates,
        ] {
            assert!(!sql.contains("{{") && sql.contains("`events"), "{sql}");
        }
    }
}
