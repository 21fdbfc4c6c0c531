//! Claim-check without the network: the config checks, the message it makes, the file store
//! and the consumer's checks. The S3 store is tested against moto in
//! `tests/claim_check_s3.rs`.

use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use outbox_core::{Event, Position, SinkErrorKind};
use sha2::{Digest as _, Sha256};
use uuid::Uuid;

use super::*;

const ID: Uuid = Uuid::from_u128(0x0190_0000_0000_7000_8000_0000_0000_00aa);
const ID_TEXT: &str = "01900000-0000-7000-8000-0000000000aa";

fn event(payload: Vec<u8>) -> Event {
    Event {
        id: ID,
        position: Position(7),
        aggregate_type: "Order".into(),
        aggregate_id: "o_91f2".into(),
        event_type: "order.placed".into(),
        payload: Bytes::from(payload),
        headers: vec![("tenant".into(), "acme".into())],
        created_at: time::OffsetDateTime::UNIX_EPOCH,
        attempts: 0,
    }
}

fn config(store: &str, above: Option<u64>) -> ClaimCheckConfig {
    ClaimCheckConfig {
        store: store.into(),
        above: above.map(ByteSize),
        keep: default_keep(),
        region: None,
        endpoint_url: None,
    }
}

fn file_store(dir: &Path) -> String {
    format!("file://{}", dir.display())
}

/// The relay's side with a file store at `dir`, above `above` bytes.
async fn on_files(dir: &Path, above: u64) -> ClaimCheck {
    ClaimCheck::connect(&config(&file_store(dir), Some(above)), None)
        .await
        .unwrap()
}

fn header<'a>(event: &'a Event, name: &str) -> Option<&'a str> {
    event
        .headers
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
}

/// Every file under `dir`, relative, sorted.
fn files(dir: &Path) -> Vec<String> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(root, &path, out);
            } else {
                out.push(path.strip_prefix(root).unwrap().display().to_string());
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.sort();
    out
}

fn err(c: ClaimCheckConfig, limit: Option<usize>) -> String {
    c.validate(limit).unwrap_err()
}

#[test]
fn the_config_is_checked_with_the_key_named() {
    assert_eq!(config("file:///tmp/cc", Some(10)).validate(None), Ok(()));
    assert_eq!(
        config("file:///tmp/cc", None).validate(Some(1 << 20)),
        Ok(()),
        "above defaults to the sink's limit"
    );
    assert_eq!(
        err(config("file:///tmp/cc", None), None),
        "above: is required for this sink, which has no message limit of its own"
    );
    let over = err(config("file:///tmp/cc", Some(300 << 10)), Some(256 << 10));
    assert!(
        over.starts_with("above: 300KiB is over the sink's own message limit of 262144 bytes"),
        "{over}"
    );
    assert_eq!(
        err(config("file:///tmp/cc", Some(0)), Some(100)),
        "above: must be greater than 0"
    );
    assert_eq!(
        err(config("s3://Orders", None), Some(100)),
        "store: `s3://Orders` is not a valid S3 location: `Orders` is not a bucket name (3 to \
         63 lower-case letters, digits, dots and hyphens, starting and ending with a letter or \
         digit); write s3://bucket/prefix or file:///absolute/dir"
    );
    assert!(err(config("file://tmp/cc", None), Some(100)).starts_with("store: `file://tmp/cc`"));

    let mut short = config("file:///tmp/cc", None);
    short.keep = Duration::from_secs(3600);
    assert_eq!(
        short.validate(Some(100)),
        Ok(()),
        "a file store is never expired: any keep will do"
    );
    short.keep = Duration::ZERO;
    assert_eq!(err(short, Some(100)), "keep: must be greater than 0");
    let mut region = config("file:///tmp/cc", None);
    region.region = Some("eu-west-1".into());
    assert_eq!(
        err(region, Some(100)),
        "region: only an s3:// store uses it"
    );
}

#[cfg(feature = "aws")]
#[test]
fn an_s3_config_is_checked_with_the_key_named() {
    let ok = config("s3://orders-big/outbox", Some(200 << 10));
    assert_eq!(ok.validate(Some(256 << 10)), Ok(()));
    assert_eq!(ok.validate(None), Ok(()));
    assert_eq!(
        err(config("s3://orders-big", None), None),
        "above: is required for this sink, which has no message limit of its own"
    );
    let mut short = config("s3://orders-big", None);
    short.keep = Duration::from_secs(3600);
    let e = err(short, Some(100));
    assert!(e.starts_with("keep: 1h is under a day"), "{e}");
    let mut region = config("s3://orders-big", None);
    region.region = Some("eu west".into());
    assert!(err(region, Some(100)).starts_with("region: `eu west` is not an AWS region"));
    let mut endpoint = config("s3://orders-big", None);
    endpoint.endpoint_url = Some("http://user:hunter2@127.0.0.1:5000".into());
    let e = err(endpoint, Some(100));
    assert!(e.starts_with("endpoint_url: `http://user:***@127.0.0.1:5000` must not carry"));
    assert!(!e.contains("hunter2"), "{e}");
}

