//! `DynamoDbInbox` against moto (started through `moto_atomic.py`, which makes
//! `TransactWriteItems` all-or-nothing as on AWS): the side effect and the dedup record in
//! one transaction, duplicates, a handler's failed condition, concurrent deliveries,
//! consumers, positions, retention and the transaction's item limit.

use std::time::Duration;

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::config::{BehaviorVersion, Credentials, Region};
use aws_sdk_dynamodb::types::{AttributeValue, Put, TransactWriteItem, Update};
use bytes::Bytes;
use outbox_inbox::dynamodb::{MAX_TRANSACT_ITEMS, POSITION_SK, PROCESSED_SK, attr};
use outbox_inbox::{DynamoDbInbox, DynamoDbInboxError, InboxMessage, OrderGate, Outcome};
use outbox_testkit::services::Moto;
use uuid::Uuid;

/// A client of the shared moto server.
async fn client() -> anyhow::Result<Client> {
    Moto::set_aws_env();
    let moto = Moto::shared().await?;
    let config = aws_sdk_dynamodb::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new(Moto::REGION))
        .credentials_provider(Credentials::new(
            std::env::var("AWS_ACCESS_KEY_ID")?,
            std::env::var("AWS_SECRET_ACCESS_KEY")?,
            None,
            None,
            "moto",
        ))
        .endpoint_url(moto.url())
        .build();
    Ok(Client::from_conf(config))
}

/// An inbox on a new table of its own, migrated.
async fn inbox() -> anyhow::Result<DynamoDbInbox> {
    let inbox = DynamoDbInbox::new(client().await?, format!("inbox-{}", Uuid::new_v4()));
    let report = inbox.migrate().await?;
    assert!(report.table_created && report.ttl_enabled, "{report:?}");
    Ok(inbox)
}

fn message(id: Uuid, aggregate_id: &str, seq: Option<u64>) -> InboxMessage {
    InboxMessage {
        id,
        event_type: "order.paid".to_owned(),
        aggregate_type: "Order".to_owned(),
        aggregate_id: aggregate_id.to_owned(),
        aggregate_seq: seq,
        headers: Vec::new(),
        payload: Bytes::from_static(b"{}"),
    }
}

fn s(v: &str) -> AttributeValue {
    AttributeValue::S(v.to_owned())
}

/// The side effect: `n` points more for `customer`, a business item in the inbox's own table
/// (single-table design).
fn add_points(inbox: &DynamoDbInbox, customer: &str, n: i64) -> TransactWriteItem {
    let update = Update::builder()
        .table_name(inbox.table())
        .key("pk", s(&format!("CUSTOMER#{customer}")))
        .key("sk", s("POINTS"))
        .update_expression("ADD #n :n")
        .expression_attribute_names("#n", "n")
        .expression_attribute_values(":n", AttributeValue::N(n.to_string()))
        .build()
        .expect("valid update");
    TransactWriteItem::builder().update(update).build()
}

/// The customer's points; 0 when the item does not exist.
async fn points(inbox: &DynamoDbInbox, customer: &str) -> anyhow::Result<i64> {
    let item = inbox
        .client()
        .get_item()
        .table_name(inbox.table())
        .key("pk", s(&format!("CUSTOMER#{customer}")))
        .key("sk", s("POINTS"))
        .consistent_read(true)
        .send()
        .await?
        .item;
    Ok(match item.as_ref().and_then(|i| i.get("n")) {
        Some(n) => n
            .as_n()
            .map_err(|_| anyhow::anyhow!("n is not N"))?
            .parse()?,
        None => 0,
    })
}

/// Delivers `m` to `consumer`: ten points for `customer`.
async fn deliver(
    inbox: &DynamoDbInbox,
    consumer: &str,
    m: &InboxMessage,
    customer: &str,
) -> Result<Outcome<()>, DynamoDbInboxError> {
    let mut tx = inbox.transaction(consumer, m)?;
    tx.push(add_points(inbox, customer, 10))?;
    tx.commit().await
}

