//! [`StreamConsumer`] (feature `redis`): a Redis Streams consumer-group loop.
//!
//! - **Group.** `XGROUP CREATE <stream> <group> <start_id> MKSTREAM` when the group is
//!   missing; then `XREADGROUP ... STREAMS <stream> >` on a connection of its own (a
//!   blocking read would stall other commands on a shared one).
//! - **Ack after commit.** `XACK` only after the handler returned `Ok`. A crash between commit
//!   and ack leaves the entry pending; it comes back (see recovery) and the inbox reports a
//!   duplicate.
//! - **Recovery.** At start the consumer first re-reads its own pending entries (`XREADGROUP
//!   ... 0`), so a restart under the same `consumer` name picks up where it crashed. Every
//!   `claim_idle / 2` it runs `XAUTOCLAIM` for entries idle longer than `claim_idle`: those
//!   of a consumer that died. Entries it is retrying are kept fresh (`XCLAIM ... JUSTID`),
//!   so a live consumer's entries are not stolen.
//! - **Failures.** Retried in place with backoff by the shared [lanes](crate::lane). After
//!   `max_attempts` (Redis' delivery count included, for recovered entries) the entry is
//!   copied to the dead-letter stream with `dead_reason`, `dead_stream`, `dead_entry` fields
//!   and acknowledged, in one `MULTI`/`EXEC`: never a silent ack. An entry without the
//!   contract fields is dead-lettered the same way at once.
//! - **Shutdown.** Cancel the token: reading stops, entries in handlers finish and are
//!   acked, the rest stay pending for the next start (or another consumer's `XAUTOCLAIM`).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use redis::aio::{ConnectionManager, MultiplexedConnection};
use redis::streams::{StreamAutoClaimReply, StreamId, StreamPendingCountReply, StreamReadReply};
use redis::{AsyncConnectionConfig, Value};
use tokio_util::sync::CancellationToken;

use crate::InboxMessage;
use crate::lane::{
    BoxError, ConsumerError, ConsumerOrder, ConsumerReport, LanePolicy, Lanes, MessageHandler,
    Settle,
};

const BROKER: &str = "Redis";
/// Prefix of the fields that carry the row's own headers (as the sink writes them).
const HEADER_FIELD_PREFIX: &str = "h:";
/// The field that carries the payload.
const PAYLOAD_FIELD: &str = "payload";

/// Config and runner of one consumer of a Redis Streams consumer group.
#[derive(Debug, Clone)]
pub struct StreamConsumer {
    /// Server URL, e.g. `redis://127.0.0.1:6379`.
    pub url: String,
    /// The stream key (the relay's rendered destination).
    pub stream: String,
    /// Consumer group: each group gets every entry once.
    pub group: String,
    /// This consumer's name in the group; keep it stable across restarts so the consumer
    /// re-reads its own pending entries.
    pub consumer: String,
    /// Where a new group starts: `0` (the whole stream, default) or `$` (new entries only).
    pub start_id: String,
    /// Entries idle (unacknowledged) longer than this are claimed from dead consumers.
    /// Keep it above the longest handler run. Default 60 s.
    pub claim_idle: Duration,
    /// The stream dead entries go to. Default `<stream>.dead`.
    pub dead_letter_stream: Option<String>,
    /// Longest `XREADGROUP ... BLOCK` (also how quickly a quiet loop notices shutdown).
    /// Default 1 s.
    pub block: Duration,
    /// Lanes, in-flight bound (`COUNT` of each read), attempts and backoff.
    pub policy: LanePolicy,
    /// Per-aggregate order across crashes and instances (`None`: per-key order within this
    /// instance only). Build it with the inbox's `order_gate`; see [`ConsumerOrder`].
    pub ordered: Option<ConsumerOrder>,
}

impl StreamConsumer {
    /// A consumer `consumer` of group `group` on `stream`, with the defaults.
    pub fn new(
        url: impl Into<String>,
        stream: impl Into<String>,
        group: impl Into<String>,
        consumer: impl Into<String>,
    ) -> Self {
        Self {
            url: url.into(),
            stream: stream.into(),
            group: group.into(),
            consumer: consumer.into(),
            start_id: "0".to_owned(),
            claim_idle: Duration::from_secs(60),
            dead_letter_stream: None,
            block: Duration::from_secs(1),
            policy: LanePolicy::default(),
            ordered: None,
        }
    }

