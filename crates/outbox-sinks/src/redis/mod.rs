//! Redis Streams sink (feature `redis`).
//!
//! Each event becomes one stream entry, appended with
//!
//! ```text
//! XADD <stream> [MAXLEN ~ <maxlen>] * id <event id> event_type <..> aggregate_type <..>
//!      aggregate_id <..> [h:<name> <value>]... payload <bytes>
//! ```
//!
//! | part | value |
//! | --- | --- |
//! | stream key | the `destination` template rendered for the event |
//! | entry id | assigned by Redis (`*`): milliseconds-sequence, increasing per stream |
//! | field `id` | the event id (UUID text): the consumer's deduplication key |
//! | fields `event_type`, `aggregate_type`, `aggregate_id` | the contract headers |
//! | fields `h:<name>` | each of the row's own headers (prefixed so that a header can never collide with a contract field or `payload`) |
//! | field `payload` | the payload bytes exactly (binary-safe), always the last field |
//!
//! With `format = "cloudevents-binary"` the fields before `payload` are the CloudEvents
//! attributes instead: `ce-specversion`, `ce-id`, `ce-source`, `ce-type`, `ce-subject`,
//! `ce-time`, `content-type` (= `datacontenttype`), the extensions as `ce-<name>`, values as
//! they are, and `payload` is the payload; with `"cloudevents-structured"` the entry is
//! `content-type application/cloudevents+json payload <JSON envelope>`. Redis has no
//! CloudEvents binding: these are the HTTP binding's names ([`BINDING`]).
//!
//! Redis does not deduplicate: a republished event (after a relay crash) is a second entry
//! with the same `id` field. Consumers deduplicate by `id` (the inbox does).
//!
//! A batch is one pipelined round trip: every `XADD` is written at once and the answers are
//! read together, in order (a batch over 32 MiB goes in several pipelines). An event counts as
//! delivered once Redis answered its `XADD` with an entry id. Durability is the server's:
//! with `appendfsync always` an acknowledged entry survives a crash of Redis, with the
//! default `everysec` up to a second of entries may not.
//!
//! | failure | kind |
//! | --- | --- |
//! | connection refused or lost, no answer within `response_timeout` | `Unavailable` (the whole batch) |
//! | server not accepting writes now: `LOADING`, `READONLY` (a replica), `MASTERDOWN`, `MISCONF`, `BUSY`, `TRYAGAIN`, `CLUSTERDOWN` | `Unavailable` |
//! | `OOM` (maxmemory reached), any other error of one `XADD` | `Transient` (retried with backoff) |
//! | `WRONGTYPE` (the key holds something other than a stream), `NOPERM` (ACL) | `Rejected`, naming the key |
//! | payload or header over the size limit, empty stream key | `Rejected`, before sending |

mod config;
mod readback;
mod scratch;

use std::fmt;

use outbox_core::cloudevents::{Binding, MessageFormat};
use outbox_core::sink::Delivery;
use outbox_core::{Destination, Event, Sink, SinkError, message};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{RedisError, Value};

pub use config::RedisConfig;
pub use readback::RedisReadBack;

use crate::secret::redact_url;

/// Redis' default `proto-max-bulk-len`, used when `CONFIG GET` is not allowed.
const DEFAULT_MAX_BULK_LEN: usize = 512 * 1024 * 1024;
/// Largest pipeline written in one go; bigger batches are split (Redis closes a client whose
/// query buffer passes `client-query-buffer-limit`, 1 GiB by default).
const PIPELINE_BYTES: usize = 32 * 1024 * 1024;
/// Prefix of the fields that carry the row's own headers.
pub const HEADER_FIELD_PREFIX: &str = "h:";
/// Name of the field that carries the payload.
pub const PAYLOAD_FIELD: &str = "payload";

/// The fields of the CloudEvents formats. Redis has no CloudEvents binding; these follow the
/// HTTP binding's names (`ce-<attribute>`, `content-type`) with values as they are (Redis
/// fields are binary-safe, so nothing is percent-encoded).
pub const BINDING: Binding = Binding {
    prefix: "ce-",
    data_content_type: Some("content-type"),
    structured_content_type: Some("content-type"),
    percent_encode: false,
};

/// Appends events to Redis streams; built from a [`RedisConfig`].
#[derive(Clone)]
pub struct RedisSink {
    connection: ConnectionManager,
    url: String,
    destination: Destination,
    maxlen: Option<usize>,
    limit: usize,
    server_limit: usize,
    format: MessageFormat,
}

impl fmt::Debug for RedisSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisSink")
            .field("url", &self.url)
            .field("destination", &self.destination.template())
            .field("maxlen", &self.maxlen)
            .field("limit", &self.limit)
            .finish_non_exhaustive()
    }
}