/// The dedup record of `consumer` and `id`, as stored.
async fn record(
    inbox: &DynamoDbInbox,
    consumer: &str,
    id: Uuid,
) -> anyhow::Result<std::collections::HashMap<String, AttributeValue>> {
    inbox
        .client()
        .get_item()
        .table_name(inbox.table())
        .key("pk", s(&format!("inbox#{consumer}#{id}")))
        .key("sk", s(PROCESSED_SK))
        .consistent_read(true)
        .send()
        .await?
        .item
        .ok_or_else(|| anyhow::anyhow!("no dedup record for {consumer} {id}"))
}

fn sendable<F: Future + Send>(f: F) -> F {
    f
}

fn number(item: &std::collections::HashMap<String, AttributeValue>, name: &str) -> u64 {
    item.get(name)
        .and_then(|v| v.as_n().ok())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{name} is not a number in {item:?}"))
}

#[tokio::test]
async fn a_first_delivery_applies_the_side_effect_with_the_record_and_a_redelivery_is_a_duplicate()
-> anyhow::Result<()> {
    let inbox = inbox().await?;
    let again = inbox.migrate().await?;
    assert!(!again.table_created && !again.ttl_enabled, "{again:?}");

    let m = message(Uuid::now_v7(), "o_1", None);
    assert!(!inbox.contains("loyalty", m.id).await?);
    assert_eq!(
        // Send: a consumer loop's handler future must be.
        sendable(deliver(&inbox, "loyalty", &m, "c1")).await?,
        Outcome::Processed(())
    );
    assert_eq!(points(&inbox, "c1").await?, 10);
    assert!(inbox.contains("loyalty", m.id).await?);
    let stored = record(&inbox, "loyalty", m.id).await?;
    assert_eq!(stored.get(attr::CONSUMER), Some(&s("loyalty")));
    assert_eq!(stored.get(attr::EVENT_ID), Some(&s(&m.id.to_string())));

    assert_eq!(
        deliver(&inbox, "loyalty", &m, "c1").await?,
        Outcome::Duplicate
    );
    assert_eq!(points(&inbox, "c1").await?, 10, "the side effect ran twice");
    Ok(())
}

#[tokio::test]
async fn a_handler_item_failing_its_condition_commits_nothing_and_a_retry_processes()
-> anyhow::Result<()> {
    let inbox = inbox().await?;
    let m = message(Uuid::now_v7(), "o_1", None);
    // The side effect: points for c1, if c2 (the referrer) exists; it does not yet.
    let referrer_exists = || {
        let check = aws_sdk_dynamodb::types::ConditionCheck::builder()
            .table_name(inbox.table())
            .key("pk", s("CUSTOMER#c2"))
            .key("sk", s("POINTS"))
            .condition_expression("attribute_exists(pk)")
            .build()
            .expect("valid check");
        TransactWriteItem::builder().condition_check(check).build()
    };
    let mut tx = inbox.transaction("loyalty", &m)?;
    tx.push(add_points(&inbox, "c1", 10))?;
    tx.push(referrer_exists())?;
    match tx.commit().await {
        Err(DynamoDbInboxError::Handler { index, code, .. }) => {
            assert_eq!((index, code.as_str()), (1, "ConditionalCheckFailed"));
        }
        other => panic!("expected the handler's error, got {other:?}"),
    }
    assert!(
        !inbox.contains("loyalty", m.id).await?,
        "the dedup record committed without the side effect"
    );
    assert_eq!(points(&inbox, "c1").await?, 0, "a partial side effect");

    deliver(
        &inbox,
        "referrals",
        &message(Uuid::now_v7(), "o_2", None),
        "c2",
    )
    .await?;
    let mut tx = inbox.transaction("loyalty", &m)?;
    tx.push(add_points(&inbox, "c1", 10))?;
    tx.push(referrer_exists())?;
    assert_eq!(tx.commit().await?, Outcome::Processed(()));
    assert_eq!(points(&inbox, "c1").await?, 10);
    assert!(inbox.contains("loyalty", m.id).await?);
    Ok(())
}

