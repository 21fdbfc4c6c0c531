//! Micro-benchmark: the NATS JetStream sink publishing one batch and awaiting every ack,
//! against a real `nats-server -js` started by the testkit (or `OUTBOX_TEST_NATS_URL`).
//! Without a server the benchmark says why and measures nothing.
//!
//! `publish/500` is one relay wave (500 independent events, acks awaited together);
//! `publish/1` is one event with its ack awaited, the hand-written relay's loop step. Fresh
//! event ids for every publish (written untimed), so JetStream's duplicate window never
//! short-circuits a store.
//!
//! `cargo bench -p outbox-sinks --features nats --bench nats_publish` (add `-- --quick`).

#![allow(missing_docs)]

use std::time::{Duration, Instant};

use bytes::Bytes;
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use outbox_core::{Destination, Event, Position, Sink};
use outbox_sinks::{NatsConfig, NatsSink};
use time::OffsetDateTime;
use uuid::Uuid;

async fn setup() -> anyhow::Result<NatsSink> {
    let nats = outbox_testkit::services::Nats::shared().await?;
    let prefix = format!("bench{}", &Uuid::now_v7().simple().to_string()[20..]);
    let config = NatsConfig {
        url: nats.url().to_owned(),
        destination: Destination::parse(&format!("{prefix}.event.{{aggregate_type}}"))?,
        stream: prefix.to_uppercase(),
        ack_timeout: Duration::from_secs(10),
        ..NatsConfig::default()
    };
    Ok(config.build().await?)
}

fn batch(n: usize, offset: usize) -> Vec<Event> {
    (0..n)
        .map(|i| Event {
            id: Uuid::now_v7(),
            position: Position((offset + i) as i64),
            aggregate_type: "Order".to_owned(),
            aggregate_id: format!("o_{}", (offset + i) % 1000),
            event_type: "order.placed".to_owned(),
            payload: Bytes::from(vec![b'x'; 200]),
            headers: Vec::new(),
            created_at: OffsetDateTime::now_utc(),
            attempts: 0,
        })
        .collect()
}

fn publish(c: &mut Criterion) {
    let rt = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("skipping the NATS benchmarks: no tokio runtime: {e}");
            return;
        }
    };
    let sink = match rt.block_on(setup()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("skipping the NATS benchmarks: cannot start nats-server: {e:#}");
            return;
        }
    };
    let mut group = c.benchmark_group("nats_publish");
    group.sample_size(20);
    let mut offset = 0;
    for size in [1usize, 500] {
        group.throughput(Throughput::Elements(size as u64));
        group.bench_with_input(BenchmarkId::from_parameter(size), &size, |b, &size| {
            b.iter_custom(|iters| {
                rt.block_on(async {
                    let mut total = Duration::ZERO;
                    for _ in 0..iters {
                        let events = batch(size, offset);
                        offset += size;
                        let start = Instant::now();
                        let deliveries = sink.publish(&events).await;
                        total += start.elapsed();
                        match deliveries {
                            Ok(d) if d.iter().all(Result::is_ok) => {}
                            Ok(d) => panic!(
                                "{} of {size} not acknowledged",
                                d.iter().filter(|r| r.is_err()).count()
                            ),
                            Err(e) => panic!("publish failed: {}", e.report()),
                        }
                    }
                    total
                })
            })
        });
    }
    group.finish();
}

criterion_group!(benches, publish);
criterion_main!(benches);
