//! The captures recorded in `<outbox>_capture` and their triggers, read and removed over
//! one connection: the MySQL side of [`RowCatalog`].

use outbox_core::Identifier;
use outbox_core::capture::rows::{self, RowCatalog};
use outbox_core::capture::{CaptureError, CaptureRecord};
use sqlx::pool::PoolConnection;
use sqlx::{Executor, MySql, MySqlConnection};

use super::lock::lock_or_db;
use super::{MySqlCapture, RECORD_DELETE, RECORD_LIST, RECORD_READ, TRIGGER_OF, backquote, db};

impl MySqlCapture {
    /// The recorded table and record of capture `name`, if installed.
    pub(super) async fn recorded(
        &self,
        conn: &mut PoolConnection<MySql>,
        name: &Identifier,
        context: &str,
    ) -> Result<Option<(String, Option<CaptureRecord>)>, CaptureError> {
        rows::recorded_row(&mut self.catalog(conn, context), name).await
    }

    /// The captures of this outbox table over `conn`, `context` naming the command.
    pub(super) fn catalog<'c>(
        &'c self,
        conn: &'c mut MySqlConnection,
        context: &'c str,
    ) -> Catalog<'c> {
        Catalog {
            capture: self,
            conn,
            context,
        }
    }
}

/// This outbox table's captures over one connection.
pub(super) struct Catalog<'c> {
    capture: &'c MySqlCapture,
    conn: &'c mut MySqlConnection,
    /// What the command does, for error messages.
    context: &'c str,
}

impl RowCatalog for Catalog<'_> {
    fn outbox(&self) -> &str {
        self.capture.outbox.as_str()
    }

    async fn has_records(&mut self) -> Result<bool, CaptureError> {
        let table = format!("{}_capture", self.capture.outbox);
        let kind = MySqlCapture::kind(&mut *self.conn, &table, self.context).await?;
        Ok(kind.is_some())
    }

    async fn record(
        &mut self,
        name: &Identifier,
    ) -> Result<Option<(String, String)>, CaptureError> {
        let read = sqlx::query_as(self.capture.sql(RECORD_READ)).bind(name.as_str());
        read.fetch_optional(&mut *self.conn)
            .await
            .map_err(db(self.context))
    }

    async fn records(&mut self) -> Result<Vec<(String, String)>, CaptureError> {
        let all = sqlx::query_as(self.capture.sql(RECORD_LIST));
        all.fetch_all(&mut *self.conn)
            .await
            .map_err(db(self.context))
    }

    async fn trigger_table(&mut self, trigger: &str) -> Result<Option<String>, CaptureError> {
        let on = sqlx::query_scalar(TRIGGER_OF).bind(trigger);
        on.fetch_optional(&mut *self.conn)
            .await
            .map_err(db(self.context))
    }

    async fn execute(&mut self, sql: String, what: &str) -> Result<(), CaptureError> {
        let what = format!("{}: {what}", self.context);
        let sql = sqlx::AssertSqlSafe(backquote(sql));
        self.conn.execute(sql).await.map_err(lock_or_db(what))?;
        Ok(())
    }

    async fn delete_record(&mut self, name: &Identifier) -> Result<(), CaptureError> {
        let delete = sqlx::query(self.capture.sql(RECORD_DELETE)).bind(name.as_str());
        delete
            .execute(&mut *self.conn)
            .await
            .map_err(db(self.context))?;
        Ok(())
    }
}