#[cfg(not(feature = "aws"))]
#[tokio::test]
async fn without_the_aws_feature_an_s3_store_is_refused_clearly() {
    let e = err(config("s3://orders-big/outbox", None), Some(100));
    assert!(
        e.starts_with(
            "store: `s3://orders-big/outbox` is not available: this relay was built \
                       without the `aws` feature"
        ),
        "{e}"
    );
    let fetcher = ClaimCheckFetcher::new(None, None)
        .await
        .allow("s3://orders-big/outbox");
    let headers = [
        ("claim_check", "s3://orders-big/outbox/Order/x"),
        ("claim_check_size", "3"),
        ("claim_check_sha256", &"0".repeat(64)),
    ]
    .map(|(n, v)| (n.to_owned(), v.to_owned()));
    match fetcher.fetch(&headers).await {
        Err(DecodeError::Invalid(text)) => assert!(text.contains("without the `aws` feature")),
        other => panic!("expected Invalid, got {other:?}"),
    }
}

#[test]
fn the_config_reads_keys_with_units_and_defaults() {
    let parsed: ClaimCheckConfig =
        serde_json::from_str(r#"{"store":"s3://orders-big/outbox","above":"200KiB"}"#).unwrap();
    assert_eq!(parsed.above, Some(ByteSize(200 << 10)));
    assert_eq!(parsed.keep, Duration::from_secs(7 * 86400));
    let parsed: ClaimCheckConfig =
        serde_json::from_str(r#"{"store":"s3://orders-big","keep":"36h"}"#).unwrap();
    assert_eq!(keep_days(parsed.keep), 2, "lifecycle days are rounded up");
    assert_eq!(keep_days(Duration::from_secs(86400)), 1);
    assert_eq!(
        keep_days(Duration::from_secs(86400) + Duration::from_nanos(1)),
        2
    );
    assert!(serde_json::from_str::<ClaimCheckConfig>(r#"{"store":"s3://b","abov":1}"#).is_err());
}

#[test]
fn the_reference_body_is_exactly_the_three_fields_as_compact_json() {
    let body = reference_body("s3://b/p/Order/x\"y", "ab12", 5_242_880);
    assert_eq!(
        std::str::from_utf8(&body).unwrap(),
        r#"{"claim_check":"s3://b/p/Order/x\"y","claim_check_sha256":"ab12","claim_check_size":5242880}"#
    );
}

#[tokio::test]
async fn a_large_payload_goes_to_the_file_store_and_the_message_carries_the_reference() {
    let dir = tempfile::tempdir().unwrap();
    let claim_check = on_files(dir.path(), 1000).await;
    assert_eq!(claim_check.above(), 1000);
    let payload: Vec<u8> = (0..5000u32).map(|i| (i % 251) as u8).collect();
    let sha = hex::encode(Sha256::digest(&payload));
    let out = claim_check.apply(event(payload.clone())).await.unwrap();

    let url = format!("file://{}/Order/{ID_TEXT}", dir.path().display());
    assert_eq!(
        out.headers,
        vec![
            ("tenant".to_owned(), "acme".to_owned()),
            ("claim_check".to_owned(), url.clone()),
            ("claim_check_sha256".to_owned(), sha.clone()),
            ("claim_check_size".to_owned(), "5000".to_owned()),
        ]
    );
    let body = format!(
        r#"{{"claim_check":"{url}","claim_check_sha256":"{sha}","claim_check_size":5000}}"#
    );
    assert_eq!(std::str::from_utf8(&out.payload).unwrap(), body);
    assert_eq!((out.id, &*out.aggregate_id), (ID, "o_91f2"));
    assert!(message_size(&out) <= 1000);
    assert_eq!(
        std::fs::read(dir.path().join("Order").join(ID_TEXT)).unwrap(),
        payload
    );

    let fetcher = ClaimCheckFetcher::new(None, None)
        .await
        .allow(&format!("file://{}", dir.path().display()));
    let fetched = fetcher.fetch(&out.headers).await.unwrap().unwrap();
    assert_eq!(fetched, payload);
    assert_eq!(fetcher.fetch(&event(vec![]).headers).await, Ok(None));
}

#[tokio::test]
async fn a_message_that_fits_passes_unchanged_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let claim_check = ClaimCheck::connect(&config(&file_store(dir.path()), None), Some(256 << 10))
        .await
        .unwrap();
    assert_eq!(
        claim_check.above(),
        186 << 10,
        "above defaults to 3/4 of the sink's limit less 8 KiB (room for base64 and headers)"
    );
    let small = event(vec![b'x'; 100]);
    // Exactly at the threshold still fits.
    let edge = event(vec![b'x'; (186 << 10) - message_size(&event(vec![]))]);
    assert_eq!(message_size(&edge), 186 << 10);
    assert_eq!(claim_check.apply(small.clone()).await.unwrap(), small);
    assert_eq!(claim_check.apply(edge.clone()).await.unwrap(), edge);
    assert!(files(dir.path()).is_empty());
}

#[tokio::test]
async fn a_retry_writes_the_same_key_again_and_leaves_no_temporary_file() {
    let dir = tempfile::tempdir().unwrap();
    let claim_check = on_files(dir.path(), 500).await;
    let first = claim_check.apply(event(vec![7; 4000])).await.unwrap();
    let second = claim_check.apply(event(vec![7; 4000])).await.unwrap();
    assert_eq!(first, second);
    assert_eq!(files(dir.path()), vec![format!("Order/{ID_TEXT}")]);
}

#[tokio::test]
async fn a_message_whose_headers_alone_are_too_large_is_rejected_and_nothing_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let claim_check = on_files(dir.path(), 1000).await;
    let mut big_headers = event(vec![1; 3000]);
    big_headers.headers.push(("trace".into(), "t".repeat(2000)));
    let err = claim_check.apply(big_headers).await.unwrap_err();
    assert_eq!(err.kind(), SinkErrorKind::Rejected);
    let text = err.to_string();
    assert!(
        text.starts_with(
            "the message still does not fit after claim-check: its headers alone are "
        ),
        "{text}"
    );
    assert!(
        text.ends_with("bytes, over the limit of 1000 (claim_check.above)"),
        "{text}"
    );
    assert!(files(dir.path()).is_empty(), "{:?}", files(dir.path()));
}

#[tokio::test]
async fn an_aggregate_type_cannot_leave_the_directory() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let claim_check = on_files(&store, 500).await;
    let mut sneaky = event(vec![1; 4000]);
    sneaky.aggregate_type = "..".into();
    let out = claim_check.apply(sneaky).await.unwrap();
    assert_eq!(
        header(&out, "claim_check"),
        Some(format!("file://{}/%2E%2E/{ID_TEXT}", store.display()).as_str())
    );
    assert_eq!(files(dir.path()), vec![format!("store/%2E%2E/{ID_TEXT}")]);
}

#[tokio::test]
async fn an_unwritable_directory_is_unavailable_not_a_dead_letter() {
    let dir = tempfile::tempdir().unwrap();
    // A file where the store's directory should be: no user, root included, can write in it.
    let blocker = dir.path().join("blocker");
    std::fs::write(&blocker, b"").unwrap();
    let claim_check = on_files(&blocker, 500).await;
    let err = claim_check.apply(event(vec![1; 4000])).await.unwrap_err();
    assert_eq!(err.kind(), SinkErrorKind::Unavailable, "{err}");
    assert!(
        err.to_string()
            .contains("cannot write the claim-check file"),
        "{err}"
    );
    let err = claim_check.check().await.unwrap_err();
    assert_eq!(err.kind(), SinkErrorKind::Unavailable, "{err}");
}

#[tokio::test]
async fn doctor_and_migrate_on_a_file_store() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("new");
    let claim_check = on_files(&store, 500).await;
    let checked = claim_check.check().await.unwrap();
    assert!(checked.contains("is writable"), "{checked}");
    assert!(files(dir.path()).is_empty(), "the probe is removed");
    let expiry = claim_check.ensure_expiry().await.unwrap();
    assert!(expiry.contains("nothing to set"), "{expiry}");
}

