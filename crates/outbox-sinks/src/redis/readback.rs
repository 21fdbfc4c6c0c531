//! `outbox verify` for Redis Streams: the stream keys the destination template can render
//! (`SCAN … MATCH <template as a glob> TYPE stream`, plus every key the expected events
//! name) are read with `XRANGE` from the window's start (entry ids are milliseconds), in
//! pages. `XRANGE` reads; it changes no consumer group and takes nothing from anyone.
//!
//! A stream whose `entries-added` exceeds its length has lost entries (`MAXLEN` trimming,
//! `XTRIM`, `XDEL`): what was sent to it before its first remaining entry is reported as
//! expired, not lost. (An `XDEL` of the very first entries looks the same as trimming.)

use std::collections::{BTreeSet, HashMap};

use outbox_core::verify::{
    Identity, Lane, LedgerEvent, ReadBack, ReadBackError, ReadMessage, ReadOutcome, Trimmed,
};
use outbox_core::{Destination, SinkErrorKind, message};
use redis::Value;
use redis::aio::ConnectionManager;
use time::OffsetDateTime;

use super::{HEADER_FIELD_PREFIX, PAYLOAD_FIELD, RedisConfig};
use crate::read_back::Read;
use crate::secret::redact_url;

/// Entries per `XRANGE` page.
const PAGE: usize = 5_000;
/// Keys per `SCAN` step.
const SCAN_COUNT: usize = 1_000;

/// Reads a Redis Streams sink's streams back.
pub struct RedisReadBack {
    connection: ConnectionManager,
    url: String,
    destination: Destination,
}

/// Connects (the sink's own client settings: TLS, credentials, timeouts).
pub(super) async fn read_back(config: &RedisConfig) -> Result<RedisReadBack, ReadBackError> {
    let client = config
        .client()
        .map_err(|e| ReadBackError::refused(e.to_string()))?;
    let url = redact_url(config.url.trim());
    let mut connection = super::manage(config, client)
        .await
        .map_err(|e| connect_error(&url, e))?;
    redis::cmd("PING")
        .query_async::<()>(&mut connection)
        .await
        .map_err(|e| connect_error(&url, e))?;
    Ok(RedisReadBack {
        connection,
        url,
        destination: config.destination.clone(),
    })
}

fn connect_error(url: &str, e: redis::RedisError) -> ReadBackError {
    let e = super::connect_error(url, e);
    match e.kind() {
        SinkErrorKind::Unavailable => ReadBackError::unreachable(e.report()),
        _ => ReadBackError::refused(e.report()),
    }
}

/// One entry: its id (milliseconds, sequence) and its fields.
struct Entry {
    ms: u64,
    seq: u64,
    fields: Vec<(Vec<u8>, Vec<u8>)>,
}

fn text(v: &Value) -> Option<Vec<u8>> {
    match v {
        Value::BulkString(b) => Some(b.clone()),
        Value::SimpleString(s) => Some(s.as_bytes().to_vec()),
        Value::Int(n) => Some(n.to_string().into_bytes()),
        _ => None,
    }
}

fn entry_id(id: &[u8]) -> Option<(u64, u64)> {
    let id = std::str::from_utf8(id).ok()?;
    let (ms, seq) = id.split_once('-')?;
    Some((ms.parse().ok()?, seq.parse().ok()?))
}

/// The entries of an `XRANGE` reply.
fn entries(reply: &Value) -> Vec<Entry> {
    let Value::Array(items) = reply else {
        return Vec::new();
    };
    items
        .iter()
        .filter_map(|item| {
            let Value::Array(pair) = item else {
                return None;
            };
            let (ms, seq) = entry_id(&text(pair.first()?)?)?;
            let fields = match pair.get(1)? {
                Value::Array(flat) => flat
                    .chunks(2)
                    .filter_map(|kv| Some((text(kv.first()?)?, text(kv.get(1)?)?)))
                    .collect(),
                Value::Map(pairs) => pairs
                    .iter()
                    .filter_map(|(k, v)| Some((text(k)?, text(v)?)))
                    .collect(),
                _ => Vec::new(),
            };
            Some(Entry { ms, seq, fields })
        })
        .collect()
}

