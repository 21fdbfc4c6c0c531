//! The source conformance suite for the DynamoDB Streams source, against moto's server: the
//! producer writes each event with its aggregate's version bump in one `TransactWriteItems`
//! (as `DynamoOutbox` documents), and the relay reads the table's stream.
//!
//! moto handles requests in parallel without locking: every client here (producers and
//! relays) goes through `SerialProxy`, one request at a time, which is what DynamoDB
//! guarantees (each request atomic). A transaction that must not commit fails a condition;
//! the test support starts moto with its transactions made all-or-nothing
//! (`services/moto_atomic.py`).

use std::collections::HashMap;
use std::time::Duration;

use anyhow::Context;
use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, AttributeValue, BillingMode, ConditionCheck, KeySchemaElement, KeyType,
    ScalarAttributeType, TransactWriteItem, Update,
};
use outbox_core::{DeadLetterPolicy, NewEvent, Ordering};
use outbox_dynamodb::{DynamoDbConfig, DynamoOutbox, DynamoStreamSource, LEASE_KEY, migrate};
use outbox_testkit::conformance::{self, Harness, StoredEvent};
use outbox_testkit::serial_proxy::SerialProxy;
use outbox_testkit::services::Moto;
use tokio::sync::Mutex;
use uuid::Uuid;

struct Written {
    aggregate: (String, String),
    seq: u64,
}

struct DynamoHarness {
    _proxy: SerialProxy,
    config: DynamoDbConfig,
    client: Client,
    outbox: DynamoOutbox,
    /// One producer request at a time (moto has no locking).
    writes: Mutex<()>,
    written: std::sync::Mutex<HashMap<Uuid, Written>>,
}

fn pk(aggregate_type: &str, aggregate_id: &str) -> AttributeValue {
    AttributeValue::S(format!("{aggregate_type}#{aggregate_id}"))
}

fn s(v: &str) -> AttributeValue {
    AttributeValue::S(v.to_owned())
}

impl DynamoHarness {
    async fn new() -> anyhow::Result<Self> {
        Moto::set_aws_env();
        let moto = Moto::shared().await?;
        let mut config = DynamoDbConfig::new(format!("conf-{}", Uuid::new_v4().simple()));
        config.region = Some(Moto::REGION.to_owned());
        let proxy = SerialProxy::start(moto.url()).await?;
        config.endpoint_url = Some(proxy.url().to_owned());
        config.lease_duration = Duration::from_secs(6); // > the suite's publish_timeout (5 s)
        config.gap_timeout = Duration::from_secs(20);
        let client = outbox_dynamodb::client(&config).await;
        let key = |name: &str, kind: KeyType| -> anyhow::Result<_> {
            Ok((
                AttributeDefinition::builder()
                    .attribute_name(name)
                    .attribute_type(ScalarAttributeType::S)
                    .build()?,
                KeySchemaElement::builder()
                    .attribute_name(name)
                    .key_type(kind)
                    .build()?,
            ))
        };
        let (pa, pk_) = key("pk", KeyType::Hash)?;
        let (sa, sk_) = key("sk", KeyType::Range)?;
        client
            .create_table()
            .table_name(&config.table)
            .billing_mode(BillingMode::PayPerRequest)
            .attribute_definitions(pa)
            .attribute_definitions(sa)
            .key_schema(pk_)
            .key_schema(sk_)
            .send()
            .await?;
        migrate(&client, &config).await?;
        Ok(Self {
            _proxy: proxy,
            outbox: DynamoOutbox::new(&config)?,
            config,
            client,
            writes: Mutex::new(()),
            written: std::sync::Mutex::new(HashMap::new()),
        })
    }

