//! `outbox verify` for Kinesis Data Streams: every stream the expected events name (and, for a
//! template, every stream of the account it could render, from `ListStreams`) is read shard
//! by shard (`ListShards`: open shards, and the closed parents and children a reshard left
//! within the retention period), each shard from a `GetShardIterator` of type `AT_TIMESTAMP`
//! at the window's start, with `GetRecords` until the shard's end as it was when the read
//! began: a closed shard's last record (or no next iterator), an open shard's tip
//! (`MillisBehindLatest` 0 and no record), or a record that arrived well after the read
//! began. Shard iterators are a plain read: no consumer, checkpoint or lease is created, so
//! the stream's consumers see nothing of it. One lane per shard.
//!
//! Kinesis records carry no headers: the event id travels only in a CloudEvents structured
//! envelope (`format = "cloudevents-structured"`), decoded as a consumer would decode it. With
//! `format = "plain"` a record is the bare payload, so nothing matches a record to its event
//! and the read is refused rather than reported as all lost.
//!
//! A stream keeps records for its retention period (`DescribeStreamSummary`,
//! `RetentionPeriodHours`, 24 h by default): when the window starts before `now - retention`,
//! what was sent before that is reported as expired, not lost. After a reshard, one
//! aggregate's events are split between the parent shard and a child shard: each lane is
//! checked for order on its own, the step from parent to child is not.
//!
//! moto (5.2) serves `AT_TIMESTAMP`, closed shards after `SplitShard` and `MillisBehindLatest`;
//! it always returns a next iterator, even for a closed shard (AWS returns none at its end),
//! which the end-of-shard rules above handle either way.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use aws_sdk_kinesis::Client;
use aws_sdk_kinesis::types::{Shard, ShardIteratorType};
use aws_smithy_runtime_api::client::orchestrator::HttpResponse;
use aws_smithy_runtime_api::client::result::SdkError;
use aws_smithy_types::error::metadata::ProvideErrorMetadata;
use outbox_core::cloudevents::Format;
use outbox_core::verify::{
    Identity, Lane, LedgerEvent, ReadBack, ReadBackError, ReadMessage, ReadOutcome, ReadProgress,
    Trimmed,
};
use outbox_core::{Destination, SinkErrorKind};
use time::OffsetDateTime;

use super::KinesisConfig;
use crate::read_back::Read;

/// How often (in records) the progress is reported.
const PROGRESS_EVERY: u64 = 5_000;
/// Streams per `ListStreams` page.
const LIST_PAGE: i32 = 100;
/// Records per `GetRecords` (the API's maximum).
const PAGE: i32 = 10_000;
/// Pause after an empty page: `GetRecords` allows five calls per second per shard.
const EMPTY_PAUSE: Duration = Duration::from_millis(200);
/// The longest a shard may give only empty pages without reaching its end.
const IDLE_LIMIT: Duration = Duration::from_secs(60);
/// Throttled calls (`ProvisionedThroughputExceededException`) retried before giving up.
const THROTTLE_TRIES: u32 = 10;
/// A record that arrived this long after the read began ends its shard's read: the tip of a
/// busy shard moves on, and what arrived after the read began is outside the window anyway.
const LATE: time::Duration = time::Duration::seconds(5);

/// Reads a Kinesis sink's streams back.
pub struct KinesisReadBack {
    client: Client,
    /// `Kinesis at http://127.0.0.1:5000` or `Kinesis in eu-west-1`, credentials masked.
    endpoint: String,
    destination: Destination,
}

/// Refuses the plain format (no event id in a record), then checks that Kinesis answers and
/// allows reading: `DescribeStreamSummary` of a fixed stream, `ListStreams` for a template.
pub(super) async fn read_back(config: &KinesisConfig) -> Result<KinesisReadBack, ReadBackError> {
    config
        .validate()
        .map_err(|e| ReadBackError::refused(e.to_string()))?;
    if config.format != Format::CloudeventsStructured {
        return Err(ReadBackError::unsupported(format!(
            "Kinesis records carry no headers, and with format = \"{}\" a record is the bare payload: no event id travels, so `outbox verify` cannot match records to events; set sink.format = \"cloudevents-structured\" (the event id in the record's JSON envelope) to verify a Kinesis stream",
            config.format.as_str()
        )));
    }
    let (sdk, place) = config
        .clone()
        .connect()
        .await
        .map_err(|e| ReadBackError::refused(e.report()))?;
    let destination = place.target.clone();
    let readback = KinesisReadBack {
        client: Client::new(&sdk),
        endpoint: place.endpoint,
        destination,
    };
    if readback.destination.is_fixed() {
        let stream = readback.destination.template().to_owned();
        readback
            .client
            .describe_stream_summary()
            .stream_name(&stream)
            .send()
            .await
            .map_err(|e| readback.error(&format!("DescribeStreamSummary of `{stream}`"), e))?;
    } else {
        readback
            .client
            .list_streams()
            .limit(1)
            .send()
            .await
            .map_err(|e| readback.error("ListStreams", e))?;
    }
    Ok(readback)
}