impl RedisSink {
    async fn connect(
        config: RedisConfig,
        client: redis::Client,
        format: MessageFormat,
    ) -> Result<Self, SinkError> {
        let url = redact_url(config.url.trim());
        let mut connection = manage(&config, client)
            .await
            .map_err(|e| connect_error(&url, e))?;

        let server_limit = match redis::cmd("CONFIG")
            .arg("GET")
            .arg("proto-max-bulk-len")
            .query_async::<Vec<String>>(&mut connection)
            .await
        {
            Ok(pair) => pair
                .get(1)
                .and_then(|v| v.parse().ok())
                .unwrap_or(DEFAULT_MAX_BULK_LEN),
            Err(e) if is_unavailable(&e) => return Err(connect_error(&url, e)),
            Err(e) => {
                tracing::debug!(error = %e, "CONFIG GET proto-max-bulk-len refused; assuming Redis' default 512 MiB");
                DEFAULT_MAX_BULK_LEN
            }
        };
        let limit = match config.max_payload {
            Some(configured) => configured.get().min(server_limit),
            None => server_limit,
        };
        Ok(Self {
            connection,
            url,
            destination: config.destination,
            maxlen: config.maxlen.map(std::num::NonZeroUsize::get),
            limit,
            server_limit,
            format,
        })
    }

    /// The largest payload or header value this sink sends, in bytes.
    pub fn max_payload(&self) -> usize {
        self.limit
    }

    /// The `XADD` of one event, and its size on the wire (roughly), or why it cannot be sent.
    fn command(&self, event: &Event) -> Result<(redis::Cmd, usize), SinkError> {
        let stream = self.destination.render(event);
        if stream.is_empty() {
            return Err(SinkError::rejected(format!(
                "destination `{}` renders to an empty stream key",
                self.destination
            )));
        }
        let mut cmd = redis::cmd("XADD");
        cmd.arg(&stream);
        if let Some(maxlen) = self.maxlen {
            cmd.arg("MAXLEN").arg("~").arg(maxlen);
        }
        cmd.arg("*");
        let mut size = stream.len() + 32;
        let mut largest = ("header", 0);
        let plain = self.format.is_plain();
        let encoded = self.format.encode(event, &BINDING, |name, value| {
            // The CloudEvents fields (`ce-...`, `content-type`) cannot collide with
            // `payload`; the plain message's row headers are prefixed so they cannot either.
            let contract = !plain
                || matches!(
                    name,
                    message::header::ID
                        | message::header::EVENT_TYPE
                        | message::header::AGGREGATE_TYPE
                        | message::header::AGGREGATE_ID
                );
            if contract {
                cmd.arg(name);
            } else {
                cmd.arg(format!("{HEADER_FIELD_PREFIX}{name}"));
            }
            cmd.arg(value);
            size += name.len() + value.len() + 16;
            if value.len() > largest.1 {
                largest = ("header", value.len());
            }
        });
        let body = encoded
            .map_err(|reason| crate::cloudevents::not_a_cloudevent(event, reason))?
            .body;
        if body.len() >= largest.1 {
            largest = ("payload", body.len());
        }
        cmd.arg(PAYLOAD_FIELD).arg(&body[..]);
        size += body.len() + 16;
        if largest.1 > self.limit {
            return Err(SinkError::rejected(format!(
                "{} of {} bytes exceeds the limit of {} bytes (Redis proto-max-bulk-len {})",
                largest.0, largest.1, self.limit, self.server_limit
            )));
        }
        Ok((cmd, size))
    }

    /// Sends `commands` as one pipeline; one answer per command, in order.
    async fn pipeline(&self, commands: Vec<redis::Cmd>) -> Result<Vec<Value>, RedisError> {
        let count = commands.len();
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        for cmd in commands {
            pipe.add_command(cmd);
        }
        let mut connection = self.connection.clone();
        let answers: Vec<Value> = pipe.query_async(&mut connection).await?;
        if answers.len() != count {
            return Err(RedisError::from((
                redis::ErrorKind::UnexpectedReturnType,
                "pipeline answered a different number of commands",
                format!("{} answers for {count} commands", answers.len()),
            )));
        }
        Ok(answers)
    }
}

/// The kind of a failure to reach the server at all.
/// A managed connection with `config`'s timeouts and one retry inside the client: an outage
/// should surface quickly as `Unavailable` so the relay backs off itself; the next command
/// reconnects.
async fn manage(
    config: &RedisConfig,
    client: redis::Client,
) -> Result<ConnectionManager, RedisError> {
    let manager_config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(config.connect_timeout))
        .set_response_timeout(Some(config.response_timeout))
        .set_number_of_retries(1)
        .set_max_delay(std::time::Duration::from_millis(500));
    ConnectionManager::new_with_config(client, manager_config).await
}

fn is_unavailable(e: &RedisError) -> bool {
    e.is_io_error() || e.is_timeout() || e.is_connection_refusal() || e.is_connection_dropped()
}

fn connect_error(url: &str, e: RedisError) -> SinkError {
    if matches!(e.kind(), redis::ErrorKind::AuthenticationFailed)
        || e.code().is_some_and(|c| c == "WRONGPASS" || c == "NOAUTH")
    {
        SinkError::rejected(format!(
            "Redis at {url} refused the credentials (check the user and password in sink.url)"
        ))
        .with_source(e)
    } else if is_unavailable(&e) {
        SinkError::unavailable(format!("cannot connect to Redis at {url}")).with_source(e)
    } else {
        SinkError::unavailable(format!("Redis at {url} did not complete the handshake"))
            .with_source(e)
    }
}

