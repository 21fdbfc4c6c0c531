//! `[source]` settings for MySQL and MariaDB (`kind = "mysql"`).

use std::time::Duration;

use outbox_core::Identifier;
pub use outbox_core::redact::DatabaseUrl;
use serde::Deserialize;

/// How the relay reads the outbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// Claim batches with `FOR UPDATE SKIP LOCKED`, polling adaptively.
    #[default]
    Poll,
    /// Read the row-based binlog (one streaming relay; others stand by).
    Cdc,
}

pub use outbox_core::backend::OnDelivered;

/// How the polling relay claims a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum ClaimMode {
    /// `skip-locked` when the server has it (MySQL 8.0.4+, MariaDB 10.6+), else `lease`.
    #[default]
    Auto,
    /// `SELECT … FOR UPDATE SKIP LOCKED` in a transaction held while the batch is published.
    SkipLocked,
    /// A claim token and expiry written on the rows (`claimed_by`, `claimed_until`), for
    /// servers without `SKIP LOCKED`; no transaction is held while publishing. A relay that
    /// dies leaves its rows claimed until `claim_timeout` passes.
    Lease,
}

/// MySQL / MariaDB source settings.
#[derive(Debug, Clone, PartialEq, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct MySqlConfig {
    /// Connection URL, e.g. `mysql://app@127.0.0.1:3306/app`; the database is the URL's path.
    /// Env: `OUTBOX_DATABASE_URL`.
    pub url: DatabaseUrl,
    /// Name of the outbox table (in the URL's database).
    #[serde(default = "default_table")]
    pub table: Identifier,
    /// `poll` (default) or `cdc`.
    #[serde(default)]
    pub mode: Mode,
    /// `mark` (default) or `delete` delivered rows.
    #[serde(default)]
    pub on_delivered: OnDelivered,
    /// `auto` (default), `skip-locked` or `lease`: see [`ClaimMode`].
    #[serde(default)]
    pub claim: ClaimMode,
    /// Connections in the relay's pool (one per worker, plus one for status and metrics).
    #[serde(default)]
    pub max_connections: Option<u32>,
    /// A claim transaction idle longer than this is ended by the server (MariaDB
    /// `idle_transaction_timeout`; MySQL `wait_timeout` on the relay's own connections),
    /// which frees its events for other replicas if this relay hangs; with `claim = "lease"`,
    /// how long a claim's lease lasts. Must exceed `relay.publish_timeout`.
    #[serde(default = "default_claim_timeout", with = "humantime_serde")]
    pub claim_timeout: Duration,
    /// How long to wait for a connection (and for the database at start).
    #[serde(default = "default_connect_timeout", with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// CDC mode: the server id the binlog session registers with (unique among the server's
    /// replicas and binlog readers). Default: a random one per start.
    #[serde(default)]
    pub server_id: Option<u32>,
    /// CDC mode: events of one open transaction held in memory; at this many the transaction
    /// goes to a scratch file, read back in batches after its commit (docs/mysql.md).
    #[serde(default = "default_spill_after_events")]
    pub spill_after_events: usize,
    /// CDC mode: the same, as an estimate of those events' size in memory, in bytes.
    #[serde(default = "default_spill_after_bytes")]
    pub spill_after_bytes: u64,
    /// CDC mode: the directory of the scratch files; default the OS temporary directory.
    #[serde(default)]
    pub spill_dir: Option<std::path::PathBuf>,
}

fn default_table() -> Identifier {
    Identifier::new("outbox").expect("valid")
}
fn default_claim_timeout() -> Duration {
    Duration::from_secs(60)
}
fn default_connect_timeout() -> Duration {
    Duration::from_secs(10)
}
fn default_spill_after_events() -> usize {
    outbox_core::spill::DEFAULT_AFTER_EVENTS
}
fn default_spill_after_bytes() -> u64 {
    outbox_core::spill::DEFAULT_AFTER_BYTES
}

impl MySqlConfig {
    /// `claim_timeout` in the whole seconds the server's idle limits take (`wait_timeout`,
    /// `idle_transaction_timeout`), rounded up: the server must not end a session before the
    /// relay's claim on it ends, so `2.5s` is 3, never 2.
    pub fn claim_timeout_secs(&self) -> u64 {
        let whole = self.claim_timeout.as_secs();
        (whole + u64::from(self.claim_timeout.subsec_nanos() > 0)).max(1)
    }

