//! [`StreamFaults`]: a fault-injecting wrapper of the DynamoDB Streams API, for what moto's
//! server cannot be made to show: a shard split, expired iterators, throttling and records
//! trimmed by the 24-hour retention.
//!
//! It is an HTTP proxy on 127.0.0.1 in front of moto (point the relay's `endpoint_url` at
//! it). Table calls pass through unchanged. Stream calls (`X-Amz-Target:
//! DynamoDBStreams_20120810.*`) are answered from moto's one real shard, presented as AWS
//! would present it:
//!
//! - **Split** ([`StreamFaults::split`]): the real shard closes after its current last record
//!   (its `EndingSequenceNumber`; reads return no `NextShardIterator` once past it) and two
//!   child shards with it as `ParentShardId` carry every later record, each record going to
//!   a child by a hash of its whole key: one partition key's items (an aggregate split by
//!   sort key) spread over both children, as on AWS.
//! - **Throttling** ([`StreamFaults::throttle`]): the next reads answer
//!   `LimitExceededException`.
//! - **Expired iterators** ([`StreamFaults::expire`]): the next reads answer
//!   `ExpiredIteratorException`.
//! - **Trim** ([`StreamFaults::trim_through`]): records up to a sequence number are gone:
//!   reads skip them, and an iterator after one of them answers
//!   `TrimmedDataAccessException`.
//!
//! Iterators are the proxy's own (`shard|after`), so a read resumes anywhere in a virtual
//! shard. The proxy also checks the lineage rule from the reader's side: a read of a child
//! shard before its parent was read to its end is counted in [`Observed::child_before_parent`].

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use anyhow::Context;
use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::Response;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

const TARGET_PREFIX: &str = "DynamoDBStreams_20120810.";
const CHILDREN: [&str; 2] = ["-child-a", "-child-b"];

/// What the proxy saw readers do.
#[derive(Debug, Default, Clone)]
pub struct Observed {
    /// Reads answered with an injected fault.
    pub faults_served: u64,
    /// Reads of a child shard made before its parent was read to its end (must stay 0).
    pub child_before_parent: u64,
    /// Shards whose end a reader reached (a read that returned no `NextShardIterator`).
    pub closed_read: HashSet<String>,
    /// Shards read at least once.
    pub read: HashSet<String>,
    /// Iterators asked for after a trimmed record.
    pub trimmed_refusals: u64,
}

#[derive(Debug, Default)]
struct Faults {
    /// The real shard's last sequence number when the split happened.
    split_at: Option<u128>,
    real_shard: Option<String>,
    throttle: u32,
    expire: u32,
    /// Records with a sequence number up to this one are gone.
    trimmed_through: Option<u128>,
    /// At most this many records per read (AWS may return fewer than asked).
    page_size: Option<usize>,
    observed: Observed,
}

#[derive(Clone)]
struct Proxy {
    base: String,
    client: reqwest::Client,
    faults: Arc<Mutex<Faults>>,
}

/// A running fault-injecting proxy; stops when dropped.
#[derive(Debug)]
pub struct StreamFaults {
    url: String,
    faults: Arc<Mutex<Faults>>,
    upstream: String,
    task: JoinHandle<()>,
}