#[tokio::test]
async fn the_consumer_refuses_a_payload_of_the_wrong_size_or_hash_or_bad_headers() {
    let dir = tempfile::tempdir().unwrap();
    let claim_check = on_files(dir.path(), 500).await;
    let out = claim_check.apply(event(vec![3; 4000])).await.unwrap();
    let fetcher = ClaimCheckFetcher::new(None, None)
        .await
        .allow(&format!("file://{}", dir.path().display()));
    let path = dir.path().join("Order").join(ID_TEXT);
    let invalid = |r: Result<Option<Bytes>, DecodeError>| match r {
        Err(DecodeError::Invalid(text)) => text,
        other => panic!("expected Invalid, got {other:?}"),
    };

    // Same size, one byte changed: the hash catches it.
    let mut corrupt = vec![3; 4000];
    corrupt[100] = 4;
    std::fs::write(&path, &corrupt).unwrap();
    let text = invalid(fetcher.fetch(&out.headers).await);
    assert!(text.contains("has sha256 "), "{text}");
    assert!(
        text.contains(&format!(
            "but claim_check_sha256 says {}",
            header(&out, "claim_check_sha256").unwrap()
        )),
        "{text}"
    );

    std::fs::write(&path, [3; 10]).unwrap();
    let text = invalid(fetcher.fetch(&out.headers).await);
    assert!(
        text.ends_with("is 10 bytes, but claim_check_size says 4000"),
        "{text}"
    );

    std::fs::remove_file(&path).unwrap();
    let text = invalid(fetcher.fetch(&out.headers).await);
    assert!(
        text.starts_with("no claim-checked payload at file://"),
        "{text}"
    );

    let with = |name: &str, value: &str| {
        let mut headers = out.headers.clone();
        headers.retain(|(n, _)| n != name);
        headers.push((name.to_owned(), value.to_owned()));
        headers
    };
    let text = invalid(fetcher.fetch(&with("claim_check_size", "many")).await);
    assert_eq!(text, "the claim_check_size header is not a number of bytes");
    let text = invalid(fetcher.fetch(&with("claim_check_sha256", "abc")).await);
    assert_eq!(text, "the claim_check_sha256 header is not 64 hex digits");
    let text = invalid(
        fetcher
            .fetch(&with("claim_check", "https://example.com/x"))
            .await,
    );
    assert!(
        text.contains("is not in a store this consumer allows"),
        "a URL of another kind is outside every allowed store: {text}"
    );
    let mut no_size = out.headers.clone();
    no_size.retain(|(n, _)| n != "claim_check_size");
    let text = invalid(fetcher.fetch(&no_size).await);
    assert_eq!(
        text,
        "the message has claim_check but no claim_check_size header"
    );
}