    /// Settings with every default and the given URL.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: DatabaseUrl::new(url),
            table: default_table(),
            mode: Mode::Poll,
            on_delivered: OnDelivered::Mark,
            claim: ClaimMode::Auto,
            max_connections: None,
            claim_timeout: default_claim_timeout(),
            connect_timeout: default_connect_timeout(),
            server_id: None,
            spill_after_events: default_spill_after_events(),
            spill_after_bytes: default_spill_after_bytes(),
            spill_dir: None,
        }
    }

    /// CDC mode: when a large open transaction goes to a scratch file.
    pub fn spill_settings(&self) -> outbox_core::spill::SpillSettings {
        outbox_core::spill::SpillSettings {
            after_events: self.spill_after_events,
            after_bytes: self.spill_after_bytes,
            dir: self.spill_dir.clone(),
        }
    }

    /// Checks what serde cannot; the error names the key.
    pub fn validate(&self) -> Result<(), String> {
        let url = self.url.expose();
        let Some(rest) = url
            .strip_prefix("mysql://")
            .or_else(|| url.strip_prefix("mariadb://"))
        else {
            return Err(format!(
                "source.url: `{}` is not a MySQL URL (expected mysql://user@host:port/database)",
                self.url.redacted()
            ));
        };
        let path = rest.split(['?', '#']).next().unwrap_or_default();
        let database = path.split_once('/').map(|(_, db)| db).unwrap_or_default();
        if database.is_empty() {
            return Err(format!(
                "source.url: `{}` names no database (expected mysql://user@host:port/database)",
                self.url.redacted()
            ));
        }
        if self.server_id == Some(0) {
            return Err("source.server_id: must be at least 1".into());
        }
        if self.claim_timeout < Duration::from_secs(1) {
            return Err("source.claim_timeout: must be at least 1s".into());
        }
        if self.mode == Mode::Cdc {
            self.spill_settings().validate()?;
        }
        Ok(())
    }

    /// The URL to connect with (`mariadb://` is accepted as a spelling of `mysql://`).
    /// True when the URL's host is this machine (`localhost`, `127.0.0.0/8`, `::1`, or a
    /// Unix socket), where an unencrypted connection exposes nothing.
    pub(crate) fn is_loopback(&self) -> bool {
        use std::str::FromStr as _;
        let Ok(options) = sqlx::mysql::MySqlConnectOptions::from_str(&self.connect_url()) else {
            return false;
        };
        if options.get_socket().is_some() {
            return true;
        }
        let host = options.get_host().trim_matches(['[', ']']);
        host.eq_ignore_ascii_case("localhost")
            || host
                .parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback())
    }

    pub(crate) fn connect_url(&self) -> String {
        let url = self.url.expose();
        match url.strip_prefix("mariadb://") {
            Some(rest) => format!("mysql://{rest}"),
            None => url.to_owned(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_servers_idle_limit_never_ends_before_the_claim() {
        let mut c = MySqlConfig::new("mysql://x/db");
        for (claim, secs) in [
            (2_000, 2),
            (2_500, 3),
            (1_000, 1),
            (60_000, 60),
            (59_001, 60),
        ] {
            c.claim_timeout = Duration::from_millis(claim);
            assert_eq!(c.claim_timeout_secs(), secs, "claim_timeout {claim} ms");
        }
    }

    #[test]
    fn defaults_unknown_keys_and_urls() {
        let c: MySqlConfig =
            toml::from_str("url = \"mysql://app:pw@127.0.0.1:3306/app\"").expect("valid config");
        assert_eq!(c, MySqlConfig::new("mysql://app:pw@127.0.0.1:3306/app"));
        assert!(c.validate().is_ok());
        assert!(!format!("{c:?}").contains("pw"), "{c:?}");
        let err = toml::from_str::<MySqlConfig>("url = \"mysql://h/db\"\ntabel = \"o\"")
            .expect_err("unknown key");
        assert!(err.to_string().contains("unknown field `tabel`"), "{err}");
        let err = toml::from_str::<MySqlConfig>("url = \"mysql://h/db\"\ntable = \"o; drop\"")
            .expect_err("bad identifier");
        assert!(err.to_string().contains("not a plain identifier"), "{err}");
        for (url, says) in [
            ("postgres://h/db", "not a MySQL URL"),
            ("mysql://app:secret@h:3306", "names no database"),
            ("mysql://app:secret@h:3306/?x=1", "names no database"),
        ] {
            let err = MySqlConfig::new(url).validate().expect_err(url);
            assert!(err.contains(says) && err.starts_with("source.url"), "{err}");
            assert!(!err.contains("secret"), "{err}");
        }
        let mut c = MySqlConfig::new("mariadb://h/db");
        assert_eq!(c.connect_url(), "mysql://h/db");
        c.mode = Mode::Cdc;
        assert!(c.validate().is_ok());
        c.server_id = Some(0);
        assert!(
            c.validate()
                .expect_err("server id")
                .starts_with("source.server_id")
        );
        c.server_id = None;
        c.spill_after_bytes = 0;
        assert!(
            c.validate()
                .expect_err("spill")
                .starts_with("source.spill_after_bytes:")
        );
        c.mode = Mode::Poll;
        assert!(c.validate().is_ok(), "spill keys matter in CDC mode only");
    }
}
