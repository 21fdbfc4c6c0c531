//! Envelope encryption against moto's KMS (`moto_server`, see outbox-testkit): the relay's
//! `Encryptor` with `aws-kms:` keys, the consumer's `KeyRing`, and a Python consumer
//! (tests/support/decrypt.py: boto3 and cryptography only, written from docs/payloads.md).
#![cfg(feature = "aws")]

use std::path::Path;

use aws_config::{BehaviorVersion, Region};
use aws_sdk_kms::Client;
use base64::Engine as _;
use bytes::Bytes;
use outbox_core::{Event, Position, SinkError, SinkErrorKind};
use outbox_payload::DecodeError;
use outbox_payload::encryption::{EncryptionConfig, Encryptor, KeyRing};
use outbox_testkit::services::Moto;
use tokio::io::AsyncWriteExt as _;
use uuid::Uuid;

const BASE64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

/// A client of moto's KMS, for creating and disabling keys.
async fn kms(moto: &Moto) -> Client {
    let sdk = aws_config::defaults(BehaviorVersion::latest())
        .region(Region::new(Moto::REGION))
        .endpoint_url(moto.url())
        .load()
        .await;
    Client::new(&sdk)
}

/// A new symmetric key: its id and ARN.
async fn create_key(client: &Client) -> anyhow::Result<(String, String)> {
    let created = client.create_key().send().await?;
    let metadata = created
        .key_metadata()
        .ok_or_else(|| anyhow::anyhow!("CreateKey answered without metadata"))?;
    let arn = metadata
        .arn()
        .ok_or_else(|| anyhow::anyhow!("CreateKey answered without an ARN"))?;
    Ok((metadata.key_id().to_owned(), arn.to_owned()))
}

fn config(moto: &Moto, key_id: &str, fields: &[&str]) -> EncryptionConfig {
    EncryptionConfig {
        key: format!("aws-kms:{key_id}"),
        rotate: std::time::Duration::from_secs(3600),
        fields: fields.iter().map(|f| (*f).to_owned()).collect(),
        region: Some(Moto::REGION.into()),
        endpoint_url: Some(moto.url().to_owned()),
    }
}

fn event(payload: &[u8]) -> Event {
    Event {
        id: Uuid::now_v7(),
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
    event
        .headers
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
}

/// The error of an operation that must be `Unavailable`.
fn unavailable<T: std::fmt::Debug>(result: Result<T, SinkError>) -> SinkError {
    match result {
        Err(e) if e.kind() == SinkErrorKind::Unavailable => e,
        other => panic!("expected Unavailable, got {other:?}"),
    }
}

/// What tests/support/decrypt.py prints for `event`, with `env` added to its environment.
async fn python_decrypt(event: &Event, env: &[(&str, &str)]) -> anyhow::Result<Vec<u8>> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/decrypt.py");
    run_python(&script, event, env).await
}