/// A record's sequence number, compared as the number it is (up to 128 digits).
fn sequence_key(sequence: &str) -> (usize, &str) {
    let digits = sequence.trim_start_matches('0');
    (digits.len(), digits)
}

fn time_of(at: &aws_smithy_types::DateTime) -> Option<OffsetDateTime> {
    OffsetDateTime::from_unix_timestamp_nanos(
        i128::from(at.secs()) * 1_000_000_000 + i128::from(at.subsec_nanos()),
    )
    .ok()
}

fn sdk_time(at: OffsetDateTime) -> aws_smithy_types::DateTime {
    let nanos = at.unix_timestamp_nanos();
    aws_smithy_types::DateTime::from_secs_and_nanos(
        i64::try_from(nanos.div_euclid(1_000_000_000)).unwrap_or(0),
        u32::try_from(nanos.rem_euclid(1_000_000_000)).unwrap_or(0),
    )
}

/// One shard to read: its lane, and its last sequence number when it is closed.
struct ShardRead<'a> {
    stream: &'a str,
    shard_id: String,
    ending: Option<String>,
    lane: u32,
}

impl KinesisReadBack {
    /// The [`ReadBackError`] of a failed request: unreachable (no connection, timeout),
    /// refused (credentials, permissions, a missing stream) or failed.
    fn error<E>(&self, what: &str, err: SdkError<E, HttpResponse>) -> ReadBackError
    where
        E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    {
        let code = err.code().unwrap_or("").to_owned();
        if code == "ResourceNotFoundException" {
            return ReadBackError::refused(format!(
                "{what} on {}: the stream or shard does not exist ({})",
                self.endpoint,
                err.message().unwrap_or(&code)
            ));
        }
        let e = crate::aws::request_error(&self.endpoint, what, err);
        let text = e.report();
        match e.kind() {
            _ if crate::aws::is_auth_code(&code) => ReadBackError::refused(format!(
                "{text}; `outbox verify` needs kinesis:ListStreams, kinesis:DescribeStreamSummary, kinesis:ListShards, kinesis:GetShardIterator and kinesis:GetRecords"
            )),
            SinkErrorKind::Unavailable if text.contains("cannot sign") => {
                ReadBackError::refused(text)
            }
            SinkErrorKind::Unavailable => ReadBackError::unreachable(text),
            _ => ReadBackError::failed(text),
        }
    }

    /// The streams to read: those the expected events name and, for a template, every
    /// stream of the account it could render.
    async fn streams(&self, expected: &[LedgerEvent]) -> Result<BTreeSet<String>, ReadBackError> {
        let mut streams: BTreeSet<String> =
            expected.iter().map(|e| self.destination_of(e)).collect();
        if self.destination.is_fixed() {
            streams.insert(self.destination.template().to_owned());
            return Ok(streams);
        }
        // Pages by `NextToken`, or by the last name where a server gives no token (moto).
        let (mut token, mut after): (Option<String>, Option<String>) = (None, None);
        loop {
            let request = self.client.list_streams().limit(LIST_PAGE);
            let request = match (&token, &after) {
                (Some(t), _) => request.next_token(t),
                (None, Some(name)) => request.exclusive_start_stream_name(name),
                (None, None) => request,
            };
            let page = request
                .send()
                .await
                .map_err(|e| self.error("ListStreams", e))?;
            streams.extend(
                page.stream_names()
                    .iter()
                    .filter(|s| self.destination.could_render(s))
                    .cloned(),
            );
            if !page.has_more_streams() {
                break;
            }
            token = page.next_token().map(str::to_owned);
            after = page.stream_names().last().cloned();
            if token.is_none() && after.is_none() {
                break;
            }
        }
        Ok(streams)
    }