    /// The aggregate's current version (0 when it has no item yet).
    async fn version(&self, pk: &AttributeValue) -> anyhow::Result<u64> {
        let out = self
            .client
            .get_item()
            .table_name(&self.config.table)
            .key("pk", pk.clone())
            .key("sk", s("AGGREGATE"))
            .consistent_read(true)
            .send()
            .await?;
        Ok(out
            .item()
            .and_then(|i| i.get("version"))
            .and_then(|v| v.as_n().ok())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0))
    }

    fn bump(&self, pk: &AttributeValue, from: u64, by: u64) -> anyhow::Result<TransactWriteItem> {
        let update = Update::builder()
            .table_name(&self.config.table)
            .key("pk", pk.clone())
            .key("sk", s("AGGREGATE"))
            .update_expression("SET #v = :next")
            .condition_expression("attribute_not_exists(#v) OR #v = :v")
            .expression_attribute_names("#v", "version")
            .expression_attribute_values(":v", AttributeValue::N(from.to_string()))
            .expression_attribute_values(":next", AttributeValue::N((from + by).to_string()))
            .build()?;
        Ok(TransactWriteItem::builder().update(update).build())
    }

    /// Writes `events` in one transaction, or (`commit = false`) in one transaction that a
    /// failing condition cancels. Retries when another writer bumped a version first.
    async fn transact(
        &self,
        events: &[NewEvent],
        commit: bool,
    ) -> anyhow::Result<Vec<(Uuid, u64)>> {
        loop {
            let _one = self.writes.lock().await;
            let mut by_aggregate: Vec<(AttributeValue, Vec<&NewEvent>)> = Vec::new();
            for e in events {
                let key = pk(&e.aggregate_type, &e.aggregate_id);
                match by_aggregate.iter_mut().find(|(k, _)| *k == key) {
                    Some((_, list)) => list.push(e),
                    None => by_aggregate.push((key, vec![e])),
                }
            }
            let mut items = Vec::new();
            let mut ids = Vec::new();
            for (key, list) in &by_aggregate {
                let v = self.version(key).await?;
                items.push(self.bump(key, v, list.len() as u64)?);
                for (i, e) in list.iter().enumerate() {
                    let seq = v + 1 + i as u64;
                    let write = self.outbox.put(key.clone(), e, seq)?;
                    ids.push((
                        write.id,
                        seq,
                        (e.aggregate_type.clone(), e.aggregate_id.clone()),
                    ));
                    items.push(write.into_transact_item()?);
                }
            }
            if !commit {
                // A version check that fails: DynamoDB cancels the whole transaction. (The
                // test support's moto checks every condition first, as DynamoDB does.)
                items.insert(
                    0,
                    TransactWriteItem::builder()
                        .condition_check(
                            ConditionCheck::builder()
                                .table_name(&self.config.table)
                                .key("pk", s("NO-SUCH"))
                                .key("sk", s("ITEM"))
                                .condition_expression("attribute_exists(pk)")
                                .build()?,
                        )
                        .build(),
                );
            }
            let sent = self
                .client
                .transact_write_items()
                .set_transact_items(Some(items))
                .send()
                .await;
            match sent {
                Ok(_) if commit => {
                    let mut written = self.written.lock().expect("lock");
                    for (id, seq, aggregate) in &ids {
                        written.insert(
                            *id,
                            Written {
                                aggregate: aggregate.clone(),
                                seq: *seq,
                            },
                        );
                    }
                    return Ok(ids.into_iter().map(|(id, seq, _)| (id, seq)).collect());
                }
                Ok(_) => anyhow::bail!("a transaction meant to fail committed"),
                Err(_) if !commit => {
                    return Ok(ids.into_iter().map(|(id, seq, _)| (id, seq)).collect());
                }
                Err(e) => {
                    let text = format!("{e:?}");
                    if text.contains("ConditionalCheckFailed")
                        || text.contains("TransactionCanceled")
                    {
                        continue; // lost a version race: read again
                    }
                    return Err(e).context("TransactWriteItems");
                }
            }
        }
    }

    async fn position(&self, aggregate: &(String, String)) -> anyhow::Result<u64> {
        let out = self
            .client
            .get_item()
            .table_name(self.config.lease_table())
            .key(
                LEASE_KEY,
                s(&format!("aggregate#{}\u{1f}{}", aggregate.0, aggregate.1)),
            )
            .consistent_read(true)
            .send()
            .await?;
        Ok(out
            .item()
            .and_then(|i| i.get("seq"))
            .and_then(|v| v.as_n().ok())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0))
    }
}

impl Harness for DynamoHarness {
    type Source = DynamoStreamSource;

    async fn source(
        &self,
        ordering: Ordering,
        dead_letter: DeadLetterPolicy,
    ) -> anyhow::Result<Self::Source> {
        Ok(DynamoStreamSource::new(
            &self.config,
            Uuid::new_v4().to_string(),
            ordering,
            dead_letter,
        )
        .await?)
    }

    async fn write(&self, events: Vec<NewEvent>, commit: bool) -> anyhow::Result<Vec<Uuid>> {
        Ok(self
            .transact(&events, commit)
            .await?
            .into_iter()
            .map(|(id, _)| id)
            .collect())
    }

    async fn stored(&self, id: Uuid) -> anyhow::Result<Option<StoredEvent>> {
        let dead = self
            .client
            .get_item()
            .table_name(self.config.lease_table())
            .key(LEASE_KEY, s(&format!("dead#{id}")))
            .consistent_read(true)
            .send()
            .await?;
        if let Some(item) = dead.item() {
            let attempts = item
                .get("attempts")
                .and_then(|v| v.as_n().ok())
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            return Ok(Some(StoredEvent {
                state: "dead".into(),
                attempts,
            }));
        }
        let (aggregate, seq) = {
            let written = self.written.lock().expect("lock");
            match written.get(&id) {
                Some(w) => (w.aggregate.clone(), w.seq),
                None => return Ok(None),
            }
        };
        let state = if self.position(&aggregate).await? >= seq {
            "delivered"
        } else {
            "pending"
        };
        Ok(Some(StoredEvent {
            state: state.into(),
            attempts: 0,
        }))
    }

    fn replicas(&self) -> usize {
        2
    }

    fn assigns_positions(&self) -> bool {
        false
    }

    async fn write_counted(
        &self,
        event: NewEvent,
        _outbox_first: bool,
        hold: Duration,
    ) -> anyhow::Result<(Uuid, i64)> {
        // One TransactWriteItems is atomic: "outbox first" has no meaning here. The hold is
        // a writer that read the version, then took its time before committing.
        tokio::time::sleep(hold).await;
        let (id, seq) = self.transact(std::slice::from_ref(&event), true).await?[0];
        Ok((id, seq as i64))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dynamodb_streams_source_passes_the_conformance_suite() -> anyhow::Result<()> {
    conformance::run_all(DynamoHarness::new).await
}
