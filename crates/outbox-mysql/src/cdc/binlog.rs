//! The binlog side of the CDC source: where a stream stands (file and offset, packed into one
//! growing number for the ledger), how to open a stream from there, and how a row of the
//! outbox table becomes an [`Event`].

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;

use bytes::Bytes;
use mysql_async::binlog::row::BinlogRow;
use mysql_async::binlog::value::BinlogValue;
use mysql_async::{OptsBuilder, SslOpts, Value};
use outbox_core::message::header;
use outbox_core::{Event, Position};
use time::{Date, Month, OffsetDateTime, PrimitiveDateTime, Time};
use uuid::Uuid;

use crate::config::MySqlConfig;

/// A binlog coordinate: the file and the offset in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct BinlogPos {
    pub(crate) file: String,
    pub(crate) offset: u64,
}

impl BinlogPos {
    /// The coordinate as one number that grows with the binlog: the file's sequence number
    /// (the digits after its last `.`) in the high 32 bits, the offset in the low 32 bits (a
    /// binlog file never exceeds 4 GiB: offsets are 32-bit in the protocol).
    pub(crate) fn token(&self) -> Option<u64> {
        token(&self.file, self.offset)
    }
}

/// [`BinlogPos::token`] of `offset` in `file`, without building a `BinlogPos` (per event).
pub(crate) fn token(file: &str, offset: u64) -> Option<u64> {
    file_number(file).map(|n| (n << 32) | (offset & 0xFFFF_FFFF))
}

/// The sequence number of a binlog file name (`binlog.000042` → 42).
pub(crate) fn file_number(file: &str) -> Option<u64> {
    let (_, digits) = file.rsplit_once('.')?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// The files of the tokens seen, to turn a confirmed token back into a coordinate.
#[derive(Debug, Default)]
pub(crate) struct FileNames(HashMap<u64, String>);

impl FileNames {
    pub(crate) fn note(&mut self, file: &str) {
        if let Some(n) = file_number(file) {
            self.0.entry(n).or_insert_with(|| file.to_owned());
        }
    }

    pub(crate) fn position(&self, token: u64) -> Option<BinlogPos> {
        self.0.get(&(token >> 32)).map(|file| BinlogPos {
            file: file.clone(),
            offset: token & 0xFFFF_FFFF,
        })
    }
}

/// MariaDB's `GTID_EVENT` (it starts each transaction when the reader declared itself
/// GTID-aware with `@mariadb_slave_capability = 4`).
pub(crate) const MARIADB_GTID_EVENT: u8 = 162;

/// A MariaDB GTID position: per replication domain, the last transaction's server id and
/// sequence number (the `gtid_binlog_pos` format: `0-1-80,1-2-5`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct GtidState(BTreeMap<u32, (u32, u64)>);

impl GtidState {
    /// Parses `domain-server-seq[,…]`; empty text is the empty position.
    pub(crate) fn parse(text: &str) -> Option<Self> {
        let mut state = BTreeMap::new();
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let mut fields = part.split('-');
            let domain = fields.next()?.parse().ok()?;
            let server = fields.next()?.parse().ok()?;
            let seq = fields.next()?.parse().ok()?;
            if fields.next().is_some() {
                return None;
            }
            state.insert(domain, (server, seq));
        }
        Some(Self(state))
    }

    /// Records a transaction of `domain`.
    pub(crate) fn apply(&mut self, domain: u32, server: u32, seq: u64) {
        self.0.insert(domain, (server, seq));
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl std::fmt::Display for GtidState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, (domain, (server, seq))) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{domain}-{server}-{seq}")?;
        }
        Ok(())
    }
}

/// A MariaDB GTID event's body: `(domain, seq, standalone)`; standalone (flag 1) marks a
/// transaction without a commit event (DDL).
pub(crate) fn mariadb_gtid(body: &[u8]) -> Option<(u32, u64, bool)> {
    let seq = u64::from_le_bytes(body.get(0..8)?.try_into().ok()?);
    let domain = u32::from_le_bytes(body.get(8..12)?.try_into().ok()?);
    let flags = *body.get(12)?;
    Some((domain, seq, flags & 1 == 1))
}

