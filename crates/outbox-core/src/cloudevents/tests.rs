use super::*;
use base64::Engine as _;

use crate::Position;

fn event(payload: &'static [u8], headers: &[(&str, &str)]) -> Event {
    Event {
        id: uuid::Uuid::from_u128(0x0190_f3c2_7d1e_7a4b_9c61_3f5e_0b2a_8d10),
        position: Position(1),
        aggregate_type: "Order".into(),
        aggregate_id: "o_91f2".into(),
        event_type: "order.placed".into(),
        payload: Bytes::from_static(payload),
        headers: headers
            .iter()
            .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
            .collect(),
        created_at: time::OffsetDateTime::parse(
            "2026-11-22T10:15:30.123456Z",
            &time::format_description::well_known::Rfc3339,
        )
        .expect("a valid time"),
        attempts: 0,
    }
}

fn settings() -> CloudEvents {
    CloudEvents::new(DEFAULT_SOURCE, DEFAULT_DATA_CONTENT_TYPE).expect("defaults are valid")
}

fn pairs(attributes: &Attributes<'_>) -> Vec<(String, String)> {
    let mut out = Vec::new();
    attributes.for_each(|n, v| out.push((n.to_owned(), v.to_owned())));
    out
}

const KAFKA: Binding = Binding {
    prefix: "ce_",
    data_content_type: Some("content-type"),
    structured_content_type: Some("content-type"),
    percent_encode: false,
};

#[test]
fn the_event_maps_onto_the_context_attributes() {
    let e = event(
        br#"{"total":1}"#,
        &[
            (
                "traceparent",
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            ),
            ("tracestate", "congo=t61rcWkgMzE"),
            ("aggregate_seq", "3"),
            ("tenant", "acme"),
        ],
    );
    let s = settings();
    let a = s.attributes(&e).expect("a CloudEvent");
    let expected: Vec<(String, String)> = [
        ("specversion", "1.0"),
        ("id", "0190f3c2-7d1e-7a4b-9c61-3f5e0b2a8d10"),
        ("source", "urn:outbox:Order"),
        ("type", "order.placed"),
        ("subject", "o_91f2"),
        ("time", "2026-11-22T10:15:30.123456Z"),
        ("datacontenttype", "application/json"),
        ("aggregatetype", "Order"),
        ("aggregateseq", "3"),
        (
            "traceparent",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ),
        ("tracestate", "congo=t61rcWkgMzE"),
        ("tenant", "acme"),
    ]
    .iter()
    .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
    .collect();
    assert_eq!(pairs(&a), expected);
}

#[test]
fn headers_that_cannot_be_extensions_travel_in_outboxheaders_never_dropped() {
    let e = event(
        b"{}",
        &[
            ("X-Request-Id", "r1"),
            ("content-type", "application/vnd.acme+json"),
            ("tenant_id", "t\"1"),
            ("source", "spoofed"),
            ("tenant", "a"),
            ("tenant", "b"),
            ("outboxheaders", "x"),
            ("id", "spoofed id"),
            ("dataschema", "https://schemas.example.com/order"),
        ],
    );
    let s = settings();
    let a = s.attributes(&e).expect("a CloudEvent");
    let got = pairs(&a);
    let get = |name: &str| got.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str());
    assert_eq!(get("id"), Some("0190f3c2-7d1e-7a4b-9c61-3f5e0b2a8d10"));
    assert_eq!(get("source"), Some("urn:outbox:Order"));
    assert_eq!(get("datacontenttype"), Some("application/vnd.acme+json"));
    assert_eq!(get("tenant"), Some("a"));
    assert_eq!(get("dataschema"), Some("https://schemas.example.com/order"));
    let overflow: Vec<[String; 2]> =
        serde_json::from_str(get("outboxheaders").expect("overflow")).expect("JSON pairs");
    let expected: Vec<[String; 2]> = [
        ["X-Request-Id", "r1"],
        ["tenant_id", "t\"1"],
        ["source", "spoofed"],
        ["tenant", "b"],
        ["outboxheaders", "x"],
    ]
    .iter()
    .map(|[n, v]| [(*n).to_owned(), (*v).to_owned()])
    .collect();
    assert_eq!(overflow, expected);
    assert_eq!(got.last().map(|(n, _)| n.as_str()), Some("outboxheaders"));
}