impl Entry {
    /// The field carrying header `name`: the contract headers and CloudEvents attributes as
    /// themselves, the row's own headers prefixed (`h:aggregate_seq`).
    fn identity(&self) -> Identity {
        let field = |name: &str| -> Option<String> {
            let wanted: std::borrow::Cow<'_, str> = match name {
                message::header::ID
                | message::header::EVENT_TYPE
                | message::header::AGGREGATE_TYPE
                | message::header::AGGREGATE_ID => name.into(),
                _ if name.starts_with("ce-") || name.starts_with("ce_") => name.into(),
                _ => format!("{HEADER_FIELD_PREFIX}{name}").into(),
            };
            self.fields
                .iter()
                .find(|(k, _)| k.as_slice() == wanted.as_bytes())
                .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
        };
        let body = self
            .fields
            .iter()
            .find(|(k, _)| k.as_slice() == PAYLOAD_FIELD.as_bytes())
            .map_or(&[][..], |(_, v)| v.as_slice());
        Identity::read(field, body)
    }
}

fn ms_time(ms: u64) -> Option<OffsetDateTime> {
    OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000).ok()
}

impl RedisReadBack {
    fn failed(&self, doing: &str, e: &redis::RedisError) -> ReadBackError {
        if e.code() == Some("NOPERM") {
            ReadBackError::refused(format!(
                "the Redis user at {} may not {doing} ({e}); verify needs SCAN, XINFO and XRANGE",
                self.url
            ))
        } else if super::is_unavailable(e) {
            ReadBackError::unreachable(format!("Redis at {} while {doing}: {e}", self.url))
        } else {
            ReadBackError::failed(format!("Redis at {} while {doing}: {e}", self.url))
        }
    }

    /// The stream keys to read: those the template can render, and those the expected
    /// events name.
    async fn keys(&self, expected: &[LedgerEvent]) -> Result<Vec<String>, ReadBackError> {
        let mut keys: BTreeSet<String> = expected.iter().map(|e| self.destination_of(e)).collect();
        let mut connection = self.connection.clone();
        if self.destination.is_fixed() {
            keys.insert(self.destination.template().to_owned());
        } else {
            let pattern = self.destination.glob();
            let mut cursor = 0_u64;
            loop {
                let (next, found): (u64, Vec<String>) = redis::cmd("SCAN")
                    .arg(cursor)
                    .arg("MATCH")
                    .arg(&pattern)
                    .arg("COUNT")
                    .arg(SCAN_COUNT)
                    .arg("TYPE")
                    .arg("stream")
                    .query_async(&mut connection)
                    .await
                    .map_err(|e| self.failed("list the stream keys (SCAN)", &e))?;
                keys.extend(
                    found
                        .into_iter()
                        .filter(|k| self.destination.could_render(k)),
                );
                if next == 0 {
                    break;
                }
                cursor = next;
            }
        }
        Ok(keys.into_iter().collect())
    }