    /// Every shard of `stream`, open and closed.
    async fn shards(&self, stream: &str) -> Result<Vec<Shard>, ReadBackError> {
        let mut shards = Vec::new();
        let mut token: Option<String> = None;
        loop {
            // `NextToken` replaces `StreamName` on the next pages.
            let request = match &token {
                Some(t) => self.client.list_shards().next_token(t),
                None => self.client.list_shards().stream_name(stream),
            };
            let page = request
                .send()
                .await
                .map_err(|e| self.error(&format!("ListShards of `{stream}`"), e))?;
            shards.extend(page.shards().iter().cloned());
            token = page.next_token().map(str::to_owned);
            if token.is_none() {
                break;
            }
        }
        Ok(shards)
    }

    async fn read_all(&self, call: Read<'_>) -> Result<ReadOutcome, ReadBackError> {
        let started = OffsetDateTime::now_utc();
        let named: BTreeSet<String> = call
            .expected
            .iter()
            .map(|e| self.destination_of(e))
            .collect();
        let mut out = ReadOutcome::default();
        let mut reads = Vec::new();
        let streams = self.streams(call.expected).await?;
        for stream in &streams {
            let summary = self
                .client
                .describe_stream_summary()
                .stream_name(stream)
                .send()
                .await;
            let summary = match summary {
                Ok(s) => s,
                Err(e) if e.code() == Some("ResourceNotFoundException") => {
                    if named.contains(stream) {
                        out.notes.push(format!(
                            "Kinesis stream `{stream}` does not exist on {}: every event the table says was delivered there counts as lost",
                            self.endpoint
                        ));
                    }
                    continue;
                }
                Err(e) => {
                    return Err(self.error(&format!("DescribeStreamSummary of `{stream}`"), e));
                }
            };
            if let Some(hours) = summary
                .stream_description_summary()
                .map(|s| s.retention_period_hours())
            {
                let retained_from = started - time::Duration::hours(i64::from(hours));
                if call.since < retained_from {
                    out.trimmed.push(Trimmed {
                        destination: Some(stream.clone()),
                        retained_from,
                        detail: format!(
                            "Kinesis stream `{stream}` keeps records for {hours} hours (RetentionPeriodHours): what was sent before {} may have expired",
                            outbox_core::admin::when(retained_from)
                        ),
                    });
                }
            }
            for shard in self.shards(stream).await? {
                let lane = u32::try_from(out.lanes.len()).unwrap_or(u32::MAX);
                let ending = shard
                    .sequence_number_range()
                    .and_then(|r| r.ending_sequence_number())
                    .map(str::to_owned);
                out.lanes.push(Lane {
                    name: format!(
                        "stream `{stream}` shard {}{}",
                        shard.shard_id(),
                        if ending.is_some() { " (closed)" } else { "" }
                    ),
                    messages: 0,
                });
                reads.push(ShardRead {
                    stream,
                    shard_id: shard.shard_id().to_owned(),
                    ending,
                    lane,
                });
            }
        }
        call.progress.advance(0, None);
        let mut read = 0_u64;
        for shard in &reads {
            let before = out.messages.len();
            self.read_shard(
                shard,
                call.since,
                started,
                &mut out.messages,
                &mut read,
                call.progress,
            )
            .await?;
            out.lanes[shard.lane as usize].messages = (out.messages.len() - before) as u64;
        }
        call.progress.advance(read, Some(read));
        Ok(out)
    }

    /// An iterator of `kind` for `shard` (`AT_TIMESTAMP` at `since`, or after the sequence
    /// number last read).
    async fn iterator(
        &self,
        shard: &ShardRead<'_>,
        since: OffsetDateTime,
        after: Option<&str>,
    ) -> Result<Option<String>, ReadBackError> {
        let request = self
            .client
            .get_shard_iterator()
            .stream_name(shard.stream)
            .shard_id(&shard.shard_id);
        let request = match after {
            Some(sequence) => request
                .shard_iterator_type(ShardIteratorType::AfterSequenceNumber)
                .starting_sequence_number(sequence),
            None => request
                .shard_iterator_type(ShardIteratorType::AtTimestamp)
                .timestamp(sdk_time(since)),
        };
        let answer = request.send().await.map_err(|e| {
            self.error(
                &format!(
                    "GetShardIterator of `{}` shard {}",
                    shard.stream, shard.shard_id
                ),
                e,
            )
        })?;
        Ok(answer.shard_iterator().map(str::to_owned))
    }

