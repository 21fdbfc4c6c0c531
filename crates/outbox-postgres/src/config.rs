//! `[source]` settings for PostgreSQL (`kind = "postgres"`).

use std::path::PathBuf;
use std::time::Duration;

use outbox_core::{Identifier, QualifiedTable};
use serde::Deserialize;

/// How the relay reads the outbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// Claim batches with `FOR UPDATE SKIP LOCKED`, polling adaptively.
    #[default]
    Poll,
    /// Stream inserts and `pg_logical_emit_message` events over logical replication
    /// (`pgoutput`); see `docs/cdc.md`.
    Cdc,
}

pub use outbox_core::backend::OnDelivered;

pub use outbox_core::redact::DatabaseUrl;

/// The URL with its password and secret parameters (`?password=`, `?sslpassword=`) replaced
/// by `***`: the workspace's one redaction function, [`outbox_core::redact::redact_url`].
pub fn redact(url: &str) -> String {
    outbox_core::redact::redact_url(url)
}

/// PostgreSQL source settings.
#[derive(Debug, Clone, PartialEq, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct PostgresConfig {
    /// Connection URL, e.g. `postgres://app@127.0.0.1:5432/app`. Env: `OUTBOX_DATABASE_URL`.
    pub url: DatabaseUrl,
    /// Schema of the outbox table.
    #[serde(default = "default_schema")]
    pub schema: Identifier,
    /// Name of the outbox table.
    #[serde(default = "default_table")]
    pub table: Identifier,
    /// `poll` (default) or `cdc`.
    #[serde(default)]
    pub mode: Mode,
    /// `mark` (default) or `delete` delivered rows.
    #[serde(default)]
    pub on_delivered: OnDelivered,
    /// Table layout: `none` (default), or `hourly` / `daily` / `weekly` range partitions on
    /// `created_at`, created by `migrate` and rotated by retention (polling mode only).
    #[serde(default)]
    pub partitioning: crate::Partitioning,
    /// Wake the relay with LISTEN/NOTIFY on insert (installs a statement trigger at
    /// `migrate`). Lowers idle latency; costs producers commit throughput. Default false.
    #[serde(default)]
    pub listen_notify: bool,
    /// `source.url` reaches PostgreSQL through a pooler in transaction mode (PgBouncer
    /// `pool_mode = transaction`, also before 1.21, which cannot carry prepared statements):
    /// no named prepared statements, no session state, every statement inside a transaction.
    /// Polling mode only; `listen_notify` and CDC need a direct connection. Default false.
    #[serde(default)]
    pub transaction_pooling: bool,
    /// Connections in the relay's pool (one per worker, plus one for status and metrics).
    #[serde(default)]
    pub max_connections: Option<u32>,
    /// A claim transaction idle longer than this is ended by the server
    /// (`idle_in_transaction_session_timeout`), which frees its events for other replicas if
    /// this relay hangs. Must exceed `relay.publish_timeout`.
    #[serde(default = "default_claim_timeout", with = "humantime_serde")]
    pub claim_timeout: Duration,
    /// Polling with ordering: replicas take turns at claiming (each claim waits, up to
    /// 100 ms, for another replica's batch to settle instead of colliding with it;
    /// docs/ordering.md). `false`: replicas claim concurrently, which can drain faster on a
    /// database host with idle cores when their batches rarely share aggregates, at more
    /// database work per event. Default true.
    #[serde(default = "default_claim_turns")]
    pub claim_turns: bool,
    /// How long to wait for a connection (and for the database at start).
    #[serde(default = "default_connect_timeout", with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// CDC: the logical replication slot (`pgoutput`) the relay streams from; created by
    /// `outbox migrate`. Lowercase letters, digits and `_` (a PostgreSQL slot name rule).
    #[serde(default = "default_slot")]
    pub slot: Identifier,
    /// CDC: the publication of the outbox table's inserts; created by `outbox migrate`.
    #[serde(default = "default_publication")]
    pub publication: Identifier,
    /// CDC: the prefix of `pg_logical_emit_message` events (table-less events) this relay
    /// delivers; messages with other prefixes are ignored.
    #[serde(default = "default_message_prefix")]
    pub message_prefix: String,
    /// CDC: events of one open transaction held in memory; at this many the transaction goes
    /// to a scratch file, read back in batches after its commit (docs/cdc.md).
    #[serde(default = "default_spill_after_events")]
    pub spill_after_events: usize,
    /// CDC: the same, as an estimate of those events' size in memory, in bytes.
    #[serde(default = "default_spill_after_bytes")]
    pub spill_after_bytes: u64,
    /// CDC: the directory of the scratch files; default the OS temporary directory.
    #[serde(default)]
    pub spill_dir: Option<PathBuf>,
    /// CDC: warn when the slot holds more WAL than this (bytes not yet confirmed).
    #[serde(default = "default_slot_lag_warn_bytes")]
    pub slot_lag_warn_bytes: u64,
    /// CDC: how often an idle stream reports its position to the server (and confirms the
    /// server's latest position when nothing is outstanding, so a quiet outbox does not make
    /// the slot retain WAL).
    #[serde(default = "default_heartbeat_interval", with = "humantime_serde")]
    pub heartbeat_interval: Duration,
    /// CDC: what the relay does when its slot is gone (a failover to a standby before
    /// PostgreSQL 17, a dropped or invalidated slot): recover by itself, or stop.
    #[serde(default)]
    pub on_slot_loss: OnSlotLoss,
    /// CDC: publish a transaction only once the synchronous standbys have flushed it, so
    /// that a failover cannot leave consumers with an event the new primary never had.
    #[serde(default)]
    pub wait_for_standby: WaitForStandby,
    /// CDC, PostgreSQL 17+: create the slot as a failover slot (`failover = true`), which the
    /// server synchronizes to standbys listed in `synchronized_standby_slots`.
    #[serde(default)]
    pub failover_slot: bool,
}