    async fn read_all(&self, call: Read<'_>) -> Result<ReadOutcome, ReadBackError> {
        let mut connection = self.connection.clone();
        let keys = self.keys(call.expected).await?;
        let mut out = ReadOutcome::default();
        // Lengths for the progress total, and what trimming removed.
        let mut total = 0_u64;
        for key in &keys {
            let info: Option<HashMap<String, Value>> = redis::cmd("XINFO")
                .arg("STREAM")
                .arg(key)
                .query_async(&mut connection)
                .await
                .or_else(|e| {
                    // A key that does not exist (nothing was ever sent there).
                    if e.code() == Some("ERR") {
                        Ok(None)
                    } else {
                        Err(e)
                    }
                })
                .map_err(|e| self.failed(&format!("read stream `{key}` (XINFO STREAM)"), &e))?;
            let Some(info) = info else { continue };
            let int = |name: &str| match info.get(name) {
                Some(Value::Int(n)) => u64::try_from(*n).ok(),
                Some(v) => text(v).and_then(|t| String::from_utf8(t).ok()?.parse().ok()),
                None => None,
            };
            let length = int("length").unwrap_or(0);
            total += length;
            let first = info
                .get("first-entry")
                .and_then(|v| entries(&Value::Array(vec![v.clone()])).into_iter().next());
            if int("entries-added").is_none()
                && !out.notes.iter().any(|n| n.contains("entries-added"))
            {
                out.notes.push(format!(
                    "Redis at {} does not report entries-added (before Redis 7.0): whether a stream was trimmed (MAXLEN) is unknown, so an event trimmed away counts as lost",
                    self.url
                ));
            }
            if let (Some(added), Some(first)) = (int("entries-added"), first)
                && added > length
                && let Some(at) = ms_time(first.ms)
            {
                out.trimmed.push(Trimmed {
                    destination: Some(key.clone()),
                    retained_from: at,
                    detail: format!(
                        "Redis stream `{key}` no longer holds {} of its {added} entries (MAXLEN trimming, XTRIM or XDEL); its oldest entry is {}-{}",
                        added - length,
                        first.ms,
                        first.seq
                    ),
                });
            }
        }
        call.progress.advance(0, Some(total));
        let start_ms = u64::try_from(call.since.unix_timestamp_nanos() / 1_000_000).unwrap_or(0);
        let mut read = 0_u64;
        for key in &keys {
            let lane = u32::try_from(out.lanes.len()).unwrap_or(u32::MAX);
            let mut count = 0_u64;
            let mut start = format!("{start_ms}-0");
            loop {
                let reply: Value = redis::cmd("XRANGE")
                    .arg(key)
                    .arg(&start)
                    .arg("+")
                    .arg("COUNT")
                    .arg(PAGE)
                    .query_async(&mut connection)
                    .await
                    .map_err(|e| self.failed(&format!("read stream `{key}` (XRANGE)"), &e))?;
                let page = entries(&reply);
                let Some(last) = page.last() else { break };
                start = format!("({}-{}", last.ms, last.seq);
                let full = page.len() == PAGE;
                for entry in &page {
                    out.messages.push(ReadMessage {
                        identity: entry.identity(),
                        lane,
                        offset: entry.ms,
                        stored_at: ms_time(entry.ms),
                    });
                }
                count += page.len() as u64;
                read += page.len() as u64;
                call.progress.advance(read, Some(total.max(read)));
                if !full {
                    break;
                }
            }
            out.lanes.push(Lane {
                name: format!("stream `{key}`"),
                messages: count,
            });
        }
        Ok(out)
    }
}

crate::read_back::impl_read_back!(
    RedisReadBack,
    describe: |r| format!("Redis Streams at {}, keys `{}`", r.url, r.destination.template()),
    destination: destination,
    debug: url,
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_of_an_xrange_reply_are_parsed() {
        let bulk = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        let reply = Value::Array(vec![Value::Array(vec![
            bulk("1700000000000-3"),
            Value::Array(vec![
                bulk("id"),
                bulk("0190f3c2-7d1e-7a4b-9c61-3f5e0b2a8d10"),
                bulk("aggregate_id"),
                bulk("o_1"),
                bulk("h:aggregate_seq"),
                bulk("4"),
                bulk("payload"),
                Value::BulkString(vec![0, 159, 146, 150]),
            ]),
        ])]);
        let got = entries(&reply);
        assert_eq!((got[0].ms, got[0].seq), (1_700_000_000_000, 3));
        let identity = got[0].identity();
        assert_eq!(identity.aggregate_id.as_deref(), Some("o_1"));
        assert_eq!(identity.aggregate_seq, Some(4));
        assert!(identity.id.is_some());
    }
}