/// Connection options for the binlog session, from `source.url` (the same URL the pool uses:
/// user, password, host, port, database, and sqlx's TLS parameters `ssl-mode` and `ssl-ca`).
pub(crate) fn binlog_opts(config: &MySqlConfig) -> Result<OptsBuilder, String> {
    let raw = config.connect_url();
    let url = url::Url::parse(&raw).map_err(|e| format!("source.url: {e}"))?;
    let decode = |s: &str| {
        percent_encoding::percent_decode_str(s)
            .decode_utf8()
            .map(|c| c.into_owned())
            .map_err(|_| "source.url: the user or password is not UTF-8".to_owned())
    };
    let user = decode(url.username())?;
    let password = url.password().map(decode).transpose()?;
    let host = url
        .host_str()
        .unwrap_or("localhost")
        .trim_matches(['[', ']'])
        .to_owned();
    let database = url.path().trim_start_matches('/').to_owned();
    let mut ssl_mode = "preferred".to_owned();
    let mut ssl_ca: Option<PathBuf> = None;
    let (mut ssl_cert, mut ssl_key): (Option<PathBuf>, Option<PathBuf>) = (None, None);
    for (key, value) in url.query_pairs() {
        match key.as_ref() {
            "ssl-mode" | "sslmode" => ssl_mode = value.to_ascii_lowercase(),
            "ssl-ca" | "sslca" => ssl_ca = Some(PathBuf::from(value.as_ref())),
            "ssl-cert" | "sslcert" => ssl_cert = Some(PathBuf::from(value.as_ref())),
            "ssl-key" | "sslkey" => ssl_key = Some(PathBuf::from(value.as_ref())),
            _ => {}
        }
    }
    let ssl = match ssl_mode.as_str() {
        "disabled" | "preferred" => None,
        "required" => Some(SslOpts::default().with_danger_accept_invalid_certs(ssl_ca.is_none())),
        "verify_ca" | "verify-ca" => {
            Some(SslOpts::default().with_danger_skip_domain_validation(true))
        }
        "verify_identity" | "verify-identity" => Some(SslOpts::default()),
        other => return Err(format!("source.url: unknown ssl-mode `{other}`")),
    }
    .map(|ssl| match &ssl_ca {
        Some(ca) => ssl.with_root_certs(vec![ca.clone().into()]),
        None => ssl,
    });
    // A client certificate (a user `REQUIRE X509`), as for the relay's pool.
    let ssl = match (ssl, ssl_cert, ssl_key) {
        (Some(ssl), Some(cert), Some(key)) => Some(ssl.with_client_identity(Some(
            mysql_async::ClientIdentity::new(cert.into(), key.into()),
        ))),
        (_, Some(_), None) | (_, None, Some(_)) => {
            return Err("source.url: `ssl-cert` and `ssl-key` go together".to_owned());
        }
        (ssl, _, _) => ssl,
    };
    if ssl.is_some() {
        // mysql_async builds its rustls config with the process' default provider, which
        // rustls cannot pick by itself when both of its own are compiled in (it panics).
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
    Ok(OptsBuilder::default()
        .ip_or_hostname(host)
        .tcp_port(url.port().unwrap_or(3306))
        .user(Some(user))
        .pass(password)
        .db_name(Some(database))
        .ssl_opts(ssl))
}

/// Where each column the source reads sits in the table's rows (binlog rows carry values by
/// position, not by name).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Columns {
    pub(crate) count: usize,
    position: usize,
    id: usize,
    aggregate_type: usize,
    aggregate_id: usize,
    event_type: usize,
    payload: usize,
    headers: usize,
    created_at: usize,
    seq: usize,
    state: usize,
    attempts: usize,
}

impl Columns {
    /// From the table's `(column name, 1-based ordinal)` list.
    pub(crate) fn from_ordinals(columns: &[(String, u32)]) -> Result<Self, String> {
        let find = |name: &str| {
            columns
                .iter()
                .find(|(n, _)| n.eq_ignore_ascii_case(name))
                .map(|(_, o)| *o as usize - 1)
                .ok_or_else(|| {
                    format!("the outbox table has no column `{name}`: run `outbox migrate`")
                })
        };
        Ok(Self {
            count: columns.len(),
            position: find("position")?,
            id: find("id")?,
            aggregate_type: find("aggregate_type")?,
            aggregate_id: find("aggregate_id")?,
            event_type: find("event_type")?,
            payload: find("payload")?,
            headers: find("headers")?,
            created_at: find("created_at")?,
            seq: find("seq")?,
            state: find("state")?,
            attempts: find("attempts")?,
        })
    }

