//! The DynamoDB producer and `migrate` against moto's server (a real DynamoDB API on
//! 127.0.0.1): the outbox item commits with the business item in one `TransactWriteItems` or
//! not at all; migrate turns the stream on, creates the lease table, and refuses a table it
//! cannot serve with the reason.

use std::collections::HashMap;

use anyhow::{Context, bail, ensure};
use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::primitives::Blob;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, AttributeValue, BillingMode, KeySchemaElement, KeyType,
    ScalarAttributeType, StreamSpecification, StreamViewType, TransactWriteItem, Update,
};
use outbox_core::NewEvent;
use outbox_dynamodb::{DynamoDbConfig, DynamoError, DynamoOutbox, migrate};
use outbox_testkit::services::Moto;
use uuid::Uuid;

async fn setup() -> anyhow::Result<(&'static Moto, DynamoDbConfig, Client)> {
    Moto::set_aws_env();
    let moto = Moto::shared().await?;
    let mut config = DynamoDbConfig::new(format!("app-{}", Uuid::new_v4().simple()));
    config.region = Some(Moto::REGION.to_owned());
    config.endpoint_url = Some(moto.url().to_owned());
    let client = outbox_dynamodb::client(&config).await;
    Ok((moto, config, client))
}

/// The application's table: `pk`/`sk` strings unless told otherwise.
async fn create_table(
    client: &Client,
    name: &str,
    keys: &[(&str, KeyType, ScalarAttributeType)],
    stream: Option<StreamViewType>,
) -> anyhow::Result<()> {
    let mut create = client
        .create_table()
        .table_name(name)
        .billing_mode(BillingMode::PayPerRequest);
    for (attr, kind, ty) in keys {
        create = create
            .attribute_definitions(
                AttributeDefinition::builder()
                    .attribute_name(*attr)
                    .attribute_type(ty.clone())
                    .build()?,
            )
            .key_schema(
                KeySchemaElement::builder()
                    .attribute_name(*attr)
                    .key_type(kind.clone())
                    .build()?,
            );
    }
    if let Some(view) = stream {
        create = create.stream_specification(
            StreamSpecification::builder()
                .stream_enabled(true)
                .stream_view_type(view)
                .build()?,
        );
    }
    create.send().await?;
    Ok(())
}

fn standard_keys() -> Vec<(&'static str, KeyType, ScalarAttributeType)> {
    vec![
        ("pk", KeyType::Hash, ScalarAttributeType::S),
        ("sk", KeyType::Range, ScalarAttributeType::S),
    ]
}

fn order_update(table: &str, pk: &AttributeValue, version: u64) -> anyhow::Result<Update> {
    Ok(Update::builder()
        .table_name(table)
        .key("pk", pk.clone())
        .key("sk", AttributeValue::S("ORDER".into()))
        .update_expression("SET #st = :st, #v = :next")
        .condition_expression("attribute_not_exists(#v) OR #v = :v")
        .expression_attribute_names("#st", "status")
        .expression_attribute_names("#v", "version")
        .expression_attribute_values(":st", AttributeValue::S(format!("v{}", version + 1)))
        .expression_attribute_values(":v", AttributeValue::N(version.to_string()))
        .expression_attribute_values(":next", AttributeValue::N((version + 1).to_string()))
        .build()?)
}

