//! Checking one `[[capture]]` entry before anything changes: the table is a table of the
//! outbox's database, its columns are there, the payload column's type can be given, and the
//! trigger names are free or this capture's own.

use outbox_core::Identifier;
use outbox_core::capture::rows;
use outbox_core::capture::{
    CaptureEntry, CaptureError, Dialect, TableColumn, TableKind, check_columns, check_table,
    payload_type_error, row_object,
};
use sqlx::MySql;
use sqlx::pool::PoolConnection;

use super::{COLUMNS, MySqlCapture, db};

/// Payload column types (`DATA_TYPE`) given as text in UTF-8, and as bytes.
const TEXT_TYPES: [&str; 7] = [
    "json",
    "char",
    "varchar",
    "tinytext",
    "text",
    "mediumtext",
    "longtext",
];
const BINARY_TYPES: [&str; 6] = [
    "binary",
    "varbinary",
    "tinyblob",
    "blob",
    "mediumblob",
    "longblob",
];

/// One entry, checked: what to install.
#[derive(Debug)]
pub(super) struct Plan<'a> {
    pub(super) entry: CaptureEntry<'a>,
    pub(super) table: Identifier,
    /// The row payload's `JSON_OBJECT(...)`, or `None` for a payload column.
    pub(super) row: Option<String>,
    /// The payload column holds bytes (given as they are).
    pub(super) binary: bool,
}

impl MySqlCapture {
    /// Checks one entry: the table (in the outbox's database), its columns, the payload
    /// column's type, and that the trigger names are free or this capture's own.
    pub(super) async fn check<'a>(
        &self,
        conn: &mut PoolConnection<MySql>,
        entry: CaptureEntry<'a>,
        context: &str,
    ) -> Result<Plan<'a>, CaptureError> {
        let config = entry.config;
        let database: String = sqlx::query_scalar("SELECT CAST(DATABASE() AS CHAR)")
            .fetch_one(&mut **conn)
            .await
            .map_err(db(context))?;
        if let Some(schema) = &config.table.schema
            && schema.as_str() != database
        {
            return Err(CaptureError::invalid(
                entry.key("table"),
                format!(
                    "`{}`: MySQL captures tables of the outbox's own database ({database}) only; name the table alone",
                    config.table
                ),
            ));
        }
        let table = config.table.table.clone();
        let kind = match Self::kind(conn, table.as_str(), context).await?.as_deref() {
            None => TableKind::Missing,
            Some("BASE TABLE") if table == self.outbox => TableKind::Outbox,
            Some("BASE TABLE") => TableKind::Table,
            Some(kind) => TableKind::Other(format!("a {}", kind.to_lowercase())),
        };
        check_table(entry, table.as_str(), kind, &self.database)?;
        let found: Vec<(String, String, String)> = sqlx::query_as(COLUMNS)
            .bind(table.as_str())
            .fetch_all(&mut **conn)
            .await
            .map_err(db(context))?;
        let columns: Vec<TableColumn> = found
            .iter()
            .map(|(name, ty, _)| TableColumn {
                name: name.clone(),
                type_name: ty.clone(),
            })
            .collect();
        let data_type = |name: &str| {
            found
                .iter()
                .find(|(n, _, _)| n == name)
                .map(|(_, _, t)| t.to_ascii_lowercase())
                .unwrap_or_default()
        };
        let (row, binary) = match check_columns(entry, table.as_str(), &columns)? {
            Some(c) if BINARY_TYPES.contains(&data_type(&c.name).as_str()) => (None, true),
            Some(c) if TEXT_TYPES.contains(&data_type(&c.name).as_str()) => (None, false),
            Some(c) => {
                return Err(payload_type_error(
                    entry,
                    table.as_str(),
                    c,
                    "json, a text type (char, varchar, text, ...) or a binary type (binary, varbinary, blob, ...)",
                ));
            }
            // Binary columns as hex text (JSON holds no bytes); the rest as JSON_OBJECT
            // gives them (numbers, strings, a json column as JSON).
            None => (
                Some(row_object(
                    Dialect::MySql,
                    "JSON_OBJECT",
                    entry,
                    table.as_str(),
                    &columns,
                    |c, col| {
                        if BINARY_TYPES.contains(&data_type(&c.name).as_str()) {
                            format!("HEX({col})")
                        } else {
                            col.to_owned()
                        }
                    },
                )?),
                false,
            ),
        };
        let mut catalog = self.catalog(conn, context);
        let ours = rows::recorded_row(&mut catalog, &config.name()).await?;
        rows::check_names_free(&mut catalog, entry, ours.is_some()).await?;
        Ok(Plan {
            entry,
            table,
            row,
            binary,
        })
    }
}
