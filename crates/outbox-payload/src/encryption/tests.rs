//! Envelope encryption with file keys: round trips, authentication, rotation, config checks,
//! and that no key material reaches `Debug` or errors. (KMS: tests/encryption_kms.rs.)

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

use outbox_core::{Position, SinkErrorKind};
use sha2::Digest as _;

use super::*;

const KEY: [u8; 32] = [0x5a; 32];

fn key_file(dir: &tempfile::TempDir) -> PathBuf {
    let path = dir.path().join("key");
    std::fs::write(&path, hex::encode(KEY)).expect("write the key file");
    path
}

fn config(path: &Path) -> EncryptionConfig {
    EncryptionConfig {
        key: format!("file:{}", path.display()),
        rotate: default_rotate(),
        fields: Vec::new(),
        region: None,
        endpoint_url: None,
    }
}

fn event(payload: &[u8]) -> Event {
    Event {
        id: Uuid::new_v4(),
        position: Position(1),
        aggregate_type: "Order".into(),
        aggregate_id: "o_1".into(),
        event_type: "order.placed".into(),
        payload: Bytes::copy_from_slice(payload),
        headers: vec![("trace".into(), "t-1".into())],
        created_at: time::OffsetDateTime::UNIX_EPOCH,
        attempts: 0,
    }
}

fn header<'a>(event: &'a Event, name: &str) -> Option<&'a str> {
    find(&event.headers, name)
}

/// A key file in a new directory, and an encryptor of it for `fields`.
async fn setup(fields: &[&str]) -> (tempfile::TempDir, PathBuf, Encryptor) {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = key_file(&dir);
    let mut config = config(&path);
    config.fields = fields.iter().map(|f| (*f).to_owned()).collect();
    let encryptor = Encryptor::connect(&config).await.expect("connect");
    (dir, path, encryptor)
}

async fn keyring(path: &Path) -> KeyRing {
    KeyRing::new().with_key_file(path).expect("key ring")
}

#[tokio::test]
async fn whole_payload_round_trip_with_a_file_key() {
    let (_dir, path, encryptor) = setup(&[]).await;
    let plain = br#"{"card":"4111 1111 1111 1111","total":12}"#;
    let original = event(plain);
    let sent = encryptor.apply(original.clone()).await.expect("encrypt");

    assert_ne!(sent.payload, original.payload);
    assert!(!sent.payload.windows(4).any(|w| w == b"4111"));
    assert_eq!(sent.payload.len(), plain.len() + 16, "ciphertext ‖ tag");
    assert_eq!(sent.headers[0], ("trace".to_owned(), "t-1".to_owned()));
    assert_eq!(header(&sent, header::ENCRYPTION), Some(WHOLE));
    let key_id = header(&sent, header::ENCRYPTION_KEY_ID).expect("key id");
    let expected_id = format!("file:{}", &hex::encode(sha2::Sha256::digest(KEY))[..16]);
    assert_eq!(key_id, expected_id);
    let nonce = BASE64
        .decode(header(&sent, header::ENCRYPTION_NONCE).expect("nonce"))
        .expect("base64");
    assert_eq!(nonce.len(), 12);
    assert!(header(&sent, header::ENCRYPTION_FIELDS).is_none());

    let decrypted = keyring(&path)
        .await
        .decrypt(sent.id, &sent.payload, &sent.headers)
        .await
        .expect("decrypt");
    assert_eq!(decrypted.as_deref(), Some(&plain[..]));

    // A message without `encryption` is not touched.
    let none = keyring(&path)
        .await
        .decrypt(original.id, &original.payload, &original.headers)
        .await
        .expect("no encryption");
    assert_eq!(none, None);
}

/// The wire format by hand, as a consumer in another language would do it: unwrap the data
/// key with the master key, then open the body.
#[tokio::test]
async fn the_wire_format_is_what_the_docs_say() {
    let (_dir, _path, encryptor) = setup(&[]).await;
    let sent = encryptor.apply(event(b"hello")).await.expect("encrypt");

    let wrapped = BASE64
        .decode(header(&sent, header::ENCRYPTION_DATA_KEY).expect("data key"))
        .expect("base64");
    assert_eq!(wrapped.len(), 12 + 32 + 16);
    let master = AesKey::new(&KEY).expect("master key");
    let data_key = master
        .open(
            wrapped[..12].try_into().expect("12 bytes"),
            b"outbox data key",
            &wrapped[12..],
        )
        .expect("unwrap");
    let data_key = AesKey::new(&data_key).expect("32 bytes");
    let nonce = BASE64
        .decode(header(&sent, header::ENCRYPTION_NONCE).expect("nonce"))
        .expect("base64");
    let plain = data_key
        .open(
            nonce.try_into().expect("12 bytes"),
            sent.id.to_string().as_bytes(),
            &sent.payload,
        )
        .expect("open");
    assert_eq!(plain, b"hello");
}

