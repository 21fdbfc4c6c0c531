//! The replication connection: built from the source URL, started on the slot (or refused
//! because another relay holds it), and closed with a final standby status update.

use std::sync::Arc;
use std::time::Duration;

use outbox_core::SourceError;
use pgwire_replication::{
    FeedbackObserver, Lsn, PgWireError, ReplicationClient, ReplicationConfig, ReplicationEvent,
    ReplicationMetrics, SslMode, TlsConfig,
};
use sqlx::postgres::PgConnectOptions;
use tokio::sync::watch;

use crate::config::PostgresConfig;

/// How often a raised confirmed position is reported while events flow. Small, so a crash
/// republishes little; the message is 34 bytes.
const STATUS_INTERVAL: Duration = Duration::from_millis(100);

/// Longest wait for the final standby status update on a clean shutdown.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(3);

/// Session settings that make pgoutput's text values unambiguous for the decoder.
const SESSION_OPTIONS: &str = "-c DateStyle=ISO -c TimeZone=UTC -c bytea_output=hex";

/// Why the stream could not start.
#[derive(Debug)]
pub(crate) enum OpenError {
    /// Another session streams from the slot: stand by and try again.
    Busy,
    /// Anything else, with its kind.
    Failed(SourceError),
}

/// Connection settings for the replication session, from the source URL.
#[derive(Clone)]
pub(crate) struct Endpoint {
    config: ReplicationConfig,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.config.display_connection())
    }
}

impl Endpoint {
    /// Reads host, port, user, password and database from `config.url`.
    pub(crate) fn new(config: &PostgresConfig) -> Result<Self, String> {
        let raw = config.url.expose();
        let options: PgConnectOptions = raw
            .parse()
            .map_err(|e| format!("source.url: cannot read `{}`: {e}", config.url.redacted()))?;
        let parsed = url::Url::parse(raw)
            .map_err(|e| format!("source.url: cannot read `{}`: {e}", config.url.redacted()))?;
        let password = parsed.password().map(percent_decode).unwrap_or_default();
        let socket = options.get_socket().is_some();
        let host = match options.get_socket() {
            Some(dir) => dir.display().to_string(),
            None => options.get_host().to_owned(),
        };
        let tls = tls_config(&parsed, socket, &host)?;
        let database = options
            .get_database()
            .unwrap_or(options.get_username())
            .to_owned();
        let replication = ReplicationConfig::new(
            host,
            options.get_username(),
            password,
            database,
            config.slot.as_str(),
            config.publication.as_str(),
        )
        .with_port(options.get_port())
        .with_start_lsn(Lsn::ZERO)
        .with_status_interval(STATUS_INTERVAL)
        .with_wakeup_interval(config.heartbeat_interval)
        .with_options(SESSION_OPTIONS)
        .with_application_name("outbox-cdc")
        .with_tls(tls);
        Ok(Self {
            config: replication,
        })
    }
}

/// The replication session's TLS, from the URL's libpq parameters (`sslmode`, `sslrootcert`,
/// `sslcert`, `sslkey`), so it is secured exactly like the relay's other connections. No
/// `sslmode` means `prefer`, as in libpq and sqlx; a Unix socket never uses TLS (as in libpq).
fn tls_config(url: &url::Url, socket: bool, host: &str) -> Result<TlsConfig, String> {
    let mut mode = None;
    let (mut ca, mut cert, mut key) = (None, None, None);
    for (name, value) in url.query_pairs() {
        match &*name {
            "sslmode" => mode = Some(value.into_owned()),
            "sslrootcert" => ca = Some(std::path::PathBuf::from(&*value)),
            "sslcert" => cert = Some(std::path::PathBuf::from(&*value)),
            "sslkey" => key = Some(std::path::PathBuf::from(&*value)),
            _ => {}
        }
    }
    if socket {
        return Ok(TlsConfig::disabled());
    }
    let mode = match mode.as_deref().unwrap_or("prefer") {
        "disable" => SslMode::Disable,
        "allow" | "prefer" => SslMode::Prefer,
        "require" => SslMode::Require,
        "verify-ca" => SslMode::VerifyCa,
        "verify-full" => SslMode::VerifyFull,
        other => {
            return Err(format!(
                "source.url: sslmode `{other}` is not one of disable, allow, prefer, require, verify-ca, verify-full"
            ));
        }
    };
    let mut tls = TlsConfig {
        mode,
        ca_pem_path: ca,
        ..TlsConfig::default()
    };
    // verify-full to an IP address checks the certificate's IP names, as libpq does (the
    // replication client refuses an IP host unless the name to verify is given explicitly).
    if mode == SslMode::VerifyFull && host.parse::<std::net::IpAddr>().is_ok() {
        tls = tls.with_sni_hostname(host);
    }
    match (cert, key) {
        (Some(cert), Some(key)) => tls = tls.with_client_cert(cert, key),
        (None, None) => {}
        _ => {
            return Err(
                "source.url: sslcert and sslkey go together (a client certificate and its key)"
                    .to_owned(),
            );
        }
    }
    Ok(tls)
}

