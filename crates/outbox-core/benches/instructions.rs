//! Instruction counts of the relay's per-event hot paths, for regressions that timings on a
//! shared machine hide: `scripts/bench/instructions.sh` runs this program under
//! `valgrind --tool=callgrind`, once per path, counting only inside that path's function
//! (`--toggle-collect`), and prints instructions per event. A count does not move with the
//! machine's load; the same binary and inputs give the same count.
//!
//! Inputs are fixed (ids, times, payloads), so the counts repeat exactly. Run on its own,
//! `cargo bench -p outbox-core --bench instructions` runs every path once and prints nothing
//! but a checksum.

#![allow(missing_docs)]

use std::hint::black_box;

use bytes::Bytes;
use outbox_core::aggregate_seq::StreamPositions;
use outbox_core::cloudevents::{self, Binding, Format, MessageFormat};
use outbox_core::relay::split_into_waves;
use outbox_core::stream_ledger::Ledger;
use outbox_core::{Destination, Event, Ordering, Position, message};
use time::OffsetDateTime;
use uuid::Uuid;

/// Events per path (the figure is divided by this).
pub const EVENTS: usize = 500;

/// A batch shaped like `outbox bench`'s: 1,000 aggregates round robin, ~200-byte payloads,
/// one row header; every value fixed.
fn batch() -> Vec<Event> {
    let at = OffsetDateTime::from_unix_timestamp(1_800_000_000).expect("a valid time");
    (0..EVENTS)
        .map(|i| Event {
            id: Uuid::from_u128(0x0190_0000_0000_7000_8000_0000_0000_0000 + i as u128),
            position: Position(i as i64),
            aggregate_type: "Order".to_owned(),
            aggregate_id: format!("o_{}", i % 1000),
            event_type: "order.placed".to_owned(),
            payload: Bytes::from(vec![b'x'; 200]),
            headers: vec![("tenant".to_owned(), "acme".to_owned())],
            created_at: at,
            attempts: 0,
        })
        .collect()
}

fn fold(acc: usize, n: &str, v: &str) -> usize {
    n.bytes()
        .chain(v.bytes())
        .fold(acc, |a, b| a.wrapping_mul(31).wrapping_add(usize::from(b)))
}

#[inline(never)]
fn ic_headers_borrowed(events: &[Event]) -> usize {
    let mut acc = 0;
    for e in events {
        message::for_each_header(black_box(e), |n, v| acc = fold(acc, n, v));
    }
    acc
}

#[inline(never)]
fn ic_headers_owned(events: &[Event]) -> usize {
    events
        .iter()
        .map(|e| black_box(message::headers(black_box(e))).len())
        .sum()
}

#[inline(never)]
fn ic_destination_render(events: &[Event], destination: &Destination) -> usize {
    events
        .iter()
        .map(|e| black_box(destination.render(black_box(e))).len())
        .sum()
}

#[inline(never)]
fn ic_format_encode(events: &[Event], format: &MessageFormat, binding: &Binding) -> usize {
    let mut acc = 0;
    for e in events {
        let encoded = format
            .encode(black_box(e), binding, |n, v| acc = fold(acc, n, v))
            .expect("a message");
        acc = acc.wrapping_add(encoded.body.len());
    }
    acc
}

#[inline(never)]
fn ic_split_into_waves(events: Vec<Event>) -> usize {
    black_box(split_into_waves(events, Ordering::PerAggregate)).len()
}

/// PostgreSQL CDC's `aggregate_seq` per event, on a batch the stream brought as five
/// transactions: the aggregates whose heads must be read (none known, as after a start), the
/// heads taken, every event numbered, and the heads to save with the position computed.
#[inline(never)]
fn ic_stream_numbering(ledger: &mut Ledger<()>) -> usize {
    let mut positions = StreamPositions::default();
    let asked = positions.unknown(ledger);
    positions.load(asked, Vec::new());
    positions.assign(ledger);
    black_box(positions.to_save(u64::MAX)).len()
}

/// The batch committed into a stream ledger as five transactions.
fn streamed(events: &[Event]) -> Ledger<()> {
    let mut ledger = Ledger::new(0);
    for (i, txn) in events.chunks(EVENTS / 5).enumerate() {
        ledger.commit(txn.iter().map(|e| (e.clone(), ())).collect(), i as u64 + 1);
    }
    ledger
}

fn format(format: Format) -> MessageFormat {
    MessageFormat::new(
        format,
        cloudevents::DEFAULT_SOURCE,
        cloudevents::DEFAULT_DATA_CONTENT_TYPE,
    )
    .expect("the defaults are valid")
}

fn main() {
    // `cargo bench` passes `--bench`; the script passes the path's name.
    let only = std::env::args().skip(1).find(|a| !a.starts_with("--"));
    let run = |name: &str| only.as_deref().is_none_or(|o| o == name);
    let events = batch();
    let destination = Destination::default();
    let binding = Binding {
        prefix: "ce_",
        data_content_type: Some("content-type"),
        structured_content_type: Some("content-type"),
        percent_encode: false,
    };
    let mut sum = 0usize;
    if run("headers_borrowed") {
        sum = sum.wrapping_add(ic_headers_borrowed(&events));
    }
    if run("headers_owned") {
        sum = sum.wrapping_add(ic_headers_owned(&events));
    }
    if run("destination_render") {
        sum = sum.wrapping_add(ic_destination_render(&events, &destination));
    }
    for (name, f) in [
        ("format_plain", Format::Plain),
        ("format_cloudevents_binary", Format::CloudeventsBinary),
        (
            "format_cloudevents_structured",
            Format::CloudeventsStructured,
        ),
    ] {
        if run(name) {
            sum = sum.wrapping_add(ic_format_encode(&events, &format(f), &binding));
        }
    }
    if run("split_into_waves") {
        sum = sum.wrapping_add(ic_split_into_waves(events.clone()));
    }
    if run("stream_numbering") {
        sum = sum.wrapping_add(ic_stream_numbering(&mut streamed(&events)));
    }
    println!("checksum {sum}");
}
