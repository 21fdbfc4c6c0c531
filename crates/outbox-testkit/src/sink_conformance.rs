//! The sink conformance suite: what every outbox sink must do, checked against the real broker
//! as a real consumer of that broker sees it. A sink's test implements [`SinkHarness`] and
//! calls [`run_all`]; adding a sink adds one call.
//!
//! | check | what must hold |
//! | --- | --- |
//! | [`an_empty_batch_publishes_nothing`] | `publish(&[])` is `Ok(vec![])` |
//! | [`messages_carry_exact_bytes_headers_and_key`] | body = payload bytes exactly (binary, empty, JSON); headers `id`, `event_type`, `aggregate_type`, `aggregate_id` and the row's own, `traceparent` / `tracestate` among them (a row header cannot spoof `id`); key = `aggregate_id` where the broker has keys |
//! | [`the_destination_template_is_rendered_per_event`] | `{aggregate_type}`, `{event_type}` and `{aggregate_id}` each land where the template says |
//! | [`events_of_one_aggregate_keep_their_order_across_batches`] | per-key order over several batches, several aggregates and destinations |
//! | [`an_oversized_message_is_rejected_while_the_rest_flow`] | a body over the broker's limit is `Rejected` with a reason; the other events of the batch are delivered |
//! | [`publishing_an_event_twice_is_harmless`] | both publishes succeed; the consumer sees one copy (broker deduplicates) or two with the same `id` |
//! | [`a_broker_outage_fails_whole_batches_and_loses_nothing`] | with the broker down, the healthcheck fails naming the broker and a publish fails as a whole with `Unavailable`; after a restart the healthcheck passes, republishing succeeds, and everything acknowledged before (for a [durable](SinkHarness::durable) broker) and after is there, in order |
//!
//! Destinations: each check publishes under a fresh scope (a unique first segment such as
//! `t1f0c2a9e`) with templates like `{scope}.event.{aggregate_type}`, and tells the harness in a
//! [`Target`] every destination it will render, so that the harness can prepare what a
//! consumer needs (Kafka topics, a bound queue, a stream covering them) before publishing.

mod expect;
mod fixture;

use std::future::Future;
use std::time::Duration;

use anyhow::{Context, bail, ensure};
use bytes::Bytes;
use outbox_core::{Destination, Event, Sink, SinkErrorKind};

use expect::{
    check_message, check_order, eventually_err, eventually_ok, expect_all_ok, find_one, identity,
    is_copy_of,
};
use fixture::{event, target};

/// Where one check publishes: the template the sink is built with, and every destination the
/// check's events render to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// Unique to this check: the first `.`-separated segment of every destination. Lower-case
    /// letters and digits only, so it is valid in any broker's names.
    pub scope: String,
    /// The destination template to build the sink with (starts with `{scope}.`).
    pub template: Destination,
    /// Every destination the check's events render to, deduplicated, in first-use order.
    pub destinations: Vec<String>,
}

/// Whether the broker itself drops a republished event (same event id).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dedupe {
    /// Stored once (NATS JetStream `Nats-Msg-Id` within the stream's duplicate window).
    ByEventId,
    /// Stored twice; consumers deduplicate by the `id` header (Redis, RabbitMQ, Kafka
    /// without transactions, HTTP).
    No,
}

/// One message as a real consumer of the broker received it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Received {
    /// Where it was published: subject, stream key, routing key, topic, URL path without the
    /// leading `/` (exactly what the template rendered to).
    pub destination: String,
    /// The message key, for brokers that have one (Kafka); `None` otherwise.
    pub key: Option<String>,
    /// The message headers with any transport prefix removed (`outbox-` for HTTP, `h:` for
    /// Redis row headers), in the order the consumer saw them. Headers the broker or the sink
    /// adds on its own (`Nats-Msg-Id`, `webhook-*`, `content-type`) may be included.
    pub headers: Vec<(String, String)>,
    /// The body bytes exactly as received.
    pub body: Bytes,
}

impl Received {
    /// Every value of header `name` (exact name match).
    pub fn header_values(&self, name: &str) -> Vec<&str> {
        self.headers
            .iter()
            .filter(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
            .collect()
    }

    /// The first value of header `name`.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.header_values(name).into_iter().next()
    }
}

