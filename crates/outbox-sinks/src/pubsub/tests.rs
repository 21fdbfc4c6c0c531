use std::collections::BTreeMap;

use super::message::{attributes, shorten};
use super::rest::{classify, shorten_bytes};
use super::*;
use outbox_core::SinkErrorKind::*;

fn event(aggregate_id: &str) -> Event {
    crate::broker::sample_event("Order", aggregate_id, "order.placed")
}

/// The attributes of the plain message.
fn plain_attributes(e: &Event) -> Result<BTreeMap<String, String>, SinkError> {
    attributes(e, &MessageFormat::Plain).map(|(a, _)| a)
}

#[test]
fn cloudevents_formats_shape_attributes_and_data() {
    use outbox_core::cloudevents::{DEFAULT_DATA_CONTENT_TYPE, DEFAULT_SOURCE, Format};
    let mut e = event("o_1");
    e.payload = bytes::Bytes::from_static(b"{\"a\":1}");
    e.headers = vec![("traceparent".to_owned(), "00-ab-cd-01".to_owned())];
    let binary = MessageFormat::new(
        Format::CloudeventsBinary,
        DEFAULT_SOURCE,
        DEFAULT_DATA_CONTENT_TYPE,
    )
    .expect("valid");
    let (map, data) = attributes(&e, &binary).expect("within limits");
    assert_eq!(data, e.payload);
    assert_eq!(map["ce-id"], e.id.to_string());
    assert_eq!(map["ce-type"], "order.placed");
    assert_eq!(map["ce-subject"], "o_1");
    assert_eq!(map["content-type"], "application/json");
    assert_eq!(map["ce-traceparent"], "00-ab-cd-01");
    assert!(!map.contains_key("id"), "{map:?}");
    let structured = MessageFormat::new(
        Format::CloudeventsStructured,
        DEFAULT_SOURCE,
        DEFAULT_DATA_CONTENT_TYPE,
    )
    .expect("valid");
    let (map, data) = attributes(&e, &structured).expect("within limits");
    assert_eq!(map.len(), 1);
    assert_eq!(map["content-type"], "application/cloudevents+json");
    let envelope: serde_json::Value = serde_json::from_slice(&data).expect("JSON");
    assert_eq!(envelope["data"]["a"], 1);
}

#[test]
fn topic_ids_follow_pubsub_rules() {
    for good in ["abc", "outbox.event.Order", "a-b_c~d%e+f", &"x".repeat(255)] {
        assert_eq!(topic_name_problem(good), None, "{good}");
    }
    for (bad, why) in [
        ("ab", "3 to 255"),
        (&"x".repeat(256), "3 to 255"),
        ("1abc", "start with a letter"),
        ("goog-events", "goog"),
        ("a/b/c", "`/` is not allowed"),
        ("ab c", "` ` is not allowed"),
        ("caf\u{e9}", "is not allowed"),
    ] {
        let problem = topic_name_problem(bad).expect(bad);
        assert!(problem.contains(why), "{bad}: {problem}");
    }
}

#[test]
fn protobuf_field_sizes() {
    assert_eq!(field_len(0), 2);
    assert_eq!(field_len(127), 129);
    assert_eq!(field_len(128), 131);
    assert_eq!(field_len(10_000_000), 10_000_005);
}