/// A started replication session.
pub(crate) struct Stream {
    client: ReplicationClient,
    metrics: Arc<ReplicationMetrics>,
    reported: watch::Receiver<()>,
}

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stream")
            .field("reported", &self.metrics.last_applied_lsn())
            .finish_non_exhaustive()
    }
}

impl Stream {
    /// Starts streaming from the slot at its confirmed position. Returns [`OpenError::Busy`]
    /// when another session holds the slot (the server refuses a second
    /// `START_REPLICATION` on an active slot: that refusal is the standby mechanism).
    pub(crate) async fn open(endpoint: &Endpoint, timeout: Duration) -> Result<Self, OpenError> {
        let (tx, reported) = watch::channel(());
        let config = endpoint
            .config
            .clone()
            .with_feedback_observer(FeedbackObserver::new(move |_| {
                tx.send_replace(());
            }));
        let mut client = ReplicationClient::connect(config)
            .await
            .map_err(|e| OpenError::Failed(wire_error("connecting for replication", &e)))?;
        match tokio::time::timeout(timeout, client.wait_started()).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) if sqlstate(&e) == Some("55006") => return Err(OpenError::Busy),
            Ok(Err(e)) => {
                return Err(OpenError::Failed(wire_error("starting replication", &e)));
            }
            Err(_) => {
                client.abort();
                return Err(OpenError::Failed(SourceError::unavailable(format!(
                    "the server did not start replication within {timeout:?} (source.connect_timeout)"
                ))));
            }
        }
        let metrics = client.metrics();
        Ok(Self {
            client,
            metrics,
            reported,
        })
    }

    /// The next replication event, waiting for it. `Ok(None)`: the stream ended.
    pub(crate) async fn recv(&mut self) -> Result<Option<ReplicationEvent>, PgWireError> {
        self.client.recv().await
    }

    /// Reports that everything up to `lsn` is settled; the worker sends it within
    /// [`STATUS_INTERVAL`].
    pub(crate) fn confirm(&self, lsn: u64) {
        self.client.update_applied_lsn(Lsn::from_u64(lsn));
    }

    /// Ends the session cleanly: sends the final standby status update with `confirmed`
    /// (without it the slot would not advance over the last batches), waits until the server
    /// shows it on the slot (read through `pool`), then sends CopyDone.
    pub(crate) async fn close(mut self, confirmed: u64, pool: sqlx::PgPool, slot: String) {
        let target = Lsn::from_u64(confirmed);
        self.client.update_applied_lsn(target);
        let applied = async {
            while self.metrics.last_applied_lsn() < target {
                if self.reported.changed().await.is_err() {
                    return;
                }
            }
            // The server applies it when its walsender reads it; nothing announces that, so
            // read the slot until it shows the position (normally at the first read).
            loop {
                let shown: Result<Option<i64>, sqlx::Error> = crate::sql::query_scalar(
                    "SELECT (confirmed_flush_lsn - '0/0'::pg_lsn)::bigint FROM pg_replication_slots WHERE slot_name = $1",
                )
                .bind(&slot)
                .fetch_one(&pool)
                .await;
                match shown {
                    Ok(Some(lsn)) if lsn as u64 >= confirmed => return,
                    Ok(_) => tokio::time::sleep(Duration::from_millis(5)).await,
                    Err(_) => return,
                }
            }
        };
        if tokio::time::timeout(CLOSE_TIMEOUT, applied).await.is_err() {
            tracing::warn!(
                confirmed = %target,
                "the final standby status update was not applied in time; the next start may republish the last events"
            );
        }
        let _ = tokio::time::timeout(CLOSE_TIMEOUT, self.client.shutdown()).await;
    }

    /// Drops the session at once, as a crash would: no final status update, no CopyDone.
    pub(crate) fn abort(mut self) {
        self.client.abort();
    }
}

