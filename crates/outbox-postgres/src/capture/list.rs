//! `outbox capture list` on PostgreSQL: the capture functions of the outbox's schema, with
//! their records and triggers.

use outbox_core::capture::{CaptureError, CaptureOp, InstalledCapture};

use super::{LIST, PgCapture, Record, db};

impl PgCapture {
    /// The captures writing into this outbox table, by name.
    pub async fn list(&self) -> Result<Vec<InstalledCapture>, CaptureError> {
        type Row = (
            String,
            Option<String>,
            Option<String>,
            Option<String>,
            bool,
            bool,
            bool,
        );
        let context = format!("listing captures into outbox table {}", self.outbox);
        // In a transaction: through a transaction pooler a statement outside one may be
        // split across server connections.
        let mut tx = self.pool.begin().await.map_err(db(&context))?;
        let rows: Vec<Row> = crate::sql::query_as(LIST)
            .bind(self.schema().as_str())
            .fetch_all(&mut *tx)
            .await
            .map_err(db(&context))?;
        tx.commit().await.map_err(db(&context))?;
        let outbox = self.outbox.to_string();
        let mut out = Vec::new();
        for (function, record, trigger, table, on_insert, on_update, enabled) in rows {
            let Some(record) = Record::parse(record.as_deref()) else {
                continue;
            };
            if record.outbox != outbox {
                continue;
            }
            let mut on = Vec::new();
            if on_insert {
                on.push(CaptureOp::Insert);
            }
            if on_update {
                on.push(CaptureOp::Update);
            }
            out.push(InstalledCapture {
                name: record.config.name().to_string(),
                function: format!("{}.{function}", self.schema()),
                table,
                trigger,
                on,
                enabled,
                config: Some(record.config),
            });
        }
        Ok(out)
    }
}