impl StreamFaults {
    /// A proxy in front of `upstream` (moto, or a proxy in front of it: `http://host:port`).
    pub async fn start(upstream: &str) -> anyhow::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}", listener.local_addr()?);
        let faults = Arc::new(Mutex::new(Faults::default()));
        let state = Proxy {
            base: upstream.trim_end_matches('/').to_owned(),
            client: reqwest::Client::builder()
                .build()
                .context("building the proxy's client")?,
            faults: faults.clone(),
        };
        let app = Router::new().fallback(handle).with_state(state);
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(Self {
            url,
            faults,
            upstream: upstream.trim_end_matches('/').to_owned(),
            task,
        })
    }

    /// `http://127.0.0.1:PORT`, the `endpoint_url` for the relay.
    pub fn url(&self) -> &str {
        &self.url
    }

    fn with<T>(&self, f: impl FnOnce(&mut Faults) -> T) -> T {
        let mut faults = self.faults.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut faults)
    }

    /// Returns at most `records` per `GetRecords` call, as AWS may, so that reading a shard
    /// to its end takes several reads.
    pub fn page_size(&self, records: usize) {
        self.with(|f| f.page_size = Some(records.max(1)));
    }

    /// Answers the next `reads` `GetRecords` calls with `LimitExceededException`.
    pub fn throttle(&self, reads: u32) {
        self.with(|f| f.throttle += reads);
    }

    /// Answers the next `reads` `GetRecords` calls with `ExpiredIteratorException`.
    pub fn expire(&self, reads: u32) {
        self.with(|f| f.expire += reads);
    }

    /// Makes every record up to sequence number `seqnum` gone, as the 24-hour retention does.
    pub fn trim_through(&self, seqnum: u128) {
        self.with(|f| f.trimmed_through = Some(seqnum));
    }

    /// What readers did so far.
    pub fn observed(&self) -> Observed {
        self.with(|f| f.observed.clone())
    }

    /// The sequence number of the stream's last record now (0 when it has none).
    pub async fn last_seqnum(&self, stream_arn: &str) -> anyhow::Result<u128> {
        let proxy = Proxy {
            base: self.upstream.clone(),
            client: reqwest::Client::new(),
            faults: self.faults.clone(),
        };
        let shard = proxy.real_shard(stream_arn).await?;
        let mut after = None;
        let mut last = 0;
        loop {
            let records = proxy.upstream_records(stream_arn, &shard, after).await?;
            let Some(max) = records.iter().filter_map(seqnum).max() else {
                return Ok(last);
            };
            last = max;
            after = Some(max);
        }
    }

    /// Splits the stream's shard now: it closes after its last record and two children
    /// carry what comes next. Returns the split point (the parent's last sequence number).
    pub async fn split(&self, stream_arn: &str) -> anyhow::Result<u128> {
        let at = self.last_seqnum(stream_arn).await?;
        self.with(|f| f.split_at = Some(at));
        Ok(at)
    }
}

