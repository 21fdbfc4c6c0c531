//! Shards: discovery (a child shard after its parent finished), reading, and the per-shard
//! checkpoints and leases that make a crash re-read only the unsettled tail.

use std::collections::VecDeque;
use std::sync::Arc;

use aws_sdk_dynamodb::error::ProvideErrorMetadata;
use aws_sdk_dynamodbstreams::types::ShardIteratorType;
use outbox_core::SourceError;
use time::OffsetDateTime;
use tokio::time::Instant;

use super::decode::{Decoded, decode};
use super::{
    DISCOVERY_INTERVAL, DynamoStreamSource, IDLE_READ, MAX_BUFFERED, Meta, READ_LIMIT, Shard,
    now_ms, warn_trimmed,
};

impl DynamoStreamSource {
    /// Lists the shards, then takes the lease of every shard that is free and whose parent
    /// is finished.
    pub(super) async fn discover(&mut self) -> Result<(), SourceError> {
        if Instant::now() < self.next_discovery {
            return Ok(());
        }
        self.next_discovery = Instant::now() + DISCOVERY_INTERVAL;
        let arn = self.stream_arn.clone().unwrap_or_default();
        let mut start: Option<String> = None;
        loop {
            let out = self
                .streams
                .describe_stream()
                .stream_arn(&arn)
                .set_exclusive_start_shard_id(start.clone())
                .send()
                .await
                .map_err(|e| self.call_err("listing the stream's shards", e))?;
            let Some(desc) = out.stream_description else {
                break;
            };
            for shard in desc.shards() {
                if let Some(id) = shard.shard_id() {
                    self.topology
                        .insert(id.to_owned(), shard.parent_shard_id().map(str::to_owned));
                }
            }
            match desc.last_evaluated_shard_id {
                Some(id) => start = Some(id),
                None => break,
            }
        }
        let mut candidates: Vec<(String, Option<String>)> = self
            .topology
            .iter()
            .filter(|(id, _)| !self.held.contains_key(id.as_str()) && !self.finished.contains(*id))
            .map(|(id, parent)| (id.clone(), parent.clone()))
            .collect();
        candidates.sort();
        for (id, parent) in candidates {
            if let Some(parent) = parent
                && self.topology.contains_key(&parent)
                && !self.finished.contains(&parent)
            {
                if self.leases.finished(&parent).await? {
                    self.finished.insert(parent);
                } else {
                    continue; // the parent first
                }
            }
            let now = now_ms();
            let until = now + self.lease_duration.as_millis() as u64;
            let Some(lease) = self.leases.acquire(&id, now, until).await? else {
                if self.leases.finished(&id).await? {
                    self.finished.insert(id);
                }
                continue;
            };
            let iterator = self.iterator(&id, lease.checkpoint.as_deref()).await?;
            tracing::info!(shard = %id, resume_after = ?lease.checkpoint, "reading a stream shard");
            let shard_id: Arc<str> = Arc::from(id.as_str());
            self.held.insert(
                shard_id.clone(),
                Shard {
                    id: shard_id,
                    iterator: Some(iterator),
                    ended: false,
                    read: VecDeque::new(),
                    checkpoint: lease.checkpoint.clone(),
                    dirty: false,
                    last_read: lease.checkpoint,
                    lease_until: Instant::now() + self.lease_duration,
                    lease_renewed: Instant::now(),
                    next_read: Instant::now(),
                },
            );
        }
        Ok(())
    }

