//! The webhook receiver on 127.0.0.1, fed by the relay's real `HttpSink` (signed with a
//! Standard Webhooks secret) and by hand-made requests, with the PostgreSQL inbox.

#![cfg(feature = "http")]

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::{Ledger, event};
use outbox_core::{Event, Sink, SinkErrorKind};
use outbox_inbox::http::{Verifier, WebhookReceiver};
use outbox_inbox::{ConsumerReport, InboxMessage};
use outbox_sinks::{HttpConfig, HttpSink};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

async fn serve<H, Fut>(
    handler: H,
    shutdown: &CancellationToken,
) -> (SocketAddr, JoinHandle<ConsumerReport>)
where
    H: Fn(InboxMessage) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), String>> + Send + 'static,
{
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("binds");
    let addr = listener.local_addr().expect("addr");
    let receiver = WebhookReceiver::new(SECRET).expect("valid secret");
    let shutdown = shutdown.clone();
    let task = tokio::spawn(async move {
        receiver
            .serve(listener, handler, shutdown)
            .await
            .expect("serves")
    });
    (addr, task)
}

async fn sink(addr: SocketAddr) -> HttpSink {
    HttpConfig {
        url: format!("http://{addr}/hooks/{{aggregate_type}}"),
        secret: Some(SECRET.into()),
        timeout: Duration::from_secs(10),
        ..HttpConfig::default()
    }
    .build()
    .await
    .expect("builds")
}

async fn publish(sink: &HttpSink, e: &Event) -> Result<(), outbox_core::SinkError> {
    sink.publish(std::slice::from_ref(e))
        .await
        .expect("batch")
        .remove(0)
}

#[tokio::test]
async fn signed_webhooks_are_processed_once_even_when_sent_twice_and_a_failure_is_retried() {
    let ledger = Ledger::new().await;
    let shutdown = CancellationToken::new();
    let (addr, server) = serve(ledger.handler(), &shutdown).await;
    let sink = sink(addr).await;

    // The relay crashed after the first delivery, before marking: it sends again.
    let first = event("o_1", 0);
    publish(&sink, &first).await.expect("delivered");
    publish(&sink, &first).await.expect("delivered again");
    assert_eq!(ledger.side_effects(first.id).await, 1);
    assert_eq!(ledger.duplicates.load(Ordering::SeqCst), 1);

    // The handler fails once: 500, the sink sees a transient failure, nothing committed;
    // the relay's retry is processed.
    let second = event("o_2", 0);
    ledger.fail("o_2", 0, 1);
    let err = publish(&sink, &second).await.expect_err("500");
    assert_eq!(err.kind(), SinkErrorKind::Transient, "{err}");
    assert_eq!(ledger.side_effects(second.id).await, 0, "rolled back");
    publish(&sink, &second).await.expect("retry delivered");
    assert_eq!(ledger.side_effects(second.id).await, 1);

    shutdown.cancel();
    let report = server.await.expect("task");
    assert_eq!((report.acked, report.retried, report.rejected), (3, 1, 0));
}