/// One sink against one real broker, as the suite needs it.
///
/// The harness owns a broker it may stop and restart (a private server, not a shared one),
/// builds sinks against it, and reads back what a consumer of that broker receives.
pub trait SinkHarness: Send + Sync {
    /// The sink under test.
    type Sink: Sink;

    /// Builds a sink publishing with `target.template`, after preparing whatever a consumer
    /// needs to receive messages at every one of `target.destinations` (create the topics,
    /// bind a durable queue, make sure a stream covers them). Set the sink's timeouts short
    /// (a few seconds): the outage check waits for them.
    fn sink(&self, target: &Target) -> impl Future<Output = anyhow::Result<Self::Sink>> + Send;

    /// Everything a consumer can read from `target.destinations` now, after waiting (up to
    /// about 10 s) until at least `at_least` messages are there. Messages of one destination
    /// come in the broker's order (per partition, for partitioned brokers). Reading must not
    /// consume them for the next call: each call returns everything from the start.
    fn received(
        &self,
        target: &Target,
        at_least: usize,
    ) -> impl Future<Output = anyhow::Result<Vec<Received>>> + Send;

    /// Stops the broker (an outage: clients lose their connections).
    fn stop_broker(&self) -> impl Future<Output = anyhow::Result<()>> + Send;

    /// Starts the broker again on the same address with the same data, and waits until it is
    /// ready. A broker that loses its state on restart (see [`durable`](Self::durable)) must
    /// get back here whatever [`sink`](Self::sink) prepared for the targets so far (topics,
    /// say), as an operator would recreate them.
    fn restart_broker(&self) -> impl Future<Output = anyhow::Result<()>> + Send;

    /// Text that a healthcheck failure must contain so an operator knows what is down,
    /// usually `127.0.0.1:PORT`.
    fn broker_address(&self) -> String;

    /// The largest body the broker (or the sink as configured by [`sink`](Self::sink))
    /// accepts, in bytes. The suite publishes `max_message_size() + 1` bytes and expects
    /// `Rejected`; it never publishes anything near the limit otherwise.
    fn max_message_size(&self) -> usize;

    /// Whether the broker drops a republished event.
    fn dedupe(&self) -> Dedupe;

    /// What the suite puts between the literal parts of its destination templates: `.` by
    /// default; `-` for a service whose names cannot hold a dot (SQS queues, SNS topics).
    /// With any other separator, the event types of the template check have no dot either.
    fn separator(&self) -> char {
        '.'
    }

    /// Whether messages carry headers. Kinesis records carry only data and a partition key:
    /// then the suite checks no headers and tells events apart by key and body (every check
    /// publishes distinct bodies), and the harness must be [`keyed`](Self::keyed).
    fn carries_headers(&self) -> bool {
        true
    }

    /// Whether messages carry a key (Kafka); then it must be `aggregate_id`.
    fn keyed(&self) -> bool {
        false
    }

    /// Whether messages acknowledged before [`stop_broker`](Self::stop_broker) are still
    /// there after [`restart_broker`](Self::restart_broker). `false` for a broker without
    /// persistence (tansu with memory storage): the outage check then requires only what was
    /// acknowledged after the restart.
    fn durable(&self) -> bool {
        true
    }
}

/// How long the outage check waits for the sink to notice an outage or a recovery.
const RECOVERY: Duration = Duration::from_secs(30);

/// Runs every check in turn; the error names the failing check.
pub async fn run_all<H: SinkHarness>(harness: &H) -> anyhow::Result<()> {
    macro_rules! check {
        ($name:ident) => {
            tracing::info!(check = stringify!($name), "sink conformance");
            $name(harness).await.context(concat!(
                "sink conformance check `",
                stringify!($name),
                "`"
            ))?;
        };
    }
    check!(an_empty_batch_publishes_nothing);
    check!(messages_carry_exact_bytes_headers_and_key);
    check!(the_destination_template_is_rendered_per_event);
    check!(events_of_one_aggregate_keep_their_order_across_batches);
    check!(an_oversized_message_is_rejected_while_the_rest_flow);
    check!(publishing_an_event_twice_is_harmless);
    check!(a_broker_outage_fails_whole_batches_and_loses_nothing);
    Ok(())
}

