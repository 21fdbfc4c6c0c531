//! Unit tests of the `[[capture]]` config, literals and splicing.

use super::*;

fn parse(toml_text: &str) -> Result<CaptureConfig, String> {
    toml::from_str(toml_text).map_err(|e| e.to_string())
}

const MINIMAL: &str = r#"
table = "bookings"
aggregate_type = "Customer"
aggregate_id = "customer_id"
event_type = "booking.created"
"#;

#[test]
fn defaults_are_row_payload_on_insert_named_after_the_table() {
    let c = parse(MINIMAL).expect("valid");
    assert_eq!(c.payload, CapturePayload::Row);
    assert_eq!(c.on, vec![CaptureOp::Insert]);
    assert_eq!(c.name().as_str(), "bookings");
    assert_eq!(c.qualified_table().to_string(), "public.bookings");
    c.validate(0).expect("valid");
}

#[test]
fn a_schema_and_a_payload_column_are_read() {
    let c = parse(
        r#"
table = "app.bookings"
name = "app_bookings"
aggregate_type = "Customer"
aggregate_id = "customer_id"
event_type_column = "status"
payload = "doc"
on = ["update", "insert"]
"#,
    )
    .expect("valid");
    assert_eq!(c.qualified_table().to_string(), "app.bookings");
    assert_eq!(
        c.payload,
        CapturePayload::Column(Identifier::new("doc").expect("valid"))
    );
    assert_eq!(c.ops(), vec![CaptureOp::Insert, CaptureOp::Update]);
    c.validate(3).expect("valid");
    let back = toml::to_string(&c).expect("serializes");
    assert_eq!(parse(&back).expect("round trip"), c);
}

#[test]
fn names_that_could_carry_sql_and_unknown_keys_are_refused_by_serde() {
    for bad in [
        r#"table = "bookings; DROP TABLE x""#,
        r#"table = "a.b.c""#,
        r#"aggregate_id = "customer id""#,
        r#"payload = "doc\"""#,
        r#"on = ["delete"]"#,
        r#"colour = "blue""#,
    ] {
        let key = bad.split(' ').next().expect("a key");
        let text = MINIMAL
            .lines()
            .filter(|l| !l.starts_with(&format!("{key} ")))
            .collect::<Vec<_>>()
            .join("\n");
        assert!(parse(&format!("{text}\n{bad}")).is_err(), "{bad}");
    }
}

#[test]
fn validate_names_the_key() {
    let mut c = parse(MINIMAL).expect("valid");
    c.event_type_column = Some(Identifier::new("status").expect("valid"));
    assert_eq!(
        c.validate(2).expect_err("both"),
        "capture[2].event_type: set either event_type or event_type_column, not both"
    );
    c.event_type = None;
    c.event_type_column = None;
    assert!(
        c.validate(0)
            .expect_err("neither")
            .starts_with("capture[0].event_type: set event_type")
    );
    let mut c = parse(MINIMAL).expect("valid");
    c.aggregate_type = " ".into();
    assert!(
        c.validate(1)
            .expect_err("empty")
            .starts_with("capture[1].aggregate_type:")
    );
    c.aggregate_type = "a\0b".into();
    assert!(c.validate(1).expect_err("nul").contains("NUL"));
    let mut c = parse(MINIMAL).expect("valid");
    c.on = vec![];
    assert!(
        c.validate(0)
            .expect_err("empty")
            .starts_with("capture[0].on:")
    );
    c.on = vec![CaptureOp::Insert, CaptureOp::Insert];
    assert!(c.validate(0).expect_err("twice").contains("twice"));
}

#[test]
fn a_validation_message_keeps_its_own_key() {
    let e =
        keyed("capture[1].event_type: set either event_type or event_type_column, not both".into());
    assert!(matches!(&e, CaptureError::Invalid { key, .. } if key == "capture[1].event_type"));
    assert_eq!(
        e.to_string(),
        "capture[1].event_type: set either event_type or event_type_column, not both"
    );
}

#[test]
fn splice_never_scans_a_value() {
    let out = splice("a @X@ b @Y@ c@d e@", &[("X", "'@Y@'"), ("Y", "2")]);
    assert_eq!(out, "a '@Y@' b 2 c@d e@");
}

#[test]
fn literals_per_dialect() {
    assert_eq!(Dialect::Sqlite.literal("O'B\\r").expect("ok"), "'O''B\\r'");
    assert_eq!(Dialect::MySql.literal("O'Br").expect("ok"), "'O''Br'");
    assert_eq!(
        Dialect::MySql.literal("a\\'").expect("ok"),
        "CONVERT(X'615C27' USING utf8mb4)"
    );
    assert_eq!(Dialect::MySql.literal("\0"), Err(LiteralError::Nul));
    assert_eq!(Dialect::Sqlite.literal("\0"), Err(LiteralError::Nul));
}

#[test]
fn duplicate_names_are_refused() {
    let a = parse(MINIMAL).expect("valid");
    let mut b = a.clone();
    b.table = parse_table("other.bookings").expect("valid");
    let err = validate_all(&[a.clone(), b.clone()]).expect_err("same name");
    assert!(err.starts_with("capture[1].name:"), "{err}");
    b.name = Some(Identifier::new("other_bookings").expect("valid"));
    validate_all(&[a, b]).expect("distinct");
}

#[test]
fn literals_are_quoted_whatever_they_contain() {
    assert_eq!(quote_literal("Customer").expect("ok"), "'Customer'");
    assert_eq!(quote_literal("O'Brien").expect("ok"), "'O''Brien'");
    assert_eq!(quote_literal("a\\b'c").expect("ok"), "E'a\\\\b''c'");
    assert_eq!(quote_literal("").expect("ok"), "''");
    assert_eq!(quote_literal("x\0"), Err(LiteralError::Nul));
}

proptest::proptest! {
    /// Reading the literal back as PostgreSQL does (both string syntaxes) gives the value.
    #[test]
    fn every_quoted_literal_reads_back_as_its_value(s in "[^\0]{0,40}") {
        let lit = quote_literal(&s).expect("no NUL");
        let (escape, body) = match lit.strip_prefix('E') {
            Some(rest) => (true, rest),
            None => (false, lit.as_str()),
        };
        let body = body.strip_prefix('\'').and_then(|b| b.strip_suffix('\'')).expect("quoted");
        let mut out = String::new();
        let mut chars = body.chars().peekable();
        while let Some(c) = chars.next() {
            match c {
                '\'' => {
                    // Inside the literal a quote only ever comes doubled.
                    proptest::prop_assert_eq!(chars.next(), Some('\''));
                    out.push('\'');
                }
                '\\' if escape => {
                    proptest::prop_assert_eq!(chars.next(), Some('\\'));
                    out.push('\\');
                }
                '\\' => proptest::prop_assert!(false, "a backslash outside E'...'"),
                c => out.push(c),
            }
        }
        proptest::prop_assert_eq!(out, s);
    }
}
