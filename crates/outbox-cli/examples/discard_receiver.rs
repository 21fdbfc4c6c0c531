//! An HTTP endpoint that accepts every `POST` and discards it: OTLP trace exports, for
//! measuring what `[tracing]` costs the relay (docs/benchmarks.md, "Trace export"), and
//! webhook deliveries, for the HTTP sink's drain rate (`scripts/bench/drain_brokers.sh`). It
//! answers `200` with an empty body and no decoding, so it takes as little CPU as possible
//! away from the relay on the same machine; on exit (Ctrl-C or SIGTERM) it prints the
//! requests and bytes it got.
//!
//! ```sh
//! cargo run --release -p outbox-cli --example discard_receiver -- 127.0.0.1:4318
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::Router;
use axum::body::Bytes;
use axum::routing::post;

#[derive(Default)]
struct Counts {
    requests: AtomicU64,
    bytes: AtomicU64,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let listen = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:4318".to_owned());
    let counts = Arc::new(Counts::default());
    let seen = counts.clone();
    let discard = move |body: Bytes| {
        seen.requests.fetch_add(1, Ordering::Relaxed);
        seen.bytes.fetch_add(body.len() as u64, Ordering::Relaxed);
        std::future::ready(([("content-type", "application/x-protobuf")], ""))
    };
    // Any path: `/v1/traces` for OTLP, whatever the webhook URL names.
    let app = Router::new().fallback(post(discard));
    let listener = tokio::net::TcpListener::bind(&listen).await?;
    eprintln!(
        "discard_receiver: listening on http://{}",
        listener.local_addr()?
    );
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    axum::serve(listener, app)
        .with_graceful_shutdown(async move {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        })
        .await?;
    println!(
        "discard_receiver: {} requests, {} bytes",
        counts.requests.load(Ordering::Relaxed),
        counts.bytes.load(Ordering::Relaxed)
    );
    Ok(())
}
