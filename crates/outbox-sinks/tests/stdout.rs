//! The stdout and JSON-lines file sinks: every line parses back to the event it came from.

#![cfg(feature = "stdout")]

use std::process::Command;

use bytes::Bytes;
use outbox_core::{Destination, Event, Position, Sink, SinkErrorKind, message};
use outbox_sinks::stdout::JsonLine;
use outbox_sinks::{FileConfig, StdoutConfig};
use time::OffsetDateTime;
use uuid::Uuid;

fn event(aggregate_id: &str, payload: &[u8]) -> Event {
    Event {
        id: Uuid::now_v7(),
        position: Position(1),
        aggregate_type: "Order".to_owned(),
        aggregate_id: aggregate_id.to_owned(),
        event_type: "order.placed".to_owned(),
        payload: Bytes::copy_from_slice(payload),
        headers: vec![("tenant".to_owned(), "acme".to_owned())],
        created_at: OffsetDateTime::now_utc(),
        attempts: 0,
    }
}

fn batch() -> Vec<Event> {
    vec![
        event("o_1", br#"{"order_id":"o_1","total_cents":1250}"#),
        event("o_2", b"\x00\xff\xfe binary \n payload"),
        event("o_3", b""),
        event("o_4", "\"caf\u{e9}\"".as_bytes()),
    ]
}

/// Asserts that `line` describes `sent` completely.
fn assert_line_matches(line: &JsonLine, sent: &Event, destination: &str) {
    assert_eq!(line.id, sent.id);
    assert_eq!(line.destination, destination);
    assert_eq!(line.key, sent.aggregate_id);
    assert_eq!(line.event_type, sent.event_type);
    assert_eq!(line.aggregate_type, sent.aggregate_type);
    assert_eq!(line.aggregate_id, sent.aggregate_id);
    assert_eq!(line.created_at, sent.created_at);
    let expected_headers: std::collections::BTreeMap<String, String> =
        message::headers(sent).into_iter().collect();
    assert_eq!(line.headers, expected_headers);
    assert_eq!(line.payload_bytes().expect("payload"), sent.payload);
}

#[tokio::test]
async fn file_lines_parse_back_to_the_same_events() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("events.jsonl");
    let sink = FileConfig {
        path: path.clone(),
        destination: Destination::parse("orders.{event_type}").expect("valid"),
        sync: true,
        ..FileConfig::default()
    }
    .build()
    .await
    .expect("opens");

    let first = batch();
    let second = vec![event("o_5", br#"[1,2,3]"#)];
    for b in [&first, &second] {
        let deliveries = sink.publish(b).await.expect("writes");
        assert!(deliveries.iter().all(Result::is_ok));
    }
    sink.healthcheck().await.expect("healthy");

    let text = std::fs::read_to_string(&path).expect("reads");
    let lines: Vec<&str> = text.lines().collect();
    let sent: Vec<&Event> = first.iter().chain(&second).collect();
    assert_eq!(
        lines.len(),
        sent.len(),
        "one line per event, appended in order"
    );
    for (line, event) in lines.iter().zip(sent) {
        let parsed = JsonLine::parse(line).expect("parses");
        assert_line_matches(&parsed, event, "orders.order.placed");
    }
}

#[tokio::test]
async fn binary_payload_goes_to_payload_base64_and_json_stays_json() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("events.jsonl");
    let sink = FileConfig {
        path: path.clone(),
        ..FileConfig::default()
    }
    .build()
    .await
    .expect("opens");
    let events = batch();
    sink.publish(&events).await.expect("writes");

    let text = std::fs::read_to_string(&path).expect("reads");
    let values: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("json"))
        .collect();
    assert_eq!(values[0]["payload"]["total_cents"], 1250);
    assert!(values[0].get("payload_base64").is_none());
    assert_eq!(values[1]["payload_base64"], "AP/+IGJpbmFyeSAKIHBheWxvYWQ=");
    assert!(values[1].get("payload").is_none());
    assert_eq!(
        values[2]["payload_base64"], "",
        "an empty payload is not JSON"
    );
    assert_eq!(values[3]["payload"], "caf\u{e9}");
}