#[tokio::test]
async fn of_two_concurrent_deliveries_of_one_event_exactly_one_is_processed() -> anyhow::Result<()>
{
    let inbox = inbox().await?;
    const EVENTS: i64 = 20;
    for _ in 0..EVENTS {
        let m = message(Uuid::now_v7(), "o_1", None);
        let (a, b) = tokio::join!(
            deliver(&inbox, "loyalty", &m, "c1"),
            deliver(&inbox, "loyalty", &m, "c1")
        );
        let outcomes = [a?, b?];
        assert_eq!(
            outcomes.iter().filter(|o| !o.is_duplicate()).count(),
            1,
            "{outcomes:?}"
        );
    }
    assert_eq!(points(&inbox, "c1").await?, 10 * EVENTS);
    Ok(())
}

#[tokio::test]
async fn two_consumers_each_process_an_event_once() -> anyhow::Result<()> {
    let inbox = inbox().await?;
    let m = message(Uuid::now_v7(), "o_1", None);
    for (consumer, customer) in [("loyalty", "c1"), ("audit", "c2")] {
        assert_eq!(
            deliver(&inbox, consumer, &m, customer).await?,
            Outcome::Processed(()),
            "{consumer}"
        );
    }
    for (consumer, customer) in [("loyalty", "c1"), ("audit", "c2")] {
        assert_eq!(
            deliver(&inbox, consumer, &m, customer).await?,
            Outcome::Duplicate,
            "{consumer}"
        );
        assert_eq!(points(&inbox, customer).await?, 10, "{consumer}");
    }
    // Names with the key's separator stay apart.
    assert_eq!(
        deliver(&inbox, "a#b", &m, "c3").await?,
        Outcome::Processed(())
    );
    assert_eq!(
        deliver(&inbox, "a", &m, "c3").await?,
        Outcome::Processed(())
    );
    Ok(())
}

#[tokio::test]
async fn records_carry_their_expiry_and_purge_removes_only_old_ones() -> anyhow::Result<()> {
    let keep = Duration::from_secs(3 * 24 * 3600);
    let inbox = inbox().await?.keep(keep);
    let (old, new) = (
        message(Uuid::now_v7(), "o_1", Some(1)),
        message(Uuid::now_v7(), "o_1", Some(2)),
    );
    for m in [&old, &new] {
        deliver(&inbox, "loyalty", m, "c1").await?;
    }
    let stored = record(&inbox, "loyalty", new.id).await?;
    assert_eq!(
        number(&stored, attr::EXPIRES_AT) - number(&stored, attr::PROCESSED_AT),
        keep.as_secs()
    );

    // `old` was processed 30 days ago.
    let month_ago = number(&stored, attr::PROCESSED_AT) - 30 * 24 * 3600;
    inbox
        .client()
        .update_item()
        .table_name(inbox.table())
        .key("pk", s(&format!("inbox#loyalty#{}", old.id)))
        .key("sk", s(PROCESSED_SK))
        .update_expression("SET #at = :at")
        .expression_attribute_names("#at", attr::PROCESSED_AT)
        .expression_attribute_values(":at", AttributeValue::N(month_ago.to_string()))
        .send()
        .await?;

    assert_eq!(
        inbox
            .purge_older_than(Duration::from_secs(7 * 24 * 3600))
            .await?,
        1
    );
    assert!(!inbox.contains("loyalty", old.id).await?);
    assert!(inbox.contains("loyalty", new.id).await?);
    // Business items and positions are not the inbox's records: untouched.
    assert_eq!(points(&inbox, "c1").await?, 20);
    assert_eq!(inbox.applied_position("loyalty", "Order", "o_1").await?, 2);
    let in_an_hour = std::time::SystemTime::now() + Duration::from_secs(3600);
    assert_eq!(inbox.purge_before(in_an_hour).await?, 1);
    assert!(!inbox.contains("loyalty", new.id).await?);
    Ok(())
}

#[tokio::test]
async fn migrate_refuses_a_table_with_another_ttl_attribute_or_other_keys() -> anyhow::Result<()> {
    let inbox = inbox().await?;
    let other = inbox.clone().ttl_attribute("ttl");
    match other.migrate().await {
        Err(DynamoDbInboxError::Table { problem, .. }) => {
            assert!(problem.contains("expires_at"), "{problem}");
        }
        other => panic!("expected a table error, got {other:?}"),
    }
    match inbox.clone().keys("PK", "SK").migrate().await {
        Err(DynamoDbInboxError::Table { problem, .. }) => assert!(
            problem.starts_with("its partition key is `pk` of type S; the inbox needs `PK`"),
            "{problem}"
        ),
        other => panic!("expected a table error, got {other:?}"),
    }
    Ok(())
}

