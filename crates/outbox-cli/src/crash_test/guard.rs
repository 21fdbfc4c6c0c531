//! What makes a database or a broker look like production, so that `outbox crash-test`
//! refuses it without `--yes` (docs/operations.md, "Crash test"):
//!
//! - a host that is not local: anything but `localhost`, a loopback or private address
//!   (10/8, 172.16/12, 192.168/16, 169.254/16, fc00::/7, fe80::/10) or a name without a dot
//!   (a container or service name such as `postgres`);
//! - `prod` anywhere in a host name or in the database's name (or an SQLite file's);
//! - an outbox table that is in use: it delivered events in the last minute, or holds more
//!   than [`BUSY_PENDING`] pending events.
//!
//! The crash test writes only to tables and destinations of its own, but it does write, it
//! starts relays, and it costs the database and the broker some load for a minute.

use std::net::IpAddr;
use std::time::Duration;

use outbox_core::backend::OpenOptions;
use outbox_runtime::Config;

/// Pending events above which the configured outbox table counts as in use.
pub(crate) const BUSY_PENDING: u64 = 1_000;

/// Every sign that `config` points at production, one line each (empty: none found).
pub(crate) async fn production_signs(config: &Config) -> Vec<String> {
    let mut signs = Vec::new();
    let database = config.source.describe();
    signs.extend(url_signs("database", &database));
    signs.extend(destination_signs(config));
    if !signs.is_empty() {
        // Refused already: do not even connect.
        return signs;
    }
    // The table the application uses: in use means production traffic (a missing table, or a
    // database that cannot be asked, is no sign: the run itself will say if it is unreachable).
    if let Ok(backend) = config.source.open(OpenOptions { connections: 1 }).await
        && let Ok(status) = backend
            .status(time::OffsetDateTime::now_utc(), Duration::from_secs(60))
            .await
    {
        let backlog = &status.backlog;
        if backlog.delivered_last_minute.unwrap_or(0) > 0 {
            signs.push(format!(
                "outbox table {} delivered {} event(s) in the last minute",
                status.table,
                backlog.delivered_last_minute.unwrap_or(0)
            ));
        }
        if backlog.pending > BUSY_PENDING {
            signs.push(format!(
                "outbox table {} holds {} pending events (more than {BUSY_PENDING})",
                status.table, backlog.pending
            ));
        }
    }
    signs
}

/// Signs in the sink's address (`url`, `brokers`, `path`), read from its redacted form.
fn destination_signs(config: &Config) -> Vec<String> {
    let Ok(serde_json::Value::Object(sink)) = serde_json::to_value(&config.sink) else {
        return Vec::new();
    };
    let mut signs = Vec::new();
    for key in ["url", "brokers", "endpoint_url", "path"] {
        if let Some(serde_json::Value::String(value)) = sink.get(key) {
            signs.extend(url_signs("broker", value));
        }
    }
    signs
}

/// Signs in one address: a URL, a comma-separated list of servers, or a file path.
fn url_signs(what: &str, address: &str) -> Vec<String> {
    let mut signs = Vec::new();
    let Some((_, rest)) = address.split_once("://") else {
        // A file (SQLite, the file sink): only its name can tell.
        if address.to_ascii_lowercase().contains("prod") {
            signs.push(format!("the {what} `{address}` has \"prod\" in its name"));
        }
        return signs;
    };
    let authority_and_path = rest.split(['?', '#']).next().unwrap_or("");
    let (authority, path) = authority_and_path
        .split_once('/')
        .unwrap_or((authority_and_path, ""));
    let hosts = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    for server in hosts.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        // Further servers of a list may carry their own scheme.
        let server = server.split_once("://").map_or(server, |(_, s)| s);
        let host = host_of(server);
        if host.is_empty() {
            continue; // a Unix socket
        }
        if host.to_ascii_lowercase().contains("prod") {
            signs.push(format!("the {what} host `{host}` has \"prod\" in its name"));
        } else if !is_local(host) {
            signs.push(format!(
                "the {what} host `{host}` is neither local nor on a private network"
            ));
        }
    }
    let name = path.trim_matches('/');
    if name.to_ascii_lowercase().contains("prod") {
        signs.push(format!("the {what} name `{name}` has \"prod\" in it"));
    }
    signs
}

/// The host of `host:port`, `[v6]:port` or a bare host.
fn host_of(server: &str) -> &str {
    if let Some(rest) = server.strip_prefix('[') {
        return rest.split(']').next().unwrap_or("");
    }
    match server.rsplit_once(':') {
        Some((host, port)) if port.chars().all(|c| c.is_ascii_digit()) => host,
        _ => server,
    }
}

/// Loopback, private or link-local addresses, `localhost`, and names without a dot.
fn is_local(host: &str) -> bool {
    if host.eq_ignore_ascii_case("localhost") || host.to_ascii_lowercase().ends_with(".localhost") {
        return true;
    }
    match host.parse::<IpAddr>() {
        Ok(IpAddr::V4(ip)) => ip.is_loopback() || ip.is_private() || ip.is_link_local(),
        Ok(IpAddr::V6(ip)) => {
            let first = ip.segments()[0];
            ip.is_loopback() || (first & 0xfe00) == 0xfc00 || (first & 0xffc0) == 0xfe80
        }
        Err(_) => !host.contains('.'),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_and_private_hosts_are_not_production() {
        for url in [
            "postgres://app:***@127.0.0.1:5432/app",
            "postgres://app@localhost/app",
            "mysql://root@10.1.2.3:3306/shop",
            "nats://127.0.0.1:4222, nats://192.168.1.5:4222",
            "postgres://u@[::1]:5432/db",
            "redis://redis:6379",
            "postgres://u@/db?host=/var/run/postgresql",
            "SQLite `outbox.db`",
        ] {
            assert_eq!(url_signs("database", url), Vec::<String>::new(), "{url}");
        }
    }

    #[test]
    fn public_hosts_and_prod_names_are_production() {
        let signs = url_signs("database", "postgres://app@db.example.com:5432/app");
        assert!(
            signs[0].contains("`db.example.com` is neither local"),
            "{signs:?}"
        );
        let signs = url_signs("database", "postgres://app@127.0.0.1:5432/shop_prod");
        assert!(signs[0].contains("`shop_prod` has \"prod\""), "{signs:?}");
        let signs = url_signs("broker", "nats://prod-nats:4222");
        assert!(signs[0].contains("`prod-nats` has \"prod\""), "{signs:?}");
        let signs = url_signs("broker", "nats://8.8.8.8:4222");
        assert_eq!(signs.len(), 1, "{signs:?}");
    }
}