/// What the Python `script` prints for `event` as JSON on its stdin.
async fn run_python(script: &Path, event: &Event, env: &[(&str, &str)]) -> anyhow::Result<Vec<u8>> {
    let headers: serde_json::Map<String, serde_json::Value> = event
        .headers
        .iter()
        .map(|(n, v)| (n.clone(), serde_json::Value::String(v.clone())))
        .collect();
    let message = serde_json::json!({
        "id": event.id.to_string(),
        "payload": BASE64.encode(&event.payload),
        "headers": headers,
    });
    let mut child = tokio::process::Command::new("python3")
        .arg(script)
        .envs(env.iter().copied())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let mut stdin = child
        .stdin
        .take()
        .ok_or_else(|| anyhow::anyhow!("no stdin"))?;
    stdin.write_all(message.to_string().as_bytes()).await?;
    drop(stdin);
    let output = child.wait_with_output().await?;
    anyhow::ensure!(
        output.status.success(),
        "{} failed ({}): {}",
        script.display(),
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(output.stdout)
}

#[tokio::test]
async fn a_kms_encrypted_payload_is_decrypted_by_the_key_ring_and_by_a_python_consumer()
-> anyhow::Result<()> {
    Moto::set_aws_env();
    let moto = Moto::shared().await?;
    let (key_id, arn) = create_key(&kms(moto).await).await?;
    let encryptor = Encryptor::connect(&config(moto, &key_id, &[])).await?;

    assert_eq!(encryptor.check().await?, format!("data key from {arn}"));

    let plain = br#"{"card":"4111 1111 1111 1111","total":12}"#;
    let sent = encryptor.apply(event(plain)).await?;
    assert_eq!(header(&sent, "encryption"), Some("aes-256-gcm"));
    assert_eq!(header(&sent, "encryption_key_id"), Some(arn.as_str()));
    assert_eq!(header(&sent, "trace"), Some("t-1"));
    assert!(!sent.payload.windows(4).any(|w| w == b"4111"));

    let keys = KeyRing::new()
        .with_kms(Some(Moto::REGION), Some(moto.url()))
        .await;
    let decrypted = keys.decrypt(sent.id, &sent.payload, &sent.headers).await?;
    assert_eq!(decrypted.as_deref(), Some(&plain[..]));

    // Moved to another event: the AAD no longer matches.
    let moved = keys
        .decrypt(Uuid::now_v7(), &sent.payload, &sent.headers)
        .await;
    assert!(matches!(moved, Err(DecodeError::Invalid(_))), "{moved:?}");

    let by_python = python_decrypt(&sent, &[("AWS_ENDPOINT_URL", moto.url())]).await?;
    assert_eq!(by_python, plain);
    Ok(())
}

#[tokio::test]
async fn kms_encrypted_fields_are_decrypted_by_the_key_ring_and_by_a_python_consumer()
-> anyhow::Result<()> {
    Moto::set_aws_env();
    let moto = Moto::shared().await?;
    let (key_id, _) = create_key(&kms(moto).await).await?;
    let encryptor = Encryptor::connect(&config(moto, &key_id, &["card", "email"])).await?;

    let plain = br#"{"status":"paid","card":{"number":"4111","exp":"12/29"},"email":"a@b.example","total":12}"#;
    let sent = encryptor.apply(event(plain)).await?;
    assert_eq!(header(&sent, "encryption"), Some("aes-256-gcm-fields"));
    assert_eq!(header(&sent, "encryption_fields"), Some("card,email"));
    let body: serde_json::Value = serde_json::from_slice(&sent.payload)?;
    assert_eq!(body["status"], "paid", "routing on the rest still works");
    assert!(body["card"]["enc"].is_string() && body["email"]["enc"].is_string());

    let keys = KeyRing::new()
        .with_kms(Some(Moto::REGION), Some(moto.url()))
        .await;
    let decrypted = keys.decrypt(sent.id, &sent.payload, &sent.headers).await?;
    assert_eq!(decrypted.as_deref(), Some(&plain[..]));

    let by_python = python_decrypt(&sent, &[("AWS_ENDPOINT_URL", moto.url())]).await?;
    let expected: serde_json::Value = serde_json::from_slice(plain)?;
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&by_python)?,
        expected
    );
    Ok(())
}

/// The Python example of docs/payloads.md ("Reading it as a consumer"), run as it is written
/// there, on a KMS message of each mode.
#[tokio::test]
async fn the_python_example_in_the_docs_decrypts_kms_messages() -> anyhow::Result<()> {
    let docs = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/payloads.md"),
    )?;
    let section = docs
        .split_once("\n## Encryption\n")
        .map(|(_, rest)| rest)
        .ok_or_else(|| anyhow::anyhow!("docs/payloads.md has no Encryption section"))?;
    let example = section
        .split_once("```python\n")
        .and_then(|(_, rest)| rest.split_once("```"))
        .map(|(code, _)| code)
        .ok_or_else(|| anyhow::anyhow!("the Encryption section has no Python example"))?;
    let dir = tempfile::tempdir()?;
    let script = dir.path().join("docs_example.py");
    std::fs::write(
        &script,
        format!(
            "{example}\n\
             import sys\n\
             message = json.load(sys.stdin)\n\
             sys.stdout.buffer.write(decrypt(message['id'], \
             base64.b64decode(message['payload']), message['headers']))\n"
        ),
    )?;

    Moto::set_aws_env();
    let moto = Moto::shared().await?;
    let (key_id, _) = create_key(&kms(moto).await).await?;
    let env = [("AWS_ENDPOINT_URL", moto.url())];
    let plain = br#"{"card":"4111","email":"a@b.example","total":12}"#;

    let whole = Encryptor::connect(&config(moto, &key_id, &[])).await?;
    let sent = whole.apply(event(plain)).await?;
    assert_eq!(run_python(&script, &sent, &env).await?, plain);

    let fields = Encryptor::connect(&config(moto, &key_id, &["card"])).await?;
    let sent = fields.apply(event(plain)).await?;
    let by_python: serde_json::Value =
        serde_json::from_slice(&run_python(&script, &sent, &env).await?)?;
    assert_eq!(
        by_python,
        serde_json::from_slice::<serde_json::Value>(plain)?
    );
    Ok(())
}

