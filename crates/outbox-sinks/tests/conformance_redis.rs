//! The sink conformance suite against a private `redis-server` (the suite stops and restarts
//! it), read back with `XRANGE` as a stream consumer would.

#![cfg(feature = "redis")]

use std::time::{Duration, Instant};

use bytes::Bytes;
use outbox_sinks::redis::{HEADER_FIELD_PREFIX, PAYLOAD_FIELD};
use outbox_sinks::{RedisConfig, RedisSink};
use outbox_testkit::services::Redis;
use outbox_testkit::sink_conformance::{self, Dedupe, Received, SinkHarness, Target};
use redis::Value;

struct RedisHarness {
    redis: Redis,
}

impl SinkHarness for RedisHarness {
    type Sink = RedisSink;

    async fn sink(&self, target: &Target) -> anyhow::Result<RedisSink> {
        let config = RedisConfig {
            url: self.redis.url().to_owned(),
            destination: target.template.clone(),
            connect_timeout: Duration::from_secs(2),
            response_timeout: Duration::from_secs(3),
            ..RedisConfig::default()
        };
        Ok(config.build().await?)
    }

    async fn received(&self, target: &Target, at_least: usize) -> anyhow::Result<Vec<Received>> {
        let client = redis::Client::open(self.redis.url())?;
        let mut connection = client.get_multiplexed_async_connection().await?;
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let mut received = Vec::new();
            for stream in &target.destinations {
                let entries: Value = redis::cmd("XRANGE")
                    .arg(stream)
                    .arg("-")
                    .arg("+")
                    .query_async(&mut connection)
                    .await?;
                received.extend(entries_of(stream, entries)?);
            }
            if received.len() >= at_least || Instant::now() >= deadline {
                return Ok(received);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn stop_broker(&self) -> anyhow::Result<()> {
        self.redis.stop().await
    }

    async fn restart_broker(&self) -> anyhow::Result<()> {
        self.redis.restart().await
    }

    fn broker_address(&self) -> String {
        format!("127.0.0.1:{}", self.redis.port())
    }

    fn max_message_size(&self) -> usize {
        Redis::MAX_BULK_LEN
    }

    fn dedupe(&self) -> Dedupe {
        Dedupe::No
    }
}

/// The entries of an `XRANGE` reply as messages: the contract fields as headers, `h:<name>`
/// fields as row headers, `payload` as the body.
fn entries_of(stream: &str, reply: Value) -> anyhow::Result<Vec<Received>> {
    let Value::Array(entries) = reply else {
        anyhow::bail!("XRANGE answered {reply:?}");
    };
    let mut out = Vec::new();
    for entry in entries {
        let Value::Array(mut parts) = entry else {
            anyhow::bail!("stream entry is not an array");
        };
        let Some(Value::Array(fields)) = parts.pop() else {
            anyhow::bail!("stream entry without fields");
        };
        let mut headers = Vec::new();
        let mut body = None;
        for pair in fields.chunks(2) {
            let [Value::BulkString(name), Value::BulkString(value)] = pair else {
                anyhow::bail!("field pair {pair:?}");
            };
            let name = String::from_utf8(name.clone())?;
            if name == PAYLOAD_FIELD {
                body = Some(Bytes::from(value.clone()));
            } else {
                let name = name
                    .strip_prefix(HEADER_FIELD_PREFIX)
                    .map_or(name.clone(), str::to_owned);
                headers.push((name, String::from_utf8(value.clone())?));
            }
        }
        out.push(Received {
            destination: stream.to_owned(),
            key: None,
            headers,
            body: body.ok_or_else(|| anyhow::anyhow!("entry without a payload field"))?,
        });
    }
    Ok(out)
}

#[tokio::test]
async fn redis_streams_sink_passes_the_sink_conformance_suite() -> anyhow::Result<()> {
    outbox_testkit::init_tracing();
    let harness = RedisHarness {
        redis: Redis::start().await?,
    };
    sink_conformance::run_all(&harness).await
}
