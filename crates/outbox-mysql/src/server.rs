//! What the server is, and whether it has what the relay needs.

/// A server's product and version, from `SELECT VERSION()`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerVersion {
    /// MariaDB (else MySQL).
    pub mariadb: bool,
    /// Major, minor, patch.
    pub number: (u32, u32, u32),
    /// As the server reported it.
    pub text: String,
}

impl ServerVersion {
    /// Parses `VERSION()`: `10.11.19-MariaDB-0+deb12u1`, `8.0.36`, `8.4.0-log`.
    pub fn parse(text: &str) -> Option<Self> {
        let numeric = text.split(['-', '+']).next()?;
        let mut parts = numeric.split('.').map(|p| p.parse::<u32>().ok());
        let number = (
            parts.next()??,
            parts.next()??,
            parts.next().flatten().unwrap_or(0),
        );
        Some(Self {
            mariadb: text.contains("MariaDB"),
            number,
            text: text.to_owned(),
        })
    }

    /// `SELECT ... FOR UPDATE SKIP LOCKED`: MySQL 8.0.1+, MariaDB 10.6+.
    pub fn has_skip_locked(&self) -> bool {
        if self.mariadb {
            self.number >= (10, 6, 0)
        } else {
            self.number >= (8, 0, 1)
        }
    }

    /// `JSON_TABLE`, which the relay's statements use: MySQL 8.0.4+, MariaDB 10.6+.
    pub fn has_json_table(&self) -> bool {
        if self.mariadb {
            self.number >= (10, 6, 0)
        } else {
            self.number >= (8, 0, 4)
        }
    }

    /// What the lease-token claim needs (`JSON_VALID` in the table's check constraint,
    /// `RANDOM_BYTES` in its trigger): MySQL 5.7.8+, MariaDB 10.2.7+.
    pub fn check_lease(&self) -> Result<(), String> {
        let ok = if self.mariadb {
            self.number >= (10, 2, 7)
        } else {
            self.number >= (5, 7, 8)
        };
        if ok {
            return Ok(());
        }
        Err(format!(
            "the server is {} {}; outbox needs MySQL 5.7.8+ or MariaDB 10.2.7+",
            if self.mariadb { "MariaDB" } else { "MySQL" },
            self.text
        ))
    }

    /// What the `SKIP LOCKED` claim needs, or why this server cannot run it.
    pub fn check_polling(&self) -> Result<(), String> {
        if self.has_skip_locked() && self.has_json_table() {
            return Ok(());
        }
        Err(format!(
            "the server is {} {}; the polling relay needs `FOR UPDATE SKIP LOCKED` and `JSON_TABLE` \
             (MySQL 8.0.4+ or MariaDB 10.6+); set source.claim = \"lease\" (or \"auto\") for older servers",
            if self.mariadb { "MariaDB" } else { "MySQL" },
            self.text
        ))
    }
}

/// Reads the server's version.
pub async fn server_version(pool: &sqlx::MySqlPool) -> Result<ServerVersion, sqlx::Error> {
    let text: String = sqlx::query_scalar("SELECT VERSION()")
        .fetch_one(pool)
        .await?;
    ServerVersion::parse(&text)
        .ok_or_else(|| sqlx::Error::Protocol(format!("unrecognised server version `{text}`")))
}

/// How one of the pool's connections is protected: the TLS version and cipher the server
/// reports for the session (`Ssl_version`, `Ssl_cipher`), `None` when it is not encrypted.
pub(crate) async fn session_tls(pool: &sqlx::MySqlPool) -> Result<Option<String>, sqlx::Error> {
    let rows: Vec<(String, String)> =
        sqlx::query_as("SHOW SESSION STATUS WHERE Variable_name IN ('Ssl_version', 'Ssl_cipher')")
            .fetch_all(pool)
            .await?;
    let value = |name: &str| {
        rows.iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.clone())
            .filter(|v| !v.is_empty())
    };
    Ok(
        value("Ssl_version").map(|version| match value("Ssl_cipher") {
            Some(cipher) => format!("{version}, {cipher}"),
            None => version,
        }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_parse_and_gate_the_polling_relay() {
        let maria = ServerVersion::parse("10.11.19-MariaDB-0+deb12u1").expect("parses");
        assert!(maria.mariadb && maria.number == (10, 11, 19));
        assert!(maria.check_polling().is_ok());
        let old = ServerVersion::parse("10.5.23-MariaDB").expect("parses");
        let err = old.check_polling().expect_err("too old");
        assert!(
            err.contains("MariaDB 10.5.23") && err.contains("SKIP LOCKED"),
            "{err}"
        );
        assert!(
            ServerVersion::parse("8.0.36")
                .expect("parses")
                .check_polling()
                .is_ok()
        );
        assert!(
            ServerVersion::parse("8.4.0-log")
                .expect("parses")
                .check_polling()
                .is_ok()
        );
        assert!(
            ServerVersion::parse("5.7.44")
                .expect("parses")
                .check_polling()
                .is_err()
        );
        assert!(ServerVersion::parse("garbage").is_none());
    }
}
