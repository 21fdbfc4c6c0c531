//! Claim-check against moto's S3 (`moto_server`, see outbox-testkit): the relay's writes,
//! `outbox migrate`'s lifecycle rule and `outbox doctor`'s check, and the consumer's fetch.
#![cfg(feature = "aws")]

use std::time::Duration;

use aws_config::{BehaviorVersion, Region};
use aws_sdk_s3::Client;
use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::types::{
    BucketLifecycleConfiguration, ExpirationStatus, LifecycleExpiration, LifecycleRule,
    LifecycleRuleFilter,
};
use bytes::Bytes;
use outbox_core::{Event, Position, SinkError, SinkErrorKind};
use outbox_payload::ByteSize;
use outbox_payload::DecodeError;
use outbox_payload::claim_check::{ClaimCheck, ClaimCheckConfig, ClaimCheckFetcher, message_size};
use outbox_testkit::services::Moto;
use sha2::{Digest as _, Sha256};
use uuid::Uuid;

const FIVE_MIB: usize = 5 << 20;

/// A client of moto's S3, path-style, for setting up and inspecting buckets.
async fn s3(moto: &Moto) -> Client {
    let sdk = aws_config::defaults(BehaviorVersion::latest())
        .region(Region::new(Moto::REGION))
        .endpoint_url(moto.url())
        .load()
        .await;
    Client::from_conf(
        aws_sdk_s3::config::Builder::from(&sdk)
            .force_path_style(true)
            .build(),
    )
}

/// A new bucket with a unique name.
async fn bucket(client: &Client) -> anyhow::Result<String> {
    let name = format!("cc-{}", &Uuid::new_v4().simple().to_string()[..16]);
    client.create_bucket().bucket(&name).send().await?;
    Ok(name)
}

/// The shared moto, a client of it and a new bucket.
async fn shared_bucket() -> anyhow::Result<(&'static Moto, Client, String)> {
    Moto::set_aws_env();
    let moto = Moto::shared().await?;
    let client = s3(moto).await;
    let bucket = bucket(&client).await?;
    Ok((moto, client, bucket))
}

/// The relay's side for `store` on `moto`, above 200 KiB.
async fn connect(moto: &Moto, store: String) -> anyhow::Result<ClaimCheck> {
    Ok(ClaimCheck::connect(&config(moto, store), None).await?)
}

/// The error of a write the store could not take; it must be `Unavailable`.
fn unavailable(written: Result<Event, SinkError>) -> SinkError {
    match written {
        Err(e) if e.kind() == SinkErrorKind::Unavailable => e,
        other => panic!("expected Unavailable, got {other:?}"),
    }
}

/// The text of an `Invalid` answer; any other fails the test.
fn invalid(answer: Result<Option<Bytes>, DecodeError>) -> String {
    match answer {
        Err(DecodeError::Invalid(text)) => text,
        other => panic!("expected Invalid, got {other:?}"),
    }
}

fn config(moto: &Moto, store: String) -> ClaimCheckConfig {
    ClaimCheckConfig {
        store,
        above: Some(ByteSize(200 << 10)),
        keep: Duration::from_secs(3 * 86400),
        region: Some(Moto::REGION.to_owned()),
        endpoint_url: Some(moto.url().to_owned()),
    }
}

/// A consumer's fetcher of every bucket these tests make (`s3://` + the bucket).
async fn fetcher(moto: &Moto, bucket: &str) -> ClaimCheckFetcher {
    ClaimCheckFetcher::new(Some(Moto::REGION), Some(moto.url()))
        .await
        .allow(&format!("s3://{bucket}"))
}

/// `len` bytes that are not all alike (a changed byte anywhere changes the hash).
fn payload(len: usize) -> Vec<u8> {
    let mut state = 0x9e37_79b9_7f4a_7c15_u64;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect()
}

fn event(payload: Vec<u8>) -> Event {
    Event {
        id: Uuid::now_v7(),
        position: Position(1),
        aggregate_type: "Order".into(),
        aggregate_id: "o_91f2".into(),
        event_type: "order.placed".into(),
        payload: Bytes::from(payload),
        headers: vec![("tenant".into(), "acme".into())],
        created_at: time::OffsetDateTime::UNIX_EPOCH,
        attempts: 0,
    }
}

fn header<'a>(event: &'a Event, name: &str) -> Option<&'a str> {
    event
        .headers
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
}

