//! From the replication stream to events: pgoutput `Relation`/`Insert` messages of the outbox
//! table and logical messages with the configured prefix, buffered per transaction and handed
//! over only at `Commit` (an aborted transaction never reaches pgoutput's stream, so nothing
//! phantom can be emitted).
//!
//! A transaction larger than `source.spill_after_events` / `spill_after_bytes` is buffered in a
//! scratch file ([`outbox_core::spill`]) and handed over as [`Step::Spilled`].
//!
//! Values arrive in pgoutput's text format. The replication session pins `DateStyle=ISO`,
//! `TimeZone=UTC` and `bytea_output=hex` (see `stream.rs`), so `created_at` reads as
//! `2026-11-22 10:00:00.123456+00` and `payload` as `\x` followed by hex digits.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use outbox_core::spill::{Buffered, SpillSettings, SpilledTxn, TxnBuffer};
use outbox_core::{Event, Position, SourceError};
use pg_walstream::{LogicalReplicationMessage, LogicalReplicationParser, TupleData};
use pgwire_replication::ReplicationEvent;
use time::{Date, Month, OffsetDateTime, PrimitiveDateTime, Time, UtcOffset};
use uuid::Uuid;

use super::ledger::{Meta, Origin};
use super::message::decode_message;

/// Why the stream could not be turned into events. Each is fatal for the stream: the data is
/// not what this build understands, and skipping it could lose an event.
#[derive(Debug, thiserror::Error)]
pub(crate) enum DecodeError {
    /// pgoutput bytes that do not parse.
    #[error("malformed pgoutput message")]
    Protocol(#[source] pg_walstream::ReplicationError),
    /// The outbox table lacks a column the relay needs.
    #[error("the outbox table as published has no column `{0}`; run `outbox migrate`")]
    MissingColumn(&'static str),
    /// A row references a relation never described on this stream.
    #[error("an insert references relation {0}, which the stream never described")]
    UnknownRelation(u32),
    /// A column value that does not read as its type.
    #[error("column `{column}` of an outbox row: {reason}")]
    BadValue {
        /// The column.
        column: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// A pgoutput message outside a transaction that must be inside one.
    #[error("{0} outside a transaction")]
    OutOfTransaction(&'static str),
    /// A large transaction could not be written to its scratch file.
    #[error("buffering a large transaction in a scratch file failed")]
    Spill(#[source] std::io::Error),
}

impl DecodeError {
    /// The error for the relay: a scratch file that cannot be written (a full disk) is worth
    /// retrying (the stream starts over from the slot); anything else is fatal.
    pub(crate) fn into_source_error(self, table: &str) -> SourceError {
        match self {
            DecodeError::Spill(e) => SourceError::unavailable(format!(
                "buffering a large transaction of {table} in a scratch file (source.spill_dir) failed"
            ))
            .with_source(e),
            e => SourceError::fatal(format!("decoding the replication stream of {table} failed"))
                .with_source(e),
        }
    }
}

/// What one replication event meant.
#[derive(Debug)]
pub(crate) enum Step {
    /// Nothing to hand over yet (a begin, a change buffered, a relation, another prefix).
    Nothing,
    /// A transaction committed; its events in commit order (possibly none) and the LSN that
    /// confirms it.
    Committed {
        /// The transaction's events, positions unassigned.
        events: Vec<(Event, Origin)>,
        /// The end of the commit record: confirming it skips this transaction on restart.
        end_lsn: u64,
        /// The transaction id (to wait until it is visible before querying its rows).
        xid: u32,
    },
    /// A transaction committed whose events went to a scratch file (past the spill
    /// thresholds); read back in batches by the ledger.
    Spilled {
        /// The transaction's events, positions unassigned.
        events: SpilledTxn<(Event, Meta)>,
        /// As for [`Step::Committed`].
        end_lsn: u64,
    },
    /// The server's position while nothing is in flight on the stream.
    KeepAlive {
        /// The server's WAL end.
        wal_end: u64,
    },
}

/// Column positions of the outbox table in the stream's tuples.
#[derive(Debug, Clone, Copy)]
struct Layout {
    id: usize,
    aggregate_type: usize,
    aggregate_id: usize,
    event_type: usize,
    payload: usize,
    headers: usize,
    created_at: usize,
    state: usize,
    seq: usize,
    attempts: usize,
    last_error: usize,
}

#[derive(Debug)]
struct OpenTxn {
    xid: u32,
    commit_time: OffsetDateTime,
    events: TxnBuffer<(Event, Meta)>,
}

impl OpenTxn {
    fn push(&mut self, event: Event, origin: Origin) -> Result<(), DecodeError> {
        let meta = Meta {
            origin,
            xid: self.xid,
        };
        self.events.push((event, meta)).map_err(DecodeError::Spill)
    }
}

/// Stateful decoder of one replication session.
pub(crate) struct Decoder {
    parser: LogicalReplicationParser,
    schema: String,
    table: String,
    prefix: String,
    /// Relation id -> the outbox table's layout, or `None` for another table.
    relations: HashMap<u32, Option<Layout>>,
    open: Option<OpenTxn>,
}

impl std::fmt::Debug for Decoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Decoder")
            .field("table", &format_args!("{}.{}", self.schema, self.table))
            .field("prefix", &self.prefix)
            .field("in_transaction", &self.open.is_some())
            .finish_non_exhaustive()
    }
}

impl Decoder {
    /// A decoder for the outbox table `schema.table` and logical messages with `prefix`.
    pub(crate) fn new(schema: &str, table: &str, prefix: &str) -> Self {
        Self {
            parser: LogicalReplicationParser::with_protocol_version(1),
            schema: schema.to_owned(),
            table: table.to_owned(),
            prefix: prefix.to_owned(),
            relations: HashMap::new(),
            open: None,
        }
    }

    /// True between a `Begin` and its `Commit`.
    pub(crate) fn in_transaction(&self) -> bool {
        self.open.is_some()
    }

    /// Interprets one replication event; an open transaction past `spill`'s thresholds goes
    /// to a scratch file.
    pub(crate) fn apply(
        &mut self,
        event: ReplicationEvent,
        spill: &Arc<SpillSettings>,
    ) -> Result<Step, DecodeError> {
        match event {
            ReplicationEvent::Begin {
                commit_time_micros,
                xid,
                ..
            } => {
                self.open = Some(OpenTxn {
                    xid,
                    commit_time: pg_timestamp(commit_time_micros),
                    events: TxnBuffer::new(spill.clone(), None),
                });
                Ok(Step::Nothing)
            }
            ReplicationEvent::Commit { end_lsn, .. } => {
                let mut txn = self
                    .open
                    .take()
                    .ok_or(DecodeError::OutOfTransaction("commit"))?;
                let end_lsn = end_lsn.as_u64();
                Ok(match txn.events.take().map_err(DecodeError::Spill)? {
                    Buffered::Memory(events) => Step::Committed {
                        events: events.into_iter().map(|(e, m)| (e, m.origin)).collect(),
                        end_lsn,
                        xid: txn.xid,
                    },
                    Buffered::Spilled(events) => Step::Spilled { events, end_lsn },
                })
            }
            ReplicationEvent::XLogData { data, .. } => {
                self.apply_pgoutput(data)?;
                Ok(Step::Nothing)
            }
            ReplicationEvent::Message {
                transactional,
                lsn,
                prefix,
                content,
            } => {
                if prefix != self.prefix {
                    return Ok(Step::Nothing);
                }
                if !transactional {
                    tracing::warn!(%lsn, prefix, "ignoring a non-transactional logical message: only pg_logical_emit_message(true, ...) is an outbox event");
                    return Ok(Step::Nothing);
                }
                let txn = self
                    .open
                    .as_mut()
                    .ok_or(DecodeError::OutOfTransaction("logical message"))?;
                match decode_message(&content) {
                    Ok(m) => {
                        let commit_time = txn.commit_time;
                        txn.push(
                            Event {
                                id: m.id,
                                position: Position(0),
                                aggregate_type: m.aggregate_type,
                                aggregate_id: m.aggregate_id,
                                event_type: m.event_type,
                                payload: m.payload,
                                headers: m.headers,
                                created_at: commit_time,
                                attempts: 0,
                            },
                            Origin::Message,
                        )?
                    }
                    Err(e) => {
                        // Not an event this build can deliver with the contract (no id, no
                        // aggregate): skipping it is the only move that does not stop every
                        // other event. Loud, with the LSN to find it.
                        tracing::error!(%lsn, prefix, error = %outbox_core::relay::ErrorChain(&e), "skipping a logical message that is not a valid outbox event");
                    }
                }
                Ok(Step::Nothing)
            }
            ReplicationEvent::KeepAlive { wal_end, .. } => Ok(Step::KeepAlive {
                wal_end: wal_end.as_u64(),
            }),
            ReplicationEvent::StoppedAt { .. } => Ok(Step::Nothing),
            #[allow(unreachable_patterns)]
            _ => Ok(Step::Nothing),
        }
    }

    fn apply_pgoutput(&mut self, data: Bytes) -> Result<(), DecodeError> {
        if data.is_empty() {
            return Ok(());
        }
        let msg = self
            .parser
            .parse_wal_message_bytes(data)
            .map_err(DecodeError::Protocol)?;
        match msg.message {
            LogicalReplicationMessage::Relation {
                relation_id,
                namespace,
                relation_name,
                columns,
                ..
            } => {
                let ours = *namespace == *self.schema && *relation_name == *self.table;
                let layout = if ours {
                    let find = |name: &'static str| {
                        columns
                            .iter()
                            .position(|c| &*c.name == name)
                            .ok_or(DecodeError::MissingColumn(name))
                    };
                    Some(Layout {
                        id: find("id")?,
                        aggregate_type: find("aggregate_type")?,
                        aggregate_id: find("aggregate_id")?,
                        event_type: find("event_type")?,
                        payload: find("payload")?,
                        headers: find("headers")?,
                        created_at: find("created_at")?,
                        state: find("state")?,
                        seq: find("seq")?,
                        attempts: find("attempts")?,
                        last_error: find("last_error")?,
                    })
                } else {
                    None
                };
                self.relations.insert(relation_id, layout);
            }
            LogicalReplicationMessage::Insert { relation_id, tuple } => {
                let layout = *self
                    .relations
                    .get(&relation_id)
                    .ok_or(DecodeError::UnknownRelation(relation_id))?;
                let Some(layout) = layout else {
                    return Ok(());
                };
                let txn = self
                    .open
                    .as_mut()
                    .ok_or(DecodeError::OutOfTransaction("insert"))?;
                if let Some((event, origin)) = decode_row(&layout, &tuple)? {
                    txn.push(event, origin)?;
                }
            }
            // The publication publishes inserts only; anything else (a publication someone
            // widened, types, origins) carries no outbox event.
            _ => {}
        }
        Ok(())
    }
}

fn text<'a>(tuple: &'a TupleData, i: usize, column: &'static str) -> Result<&'a str, DecodeError> {
    let col = tuple.get_column(i).ok_or(DecodeError::BadValue {
        column,
        reason: "missing from the tuple".into(),
    })?;
    if col.is_null() {
        return Err(DecodeError::BadValue {
            column,
            reason: "NULL".into(),
        });
    }
    std::str::from_utf8(col.as_bytes()).map_err(|_| DecodeError::BadValue {
        column,
        reason: "not UTF-8 text".into(),
    })
}

/// One outbox row as an event, with its `seq` and whether it is a dead letter put back in
/// line (migration 0005: `attempts = 0` and a `last_error`); `None` for a row that is not
/// `pending` (a dead letter the CDC source itself inserted for a table-less event).
fn decode_row(layout: &Layout, tuple: &TupleData) -> Result<Option<(Event, Origin)>, DecodeError> {
    if text(tuple, layout.state, "state")? != "pending" {
        return Ok(None);
    }
    let bad = |column: &'static str| move |reason: String| DecodeError::BadValue { column, reason };
    let id =
        Uuid::parse_str(text(tuple, layout.id, "id")?).map_err(|e| bad("id")(e.to_string()))?;
    let payload = decode_bytea_hex(text(tuple, layout.payload, "payload")?.as_bytes())
        .map_err(|e| bad("payload")(e.to_owned()))?;
    let headers: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(text(tuple, layout.headers, "headers")?)
            .map_err(|e| bad("headers")(e.to_string()))?;
    let created_at = parse_timestamptz(text(tuple, layout.created_at, "created_at")?)
        .map_err(|e| bad("created_at")(e.to_owned()))?;
    let seq: i64 = text(tuple, layout.seq, "seq")?
        .parse()
        .map_err(|e: std::num::ParseIntError| bad("seq")(e.to_string()))?;
    let put_back = text(tuple, layout.attempts, "attempts")? == "0"
        && tuple
            .get_column(layout.last_error)
            .is_some_and(|c| !c.is_null());
    let event = Event {
        id,
        position: Position(0),
        aggregate_type: text(tuple, layout.aggregate_type, "aggregate_type")?.to_owned(),
        aggregate_id: text(tuple, layout.aggregate_id, "aggregate_id")?.to_owned(),
        event_type: text(tuple, layout.event_type, "event_type")?.to_owned(),
        payload: Bytes::from(payload),
        headers: outbox_core::enqueue::decode_headers(headers),
        created_at,
        attempts: 0,
    };
    Ok(Some((event, Origin::Row { seq, put_back })))
}

/// Decodes bytea's hex text format (`\x` then two hex digits per byte), exactly.
pub(crate) fn decode_bytea_hex(text: &[u8]) -> Result<Vec<u8>, &'static str> {
    let hex = text
        .strip_prefix(b"\\x")
        .ok_or("not in bytea hex format (expected `\\x...`)")?;
    if hex.len() % 2 != 0 {
        return Err("odd number of hex digits");
    }
    fn nibble(c: u8) -> Result<u8, &'static str> {
        match c {
            b'0'..=b'9' => Ok(c - b'0'),
            b'a'..=b'f' => Ok(c - b'a' + 10),
            b'A'..=b'F' => Ok(c - b'A' + 10),
            _ => Err("not a hex digit"),
        }
    }
    hex.chunks_exact(2)
        .map(|pair| Ok(nibble(pair[0])? << 4 | nibble(pair[1])?))
        .collect()
}