async fn outbox_items(
    client: &Client,
    table: &str,
    pk: &AttributeValue,
) -> anyhow::Result<Vec<HashMap<String, AttributeValue>>> {
    let out = client
        .query()
        .table_name(table)
        .key_condition_expression("pk = :pk AND begins_with(sk, :p)")
        .expression_attribute_values(":pk", pk.clone())
        .expression_attribute_values(":p", AttributeValue::S("OUTBOX#".into()))
        .consistent_read(true)
        .send()
        .await?;
    Ok(out.items.unwrap_or_default())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_outbox_item_commits_with_the_business_item_or_not_at_all() -> anyhow::Result<()> {
    let (_moto, config, client) = setup().await?;
    create_table(&client, &config.table, &standard_keys(), None).await?;
    let outbox = DynamoOutbox::new(&config)?;
    let pk = AttributeValue::S("ORDER#o_1".into());
    let payload: Vec<u8> = vec![0xff, 0x00, b'{', 0xe2, 0x82];
    let event = NewEvent::new("Order", "o_1", "order.placed", payload.clone()).with_header(
        "traceparent",
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    );
    let write = outbox.put(pk.clone(), &event, 1)?;
    let id = write.id;
    client
        .transact_write_items()
        .transact_items(
            TransactWriteItem::builder()
                .update(order_update(&config.table, &pk, 0)?)
                .build(),
        )
        .transact_items(write.into_transact_item()?)
        .send()
        .await
        .context("the first transaction")?;
    let items = outbox_items(&client, &config.table, &pk).await?;
    ensure!(items.len() == 1, "one outbox item: {items:?}");
    let item = &items[0];
    ensure!(item["sk"] == AttributeValue::S(format!("OUTBOX#{id}")));
    ensure!(item["id"] == AttributeValue::S(id.to_string()));
    ensure!(item["aggregate_id"] == AttributeValue::S("o_1".into()));
    ensure!(item["seq"] == AttributeValue::N("1".into()));
    ensure!(
        item["payload"] == AttributeValue::B(Blob::new(payload)),
        "payload bytes exact: {:?}",
        item["payload"]
    );
    let AttributeValue::M(headers) = &item["headers"] else {
        bail!("headers: {:?}", item["headers"]);
    };
    ensure!(headers.len() == 1 && headers.contains_key("traceparent"));

    // A writer that read the order at version 0 too (a lost race): its condition fails, so
    // neither its order update nor its event is written.
    let stale = outbox.put(
        pk.clone(),
        &NewEvent::new("Order", "o_1", "order.cancelled", "{}"),
        1,
    )?;
    let stale_id = stale.id;
    let refused = client
        .transact_write_items()
        .transact_items(
            TransactWriteItem::builder()
                .update(order_update(&config.table, &pk, 0)?)
                .build(),
        )
        .transact_items(stale.into_transact_item()?)
        .send()
        .await;
    ensure!(refused.is_err(), "the stale transaction must fail");
    let items = outbox_items(&client, &config.table, &pk).await?;
    ensure!(
        items.len() == 1 && items[0]["id"] == AttributeValue::S(id.to_string()),
        "no phantom event {stale_id}: {items:?}"
    );
    // The same event written twice is refused, never rewritten.
    let again = outbox.put(pk.clone(), &event.clone().with_id(id), 2)?;
    let twice = client
        .transact_write_items()
        .transact_items(again.into_transact_item()?)
        .send()
        .await;
    ensure!(twice.is_err(), "an id is written once");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_turns_the_stream_on_and_creates_the_lease_table_once() -> anyhow::Result<()> {
    let (_moto, config, client) = setup().await?;
    create_table(&client, &config.table, &standard_keys(), None).await?;
    let first = migrate(&client, &config).await?;
    ensure!(first.stream_enabled, "{first:?}");
    ensure!(first.stream_view == "NEW_IMAGE", "{first:?}");
    ensure!(first.lease_table_created, "{first:?}");
    ensure!(!first.stream_arn.is_empty(), "{first:?}");
    let table = client
        .describe_table()
        .table_name(&config.table)
        .send()
        .await?
        .table
        .context("described")?;
    ensure!(
        table
            .stream_specification()
            .is_some_and(|s| s.stream_enabled()),
        "the stream is on"
    );
    client
        .describe_table()
        .table_name(config.lease_table())
        .send()
        .await
        .context("the lease table exists")?;
    let second = migrate(&client, &config).await?;
    ensure!(
        !second.stream_enabled && !second.lease_table_created,
        "a second migrate changes nothing: {second:?}"
    );
    ensure!(second.stream_arn == first.stream_arn);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_refuses_a_table_it_cannot_serve_and_says_why() -> anyhow::Result<()> {
    let (_moto, config, client) = setup().await?;
    // Missing.
    let e = migrate(&client, &config).await.expect_err("no table");
    ensure!(matches!(e, DynamoError::TableMissing { .. }), "{e}");
    ensure!(e.to_string().contains(&config.table), "{e}");

    // Other key names.
    create_table(
        &client,
        &config.table,
        &[
            ("PK", KeyType::Hash, ScalarAttributeType::S),
            ("SK", KeyType::Range, ScalarAttributeType::S),
        ],
        None,
    )
    .await?;
    let e = migrate(&client, &config).await.expect_err("wrong keys");
    ensure!(
        e.to_string().contains("`PK`") && e.to_string().contains("`pk`"),
        "{e}"
    );
    let mut renamed = config.clone();
    renamed.partition_key = "PK".into();
    renamed.sort_key = "SK".into();
    migrate(&client, &renamed)
        .await
        .context("the configured key names are honoured")?;

    // A keys-only stream cannot carry events.
    let mut keys_only = config.clone();
    keys_only.table = format!("{}-k", config.table);
    create_table(
        &client,
        &keys_only.table,
        &standard_keys(),
        Some(StreamViewType::KeysOnly),
    )
    .await?;
    let e = migrate(&client, &keys_only).await.expect_err("keys only");
    ensure!(e.to_string().contains("KEYS_ONLY"), "{e}");

    // No sort key.
    let mut flat = config.clone();
    flat.table = format!("{}-f", config.table);
    create_table(
        &client,
        &flat.table,
        &[("pk", KeyType::Hash, ScalarAttributeType::S)],
        None,
    )
    .await?;
    let e = migrate(&client, &flat).await.expect_err("no sort key");
    ensure!(e.to_string().contains("no sort key"), "{e}");
    Ok(())
}