/// The keys of every object in `bucket`.
async fn keys(client: &Client, bucket: &str) -> anyhow::Result<Vec<String>> {
    let listed = client.list_objects_v2().bucket(bucket).send().await?;
    Ok(listed
        .contents()
        .iter()
        .filter_map(|o| o.key().map(str::to_owned))
        .collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_payload_is_stored_in_s3_and_fetched_back_bit_exact() -> anyhow::Result<()> {
    let (moto, client, bucket) = shared_bucket().await?;
    let claim_check = connect(moto, format!("s3://{bucket}/outbox/large")).await?;

    let original = payload(FIVE_MIB);
    let sha = hex::encode(Sha256::digest(&original));
    let event = event(original.clone());
    let id = event.id.hyphenated().to_string();
    let out = claim_check.apply(event.clone()).await?;

    let key = format!("outbox/large/Order/{id}");
    let url = format!("s3://{bucket}/{key}");
    assert_eq!(
        out.headers,
        vec![
            ("tenant".to_owned(), "acme".to_owned()),
            ("claim_check".to_owned(), url.clone()),
            ("claim_check_sha256".to_owned(), sha.clone()),
            ("claim_check_size".to_owned(), FIVE_MIB.to_string()),
        ]
    );
    assert_eq!(
        std::str::from_utf8(&out.payload)?,
        format!(
            r#"{{"claim_check":"{url}","claim_check_sha256":"{sha}","claim_check_size":5242880}}"#
        )
    );
    assert!(message_size(&out) <= 200 << 10);

    // The object, as any S3 client sees it.
    let object = client.get_object().bucket(&bucket).key(&key).send().await?;
    let metadata = object.metadata().cloned().unwrap_or_default();
    assert_eq!(metadata.get("event-id"), Some(&id));
    assert_eq!(
        metadata.get("aggregate-type").map(String::as_str),
        Some("Order")
    );
    assert_eq!(
        metadata.get("event-type").map(String::as_str),
        Some("order.placed")
    );
    assert_eq!(object.content_type(), Some("application/octet-stream"));
    assert!(object.body.collect().await?.into_bytes() == original);

    // The consumer's side.
    let fetched = fetcher(moto, &bucket).await.fetch(&out.headers).await?;
    assert!(fetched.is_some_and(|f| f == original), "not bit-exact");

    // A retry writes the same key: still one object.
    let again = claim_check.apply(event).await?;
    assert_eq!(again, out);
    assert_eq!(keys(&client, &bucket).await?, vec![key]);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_payload_passes_unchanged_and_nothing_is_stored() -> anyhow::Result<()> {
    let (moto, client, bucket) = shared_bucket().await?;
    let claim_check = connect(moto, format!("s3://{bucket}/outbox")).await?;
    let small = event(payload(10 << 10));
    assert_eq!(claim_check.apply(small.clone()).await?, small);
    assert!(keys(&client, &bucket).await?.is_empty());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_bucket_is_unavailable_not_a_dead_letter() -> anyhow::Result<()> {
    Moto::set_aws_env();
    let moto = Moto::shared().await?;
    let missing = format!("cc-missing-{}", &Uuid::new_v4().simple().to_string()[..12]);
    let claim_check = connect(moto, format!("s3://{missing}/outbox")).await?;
    let err = unavailable(claim_check.apply(event(payload(300 << 10))).await);
    assert!(
        err.to_string().starts_with(&format!(
            "the claim-check bucket `{missing}` does not exist"
        )),
        "{err}"
    );
    let err = claim_check.check().await.unwrap_err();
    assert!(err.to_string().contains("does not exist"), "{err}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_sets_the_lifecycle_rule_doctor_checks_and_keeps_the_others() -> anyhow::Result<()>
{
    let (moto, client, bucket) = shared_bucket().await?;
    // A rule of the bucket's owner that must survive.
    let other = LifecycleRule::builder()
        .id("logs")
        .filter(LifecycleRuleFilter::builder().prefix("logs/").build())
        .status(ExpirationStatus::Enabled)
        .expiration(LifecycleExpiration::builder().days(30).build())
        .build()?;
    client
        .put_bucket_lifecycle_configuration()
        .bucket(&bucket)
        .lifecycle_configuration(
            BucketLifecycleConfiguration::builder()
                .rules(other)
                .build()?,
        )
        .send()
        .await?;
    let mut config = config(moto, format!("s3://{bucket}/outbox/large"));
    // 2.5 days: rounded up to 3.
    config.keep = Duration::from_secs(5 * 43200);
    let claim_check = ClaimCheck::connect(&config, None).await?;

    let before = claim_check.check().await.unwrap_err();
    assert!(
        before.to_string().starts_with(&format!(
            "no enabled lifecycle rule of bucket `{bucket}` expires the objects under \
             s3://{bucket}/outbox/large/: run `outbox migrate`"
        )),
        "{before}"
    );

    let set = claim_check.ensure_expiry().await?;
    assert_eq!(
        set,
        format!(
            "lifecycle rule `outbox-claim-check-outbox/large` of bucket `{bucket}` expires the \
             objects under s3://{bucket}/outbox/large/ after 3 days (set)"
        )
    );
    let rules = client
        .get_bucket_lifecycle_configuration()
        .bucket(&bucket)
        .send()
        .await?;
    let mut summary: Vec<(String, Option<String>, Option<i32>)> = rules
        .rules()
        .iter()
        .map(|r| {
            (
                r.id().unwrap_or("").to_owned(),
                r.filter().and_then(|f| f.prefix()).map(str::to_owned),
                r.expiration().and_then(|e| e.days()),
            )
        })
        .collect();
    summary.sort();
    assert_eq!(
        summary,
        vec![
            ("logs".into(), Some("logs/".into()), Some(30)),
            (
                "outbox-claim-check-outbox/large".into(),
                Some("outbox/large/".into()),
                Some(3)
            ),
        ]
    );

    let after = claim_check.check().await?;
    assert!(
        after.contains("writable; objects expire after 3 days (lifecycle rule `outbox-claim-check-outbox/large`)"),
        "{after}"
    );
    // The doctor's probe object is gone.
    assert!(keys(&client, &bucket).await?.is_empty());
    assert!(
        claim_check
            .ensure_expiry()
            .await?
            .ends_with("(already set)")
    );

    // A keep that no longer matches the rule is reported, and migrate replaces the rule.
    config.keep = Duration::from_secs(10 * 86400);
    let longer = ClaimCheck::connect(&config, None).await?;
    let stale = longer.check().await.unwrap_err();
    assert!(
        stale
            .to_string()
            .contains("after 3 days, but claim_check.keep is 10 days"),
        "{stale}"
    );
    assert!(
        longer
            .ensure_expiry()
            .await?
            .ends_with("after 10 days (set)")
    );
    longer.check().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_store_is_unavailable_for_the_relay_and_the_consumer() -> anyhow::Result<()> {
    Moto::set_aws_env();
    let moto = Moto::start().await?;
    let client = s3(&moto).await;
    let bucket = bucket(&client).await?;
    let claim_check = connect(&moto, format!("s3://{bucket}/outbox")).await?;
    let stored = claim_check.apply(event(payload(300 << 10))).await?;
    assert!(header(&stored, "claim_check").is_some());
    let fetcher = fetcher(&moto, &bucket).await;

    moto.stop().await?;
    let err = unavailable(claim_check.apply(event(payload(300 << 10))).await);
    assert!(
        err.to_string().starts_with(&format!(
            "cannot reach the claim-check store (S3 at {})",
            moto.url()
        )),
        "{err}"
    );
    match fetcher.fetch(&stored.headers).await {
        Err(e @ DecodeError::Unavailable(_)) => assert!(e.is_transient()),
        other => panic!("expected Unavailable, got {other:?}"),
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupted_or_deleted_object_is_invalid_for_the_consumer() -> anyhow::Result<()> {
    let (moto, client, bucket) = shared_bucket().await?;
    let claim_check = connect(moto, format!("s3://{bucket}")).await?;
    let original = payload(300 << 10);
    let out = claim_check.apply(event(original.clone())).await?;
    let url = header(&out, "claim_check").unwrap_or_default().to_owned();
    let key = url
        .strip_prefix(&format!("s3://{bucket}/"))
        .unwrap_or_default()
        .to_owned();
    assert!(
        key.starts_with("Order/"),
        "no prefix: the key starts at the aggregate type"
    );
    let fetcher = fetcher(moto, &bucket).await;

    // Same size, one byte changed.
    let mut corrupt = original;
    corrupt[1000] ^= 0xff;
    client
        .put_object()
        .bucket(&bucket)
        .key(&key)
        .body(ByteStream::from(corrupt))
        .send()
        .await?;
    let text = invalid(fetcher.fetch(&out.headers).await);
    let sha = header(&out, "claim_check_sha256").unwrap_or_default();
    assert!(
        text.contains(&format!("but claim_check_sha256 says {sha}")),
        "{text}"
    );

    client
        .delete_object()
        .bucket(&bucket)
        .key(&key)
        .send()
        .await?;
    match fetcher.fetch(&out.headers).await {
        Err(DecodeError::Invalid(text)) => {
            assert!(
                text.starts_with(&format!("no claim-checked payload at {url}")),
                "{text}"
            )
        }
        other => panic!("expected Invalid, got {other:?}"),
    }
    Ok(())
}