/// `source.wait_for_standby` (docs/cdc.md, "Failover").
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum WaitForStandby {
    /// On when the server has `synchronous_standby_names` set (read when streaming starts).
    #[default]
    Auto,
    /// Always: wait for the synchronous standbys.
    On,
    /// Never: publish what the primary has flushed.
    Off,
}

/// `source.on_slot_loss` (docs/cdc.md, "Failover").
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum OnSlotLoss {
    /// Create the slot again and publish from the table every event committed after the
    /// last acknowledged snapshot, then stream from the new slot.
    #[default]
    Recover,
    /// Exit with an error naming the lost slot; an operator recovers by hand.
    Stop,
}

fn default_schema() -> Identifier {
    Identifier::new("public").expect("valid")
}
fn default_table() -> Identifier {
    Identifier::new("outbox").expect("valid")
}
fn default_claim_turns() -> bool {
    true
}
fn default_claim_timeout() -> Duration {
    Duration::from_secs(60)
}
fn default_connect_timeout() -> Duration {
    Duration::from_secs(10)
}
fn default_slot() -> Identifier {
    Identifier::new("outbox_slot").expect("valid")
}
fn default_publication() -> Identifier {
    Identifier::new("outbox_pub").expect("valid")
}
fn default_message_prefix() -> String {
    "outbox".to_owned()
}
fn default_spill_after_events() -> usize {
    outbox_core::spill::DEFAULT_AFTER_EVENTS
}
fn default_spill_after_bytes() -> u64 {
    outbox_core::spill::DEFAULT_AFTER_BYTES
}
fn default_slot_lag_warn_bytes() -> u64 {
    1 << 30
}
fn default_heartbeat_interval() -> Duration {
    Duration::from_secs(10)
}

