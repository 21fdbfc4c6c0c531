//! The producers of a crash test: concurrent tasks writing events in transactions to a few
//! aggregates each, and rolling some transactions back on purpose. The ids of rolled-back
//! events are kept: none may ever reach the destination.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::anyhow;
use outbox_core::{Backend, NewEvent};
use rand::Rng;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// The aggregate type of every crash-test event.
pub(crate) const AGGREGATE_TYPE: &str = "CrashTest";
/// The event type of every crash-test event.
pub(crate) const EVENT_TYPE: &str = "crash_test.written";
/// Aggregates per producer.
const AGGREGATES: u32 = 5;
/// One transaction in this many is rolled back.
const ROLL_BACK_ONE_IN: u32 = 8;
/// Consecutive failed writes after which the database counts as gone.
const GIVE_UP_AFTER: u32 = 20;

/// What the producers did so far (read by the progress line while they run).
#[derive(Debug, Default)]
pub(crate) struct Written {
    /// Events in committed transactions.
    pub(crate) committed: AtomicU64,
    /// Events in rolled-back transactions.
    pub(crate) rolled_back: AtomicU64,
    /// Writes that failed (the database was busy or unreachable for a moment).
    pub(crate) failed: AtomicU64,
}

/// Runs `producers` tasks until `stop` is cancelled; returns the ids of every rolled-back
/// event. Fails when the database stopped answering.
pub(crate) async fn run(
    backend: Arc<dyn Backend>,
    producers: usize,
    written: Arc<Written>,
    stop: CancellationToken,
) -> anyhow::Result<Vec<Uuid>> {
    let mut tasks = Vec::with_capacity(producers);
    for p in 0..producers {
        tasks.push(tokio::spawn(produce(
            backend.clone(),
            p,
            written.clone(),
            stop.clone(),
        )));
    }
    let mut rolled_back = Vec::new();
    let mut first_error = None;
    for task in tasks {
        match task.await {
            Ok(Ok(ids)) => rolled_back.extend(ids),
            Ok(Err(e)) => {
                // One producer giving up stops the others: the run cannot go on.
                stop.cancel();
                first_error.get_or_insert(e);
            }
            Err(e) => {
                stop.cancel();
                first_error.get_or_insert(anyhow!("a producer task failed: {e}"));
            }
        }
    }
    match first_error {
        Some(e) => Err(e),
        None => Ok(rolled_back),
    }
}

/// One producer: its own aggregates, one transaction at a time (so its program order is the
/// commit order of its aggregates).
async fn produce(
    backend: Arc<dyn Backend>,
    p: usize,
    written: Arc<Written>,
    stop: CancellationToken,
) -> anyhow::Result<Vec<Uuid>> {
    let producer = backend.producer().map_err(|e| anyhow!(e))?;
    let scratch = backend.scratch().map_err(|e| anyhow!(e))?;
    let mut rolled_back = Vec::new();
    let mut next_n: Vec<u64> = vec![0; AGGREGATES as usize];
    let mut failures_in_a_row = 0;
    while !stop.is_cancelled() {
        let (aggregate, count, roll_back, pause) = {
            let mut rng = rand::rng();
            (
                rng.random_range(0..AGGREGATES) as usize,
                rng.random_range(1..=4_u64),
                rng.random_ratio(1, ROLL_BACK_ONE_IN),
                Duration::from_millis(rng.random_range(10..30)),
            )
        };
        let start = next_n[aggregate];
        let events: Vec<NewEvent> = (start..start + count)
            .map(|n| {
                NewEvent::new(
                    AGGREGATE_TYPE,
                    format!("p{p}-a{aggregate}"),
                    EVENT_TYPE,
                    format!("{{\"n\":{n}}}"),
                )
                .with_id(Uuid::now_v7())
            })
            .collect();
        let result = if roll_back {
            scratch.roll_back(&events).await
        } else {
            producer.commit(&events).await
        };
        match result {
            Ok(()) if roll_back => {
                rolled_back.extend(events.iter().filter_map(|e| e.id));
                written.rolled_back.fetch_add(count, Ordering::Relaxed);
                failures_in_a_row = 0;
            }
            Ok(()) => {
                next_n[aggregate] = start + count;
                written.committed.fetch_add(count, Ordering::Relaxed);
                failures_in_a_row = 0;
            }
            Err(e) => {
                // A failed roll-back never committed; a failed commit may still have
                // committed: the table decides, and verify reads the table.
                if roll_back {
                    rolled_back.extend(events.iter().filter_map(|e| e.id));
                }
                written.failed.fetch_add(1, Ordering::Relaxed);
                failures_in_a_row += 1;
                if failures_in_a_row >= GIVE_UP_AFTER {
                    return Err(anyhow!(
                        "the database stopped answering the producers ({GIVE_UP_AFTER} writes in a row failed): {}",
                        crate::chain(&e)
                    ));
                }
            }
        }
        tokio::select! {
            () = stop.cancelled() => {}
            () = tokio::time::sleep(pause) => {}
        }
    }
    Ok(rolled_back)
}
