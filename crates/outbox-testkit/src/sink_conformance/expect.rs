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

/// True when `got` carries the event id of `sent`.
pub(super) fn is_copy_of(got: &Received, sent: &Event) -> bool {
    got.header("id") == Some(sent.id.to_string().as_str())
}

/// The one message carrying `sent`'s id (an error for none or several).
pub(super) fn find_one<'r>(received: &'r [Received], sent: &Event) -> anyhow::Result<&'r Received> {
    let copies: Vec<&Received> = received.iter().filter(|r| is_copy_of(r, sent)).collect();
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
    for (name, value) in message::headers(sent) {
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

/// For every aggregate of `sent`, the consumer's messages of that aggregate (by header) come
/// in the order they were sent.
pub(super) fn check_order(received: &[Received], sent: &[Event]) -> anyhow::Result<()> {
    let mut keys: Vec<(&str, &str)> = Vec::new();
    for e in sent {
        let key = (e.aggregate_type.as_str(), e.aggregate_id.as_str());
        if !keys.contains(&key) {
            keys.push(key);
        }
    }
    for (aggregate_type, aggregate_id) in keys {
        let expected: Vec<String> = sent
            .iter()
            .filter(|e| e.aggregate_type == aggregate_type && e.aggregate_id == aggregate_id)
            .map(|e| e.id.to_string())
            .collect();
        let got: Vec<&str> = received
            .iter()
            .filter(|r| {
                r.header("aggregate_type") == Some(aggregate_type)
                    && r.header("aggregate_id") == Some(aggregate_id)
            })
            .filter_map(|r| r.header("id"))
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
