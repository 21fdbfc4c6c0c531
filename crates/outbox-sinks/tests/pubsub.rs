//! The Pub/Sub sink: what the conformance suite does not cover. Against the Cloud Pub/Sub
//! emulator (the testkit's shared one, `OUTBOX_TEST_PUBSUB_HOST`, else one started per test
//! process): illegal topic ids, the ordering key, the exact attributes, Pub/Sub's limits
//! (which the emulator does not enforce: the sink must), `PUBSUB_EMULATOR_HOST`, and a failed
//! ordered publish followed by its retry. Against a fake Google API on 127.0.0.1: the OAuth
//! token from Application Default Credentials, and 401/403 answers (the emulator has no
//! authentication at all).
//!
//! Tests that need the emulator say on stderr that they were skipped, and pass, when it is
//! not installed. Tests that need a different environment (`PUBSUB_EMULATOR_HOST`,
//! `GOOGLE_APPLICATION_CREDENTIALS`) run the test binary again as a child process with it.

#![cfg(feature = "pubsub")]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::num::NonZeroUsize;
use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use base64::Engine as _;
use outbox_core::{Destination, Event, Position, Sink, SinkErrorKind};
use outbox_sinks::pubsub::SCOPE;
use outbox_sinks::{PubSubConfig, PubSubSink};
use outbox_testkit::services::{PubSubEmulator, PulledMessage, find_emulator};
use sha2::{Digest as _, Sha256};
use time::OffsetDateTime;
use uuid::Uuid;

const PROJECT: &str = "proj-outbox";

/// Set in a child process: which environment-dependent check it runs.
const CHILD_ENV: &str = "OUTBOX_TEST_PUBSUB_CHILD";
/// The access token the fake Google API hands out.
const TOKEN: &str = "ya29.fake-access-token-do-not-print";

/// A topic prefix no other test uses (starts with a letter, as topic ids must).
fn unique() -> String {
    format!("t{}", &Uuid::now_v7().simple().to_string()[20..])
}

fn event(aggregate_type: &str, aggregate_id: &str, payload: impl Into<Bytes>) -> Event {
    Event {
        id: Uuid::now_v7(),
        position: Position(1),
        aggregate_type: aggregate_type.to_owned(),
        aggregate_id: aggregate_id.to_owned(),
        event_type: format!("{}.placed", aggregate_type.to_lowercase()),
        payload: payload.into(),
        headers: Vec::new(),
        created_at: OffsetDateTime::now_utc(),
        attempts: 0,
    }
}

/// The shared emulator, or `None` (after saying so) when it is not installed.
async fn emulator(test: &str) -> anyhow::Result<Option<&'static PubSubEmulator>> {
    if let Err(why) = find_emulator() {
        eprintln!("SKIPPED {test}: {why:#}");
        return Ok(None);
    }
    Ok(Some(PubSubEmulator::shared().await?))
}

fn config(emulator: &PubSubEmulator, topic: &str) -> PubSubConfig {
    PubSubConfig {
        project: PROJECT.to_owned(),
        topic: Destination::parse(topic).expect("valid template"),
        endpoint: Some(emulator.host().to_owned()),
        timeout: Duration::from_secs(5),
        ..PubSubConfig::default()
    }
}

/// Creates `topic` with an ordered subscription `<topic>.sub`.
async fn prepare(emulator: &PubSubEmulator, topic: &str) -> anyhow::Result<()> {
    emulator.create_topic(PROJECT, topic).await?;
    emulator
        .create_subscription(PROJECT, &format!("{topic}.sub"), topic, true)
        .await
}