    /// An iterator after `after`, or at the oldest record.
    pub(super) async fn iterator(
        &self,
        shard: &str,
        after: Option<&str>,
    ) -> Result<String, SourceError> {
        let arn = self.stream_arn.clone().unwrap_or_default();
        let mut req = self
            .streams
            .get_shard_iterator()
            .stream_arn(&arn)
            .shard_id(shard);
        req = match after {
            Some(seq) => req
                .shard_iterator_type(ShardIteratorType::AfterSequenceNumber)
                .sequence_number(seq),
            None => req.shard_iterator_type(ShardIteratorType::TrimHorizon),
        };
        match req.send().await {
            Ok(out) => out
                .shard_iterator
                .ok_or_else(|| SourceError::unavailable("the stream returned no shard iterator")),
            Err(e) if e.code() == Some("TrimmedDataAccessException") => {
                warn_trimmed(shard, after);
                let out = self
                    .streams
                    .get_shard_iterator()
                    .stream_arn(&arn)
                    .shard_id(shard)
                    .shard_iterator_type(ShardIteratorType::TrimHorizon)
                    .send()
                    .await
                    .map_err(|e| self.call_err("opening a shard", e))?;
                out.shard_iterator.ok_or_else(|| {
                    SourceError::unavailable("the stream returned no shard iterator")
                })
            }
            Err(e) => Err(self.call_err("opening a shard", e)),
        }
    }

    /// Reads every held shard that is due.
    pub(super) async fn read(&mut self, now: OffsetDateTime) -> Result<(), SourceError> {
        let due: Vec<Arc<str>> = self
            .held
            .values()
            .filter(|s| !s.ended && s.next_read <= Instant::now())
            .map(|s| s.id.clone())
            .collect();
        for shard in due {
            if self.ledger.unsettled() >= MAX_BUFFERED {
                return Ok(());
            }
            let Some(iterator) = self.held.get(&shard).and_then(|s| s.iterator.clone()) else {
                continue;
            };
            let out = self
                .streams
                .get_records()
                .shard_iterator(iterator)
                .limit(READ_LIMIT)
                .send()
                .await;
            let out = match out {
                Ok(out) => out,
                Err(e) if e.code() == Some("ExpiredIteratorException") => {
                    let after = self.held.get(&shard).and_then(|s| s.last_read.clone());
                    let fresh = self.iterator(&shard, after.as_deref()).await?;
                    if let Some(s) = self.held.get_mut(&shard) {
                        s.iterator = Some(fresh);
                    }
                    continue;
                }
                Err(e)
                    if e.code() == Some("LimitExceededException")
                        || e.code() == Some("ProvisionedThroughputExceededException") =>
                {
                    if let Some(s) = self.held.get_mut(&shard) {
                        s.next_read = Instant::now() + IDLE_READ * 4;
                    }
                    tracing::debug!(%shard, "stream reads throttled; backing off");
                    continue;
                }
                Err(e) if e.code() == Some("TrimmedDataAccessException") => {
                    let after = self.held.get(&shard).and_then(|s| s.last_read.clone());
                    warn_trimmed(&shard, after.as_deref());
                    let fresh = self.iterator(&shard, None).await?;
                    if let Some(s) = self.held.get_mut(&shard) {
                        s.iterator = Some(fresh);
                    }
                    continue;
                }
                Err(e) => return Err(self.call_err("reading the stream", e)),
            };
            let records = out.records.unwrap_or_default();
            let got = records.len();
            for record in &records {
                let seqnum: Arc<str> = Arc::from(
                    record
                        .dynamodb()
                        .and_then(|d| d.sequence_number())
                        .unwrap_or_default(),
                );
                let decoded = decode(record, &self.config.sort_key);
                let settled = matches!(decoded, Decoded::Ignored);
                if let Some(s) = self.held.get_mut(&shard) {
                    s.read.push_back((seqnum.clone(), settled));
                    s.last_read = Some(seqnum.to_string());
                }
                let meta = |seq| Meta {
                    shard: shard.clone(),
                    seqnum: seqnum.clone(),
                    seq,
                    requeued: None,
                };
                match decoded {
                    Decoded::Ignored => {}
                    Decoded::Event { event, seq } => self.ingest(event, meta(seq), now).await?,
                    Decoded::Invalid { event, reason } => {
                        tracing::error!(event_id = %event.id, %reason, "dead-lettered an outbox item that cannot be published");
                        self.leases.dead(&event, None, 1, &reason, now).await?;
                        self.mark_settled(&shard, &seqnum);
                    }
                }
            }
            if let Some(s) = self.held.get_mut(&shard) {
                s.iterator = out.next_shard_iterator;
                if s.iterator.is_none() {
                    s.ended = true;
                    tracing::info!(shard = %s.id, "read a closed shard to its end");
                }
                s.next_read = if got == 0 {
                    Instant::now() + IDLE_READ
                } else {
                    Instant::now()
                };
            }
        }
        Ok(())
    }