    /// The row's `state`.
    pub(crate) fn state<'a>(&self, row: &'a BinlogRow) -> Option<&'a [u8]> {
        bytes(row.as_ref(self.state))
    }

    /// The row's `position` (its primary key).
    pub(crate) fn row_position(&self, row: &BinlogRow) -> Option<i64> {
        int(row.as_ref(self.position))
    }

    /// The event a row holds, with its `seq` as the `aggregate_seq` header; `Err` names what
    /// is wrong with a row no relay can publish (it is dead-lettered).
    pub(crate) fn event(&self, row: &BinlogRow) -> Result<Event, String> {
        let text = |index: usize, what: &str| -> Result<String, String> {
            let raw = bytes(row.as_ref(index)).ok_or_else(|| format!("no {what}"))?;
            String::from_utf8(raw.to_vec()).map_err(|_| format!("{what} is not UTF-8"))
        };
        let id = text(self.id, "id")?;
        let id = Uuid::parse_str(&id).map_err(|e| format!("invalid id `{id}`: {e}"))?;
        let headers = match bytes(row.as_ref(self.headers)) {
            None => serde_json::Map::new(),
            Some(raw) => {
                serde_json::from_slice(raw).map_err(|e| format!("invalid headers: {e}"))?
            }
        };
        let mut headers = outbox_core::enqueue::decode_headers(headers);
        let seq = int(row.as_ref(self.seq)).ok_or("no seq")?;
        headers.retain(|(name, _)| name != header::AGGREGATE_SEQ);
        headers.push((header::AGGREGATE_SEQ.to_owned(), seq.to_string()));
        Ok(Event {
            id,
            position: Position(0),
            aggregate_type: text(self.aggregate_type, "aggregate_type")?,
            aggregate_id: text(self.aggregate_id, "aggregate_id")?,
            event_type: text(self.event_type, "event_type")?,
            payload: Bytes::copy_from_slice(bytes(row.as_ref(self.payload)).unwrap_or_default()),
            headers,
            created_at: datetime(row.as_ref(self.created_at)).ok_or("no created_at")?,
            attempts: int(row.as_ref(self.attempts))
                .and_then(|n| u32::try_from(n).ok())
                .unwrap_or(0),
        })
    }
}

fn value<'a>(v: Option<&'a BinlogValue<'_>>) -> Option<&'a Value> {
    match v {
        Some(BinlogValue::Value(v)) => Some(v),
        _ => None,
    }
}

fn bytes<'a>(v: Option<&'a BinlogValue<'_>>) -> Option<&'a [u8]> {
    match value(v) {
        Some(Value::Bytes(b)) => Some(b),
        _ => None,
    }
}

fn int(v: Option<&BinlogValue<'_>>) -> Option<i64> {
    match value(v) {
        Some(Value::Int(n)) => Some(*n),
        Some(Value::UInt(n)) => i64::try_from(*n).ok(),
        _ => None,
    }
}

/// A `DATETIME(6)` value, stored in UTC by this crate.
fn datetime(v: Option<&BinlogValue<'_>>) -> Option<OffsetDateTime> {
    let Some(Value::Date(y, mo, d, h, mi, s, us)) = value(v) else {
        return None;
    };
    let date = Date::from_calendar_date(i32::from(*y), Month::try_from(*mo).ok()?, *d).ok()?;
    let time = Time::from_hms_micro(*h, *mi, *s, *us).ok()?;
    Some(PrimitiveDateTime::new(date, time).assume_utc())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_grow_with_the_binlog_and_map_back_to_coordinates() {
        let at = |file: &str, offset| BinlogPos {
            file: file.into(),
            offset,
        };
        let a = at("binlog.000009", 4_000_000_000).token().expect("token");
        let b = at("binlog.000010", 4).token().expect("token");
        assert!(a < b);
        assert_eq!(file_number("mysql-bin.1234567"), Some(1_234_567));
        assert_eq!(file_number("binlog"), None);
        assert_eq!(file_number("binlog.00a"), None);
        let mut names = FileNames::default();
        names.note("binlog.000010");
        assert_eq!(names.position(b), Some(at("binlog.000010", 4)));
        assert_eq!(names.position(a), None);
    }

    #[test]
    fn gtid_positions_parse_update_and_print_in_mariadb_format() {
        let mut g = GtidState::parse("0-1-80, 1-2-5").expect("valid");
        g.apply(0, 3, 81);
        g.apply(2, 1, 1);
        assert_eq!(g.to_string(), "0-3-81,1-2-5,2-1-1");
        assert!(GtidState::parse("").expect("empty").is_empty());
        assert_eq!(GtidState::parse("0-1"), None);
        assert_eq!(GtidState::parse("0-1-x"), None);
        // seq 81, domain 0, flags 12 (as a MariaDB 10.11 server wrote it).
        let body = [81, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 12, 0, 0, 0];
        assert_eq!(mariadb_gtid(&body), Some((0, 81, false)));
        assert_eq!(mariadb_gtid(&body[..10]), None);
    }

    #[test]
    fn binlog_options_come_from_the_pool_url_with_its_tls_mode() {
        let opts = |url: &str| binlog_opts(&MySqlConfig::new(url));
        let o: mysql_async::Opts = opts(
            "mysql://app:p%40ss@db.internal:3307/shop?ssl-mode=verify_identity&ssl-ca=/ca.pem",
        )
        .expect("valid")
        .into();
        assert_eq!(o.user(), Some("app"));
        assert_eq!(o.pass(), Some("p@ss"));
        assert_eq!(o.ip_or_hostname(), "db.internal");
        assert_eq!(o.tcp_port(), 3307);
        assert_eq!(o.db_name(), Some("shop"));
        assert!(o.ssl_opts().is_some());
        let plain: mysql_async::Opts = opts("mariadb://app@127.0.0.1/shop").expect("valid").into();
        assert!(plain.ssl_opts().is_none());
        assert!(opts("mysql://app@h/shop?ssl-mode=sometimes").is_err());
    }
}
