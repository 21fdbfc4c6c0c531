//! How the checks judge what the consumer received.

use std::future::Future;
use std::time::Duration;

use anyhow::{bail, ensure};
use outbox_core::{Event, SinkError, message};

use super::{Received, SinkHarness, Target};

/// Every delivery is `Ok`, one per event of `batch`.
pub(super) fn expect_all_ok(
    deliveries: &[Result<(), SinkError>],
    batch: &[Event],
) -> anyhow::Result<()> {
    ensure!(
        deliveries.len() == batch.len(),
        "{} deliveries for {} events",
        deliveries.len(),
        batch.len()
    );
    for (d, e) in deliveries.iter().zip(batch) {
        if let Err(err) = d {
            bail!(
                "event {} was not delivered: {:?} {}",
                e.id,
                err.kind(),
                err.report()
            );
        }
    }
    Ok(())
}

/// True when `got` is a copy of `sent`: it carries `sent`'s event id, or, for a broker whose
/// messages have no headers, `sent`'s body under `sent`'s key.
pub(super) fn is_copy_of<H: SinkHarness>(h: &H, got: &Received, sent: &Event) -> bool {
    if h.carries_headers() {
        got.header("id") == Some(sent.id.to_string().as_str())
    } else {
        got.body == sent.payload && got.key.as_deref() == Some(sent.aggregate_id.as_str())
    }
}

/// What tells copies of one event apart from other events: the `id` header, or key and body.
pub(super) fn identity<H: SinkHarness>(h: &H, got: &Received) -> String {
    if h.carries_headers() {
        got.header("id").unwrap_or_default().to_owned()
    } else {
        format!("{:?}/{:?}", got.key, got.body)
    }
}

/// The one message that is a copy of `sent` (an error for none or several).
pub(super) fn find_one<'r, H: SinkHarness>(
    h: &H,
    received: &'r [Received],
    sent: &Event,
) -> anyhow::Result<&'r Received> {
    let copies: Vec<&Received> = received.iter().filter(|r| is_copy_of(h, r, sent)).collect();
    match copies.as_slice() {
        [one] => Ok(one),
        [] => bail!(
            "no message with id {} ({}); the consumer got: {:#?}",
            sent.id,
            sent.aggregate_id,
            received
        ),
        many => bail!("{} messages with id {}", many.len(), sent.id),
    }
}

/// Body, destination, contract and row headers, and key of `got` are what `sent` says.
pub(super) fn check_message<H: SinkHarness>(
    h: &H,
    target: &Target,
    sent: &Event,
    got: &Received,
) -> anyhow::Result<()> {
    let what = format!("event {} ({})", sent.id, sent.aggregate_id);
    ensure!(
        got.body == sent.payload,
        "{what}: body {:?} is not the payload {:?}",
        got.body,
        sent.payload
    );
    let destination = target.template.render(sent);
    ensure!(
        got.destination == destination,
        "{what}: destination `{}`, expected `{destination}`",
        got.destination
    );
    let headers = if h.carries_headers() {
        message::headers(sent)
    } else {
        Vec::new()
    };
    for (name, value) in headers {
        let values = got.header_values(&name);
        ensure!(
            values == [value.as_str()],
            "{what}: header `{name}` should be exactly once `{value}`, got {values:?} (all \
             headers: {:?})",
            got.headers
        );
    }
    let expected_key = h.keyed().then(|| sent.aggregate_id.clone());
    ensure!(
        got.key == expected_key,
        "{what}: key {:?}, expected {expected_key:?}",
        got.key
    );
    Ok(())
}

/// For every aggregate of `sent`, the consumer's messages of that aggregate come in the order
/// they were sent.
pub(super) fn check_order<H: SinkHarness>(
    h: &H,
    received: &[Received],
    sent: &[Event],
) -> anyhow::Result<()> {
    // The sent event each message is a copy of, in the consumer's order.
    let arrived: Vec<&Event> = received
        .iter()
        .filter_map(|r| sent.iter().find(|e| is_copy_of(h, r, e)))
        .collect();
    let mut keys: Vec<(&str, &str)> = Vec::new();
    for e in sent {
        let key = (e.aggregate_type.as_str(), e.aggregate_id.as_str());
        if !keys.contains(&key) {
            keys.push(key);
        }
    }
    for (aggregate_type, aggregate_id) in keys {
        let of_aggregate =
            |e: &&Event| e.aggregate_type == aggregate_type && e.aggregate_id == aggregate_id;
        let expected: Vec<String> = sent
            .iter()
            .filter(of_aggregate)
            .map(|e| e.id.to_string())
            .collect();
        let got: Vec<String> = arrived
            .iter()
            .copied()
            .filter(of_aggregate)
            .map(|e| e.id.to_string())
            .collect();
        ensure!(
            got == expected,
            "events of {aggregate_type} {aggregate_id} arrived as {got:?}, sent as {expected:?}"
        );
    }
    Ok(())
}

/// Calls `f` until it fails (returning the error), for at most `timeout`.
pub(super) async fn eventually_err<F, Fut>(timeout: Duration, mut f: F) -> anyhow::Result<SinkError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<(), SinkError>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Err(e) = f().await {
            return Ok(e);
        }
        if tokio::time::Instant::now() >= deadline {
            bail!("still Ok after {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Calls `f` until it succeeds, for at most `timeout`.
pub(super) async fn eventually_ok<F, Fut>(timeout: Duration, mut f: F) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<(), SinkError>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        match f().await {
            Ok(()) => return Ok(()),
            Err(e) if tokio::time::Instant::now() >= deadline => {
                bail!("still failing after {timeout:?}: {}", e.report())
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}