/// Pulls `<topic>.sub` until `count` messages came (or 10 s passed), then once more to catch
/// any extra; everything pulled, in delivery order.
async fn pull(
    emulator: &PubSubEmulator,
    topic: &str,
    count: usize,
) -> anyhow::Result<Vec<PulledMessage>> {
    let sub = format!("{topic}.sub");
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut all = Vec::new();
    loop {
        let batch = emulator.pull(PROJECT, &sub, 1000).await?;
        let empty = batch.is_empty();
        all.extend(batch);
        if all.len() >= count && empty {
            return Ok(all);
        }
        if Instant::now() >= deadline {
            return Ok(all);
        }
        if empty {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

fn sha256_key(id: &str) -> String {
    let hash = Sha256::digest(id.as_bytes());
    let hex: String = hash.iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

// ---------------------------------------------------------------------------------------------
// Configuration (no service needed)
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn config_errors_name_the_key_and_build_refuses_them() {
    let cases = [
        ("topic = \"orders\"", "sink.project: must be set"),
        (
            "project = \"proj-outbox\"\ntopic = \"9-{aggregate_type}\"",
            "sink.topic: `9-{aggregate_type}` renders to `9-Order`",
        ),
        (
            "project = \"proj-outbox\"\ntopic = \"orders/{aggregate_type}\"",
            "sink.topic: ",
        ),
        (
            "project = \"proj-outbox\"\nendpoint = \"http://127.0.0.1:8085\"",
            "sink.endpoint: ",
        ),
    ];
    for (text, expected) in cases {
        let config: PubSubConfig = toml::from_str(text).expect("parses");
        let err = config.validate().expect_err(text);
        assert!(err.to_string().starts_with(expected), "{text}: {err}");
        let built = config.clone().build().await.expect_err(text);
        assert_eq!(built.kind(), SinkErrorKind::Rejected, "{text}");
        assert!(built.to_string().starts_with(expected), "{text}: {built}");
    }
    let err = toml::from_str::<PubSubConfig>("project = \"proj-outbox\"\nsubject = \"x\"")
        .expect_err("unknown key");
    assert!(err.to_string().contains("unknown field `subject`"), "{err}");
}

#[test]
fn debug_output_of_the_config_shows_no_secret() {
    let config: PubSubConfig = toml::from_str(
        "project = \"proj-outbox\"\napi_url = \"https://svc:pa55word@pubsub.internal.example\"",
    )
    .expect("parses");
    let debug = format!("{config:?}");
    assert!(!debug.contains("pa55word"), "{debug}");
    assert!(debug.contains("proj-outbox"), "{debug}");
}

// ---------------------------------------------------------------------------------------------
// Against the emulator
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn an_event_whose_topic_renders_illegal_is_rejected_while_the_rest_flow() -> anyhow::Result<()>
{
    let Some(emulator) = emulator("an_event_whose_topic_renders_illegal_is_rejected").await? else {
        return Ok(());
    };
    let scope = unique();
    prepare(emulator, &format!("{scope}-ok_1")).await?;
    let sink = config(emulator, &format!("{scope}-{{aggregate_id}}"))
        .build()
        .await?;
    let batch = [
        event("Order", "bad id/1", "illegal"),
        event("Order", "ok_1", "fine"),
        event("Order", &"x".repeat(300), "too long"),
    ];
    let deliveries = sink.publish(&batch).await?;
    assert!(deliveries[1].is_ok(), "{deliveries:?}");
    for (i, why) in [(0, "` ` is not allowed"), (2, "3 to 255 characters")] {
        let err = deliveries[i].as_ref().expect_err("illegal topic");
        assert_eq!(err.kind(), SinkErrorKind::Rejected, "{err}");
        assert!(err.to_string().contains("not a Pub/Sub topic id"), "{err}");
        assert!(err.to_string().contains(why), "{err}");
    }
    let got = pull(emulator, &format!("{scope}-ok_1"), 1).await?;
    assert_eq!(got.len(), 1);
    assert_eq!(&got[0].data[..], b"fine");
    Ok(())
}

#[tokio::test]
async fn the_ordering_key_is_the_aggregate_id_or_a_digest_of_it() -> anyhow::Result<()> {
    let Some(emulator) = emulator("the_ordering_key_is_the_aggregate_id_or_a_digest_of_it").await?
    else {
        return Ok(());
    };
    let topic = format!("{}-orders", unique());
    prepare(emulator, &topic).await?;
    let sink = config(emulator, &topic).build().await?;
    let spoof = sha256_key("someone else");
    let ids = [
        "o_1".to_owned(),
        "Zürich 📦 #1".to_owned(),
        "line\nbreak".to_owned(),
        spoof.clone(),
        "k".repeat(1024),
    ];
    let batch: Vec<Event> = ids.iter().map(|id| event("Order", id, "x")).collect();
    let deliveries = sink.publish(&batch).await?;
    assert!(deliveries.iter().all(Result::is_ok), "{deliveries:?}");

    let got = pull(emulator, &topic, batch.len()).await?;
    assert_eq!(got.len(), batch.len());
    let key_of = |id: &str| {
        got.iter()
            .find(|m| m.attributes.get("aggregate_id").map(String::as_str) == Some(id))
            .and_then(|m| m.ordering_key.clone())
    };
    // Legal ids are their own key, Unicode and spaces included.
    assert_eq!(key_of("o_1").as_deref(), Some("o_1"));
    assert_eq!(key_of("Zürich 📦 #1").as_deref(), Some("Zürich 📦 #1"));
    assert_eq!(key_of(&ids[4]).as_deref(), Some(ids[4].as_str()));
    // A control character, or an id that looks like a digest, gets the digest of the id.
    assert_eq!(
        key_of("line\nbreak"),
        Some(sha256_key("line\nbreak")),
        "control characters are digested"
    );
    assert_eq!(key_of(&spoof), Some(sha256_key(&spoof)));

    // An id over 1024 bytes cannot travel as the `aggregate_id` attribute (1024 bytes at most):
    // the event is rejected with the limit, never cut.
    let long = [event("Order", &"k".repeat(1025), "x")];
    let deliveries = sink.publish(&long).await?;
    let err = deliveries[0]
        .as_ref()
        .expect_err("over the attribute limit");
    assert_eq!(err.kind(), SinkErrorKind::Rejected);
    assert!(
        err.to_string()
            .contains("`aggregate_id` of 1025 bytes exceeds Pub/Sub's limit of 1024 bytes"),
        "{err}"
    );
    Ok(())
}

#[tokio::test]
async fn attributes_are_exactly_the_message_headers_and_data_the_payload() -> anyhow::Result<()> {
    let Some(emulator) =
        emulator("attributes_are_exactly_the_message_headers_and_data_the_payload").await?
    else {
        return Ok(());
    };
    let topic = format!("{}-orders", unique());
    prepare(emulator, &topic).await?;
    let sink = config(emulator, &topic).build().await?;
    let mut with_headers = event("Order", "o_1", &b"\x00\xff{\"total\":1}\r\n"[..]);
    with_headers.headers = vec![
        ("tenant".to_owned(), "acme".to_owned()),
        ("id".to_owned(), "spoofed".to_owned()),
        (
            "traceparent".to_owned(),
            "00-4bf92f3577b34da6-00f067aa0ba902b7-01".to_owned(),
        ),
    ];
    let empty = event("Invoice", "i_1", Bytes::new());
    let batch = [with_headers.clone(), empty.clone()];
    let deliveries = sink.publish(&batch).await?;
    assert!(deliveries.iter().all(Result::is_ok), "{deliveries:?}");

    let got = pull(emulator, &topic, 2).await?;
    assert_eq!(got.len(), 2);
    for sent in &batch {
        let message = got
            .iter()
            .find(|m| m.attributes.get("id") == Some(&sent.id.to_string()))
            .expect("message with the event id");
        let mut expected: BTreeMap<String, String> = [
            ("id", sent.id.to_string()),
            ("event_type", sent.event_type.clone()),
            ("aggregate_type", sent.aggregate_type.clone()),
            ("aggregate_id", sent.aggregate_id.clone()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        for (name, value) in &sent.headers {
            if name != "id" {
                expected.insert(name.clone(), value.clone());
            }
        }
        assert_eq!(message.attributes, expected);
        assert_eq!(message.data, sent.payload);
        assert_eq!(
            message.ordering_key.as_deref(),
            Some(sent.aggregate_id.as_str())
        );
    }
    Ok(())
}

#[tokio::test]
async fn pubsub_limits_reject_only_the_offending_events() -> anyhow::Result<()> {
    let Some(emulator) = emulator("pubsub_limits_reject_only_the_offending_events").await? else {
        return Ok(());
    };
    let topic = format!("{}-orders", unique());
    prepare(emulator, &topic).await?;
    let mut config = config(emulator, &topic);
    config.max_payload = NonZeroUsize::new(1000);
    let sink = config.build().await?;
    assert_eq!(sink.max_payload(), 1000);

    let with = |id: &str, headers: Vec<(String, String)>| {
        let mut e = event("Order", id, format!("{id} payload"));
        e.headers = headers;
        e
    };
    let batch = vec![
        with("ok_1", vec![]),
        event("Order", "big", vec![b'x'; 1001]),
        with("val", vec![("note".to_owned(), "v".repeat(1025))]),
        with("key", vec![("k".repeat(257), "v".to_owned())]),
        with(
            "many",
            (0..97).map(|i| (format!("h{i}"), "v".to_owned())).collect(),
        ),
        with("goog", vec![("goog-reserved".to_owned(), "v".to_owned())]),
        with(
            "edge",
            (0..96)
                .map(|i| (format!("h{i:0>255}"), "v".repeat(1024)))
                .collect(),
        ),
        event("Order", "ok_2", vec![b'y'; 1000]),
    ];
    let deliveries = sink.publish(&batch).await?;
    assert_eq!(deliveries.len(), batch.len());
    for (i, expected) in [
        (
            1,
            "payload of 1001 bytes exceeds the limit of 1000 bytes (sink.max_payload)",
        ),
        (
            2,
            "header `note` of 1025 bytes exceeds Pub/Sub's limit of 1024 bytes",
        ),
        (
            3,
            "bytes exceeds Pub/Sub's limit of 256 bytes per attribute key",
        ),
        (
            4,
            "101 headers (the 4 contract headers included) exceed Pub/Sub's limit of 100",
        ),
        (
            5,
            "keys starting with `goog` are reserved (a Pub/Sub limit)",
        ),
    ] {
        let err = deliveries[i].as_ref().expect_err(expected);
        assert_eq!(err.kind(), SinkErrorKind::Rejected, "{err}");
        assert!(err.to_string().contains(expected), "#{i}: {err}");
    }
    // Exactly at every limit (100 attributes, 256-byte keys, 1024-byte values, a payload of
    // max_payload bytes) is fine.
    for i in [0, 6, 7] {
        assert!(deliveries[i].is_ok(), "#{i}: {:?}", deliveries[i]);
    }
    let got = pull(emulator, &topic, 3).await?;
    let ids: Vec<&str> = got
        .iter()
        .map(|m| m.attributes["aggregate_id"].as_str())
        .collect();
    assert_eq!(ids.len(), 3, "{ids:?}");
    for id in ["ok_1", "edge", "ok_2"] {
        assert!(ids.contains(&id), "{ids:?}");
    }
    let edge = got
        .iter()
        .find(|m| m.attributes["aggregate_id"] == "edge")
        .expect("edge");
    assert_eq!(edge.attributes.len(), 100);
    Ok(())
}

#[tokio::test]
async fn the_message_size_limit_of_pubsub_applies_without_max_payload() -> anyhow::Result<()> {
    let Some(emulator) =
        emulator("the_message_size_limit_of_pubsub_applies_without_max_payload").await?
    else {
        return Ok(());
    };
    let topic = format!("{}-orders", unique());
    prepare(emulator, &topic).await?;
    let sink = config(emulator, &topic).build().await?;
    assert_eq!(sink.max_payload(), 10_000_000);
    // The payload alone fits in 10 MB; with its attributes the request would not.
    let batch = [
        event("Order", "big", vec![b'x'; 9_999_990]),
        event("Order", "small", "small"),
    ];
    let deliveries = sink.publish(&batch).await?;
    let err = deliveries[0].as_ref().expect_err("over 10 MB");
    assert_eq!(err.kind(), SinkErrorKind::Rejected);
    assert!(
        err.to_string()
            .contains("exceeds Pub/Sub's limit of 10000000 bytes per publish request"),
        "{err}"
    );
    assert!(deliveries[1].is_ok(), "{:?}", deliveries[1]);
    Ok(())
}

#[tokio::test]
async fn a_failed_ordered_publish_then_its_retry_keeps_the_order() -> anyhow::Result<()> {
    let Some(emulator) =
        emulator("a_failed_ordered_publish_then_its_retry_keeps_the_order").await?
    else {
        return Ok(());
    };
    let topic = format!("{}-orders", unique());
    let sink = config(emulator, &topic).build().await?;
    let a: Vec<Event> = (1..=3)
        .map(|n| event("Order", "A", format!("A{n}")))
        .collect();
    let b: Vec<Event> = (1..=2)
        .map(|n| event("Order", "B", format!("B{n}")))
        .collect();

    // The topic does not exist yet: the first event of A fails, naming the topic.
    let deliveries = sink.publish(&a[..1]).await?;
    let err = deliveries[0].as_ref().expect_err("topic missing");
    assert_eq!(err.kind(), SinkErrorKind::Rejected);
    let path = format!("projects/{PROJECT}/topics/{topic}");
    assert!(err.to_string().contains(&path), "{err}");
    assert!(err.to_string().contains("not found"), "{err}");

    // An operator creates it; the relay retries A1 before A2 (one event per aggregate per
    // call), as it does after any failure.
    prepare(emulator, &topic).await?;
    for batch in [
        vec![a[0].clone()],
        vec![a[1].clone(), b[0].clone()],
        vec![a[2].clone(), b[1].clone()],
    ] {
        let deliveries = sink.publish(&batch).await?;
        assert!(deliveries.iter().all(Result::is_ok), "{deliveries:?}");
    }

    let got = pull(emulator, &topic, 5).await?;
    assert_eq!(got.len(), 5);
    for (key, expected) in [("A", &a), ("B", &b)] {
        let bodies: Vec<&[u8]> = got
            .iter()
            .filter(|m| m.ordering_key.as_deref() == Some(key))
            .map(|m| &m.data[..])
            .collect();
        let sent: Vec<&[u8]> = expected.iter().map(|e| &e.payload[..]).collect();
        assert_eq!(bodies, sent, "order of aggregate {key}");
    }
    Ok(())
}

#[tokio::test]
async fn the_healthcheck_reads_a_fixed_topic_or_the_project() -> anyhow::Result<()> {
    let Some(emulator) = emulator("the_healthcheck_reads_a_fixed_topic_or_the_project").await?
    else {
        return Ok(());
    };
    let topic = format!("{}-orders", unique());
    let sink = config(emulator, &topic).build().await?;
    let err = sink.healthcheck().await.expect_err("topic missing");
    assert!(
        err.to_string().contains(&format!(
            "topic `projects/{PROJECT}/topics/{topic}` does not exist"
        )),
        "{err}"
    );
    assert!(err.to_string().contains(emulator.host()), "{err}");
    prepare(emulator, &topic).await?;
    sink.healthcheck().await?;
    let template = config(emulator, "{aggregate_type}-orders").build().await?;
    template.healthcheck().await?;

    // Nothing listens on the endpoint: Unavailable, naming it, for the healthcheck and for
    // a whole batch.
    let dead = format!("127.0.0.1:{}", free_port());
    let mut config = config(emulator, &topic);
    config.endpoint = Some(dead.clone());
    let sink = config.build().await?;
    let err = sink.healthcheck().await.expect_err("nothing listens");
    assert_eq!(err.kind(), SinkErrorKind::Unavailable);
    assert!(err.report().contains(&dead), "{}", err.report());
    let err = sink
        .publish(&[event("Order", "o_1", "x"), event("Order", "o_2", "y")])
        .await
        .expect_err("whole batch unavailable");
    assert_eq!(err.kind(), SinkErrorKind::Unavailable);
    assert!(err.report().contains(&dead), "{}", err.report());
    Ok(())
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

// ---------------------------------------------------------------------------------------------
// Environment: PUBSUB_EMULATOR_HOST and Application Default Credentials, in a child process
// ---------------------------------------------------------------------------------------------

/// Runs [`child_process_checks`] in a child process with `mode` and `env`; its output on
/// failure.
fn run_child(mode: &str, env: &[(&str, &str)]) {
    let mut command = Command::new(std::env::current_exe().expect("test binary"));
    command
        .args([
            "--exact",
            "child_process_checks",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, mode)
        .env_remove("PUBSUB_EMULATOR_HOST")
        .env_remove("GOOGLE_APPLICATION_CREDENTIALS");
    for (name, value) in env {
        command.env(name, value);
    }
    let output = command.output().expect("runs the child");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "child `{mode}` failed:\n{stdout}\n{stderr}"
    );
    assert!(
        stdout.contains("1 passed"),
        "the child ran no check:\n{stdout}"
    );
    assert!(
        !stdout.contains(TOKEN) && !stderr.contains(TOKEN),
        "the access token was printed"
    );
}

#[tokio::test]
async fn pubsub_emulator_host_is_honoured_and_endpoint_wins_over_it() -> anyhow::Result<()> {
    let Some(emulator) =
        emulator("pubsub_emulator_host_is_honoured_and_endpoint_wins_over_it").await?
    else {
        return Ok(());
    };
    let topic = format!("{}-orders", unique());
    prepare(emulator, &topic).await?;
    let dead = format!("127.0.0.1:{}", free_port());
    let host = emulator.host().to_owned();
    let (topic_c, dead_c) = (topic.clone(), dead.clone());
    tokio::task::spawn_blocking(move || {
        run_child(
            "emulator-host",
            &[
                ("PUBSUB_EMULATOR_HOST", host.as_str()),
                ("CHILD_TOPIC", topic_c.as_str()),
                ("CHILD_DEAD", dead_c.as_str()),
            ],
        );
    })
    .await?;
    // What the child published through PUBSUB_EMULATOR_HOST arrived.
    let got = pull(emulator, &topic, 1).await?;
    let bodies: Vec<&[u8]> = got.iter().map(|m| &m.data[..]).collect();
    assert_eq!(bodies, [&b"through PUBSUB_EMULATOR_HOST"[..]]);
    Ok(())
}

#[tokio::test]
async fn on_google_the_sink_sends_an_oauth_token_from_application_default_credentials() {
    let dir = tempfile::tempdir().expect("temp dir");
    let pem = dir.path().join("key.pem");
    let generated = Command::new("openssl")
        .args([
            "genpkey",
            "-algorithm",
            "RSA",
            "-pkeyopt",
            "rsa_keygen_bits:2048",
            "-out",
        ])
        .arg(&pem)
        .output();
    if !generated.is_ok_and(|o| o.status.success()) {
        eprintln!(
            "SKIPPED on_google_the_sink_sends_an_oauth_token_from_application_default_credentials: \
             `openssl` could not make a throwaway RSA key for a fake service account"
        );
        return;
    }
    let key_file = dir.path().join("service-account.json");
    let key_file = key_file.to_str().expect("utf-8 path").to_owned();
    let pem = pem.to_str().expect("utf-8 path").to_owned();
    tokio::task::spawn_blocking(move || {
        run_child(
            "adc",
            &[
                ("GOOGLE_APPLICATION_CREDENTIALS", key_file.as_str()),
                ("CHILD_PEM", pem.as_str()),
            ],
        );
    })
    .await
    .expect("child ran");
}

/// Does nothing in a normal run; in a child process started by a test above, runs the check
/// named by [`CHILD_ENV`] in the environment that test set up.
#[tokio::test]
async fn child_process_checks() -> anyhow::Result<()> {
    match std::env::var(CHILD_ENV).as_deref() {
        Ok("emulator-host") => emulator_host_child().await,
        Ok("adc") => adc_child().await,
        _ => Ok(()),
    }
}

/// With `PUBSUB_EMULATOR_HOST` set: a config without `endpoint` publishes there; one with an
/// `endpoint` publishes to that endpoint instead (here one where nothing listens).
async fn emulator_host_child() -> anyhow::Result<()> {
    let topic = std::env::var("CHILD_TOPIC")?;
    let dead = std::env::var("CHILD_DEAD")?;
    let host = std::env::var("PUBSUB_EMULATOR_HOST")?;
    let config = PubSubConfig {
        project: PROJECT.to_owned(),
        topic: Destination::parse(&topic)?,
        timeout: Duration::from_secs(5),
        ..PubSubConfig::default()
    };
    let sink = config.clone().build().await?;
    assert_eq!(
        sink.place(),
        format!("Pub/Sub emulator at {host} (from PUBSUB_EMULATOR_HOST)")
    );
    let deliveries = sink
        .publish(&[event("Order", "o_1", "through PUBSUB_EMULATOR_HOST")])
        .await?;
    assert!(deliveries[0].is_ok(), "{deliveries:?}");

    let sink = PubSubConfig {
        endpoint: Some(dead.clone()),
        ..config
    }
    .build()
    .await?;
    assert_eq!(sink.place(), format!("Pub/Sub emulator at {dead}"));
    let err = sink
        .publish(&[event("Order", "o_1", "through endpoint")])
        .await
        .expect_err("nothing listens on the endpoint");
    assert_eq!(err.kind(), SinkErrorKind::Unavailable);
    assert!(err.to_string().contains(&dead), "{err}");
    Ok(())
}

/// A fake Google: an OAuth token endpoint and the Pub/Sub REST API, recording requests.
#[derive(Default)]
struct FakeGoogle {
    requests: Mutex<Vec<(Method, String, HeaderMap, Bytes)>>,
    /// The status of the next publishes and topic reads (200 when unset).
    status: Mutex<Option<StatusCode>>,
}

async fn fake_google(
    State(state): State<Arc<FakeGoogle>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> (StatusCode, String) {
    let path = uri.path().to_owned();
    state.requests.lock().expect("not poisoned").push((
        method,
        path.clone(),
        headers,
        body.clone(),
    ));
    if path == "/token" {
        return (
            StatusCode::OK,
            format!(r#"{{"access_token":"{TOKEN}","expires_in":3600,"token_type":"Bearer"}}"#),
        );
    }
    let status = state
        .status
        .lock()
        .expect("not poisoned")
        .unwrap_or(StatusCode::OK);
    if status != StatusCode::OK {
        let code = if status == StatusCode::FORBIDDEN {
            "PERMISSION_DENIED"
        } else {
            "UNAUTHENTICATED"
        };
        return (
            status,
            format!(
                r#"{{"error":{{"code":{},"message":"denied","status":"{code}"}}}}"#,
                status.as_u16()
            ),
        );
    }
    if path.ends_with(":publish") {
        let request: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
        let messages = request["messages"].as_array().cloned().unwrap_or_default();
        // Like Pub/Sub, refuse a whole request over one invalid message (here: data `poison`).
        if messages.iter().any(|m| m["data"] == "cG9pc29u") {
            return (
                StatusCode::BAD_REQUEST,
                r#"{"error":{"code":400,"message":"poison","status":"INVALID_ARGUMENT"}}"#
                    .to_owned(),
            );
        }
        let count = messages.len();
        let ids: Vec<String> = (0..count).map(|i| format!("\"{i}\"")).collect();
        return (
            StatusCode::OK,
            format!(r#"{{"messageIds":[{}]}}"#, ids.join(",")),
        );
    }
    (StatusCode::OK, "{}".to_owned())
}

/// With `GOOGLE_APPLICATION_CREDENTIALS` naming a service-account key whose token endpoint
/// is the fake: the sink asks for the Pub/Sub scope and sends the token as a bearer token,
/// keeps it out of every message, and maps 401/403 to `Unavailable` with what to fix.
async fn adc_child() -> anyhow::Result<()> {
    let state = Arc::new(FakeGoogle::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr: SocketAddr = listener.local_addr()?;
    let app = Router::new()
        .fallback(fake_google)
        .with_state(Arc::clone(&state));
    tokio::spawn(async move { axum::serve(listener, app).await });

    let key = serde_json::json!({
        "type": "service_account",
        "project_id": PROJECT,
        "private_key": std::fs::read_to_string(std::env::var("CHILD_PEM")?)?,
        "client_email": "outbox-test@proj-outbox.iam.gserviceaccount.com",
        "token_uri": format!("http://{addr}/token"),
    });
    let key_file = std::env::var("GOOGLE_APPLICATION_CREDENTIALS")?;
    std::fs::write(Path::new(&key_file), key.to_string())?;

    let sink: PubSubSink = PubSubConfig {
        project: PROJECT.to_owned(),
        topic: Destination::parse("orders-topic")?,
        api_url: Some(format!("http://{addr}")),
        timeout: Duration::from_secs(5),
        ..PubSubConfig::default()
    }
    .build()
    .await?;
    assert_eq!(sink.place(), format!("Pub/Sub at http://{addr}"));

    for n in 0..3 {
        let deliveries = sink
            .publish(&[event("Order", &format!("o_{n}"), "x")])
            .await?;
        assert!(deliveries[0].is_ok(), "{deliveries:?}");
    }
    sink.healthcheck().await?;
    {
        let requests = state.requests.lock().expect("not poisoned");
        let tokens: Vec<_> = requests.iter().filter(|r| r.1 == "/token").collect();
        assert_eq!(tokens.len(), 1, "the token is fetched once and reused");
        let form = String::from_utf8_lossy(&tokens[0].3).into_owned();
        let assertion = form
            .split('&')
            .find_map(|p| p.strip_prefix("assertion="))
            .expect("a JWT bearer grant");
        // The form is URL-encoded: only the base64 padding `=` is escaped in a JWT.
        let assertion = assertion.replace("%3D", "");
        let claims = assertion.split('.').nth(1).expect("JWT claims");
        let claims: serde_json::Value = serde_json::from_slice(
            &base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(claims.trim_end_matches('='))?,
        )?;
        assert_eq!(claims["scope"], SCOPE);
        let api: Vec<_> = requests.iter().filter(|r| r.1 != "/token").collect();
        assert_eq!(api.len(), 4);
        for (method, path, headers, _) in &api {
            assert_eq!(
                headers.get("authorization").and_then(|v| v.to_str().ok()),
                Some(format!("Bearer {TOKEN}").as_str()),
                "{method} {path}"
            );
        }
        assert_eq!(
            api[0].1,
            format!("/v1/projects/{PROJECT}/topics/orders-topic:publish")
        );
        assert_eq!(
            api[3].1,
            format!("/v1/projects/{PROJECT}/topics/orders-topic")
        );
    }

    // Pub/Sub refuses a whole request over one invalid message: the sink sends the messages
    // of that request again one by one, so only the invalid one is rejected.
    let batch = [
        event("Order", "o_a", "fine"),
        event("Order", "o_b", "poison"),
        event("Order", "o_c", "fine too"),
    ];
    let before = state.requests.lock().expect("not poisoned").len();
    let deliveries = sink.publish(&batch).await?;
    assert!(
        deliveries[0].is_ok() && deliveries[2].is_ok(),
        "{deliveries:?}"
    );
    let err = deliveries[1].as_ref().expect_err("invalid message");
    assert_eq!(err.kind(), SinkErrorKind::Rejected);
    assert!(
        err.to_string().contains("INVALID_ARGUMENT: poison"),
        "{err}"
    );
    assert!(
        err.to_string()
            .contains("projects/proj-outbox/topics/orders-topic"),
        "{err}"
    );
    let sizes: Vec<usize> = state.requests.lock().expect("not poisoned")[before..]
        .iter()
        .map(|r| {
            serde_json::from_slice::<serde_json::Value>(&r.3).expect("JSON")["messages"]
                .as_array()
                .map_or(0, Vec::len)
        })
        .collect();
    assert_eq!(sizes, [3, 1, 1, 1], "one request, then each message alone");

    // A publisher-only account may not read the topic: still healthy.
    *state.status.lock().expect("not poisoned") = Some(StatusCode::FORBIDDEN);
    sink.healthcheck().await?;
    let err = sink
        .publish(&[event("Order", "o_9", "x")])
        .await
        .expect_err("whole batch unavailable");
    assert_eq!(err.kind(), SinkErrorKind::Unavailable);
    assert!(err.to_string().contains("roles/pubsub.publisher"), "{err}");
    assert!(err.to_string().contains("PERMISSION_DENIED"), "{err}");

    *state.status.lock().expect("not poisoned") = Some(StatusCode::UNAUTHORIZED);
    let health = sink.healthcheck().await.expect_err("credentials refused");
    assert_eq!(health.kind(), SinkErrorKind::Unavailable);
    let err = sink
        .publish(&[event("Order", "o_9", "x")])
        .await
        .expect_err("whole batch unavailable");
    assert_eq!(err.kind(), SinkErrorKind::Unavailable);
    assert!(err.to_string().contains("refused the credentials"), "{err}");

    for text in [format!("{sink:?}"), err.report(), health.report()] {
        assert!(!text.contains(TOKEN), "the token leaked: {text}");
    }
    Ok(())
}