#[tokio::test]
async fn a_ciphertext_moved_to_another_event_or_altered_fails_authentication() {
    let (_dir, path, encryptor) = setup(&[]).await;
    let sent = encryptor
        .apply(event(b"secret body"))
        .await
        .expect("encrypt");
    let keys = keyring(&path).await;

    let moved = keys
        .decrypt(Uuid::new_v4(), &sent.payload, &sent.headers)
        .await
        .expect_err("another event id");
    assert_eq!(moved, DecodeError::Invalid(TAMPERED.into()));

    for i in [0, sent.payload.len() - 1] {
        let mut body = sent.payload.to_vec();
        body[i] ^= 0x01;
        let err = keys
            .decrypt(sent.id, &Bytes::from(body), &sent.headers)
            .await
            .expect_err("a flipped bit");
        assert_eq!(err, DecodeError::Invalid(TAMPERED.into()));
    }

    // An altered wrapped data key.
    let mut headers = sent.headers.clone();
    for (name, value) in &mut headers {
        if name == header::ENCRYPTION_DATA_KEY {
            let mut wrapped = BASE64.decode(&*value).expect("base64");
            wrapped[15] ^= 0x01;
            *value = BASE64.encode(wrapped);
        }
    }
    let err = KeyRing::new()
        .with_key_file(&path)
        .expect("key ring")
        .decrypt(sent.id, &sent.payload, &headers)
        .await
        .expect_err("altered data key");
    assert!(matches!(err, DecodeError::Invalid(_)), "{err:?}");
}

#[tokio::test]
async fn fields_round_trip_keeps_the_other_fields_and_their_order() {
    let (_dir, path, encryptor) = setup(&["email", "card", "absent"]).await;
    let plain = br#"{"status":"paid","card":{"number":"4111","exp":"12/29"},"email":"a@b.example","total":12.5}"#;
    let sent = encryptor.apply(event(plain)).await.expect("encrypt");

    let text = std::str::from_utf8(&sent.payload).expect("utf-8");
    assert!(
        !text.contains("4111") && !text.contains("a@b.example"),
        "{text}"
    );
    let members = Members::parse(&sent.payload).expect("an object");
    let names: Vec<_> = members.0.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["status", "card", "email", "total"]);
    assert_eq!(members.0[0].1.get(), r#""paid""#);
    assert_eq!(members.0[3].1.get(), "12.5");
    assert!(fields::enc_text(&members.0[1].1).is_some());
    assert_eq!(header(&sent, header::ENCRYPTION), Some(FIELDS));
    assert_eq!(header(&sent, header::ENCRYPTION_FIELDS), Some("email,card"));
    assert!(header(&sent, header::ENCRYPTION_NONCE).is_none());

    let decrypted = keyring(&path)
        .await
        .decrypt(sent.id, &sent.payload, &sent.headers)
        .await
        .expect("decrypt")
        .expect("encrypted");
    assert_eq!(&decrypted[..], &plain[..]);
}