#[tokio::test]
async fn positions_are_recorded_with_the_side_effect_and_never_move_back() -> anyhow::Result<()> {
    let inbox = inbox().await?;
    let gate = inbox.gate("balances");
    assert_eq!(gate.applied("Order", "o_1").await?, 0);

    deliver(
        &inbox,
        "balances",
        &message(Uuid::now_v7(), "o_1", Some(1)),
        "c1",
    )
    .await?;
    assert_eq!(gate.applied("Order", "o_1").await?, 1);
    let position = inbox
        .client()
        .get_item()
        .table_name(inbox.table())
        .key("pk", s("inbox#balances#Order#o_1"))
        .key("sk", s(POSITION_SK))
        .send()
        .await?
        .item
        .ok_or_else(|| anyhow::anyhow!("no position item"))?;
    assert_eq!(number(&position, attr::APPLIED_SEQ), 1);

    // Position 4 dead-lettered and passed; a redelivery of 3 still applies, and leaves it.
    gate.pass("Order", "o_1", 4).await?;
    gate.pass("Order", "o_1", 2).await?;
    assert_eq!(gate.applied("Order", "o_1").await?, 4);
    let three = message(Uuid::now_v7(), "o_1", Some(3));
    assert_eq!(
        deliver(&inbox, "balances", &three, "c1").await?,
        Outcome::Processed(())
    );
    assert_eq!(gate.applied("Order", "o_1").await?, 4);
    assert_eq!(points(&inbox, "c1").await?, 20);

    // A duplicate still records its position (it was applied), on its own.
    let five = message(Uuid::now_v7(), "o_1", Some(5));
    assert_eq!(
        inbox
            .transaction_for_id("balances", five.id)?
            .commit()
            .await?,
        Outcome::Processed(())
    );
    assert_eq!(gate.applied("Order", "o_1").await?, 4);
    assert_eq!(
        deliver(&inbox, "balances", &five, "c1").await?,
        Outcome::Duplicate
    );
    assert_eq!(gate.applied("Order", "o_1").await?, 5);
    assert_eq!(points(&inbox, "c1").await?, 20);

    // Another aggregate and another consumer have their own positions.
    assert_eq!(gate.applied("Order", "o_2").await?, 0);
    assert_eq!(inbox.applied_position("loyalty", "Order", "o_1").await?, 0);
    Ok(())
}

#[tokio::test]
async fn the_handler_gets_the_items_the_inbox_leaves_in_one_transaction() -> anyhow::Result<()> {
    let inbox = inbox().await?;
    let put = |i: usize| {
        let put = Put::builder()
            .table_name(inbox.table())
            .item("pk", s(&format!("LINE#{i}")))
            .item("sk", s("LINE"))
            .build()
            .expect("valid put");
        TransactWriteItem::builder().put(put).build()
    };
    let mut tx = inbox.transaction("lines", &message(Uuid::now_v7(), "o_1", None))?;
    assert_eq!(tx.room(), MAX_TRANSACT_ITEMS - 1);
    for i in 0..MAX_TRANSACT_ITEMS - 1 {
        tx.push(put(i))?;
    }
    assert!(matches!(
        tx.push(put(MAX_TRANSACT_ITEMS)),
        Err(DynamoDbInboxError::Invalid(_))
    ));
    assert_eq!(tx.commit().await?, Outcome::Processed(()));
    let last = inbox
        .client()
        .get_item()
        .table_name(inbox.table())
        .key("pk", s(&format!("LINE#{}", MAX_TRANSACT_ITEMS - 2)))
        .key("sk", s("LINE"))
        .send()
        .await?;
    assert!(last.item.is_some());

    let with_position = inbox.transaction("lines", &message(Uuid::now_v7(), "o_1", Some(1)))?;
    assert_eq!(with_position.room(), MAX_TRANSACT_ITEMS - 2);
    Ok(())
}