/// `publish(&[])` returns no deliveries and sends nothing.
pub async fn an_empty_batch_publishes_nothing<H: SinkHarness>(h: &H) -> anyhow::Result<()> {
    let target = target(
        h,
        "{scope}.event.{aggregate_type}",
        &[event("Order", "o_1", "")],
    )?;
    let sink = h.sink(&target).await?;
    let deliveries = sink.publish(&[]).await.context("publishing nothing")?;
    ensure!(
        deliveries.is_empty(),
        "deliveries for no events: {deliveries:?}"
    );
    Ok(())
}

/// Body, headers and key of every message are exactly what the contract says.
pub async fn messages_carry_exact_bytes_headers_and_key<H: SinkHarness>(
    h: &H,
) -> anyhow::Result<()> {
    let mut batch = vec![
        event(
            "Order",
            "o_1",
            &br#"{"order_id":"o_1","total_cents":1250}"#[..],
        ),
        event("Invoice", "i_1", &b"\x00\xffbinary\r\n\x7fbytes\x00"[..]),
        event("Order", "o_2", Bytes::new()),
        event("Order", "o_3", "caf\u{e9} \u{1f4e6} utf-8"),
    ];
    // W3C trace context travels like any row header (docs/observability.md, "Traces").
    batch[1].headers = vec![
        ("tenant".to_owned(), "acme".to_owned()),
        ("trace-id".to_owned(), "4bf92f3577b34da6".to_owned()),
        (
            "traceparent".to_owned(),
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".to_owned(),
        ),
        ("tracestate".to_owned(), "congo=t61rcWkgMzE".to_owned()),
    ];
    // A row header named like a contract header must not override it.
    batch[2].headers = vec![
        ("id".to_owned(), "spoofed".to_owned()),
        ("tenant".to_owned(), "globex".to_owned()),
    ];
    let target = target(h, "{scope}.event.{aggregate_type}", &batch)?;
    let sink = h.sink(&target).await?;
    expect_all_ok(&sink.publish(&batch).await?, &batch)?;

    let received = h.received(&target, batch.len()).await?;
    ensure!(
        received.len() == batch.len(),
        "expected {} messages, the consumer got {}: {received:#?}",
        batch.len(),
        received.len()
    );
    for sent in &batch {
        let got = find_one(h, &received, sent)?;
        check_message(h, &target, sent, got)?;
    }
    Ok(())
}

/// Each placeholder of the template is rendered from its own field of the event.
pub async fn the_destination_template_is_rendered_per_event<H: SinkHarness>(
    h: &H,
) -> anyhow::Result<()> {
    let mut batch = vec![
        event("Order", "o_1", "1"),
        event("Order", "o_2", "2"),
        event("Invoice", "i_1", "3"),
    ];
    batch[1].event_type = "order.shipped".to_owned();
    let sep = h.separator();
    if sep != '.' {
        for e in &mut batch {
            e.event_type = e.event_type.replace('.', "_");
        }
    }
    let target = target(
        h,
        "{scope}.{aggregate_type}.{event_type}.{aggregate_id}",
        &batch,
    )?;
    let sink = h.sink(&target).await?;
    expect_all_ok(&sink.publish(&batch).await?, &batch)?;
    let received = h.received(&target, batch.len()).await?;
    for sent in &batch {
        let got = find_one(h, &received, sent)?;
        let expected = format!(
            "{}{sep}{}{sep}{}{sep}{}",
            target.scope, sent.aggregate_type, sent.event_type, sent.aggregate_id
        );
        ensure!(
            got.destination == expected,
            "event {} went to `{}`, the template `{}` says `{expected}`",
            sent.id,
            got.destination,
            target.template
        );
    }
    Ok(())
}