    /// The dead-letter stream's key.
    pub fn dead_letter_stream(&self) -> String {
        self.dead_letter_stream
            .clone()
            .unwrap_or_else(|| format!("{}.dead", self.stream))
    }

    fn millis(d: Duration) -> u64 {
        u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
    }

    /// Runs until `shutdown` is cancelled, calling `handler` for each entry (see
    /// [`MessageHandler`]), and returns what it did.
    pub async fn run<H: MessageHandler>(
        &self,
        handler: H,
        shutdown: CancellationToken,
    ) -> Result<ConsumerReport, ConsumerError> {
        let connect = |e: redis::RedisError| ConsumerError::connect(BROKER, &self.url, e);
        let client = redis::Client::open(self.url.as_str()).map_err(connect)?;
        let mut commands = ConnectionManager::new(client.clone())
            .await
            .map_err(connect)?;
        let created: redis::RedisResult<()> = redis::cmd("XGROUP")
            .arg("CREATE")
            .arg(&self.stream)
            .arg(&self.group)
            .arg(&self.start_id)
            .arg("MKSTREAM")
            .query_async(&mut commands)
            .await;
        match created {
            Err(e) if e.code() != Some("BUSYGROUP") => {
                return Err(ConsumerError::broker(
                    BROKER,
                    format!("create group {} on {}", self.group, self.stream),
                    e,
                ));
            }
            _ => {}
        }
        let read_config = AsyncConnectionConfig::new()
            .set_response_timeout(Some(self.block + Duration::from_secs(10)));
        let mut reads = client
            .get_multiplexed_async_connection_with_config(&read_config)
            .await
            .map_err(connect)?;

        let settle = Arc::new(RedisSettle {
            connection: commands,
            stream: self.stream.clone(),
            group: self.group.clone(),
            consumer: self.consumer.clone(),
            dead: self.dead_letter_stream(),
            claim_idle: self.claim_idle,
            in_flight: Mutex::new(HashSet::new()),
        });
        let lanes = Lanes::start(
            &self.policy,
            self.ordered.clone(),
            Arc::clone(&settle),
            handler,
            &shutdown,
        );

        // Own pending entries first (a restart after a crash).
        let mut own = "0".to_owned();
        'recover: while !shutdown.is_cancelled() {
            let entries = match self.read(&mut reads, &own, false).await {
                Ok(entries) => entries,
                Err(e) => {
                    tracing::warn!(error = %e, "re-reading own pending entries failed; skipping to new ones");
                    break;
                }
            };
            let Some(last) = entries.last() else { break };
            own = last.id.clone();
            for entry in entries {
                if !self.dispatch(&lanes, &settle, entry, true, &shutdown).await {
                    break 'recover;
                }
            }
        }