/// The docs' file-key steps, in Python too.
#[tokio::test]
async fn a_file_key_payload_is_decrypted_by_a_python_consumer() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("key");
    std::fs::write(&path, format!("{}\n", BASE64.encode([0x42u8; 32])))?;
    let config = EncryptionConfig {
        key: format!("file:{}", path.display()),
        rotate: std::time::Duration::from_secs(3600),
        fields: Vec::new(),
        region: None,
        endpoint_url: None,
    };
    let encryptor = Encryptor::connect(&config).await?;
    let sent = encryptor.apply(event(b"plain text, not JSON")).await?;
    let path = path.display().to_string();
    let by_python = python_decrypt(&sent, &[("OUTBOX_KEY_FILE", &path)]).await?;
    assert_eq!(by_python, b"plain text, not JSON");
    Ok(())
}

#[tokio::test]
async fn kms_that_cannot_be_reached_is_unavailable() -> anyhow::Result<()> {
    Moto::set_aws_env();
    let moto = Moto::start().await?;
    let (key_id, _) = create_key(&kms(&moto).await).await?;
    let config = config(&moto, &key_id, &[]);
    let encryptor = Encryptor::connect(&config).await?;
    let sent = encryptor.apply(event(b"before the outage")).await?;

    moto.stop().await?;

    // A relay that has no data key yet cannot encrypt: Unavailable, never a dead letter.
    let fresh = Encryptor::connect(&config).await?;
    let err = unavailable(fresh.apply(event(b"during the outage")).await);
    assert!(err.to_string().contains("cannot reach KMS"), "{err}");
    let err = unavailable(fresh.check().await);
    assert!(err.to_string().contains(&key_id), "{err}");

    // The relay that has one goes on with it until `rotate`.
    encryptor.apply(event(b"cached data key")).await?;

    // A consumer that never unwrapped this data key must wait.
    let keys = KeyRing::new()
        .with_kms(Some(Moto::REGION), Some(moto.url()))
        .await;
    let answer = keys.decrypt(sent.id, &sent.payload, &sent.headers).await;
    assert!(
        matches!(answer, Err(DecodeError::Unavailable(_))),
        "{answer:?}"
    );
    Ok(())
}

/// A key KMS does not have. (moto 5.2 does not refuse `GenerateDataKey` on a disabled key nor
/// enforce IAM, so `DisabledException` and `AccessDeniedException` are checked by the unit
/// tests of the error mapping in src/encryption/kms.rs.)
#[tokio::test]
async fn a_missing_kms_key_is_unavailable_and_named() -> anyhow::Result<()> {
    Moto::set_aws_env();
    let moto = Moto::shared().await?;
    let missing = format!("alias/missing-{}", Uuid::new_v4().simple());
    let encryptor = Encryptor::connect(&config(moto, &missing, &[])).await?;
    let err = unavailable(encryptor.apply(event(b"x")).await);
    assert!(
        err.to_string()
            .starts_with(&format!("KMS has no key {missing} (NotFoundException")),
        "{err}"
    );
    let err = unavailable(encryptor.check().await);
    assert!(err.to_string().contains(&missing), "{err}");
    Ok(())
}