    /// Reads one shard from `since` to its end as it was at `started`, adding to `read`.
    async fn read_shard(
        &self,
        shard: &ShardRead<'_>,
        since: OffsetDateTime,
        started: OffsetDateTime,
        messages: &mut Vec<ReadMessage>,
        read: &mut u64,
        progress: &dyn ReadProgress,
    ) -> Result<(), ReadBackError> {
        let what = format!("GetRecords of `{}` shard {}", shard.stream, shard.shard_id);
        let mut iterator = self.iterator(shard, since, None).await?;
        let mut last: Option<String> = None;
        let mut position = 0_u64;
        let mut throttled = 0_u32;
        let mut progress_at = Instant::now();
        while let Some(current) = iterator.take() {
            let page = match self
                .client
                .get_records()
                .shard_iterator(&current)
                .limit(PAGE)
                .send()
                .await
            {
                Ok(page) => page,
                Err(e) if e.code() == Some("ExpiredIteratorException") => {
                    // Iterators expire after five minutes: continue after the last record.
                    iterator = self.iterator(shard, since, last.as_deref()).await?;
                    continue;
                }
                Err(e)
                    if e.code() == Some("ProvisionedThroughputExceededException")
                        && throttled < THROTTLE_TRIES =>
                {
                    throttled += 1;
                    tokio::time::sleep(Duration::from_millis(250) * throttled).await;
                    iterator = Some(current);
                    continue;
                }
                Err(e) => return Err(self.error(&what, e)),
            };
            throttled = 0;
            let records = page.records();
            let mut late = false;
            for record in records {
                position += 1;
                *read += 1;
                if read.is_multiple_of(PROGRESS_EVERY) {
                    progress.advance(*read, None);
                }
                let stored_at = record.approximate_arrival_timestamp().and_then(time_of);
                late |= stored_at.is_some_and(|t| t > started + LATE);
                messages.push(ReadMessage {
                    identity: Identity::read(|_| None, record.data().as_ref()),
                    lane: shard.lane,
                    offset: position,
                    stored_at,
                });
            }
            if let Some(r) = records.last() {
                last = Some(r.sequence_number().to_owned());
                progress_at = Instant::now();
            }
            let at_end = shard.ending.as_deref().is_some_and(|end| {
                last.as_deref()
                    .is_some_and(|l| sequence_key(l) >= sequence_key(end))
            });
            let caught_up = records.is_empty() && page.millis_behind_latest() == Some(0);
            if at_end || caught_up || late {
                break;
            }
            if records.is_empty() {
                if progress_at.elapsed() > IDLE_LIMIT {
                    return Err(ReadBackError::unreachable(format!(
                        "{what} on {}: no record for {}s while the shard had not reached its end ({} ms behind its tip)",
                        self.endpoint,
                        IDLE_LIMIT.as_secs(),
                        page.millis_behind_latest().unwrap_or(-1)
                    )));
                }
                tokio::time::sleep(EMPTY_PAUSE).await;
            }
            // None: a closed shard read to its end.
            iterator = page.next_shard_iterator().map(str::to_owned);
        }
        Ok(())
    }
}

crate::read_back::impl_read_back!(
    KinesisReadBack,
    describe: |r| format!("{}, streams `{}`", r.endpoint, r.destination.template()),
    destination: destination,
    debug: endpoint,
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequence_numbers_compare_as_numbers() {
        assert!(sequence_key("10") > sequence_key("9"));
        assert!(
            sequence_key("49590338271490256608559692538361571095921575989136588898")
                > sequence_key("49590338271490256608559692538361571095921575989136588897")
        );
        assert_eq!(sequence_key("007"), sequence_key("7"));
    }

    #[test]
    fn times_convert_both_ways() {
        let at =
            OffsetDateTime::from_unix_timestamp_nanos(1_764_300_000_123_456_789).expect("a time");
        assert_eq!(time_of(&sdk_time(at)), Some(at));
    }
}
