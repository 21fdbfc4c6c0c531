use super::{Config, describe};

#[test]
fn a_kind_left_out_of_the_build_says_which_feature_brings_it_back() {
    let mut error = figment::Error::from(figment::error::Kind::UnknownVariant(
        "postgres".to_owned(),
        &["sqlite"],
    ));
    error.path = vec!["source".to_owned(), "kind".to_owned()];
    let message = describe(vec![error]);
    assert!(
        message.starts_with("source.kind: unknown value `postgres`")
            && message.contains("cargo feature `postgres`")
            && message.contains("cargo build --release -p outbox-cli"),
        "{message}"
    );
    let mut typo = figment::Error::from(figment::error::Kind::UnknownVariant(
        "postgre".to_owned(),
        &["sqlite"],
    ));
    typo.path = vec!["source".to_owned(), "kind".to_owned()];
    assert!(!describe(vec![typo]).contains("cargo feature"));
}

/// What `outbox check-config` prints is a config file: read back, it is the same
/// configuration (secrets aside, which print as `***`).
#[test]
fn the_printed_configuration_reads_back_as_the_same_configuration() {
    let text = r#"
[source]
kind = "sqlite"
path = "orders.db"
lease_ttl = "1m"
[relay]
batch_size = 200
backoff = { initial = "250ms", max = "1m" }
[sink]
kind = "file"
path = "events.jsonl"
[metrics]
listen = "127.0.0.1:9187"
[retention]
keep = "3days"
"#;
    let config = Config::from_toml(text).expect("valid");
    let printed = config.to_redacted_toml().expect("printable");
    assert!(printed.contains("batch_size = 200"), "{printed}");
    assert!(printed.contains("initial = \"250ms\""), "{printed}");
    let again = Config::from_toml(&printed)
        .unwrap_or_else(|e| panic!("the printed config does not read back: {e}\n{printed}"));
    assert_eq!(again.to_redacted_toml().expect("printable"), printed);
}

/// With subscriptions, the printed file keeps every section but `[sink]` and reads back
/// as the same configuration.
#[test]
fn a_configuration_with_subscriptions_prints_and_reads_back() {
    let text = r#"
[source]
kind = "postgres"
url = "postgres://app@127.0.0.1:5432/app"
[sinks.files]
kind = "file"
path = "events.jsonl"
[[subscription]]
name = "all"
sink = "files"
event_type = ["order.*", "invoice.paid"]
[[capture]]
table = "bookings"
aggregate_type = "Customer"
aggregate_id = "customer_id"
event_type = "booking.created"
"#;
    let config = Config::from_toml(text).expect("valid");
    let printed = config.to_redacted_toml().expect("printable");
    assert!(!printed.contains("[sink]"), "{printed}");
    for section in [
        "[source]",
        "[relay]",
        "[sinks.files]",
        "[[subscription]]",
        "[metrics]",
        "[retention]",
        "[ui]",
        "[tracing]",
        "[[capture]]",
    ] {
        assert!(
            printed.contains(section),
            "{section} missing from\n{printed}"
        );
    }
    let again = Config::from_toml(&printed)
        .unwrap_or_else(|e| panic!("the printed config does not read back: {e}\n{printed}"));
    assert_eq!(again.to_redacted_toml().expect("printable"), printed);
}

/// A secret read from a file (`KEY_file`) is the key's value, without the file's trailing
/// newline; mistakes name the key and the path, never the contents.
#[test]
fn secrets_come_from_files() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = dir.path().join("db.url");
    std::fs::write(&url, "postgres://app:Pw-From-File@127.0.0.1:5432/app\n").expect("write");
    let token = dir.path().join("token");
    std::fs::write(&token, "Tok-From-File\n").expect("write");
    let text = with_secret_files("[sink]", &url, &token);
    let (config, printed) = read_redacted(&text);
    assert!(
        printed.contains("url = \"postgres://app:***@127.0.0.1:5432/app\""),
        "{printed}"
    );
    let crate::SourceConfig::Postgres(pg) = &config.source else {
        panic!("not postgres")
    };
    assert_eq!(
        pg.url.expose(),
        "postgres://app:Pw-From-File@127.0.0.1:5432/app"
    );

    let both = format!("{text}\n").replace("[sink]", "url = \"postgres://x@h/d\"\n[sink]");
    let e = Config::from_toml(&both).expect_err("both").to_string();
    assert!(
        e.contains("source.url_file") && e.contains("not both"),
        "{e}"
    );
    refused_without(&text, &token, "sink.secret_file");
    // A named sink (`[sinks.NAME]`) reads its secrets from files the same way.
    let named = format!(
        "{}[[subscription]]\nname = \"partner\"\nsink = \"hook\"\n",
        with_secret_files("[sinks.hook]", &url, &token)
    );
    let (config, printed) = read_redacted(&named);
    assert!(printed.contains("[sinks.hook]"), "{printed}");
    assert!(!format!("{config:?}").contains("From-File"));
    refused_without(&named, &token, "sinks.hook.secret_file");
    let unknown = text.replace("secret_file", "headers_file");
    let e = Config::from_toml(&unknown)
        .expect_err("unknown")
        .to_string();
    assert!(e.contains("sink.headers_file"), "{e}");
}

/// A config whose `[source]` reads its URL from file `url`, and whose sink (the table
/// `sink_table` opens: `[sink]`, or a named sink's) reads its secret from file `token`.
fn with_secret_files(sink_table: &str, url: &std::path::Path, token: &std::path::Path) -> String {
    format!(
        "[source]\nkind = \"postgres\"\nurl_file = \"{}\"\n{sink_table}\nkind = \"http\"\nurl = \"http://127.0.0.1:1/in\"\nsecret_file = \"{}\"\n",
        url.display(),
        token.display()
    )
}

/// Reads `text` and prints it back: the secret shows as `***`, the files' contents nowhere.
fn read_redacted(text: &str) -> (Config, String) {
    let config = Config::from_toml(text).expect("valid");
    let printed = config.to_redacted_toml().expect("printable");
    assert!(printed.contains("secret = \"***\""), "{printed}");
    assert!(!printed.contains("From-File"), "{printed}");
    (config, printed)
}

/// `text` with the secret file `token` replaced by a missing one is refused, and the error
/// names `key` and the missing path.
fn refused_without(text: &str, token: &std::path::Path, key: &str) {
    let missing = text.replace(&token.display().to_string(), "/no/such/secret");
    let e = Config::from_toml(&missing)
        .expect_err("missing")
        .to_string();
    assert!(e.contains(key) && e.contains("/no/such/secret"), "{e}");
}