        let claim_every = (self.claim_idle / 2).max(Duration::from_millis(100));
        let mut next_claim = tokio::time::Instant::now() + claim_every;
        let mut cursor = "0-0".to_owned();
        'main: while !shutdown.is_cancelled() {
            if tokio::time::Instant::now() >= next_claim {
                next_claim = tokio::time::Instant::now() + claim_every;
                match self.autoclaim(&settle, &cursor).await {
                    Ok((next, entries)) => {
                        cursor = next;
                        for entry in entries {
                            if !self.dispatch(&lanes, &settle, entry, true, &shutdown).await {
                                break 'main;
                            }
                        }
                    }
                    Err(e) => tracing::warn!(error = %e, "XAUTOCLAIM failed"),
                }
            }
            let read = tokio::select! {
                () = shutdown.cancelled() => break,
                read = self.read(&mut reads, ">", true) => read,
            };
            match read {
                Ok(entries) => {
                    for entry in entries {
                        if !self
                            .dispatch(&lanes, &settle, entry, false, &shutdown)
                            .await
                        {
                            break 'main;
                        }
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "XREADGROUP failed; retrying");
                    tokio::select! {
                        () = shutdown.cancelled() => break,
                        () = tokio::time::sleep(Duration::from_secs(1)) => {}
                    }
                }
            }
        }
        Ok(lanes.finish().await)
    }

    /// One `XREADGROUP` from `id` (`>` for new entries), blocking when `block`.
    async fn read(
        &self,
        reads: &mut MultiplexedConnection,
        id: &str,
        block: bool,
    ) -> redis::RedisResult<Vec<StreamId>> {
        let mut cmd = redis::cmd("XREADGROUP");
        cmd.arg("GROUP").arg(&self.group).arg(&self.consumer);
        cmd.arg("COUNT").arg(self.policy.max_in_flight.get());
        if block {
            cmd.arg("BLOCK").arg(Self::millis(self.block));
        }
        cmd.arg("STREAMS").arg(&self.stream).arg(id);
        let reply: Option<StreamReadReply> = cmd.query_async(reads).await?;
        Ok(reply
            .into_iter()
            .flat_map(|r| r.keys)
            .flat_map(|k| k.ids)
            .collect())
    }

    /// One `XAUTOCLAIM` step from `cursor`; acks entries deleted from the stream meanwhile.
    async fn autoclaim(
        &self,
        settle: &RedisSettle,
        cursor: &str,
    ) -> redis::RedisResult<(String, Vec<StreamId>)> {
        let mut connection = settle.connection.clone();
        let reply: StreamAutoClaimReply = redis::cmd("XAUTOCLAIM")
            .arg(&self.stream)
            .arg(&self.group)
            .arg(&self.consumer)
            .arg(Self::millis(self.claim_idle))
            .arg(cursor)
            .arg("COUNT")
            .arg(self.policy.max_in_flight.get())
            .query_async(&mut connection)
            .await?;
        if !reply.deleted_ids.is_empty() {
            tracing::warn!(ids = ?reply.deleted_ids, "pending entries were deleted from the stream before being processed");
            let _: redis::RedisResult<i64> = redis::cmd("XACK")
                .arg(&self.stream)
                .arg(&self.group)
                .arg(&reply.deleted_ids)
                .query_async(&mut connection)
                .await;
        }
        Ok((reply.next_stream_id, reply.claimed))
    }

    /// Parses one entry and hands it to the lanes (or dead-letters it). `recovered`: it was
    /// delivered before, so its delivery count is looked up. `false` on shutdown.
    async fn dispatch(
        &self,
        lanes: &Lanes<RedisSettle>,
        settle: &RedisSettle,
        entry: StreamId,
        recovered: bool,
        shutdown: &CancellationToken,
    ) -> bool {
        if !settle.track(&entry.id) {
            return true; // already in a lane (claimed back from ourselves)
        }
        let earlier_attempts = if recovered {
            settle.delivered(&entry.id).await.saturating_sub(1)
        } else {
            0
        };
        let handle = Entry {
            id: entry.id,
            fields: entry.map,
        };
        let parsed = parse(&handle.fields);
        lanes
            .offer(handle, parsed, earlier_attempts, shutdown)
            .await
    }
}

fn text(value: &Value) -> Option<&str> {
    match value {
        Value::BulkString(b) => std::str::from_utf8(b).ok(),
        Value::SimpleString(s) => Some(s),
        _ => None,
    }
}

/// The entry's fields as the sink wrote them, back into a message.
fn parse(fields: &HashMap<String, Value>) -> Result<InboxMessage, String> {
    let payload = match fields.get(PAYLOAD_FIELD) {
        Some(Value::BulkString(b)) => Bytes::copy_from_slice(b),
        _ => return Err(format!("the entry has no `{PAYLOAD_FIELD}` field")),
    };
    let headers = fields.iter().filter_map(|(name, value)| {
        if name == PAYLOAD_FIELD {
            return None;
        }
        let name = name.strip_prefix(HEADER_FIELD_PREFIX).unwrap_or(name);
        Some((name, text(value)?))
    });
    InboxMessage::from_headers(headers, &[], payload).map_err(|e| e.to_string())
}

/// One delivered entry.
struct Entry {
    id: String,
    fields: HashMap<String, Value>,
}

/// Acks, dead-letters and keeps entries alive.
struct RedisSettle {
    connection: ConnectionManager,
    stream: String,
    group: String,
    consumer: String,
    dead: String,
    claim_idle: Duration,
    /// Entry ids held by a lane: `XAUTOCLAIM` may return our own slow entries.
    in_flight: Mutex<HashSet<String>>,
}

impl RedisSettle {
    /// Marks an entry in flight; `false` when it already was.
    fn track(&self, id: &str) -> bool {
        self.in_flight
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(id.to_owned())
    }

