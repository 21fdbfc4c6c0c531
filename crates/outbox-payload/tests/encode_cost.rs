//! What the relay's payload stage costs per event, alone (no database, no broker): a
//! benchmark, run in release and by hand (docs/benchmarks.md, "Payload encryption and
//! claim-check"):
//!
//! ```sh
//! cargo test --release -p outbox-payload --test encode_cost -- --ignored --nocapture
//! ```
//!
//! It prints µs per event for a 200-byte JSON payload: encrypted whole, encrypted in one
//! field, and unchanged (the stage's clone alone). It asserts only that every event came out
//! encrypted (a figure of an encoder that did nothing would be a lie), never a time.

use std::time::Instant;

use outbox_payload::encryption::EncryptionConfig;
use outbox_payload::{Encoder, PayloadOptions};

const EVENTS: usize = 100_000;

fn event(i: usize) -> outbox_core::Event {
    let payload = format!(
        r#"{{"order_id":"o_{i}","customer_id":"c_{}","total_cents":{},"pad":"{}"}}"#,
        i % 977,
        i * 7,
        "x".repeat(120)
    );
    outbox_core::Event {
        id: uuid::Uuid::now_v7(),
        position: outbox_core::Position(i64::try_from(i).unwrap_or(i64::MAX)),
        aggregate_type: "Order".into(),
        aggregate_id: format!("o_{}", i % 1000),
        event_type: "order.placed".into(),
        payload: payload.into_bytes().into(),
        headers: Vec::new(),
        created_at: time::OffsetDateTime::now_utc(),
        attempts: 0,
    }
}

async fn cost(options: PayloadOptions, events: &[outbox_core::Event]) -> f64 {
    let encoder = Encoder::connect(&options, Some(1 << 20))
        .await
        .expect("connect")
        .expect("an encoder");
    // Warm up: the data key is made once.
    let _ = encoder.encode(&events[0]).await.expect("encode");
    let start = Instant::now();
    let mut encrypted = 0usize;
    for event in events {
        let out = encoder.encode(event).await.expect("encode");
        encrypted += usize::from(out.headers.iter().any(|(n, _)| n == "encryption"));
    }
    let elapsed = start.elapsed();
    assert_eq!(encrypted, events.len(), "every event came out encrypted");
    elapsed.as_secs_f64() * 1e6 / events.len() as f64
}

#[tokio::test]
#[ignore = "a benchmark: run it in release, see the module documentation"]
async fn encryption_cost_per_event() {
    let dir = tempfile::tempdir().expect("tempdir");
    let key = dir.path().join("key");
    std::fs::write(&key, [7u8; 32]).expect("key file");
    let encryption = |fields: Vec<String>| PayloadOptions {
        claim_check: None,
        encryption: Some(EncryptionConfig {
            key: format!("file:{}", key.display()),
            rotate: std::time::Duration::from_secs(3600),
            fields,
            region: None,
            endpoint_url: None,
        }),
    };
    let events: Vec<_> = (0..EVENTS).map(event).collect();
    for round in 1..=3 {
        let whole = cost(encryption(Vec::new()), &events).await;
        let field = cost(encryption(vec!["customer_id".into()]), &events).await;
        let start = Instant::now();
        let cloned: usize = events.iter().map(|e| e.clone().payload.len()).sum();
        let clone = start.elapsed().as_secs_f64() * 1e6 / events.len() as f64;
        assert!(cloned > 0);
        println!(
            "round {round}: whole payload {whole:.2} µs/event, one field {field:.2} µs/event, clone alone {clone:.2} µs/event"
        );
    }
}

/// The future of one event's encode stays small: the relay holds one per event of a batch
/// (500 by default) at once, and a KMS or S3 request's future inline in each made the stage
/// cost more in allocation and page faults than the encryption itself. Fails if a large
/// future creeps back in (the bound is loose: 4 KiB, against tens of KiB for an SDK call).
#[tokio::test]
async fn an_encode_future_is_small() {
    let dir = tempfile::tempdir().expect("tempdir");
    let options = PayloadOptions {
        claim_check: Some(
            serde_json::from_value(serde_json::json!({
                "store": "s3://bucket/prefix", "above": 1024,
                "endpoint_url": "http://127.0.0.1:9", "region": "us-east-1"
            }))
            .expect("claim_check"),
        ),
        encryption: Some(EncryptionConfig {
            key: "aws-kms:alias/outbox".into(),
            rotate: std::time::Duration::from_secs(3600),
            fields: Vec::new(),
            region: Some("us-east-1".into()),
            endpoint_url: Some("http://127.0.0.1:9".into()),
        }),
    };
    let _ = dir;
    let encoder = Encoder::connect(&options, Some(1 << 20))
        .await
        .expect("connect")
        .expect("an encoder");
    let event = event(1);
    let size = std::mem::size_of_val(&encoder.encode(&event));
    println!("encode future: {size} bytes");
    assert!(size <= 4096, "an encode future is {size} bytes");
}
