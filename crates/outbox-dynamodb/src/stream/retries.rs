//! Picking up `outbox dead retry`: the requests the operator wrote (`requeue.rs`) are put in
//! line once the request counter moved, under a claim renewed while they are out.

use std::sync::Arc;

use outbox_core::SourceError;
use tokio::time::Instant;

use super::requeue::{Requeued, request};
use super::{DynamoStreamSource, Meta, REQUEUE_CHECK, aggregate, now_ms};

impl DynamoStreamSource {
    /// Puts in line what `outbox dead retry` asked for, once the request counter moved (and
    /// at start, and when another relay's claim may have expired).
    pub(super) async fn pick_up_requeued(&mut self) -> Result<(), SourceError> {
        if Instant::now() < self.next_requeue_check {
            return Ok(());
        }
        self.next_requeue_check = Instant::now() + REQUEUE_CHECK;
        let requests = self.leases.requeue_requests().await?;
        if self.requests_seen == Some(requests) {
            return Ok(());
        }
        let until = now_ms() + self.lease_duration.as_millis() as u64;
        let claimed = self.leases.claim_requeued(now_ms(), until).await?;
        // Marked items under another relay's claim: look again once that claim may have
        // expired (its relay died).
        self.requests_seen = (claimed.others == 0).then_some(requests);
        if claimed.others > 0 {
            self.next_requeue_check = Instant::now() + self.lease_duration;
        }
        if claimed.mine.is_empty() {
            return Ok(());
        }
        let mut mine = claimed.mine;
        mine.retain(|r| !self.claims.contains_key(r.key.as_str()));
        mine.sort_by(|a, b| {
            (&a.event.aggregate_type, &a.event.aggregate_id, a.seq).cmp(&(
                &b.event.aggregate_type,
                &b.event.aggregate_id,
                b.seq,
            ))
        });
        let keys: Vec<(String, String)> = mine.iter().map(|r| aggregate(&r.event)).collect();
        let unknown: Vec<(String, String)> = keys
            .iter()
            .filter(|k| !self.last.contains_key(*k))
            .cloned()
            .collect();
        if !unknown.is_empty() {
            let found = self.leases.positions(&unknown).await?;
            for k in unknown {
                let p = found.get(&k).copied().unwrap_or(0);
                self.last.insert(k, p);
            }
        }
        tracing::info!(
            events = mine.len(),
            "putting retried dead letters back in line"
        );
        for Requeued { key, event, seq } in mine {
            let agg = aggregate(&event);
            // New events of the aggregate from the stream are still parked until these are
            // out; then they are retried too, behind them.
            self.retrying.insert(agg.clone());
            let last = self.last.entry(agg.clone()).or_insert(0);
            *last = (*last).max(seq);
            let key: Arc<str> = Arc::from(key);
            self.claims.insert(key.clone(), agg);
            self.put_in_line(
                event,
                Meta {
                    shard: Arc::from(""),
                    seqnum: Arc::from(""),
                    seq,
                    requeued: Some(key),
                },
            );
        }
        self.claims_until = Instant::now() + self.lease_duration;
        self.claims_renewed = Instant::now();
        Ok(())
    }

    /// Renews the claims on retried events (with the shard leases); drops the ones lost.
    pub(super) async fn renew_claims(&mut self) -> Result<(), SourceError> {
        if self.claims.is_empty() || self.claims_renewed.elapsed() < self.lease_duration / 3 {
            return Ok(());
        }
        let keys: Vec<String> = self.claims.keys().map(|k| k.to_string()).collect();
        let until = now_ms() + self.lease_duration.as_millis() as u64;
        let lost = self.leases.renew_claims(&keys, until).await?;
        self.claims_renewed = Instant::now();
        self.claims_until = Instant::now() + self.lease_duration;
        for key in lost {
            tracing::warn!(item = %key, "lost the claim on a retried dead letter; another relay retries it");
            self.claims.remove(key.as_str());
            let queued: Vec<i64> = self
                .ledger
                .queued()
                .filter(|e| e.meta.requeued.as_deref() == Some(key.as_str()))
                .map(|e| e.event.position.0)
                .collect();
            for p in queued {
                self.ledger.remove_queued(p);
            }
        }
        Ok(())
    }

    /// A retried event was settled for good (`delivered`: acknowledged; else dead again or
    /// parked). When its aggregate has no retried event left in line, what is left of its
    /// dead letters decides: none → the aggregate's mark goes; only events parked meanwhile
    /// behind the retried ones → they are retried too; a dead letter → the aggregate stays
    /// held.
    pub(super) async fn requeued_settled(
        &mut self,
        key: &str,
        delivered: bool,
    ) -> Result<(), SourceError> {
        let Some(agg) = self.claims.remove(key) else {
            return Ok(());
        };
        if delivered {
            self.leases.requeued_done(key).await?;
        }
        if self.claims.values().any(|a| *a == agg) {
            return Ok(());
        }
        self.retrying.remove(&agg);
        let left = self.leases.dead_of(&agg).await?;
        if left.is_empty() {
            self.leases.unhold(&agg).await?;
            if let Some(dead) = self.dead.as_mut() {
                dead.remove(&agg);
            }
        } else if left.iter().all(|(_, held)| *held) {
            let keys: Vec<String> = left.into_iter().map(|(k, _)| k).collect();
            request(&self.leases.client, &self.leases.table, &keys, now_ms()).await?;
            self.next_requeue_check = Instant::now();
        } else if self.hold
            && let Some(dead) = self.dead.as_mut()
        {
            dead.insert(agg);
        }
        Ok(())
    }
}