/// Several batches, each with one event per aggregate (as the relay sends them when ordering
/// is on): every aggregate's events reach the consumer in publish order.
pub async fn events_of_one_aggregate_keep_their_order_across_batches<H: SinkHarness>(
    h: &H,
) -> anyhow::Result<()> {
    const ROUNDS: usize = 6;
    let aggregates = [
        ("Order", "o_1"),
        ("Order", "o_2"),
        ("Order", "o_3"),
        ("Invoice", "i_1"),
    ];
    let batches: Vec<Vec<Event>> = (0..ROUNDS)
        .map(|round| {
            aggregates
                .iter()
                .map(|(t, id)| event(t, id, format!("{id}#{round}")))
                .collect()
        })
        .collect();
    let all: Vec<Event> = batches.iter().flatten().cloned().collect();
    let target = target(h, "{scope}.event.{aggregate_type}", &all)?;
    let sink = h.sink(&target).await?;
    for batch in &batches {
        expect_all_ok(&sink.publish(batch).await?, batch)?;
    }
    let received = h.received(&target, all.len()).await?;
    ensure!(
        received.len() == all.len(),
        "expected {} messages, the consumer got {}",
        all.len(),
        received.len()
    );
    check_order(h, &received, &all)
}

/// A body one byte over the broker's limit is rejected with a reason; the other events of the
/// same batch are delivered.
pub async fn an_oversized_message_is_rejected_while_the_rest_flow<H: SinkHarness>(
    h: &H,
) -> anyhow::Result<()> {
    let too_big = h.max_message_size() + 1;
    let batch = vec![
        event("Order", "o_1", "small before"),
        event("Order", "o_2", vec![b'x'; too_big]),
        event("Order", "o_3", "small after"),
    ];
    let target = target(h, "{scope}.event.{aggregate_type}", &batch)?;
    let sink = h.sink(&target).await?;
    let deliveries = sink
        .publish(&batch)
        .await
        .context("an oversized event must not fail the whole batch")?;
    ensure!(
        deliveries.len() == 3,
        "{} deliveries for 3 events",
        deliveries.len()
    );
    ensure!(
        deliveries[0].is_ok() && deliveries[2].is_ok(),
        "the small events must be delivered: {deliveries:?}"
    );
    let err = match &deliveries[1] {
        Ok(()) => bail!(
            "a {too_big}-byte body was acknowledged, over the limit of {}",
            h.max_message_size()
        ),
        Err(e) => e,
    };
    ensure!(
        err.kind() == SinkErrorKind::Rejected,
        "an oversized message must be Rejected (dead-lettered at once), got {:?}: {}",
        err.kind(),
        err.report()
    );
    tracing::info!(reason = %err.report(), "oversized message rejected");
    let reason = err.report().to_ascii_lowercase();
    ensure!(
        ["limit", "large", "size", "exceed", "413"]
            .iter()
            .any(|w| reason.contains(w)),
        "the reason should say the message is too large: `{}`",
        err.report()
    );

    let received = h.received(&target, 2).await?;
    let bodies: Vec<&[u8]> = received.iter().map(|r| &r.body[..]).collect();
    ensure!(
        bodies == [&b"small before"[..], &b"small after"[..]],
        "the consumer should get exactly the two small messages, got {} messages: {:?}",
        received.len(),
        received
            .iter()
            .map(|r| (r.destination.as_str(), r.body.len()))
            .collect::<Vec<_>>()
    );
    // The sink still works after the refusal (a broker may have closed a channel over it).
    let after = [event("Order", "o_4", "later")];
    expect_all_ok(&sink.publish(&after).await?, &after)?;
    Ok(())
}

/// Publishing the same event twice succeeds both times; the consumer sees it once when the
/// broker deduplicates, else twice with the same `id`.
pub async fn publishing_an_event_twice_is_harmless<H: SinkHarness>(h: &H) -> anyhow::Result<()> {
    let e = event("Order", "o_1", "once");
    let target = target(
        h,
        "{scope}.event.{aggregate_type}",
        std::slice::from_ref(&e),
    )?;
    let sink = h.sink(&target).await?;
    for attempt in 1..=2 {
        let deliveries = sink.publish(std::slice::from_ref(&e)).await?;
        ensure!(
            matches!(deliveries.as_slice(), [Ok(())]),
            "publish #{attempt} of the same event: {deliveries:?}"
        );
    }
    let copies = match h.dedupe() {
        Dedupe::ByEventId => 1,
        Dedupe::No => 2,
    };
    let received = h.received(&target, copies).await?;
    ensure!(
        received.len() == copies,
        "expected {copies} copies ({:?}), the consumer got {}",
        h.dedupe(),
        received.len()
    );
    for got in &received {
        ensure!(
            is_copy_of(h, got, &e) && got.body == e.payload,
            "every copy carries the same id and body: {got:?}"
        );
    }
    Ok(())
}