/// Decodes `%XX` escapes of a URL part (`+` stays `+`, as in URL userinfo).
fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && let Some(hex) = s.get(i + 1..i + 3)
            && let Ok(b) = u8::from_str_radix(hex, 16)
        {
            out.push(b);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The SQLSTATE of a server error (`... (SQLSTATE 55006)`).
pub(crate) fn sqlstate(e: &PgWireError) -> Option<&str> {
    match e {
        PgWireError::Server(message) => {
            let at = message.find("SQLSTATE ")? + "SQLSTATE ".len();
            message.get(at..at + 5)
        }
        _ => None,
    }
}

/// Maps a replication error to what the relay should do.
pub(crate) fn wire_error(context: &str, e: &PgWireError) -> SourceError {
    let error = e.clone();
    match (e, sqlstate(e)) {
        // Both are decided again by the check before the next attempt (`slot::check`), which
        // recovers a missing or invalidated slot, or stops, as `source.on_slot_loss` says.
        (_, Some("42704")) => SourceError::unavailable(format!(
            "{context}: the replication slot or publication does not exist (dropped just now, or a failover); checking again (docs/cdc.md#failover)"
        ))
        .with_source(error),
        (_, Some("55000")) => SourceError::unavailable(format!(
            "{context}: the replication slot cannot stream (invalidated, or the server is a standby in recovery); checking again (docs/cdc.md#failover)"
        ))
        .with_source(error),
        (_, Some(code)) if code.starts_with("42") || code.starts_with("28") => {
            SourceError::fatal(context.to_owned()).with_source(error)
        }
        (PgWireError::Auth(_) | PgWireError::Tls(_) | PgWireError::MessageTooLarge { .. }, _) => {
            SourceError::fatal(context.to_owned()).with_source(error)
        }
        _ => SourceError::unavailable(context.to_owned()).with_source(error),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use outbox_core::SourceErrorKind;

    #[test]
    fn the_url_gives_every_replication_connection_parameter() {
        let mut config = PostgresConfig::new("postgres://app:p%40ss%20w+@db.local:6543/shop");
        config.slot = outbox_core::Identifier::new("s1").expect("valid");
        let e = Endpoint::new(&config).expect("valid");
        assert_eq!(e.config.host, "db.local");
        assert_eq!(e.config.port, 6543);
        assert_eq!(e.config.user, "app");
        assert_eq!(e.config.password, "p@ss w+");
        assert_eq!(e.config.database, "shop");
        assert_eq!(e.config.slot, "s1");
        assert!(!format!("{e:?}").contains("p@ss"));
    }

    #[test]
    fn server_errors_map_to_kinds_by_sqlstate() {
        let busy = PgWireError::Server(
            "ERROR: replication slot \"s\" is active for PID 7 (SQLSTATE 55006)".into(),
        );
        assert_eq!(sqlstate(&busy), Some("55006"));
        // A slot missing at START_REPLICATION is checked again (recovered or refused) before
        // the next attempt, not fatal on its own.
        let missing = PgWireError::Server("ERROR: x (SQLSTATE 42704)".into());
        assert_eq!(
            wire_error("c", &missing).kind(),
            SourceErrorKind::Unavailable
        );
        let denied = PgWireError::Server("ERROR: x (SQLSTATE 42501)".into());
        assert_eq!(wire_error("c", &denied).kind(), SourceErrorKind::Fatal);
        let io = PgWireError::Io(Arc::new(std::io::Error::other("reset")));
        assert_eq!(wire_error("c", &io).kind(), SourceErrorKind::Unavailable);
    }

    #[test]
    fn the_replication_session_takes_its_tls_from_the_url_like_libpq() {
        let tls = |url: &str, socket: bool| {
            let url = url::Url::parse(url).expect("url");
            let host = url.host_str().unwrap_or_default().to_owned();
            tls_config(&url, socket, &host)
        };
        let full = tls(
            "postgres://a@127.0.0.1/db?sslmode=verify-full&sslrootcert=/ca.pem",
            false,
        )
        .expect("valid");
        assert_eq!(full.mode, SslMode::VerifyFull);
        assert_eq!(full.ca_pem_path, Some("/ca.pem".into()));
        assert_eq!(
            full.sni_hostname.as_deref(),
            Some("127.0.0.1"),
            "IP names checked"
        );
        let named = tls("postgres://a@db.internal/db?sslmode=verify-full", false).expect("ok");
        assert_eq!(named.sni_hostname, None, "the host name itself is checked");
        assert_eq!(
            tls("postgres://a@h/db", false).expect("ok").mode,
            SslMode::Prefer
        );
        assert_eq!(
            tls("postgres://a@h/db?sslmode=require", true)
                .expect("ok")
                .mode,
            SslMode::Disable,
            "no TLS over a Unix socket"
        );
        let client = tls(
            "postgres://a@h/db?sslmode=verify-ca&sslcert=/c.pem&sslkey=/c.key",
            false,
        )
        .expect("ok");
        assert_eq!(client.client_cert_pem_path, Some("/c.pem".into()));
        let bad = tls("postgres://a@h/db?sslmode=strict", false).expect_err("refused");
        assert!(bad.contains("sslmode `strict`"), "{bad}");
        let half = tls("postgres://a@h/db?sslcert=/c.pem", false).expect_err("refused");
        assert!(half.contains("sslcert and sslkey"), "{half}");
    }
}