#[tokio::test]
async fn with_encryption_the_ciphertext_is_stored_and_the_decoder_undoes_both() {
    use crate::encryption::{EncryptionConfig, KeyRing};
    use crate::{Decoder, Encoder, PayloadOptions};

    let dir = tempfile::tempdir().unwrap();
    let key_file = dir.path().join("key");
    std::fs::write(&key_file, hex::encode([7u8; 32])).unwrap();
    let store = dir.path().join("store");
    let options = PayloadOptions {
        claim_check: Some(config(&file_store(&store), Some(1000))),
        encryption: Some(EncryptionConfig {
            key: format!("file:{}", key_file.display()),
            rotate: Duration::from_secs(3600),
            fields: Vec::new(),
            region: None,
            endpoint_url: None,
        }),
    };
    let encoder = Encoder::connect(&options, None).await.unwrap().unwrap();
    let plain: Vec<u8> = (0..6000u32).map(|i| (i % 97) as u8).collect();
    let out = encoder.encode(&event(plain.clone())).await.unwrap();

    let stored = std::fs::read(store.join("Order").join(ID_TEXT)).unwrap();
    assert_ne!(stored, plain, "the store holds ciphertext");
    assert_eq!(
        header(&out, "claim_check_sha256"),
        Some(hex::encode(Sha256::digest(&stored)).as_str()),
        "the hash is of the stored bytes"
    );
    assert_eq!(
        header(&out, "claim_check_size"),
        Some(stored.len().to_string().as_str())
    );
    assert!(header(&out, "encryption").is_some());

    let decoder = Decoder::new()
        .with_claim_check(
            ClaimCheckFetcher::new(None, None)
                .await
                .allow(&format!("file://{}", store.display())),
        )
        .with_keys(KeyRing::new().with_key_file(&key_file).unwrap());
    let decoded = decoder
        .decode(out.id, &out.payload, &out.headers)
        .await
        .unwrap();
    assert_eq!(decoded, plain);
}

/// A fetcher follows only the stores it was given: a message naming another directory (or a
/// sibling whose name merely starts the same) is refused before anything is read.
#[tokio::test]
async fn the_consumer_fetches_only_from_the_stores_it_allows() {
    let dir = tempfile::tempdir().unwrap();
    let claim_check = on_files(dir.path(), 500).await;
    let out = claim_check.apply(event(vec![5; 4000])).await.unwrap();
    let allowed = format!("file://{}", dir.path().display());
    for fetcher in [
        ClaimCheckFetcher::new(None, None).await,
        ClaimCheckFetcher::new(None, None)
            .await
            .allow("file:///etc"),
        ClaimCheckFetcher::new(None, None)
            .await
            .allow(&allowed[..allowed.len() - 1]),
    ] {
        match fetcher.fetch(&out.headers).await {
            Err(DecodeError::Invalid(text)) => {
                assert!(
                    text.contains("not in a store this consumer allows"),
                    "{text}"
                );
            }
            other => panic!("expected a refusal, got {other:?}"),
        }
    }
    let fetched = ClaimCheckFetcher::new(None, None)
        .await
        .allow(&format!("{allowed}/"))
        .fetch(&out.headers)
        .await
        .unwrap();
    assert_eq!(fetched.as_deref(), Some(&[5u8; 4000][..]));
}