#[tokio::test]
async fn bad_stale_and_unsigned_requests_are_refused_before_the_handler_and_replays_are_duplicates()
{
    let ledger = Ledger::new().await;
    let shutdown = CancellationToken::new();
    let (addr, server) = serve(ledger.handler(), &shutdown).await;
    let client = reqwest::Client::new();
    let e = event("o_1", 0);
    let id = e.id.to_string();
    let body = e.payload.to_vec();
    let verifier = Verifier::from_secret(SECRET).expect("valid");
    let now = time::OffsetDateTime::now_utc().unix_timestamp();
    let post = |timestamp: i64, signature: String, contract: bool| {
        let mut request = client
            .post(format!("http://{addr}/hooks"))
            .header("webhook-id", &id)
            .header("webhook-timestamp", timestamp.to_string())
            .header("webhook-signature", signature)
            .body(body.clone());
        if contract {
            request = request
                .header("outbox-id", &id)
                .header("outbox-event_type", "order.placed")
                .header("outbox-aggregate_type", "Order")
                .header("outbox-aggregate_id", "o_1")
                .header("outbox-tenant", "acme");
        }
        async move { request.send().await.expect("answered").status().as_u16() }
    };

    let wrong_key = Verifier::from_secret("whsec_c2VjcmV0").expect("valid");
    assert_eq!(post(now, wrong_key.sign(&id, now, &body), true).await, 401);
    let mut tampered = verifier.sign(&id, now, &body);
    tampered.replace_range(5..6, if &tampered[5..6] == "A" { "B" } else { "A" });
    assert_eq!(post(now, tampered, true).await, 401);
    let stale = now - 600;
    assert_eq!(
        post(stale, verifier.sign(&id, stale, &body), true).await,
        401
    );
    let future = now + 600;
    assert_eq!(
        post(future, verifier.sign(&id, future, &body), true).await,
        401
    );
    let unsigned = client
        .post(format!("http://{addr}/hooks"))
        .body(body.clone())
        .send()
        .await
        .expect("answered");
    assert_eq!(unsigned.status().as_u16(), 401);
    assert_eq!(
        ledger.attempts.load(Ordering::SeqCst),
        0,
        "the handler never ran"
    );

    // Signed but not following the contract: 400, which the sink dead-letters.
    assert_eq!(post(now, verifier.sign(&id, now, &body), false).await, 400);
    // A valid request, then the same request replayed within the window: one side effect.
    assert_eq!(post(now, verifier.sign(&id, now, &body), true).await, 200);
    assert_eq!(post(now, verifier.sign(&id, now, &body), true).await, 200);
    assert_eq!(ledger.side_effects(e.id).await, 1);
    assert_eq!(ledger.duplicates.load(Ordering::SeqCst), 1);

    shutdown.cancel();
    let report = server.await.expect("task");
    assert_eq!(report.rejected, 5);
    assert_eq!(report.dead_lettered, 1);
    assert_eq!(report.acked, 2);
}

#[tokio::test]
async fn requests_of_one_key_are_handled_one_at_a_time() {
    let busy = Arc::new(AtomicUsize::new(0));
    let overlap = Arc::new(AtomicUsize::new(0));
    let shutdown = CancellationToken::new();
    let handler = {
        let (busy, overlap) = (busy.clone(), overlap.clone());
        move |_m: InboxMessage| {
            let (busy, overlap) = (busy.clone(), overlap.clone());
            async move {
                if busy.fetch_add(1, Ordering::SeqCst) > 0 {
                    overlap.fetch_add(1, Ordering::SeqCst);
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
                busy.fetch_sub(1, Ordering::SeqCst);
                Ok::<_, String>(())
            }
        }
    };
    let (addr, server) = serve(handler, &shutdown).await;
    // The sink sends a batch concurrently (64 at once by default).
    let events: Vec<Event> = (0..10).map(|seq| event("same", seq)).collect();
    for d in sink(addr).await.publish(&events).await.expect("batch") {
        d.expect("delivered");
    }
    assert_eq!(overlap.load(Ordering::SeqCst), 0);
    shutdown.cancel();
    assert_eq!(server.await.expect("task").acked, 10);
}

#[tokio::test]
async fn a_non_ascii_aggregate_id_reaches_the_handler_intact() {
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let shutdown = CancellationToken::new();
    let record = Arc::clone(&seen);
    let (addr, server) = serve(
        move |m: InboxMessage| {
            record.lock().expect("lock").push(m.aggregate_id);
            async { Ok::<_, String>(()) }
        },
        &shutdown,
    )
    .await;
    let sink = sink(addr).await;
    let mut zurich = event("Zürich-1", 0);
    zurich.headers.clear();
    publish(&sink, &zurich).await.expect("delivered");
    shutdown.cancel();
    server.await.expect("task");
    assert_eq!(*seen.lock().expect("lock"), ["Zürich-1"]);
}