/// Parses timestamptz text in `DateStyle=ISO`: `YYYY-MM-DD HH:MM:SS[.ffffff]±HH[:MM[:SS]]`.
pub(crate) fn parse_timestamptz(s: &str) -> Result<OffsetDateTime, &'static str> {
    const BAD: &str = "not an ISO timestamp with time zone";
    let (date, rest) = s.split_once(' ').ok_or(BAD)?;
    let mut d = date.splitn(3, '-');
    let year: i32 = d.next().and_then(|v| v.parse().ok()).ok_or(BAD)?;
    let month: u8 = d.next().and_then(|v| v.parse().ok()).ok_or(BAD)?;
    let day: u8 = d.next().and_then(|v| v.parse().ok()).ok_or(BAD)?;
    let sign_at = rest.rfind(['+', '-']).ok_or(BAD)?;
    let (clock, offset) = rest.split_at(sign_at);
    let (hms, fraction) = match clock.split_once('.') {
        Some((hms, f)) => (hms, Some(f)),
        None => (clock, None),
    };
    let mut t = hms.splitn(3, ':');
    let hour: u8 = t.next().and_then(|v| v.parse().ok()).ok_or(BAD)?;
    let minute: u8 = t.next().and_then(|v| v.parse().ok()).ok_or(BAD)?;
    let second: u8 = t.next().and_then(|v| v.parse().ok()).ok_or(BAD)?;
    let micros: u32 = match fraction {
        None => 0,
        Some(f) if !f.is_empty() && f.len() <= 6 && f.bytes().all(|b| b.is_ascii_digit()) => {
            f.parse::<u32>().map_err(|_| BAD)? * 10u32.pow(6 - f.len() as u32)
        }
        Some(_) => return Err(BAD),
    };
    let negative = offset.starts_with('-');
    let mut o = offset[1..].splitn(3, ':');
    let oh: i8 = o.next().and_then(|v| v.parse().ok()).ok_or(BAD)?;
    let om: i8 = o.next().map_or(Some(0), |v| v.parse().ok()).ok_or(BAD)?;
    let os: i8 = o.next().map_or(Some(0), |v| v.parse().ok()).ok_or(BAD)?;
    let sign = if negative { -1 } else { 1 };
    let offset = UtcOffset::from_hms(sign * oh, sign * om, sign * os).map_err(|_| BAD)?;
    let month = Month::try_from(month).map_err(|_| BAD)?;
    let date = Date::from_calendar_date(year, month, day).map_err(|_| BAD)?;
    let time = Time::from_hms_micro(hour, minute, second, micros).map_err(|_| BAD)?;
    Ok(PrimitiveDateTime::new(date, time).assume_offset(offset))
}