    fn untrack(&self, id: &str) {
        self.in_flight
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(id);
    }

    /// How many times the group delivered `id` (1 when unknown).
    async fn delivered(&self, id: &str) -> u32 {
        let mut connection = self.connection.clone();
        let reply: redis::RedisResult<StreamPendingCountReply> = redis::cmd("XPENDING")
            .arg(&self.stream)
            .arg(&self.group)
            .arg(id)
            .arg(id)
            .arg(1)
            .query_async(&mut connection)
            .await;
        reply
            .ok()
            .and_then(|r| r.ids.first().map(|p| p.times_delivered))
            .map_or(1, |n| u32::try_from(n).unwrap_or(u32::MAX))
    }
}

impl Settle for RedisSettle {
    type Handle = Entry;

    async fn ack(&self, entry: Entry) -> Result<(), BoxError> {
        let mut connection = self.connection.clone();
        let acked: redis::RedisResult<i64> = redis::cmd("XACK")
            .arg(&self.stream)
            .arg(&self.group)
            .arg(&entry.id)
            .query_async(&mut connection)
            .await;
        self.untrack(&entry.id);
        acked.map(drop).map_err(Into::into)
    }

    async fn dead_letter(
        &self,
        entry: Entry,
        _: Option<&InboxMessage>,
        reason: &str,
    ) -> Result<(), BoxError> {
        let mut xadd = redis::cmd("XADD");
        xadd.arg(&self.dead).arg("*");
        for (name, value) in &entry.fields {
            match value {
                Value::BulkString(b) => xadd.arg(name).arg(&b[..]),
                Value::SimpleString(v) => xadd.arg(name).arg(v),
                Value::Int(v) => xadd.arg(name).arg(v),
                _ => continue,
            };
        }
        xadd.arg("dead_reason").arg(reason);
        xadd.arg("dead_stream").arg(&self.stream);
        xadd.arg("dead_entry").arg(&entry.id);
        let mut xack = redis::cmd("XACK");
        xack.arg(&self.stream).arg(&self.group).arg(&entry.id);
        let mut pipe = redis::pipe();
        pipe.atomic().add_command(xadd).add_command(xack);
        let mut connection = self.connection.clone();
        let done: redis::RedisResult<(String, i64)> = pipe.query_async(&mut connection).await;
        self.untrack(&entry.id);
        done.map(drop).map_err(Into::into)
    }

    async fn release(&self, entry: Entry) {
        // Left pending: the next start re-reads it, or another consumer claims it.
        self.untrack(&entry.id);
    }

    fn keep_alive_every(&self) -> Option<Duration> {
        Some(self.claim_idle / 2)
    }

    async fn keep_alive(&self, entry: &Entry) {
        if let Some(ping) = self.keep_alive_owned(entry) {
            ping.await;
        }
    }

    fn keep_alive_owned(&self, entry: &Entry) -> Option<futures::future::BoxFuture<'static, ()>> {
        let mut connection = self.connection.clone();
        let mut xclaim = redis::cmd("XCLAIM");
        xclaim
            .arg(&self.stream)
            .arg(&self.group)
            .arg(&self.consumer)
            .arg(0)
            .arg(&entry.id)
            .arg("JUSTID");
        Some(Box::pin(async move {
            let _: redis::RedisResult<Value> = xclaim.query_async(&mut connection).await;
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_written_by_the_sink_parse_back_and_a_missing_payload_is_named() {
        let s = |v: &str| Value::BulkString(v.as_bytes().to_vec());
        let mut fields = HashMap::from([
            ("id".to_owned(), s("00000000-0000-0000-0000-000000000007")),
            ("event_type".to_owned(), s("order.placed")),
            ("aggregate_type".to_owned(), s("Order")),
            ("aggregate_id".to_owned(), s("o_1")),
            ("h:tenant".to_owned(), s("acme")),
            ("payload".to_owned(), Value::BulkString(vec![0, 255])),
        ]);
        let m = parse(&fields).expect("parses");
        assert_eq!(m.id.as_u128(), 7);
        assert_eq!(m.headers, vec![("tenant".to_owned(), "acme".to_owned())]);
        assert_eq!(&m.payload[..], &[0, 255]);
        fields.remove("payload");
        assert_eq!(
            parse(&fields).err().as_deref(),
            Some("the entry has no `payload` field")
        );
    }
}