#[test]
fn attributes_are_the_message_headers_within_pubsub_limits() {
    let mut e = event("o_1");
    e.headers = vec![("tenant".to_owned(), "acme".to_owned())];
    let map = plain_attributes(&e).expect("within limits");
    assert_eq!(map.len(), 5);
    assert_eq!(map["tenant"], "acme");
    assert_eq!(map["aggregate_id"], "o_1");

    let reason = |headers: Vec<(String, String)>| {
        let mut e = event("o_1");
        e.headers = headers;
        let err = plain_attributes(&e).expect_err("over a limit");
        assert_eq!(err.kind(), Rejected);
        err.to_string()
    };
    let r = reason(vec![("k".repeat(257), "v".to_owned())]);
    assert!(r.contains("exceeds Pub/Sub's limit of 256 bytes"), "{r}");
    assert_eq!(
        plain_attributes(&{
            let mut e = event("o_1");
            e.headers = vec![("k".repeat(256), "v".repeat(1024))];
            e
        })
        .map(|a| a.len())
        .ok(),
        Some(5)
    );
    let r = reason(vec![("big".to_owned(), "v".repeat(1025))]);
    assert!(r.contains("`big` of 1025 bytes exceeds"), "{r}");
    let r = reason((0..97).map(|i| (format!("h{i}"), "v".to_owned())).collect());
    assert!(r.contains("101 headers"), "{r}");
    assert!(r.contains("limit of 100 attributes"), "{r}");
    let r = reason(vec![("googler".to_owned(), "v".to_owned())]);
    assert!(r.contains("reserved") && r.contains("limit"), "{r}");
    let r = reason(vec![(String::new(), "v".to_owned())]);
    assert!(r.contains("empty name"), "{r}");
    let r = reason(vec![
        ("x".to_owned(), "1".to_owned()),
        ("x".to_owned(), "2".to_owned()),
    ]);
    assert!(r.contains("appears twice"), "{r}");
    // 96 row headers + 4 contract headers = 100: the limit itself is fine.
    let mut e = event("o_1");
    e.headers = (0..96).map(|i| (format!("h{i}"), "v".to_owned())).collect();
    assert_eq!(plain_attributes(&e).map(|a| a.len()).ok(), Some(100));
}

#[test]
fn error_answers_map_to_kinds() {
    let kind = |status: u16, body: &str| {
        classify(
            StatusCode::from_u16(status).expect("status"),
            body.as_bytes(),
            "projects/p/topics/t",
            "Pub/Sub emulator at 127.0.0.1:1",
        )
        .kind()
    };
    assert_eq!(kind(429, ""), Transient);
    assert_eq!(kind(500, ""), Transient);
    assert_eq!(kind(503, ""), Transient);
    assert_eq!(kind(408, ""), Transient);
    assert_eq!(
        kind(
            409,
            r#"{"error":{"code":409,"message":"m","status":"ABORTED"}}"#
        ),
        Transient
    );
    assert_eq!(
        kind(
            400,
            r#"{"error":{"code":400,"message":"m","status":"UNAVAILABLE"}}"#
        ),
        Transient
    );
    assert_eq!(kind(401, ""), Unavailable);
    assert_eq!(kind(403, ""), Unavailable);
    assert_eq!(kind(404, ""), Rejected);
    assert_eq!(kind(400, ""), Rejected);
    assert_eq!(kind(413, ""), Rejected);
    let e = classify(
        StatusCode::NOT_FOUND,
        br#"{"error":{"code":404,"message":"Topic not found","status":"NOT_FOUND"}}"#,
        "projects/p/topics/orders",
        "Pub/Sub emulator at 127.0.0.1:1",
    );
    assert_eq!(
        e.to_string(),
        "topic `projects/p/topics/orders` not found on Pub/Sub emulator at 127.0.0.1:1 \
         (HTTP 404 NOT_FOUND: Topic not found); create the topic (and its subscriptions) \
         first"
    );
    let e = classify(
        StatusCode::FORBIDDEN,
        b"<html>nope</html>",
        "projects/p/topics/orders",
        "Pub/Sub at https://pubsub.googleapis.com",
    );
    assert!(e.to_string().contains("roles/pubsub.publisher"), "{e}");
    assert!(e.to_string().contains("<html>nope</html>"), "{e}");
}

#[test]
fn long_names_are_shortened_in_reasons() {
    assert_eq!(shorten("abc"), "abc");
    assert_eq!(shorten(&"é".repeat(70)).chars().count(), 61);
    assert_eq!(shorten_bytes(&"é".repeat(10), 5), "éé…");
}