    /// Marks a record settled for good in its shard's read list.
    pub(super) fn mark_settled(&mut self, shard: &str, seqnum: &str) {
        if let Some(s) = self.held.get_mut(shard)
            && let Some(r) = s.read.iter_mut().find(|(n, _)| &**n == seqnum)
        {
            r.1 = true;
        }
    }

    /// Moves each shard's checkpoint over its settled prefix, renews leases, saves what
    /// moved, and lets finished shards go. Positions handed out are recorded first, so a
    /// checkpoint never passes an event whose position is not on record.
    pub(super) async fn checkpoint(&mut self, force: bool) -> Result<(), SourceError> {
        if !self.unrecorded.is_empty() {
            let positions: Vec<_> = self
                .unrecorded
                .iter()
                .map(|(k, v)| (k.clone(), *v))
                .collect();
            self.leases.advance(positions).await?;
            self.unrecorded.clear();
        }
        let renew_after = self.lease_duration / 3;
        let ids: Vec<Arc<str>> = self.held.keys().cloned().collect();
        for id in ids {
            let Some(s) = self.held.get_mut(&id) else {
                continue;
            };
            while s.read.front().is_some_and(|(_, done)| *done) {
                if let Some((n, _)) = s.read.pop_front() {
                    s.checkpoint = Some(n.to_string());
                    s.dirty = true;
                }
            }
            let finished = s.ended && s.read.is_empty();
            let due = s.lease_renewed.elapsed() >= renew_after;
            if !(finished || due || (force && s.dirty)) {
                continue;
            }
            let checkpoint = s.dirty.then(|| s.checkpoint.clone()).flatten();
            let until = now_ms() + self.lease_duration.as_millis() as u64;
            let kept = self
                .leases
                .save(&id, checkpoint.as_deref(), finished, until)
                .await?;
            if !kept {
                tracing::warn!(shard = %id, "lost the lease of a shard to another relay; dropping what was read from it");
                self.drop_shard(&id);
                continue;
            }
            if finished {
                tracing::info!(shard = %id, "shard finished: its child shards may be read");
                self.held.remove(&id);
                self.finished.insert(id.to_string());
                self.next_discovery = Instant::now();
                continue;
            }
            if let Some(s) = self.held.get_mut(&id) {
                s.dirty = false;
                s.lease_renewed = Instant::now();
                s.lease_until = Instant::now() + self.lease_duration;
            }
        }
        Ok(())
    }

    /// Forgets a shard whose lease was lost: its queued and waiting events belong to the
    /// new holder.
    pub(super) fn drop_shard(&mut self, id: &str) {
        self.held.remove(id);
        let queued: Vec<(i64, (String, String))> = self
            .ledger
            .queued()
            .filter(|e| &*e.meta.shard == id)
            .map(|e| (e.event.position.0, e.aggregate()))
            .collect();
        for (p, key) in queued {
            self.ledger.remove_queued(p);
            self.last.remove(&key);
        }
        for (key, queue) in self.waiting.iter_mut() {
            queue.retain(|_, w| &*w.meta.shard != id);
            self.last.remove(key);
        }
        self.waiting.retain(|_, q| !q.is_empty());
    }

    /// Until when a batch from the held shards may be published.
    pub(super) fn valid_until(&self) -> Option<Instant> {
        let claims = (!self.claims.is_empty()).then_some(self.claims_until);
        self.held
            .values()
            .map(|s| s.lease_until)
            .chain(claims)
            .min()
    }
}
