//! `outbox doctor` for MySQL: the server version, the connection's encryption, in CDC mode
//! the binlog settings, replication privileges and the kept position, then the schema, the
//! relay's privileges on the outbox table and the backlog.

use outbox_core::admin::{DoctorCheck, DoctorThresholds};
use outbox_core::backend::{SchemaFixes, schema_check};
use time::OffsetDateTime;

use super::MySqlBackend;
use crate::cdc::{MySqlCdcInspector, binlog_problems, replication_check};
use crate::migrate::{SCHEMA_VERSION, schema_version};
use crate::server::{server_version, session_tls};

/// What `outbox doctor` says to do about the outbox table's schema.
const SCHEMA_FIXES: SchemaFixes = SchemaFixes {
    migrate: "run `outbox migrate`",
    unreadable: "check the privileges of source.url's user (SELECT on the outbox tables)",
};

impl MySqlBackend {
    pub(super) async fn checks(&self, thresholds: DoctorThresholds) -> Vec<DoctorCheck> {
        let table = &self.config.table;
        let mut out = Vec::new();
        match server_version(&self.pool).await {
            Ok(v) => out.push(match v.check_polling() {
                Ok(()) => DoctorCheck::ok("server", v.text.clone()),
                Err(why) => {
                    DoctorCheck::red("server", why, "upgrade to MySQL 8.0.4+ or MariaDB 10.6+")
                }
            }),
            Err(e) => {
                out.push(DoctorCheck::red(
                    "server",
                    format!(
                        "cannot read the server version: {}",
                        outbox_core::relay::ErrorChain(&e)
                    ),
                    "check source.url",
                ));
                return out;
            }
        }
        out.push(self.transport().await);
        if self.cdc() {
            out.push(self.binlog_check().await);
        }
        let found = schema_version(&self.pool, table)
            .await
            .map_err(|e| outbox_core::relay::ErrorChain(&e).to_string());
        if !schema_check(&mut out, table, found, SCHEMA_VERSION, SCHEMA_FIXES) {
            return out;
        }
        out.push(self.privileges().await);
        if self.cdc() {
            self.cdc_checks(&mut out).await;
            return out;
        }
        out.extend(outbox_core::backend::backlog_or_red(
            self.admin.backlog_at(OffsetDateTime::now_utc()).await,
            thresholds.stuck_after,
            "is a relay running and reaching the broker? `outbox status` shows held aggregates; `outbox why ID` explains one event",
            "run `outbox migrate`",
        ));
        out
    }

    /// CDC mode: the server's binlog settings (checked before the schema: they do not depend
    /// on it, and a refused `migrate` names them).
    async fn binlog_check(&self) -> DoctorCheck {
        match binlog_problems(&self.pool).await {
            Ok(problems) if problems.is_empty() => DoctorCheck::ok(
                "binlog",
                "log_bin ON, binlog_format ROW, binlog_row_image FULL",
            ),
            Ok(problems) => DoctorCheck::red(
                "binlog",
                problems.join("; "),
                "set them in the server's config and restart it (docs/mysql.md, CDC)",
            ),
            Err(e) => DoctorCheck::red(
                "binlog",
                format!(
                    "cannot read the binlog settings: {}",
                    outbox_core::relay::ErrorChain(&e)
                ),
                "check source.url",
            ),
        }
    }

    /// CDC mode: replication privileges, the kept position and its binlog file.
    async fn cdc_checks(&self, out: &mut Vec<DoctorCheck>) {
        out.push(replication_check(&self.pool, &self.config).await);
        let inspector = MySqlCdcInspector::new(self.pool.clone(), &self.config);
        out.push(inspector.retention_check(OffsetDateTime::now_utc()).await);
        match inspector.position_lines().await {
            Ok(lines) if lines.iter().any(|l| l.contains("none kept")) => {
                out.push(DoctorCheck::red(
                    "cdc_position",
                    "no binlog position is kept for this outbox",
                    "run `outbox migrate` with source.mode = \"cdc\"",
                ))
            }
            Ok(lines) => out.push(DoctorCheck::ok(
                "cdc_position",
                lines
                    .iter()
                    .take(2)
                    .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
                    .collect::<Vec<_>>()
                    .join("; "),
            )),
            Err(e) => out.push(DoctorCheck::red(
                "cdc_position",
                format!("cannot read the CDC position: {e}"),
                "grant REPLICATION CLIENT (MySQL) or BINLOG MONITOR (MariaDB) to source.url's user",
            )),
        }
    }

    /// Whether the relay's connections are encrypted: fine either way on loopback, a
    /// warning when a plain connection crosses a network.
    async fn transport(&self) -> DoctorCheck {
        match session_tls(&self.pool).await {
            Ok(Some(tls)) => DoctorCheck::ok("connection", format!("TLS ({tls})")),
            Ok(None) if self.config.is_loopback() => {
                DoctorCheck::ok("connection", "not encrypted (loopback)")
            }
            Ok(None) => DoctorCheck::warn(
                "connection",
                "not encrypted: passwords and events cross the network in clear",
                "add ?ssl-mode=verify_identity&ssl-ca=/path/ca.pem to source.url (docs/mysql.md, TLS)",
            ),
            Err(e) => DoctorCheck::red(
                "connection",
                format!(
                    "cannot read the session's TLS status: {}",
                    outbox_core::relay::ErrorChain(&e)
                ),
                "check source.url",
            ),
        }
    }

    /// Whether source.url's user may do what the relay does to the outbox table: `EXPLAIN`
    /// of each statement kind checks the privilege (roles included) without running it.
    async fn privileges(&self) -> DoctorCheck {
        let table = self.admin_table();
        let mut missing = Vec::new();
        for (privilege, statement) in [
            (
                "SELECT",
                format!("EXPLAIN SELECT position FROM {table} WHERE position = 0"),
            ),
            (
                "UPDATE",
                format!("EXPLAIN UPDATE {table} SET state = state WHERE position = 0"),
            ),
            (
                "DELETE",
                format!("EXPLAIN DELETE FROM {table} WHERE position = 0"),
            ),
        ] {
            // The table name is a validated, quoted identifier; nothing else varies.
            match sqlx::query(sqlx::AssertSqlSafe(statement))
                .fetch_all(&self.pool)
                .await
            {
                Ok(_) => {}
                Err(sqlx::Error::Database(db))
                    if db
                        .try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
                        .is_some_and(|m| m.number() == 1142) =>
                {
                    missing.push(privilege);
                }
                Err(e) => {
                    return DoctorCheck::red(
                        "privileges",
                        format!(
                            "cannot check the privileges: {}",
                            outbox_core::relay::ErrorChain(&e)
                        ),
                        "check source.url",
                    );
                }
            }
        }
        if missing.is_empty() {
            return DoctorCheck::ok(
                "privileges",
                format!("SELECT, UPDATE, DELETE on {}", self.config.table),
            );
        }
        DoctorCheck::red(
            "privileges",
            format!(
                "source.url's user lacks {} on outbox table {}: the relay cannot {}",
                missing.join(", "),
                self.config.table,
                if missing.contains(&"SELECT") {
                    "read events"
                } else {
                    "record deliveries"
                }
            ),
            format!(
                "GRANT SELECT, UPDATE, DELETE ON <database>.{} TO <user>",
                self.config.table
            ),
        )
    }

    /// The outbox table, quoted for MySQL (rendered from the validated identifier).
    fn admin_table(&self) -> String {
        crate::sql::render("{{table}}", &self.config.table)
    }
}
