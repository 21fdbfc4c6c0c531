//! Binlog events to ledger entries: rotations, row events of the outbox table (inserts, and
//! rows put back to `pending`), commits; and the session as the shared change-stream
//! machinery reads it ([`Binlog`]).

use std::future::Future;

use futures::StreamExt as _;
use mysql_async::binlog::events::{EventData, RowsEventData};
use outbox_core::change_stream::{ChangeStream, LogReader, StreamMeta};
use outbox_core::spill::{self, Buffered, Spillable};
use outbox_core::stream_ledger;
use outbox_core::{Event, SourceError};
use time::OffsetDateTime;
use uuid::Uuid;

use super::super::binlog::{BinlogPos, MARIADB_GTID_EVENT, mariadb_gtid, token};
use super::{MySqlCdcSource, binlog_error};

/// What the ledger keeps with each streamed event.
#[derive(Debug, Clone)]
pub(super) struct Meta {
    /// The row's primary key (`position`), to dead-letter it.
    pub(super) row: i64,
    /// The row's `seq`.
    pub(super) seq: i64,
    /// Why the row cannot be published (it is dead-lettered at once).
    pub(super) invalid: Option<String>,
    /// A dead letter put back to `pending` (streamed from an `UPDATE`).
    pub(super) put_back: bool,
}

pub(super) type Entry = stream_ledger::Entry<Meta>;

impl StreamMeta for Meta {
    fn put_back(&self) -> bool {
        self.put_back
    }
}

/// How a large transaction's events are kept in its scratch file.
impl Spillable for Meta {
    fn memory_size(&self) -> usize {
        std::mem::size_of::<Self>() + self.invalid.as_ref().map_or(0, String::len)
    }

    fn encode(&self, out: &mut Vec<u8>) {
        spill::put_u64(out, self.row as u64);
        spill::put_u64(out, self.seq as u64);
        spill::put_u64(out, u64::from(self.put_back));
        match &self.invalid {
            None => spill::put_u64(out, 0),
            Some(why) => {
                spill::put_u64(out, 1);
                spill::put_bytes(out, why.as_bytes());
            }
        }
    }

    fn decode(input: &mut &[u8]) -> std::io::Result<Self> {
        let row = spill::take_u64(input)? as i64;
        let seq = spill::take_u64(input)? as i64;
        let put_back = spill::take_u64(input)? == 1;
        let invalid = match spill::take_u64(input)? {
            0 => None,
            _ => Some(spill::take_string(input)?),
        };
        Ok(Self {
            row,
            seq,
            invalid,
            put_back,
        })
    }
}

/// The order a transaction's events go out in: rows put back to pending in one statement come
/// in table order, so each aggregate's are sorted by `seq` (a stable sort).
pub(super) fn by_aggregate_seq(a: &(Event, Meta), b: &(Event, Meta)) -> std::cmp::Ordering {
    (&a.0.aggregate_type, &a.0.aggregate_id, a.1.seq).cmp(&(
        &b.0.aggregate_type,
        &b.0.aggregate_id,
        b.1.seq,
    ))
}

impl MySqlCdcSource {
    /// Ends the session after a failure; the next `fetch` reconnects (if the lock is free)
    /// and the stream resends everything after the kept position.
    pub(super) fn lost(&mut self, error: SourceError) -> SourceError {
        self.live = None;
        self.cs.set_streaming(false);
        self.cs.ledger.reset(self.saved);
        self.cs.claim.retry_now();
        tracing::warn!(error = %outbox_core::relay::ErrorChain(&error), "binlog stream lost; events after the kept position will be streamed again");
        error
    }