#[test]
fn binary_headers_follow_the_binding() {
    let e = event(
        b"{}",
        &[("traceparent", "00-ab-cd-01"), ("note", "Zürich 1")],
    );
    let kafka = MessageFormat::new(
        Format::CloudeventsBinary,
        DEFAULT_SOURCE,
        DEFAULT_DATA_CONTENT_TYPE,
    )
    .expect("valid");
    let mut headers = Vec::new();
    let encoded = kafka
        .encode(&e, &KAFKA, |n, v| headers.push(format!("{n}={v}")))
        .expect("encodes");
    assert_eq!(encoded.body, e.payload, "the data is the payload unchanged");
    assert_eq!(encoded.content_type, None);
    assert_eq!(
        headers,
        [
            "ce_specversion=1.0",
            "ce_id=0190f3c2-7d1e-7a4b-9c61-3f5e0b2a8d10",
            "ce_source=urn:outbox:Order",
            "ce_type=order.placed",
            "ce_subject=o_91f2",
            "ce_time=2026-11-22T10:15:30.123456Z",
            "content-type=application/json",
            "ce_aggregatetype=Order",
            "ce_traceparent=00-ab-cd-01",
            "ce_note=Zürich 1",
        ]
    );

    let nats = Binding {
        prefix: "ce-",
        data_content_type: Some("ce-datacontenttype"),
        structured_content_type: Some("Content-Type"),
        percent_encode: true,
    };
    let mut headers = Vec::new();
    let with_charset = MessageFormat::new(
        Format::CloudeventsBinary,
        "urn:x:{aggregate_id}",
        "application/json; charset=utf-8",
    )
    .expect("valid");
    with_charset
        .encode(&e, &nats, |n, v| headers.push(format!("{n}={v}")))
        .expect("encodes");
    assert!(
        headers.contains(&"ce-note=Z%C3%BCrich%201".to_owned()),
        "{headers:?}"
    );
    assert!(
        headers.contains(&"ce-datacontenttype=application/json;%20charset=utf-8".to_owned()),
        "{headers:?}"
    );
    assert!(headers.contains(&"ce-source=urn:x:o_91f2".to_owned()));

    let amqp = Binding {
        prefix: "ce-",
        data_content_type: None,
        structured_content_type: None,
        percent_encode: false,
    };
    let mut names = Vec::new();
    let encoded = kafka
        .encode(&e, &amqp, |n, _| names.push(n.to_owned()))
        .expect("encodes");
    assert_eq!(encoded.content_type, Some("application/json"));
    assert!(!names.iter().any(|n| n.contains("content")), "{names:?}");
}

#[test]
fn the_structured_envelope_embeds_json_and_base64_encodes_the_rest() {
    let structured = MessageFormat::new(
        Format::CloudeventsStructured,
        DEFAULT_SOURCE,
        DEFAULT_DATA_CONTENT_TYPE,
    )
    .expect("valid");
    let json = event(b" {\"total\": 1250,\n \"items\": [1, 2]}\n", &[]);
    let mut headers = Vec::new();
    let encoded = structured
        .encode(&json, &KAFKA, |n, v| {
            headers.push((n.to_owned(), v.to_owned()))
        })
        .expect("encodes");
    assert_eq!(
        headers,
        [(
            "content-type".to_owned(),
            STRUCTURED_CONTENT_TYPE.to_owned()
        )]
    );
    let text = std::str::from_utf8(&encoded.body).expect("UTF-8");
    assert_eq!(
        text,
        "{\"specversion\":\"1.0\",\"id\":\"0190f3c2-7d1e-7a4b-9c61-3f5e0b2a8d10\",\
         \"source\":\"urn:outbox:Order\",\"type\":\"order.placed\",\"subject\":\"o_91f2\",\
         \"time\":\"2026-11-22T10:15:30.123456Z\",\"datacontenttype\":\"application/json\",\
         \"aggregatetype\":\"Order\",\"data\":{\"total\": 1250,\n \"items\": [1, 2]}}"
    );
    let back = Envelope::parse(&encoded.body).expect("a CloudEvent");
    assert_eq!(&back.data[..], b"{\"total\": 1250,\n \"items\": [1, 2]}");
    assert!(
        back.attributes
            .contains(&("type".to_owned(), "order.placed".to_owned()))
    );

    for (payload, content_type) in [
        (&b"\x00\xff binary"[..], None),
        (b"not json", None),
        (b"", None),
        (b"{\"a\":1}", Some("text/plain")),
    ] {
        let mut e = event(b"", &[]);
        e.payload = Bytes::copy_from_slice(payload);
        if let Some(ct) = content_type {
            e.headers.push(("content-type".into(), ct.into()));
        }
        let encoded = structured.encode(&e, &KAFKA, |_, _| {}).expect("encodes");
        let value: serde_json::Value =
            serde_json::from_slice(&encoded.body).expect("the envelope is JSON");
        assert!(value.get("data").is_none(), "{value}");
        let b64 = value["data_base64"].as_str().expect("data_base64");
        assert_eq!(
            base64::engine::general_purpose::STANDARD
                .decode(b64)
                .expect("base64"),
            payload
        );
        assert_eq!(
            &Envelope::parse(&encoded.body).expect("a CloudEvent").data[..],
            payload
        );
    }
}