impl PostgresConfig {
    /// Settings with every default and the given URL.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: DatabaseUrl::new(url),
            schema: default_schema(),
            table: default_table(),
            mode: Mode::Poll,
            on_delivered: OnDelivered::Mark,
            partitioning: crate::Partitioning::None,
            listen_notify: false,
            transaction_pooling: false,
            max_connections: None,
            claim_timeout: default_claim_timeout(),
            claim_turns: default_claim_turns(),
            connect_timeout: default_connect_timeout(),
            slot: default_slot(),
            publication: default_publication(),
            message_prefix: default_message_prefix(),
            spill_after_events: default_spill_after_events(),
            spill_after_bytes: default_spill_after_bytes(),
            spill_dir: None,
            slot_lag_warn_bytes: default_slot_lag_warn_bytes(),
            heartbeat_interval: default_heartbeat_interval(),
            on_slot_loss: OnSlotLoss::Recover,
            wait_for_standby: WaitForStandby::Auto,
            failover_slot: false,
        }
    }

    /// The qualified outbox table.
    pub fn qualified_table(&self) -> QualifiedTable {
        QualifiedTable::new(Some(self.schema.clone()), self.table.clone())
    }

    /// CDC: when a large open transaction goes to a scratch file.
    pub fn spill_settings(&self) -> outbox_core::spill::SpillSettings {
        outbox_core::spill::SpillSettings {
            after_events: self.spill_after_events,
            after_bytes: self.spill_after_bytes,
            dir: self.spill_dir.clone(),
        }
    }

    /// Checks what serde cannot; the error names the key.
    pub fn validate(&self) -> Result<(), String> {
        if !(self.url.expose().starts_with("postgres://")
            || self.url.expose().starts_with("postgresql://"))
        {
            return Err(format!(
                "source.url: `{}` is not a PostgreSQL URL (postgres://user@host:port/db)",
                self.url.redacted()
            ));
        }
        if self.mode == Mode::Cdc {
            self.validate_cdc()?;
            if self.partitioning != crate::Partitioning::None {
                return Err(format!(
                    "source.partitioning: `{}` is supported in polling mode only (source.mode = \"poll\"); CDC streams a plain table",
                    self.partitioning.as_str()
                ));
            }
        }
        if self.transaction_pooling && self.mode == Mode::Cdc {
            return Err("source.transaction_pooling: CDC streams over a replication connection, which no transaction pooler carries; point source.url at PostgreSQL itself (the pooler can stay in front of the producers)".into());
        }
        if self.transaction_pooling && self.listen_notify {
            return Err("source.listen_notify: LISTEN needs a session of its own, which a transaction pooler does not keep; turn it off with source.transaction_pooling = true (the relay polls)".into());
        }
        if self.claim_timeout < Duration::from_secs(1) {
            return Err("source.claim_timeout: must be at least 1s".into());
        }
        Ok(())
    }

    fn validate_cdc(&self) -> Result<(), String> {
        let lowercase = |id: &Identifier| {
            id.as_str()
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        };
        if !lowercase(&self.slot) {
            return Err(format!(
                "source.slot: `{}` must use lowercase letters, digits and `_` only (PostgreSQL slot names)",
                self.slot
            ));
        }
        if !lowercase(&self.publication) {
            return Err(format!(
                "source.publication: `{}` must use lowercase letters, digits and `_` only",
                self.publication
            ));
        }
        if self.message_prefix.is_empty() || self.message_prefix.contains('\0') {
            return Err("source.message_prefix: must be a non-empty string without NUL".into());
        }
        self.spill_settings().validate()?;
        if self.heartbeat_interval < Duration::from_millis(100)
            || self.heartbeat_interval > Duration::from_secs(3600)
        {
            return Err("source.heartbeat_interval: must be between 100ms and 1h".into());
        }
        if self.slot_lag_warn_bytes == 0 {
            return Err("source.slot_lag_warn_bytes: must be greater than 0".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_never_print() {
        let url = DatabaseUrl::new("postgres://app:s3cret@db:5432/app");
        assert_eq!(format!("{url:?}"), "postgres://app:***@db:5432/app");
        assert_eq!(url.to_string(), "postgres://app:***@db:5432/app");
        assert_eq!(redact("postgres://app@db/app"), "postgres://app@db/app");
    }

    #[test]
    fn unknown_keys_and_sql_in_table_names_are_refused() {
        let err = toml::from_str::<PostgresConfig>("url = \"postgres://x\"\ntabel = \"o\"")
            .expect_err("unknown key");
        assert!(err.to_string().contains("unknown field `tabel`"), "{err}");
        let err =
            toml::from_str::<PostgresConfig>("url = \"postgres://x\"\ntable = \"o; drop table x\"")
                .expect_err("bad identifier");
        assert!(err.to_string().contains("not a plain identifier"), "{err}");
    }

    #[test]
    fn cdc_keys_have_defaults_and_are_validated() {
        let c: PostgresConfig =
            toml::from_str("url = \"postgres://x\"\nmode = \"cdc\"").expect("valid");
        assert_eq!(c.slot.as_str(), "outbox_slot");
        assert_eq!(c.publication.as_str(), "outbox_pub");
        assert_eq!(c.message_prefix, "outbox");
        assert_eq!(c.slot_lag_warn_bytes, 1 << 30);
        assert_eq!(c.heartbeat_interval, Duration::from_secs(10));
        assert_eq!(c.validate(), Ok(()));
        let upper = PostgresConfig {
            slot: Identifier::new("Outbox").expect("valid"),
            ..c.clone()
        };
        assert!(upper.validate().unwrap_err().starts_with("source.slot"));
        let empty = PostgresConfig {
            message_prefix: String::new(),
            ..c.clone()
        };
        assert!(
            empty
                .validate()
                .unwrap_err()
                .starts_with("source.message_prefix")
        );
        let c: PostgresConfig = toml::from_str(
            "url = \"postgres://x\"\nmode = \"cdc\"\nslot = \"s1\"\nheartbeat_interval = \"2s\"\nslot_lag_warn_bytes = 1024",
        )
        .expect("valid");
        assert_eq!(c.slot.as_str(), "s1");
        assert_eq!(c.heartbeat_interval, Duration::from_secs(2));
    }

    #[test]
    fn spill_keys_have_defaults_and_bad_values_name_the_key() {
        let cdc = "url = \"postgres://x\"\nmode = \"cdc\"\n";
        let c: PostgresConfig = toml::from_str(cdc).expect("valid");
        assert_eq!(
            c.spill_settings(),
            outbox_core::spill::SpillSettings::default()
        );
        let c: PostgresConfig =
            toml::from_str(&format!("{cdc}spill_after_events = 0")).expect("parses");
        assert!(
            c.validate()
                .unwrap_err()
                .starts_with("source.spill_after_events:")
        );
        let c: PostgresConfig =
            toml::from_str(&format!("{cdc}spill_dir = \"/nonexistent/spill\"")).expect("parses");
        assert!(c.validate().unwrap_err().starts_with("source.spill_dir:"));
    }
}