#[tokio::test]
async fn a_missing_directory_is_a_clear_error() {
    let dir = tempfile::tempdir().expect("temp dir");
    let missing = dir.path().join("nope");
    let err = FileConfig {
        path: missing.join("events.jsonl"),
        ..FileConfig::default()
    }
    .build()
    .await
    .expect_err("no directory");
    assert_eq!(err.kind(), SinkErrorKind::Rejected);
    let text = err.to_string();
    assert!(
        text.contains(&format!("directory `{}` does not exist", missing.display())),
        "{text}"
    );
}

#[tokio::test]
async fn a_removed_file_fails_the_healthcheck() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("events.jsonl");
    let sink = FileConfig {
        path: path.clone(),
        ..FileConfig::default()
    }
    .build()
    .await
    .expect("opens");
    std::fs::remove_file(&path).expect("removes");
    let err = sink.healthcheck().await.expect_err("gone");
    assert!(err.to_string().contains("events.jsonl"), "{err}");
}

#[tokio::test]
async fn dev_null_is_a_healthy_file_sink() {
    // Benchmarks and dry runs point the file sink at /dev/null: a device, not a regular file.
    let sink = FileConfig {
        path: "/dev/null".into(),
        ..FileConfig::default()
    }
    .build()
    .await
    .expect("opens /dev/null");
    sink.healthcheck().await.expect("a device is a fine target");
    // No fsync on a device (it fails with EINVAL): the batch is delivered.
    let batch = batch();
    let deliveries = sink.publish(&batch).await.expect("publishes to /dev/null");
    assert!(deliveries.iter().all(Result::is_ok), "{deliveries:?}");
}

/// Env var telling [`stdout_child_writes_a_batch`] that it runs as the child of
/// [`stdout_lines_parse_back_to_the_same_events`] and should write.
const CHILD_ENV: &str = "OUTBOX_SINKS_STDOUT_CHILD";

/// The writing half of the stdout test: runs only as a child process, whose real standard
/// output the parent reads (the test harness does not capture direct writes to stdout).
#[tokio::test]
async fn stdout_child_writes_a_batch() {
    let Ok(ids) = std::env::var(CHILD_ENV) else {
        return;
    };
    let mut events = batch();
    for (event, id) in events.iter_mut().zip(ids.split(',')) {
        event.id = id.parse().expect("uuid");
        event.created_at = OffsetDateTime::UNIX_EPOCH;
    }
    let sink = StdoutConfig::default().build().await.expect("builds");
    let deliveries = sink.publish(&events).await.expect("writes");
    assert!(deliveries.iter().all(Result::is_ok));
}

#[test]
fn stdout_lines_parse_back_to_the_same_events() {
    let mut events = batch();
    for event in &mut events {
        event.created_at = OffsetDateTime::UNIX_EPOCH;
    }
    let ids: Vec<String> = events.iter().map(|e| e.id.to_string()).collect();
    let output = Command::new(std::env::current_exe().expect("test binary"))
        .args([
            "--exact",
            "stdout_child_writes_a_batch",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, ids.join(","))
        .output()
        .expect("runs the child");
    assert!(
        output.status.success(),
        "child failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );

    let stdout = String::from_utf8(output.stdout).expect("utf-8");
    // The harness prints `test <name> ... ` on the line where the sink's output starts.
    let lines: Vec<&str> = stdout
        .lines()
        .filter_map(|l| l.find("{\"id\":").map(|start| &l[start..]))
        .collect();
    assert_eq!(lines.len(), events.len(), "{stdout}");
    for (line, event) in lines.iter().zip(&events) {
        let parsed = JsonLine::parse(line).expect("parses");
        assert_line_matches(&parsed, event, "outbox.event.Order");
    }
}
