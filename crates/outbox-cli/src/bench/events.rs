//! The events a bench run writes: round-robin aggregates, a JSON payload of the requested
//! size, and optionally a `traceparent` of their own.

use outbox_core::NewEvent;

/// Event `i` of a run: aggregate `o_{i % aggregates}`, a JSON payload of about `bytes` bytes.
pub(super) fn event(i: u64, aggregates: u32, bytes: usize) -> NewEvent {
    let aggregate = format!("o_{}", i % u64::from(aggregates));
    let head = format!(r#"{{"order_id":"{aggregate}","n":{i},"pad":""#);
    let pad = bytes.saturating_sub(head.len() + 2);
    let mut payload = String::with_capacity(head.len() + pad + 2);
    payload.push_str(&head);
    payload.extend(std::iter::repeat_n('x', pad));
    payload.push_str("\"}");
    NewEvent::new("Order", aggregate, "order.placed", payload.into_bytes())
}

/// `event` with a `traceparent` naming a sampled producer span of its own: ids spread like
/// random ones (a ratio sampler reads the trace id's bits), derived from `i`.
fn with_traceparent(event: NewEvent, i: u64) -> NewEvent {
    // splitmix64: distinct inputs, well-spread outputs, never all zeros for these.
    let mix = |x: u64| {
        let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    let (high, low) = (mix(2 * i), mix(2 * i + 1));
    let parent = outbox_core::trace::TraceParent {
        trace_id: (u128::from(high) << 64 | u128::from(low) | 1).to_be_bytes(),
        span_id: (mix(i) | 1).to_be_bytes(),
        flags: 1,
    };
    event.with_header(outbox_core::trace::TRACEPARENT, parent.to_string())
}

/// Event `i` of a run, with a `traceparent` when asked.
pub(super) fn bench_event(i: u64, aggregates: u32, bytes: usize, traceparent: bool) -> NewEvent {
    let e = event(i, aggregates, bytes);
    if traceparent {
        with_traceparent(e, i)
    } else {
        e
    }
}
