//! Installing checked captures: each capture's triggers replaced under `LOCK TABLES`
//! ([`MySqlCapture::apply`]), the entries recorded in one transaction, and on a failure the
//! triggers put back as they were (`SHOW CREATE TRIGGER`).

use outbox_core::Identifier;
use outbox_core::capture::rows;
use outbox_core::capture::{
    CaptureError, CaptureOp, CaptureRecord, op_trigger_name, recorded, trigger_identifiers,
};
use sqlx::pool::PoolConnection;
use sqlx::{Executor, MySql};

use super::check::Plan;
use super::lock::lock_or_db;
use super::{MySqlCapture, RECORD_UPSERT, TRIGGER_OF, TRIGGER_SQL, backquote, db};

/// A trigger as it was before this run replaced it, to put back on failure.
pub(super) struct Saved {
    trigger: String,
    create: Option<String>,
}

impl MySqlCapture {
    /// Records every installed entry, in one transaction.
    pub(super) async fn record(
        &self,
        conn: &mut PoolConnection<MySql>,
        plans: &[Plan<'_>],
        context: &str,
    ) -> Result<(), CaptureError> {
        let mut tx = sqlx::Connection::begin(&mut **conn)
            .await
            .map_err(db(context))?;
        for plan in plans {
            let config = plan.entry.config;
            sqlx::query(self.sql(RECORD_UPSERT))
                .bind(config.name().as_str())
                .bind(plan.table.as_str())
                .bind(CaptureRecord::new(self.outbox.to_string(), config).to_json())
                .execute(&mut *tx)
                .await
                .map_err(db(format!("{context}: recording it")))?;
        }
        tx.commit().await.map_err(db(context))
    }

    /// Puts the triggers this run changed back as they were: drops the new ones, recreates
    /// the replaced ones. Best effort: a failure here is logged, the original error stands.
    pub(super) async fn undo(&self, conn: &mut PoolConnection<MySql>, saved: &[Saved]) {
        for s in saved.iter().rev() {
            let drop = format!("DROP TRIGGER IF EXISTS `{}`", s.trigger);
            if let Err(e) = conn.execute(sqlx::AssertSqlSafe(drop)).await {
                tracing::error!(trigger = %s.trigger, error = %e, "undoing a failed capture install: dropping the trigger failed");
            }
            if let Some(create) = &s.create
                && let Err(e) = conn.execute(sqlx::AssertSqlSafe(create.clone())).await
            {
                tracing::error!(trigger = %s.trigger, error = %e, "undoing a failed capture install: restoring the trigger failed");
            }
        }
    }

    /// `SHOW CREATE TRIGGER` of `trigger`, if it exists.
    async fn create_statement(
        conn: &mut PoolConnection<MySql>,
        trigger: &str,
        context: &str,
    ) -> Result<Option<String>, CaptureError> {
        let exists: Option<String> = sqlx::query_scalar(TRIGGER_OF)
            .bind(trigger)
            .fetch_optional(&mut **conn)
            .await
            .map_err(db(context))?;
        if exists.is_none() {
            return Ok(None);
        }
        // A trigger name read from the catalog and equal to one built from a validated
        // identifier: safe to backquote.
        let row = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SHOW CREATE TRIGGER `{trigger}`"
        )))
        .fetch_one(&mut **conn)
        .await
        .map_err(db(context))?;
        let create: String = sqlx::Row::try_get(&row, 2).map_err(db(context))?;
        Ok(Some(create))
    }

    /// Replaces one capture's triggers under `LOCK TABLES ... WRITE` (no writer commits
    /// between the drop and the create), remembering in `saved` what it changed.
    pub(super) async fn apply(
        &self,
        conn: &mut PoolConnection<MySql>,
        plan: &Plan<'_>,
        saved: &mut Vec<Saved>,
        context: &str,
    ) -> Result<String, CaptureError> {
        let config = plan.entry.config;
        let name = config.name();
        let table = &plan.table;
        let context = format!("{context}: capture `{name}` on {table}");
        let before = self.recorded(conn, &name, &context).await?;
        let mut old = Vec::new();
        for op in [CaptureOp::Insert, CaptureOp::Update] {
            let trigger = op_trigger_name(&name, op);
            let create = Self::create_statement(conn, &trigger, &context).await?;
            old.push(Saved { trigger, create });
        }
        // Every table holding one of the triggers, and the new one.
        let mut locked = vec![table.clone()];
        if let Some((t, _)) = &before
            && t != table.as_str()
            && let Ok(t) = Identifier::new(t.as_str())
        {
            locked.push(t);
        }
        let lock = format!(
            "LOCK TABLES {}",
            locked
                .iter()
                .map(|t| format!("`{t}` WRITE"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        conn.execute(sqlx::AssertSqlSafe(lock))
            .await
            .map_err(lock_or_db(format!("{context}: locking the table")))?;
        let named = trigger_identifiers(
            config,
            [("captured_table", table), ("outbox_table", &self.outbox)],
        );
        let mut spec = TRIGGER_SQL;
        if plan.binary {
            spec.payload_column = "NEW.{{payload_column}}";
        }
        // From here on every trigger of this capture is in `saved`: undo puts them back.
        saved.extend(old);
        for op in [CaptureOp::Insert, CaptureOp::Update] {
            let sql = backquote(recorded::drop_trigger(&name, op));
            conn.execute(sqlx::AssertSqlSafe(sql))
                .await
                .map_err(db(format!("{context}: dropping the old trigger")))?;
        }
        let mut triggers = Vec::new();
        for op in config.ops() {
            let sql = spec.render(plan.entry, op, table.as_str(), plan.row.as_deref(), &named)?;
            let trigger = op_trigger_name(&name, op);
            conn.execute(sqlx::AssertSqlSafe(sql))
                .await
                .map_err(db(format!("{context}: creating trigger {trigger}")))?;
            triggers.push(trigger);
        }
        conn.execute("UNLOCK TABLES").await.map_err(db(&context))?;
        let before = before.as_ref().map(|(t, _)| t.as_str());
        let outbox = self.outbox.as_str();
        let line = rows::installed_line(config, before, &triggers, table.as_str(), outbox);
        Ok(line)
    }
}