impl Drop for StreamFaults {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn seqnum(record: &Value) -> Option<u128> {
    record
        .pointer("/dynamodb/SequenceNumber")
        .and_then(Value::as_str)
        .and_then(|s| s.parse().ok())
}

/// Which child a record goes to: a hash of its whole key (FNV-1a over the canonical JSON).
fn child_of(record: &Value) -> usize {
    let keys = record
        .pointer("/dynamodb/Keys")
        .map(Value::to_string)
        .unwrap_or_default();
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for b in keys.bytes() {
        hash ^= u64::from(b);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    (hash % 2) as usize
}

fn error(code: &str, message: &str) -> Response {
    Response::builder()
        .status(StatusCode::BAD_REQUEST)
        .header("content-type", "application/x-amz-json-1.0")
        .body(Body::from(
            json!({"__type": format!("com.amazonaws.dynamodb.v20120810#{code}"), "message": message})
                .to_string(),
        ))
        .unwrap_or_default()
}

fn ok(body: Value) -> Response {
    Response::builder()
        .status(StatusCode::OK)
        .header("content-type", "application/x-amz-json-1.0")
        .body(Body::from(body.to_string()))
        .unwrap_or_default()
}

/// A proxy iterator: the virtual shard and the last sequence number read (`-` for none).
fn iterator(arn: &str, shard: &str, after: Option<u128>) -> String {
    let after = after.map_or_else(|| "-".to_owned(), |a| a.to_string());
    format!("{arn}|{shard}|{after}")
}

fn parse_iterator(it: &str) -> Option<(String, String, Option<u128>)> {
    let mut parts = it.rsplitn(3, '|');
    let after = parts.next()?;
    let shard = parts.next()?.to_owned();
    let arn = parts.next()?.to_owned();
    let after = if after == "-" {
        None
    } else {
        Some(after.parse().ok()?)
    };
    Some((arn, shard, after))
}

impl Proxy {
    fn lock(&self) -> std::sync::MutexGuard<'_, Faults> {
        self.faults.lock().unwrap_or_else(|e| e.into_inner())
    }

    async fn call(&self, target: &str, body: Value) -> anyhow::Result<Value> {
        let answer = self
            .client
            .post(format!("{}/", self.base))
            .header("x-amz-target", format!("{TARGET_PREFIX}{target}"))
            .header("content-type", "application/x-amz-json-1.0")
            .header(
                "authorization",
                "AWS4-HMAC-SHA256 Credential=testing/20260101/us-east-1/dynamodb/aws4_request, SignedHeaders=host, Signature=0",
            )
            .body(body.to_string())
            .send()
            .await?;
        let status = answer.status();
        let text = answer.text().await?;
        anyhow::ensure!(status.is_success(), "{target}: {status}: {text}");
        Ok(serde_json::from_str(&text)?)
    }

    async fn real_shard(&self, arn: &str) -> anyhow::Result<String> {
        if let Some(s) = self.lock().real_shard.clone() {
            return Ok(s);
        }
        let out = self
            .call("DescribeStream", json!({"StreamArn": arn}))
            .await?;
        let shard = out
            .pointer("/StreamDescription/Shards/0/ShardId")
            .and_then(Value::as_str)
            .context("the stream has no shard")?
            .to_owned();
        self.lock().real_shard = Some(shard.clone());
        Ok(shard)
    }

    /// One page of the real shard's records after `after`.
    async fn upstream_records(
        &self,
        arn: &str,
        shard: &str,
        after: Option<u128>,
    ) -> anyhow::Result<Vec<Value>> {
        let request = match after {
            Some(a) => json!({"StreamArn": arn, "ShardId": shard,
                "ShardIteratorType": "AFTER_SEQUENCE_NUMBER", "SequenceNumber": a.to_string()}),
            None => {
                json!({"StreamArn": arn, "ShardId": shard, "ShardIteratorType": "TRIM_HORIZON"})
            }
        };
        let it = self.call("GetShardIterator", request).await?;
        let it = it
            .get("ShardIterator")
            .and_then(Value::as_str)
            .context("no iterator")?
            .to_owned();
        let out = self
            .call("GetRecords", json!({"ShardIterator": it, "Limit": 1000}))
            .await?;
        Ok(out
            .get("Records")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default())
    }

    async fn describe(&self, body: &Value) -> anyhow::Result<Response> {
        let arn = body
            .get("StreamArn")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let mut out = self
            .call("DescribeStream", json!({"StreamArn": arn}))
            .await?;
        let Some(real) = out
            .pointer("/StreamDescription/Shards/0")
            .cloned()
            .filter(|s| s.get("ShardId").is_some())
        else {
            return Ok(ok(out));
        };
        let real_id = real
            .get("ShardId")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        self.lock().real_shard = Some(real_id.clone());
        let split = self.lock().split_at;
        if let Some(at) = split {
            let mut parent = real.clone();
            parent["SequenceNumberRange"]["EndingSequenceNumber"] = json!(at.to_string());
            let mut shards = vec![parent];
            for suffix in CHILDREN {
                shards.push(json!({
                    "ShardId": format!("{real_id}{suffix}"),
                    "ParentShardId": real_id,
                    "SequenceNumberRange": {"StartingSequenceNumber": (at + 1).to_string()},
                }));
            }
            out["StreamDescription"]["Shards"] = json!(shards);
        }
        Ok(ok(out))
    }

    fn shard_iterator(&self, body: &Value) -> Response {
        let arn = body
            .get("StreamArn")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let shard = body
            .get("ShardId")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let kind = body
            .get("ShardIteratorType")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let number: Option<u128> = body
            .get("SequenceNumber")
            .and_then(Value::as_str)
            .and_then(|s| s.parse().ok());
        let after = match kind {
            "TRIM_HORIZON" => None,
            "AFTER_SEQUENCE_NUMBER" => number,
            "AT_SEQUENCE_NUMBER" => number.map(|n| n.saturating_sub(1)),
            other => {
                return error(
                    "ValidationException",
                    &format!("the fault proxy does not serve {other} iterators"),
                );
            }
        };
        let mut faults = self.lock();
        if let (Some(a), Some(t)) = (after, faults.trimmed_through)
            && a < t
        {
            faults.observed.trimmed_refusals += 1;
            return error(
                "TrimmedDataAccessException",
                "the requested sequence number is beyond the trim horizon",
            );
        }
        ok(json!({"ShardIterator": iterator(arn, shard, after)}))
    }

    async fn records(&self, body: &Value) -> anyhow::Result<Response> {
        let Some((arn, shard, after)) = body
            .get("ShardIterator")
            .and_then(Value::as_str)
            .and_then(parse_iterator)
        else {
            return Ok(error(
                "ValidationException",
                "not an iterator of the fault proxy",
            ));
        };
        let limit = body
            .get("Limit")
            .and_then(Value::as_u64)
            .unwrap_or(1000)
            .max(1) as usize;
        let limit = self.lock().page_size.map_or(limit, |p| p.min(limit));
        let (split, trimmed) = {
            let mut faults = self.lock();
            if faults.throttle > 0 {
                faults.throttle -= 1;
                faults.observed.faults_served += 1;
                return Ok(error(
                    "LimitExceededException",
                    "too many reads of this shard (injected)",
                ));
            }
            if faults.expire > 0 {
                faults.expire -= 1;
                faults.observed.faults_served += 1;
                return Ok(error(
                    "ExpiredIteratorException",
                    "the iterator expired (injected)",
                ));
            }
            if let (Some(a), Some(t)) = (after, faults.trimmed_through)
                && a < t
            {
                faults.observed.trimmed_refusals += 1;
                return Ok(error(
                    "TrimmedDataAccessException",
                    "the iterator points before the trim horizon",
                ));
            }
            (faults.split_at, faults.trimmed_through)
        };
        let real = self.real_shard(&arn).await?;
        let child = CHILDREN
            .iter()
            .position(|suffix| shard.strip_prefix(real.as_str()) == Some(*suffix));
        {
            let mut faults = self.lock();
            if child.is_some() && !faults.observed.closed_read.contains(&real) {
                faults.observed.child_before_parent += 1;
            }
            faults.observed.read.insert(shard.clone());
        }
        if child.is_some() && split.is_none() {
            return Ok(error("ResourceNotFoundException", "no such shard"));
        }
        // Children start after the split point.
        let from = match (child, split) {
            (Some(_), Some(at)) => Some(after.map_or(at, |a| a.max(at))),
            _ => after,
        };
        let from = match (from, trimmed) {
            (None, Some(t)) => Some(t),
            (f, _) => f,
        };
        if let (Some(at), None, Some(f)) = (split, child, from)
            && f >= at
        {
            // The parent, read to its end.
            self.lock().observed.closed_read.insert(shard);
            return Ok(ok(json!({"Records": []})));
        }
        let page = self.upstream_records(&arn, &real, from).await?;
        let mut records = Vec::new();
        let mut scanned = from;
        let mut closed = false;
        for record in page {
            let Some(n) = seqnum(&record) else { continue };
            if let (None, Some(at)) = (child, split)
                && n > at
            {
                closed = true;
                break;
            }
            scanned = Some(n);
            let mine = match child {
                Some(c) => child_of(&record) == c,
                None => true,
            };
            if mine {
                records.push(record);
                if records.len() >= limit {
                    break;
                }
            }
        }
        if let (None, Some(at), Some(s)) = (child, split, scanned)
            && s >= at
        {
            closed = true;
        }
        if closed {
            self.lock().observed.closed_read.insert(shard);
            return Ok(ok(json!({"Records": records})));
        }
        Ok(ok(json!({
            "Records": records,
            "NextShardIterator": iterator(&arn, &shard, scanned),
        })))
    }
}

async fn handle(
    State(proxy): State<Proxy>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let target = headers
        .get("x-amz-target")
        .and_then(|v| v.to_str().ok())
        .and_then(|t| t.strip_prefix(TARGET_PREFIX));
    let request = || serde_json::from_slice(&body).unwrap_or(Value::Null);
    // The stream reads this proxy serves itself; every other request goes to moto as it is.
    let answer = match target {
        Some("DescribeStream") => proxy.describe(&request()).await,
        Some("GetShardIterator") => Ok(proxy.shard_iterator(&request())),
        Some("GetRecords") => proxy.records(&request()).await,
        _ => {
            return crate::serial_proxy::pass_through(
                &proxy.client,
                &proxy.base,
                method,
                &uri,
                &headers,
                body,
            )
            .await;
        }
    };
    answer.unwrap_or_else(|e| {
        Response::builder()
            .status(StatusCode::INTERNAL_SERVER_ERROR)
            .header("content-type", "application/x-amz-json-1.0")
            .body(Body::from(
                json!({"__type": "com.amazonaws.dynamodb.v20120810#InternalServerError", "message": e.to_string()})
                    .to_string(),
            ))
            .unwrap_or_default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iterators_round_trip_through_an_arn_with_bars() {
        let it = iterator("arn:aws:dynamodb:x|y", "shardId-1-child-a", Some(42));
        assert_eq!(
            parse_iterator(&it),
            Some((
                "arn:aws:dynamodb:x|y".to_owned(),
                "shardId-1-child-a".to_owned(),
                Some(42)
            ))
        );
        let it = iterator("arn", "s", None);
        assert_eq!(parse_iterator(&it), Some(("arn".into(), "s".into(), None)));
    }

    #[test]
    fn one_partition_key_spreads_over_both_children() {
        let children: HashSet<usize> = (0..20)
            .map(|i| {
                child_of(&json!({"dynamodb": {"Keys": {
                    "pk": {"S": "ORDER#1"}, "sk": {"S": format!("OUTBOX#{i}")}}}}))
            })
            .collect();
        assert_eq!(children.len(), 2);
    }
}
