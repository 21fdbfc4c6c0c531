//! A reader of Kinesis streams on moto, as an application would write one with the AWS SDK:
//! every shard from its oldest record (`TRIM_HORIZON`).

#![allow(dead_code)]

use anyhow::Context as _;
use aws_sdk_kinesis::Client;
use aws_sdk_kinesis::types::ShardIteratorType;
use bytes::Bytes;
use outbox_testkit::services::Moto;
use outbox_testkit::sink_conformance::Received;

/// A Kinesis client for `moto` (dummy credentials from [`Moto::set_aws_env`]).
pub(crate) async fn client(moto: &Moto) -> Client {
    Moto::set_aws_env();
    let config = aws_config::defaults(aws_config::BehaviorVersion::latest())
        .endpoint_url(moto.url())
        .region(aws_config::Region::new(Moto::REGION))
        .load()
        .await;
    Client::new(&config)
}

/// Creates stream `name` with `shards` shards.
pub(crate) async fn create_stream(client: &Client, name: &str, shards: i32) -> anyhow::Result<()> {
    client
        .create_stream()
        .stream_name(name)
        .shard_count(shards)
        .send()
        .await
        .with_context(|| format!("creating stream {name}"))?;
    Ok(())
}

/// One record as read: its shard, partition key and data.
#[derive(Debug, Clone)]
pub(crate) struct Record {
    pub(crate) shard: String,
    pub(crate) received: Received,
}

/// Every record of `stream`, shard by shard, each shard in order.
pub(crate) async fn read_all(client: &Client, stream: &str) -> anyhow::Result<Vec<Record>> {
    let shards = client
        .list_shards()
        .stream_name(stream)
        .send()
        .await
        .with_context(|| format!("listing the shards of {stream}"))?;
    let mut out = Vec::new();
    for shard in shards.shards() {
        let mut iterator = client
            .get_shard_iterator()
            .stream_name(stream)
            .shard_id(shard.shard_id())
            .shard_iterator_type(ShardIteratorType::TrimHorizon)
            .send()
            .await?
            .shard_iterator()
            .map(str::to_owned);
        while let Some(it) = iterator.take() {
            let page = client.get_records().shard_iterator(it).send().await?;
            if page.records().is_empty() {
                break;
            }
            for record in page.records() {
                out.push(Record {
                    shard: shard.shard_id().to_owned(),
                    received: Received {
                        destination: stream.to_owned(),
                        key: Some(record.partition_key().to_owned()),
                        headers: Vec::new(),
                        body: Bytes::from(record.data().as_ref().to_vec()),
                    },
                });
            }
            iterator = page.next_shard_iterator().map(str::to_owned);
        }
    }
    Ok(out)
}
