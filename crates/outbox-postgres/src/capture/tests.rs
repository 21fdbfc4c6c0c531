//! Rendering of the capture templates.

use super::*;

fn capture() -> PgCapture {
    let config: PostgresConfig =
        toml::from_str("url = \"postgres://u:secret@h/db\"\nschema = \"app\"\ntable = \"events\"")
            .expect("valid");
    PgCapture {
        pool: crate::db::Db::new(
            PgPool::connect_lazy("postgres://u@127.0.0.1:1/db").expect("lazy pool"),
            false,
        ),
        outbox: config.qualified_table(),
        database: config.url.redacted(),
    }
}

#[tokio::test]
async fn every_template_renders_without_leftover_placeholders() {
    let c = capture();
    let id = |s: &str| Identifier::new(s).expect("valid");
    let (schema, table, agg, et, pay) = (
        id("shop"),
        id("bookings"),
        id("customer_id"),
        id("status"),
        id("doc"),
    );
    let named: Vec<(&str, &Identifier)> = vec![
        ("captured_schema", &schema),
        ("captured_table", &table),
        ("aggregate_id", &agg),
        ("event_type_column", &et),
        ("payload_column", &pay),
    ];
    let name = id("bookings");
    for template in [
        FUNCTION
            .replace("@EVENT_TYPE@", &event_type_column("NEW"))
            .replace("@PAYLOAD@", &PayloadKind::Text.expression("NEW")),
        TRIGGER.to_owned(),
        COMMENT.to_owned(),
        DROP_FUNCTION.to_owned(),
        DROP_TRIGGER.to_owned(),
        SIGNATURE.to_owned(),
    ] {
        let sql = c.render(&template, &name, &named);
        assert!(!sql.contains("{{"), "{sql}");
    }
    let function = c.render(
        &FUNCTION
            .replace("@EVENT_TYPE@", &event_type_column("NEW"))
            .replace("@PAYLOAD@", &PayloadKind::Bytea.expression("NEW")),
        &name,
        &named,
    );
    assert!(function.contains("FUNCTION \"app\".\"bookings_outbox_capture\"()"));
    assert!(function.contains("INSERT INTO \"app\".\"events\" "));
    assert!(function.contains("NEW.\"customer_id\"::text"));
    assert!(function.contains("NEW.\"status\"::text"));
    assert!(function.contains("v_payload      bytea := NEW.\"doc\";"));
    let trigger = c.render(TRIGGER, &name, &named);
    assert!(trigger.contains(
        "CREATE TRIGGER \"bookings_outbox_capture\" AFTER @EVENTS@ ON \"shop\".\"bookings\""
    ));
}