    /// Interprets one binlog event. Returns true when a transaction with events committed.
    pub(super) fn apply(
        &mut self,
        event: &mysql_async::binlog::events::Event,
    ) -> Result<bool, SourceError> {
        let Some(live) = self.live.as_mut() else {
            return Ok(false);
        };
        let decode = |e: std::io::Error| {
            SourceError::fatal(format!("decoding the binlog of {} failed", self.table))
                .with_source(e)
        };
        let end = u64::from(event.header().log_pos());
        if let Some(reached) = live
            .file
            .as_deref()
            .filter(|_| end > 0)
            .and_then(|f| token(f, end))
        {
            self.cs.reached(reached);
        }
        if event.header().event_type_raw() == MARIADB_GTID_EVENT {
            if let Some((domain, seq, standalone)) = mariadb_gtid(event.data()) {
                live.txn_gtid = Some((domain, event.header().server_id(), seq, standalone));
            }
            return Ok(false);
        }
        let data = event.read_data().map_err(decode)?;
        let commit = match data {
            Some(EventData::RotateEvent(rotate)) => {
                let raw = rotate.name_raw();
                // A rotate sent before the first format description still carries its
                // checksum: the reader only strips it once it knows the checksum setting.
                let name = if live.described || raw.len() <= 4 {
                    raw
                } else {
                    strip_checksum(raw, live.file.as_deref())
                };
                let name = String::from_utf8_lossy(name).into_owned();
                self.files.note(&name);
                live.file = Some(name);
                false
            }
            Some(EventData::FormatDescriptionEvent(_)) => {
                live.described = true;
                false
            }
            Some(EventData::RowsEvent(rows)) => {
                let Some(columns) = self.columns.as_ref() else {
                    return Ok(false);
                };
                let Some(tme) = live.stream.get_tme(rows.table_id()) else {
                    return Ok(false);
                };
                if tme.database_name() != self.database || tme.table_name() != self.table {
                    return Ok(false);
                }
                if tme.columns_count() as usize != columns.count {
                    return Err(SourceError::unavailable(format!(
                        "the outbox table {} changed shape ({} columns in the binlog, {} known): reading its columns again",
                        self.table,
                        tme.columns_count(),
                        columns.count
                    )));
                }
                let update = matches!(
                    rows,
                    RowsEventData::UpdateRowsEventV1(_) | RowsEventData::UpdateRowsEvent(_)
                );
                let insert = matches!(
                    rows,
                    RowsEventData::WriteRowsEventV1(_) | RowsEventData::WriteRowsEvent(_)
                );
                if !(insert || update) {
                    return Ok(false);
                }
                for row in rows.rows(tme) {
                    let (before, after) = row.map_err(decode)?;
                    let Some(after) = after else { continue };
                    if columns.state(&after) != Some(b"pending") {
                        continue;
                    }
                    // An update streams a row put back to pending (dead letter retried,
                    // replay), never one that stayed pending.
                    if update
                        && before
                            .as_ref()
                            .is_none_or(|b| columns.state(b) == Some(b"pending"))
                    {
                        continue;
                    }
                    let row = columns.row_position(&after).unwrap_or(0);
                    let item = match columns.event(&after) {
                        Ok(event) => {
                            let seq = aggregate_seq(&event);
                            (
                                event,
                                Meta {
                                    row,
                                    seq,
                                    invalid: None,
                                    put_back: update,
                                },
                            )
                        }
                        Err(why) => (
                            placeholder(),
                            Meta {
                                row,
                                seq: 0,
                                invalid: Some(format!("undecodable outbox row: {why}")),
                                put_back: update,
                            },
                        ),
                    };
                    live.pending.push(item).map_err(spill_error)?;
                }
                false
            }
            Some(EventData::XidEvent(_)) => true,
            // COMMIT ends a transaction on non-transactional tables; a standalone GTID's one
            // statement (DDL) is its whole transaction.
            Some(EventData::QueryEvent(q)) => {
                q.query().eq_ignore_ascii_case("COMMIT")
                    || live.txn_gtid.is_some_and(|(.., standalone)| standalone)
            }
            _ => false,
        };
        if !commit {
            return Ok(false);
        }
        let Some(file) = live.file.as_deref() else {
            return Ok(false);
        };
        let Some(token) = token(file, end) else {
            return Ok(false);
        };
        if std::mem::take(&mut live.check_token) && token <= self.cs.ledger.confirmed() {
            // Resumed by GTID, the stream's first transaction ends at or before the kept
            // token: that token was measured in another binlog (a failover to a replica whose
            // file of the same name holds the transactions at other offsets). Left as it is,
            // no position here could pass it: the kept position would stay at the failover
            // and every restart would publish everything since again. Positions start over.
            tracing::warn!(
                kept_token = self.saved,
                first_token = token,
                file,
                "the kept binlog position is not in this server's binlog (failover?): following this server's positions from here"
            );
            self.cs.ledger.reset(0);
            self.saved = 0;
            self.rebase_row = true;
        }
        if let (Some(state), Some((domain, server, seq, _))) =
            (live.gtid.as_mut(), live.txn_gtid.take())
        {
            state.apply(domain, server, seq);
            self.gtids.insert(token, state.to_string());
        }
        // Sorted by `by_aggregate_seq`, in memory or merged from the scratch file's runs.
        match live.pending.take().map_err(spill_error)? {
            Buffered::Memory(events) => {
                let any = !events.is_empty();
                self.cs.ledger.commit(events, token);
                Ok(any)
            }
            Buffered::Spilled(events) => {
                // Loaded in batches by `pump`; the binlog waits until all of it is loaded.
                self.cs.ledger.commit_spilled(events, token);
                Ok(true)
            }
        }
    }

