//! How far the relays are behind the stream: per shard, the age of the oldest record after
//! its checkpoint (`outbox status`).

use std::collections::HashMap;

use aws_sdk_dynamodb::error::ProvideErrorMetadata;
use aws_sdk_dynamodbstreams::types::ShardIteratorType;
use outbox_core::SourceError;
use time::OffsetDateTime;

use crate::config::DynamoDbConfig;

/// Empty pages followed before a shard counts as read up (an open shard's tip answers empty
/// pages with a next iterator for ever).
const MAX_EMPTY_PAGES: usize = 5;

/// One shard of the stream, as `status` reports it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ShardLag {
    pub(crate) shard: String,
    pub(crate) parent: Option<String>,
    /// When the oldest record after the checkpoint was written; `None` when every record
    /// is read (or the shard is finished).
    pub(crate) oldest_unread: Option<OffsetDateTime>,
}

fn failed(doing: &str, e: impl std::error::Error + Send + Sync + 'static) -> SourceError {
    SourceError::unavailable(format!(
        "{doing} failed: {}",
        outbox_core::relay::ErrorChain(&e)
    ))
}

/// Every shard of the table's stream with its oldest unread record, given each shard's
/// `(checkpoint, finished)` from the lease table. `None` when the table has no stream.
pub(crate) async fn unread(
    config: &DynamoDbConfig,
    table: &aws_sdk_dynamodb::Client,
    leases: &HashMap<String, (Option<String>, bool)>,
) -> Result<Option<Vec<ShardLag>>, SourceError> {
    let described = table
        .describe_table()
        .table_name(&config.table)
        .send()
        .await
        .map_err(|e| failed("describing the table", e))?;
    let Some(arn) = described
        .table()
        .filter(|t| t.stream_specification().is_some_and(|s| s.stream_enabled()))
        .and_then(|t| t.latest_stream_arn())
        .map(str::to_owned)
    else {
        return Ok(None);
    };
    let streams = aws_sdk_dynamodbstreams::Client::new(&crate::migrate::sdk_config(config).await);
    let mut shards = Vec::new();
    let mut start: Option<String> = None;
    loop {
        let out = streams
            .describe_stream()
            .stream_arn(&arn)
            .set_exclusive_start_shard_id(start.take())
            .send()
            .await
            .map_err(|e| failed("listing the stream's shards", e))?;
        let Some(desc) = out.stream_description else {
            break;
        };
        for s in desc.shards() {
            if let Some(id) = s.shard_id() {
                shards.push((id.to_owned(), s.parent_shard_id().map(str::to_owned)));
            }
        }
        match desc.last_evaluated_shard_id {
            Some(id) => start = Some(id),
            None => break,
        }
    }
    let mut out = Vec::with_capacity(shards.len());
    for (shard, parent) in shards {
        let (checkpoint, finished) = leases.get(&shard).cloned().unwrap_or((None, false));
        let oldest_unread = if finished {
            None
        } else {
            oldest_after(&streams, &arn, &shard, checkpoint.as_deref()).await?
        };
        out.push(ShardLag {
            shard,
            parent,
            oldest_unread,
        });
    }
    Ok(Some(out))
}

async fn oldest_after(
    streams: &aws_sdk_dynamodbstreams::Client,
    arn: &str,
    shard: &str,
    after: Option<&str>,
) -> Result<Option<OffsetDateTime>, SourceError> {
    let request = |after: Option<&str>| {
        let req = streams.get_shard_iterator().stream_arn(arn).shard_id(shard);
        match after {
            Some(seq) => req
                .shard_iterator_type(ShardIteratorType::AfterSequenceNumber)
                .sequence_number(seq),
            None => req.shard_iterator_type(ShardIteratorType::TrimHorizon),
        }
    };
    let mut iterator = match request(after).send().await {
        Ok(out) => out.shard_iterator,
        // The checkpoint is past the retention: the oldest record left is unread.
        Err(e) if e.code() == Some("TrimmedDataAccessException") => {
            request(None)
                .send()
                .await
                .map_err(|e| failed("opening a shard", e))?
                .shard_iterator
        }
        Err(e) => return Err(failed("opening a shard", e)),
    };
    for _ in 0..MAX_EMPTY_PAGES {
        let Some(it) = iterator.take() else {
            break;
        };
        let page = streams
            .get_records()
            .shard_iterator(it)
            .limit(1)
            .send()
            .await
            .map_err(|e| failed("reading the stream", e))?;
        if let Some(record) = page.records().first() {
            return Ok(super::decode::written_at(record));
        }
        iterator = page.next_shard_iterator;
    }
    Ok(None)
}
