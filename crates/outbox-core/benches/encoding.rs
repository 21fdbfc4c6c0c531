//! Micro-benchmark: building the messages of one 500-event batch, the per-event work every
//! sink does before it publishes (the contract headers, the rendered destination, the
//! CloudEvents formats), and the relay's split of a batch into per-aggregate waves.
//!
//! `cargo bench -p outbox-core --bench encoding` (add `-- --quick` for a short run).

#![allow(missing_docs)]

use std::hint::black_box;

use bytes::Bytes;
use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use outbox_core::cloudevents::{self, Binding, Format, MessageFormat};
use outbox_core::relay::split_into_waves;
use outbox_core::{Destination, Event, Ordering, Position, message};
use time::OffsetDateTime;
use uuid::Uuid;

const BATCH: usize = 500;

/// A batch shaped like `outbox bench`'s: 1,000 aggregates round robin, ~200-byte payloads,
/// one row header.
fn batch() -> Vec<Event> {
    (0..BATCH)
        .map(|i| Event {
            id: Uuid::now_v7(),
            position: Position(i as i64),
            aggregate_type: "Order".to_owned(),
            aggregate_id: format!("o_{}", i % 1000),
            event_type: "order.placed".to_owned(),
            payload: Bytes::from(vec![b'x'; 200]),
            headers: vec![("tenant".to_owned(), "acme".to_owned())],
            created_at: OffsetDateTime::now_utc(),
            attempts: 0,
        })
        .collect()
}

fn encoding(c: &mut Criterion) {
    let events = batch();
    let destination = Destination::default();
    let mut group = c.benchmark_group("encode_batch_500");
    group.throughput(Throughput::Elements(BATCH as u64));

    // What the NATS / Kafka / Redis sinks do per event: visit the headers without owning them.
    group.bench_function("headers_borrowed", |b| {
        b.iter(|| {
            let mut bytes = 0usize;
            for e in &events {
                // Read every byte, as a client copying the header into its buffer would.
                message::for_each_header(black_box(e), |n, v| {
                    bytes = n.bytes().chain(v.bytes()).fold(bytes, |acc, b| {
                        acc.wrapping_mul(31).wrapping_add(usize::from(b))
                    });
                });
            }
            black_box(bytes)
        })
    });
    // The owned form (sinks whose client takes `String`s).
    group.bench_function("headers_owned", |b| {
        b.iter(|| {
            for e in &events {
                black_box(message::headers(black_box(e)));
            }
        })
    });
    // `[sink] format`: the plain message through `MessageFormat::encode` (what every sink
    // now calls; must cost what `headers_borrowed` does), and the two CloudEvents modes.
    let binding = Binding {
        prefix: "ce_",
        data_content_type: Some("content-type"),
        structured_content_type: Some("content-type"),
        percent_encode: false,
    };
    for (name, format) in [
        ("format_plain", Format::Plain),
        ("format_cloudevents_binary", Format::CloudeventsBinary),
        (
            "format_cloudevents_structured",
            Format::CloudeventsStructured,
        ),
    ] {
        let format = MessageFormat::new(
            format,
            cloudevents::DEFAULT_SOURCE,
            cloudevents::DEFAULT_DATA_CONTENT_TYPE,
        )
        .expect("the defaults are valid");
        group.bench_function(name, |b| {
            b.iter(|| {
                let mut bytes = 0usize;
                for e in &events {
                    let encoded = format
                        .encode(black_box(e), &binding, |n, v| {
                            bytes = n.bytes().chain(v.bytes()).fold(bytes, |acc, b| {
                                acc.wrapping_mul(31).wrapping_add(usize::from(b))
                            });
                        })
                        .expect("a CloudEvent");
                    bytes = bytes.wrapping_add(encoded.body.len());
                }
                black_box(bytes)
            })
        });
    }
    group.bench_function("destination_render", |b| {
        b.iter(|| {
            for e in &events {
                black_box(destination.render(black_box(e)));
            }
        })
    });
    // Headers + destination + payload clone: one message's worth of work, 500 times.
    group.bench_function("message_full", |b| {
        b.iter(|| {
            let mut out = Vec::with_capacity(BATCH);
            for e in &events {
                out.push((
                    destination.render(e),
                    message::headers(e),
                    e.payload.clone(),
                ));
            }
            black_box(out)
        })
    });
    group.bench_function("split_into_waves_per_aggregate", |b| {
        b.iter_batched(
            || events.clone(),
            |evs| black_box(split_into_waves(evs, Ordering::PerAggregate)),
            BatchSize::SmallInput,
        )
    });
    group.finish();
}

criterion_group!(benches, encoding);
criterion_main!(benches);