    /// Applies one item of the stream; a failure ends the session.
    pub(super) fn receive(&mut self, received: BinlogItem) -> Result<bool, SourceError> {
        match received {
            Some(Ok(event)) => self.apply(&event).map_err(|e| self.lost(e)),
            None => Err(self.lost(SourceError::unavailable(
                "the server ended the binlog stream",
            ))),
            Some(Err(e)) => {
                let at = self.files.position(self.saved).unwrap_or(BinlogPos {
                    file: "?".to_owned(),
                    offset: 0,
                });
                let e = binlog_error("reading the binlog stream", &at, e);
                Err(self.lost(e))
            }
        }
    }
}

/// A rotate event's name without the 4-byte checksum it carries before the first format
/// description (kept when it is the name the stream was asked for, whole).
fn strip_checksum<'a>(raw: &'a [u8], requested: Option<&str>) -> &'a [u8] {
    match requested {
        Some(r) if raw.starts_with(r.as_bytes()) => &raw[..r.len()],
        _ => &raw[..raw.len() - 4],
    }
}

/// The `aggregate_seq` header of an event decoded from a row.
fn aggregate_seq(event: &Event) -> i64 {
    event
        .headers
        .iter()
        .rev()
        .find(|(n, _)| n == outbox_core::message::header::AGGREGATE_SEQ)
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0)
}

/// The stand-in event of a row that cannot be decoded (it is only ever dead-lettered).
fn placeholder() -> Event {
    Event {
        id: Uuid::nil(),
        position: outbox_core::Position(0),
        aggregate_type: String::new(),
        aggregate_id: String::new(),
        event_type: String::new(),
        payload: bytes::Bytes::new(),
        headers: Vec::new(),
        created_at: OffsetDateTime::UNIX_EPOCH,
        attempts: 0,
    }
}

/// A scratch file of a large transaction that cannot be written (a full disk): worth retrying,
/// the binlog sends the transaction again.
fn spill_error(e: std::io::Error) -> SourceError {
    SourceError::unavailable(
        "buffering a large transaction in a scratch file (source.spill_dir) failed",
    )
    .with_source(e)
}

/// One item of the binlog stream.
pub(super) type BinlogItem = Option<Result<mysql_async::binlog::events::Event, mysql_async::Error>>;

/// The source as the shared machinery reads its log ([`LogReader`]).
pub(super) struct Binlog<'a>(pub(super) &'a mut MySqlCdcSource);

impl LogReader for Binlog<'_> {
    type Meta = Meta;
    type Item = BinlogItem;

    fn stream(&self) -> &ChangeStream<Meta> {
        &self.0.cs
    }

    fn stream_mut(&mut self) -> &mut ChangeStream<Meta> {
        &mut self.0.cs
    }

    fn is_open(&self) -> bool {
        self.0.live.is_some()
    }

    fn next_item(&mut self) -> Option<impl Future<Output = BinlogItem> + Send + '_> {
        self.0.live.as_mut().map(|live| live.stream.next())
    }

    fn receive(&mut self, item: BinlogItem) -> Result<bool, SourceError> {
        self.0.receive(item)
    }

    fn lost(&mut self, error: SourceError) -> SourceError {
        self.0.lost(error)
    }

    fn mid_transaction(&self) -> bool {
        self.0.live.as_ref().is_some_and(|l| !l.pending.is_empty())
    }
}
