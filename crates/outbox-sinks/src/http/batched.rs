//! The HTTP sink's batched mode (`events_per_request` above 1): many events in one `POST`.
//!
//! The events of a batch that render to the same URL go together, at most
//! `events_per_request` per request, with at most `max_concurrency` requests in flight:
//!
//! | format | body | `content-type` |
//! | --- | --- | --- |
//! | `plain` | one JSON line per event, the file sink's line format ([`crate::stdout`]), `destination` being the URL (password and secret query values masked) | `application/x-ndjson` |
//! | `cloudevents-structured` | a JSON array of CloudEvents envelopes (the CloudEvents HTTP binding's batched mode) | `application/cloudevents-batch+json` |
//!
//! The configured `headers` go with every request. With a `secret` the request is signed
//! per Standard Webhooks over the whole body; its `webhook-id` is the event id for a request
//! of one event and `batch_<32 hex digits>` (a hash of the event ids, in order) otherwise, so
//! a request sent again with the same events carries the same id. Receivers deduplicate by
//! each line's `id`.
//!
//! A request's answer is every event's outcome (2xx delivered, 408/429/5xx transient, ...),
//! with one exception: when the receiver refuses a request of several events for good (any
//! other 4xx, such as 400 or 413), each of its events is sent again alone at once, so that
//! only the events the receiver refuses on their own are dead-lettered. Per-aggregate order
//! holds as in the one-event mode: the relay never passes two events of one aggregate in one
//! call, so no request holds two of them and none races another of the same aggregate.

use std::collections::HashMap;

use bytes::Bytes;
use futures::StreamExt as _;
use futures::future::join_all;
use outbox_core::sink::Delivery;
use outbox_core::{Event, SinkError, SinkErrorKind};
use reqwest::Url;
use reqwest::header::{CONTENT_TYPE, HeaderValue};
use sha2::{Digest as _, Sha256};

use super::{HttpSink, redact, render_url};
use crate::json_lines::{render_envelope, render_line};

/// `content-type` of a plain batch.
const NDJSON: &str = "application/x-ndjson";
/// `content-type` of a CloudEvents batch.
const CLOUDEVENTS_BATCH: &str = "application/cloudevents-batch+json";

/// The encoded events that go to one URL, each with its index in the batch.
struct Group {
    url: Url,
    items: Vec<(usize, Vec<u8>)>,
}

impl HttpSink {
    /// Publishes `batch` in requests of many events; one outcome per event, in input order.
    pub(super) async fn publish_batched(&self, batch: &[Event]) -> Vec<Delivery> {
        let mut outcomes: Vec<Option<Delivery>> = vec![None; batch.len()];
        let mut groups: Vec<Group> = Vec::new();
        let mut group_of_url: HashMap<String, (usize, String)> = HashMap::new();
        for (index, event) in batch.iter().enumerate() {
            let url = match render_url(&self.url, event) {
                Ok(url) => url,
                Err(reason) => {
                    outcomes[index] = Some(Err(SinkError::rejected(reason)));
                    continue;
                }
            };
            let (group, shown_url) =
                group_of_url
                    .entry(url.as_str().to_owned())
                    .or_insert_with(|| {
                        groups.push(Group {
                            url: url.clone(),
                            items: Vec::new(),
                        });
                        (groups.len() - 1, redact(&url))
                    });
            let mut item = Vec::with_capacity(256 + event.payload.len());
            let encoded = if self.format.is_plain() {
                render_line(shown_url, event, &mut item)
            } else {
                render_envelope(&self.format, event, &mut item)
            };
            match encoded {
                Ok(()) => {
                    if !self.format.is_plain() {
                        // Array elements, not lines.
                        item.pop();
                    }
                    groups[*group].items.push((index, item));
                }
                Err(e) => outcomes[index] = Some(Err(e)),
            }
        }

        let mut requests = Vec::new();
        for group in &groups {
            for items in group.items.chunks(self.events_per_request) {
                requests.push(self.send_or_split(batch, &group.url, items));
            }
        }
        let answered: Vec<Vec<(usize, Delivery)>> = futures::stream::iter(requests)
            .buffer_unordered(self.max_concurrency)
            .collect()
            .await;
        for (index, outcome) in answered.into_iter().flatten() {
            outcomes[index] = Some(outcome);
        }
        outcomes
            .into_iter()
            .map(|outcome| outcome.expect("every event was encoded, refused or sent"))
            .collect()
    }

    /// Sends `items` in one request; if the receiver refuses several events for good, sends
    /// each again alone.
    async fn send_or_split(
        &self,
        batch: &[Event],
        url: &Url,
        items: &[(usize, Vec<u8>)],
    ) -> Vec<(usize, Delivery)> {
        let outcome = self.send(batch, url, items).await;
        match outcome {
            Err(e) if e.kind() == SinkErrorKind::Rejected && items.len() > 1 => {
                tracing::debug!(
                    events = items.len(),
                    error = %e,
                    "the webhook refused a batched request; sending its events one by one"
                );
                join_all(items.iter().map(|item| async move {
                    let outcome = self.send(batch, url, std::slice::from_ref(item)).await;
                    (item.0, outcome)
                }))
                .await
            }
            outcome => items
                .iter()
                .map(|(index, _)| (*index, outcome.clone()))
                .collect(),
        }
    }

    /// One request carrying `items`.
    async fn send(&self, batch: &[Event], url: &Url, items: &[(usize, Vec<u8>)]) -> Delivery {
        let plain = self.format.is_plain();
        let size: usize = items.iter().map(|(_, item)| item.len() + 1).sum();
        let mut body = Vec::with_capacity(size + 2);
        if !plain {
            body.push(b'[');
        }
        for (n, (_, item)) in items.iter().enumerate() {
            if !plain && n > 0 {
                body.push(b',');
            }
            body.extend_from_slice(item);
        }
        if !plain {
            body.push(b']');
        }
        let mut headers = self.static_headers.clone();
        let content_type = if plain { NDJSON } else { CLOUDEVENTS_BATCH };
        headers.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
        if self.signer.is_some() {
            let id = request_id(items.iter().map(|(index, _)| &batch[*index]));
            self.sign(&mut headers, &id, &body);
        }
        self.post(url.clone(), headers, Bytes::from(body)).await
    }
}

/// The `webhook-id` of a request: the event id for one event, else a hash of the ids.
fn request_id<'e>(mut events: impl ExactSizeIterator<Item = &'e Event>) -> String {
    if events.len() == 1 {
        return events.next().expect("one event").id.to_string();
    }
    let mut hash = Sha256::new();
    for event in events {
        hash.update(event.id.as_bytes());
    }
    let digest = hash.finalize();
    let hex: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
    format!("batch_{hex}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_id_is_the_event_id_alone_and_a_stable_hash_for_many() {
        let a = crate::broker::sample_event("Order", "o_1", "order.placed");
        let mut b = crate::broker::sample_event("Order", "o_2", "order.placed");
        b.id = uuid::Uuid::from_u128(2);
        assert_eq!(request_id([&a].into_iter()), a.id.to_string());
        let both = request_id([&a, &b].into_iter());
        assert!(both.starts_with("batch_") && both.len() == 6 + 32, "{both}");
        assert_eq!(both, request_id([&a, &b].into_iter()));
        assert_ne!(both, request_id([&b, &a].into_iter()));
    }
}