#[tokio::test]
async fn a_field_moved_to_another_field_or_event_fails_authentication() {
    let (_dir, path, encryptor) = setup(&["card", "email"]).await;
    let sent = encryptor
        .apply(event(br#"{"card":"4111","email":"a@b.example"}"#))
        .await
        .expect("encrypt");
    let keys = keyring(&path).await;

    // Swap the two encrypted values.
    let mut members = Members::parse(&sent.payload).expect("an object");
    let card = members.0[0].1.clone();
    members.0[0].1 = members.0[1].1.clone();
    members.0[1].1 = card;
    let swapped = Bytes::from(members.to_bytes());
    let err = keys
        .decrypt(sent.id, &swapped, &sent.headers)
        .await
        .expect_err("swapped fields");
    assert_eq!(
        err,
        DecodeError::Invalid(format!("the field `card`: {TAMPERED}"))
    );

    let err = keys
        .decrypt(Uuid::new_v4(), &sent.payload, &sent.headers)
        .await
        .expect_err("another event");
    assert_eq!(
        err,
        DecodeError::Invalid(format!("the field `card`: {TAMPERED}"))
    );
}

#[tokio::test]
async fn fields_mode_rejects_a_payload_that_is_not_an_object_and_skips_one_without_the_fields() {
    let (_dir, _path, encryptor) = setup(&["card"]).await;

    let err = encryptor
        .apply(event(br#"["4111 secret"]"#))
        .await
        .expect_err("an array");
    assert_eq!(err.kind(), SinkErrorKind::Rejected);
    assert_eq!(
        err.to_string(),
        "encryption.fields is set and the payload is not a JSON object: its top level is \
         another JSON value"
    );

    let original = event(br#"{"total": 3}"#);
    let sent = encryptor.apply(original.clone()).await.expect("no field");
    assert_eq!(sent, original);
}

#[tokio::test]
async fn the_consumer_needs_the_right_key_and_known_headers() {
    let (dir, path, encryptor) = setup(&[]).await;
    let sent = encryptor.apply(event(b"x")).await.expect("encrypt");
    let key_id = header(&sent, header::ENCRYPTION_KEY_ID).expect("key id");

    let err = KeyRing::new()
        .decrypt(sent.id, &sent.payload, &sent.headers)
        .await
        .expect_err("no key");
    assert!(
        matches!(&err, DecodeError::NoKey(m) if m.contains(key_id)),
        "{err:?}"
    );

    let other = dir.path().join("other");
    std::fs::write(&other, [7u8; 32]).expect("write");
    let err = KeyRing::new()
        .with_key_file(&other)
        .expect("key ring")
        .decrypt(sent.id, &sent.payload, &sent.headers)
        .await
        .expect_err("another key");
    assert!(
        matches!(&err, DecodeError::NoKey(m) if m.contains(key_id)),
        "{err:?}"
    );

    let mut headers = sent.headers.clone();
    for (name, value) in &mut headers {
        if name == header::ENCRYPTION {
            *value = "rot13".into();
        }
    }
    let err = keyring(&path)
        .await
        .decrypt(sent.id, &sent.payload, &headers)
        .await
        .expect_err("unknown mode");
    assert!(
        matches!(&err, DecodeError::Invalid(m) if m.contains("rot13")),
        "{err:?}"
    );
}

/// A clock the test moves by hand.
fn manual_clock() -> (Clock, Arc<AtomicU64>) {
    let start = Instant::now();
    let offset = Arc::new(AtomicU64::new(0));
    let seconds = Arc::clone(&offset);
    let clock: Clock =
        Arc::new(move || start + Duration::from_secs(seconds.load(Ordering::SeqCst)));
    (clock, offset)
}

#[tokio::test]
async fn a_data_key_is_replaced_after_rotate() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = key_file(&dir);
    let mut config = config(&path);
    config.rotate = Duration::from_secs(60);
    let (clock, offset) = manual_clock();
    let encryptor = Encryptor::with_clock(&config, clock)
        .await
        .expect("connect");
    let data_key = |event: &Event| {
        header(event, header::ENCRYPTION_DATA_KEY)
            .expect("data key")
            .to_owned()
    };

    let first = data_key(&encryptor.apply(event(b"1")).await.expect("encrypt"));
    offset.store(59, Ordering::SeqCst);
    let same = encryptor.apply(event(b"2")).await.expect("encrypt");
    assert_eq!(data_key(&same), first, "still within rotate");
    // Each message still has its own nonce.
    let other = encryptor.apply(event(b"2")).await.expect("encrypt");
    assert_ne!(
        header(&same, header::ENCRYPTION_NONCE),
        header(&other, header::ENCRYPTION_NONCE)
    );

    offset.store(60, Ordering::SeqCst);
    let second = data_key(&encryptor.apply(event(b"3")).await.expect("encrypt"));
    assert_ne!(second, first, "rotated");
    offset.store(119, Ordering::SeqCst);
    assert_eq!(
        data_key(&encryptor.apply(event(b"4")).await.expect("encrypt")),
        second
    );

    // Both generations decrypt.
    let keys = keyring(&path).await;
    for offset_s in [0, 200] {
        offset.store(offset_s, Ordering::SeqCst);
        let sent = encryptor.apply(event(b"5")).await.expect("encrypt");
        let plain = keys
            .decrypt(sent.id, &sent.payload, &sent.headers)
            .await
            .expect("decrypt");
        assert_eq!(plain.as_deref(), Some(&b"5"[..]));
    }
}

#[test]
fn validate_names_the_key_and_the_problem() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = key_file(&dir);
    let good = config(&path);
    assert_eq!(good.validate(), Ok(()));

    let check = |change: &dyn Fn(&mut EncryptionConfig), prefix: &str| {
        let mut config = good.clone();
        change(&mut config);
        let err = config.validate().expect_err(prefix);
        assert!(err.starts_with(prefix), "{err}");
        err
    };
    check(&|c| c.key = "vault:x".into(), "key: `vault:x` must be");
    check(&|c| c.key = "file:".into(), "key: `file:` needs");
    check(&|c| c.key = "aws-kms:".into(), "key: ");
    check(
        &|c| c.key = format!("file:{}/missing", dir.path().display()),
        "key: cannot read",
    );
    check(
        &|c| c.rotate = Duration::from_millis(500),
        "rotate: must be at least 1s",
    );
    check(&|c| c.fields = vec!["a".into(), String::new()], "fields: ");
    check(
        &|c| c.fields = vec!["a".into(), "a".into()],
        "fields: `a` is listed twice",
    );
    check(
        &|c| c.fields = vec!["a,b".into()],
        "fields: `a,b` has a comma",
    );
    check(&|c| c.region = Some("eu-west-1".into()), "region: ");

    let bad = dir.path().join("bad");
    std::fs::write(&bad, "topsecretvalue\n").expect("write");
    let err = check(
        &|c| c.key = format!("file:{}", bad.display()),
        "key: the key file",
    );
    assert!(
        err.contains(&bad.display().to_string()) && err.contains("15 bytes"),
        "{err}"
    );
    assert!(!err.contains("topsecret"), "{err}");
}

#[cfg(feature = "aws")]
#[test]
fn validate_kms_keys() {
    let config = EncryptionConfig {
        key: "aws-kms:alias/outbox".into(),
        rotate: default_rotate(),
        fields: Vec::new(),
        region: Some("eu-west-1".into()),
        endpoint_url: Some("http://127.0.0.1:5000".into()),
    };
    assert_eq!(config.validate(), Ok(()));
    let mut bad = config.clone();
    bad.endpoint_url = Some("http://user:pw@127.0.0.1:5000".into());
    let err = bad.validate().expect_err("credentials in the url");
    assert!(
        err.starts_with("endpoint_url: ") && !err.contains("pw"),
        "{err}"
    );
    let mut bad = config;
    bad.region = Some("eu west".into());
    assert!(bad.validate().expect_err("region").starts_with("region: "));
}

#[cfg(not(feature = "aws"))]
#[test]
fn kms_keys_need_the_aws_feature() {
    let config = EncryptionConfig {
        key: "aws-kms:alias/outbox".into(),
        rotate: default_rotate(),
        fields: Vec::new(),
        region: None,
        endpoint_url: None,
    };
    let err = config.validate().expect_err("no aws");
    assert!(
        err.starts_with("key: ") && err.contains("`aws` feature"),
        "{err}"
    );
}

#[tokio::test]
async fn debug_output_holds_no_key_material() {
    let (_dir, path, encryptor) = setup(&["card"]).await;
    let config = &encryptor.config;
    encryptor
        .apply(event(br#"{"card":"4111"}"#))
        .await
        .expect("encrypt");
    let data_key = encryptor.data_key().await.expect("cached data key");
    let keys = keyring(&path).await;

    let hex_key = hex::encode(KEY);
    let b64_key = BASE64.encode(KEY);
    for text in [
        format!("{config:?}"),
        format!("{encryptor:?}"),
        format!("{keys:?}"),
        format!("{data_key:?}"),
    ] {
        assert!(
            !text.contains(&hex_key) && !text.contains(&b64_key),
            "{text}"
        );
        assert!(!text.contains("90, 90, 90"), "{text}"); // the key's bytes as a list
        assert!(!text.contains(&data_key.wrapped), "{text}");
    }
    assert!(format!("{encryptor:?}").contains(&config.key));
}

#[tokio::test]
async fn doctor_reads_the_key_file_again() {
    let (_dir, path, encryptor) = setup(&[]).await;
    let ok = encryptor.check().await.expect("check");
    assert!(ok.starts_with("data key from file:"), "{ok}");

    std::fs::write(&path, [9u8; 32]).expect("replace the key");
    let err = encryptor.check().await.expect_err("another key");
    assert_eq!(err.kind(), SinkErrorKind::Unavailable);
    assert!(err.to_string().contains("restart the relay"), "{err}");

    std::fs::remove_file(&path).expect("remove");
    let err = encryptor.check().await.expect_err("no file");
    assert!(
        err.to_string().contains("cannot read the key file"),
        "{err}"
    );
}