/// A PostgreSQL timestamp (microseconds since 2000-01-01 UTC) as a time.
pub(crate) fn pg_timestamp(micros: i64) -> OffsetDateTime {
    const PG_EPOCH_UNIX_SECONDS: i64 = 946_684_800;
    let nanos = (i128::from(micros) + i128::from(PG_EPOCH_UNIX_SECONDS) * 1_000_000) * 1_000;
    OffsetDateTime::from_unix_timestamp_nanos(nanos).unwrap_or(OffsetDateTime::UNIX_EPOCH)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn utc(y: i32, mo: u8, d: u8, h: u8, mi: u8, s: u8, micro: u32) -> OffsetDateTime {
        PrimitiveDateTime::new(
            Date::from_calendar_date(y, Month::try_from(mo).expect("month"), d).expect("date"),
            Time::from_hms_micro(h, mi, s, micro).expect("time"),
        )
        .assume_utc()
    }

    #[test]
    fn bytea_hex_text_decodes_to_the_exact_bytes() {
        assert_eq!(
            decode_bytea_hex(b"\\x00ff7B0a5C").expect("valid"),
            vec![0, 255, b'{', b'\n', b'\\']
        );
        assert_eq!(decode_bytea_hex(b"\\x").expect("valid"), Vec::<u8>::new());
        assert!(decode_bytea_hex(b"\\x0").is_err());
        assert!(decode_bytea_hex(b"\\xzz").is_err());
        assert!(decode_bytea_hex(b"abc").is_err());
    }

    #[test]
    fn iso_timestamps_with_any_precision_and_offset_parse() {
        assert_eq!(
            parse_timestamptz("2026-11-22 10:00:00.123456+00").expect("valid"),
            utc(2026, 11, 22, 10, 0, 0, 123_456)
        );
        assert_eq!(
            parse_timestamptz("2026-11-22 10:00:00.5+00").expect("valid"),
            utc(2026, 11, 22, 10, 0, 0, 500_000)
        );
        assert_eq!(
            parse_timestamptz("2026-11-22 10:00:00-05:30").expect("valid"),
            utc(2026, 11, 22, 15, 30, 0, 0)
        );
        assert!(parse_timestamptz("2026-11-22T10:00:00Z").is_err());
        assert!(parse_timestamptz("yesterday").is_err());
    }

    #[test]
    fn postgres_epoch_microseconds_convert() {
        assert_eq!(pg_timestamp(0), utc(2000, 1, 1, 0, 0, 0, 0));
        assert_eq!(pg_timestamp(1_500_000), utc(2000, 1, 1, 0, 0, 1, 500_000));
    }
}