/// Broker down: the healthcheck names it and a batch fails as a whole with `Unavailable`.
/// Broker back: the healthcheck passes, republishing succeeds, and the consumer has every
/// acknowledged event, in per-key order.
pub async fn a_broker_outage_fails_whole_batches_and_loses_nothing<H: SinkHarness>(
    h: &H,
) -> anyhow::Result<()> {
    let before: Vec<Event> = ["o_1", "o_2"]
        .iter()
        .map(|id| event("Order", id, format!("{id} before")))
        .collect();
    let during: Vec<Event> = ["o_1", "o_2"]
        .iter()
        .map(|id| event("Order", id, format!("{id} during")))
        .collect();
    let after: Vec<Event> = ["o_1", "o_2"]
        .iter()
        .map(|id| event("Order", id, format!("{id} after")))
        .collect();
    let all: Vec<Event> = [&before[..], &during[..], &after[..]].concat();
    let target = target(h, "{scope}.event.{aggregate_type}", &all)?;
    let sink = h.sink(&target).await?;
    sink.healthcheck()
        .await
        .context("healthcheck with the broker up")?;
    expect_all_ok(&sink.publish(&before).await?, &before)?;

    h.stop_broker().await.context("stopping the broker")?;
    let down = eventually_err(RECOVERY, || sink.healthcheck())
        .await
        .context("the healthcheck still passes with the broker stopped")?;
    ensure!(
        down.kind() == SinkErrorKind::Unavailable,
        "healthcheck with the broker down: {:?} `{}`",
        down.kind(),
        down.report()
    );
    tracing::info!(error = %down.report(), "healthcheck with the broker down");
    let address = h.broker_address();
    ensure!(
        down.report().contains(&address),
        "the healthcheck failure should name the broker ({address}): `{}`",
        down.report()
    );
    match sink.publish(&during).await {
        Err(e) if e.kind() == SinkErrorKind::Unavailable => {
            tracing::info!(error = %e.report(), "publish with the broker down");
        }
        Err(e) => bail!(
            "publish with the broker down: whole batch {:?}, expected Unavailable: {}",
            e.kind(),
            e.report()
        ),
        Ok(deliveries) => bail!(
            "publish with the broker down must fail the whole batch with Unavailable, got \
             per-event results {deliveries:?}"
        ),
    }

    h.restart_broker().await.context("restarting the broker")?;
    eventually_ok(RECOVERY, || sink.healthcheck())
        .await
        .context("the healthcheck never passed after the broker restarted")?;
    // As the relay would: republish what was not acknowledged until it is.
    for batch in [&during, &after] {
        let deadline = tokio::time::Instant::now() + RECOVERY;
        loop {
            match sink.publish(batch).await {
                Ok(d) if d.iter().all(Result::is_ok) => break,
                result if tokio::time::Instant::now() >= deadline => {
                    bail!("republishing after the restart still fails: {result:?}")
                }
                _ => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
    }

    // What the consumer must have: everything, or what was published after the restart when
    // the broker forgets its data.
    let kept: Vec<Event> = if h.durable() {
        all
    } else {
        [&during[..], &after[..]].concat()
    };
    let received = h.received(&target, kept.len()).await?;
    for sent in &kept {
        ensure!(
            received.iter().any(|r| is_copy_of(h, r, sent)),
            "event {} ({:?}) was acknowledged but the consumer does not have it",
            sent.id,
            String::from_utf8_lossy(&sent.payload)
        );
    }
    // Duplicates of the republished events are allowed; order counts first copies.
    let mut seen = std::collections::HashSet::new();
    let first_copies: Vec<Received> = received
        .into_iter()
        .filter(|r| seen.insert(identity(h, r)))
        .collect();
    check_order(h, &first_copies, &kept)
}