/// The failure of a whole pipeline (nothing can be assumed stored).
fn pipeline_error(url: &str, e: RedisError) -> SinkError {
    if e.is_timeout() {
        SinkError::unavailable(format!("Redis at {url} did not answer in time")).with_source(e)
    } else if e.is_connection_refusal() {
        SinkError::unavailable(format!("cannot connect to Redis at {url}")).with_source(e)
    } else {
        SinkError::unavailable(format!("lost the connection to Redis at {url}")).with_source(e)
    }
}

/// The failure of one `XADD`, from its error reply (`CODE detail`).
fn command_error(stream: &str, code: &str, detail: &str) -> SinkError {
    let text = format!("{code} {detail}");
    let text = text.trim();
    match code {
        "WRONGTYPE" => SinkError::rejected(format!(
            "key `{stream}` holds a value that is not a stream ({text})"
        )),
        "NOPERM" => SinkError::rejected(format!(
            "the Redis user may not append to `{stream}` ({text})"
        )),
        "LOADING" | "READONLY" | "MASTERDOWN" | "MISCONF" | "BUSY" | "TRYAGAIN" | "CLUSTERDOWN" => {
            SinkError::unavailable(format!(
                "Redis does not accept writes to `{stream}` now ({text})"
            ))
        }
        _ => SinkError::transient(format!("XADD to `{stream}` failed ({text})")),
    }
}

impl Sink for RedisSink {
    fn name(&self) -> &'static str {
        "redis"
    }

    async fn publish(&self, batch: &[Event]) -> Result<Vec<Delivery>, SinkError> {
        let mut deliveries: Vec<Option<Delivery>> = vec![None; batch.len()];
        let mut pending: Vec<(usize, redis::Cmd)> = Vec::with_capacity(batch.len());
        let mut chunks: Vec<Vec<(usize, redis::Cmd)>> = Vec::new();
        let mut chunk_bytes = 0;
        for (i, event) in batch.iter().enumerate() {
            match self.command(event) {
                Err(e) => deliveries[i] = Some(Err(e)),
                Ok((cmd, size)) => {
                    if chunk_bytes + size > PIPELINE_BYTES && !pending.is_empty() {
                        chunks.push(std::mem::take(&mut pending));
                        chunk_bytes = 0;
                    }
                    chunk_bytes += size;
                    pending.push((i, cmd));
                }
            }
        }
        if !pending.is_empty() {
            chunks.push(pending);
        }

        for chunk in chunks {
            let (indices, commands): (Vec<usize>, Vec<redis::Cmd>) = chunk.into_iter().unzip();
            match self.pipeline(commands).await {
                Ok(answers) => {
                    for (i, answer) in indices.into_iter().zip(answers) {
                        deliveries[i] = Some(match answer {
                            Value::ServerError(e) => Err(command_error(
                                &self.destination.render(&batch[i]),
                                e.code(),
                                e.details().unwrap_or_default(),
                            )),
                            _ => Ok(()),
                        });
                    }
                }
                Err(e) => {
                    let err = pipeline_error(&self.url, e);
                    for i in indices {
                        deliveries[i] = Some(Err(err.clone()));
                    }
                }
            }
        }
        crate::broker::collapse_decided(deliveries, "event was not attempted")
    }

    async fn healthcheck(&self) -> Result<(), SinkError> {
        let mut connection = self.connection.clone();
        match redis::cmd("PING")
            .query_async::<String>(&mut connection)
            .await
        {
            Ok(_) => Ok(()),
            Err(e) => Err(SinkError::unavailable(format!(
                "Redis at {} is unreachable or did not answer PING",
                self.url
            ))
            .with_source(e)),
        }
    }
}

crate::build_sink!(RedisConfig, "redis", |config, event| format!(
    "Redis stream {}",
    config.destination.render(event)
), message_limit: |c| c.max_payload.map_or(DEFAULT_MAX_BULK_LEN, std::num::NonZeroUsize::get), destination: destination, read_back: readback::read_back,
scratch: scratch::scratch, remove_scratch: scratch::remove_scratch);

#[cfg(test)]
mod tests {
    use super::*;
    use outbox_core::SinkErrorKind::*;

    #[test]
    fn error_replies_map_to_kinds() {
        let kind = |code: &str| command_error("s", code, "detail").kind();
        assert_eq!(kind("WRONGTYPE"), Rejected);
        assert_eq!(kind("NOPERM"), Rejected);
        assert_eq!(kind("OOM"), Transient);
        assert_eq!(kind("ERR"), Transient);
        assert_eq!(kind("LOADING"), Unavailable);
        assert_eq!(kind("READONLY"), Unavailable);
        assert_eq!(kind("MISCONF"), Unavailable);
        let e = command_error(
            "orders",
            "WRONGTYPE",
            "Operation against a key holding the wrong kind of value",
        );
        assert_eq!(
            e.to_string(),
            "key `orders` holds a value that is not a stream (WRONGTYPE Operation against a key \
             holding the wrong kind of value)"
        );
    }
}