#[test]
fn an_event_without_type_or_source_is_refused_and_an_empty_subject_left_out() {
    let s = settings();
    let mut e = event(b"{}", &[]);
    e.event_type.clear();
    assert!(s.attributes(&e).expect_err("no type").contains("`type`"));
    let mut e = event(b"{}", &[]);
    e.aggregate_type.clear();
    let only_type = CloudEvents::new("{aggregate_type}", "application/json").expect("valid");
    assert!(
        only_type
            .attributes(&e)
            .expect_err("no source")
            .contains("empty `source`")
    );
    let mut e = event(b"{}", &[]);
    e.aggregate_id.clear();
    e.created_at = time::OffsetDateTime::UNIX_EPOCH;
    let names: Vec<String> = pairs(&s.attributes(&e).expect("valid"))
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert!(!names.contains(&"subject".to_owned()) && !names.contains(&"time".to_owned()));
}

#[test]
fn settings_are_checked_and_name_their_key() {
    for (source, content_type, key) in [
        ("", "application/json", "cloudevents_source"),
        (
            "urn:outbox {aggregate_type}",
            "application/json",
            "cloudevents_source",
        ),
        ("urn:{tenant}", "application/json", "cloudevents_source"),
        (
            "urn:{aggregate_type",
            "application/json",
            "cloudevents_source",
        ),
        (DEFAULT_SOURCE, "json", "cloudevents_content_type"),
        (DEFAULT_SOURCE, "", "cloudevents_content_type"),
        (
            DEFAULT_SOURCE,
            " application/json",
            "cloudevents_content_type",
        ),
    ] {
        let error = CloudEvents::new(source, content_type).expect_err(source);
        assert_eq!(error.key, key, "{source} {content_type}: {error}");
    }
    assert!(
        CloudEvents::new("urn:{tenant}", "application/json")
            .expect_err("unknown placeholder")
            .message
            .contains("`{tenant}`")
    );
    assert!(CloudEvents::new("https://orders.example.com/{event_type}", "text/plain").is_ok());
    let plain = MessageFormat::new(Format::Plain, "", "").expect("plain ignores them");
    assert!(plain.is_plain());
}

#[test]
fn format_names_are_the_config_values() {
    for name in Format::NAMES {
        let parsed: Format =
            serde_json::from_value(serde_json::Value::String(name.to_owned())).expect(name);
        assert_eq!(parsed.as_str(), name);
    }
    assert!(serde_json::from_str::<Format>("\"cloudevents\"").is_err());
}

#[test]
fn percent_encoding_round_trips() {
    let mut buffer = String::new();
    assert_eq!(percent_encode("plain-value", &mut buffer), "plain-value");
    let encoded = percent_encode("Euro € 😀 \"%\"", &mut buffer).to_owned();
    assert_eq!(encoded, "Euro%20%E2%82%AC%20%F0%9F%98%80%20%22%25%22");
    assert_eq!(percent_decode(&encoded).as_deref(), Some("Euro € 😀 \"%\""));
    assert_eq!(percent_decode("100%").as_deref(), Some("100%"));
    assert_eq!(percent_decode("%C0"), None);
}

#[test]
fn timestamps_are_rfc3339_in_utc_with_the_fraction_needed() {
    use time::format_description::well_known::Rfc3339;
    for text in [
        "2026-11-22T10:15:30Z",
        "2026-11-22T10:15:30.1Z",
        "2026-11-22T10:15:30.123456Z",
        "2026-11-22T10:15:30.000001Z",
        "2026-11-22T10:15:30.123456789Z",
        "0001-01-01T00:00:00.5Z",
    ] {
        let at = time::OffsetDateTime::parse(text, &Rfc3339).expect(text);
        let ours = Timestamp::rfc3339(at).expect(text);
        assert_eq!(ours.as_str(), text);
        assert_eq!(Some(ours.as_str().to_owned()), at.format(&Rfc3339).ok());
    }
    let cest = time::OffsetDateTime::parse("2026-11-22T12:15:30+02:00", &Rfc3339).expect("valid");
    assert_eq!(
        Timestamp::rfc3339(cest).expect("valid").as_str(),
        "2026-11-22T10:15:30Z"
    );
}

#[test]
fn json_media_types() {
    for yes in [
        "application/json",
        "Application/JSON; charset=utf-8",
        "application/vnd.a+json",
        "text/json",
    ] {
        assert!(is_json_media_type(yes), "{yes}");
    }
    for no in [
        "text/plain",
        "application/octet-stream",
        "application/jsonl",
    ] {
        assert!(!is_json_media_type(no), "{no}");
    }
}
