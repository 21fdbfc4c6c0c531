//! `[source]` settings for SQLite (`kind = "sqlite"`), the embedded default.

use std::path::{Path, PathBuf};
use std::time::Duration;

use outbox_core::Identifier;
use serde::{Deserialize, Deserializer};

pub use outbox_core::backend::OnDelivered;

/// How hard SQLite works to make a commit survive a power loss (`PRAGMA synchronous`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum Synchronous {
    /// `NORMAL` (default): in WAL mode a commit is written to the WAL but not flushed to disk
    /// until the next checkpoint. A killed process (`kill -9`, a panic) loses nothing; a power
    /// loss or OS crash may undo the last transactions, business rows and their events
    /// together. An event the relay published just before such a crash may then belong to a
    /// transaction that no longer exists. Several times the commit rate of `full`.
    #[default]
    Normal,
    /// `FULL`: every commit is flushed (fsync) before it returns, so a published event's
    /// transaction survives a power loss too.
    Full,
}

/// SQLite source settings.
#[derive(Debug, Clone, PartialEq, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct SqliteConfig {
    /// Database file, created if missing. Also accepted as `url` (`sqlite://outbox.db`,
    /// `sqlite:outbox.db` or a plain path), so `OUTBOX_DATABASE_URL` can point at a file.
    #[serde(default = "default_path", alias = "url", deserialize_with = "de_path")]
    pub path: PathBuf,
    /// Name of the outbox table.
    #[serde(default = "default_table")]
    pub table: Identifier,
    /// `mark` (default) or `delete` delivered rows.
    #[serde(default)]
    pub on_delivered: OnDelivered,
    /// How long a statement waits for another connection's write lock before failing with
    /// "database is locked" (`PRAGMA busy_timeout`). SQLite runs one writer at a time. The
    /// relay source waits as long for its settle transactions, trying every millisecond.
    #[serde(default = "default_busy_timeout", with = "humantime_serde")]
    pub busy_timeout: Duration,
    /// Durability of commits: `normal` (default) or `full`; see [`Synchronous`].
    #[serde(default)]
    pub synchronous: Synchronous,
    /// Lifetime of the relay lease. Only the lease holder claims events; a second relay on
    /// the same file waits as a standby and takes over once the holder has not renewed the
    /// lease for this long (it died or hung) or released it (it stopped). The holder renews it
    /// on its fetches, at most once a second. After a crash (`kill -9`) the next relay starts
    /// delivering within this time. Keep it longer than `relay.publish_timeout`: a publish
    /// that outlasts the lease lets a standby take over and publish the same events again
    /// (duplicates, never loss). Default 45s.
    #[serde(default = "default_lease_ttl", with = "humantime_serde")]
    pub lease_ttl: Duration,
}

fn default_path() -> PathBuf {
    PathBuf::from("outbox.db")
}
fn default_table() -> Identifier {
    Identifier::new("outbox").expect("valid")
}
fn default_busy_timeout() -> Duration {
    Duration::from_secs(5)
}
fn default_lease_ttl() -> Duration {
    Duration::from_secs(45)
}

/// Accepts a plain path or a `sqlite:` / `sqlite://` URL (its query string, if any, is
/// refused rather than silently dropped).
fn de_path<'de, D: Deserializer<'de>>(d: D) -> Result<PathBuf, D::Error> {
    let s = String::deserialize(d)?;
    parse_path(&s).map_err(serde::de::Error::custom)
}

fn parse_path(s: &str) -> Result<PathBuf, String> {
    let path = s
        .strip_prefix("sqlite://")
        .or_else(|| s.strip_prefix("sqlite:"))
        .unwrap_or(s);
    if path.contains('?') {
        return Err(format!(
            "`{s}`: URL options are not supported; configure the SQLite source with its own keys"
        ));
    }
    if path.is_empty() {
        return Err("the database path must not be empty".to_owned());
    }
    Ok(PathBuf::from(path))
}

impl Default for SqliteConfig {
    /// `outbox.db` in the working directory, table `outbox`.
    fn default() -> Self {
        Self::new(default_path())
    }
}

impl SqliteConfig {
    /// Settings with every default and the given database file.
    pub fn new(path: impl AsRef<Path>) -> Self {
        Self {
            path: path.as_ref().to_owned(),
            table: default_table(),
            on_delivered: OnDelivered::Mark,
            busy_timeout: default_busy_timeout(),
            synchronous: Synchronous::Normal,
            lease_ttl: default_lease_ttl(),
        }
    }

    /// Checks what serde cannot; the error names the key.
    pub fn validate(&self) -> Result<(), String> {
        if self.path.as_os_str().is_empty() {
            return Err("source.path: must not be empty".into());
        }
        if self.path.to_str() == Some(":memory:") {
            return Err(
                "source.path: `:memory:` cannot be shared between producers and the relay; use a file"
                    .into(),
            );
        }
        if self.lease_ttl < Duration::from_secs(1) {
            return Err("source.lease_ttl: must be at least 1s".into());
        }
        Ok(())
    }
}

/// `config` with the scratch outbox table `tag` and a lease of [`outbox_core::backend::SCRATCH_CLAIM_TIMEOUT`].
pub(crate) fn scratch_config(
    config: &SqliteConfig,
    tag: &Identifier,
) -> Result<SqliteConfig, String> {
    outbox_core::scratch::scratch_config(tag, SqliteConfig::validate, |table| {
        Ok(SqliteConfig {
            table,
            lease_ttl: outbox_core::backend::SCRATCH_CLAIM_TIMEOUT,
            ..config.clone()
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_the_embedded_setup() {
        let c: SqliteConfig = toml::from_str("").expect("empty config");
        assert_eq!(c, SqliteConfig::default());
        assert_eq!(c.path, PathBuf::from("outbox.db"));
        assert_eq!(c.table.as_str(), "outbox");
        assert_eq!(c.busy_timeout, Duration::from_secs(5));
        assert!(c.validate().is_ok());
    }

    #[test]
    fn a_url_is_accepted_in_place_of_the_path() {
        for (input, path) in [
            ("url = \"sqlite://data/app.db\"", "data/app.db"),
            ("url = \"sqlite:app.db\"", "app.db"),
            ("path = \"/var/lib/app.db\"", "/var/lib/app.db"),
        ] {
            let c: SqliteConfig = toml::from_str(input).expect(input);
            assert_eq!(c.path, PathBuf::from(path), "{input}");
        }
        let err = toml::from_str::<SqliteConfig>("url = \"sqlite://a.db?mode=rwc\"")
            .expect_err("options");
        assert!(err.to_string().contains("not supported"), "{err}");
    }

    #[test]
    fn unknown_keys_and_sql_in_table_names_are_refused() {
        let err = toml::from_str::<SqliteConfig>("tabel = \"o\"").expect_err("unknown key");
        assert!(err.to_string().contains("unknown field `tabel`"), "{err}");
        let err = toml::from_str::<SqliteConfig>("table = \"o; drop table x\"")
            .expect_err("bad identifier");
        assert!(err.to_string().contains("not a plain identifier"), "{err}");
    }

    #[test]
    fn durations_are_humantime_and_checked() {
        let c: SqliteConfig = toml::from_str(
            "busy_timeout = \"250ms\"\nlease_ttl = \"500ms\"\non_delivered = \"delete\"",
        )
        .expect("valid toml");
        assert_eq!(c.busy_timeout, Duration::from_millis(250));
        assert_eq!(c.on_delivered, OnDelivered::Delete);
        assert_eq!(
            c.validate(),
            Err("source.lease_ttl: must be at least 1s".to_owned())
        );
    }
}
