//! Bounded duplicates after a database crash in CDC mode (guarantee 4). A replication slot
//! writes its confirmed position to disk only at checkpoints, so after a crash it comes back
//! far behind what the relay had acknowledged. The source saves its acknowledged position in
//! `<table>_cdc_offsets` and drops the replayed transactions up to it: two crashes
//! (`SIGQUIT` to the postmaster, as `pg_ctl stop -m immediate`) during steady traffic may cost
//! no more duplicates than the batches in flight plus one second of traffic each, and lose
//! nothing.
#![allow(clippy::disallowed_methods)] // tests talk to PostgreSQL directly, never through a pooler

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering as AtomicOrdering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, ensure};
use outbox_core::source::{Outcome, Settlement};
use outbox_core::{DeadLetterPolicy, NewEvent, Ordering, Source};
use outbox_postgres::{Mode, PgCdcSource, PgOutbox, PostgresConfig};
use outbox_testkit::services::Postgres;
use time::OffsetDateTime;
use tokio::time::Instant;
use uuid::Uuid;

const BATCH: usize = 50;
const CRASHES: usize = 2;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_database_crash_replays_at_most_the_batches_in_flight_and_a_second_of_traffic()
-> anyhow::Result<()> {
    outbox_testkit::init_tracing();
    let pg = Postgres::start_private().await?;
    let url = pg.fresh_database().await?;
    let mut config = PostgresConfig::new(url.clone());
    config.mode = Mode::Cdc;
    config.slot = outbox_core::Identifier::new("crash_slot")?;
    config.heartbeat_interval = Duration::from_millis(500);
    config.connect_timeout = Duration::from_secs(2);
    config.validate().map_err(anyhow::Error::msg)?;
    let pool = outbox_postgres::connect(&config, 8).await?;
    outbox_postgres::migrate(&pool, &config.qualified_table(), false).await?;
    outbox_postgres::setup_cdc(&pool, &config).await?;
    // Make the slot's on-disk position as old as it gets: a checkpoint now, none later
    // (the default checkpoint_timeout is 5 minutes).
    sqlx::query("CHECKPOINT").execute(&pool).await?;

    // The relay: fetch, "publish" (record the id), settle delivered. It survives the crashes
    // the way the real relay does: errors are logged and the next fetch reconnects.
    let published: Arc<Mutex<Vec<Uuid>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let relay = {
        let published = published.clone();
        let stop = stop.clone();
        let mut source = PgCdcSource::new(
            pool.clone(),
            &config,
            Ordering::PerAggregate,
            DeadLetterPolicy::HoldAggregate,
        )?;
        tokio::spawn(async move {
            while !stop.load(AtomicOrdering::Relaxed) {
                let fetched = match source.fetch(BATCH, OffsetDateTime::now_utc()).await {
                    Ok(f) => f,
                    Err(e) => {
                        tracing::info!(error = %e, "fetch failed (database down?)");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                if fetched.events.is_empty() {
                    source.wait_for_events(Duration::from_millis(100)).await;
                    continue;
                }
                published
                    .lock()
                    .expect("lock")
                    .extend(fetched.events.iter().map(|e| e.id));
                let settle: Vec<Settlement> = fetched
                    .events
                    .iter()
                    .map(|e| Settlement {
                        position: e.position,
                        outcome: Outcome::Delivered,
                    })
                    .collect();
                if let Err(e) = source.settle(&settle, OffsetDateTime::now_utc()).await {
                    tracing::info!(error = %e, "settle failed (database down?)");
                }
            }
        })
    };

    // Producers: one event per transaction, about 200 a second; only commits that returned
    // Ok count as committed (a commit cut off by the crash may or may not have happened).
    let committed: Arc<Mutex<Vec<Uuid>>> = Arc::default();
    let producing = Arc::new(AtomicBool::new(true));
    let producer = {
        let committed = committed.clone();
        let producing = producing.clone();
        let url = url.clone();
        tokio::spawn(async move {
            let outbox = PgOutbox::default();
            let mut pool: Option<sqlx::PgPool> = None;
            let mut n = 0u64;
            while producing.load(AtomicOrdering::Relaxed) {
                tokio::time::sleep(Duration::from_millis(5)).await;
                let p = match &pool {
                    Some(p) => p.clone(),
                    None => match sqlx::PgPool::connect(&url).await {
                        Ok(p) => {
                            pool = Some(p.clone());
                            p
                        }
                        Err(_) => continue,
                    },
                };
                let event = NewEvent::new("Order", format!("o{}", n % 7), "order.changed", "{}");
                let write = async {
                    let mut tx = p.begin().await?;
                    let id = outbox.enqueue(&mut *tx, &event).await?;
                    tx.commit().await?;
                    anyhow::Ok(id)
                };
                match write.await {
                    Ok(id) => {
                        committed.lock().expect("lock").push(id);
                        n += 1;
                    }
                    Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
                }
            }
        })
    };

    let started = Instant::now();
    let mut per_second = Vec::new();
    for crash in 0..CRASHES {
        tokio::time::sleep(Duration::from_secs(2)).await;
        // Traffic of the second before the crash, for the bound below.
        let before = committed.lock().expect("lock").len();
        tokio::time::sleep(Duration::from_secs(1)).await;
        per_second.push(committed.lock().expect("lock").len() - before);
        pg.crash().await?;
        tracing::info!(crash, after = ?started.elapsed(), "PostgreSQL crashed");
        pg.restart().await?;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    producing.store(false, AtomicOrdering::Relaxed);
    producer.await?;

    let committed = committed.lock().expect("lock").clone();
    outbox_testkit::wait::eventually(Duration::from_secs(60), || async {
        let got = published.lock().expect("lock").clone();
        let got: std::collections::HashSet<_> = got.into_iter().collect();
        committed.iter().all(|id| got.contains(id))
    })
    .await
    .with_context(|| {
        format!(
            "not every committed event ({}) was published",
            committed.len()
        )
    })?;
    stop.store(true, AtomicOrdering::Relaxed);
    relay.await?;

    let published = published.lock().expect("lock").clone();
    let mut times: HashMap<Uuid, usize> = HashMap::new();
    for id in &published {
        *times.entry(*id).or_default() += 1;
    }
    let duplicates: usize = times.values().map(|n| n - 1).sum();
    let bound: usize = per_second.iter().map(|s| s + 2 * BATCH).sum();
    tracing::info!(
        committed = committed.len(),
        published = published.len(),
        duplicates,
        bound,
        "CDC crash run"
    );
    ensure!(
        duplicates <= bound,
        "{duplicates} duplicates after {CRASHES} crashes ({} committed, {} published); the bound is \
         two batches of {BATCH} plus one second of traffic ({per_second:?}) per crash: {bound}",
        committed.len(),
        published.len()
    );
    Ok(())
}
